"""transformers models: the trace takes the attention-mask path of the real eager run."""

from __future__ import annotations

import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from benchmarks.common.groundtruth import measure_cpu_peak  # noqa: E402
from nnmem_callbacks import estimate_training  # noqa: E402
from nnmem_callbacks.estimators.torch import compat  # noqa: E402

BATCH, LENGTH = 4, 96


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=500,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=3,
        attn_implementation="eager",
    )
    return transformers.BertForSequenceClassification(config)


def loss_of(model, batch):
    return model(**batch).loss


def make_batch(mask):
    torch.manual_seed(1)
    batch = {"input_ids": torch.randint(0, 500, (BATCH, LENGTH)), "labels": torch.randint(0, 3, (BATCH,))}
    if mask is not None:
        batch["attention_mask"] = mask
    return batch


def padded_mask():
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[1:, LENGTH // 2 :] = 0
    return mask


@pytest.mark.parametrize(
    "mask",
    [None, torch.ones(BATCH, LENGTH, dtype=torch.long), padded_mask()],
    ids=["no-mask", "all-ones-mask", "padded-mask"],
)
def test_tiny_bert_bf16_mixed_eager_matches_the_profiler(bert, mask):
    """Without padding the real run builds no mask; fake tensors made
    transformers build an fp32 one, promoting eager attention to fp32."""
    batch = make_batch(mask)
    truth = measure_cpu_peak(bert, batch, lambda p: torch.optim.AdamW(p), loss_of, "bf16-mixed")["peak_bytes"]
    est = estimate_training(bert, batch, optimizer="adamw", loss_fn=loss_of, precision="bf16-mixed")
    assert est.method == "trace"
    assert est.peak_bytes == pytest.approx(truth, rel=0.01)


def test_mask_modules_are_restored_after_the_estimate(bert):
    import transformers.masking_utils as masking_utils

    original = masking_utils.is_tracing
    seen = []
    real_forward = bert.forward

    def forward(*args, **kwargs):
        seen.append(masking_utils.is_tracing)
        return real_forward(*args, **kwargs)

    bert.forward = forward
    try:
        estimate_training(
            bert,
            make_batch(torch.ones(BATCH, LENGTH, dtype=torch.long)),
            optimizer="sgd",
            loss_fn=loss_of,
            check_scaling=False,
        )
    finally:
        del bert.forward
    assert seen and all(f is not original for f in seen)  # patched during the trace
    assert masking_utils.is_tracing is original


def test_patched_check_ignores_only_fake_tensors():
    import transformers.masking_utils as masking_utils
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.ones(2, 3)
    assert masking_utils.is_tracing(fake)  # what transformers answers for fake tensors
    with compat.eager_library_checks({"attention_mask": torch.ones(2, 3)}):
        assert not masking_utils.is_tracing(fake)
        graph = torch.fx.Graph()
        assert masking_utils.is_tracing(torch.fx.Proxy(graph.placeholder("x")))  # fx tracing still reported
    with compat.eager_library_checks({"attention_mask": padded_mask()}):
        assert masking_utils.is_tracing(fake)  # padding: the real run builds the mask too


def test_does_nothing_without_transformers_imported(monkeypatch):
    for name in compat.MASK_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    with compat.eager_library_checks(None):
        pass
    assert not any(name in sys.modules for name in compat.MASK_MODULES)
