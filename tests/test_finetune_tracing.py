"""QLoRA (bitsandbytes 4-bit weights) and mixture-of-experts layers are traced, and match real CPU steps."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.common.groundtruth import live_bytes, measure_cpu_peak
from nnmem_callbacks.estimators.torch import quantized
from nnmem_callbacks.torch import estimate_training

bnb = pytest.importorskip("bitsandbytes")
peft = pytest.importorskip("peft")


class QuantizedBlock(torch.nn.Module):
    def __init__(self, width: int = 256, quant_type: str = "nf4", double: bool = True) -> None:
        super().__init__()
        self.up = bnb.nn.Linear4bit(
            width, 2 * width, compute_dtype=torch.bfloat16, quant_type=quant_type, compress_statistics=double
        )
        self.down = bnb.nn.Linear4bit(
            2 * width, width, compute_dtype=torch.bfloat16, quant_type=quant_type, compress_statistics=double
        )
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.gelu(self.down(torch.nn.functional.gelu(self.up(x)))).float())


def _qlora(quant_type: str = "nf4", double: bool = True, quantize: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    model = QuantizedBlock(quant_type=quant_type, double=double)
    if quantize:
        model = model.to("cpu")  # bitsandbytes quantizes a Params4bit when it moves to a device
    config = peft.LoraConfig(r=8, target_modules=["up", "down"])
    return peft.get_peft_model(model, config)


def _state_bytes(model: torch.nn.Module) -> int:
    tensors = []
    for parameter in model.parameters():
        state = getattr(parameter, "quant_state", None)
        while state is not None:
            tensors += [t for t in (state.absmax, state.code, getattr(state, "offset", None)) if t is not None]
            state = state.state2
    return live_bytes(tensors, "cpu")


def _loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).square().mean()


def _adamw(parameters):
    return torch.optim.AdamW([p for p in parameters if p.requires_grad], lr=1e-3)


@pytest.mark.parametrize("quant_type, double", [("nf4", True), ("fp4", False)])
def test_a_qlora_step_is_traced_to_the_measured_peak(quant_type, double):
    model = _qlora(quant_type, double)
    weight = model.base_model.model.up.weight
    assert quantized.is_params4bit(weight) and weight.bnb_quantized
    packed_before = weight.data.clone()
    batch = torch.randn(64, 256)
    estimate = estimate_training(model, batch, optimizer=_adamw, loss_fn=_loss, check_scaling=False)
    assert estimate.method == "trace", estimate.notes
    # the user's layers are untouched: still quantized, same bytes, same quantization state
    assert model.base_model.model.up.weight is weight and torch.equal(weight.data, packed_before)
    assert weight.quant_state.absmax.device.type == "cpu"
    truth = measure_cpu_peak(model, batch, _adamw, _loss, copy_model=False)
    measured = truth["peak_bytes"] + _state_bytes(model)
    assert abs(estimate.peak_bytes - measured) / measured < 0.01, (estimate.peak_bytes, measured)


def test_a_meta_model_counts_the_weights_as_they_will_be_quantized():
    real = _qlora("nf4", True)
    with torch.device("meta"):
        meta = _qlora("nf4", True, quantize=False)
    assert not meta.base_model.model.up.weight.bnb_quantized
    batch = torch.randn(64, 256)
    on_cpu = estimate_training(real, batch, optimizer=_adamw, loss_fn=_loss, check_scaling=False)
    on_meta = estimate_training(
        meta, batch.to("meta"), optimizer=_adamw, loss_fn=_loss, device="cpu", check_scaling=False
    )
    assert on_meta.method == "trace"
    assert on_meta.breakdown["parameters"] == on_cpu.breakdown["parameters"]
    elements = 256 * 512
    expected_weight = elements // 2 + math.ceil(elements / 64)  # packed nibbles + 8-bit block scales
    assert on_meta.breakdown["parameters"] > 2 * expected_weight


def test_gemm_4bit_runs_its_cpu_composition_in_the_trace():
    """The dequantized weight lives while ``linear`` runs: without it the forward peak is lower."""
    from nnmem_callbacks.estimators.torch import rules

    model = _qlora("nf4", False)
    batch = torch.randn(8, 256)
    with_composition = estimate_training(model, batch, optimizer=_adamw, loss_fn=_loss, check_scaling=False)
    saved = rules.DECOMPOSITIONS["cpu"].pop(torch.ops.bitsandbytes.gemm_4bit)
    try:
        quantized_install = quantized.install_rules
        quantized.install_rules = lambda: None
        without = estimate_training(model, batch, optimizer=_adamw, loss_fn=_loss, check_scaling=False)
    finally:
        quantized.install_rules = quantized_install
        rules.DECOMPOSITIONS["cpu"][torch.ops.bitsandbytes.gemm_4bit] = saved
    forward = "step1/forward"
    dequantized = 256 * 512 * 2  # the larger layer's weight in bf16
    peak_with = sum(with_composition.phase_breakdowns[forward].values())
    peak_without = sum(without.phase_breakdowns[forward].values())
    # the forward's peak moves by most of one dequantized weight (the moments of the two peaks differ a little)
    assert peak_with - peak_without > dequantized * 0.9, (peak_with, peak_without)


def _tiny_mixtral(**implementation):
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=4, num_experts_per_tok=2, vocab_size=512, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM._from_config(config, **implementation)


def test_a_mixture_of_experts_step_in_fp32_is_traced():
    model = _tiny_mixtral()
    ids = torch.randint(0, 512, (4, 32))
    batch = {"input_ids": ids, "labels": ids}

    def loss(model, batch):
        return model(**batch).loss

    estimate = estimate_training(model, batch, optimizer=_adamw, loss_fn=loss, check_scaling=False)
    assert estimate.method == "trace", estimate.notes
    truth = measure_cpu_peak(model, batch, _adamw, loss, copy_model=False)
    assert abs(estimate.peak_bytes - truth["peak_bytes"]) / truth["peak_bytes"] < 0.01


def test_a_per_expert_loop_falls_back_with_a_note_that_says_what_traces():
    model = _tiny_mixtral(experts_implementation="eager")
    ids = torch.randint(0, 512, (2, 16))
    with pytest.warns(RuntimeWarning, match="could not trace"):
        estimate = estimate_training(model, {"input_ids": ids, "labels": ids}, loss_fn=lambda m, b: m(**b).loss)
    assert estimate.method == "closed-form"
    assert any("experts_implementation='grouped_mm'" in note for note in estimate.notes)


SEVEN_B_FROM_META = """
import resource, sys, torch, transformers, peft
from transformers.integrations.bitsandbytes import replace_with_bnb_linear
from nnmem_callbacks.torch import estimate_training
config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                  num_attention_heads=32, vocab_size=32000, max_position_embeddings=4096)
quantization = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                               bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
with torch.device("meta"):
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
model = replace_with_bnb_linear(model, quantization_config=quantization, modules_to_not_convert=["lm_head"])
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
ids = torch.zeros(1, 2048, dtype=torch.long, device="meta")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
estimate = estimate_training(model, {"input_ids": ids, "labels": ids}, optimizer="adamw", precision="bf16-true",
                             device="cuda:a100-80gb", loss_fn=lambda m, b: m(**b).loss, check_scaling=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(estimate.method, estimate.breakdown["parameters"], (after - before) * 1024)
"""


@pytest.mark.slow
def test_a_7b_qlora_estimate_from_meta_tensors_does_not_allocate_the_model():
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("transformers")
    done = subprocess.run(
        [sys.executable, "-c", SEVEN_B_FROM_META],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(Path(__file__).parents[1]),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    method, parameter_bytes, rss_rise = done.stdout.split()[-3:]
    assert method == "trace"
    # 6.5e9 weights in 4 bits (~3.0 GiB) plus bf16 embeddings and head (~0.5 GiB): as quantized, not as bf16 (12.6 GiB)
    assert 3.2 * 2**30 < int(parameter_bytes) < 4.0 * 2**30
    assert int(rss_rise) < 2**30, f"peak RSS rose by {int(rss_rise) / 2**30:.2f} GiB"


class Int8Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.quantized = bnb.nn.Linear8bitLt(256, 512, has_fp16_weights=False)
        self.head = torch.nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.gelu(self.quantized(x)).float())


@pytest.mark.parametrize("ran_before", [False, True])
def test_8bit_weights_are_traced_and_their_state_is_left_alone(ran_before):
    torch.manual_seed(0)
    model = Int8Model().to("cpu")  # quantizes the 8-bit weight
    batch = torch.randn(64, 256)
    if ran_before:  # the layer's first forward moves CB and SCB from the weight into its state
        model(batch)
    layer = model.quantized
    state, weight = layer.state, layer.weight
    before = (state.CB, state.SCB, weight.CB, weight.SCB, weight.data.clone())
    estimate = estimate_training(model, batch, optimizer=_adamw, loss_fn=_loss, check_scaling=False)
    assert estimate.method == "trace", estimate.notes
    assert layer.state is state and layer.weight is weight
    after = (state.CB, state.SCB, weight.CB, weight.SCB)
    assert all(a is b for a, b in zip(after, before)) and torch.equal(weight.data, before[4])
    scales = state.SCB if state.SCB is not None else weight.SCB  # not a parameter: outside the truth's baseline
    truth = measure_cpu_peak(model, batch, _adamw, _loss, copy_model=False)["peak_bytes"] + scales.nbytes
    assert abs(estimate.peak_bytes - truth) / truth < 0.01, (estimate.peak_bytes, truth)


def test_a_paged_optimizer_is_traced_unpaged_and_a_cuda_estimate_says_where_its_state_lives():
    model = _qlora("nf4", True)
    batch = torch.randn(16, 256)

    def paged(parameters):
        return bnb.optim.PagedAdamW8bit([p for p in parameters if p.requires_grad], lr=1e-3)

    def plain(parameters):
        return bnb.optim.AdamW8bit([p for p in parameters if p.requires_grad], lr=1e-3)

    on_cpu = estimate_training(model, batch, optimizer=paged, loss_fn=_loss, check_scaling=False)
    assert (
        on_cpu.peak_bytes
        == estimate_training(model, batch, optimizer=plain, loss_fn=_loss, check_scaling=False).peak_bytes
    )
    assert not any("unified memory" in note for note in on_cpu.notes)
    for_cuda = estimate_training(model, batch, optimizer=paged, loss_fn=_loss, device="cuda", check_scaling=False)
    assert any("PagedAdamW8bit" in note and "unified memory" in note for note in for_cuda.notes)


def test_torchao_int8_weights_are_traced_at_their_packed_bytes():
    quantization = pytest.importorskip("torchao.quantization")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10))
    quantization.quantize_(model[0], quantization.Int8WeightOnlyConfig())
    model[0].weight.requires_grad_(False)
    weight = model[0].weight
    batch = torch.randn(64, 256)
    estimate = estimate_training(model, batch, optimizer=_adamw, loss_fn=_loss, check_scaling=False)
    assert estimate.method == "trace" and model[0].weight is weight
    assert estimate.breakdown["parameters"] < 256 * 512 * 2  # int8 and scales, not the fp32 weight (512 KiB)
    truth = measure_cpu_peak(model, batch, _adamw, _loss, copy_model=False)["peak_bytes"]
    assert abs(estimate.peak_bytes - truth) / truth < 0.01, (estimate.peak_bytes, truth)


def test_layers_of_other_quantizers_are_named_in_a_note():
    class HQQLinear(torch.nn.Linear):  # stands for hqq's layer class: only its name is read
        pass

    model = torch.nn.Sequential(HQQLinear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    estimate = estimate_training(model, torch.randn(4, 16), check_scaling=False)
    assert any("HQQ (1 layers)" in note and "not yet compared" in note for note in estimate.notes)


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


@pytest.mark.parametrize("paged", [False, True])
def test_an_8bit_optimizer_instance_keeps_its_bits(paged):
    """The Trainer's ``optim="adamw_8bit"`` builds ``bnb.optim.AdamW(optim_bits=8)``; its clone dropped ``optim_bits``
    (kept in ``optimizer.args``, not ``defaults``) and was estimated as a 32-bit AdamW."""
    torch.manual_seed(0)
    model = Mlp()
    batch = torch.randn(16, 256)
    instance = bnb.optim.AdamW(model.parameters(), lr=1e-3, optim_bits=8, is_paged=paged)

    def eight_bit(parameters):
        return bnb.optim.AdamW8bit(parameters, lr=1e-3)

    kwargs = dict(loss_fn=_loss, check_scaling=False, probe_kernels=False)
    estimate = estimate_training(model, batch, optimizer=instance, **kwargs)
    assert estimate.method == "trace", estimate.notes
    assert estimate.extra["optimizer"] == "AdamW (8-bit)"
    expected = estimate_training(model, batch, optimizer=eight_bit, **kwargs).breakdown["optimizer_state"]
    elements = sum(p.numel() for p in model.parameters())
    assert estimate.breakdown["optimizer_state"] == expected < 2 * elements + elements // 16  # 1 byte per moment
    assert instance.state == {} and instance.is_paged == paged  # the user's optimizer is left alone
    if paged:
        for_cuda = estimate_training(model, batch, optimizer=instance, device="cuda", **kwargs)
        assert any("AdamW" in note and "unified memory" in note for note in for_cuda.notes)


@pytest.mark.parametrize("name", ["AdamW8bit", "PagedAdamW32bit", "Lion8bit"])
def test_a_bitsandbytes_step_on_cpu_holds_its_fp32_copies(name):
    """bitsandbytes' CPU update kernels are Python: the 8-bit one dequantizes the moments to fp32 beside an fp32
    gradient, then quantizes them back. Their fake kernels return nothing, so an MLP whose peak is the optimizer
    step was estimated at half its measured peak."""
    torch.manual_seed(0)
    model = Mlp()
    batch = torch.randn(16, 256)

    def factory(parameters):
        return getattr(bnb.optim, name)(parameters, lr=1e-3)

    estimate = estimate_training(model, batch, optimizer=factory, loss_fn=_loss, check_scaling=False)
    truth = measure_cpu_peak(model, batch, factory, _loss, copy_model=False)
    assert estimate.peak_phase.endswith("optimizer") and truth["peak_phase"].endswith("optimizer")
    assert abs(estimate.peak_bytes - truth["peak_bytes"]) / truth["peak_bytes"] < 0.01, (estimate.peak_bytes, truth)
