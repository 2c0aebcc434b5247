"""The torch estimate says whether the model checkpoints its activations, so that no plan suggests it again."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nnmem_callbacks import estimate_training  # noqa: E402
from nnmem_callbacks.estimators.torch.step import checkpoints_activations  # noqa: E402


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    return transformers.LlamaForCausalLM(config)


def test_an_estimate_records_the_checkpointing_transformers_switched_on():
    ids = torch.randint(0, 128, (2, 16))
    batch = {"input_ids": ids, "labels": ids}
    plain = _llama()
    assert not checkpoints_activations(plain)
    assert (
        estimate_training(plain, batch, probe_kernels=False, check_scaling=False).extra["activation_checkpointing"]
        is False
    )
    model = _llama()
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    assert checkpoints_activations(model)
    wrapper = torch.nn.ModuleDict({"inner": model})  # as a Lightning module or a PEFT wrapper holds it
    assert checkpoints_activations(wrapper)
    model.train()
    est = estimate_training(model, batch, probe_kernels=False, check_scaling=False)
    assert est.extra["activation_checkpointing"] is True
