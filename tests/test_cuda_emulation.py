"""CUDA semantics on a CPU host (issue #14): autocast policy, attention backend choice, trainable masks.

Everything here runs without a GPU; the CUDA kernels are reached through
torch's own AutocastCUDA registrations and the attention ops' meta kernels.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from nnmem_callbacks import estimate_training
from nnmem_callbacks.estimators.torch.cuda.autocast import (
    cpu_autocast_ops,
    cuda_autocast_on_cpu,
    cuda_autocast_ops,
    probe_cuda_autocast,
)
from nnmem_callbacks.estimators.torch.cuda.emulation import cuda_kernel_emulation
from nnmem_callbacks.estimators.torch.cuda.sdpa_backends import SdpaCall, SdpaSwitches, select_backend
from nnmem_callbacks.hardware import gpus

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU emulation of CUDA kernels")

BF16 = torch.bfloat16


# ---------------------------------------------------------------------------
# autocast
# ---------------------------------------------------------------------------
def _under_cuda_autocast(fn):
    with cuda_autocast_on_cpu(), torch.autocast("cpu", dtype=BF16):
        return fn()


@pytest.mark.parametrize(
    "name, fn, dtype",
    [
        ("softmax", lambda x, w: torch.softmax(x.to(BF16), -1), torch.float32),
        ("log_softmax", lambda x, w: torch.log_softmax(x.to(BF16), -1), torch.float32),
        ("layer_norm", lambda x, w: nn.functional.layer_norm(x.to(BF16), (8,)), torch.float32),
        ("pow", lambda x, w: torch.pow(x.to(BF16), 3), torch.float32),
        ("matmul", lambda x, w: x @ w, BF16),
        ("linear", lambda x, w: nn.functional.linear(x, w), BF16),
        ("cross_entropy", lambda x, w: nn.functional.cross_entropy(x @ w, torch.tensor([1, 2, 3, 4])), torch.float32),
    ],
)
def test_cuda_autocast_policy_for_the_ops_that_matter(name, fn, dtype):
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    assert _under_cuda_autocast(lambda: fn(x, w)).dtype == dtype, name


def test_softmax_keeps_its_fp32_output_for_backward_under_cuda_autocast():
    x = torch.randn(4, 8, dtype=BF16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
        out = _under_cuda_autocast(lambda: torch.softmax(x, -1))
    assert out.dtype == torch.float32 and torch.float32 in saved  # _softmax saves its (fp32) output
    out.sum().backward()
    assert x.grad.dtype == BF16


def test_the_op_lists_come_from_torch_registrations():
    cuda_ops, cpu_ops = set(cuda_autocast_ops()), set(cpu_autocast_ops())
    for op in ("aten::softmax.int", "aten::log_softmax.int", "aten::layer_norm", "aten::mm"):
        assert op in cuda_ops
    assert "aten::cross_entropy_loss" in cpu_ops - cuda_ops  # CUDA autocasts its parts instead
    with cuda_autocast_on_cpu() as emulation:
        assert "aten::cross_entropy_loss" in emulation.fallthrough
        assert set(emulation.overridden) == cuda_ops - set(emulation.unresolved)


def test_probe_reads_the_cast_policy_from_the_cuda_kernel():
    x16, x32 = torch.empty(4, 4, dtype=BF16), torch.empty(4, 4)
    mm = probe_cuda_autocast(torch.ops.aten.mm.default, (x32, x32), {}, BF16)
    assert mm.func is torch.ops.aten.mm.default and mm.casts() == {0: BF16, 1: BF16}
    softmax = probe_cuda_autocast(torch.ops.aten.softmax.int, (x16, -1), {}, BF16)
    assert softmax.casts() == {} and softmax.template[-1] == ("const", torch.float32)  # fp32 output dtype
    layer_norm = probe_cuda_autocast(torch.ops.aten.layer_norm.default, (x16, [4]), {}, BF16)
    assert layer_norm.casts() == {0: torch.float32}
    fp16 = probe_cuda_autocast(torch.ops.aten.mm.default, (x32, x32), {}, torch.float16)
    assert fp16.casts() == {0: torch.float16, 1: torch.float16}


def test_a_weight_is_cast_once_per_autocast_region_and_the_cache_is_cleared():
    w = nn.Parameter(torch.randn(8, 8))
    x = torch.randn(4, 8)
    casts = []
    with cuda_autocast_on_cpu() as emulation:
        with torch.autocast("cpu", dtype=BF16):
            (x @ w) @ w
            casts.append(len(emulation.cache.entries))
        casts.append(len(emulation.cache.entries))
    assert casts == [1, 0]


def test_cpu_autocast_is_restored_after_the_block():
    with cuda_autocast_on_cpu():
        pass
    with torch.autocast("cpu", dtype=BF16):
        assert torch.softmax(torch.randn(2, 2) @ torch.randn(2, 2), -1).dtype == BF16


# ---------------------------------------------------------------------------
# attention backend choice (sdp_utils.cpp)
# ---------------------------------------------------------------------------
def _call(
    dtype="bfloat16",
    head=64,
    mask=None,
    mask_grad=False,
    dropout=0.0,
    causal=False,
    lq=128,
    lk=128,
    grad=True,
    heads_kv=8,
    gqa=False,
):
    return SdpaCall(
        (4, 8, lq, head),
        (4, heads_kv, lk, head),
        (4, heads_kv, lk, head),
        dtype,
        mask_dtype=mask,
        mask_shape=None if mask is None else (1, 8, lq, lk),
        mask_requires_grad=mask_grad,
        dropout_p=dropout,
        is_causal=causal,
        requires_grad=grad,
        enable_gqa=gqa,
    )


H100, A100, A10, T4, V100, P100 = (gpus.find_arch(n) for n in ("h100", "a100-80gb", "a10", "t4", "v100-16gb", "p100"))
H100_OLD_CUDNN = dataclasses.replace(H100, cudnn_version=91000)


@pytest.mark.parametrize(
    "call, arch, expected",
    [
        (_call(causal=True), A100, "flash"),
        (_call(causal=True), H100, "cudnn"),  # sm90 with cuDNN > 9.15 prefers cuDNN
        (_call(causal=True), H100_OLD_CUDNN, "flash"),
        (_call(dropout=0.1), H100, "flash"),  # cuDNN dropout must be a multiple of 1/16
        (_call(dropout=0.125), H100, "cudnn"),
        (_call(dtype="float32"), H100, "efficient"),  # flash and cuDNN are fp16/bf16 only
        (_call(dtype="float32", mask="float32", mask_grad=True), A100, "efficient"),  # T5's position bias
        (_call(mask="bfloat16"), A100, "efficient"),  # flash takes no mask
        (_call(mask="bool"), H100, "cudnn"),
        (_call(head=320), A100, "efficient"),  # flash: head dim <= 256
        (_call(dtype="float32", head=62), A100, "math"),  # efficient: fp32 head dim divisible by 4
        (_call(head=200), A10, "efficient"),  # sm86 training with head dim in (192, 224]
        (_call(head=200, grad=False), A10, "flash"),
        (_call(causal=True, lq=64, lk=128), A100, "efficient"),  # flash: causal needs lq == lk
        (_call(), T4, "math"),  # bf16 below sm80: no fused kernel
        (_call(dtype="float16"), T4, "efficient"),
        (_call(dtype="float16"), P100, "efficient"),
        (_call(dtype="float32", head=30), V100, "efficient"),  # no tensor cores for fp32 on sm70: alignment 1
        (_call(heads_kv=2, gqa=True), A100, "flash"),
        (_call(heads_kv=2), A100, "math"),  # unequal heads without enable_gqa
        # efficient attention takes no grouped-query heads (check_batch_size_and_num_heads_dense<false>)
        (_call(dtype="float32", heads_kv=2, gqa=True), H100, "math"),
        (_call(mask="bfloat16", heads_kv=2, gqa=True), A100, "math"),
        (_call(causal=True, heads_kv=2, gqa=True), H100, "cudnn"),
    ],
)
def test_attention_backend_choice_table(call, arch, expected):
    assert select_backend(call, arch)[0] == expected


def test_switches_and_priority_order_are_honoured():
    call = _call(causal=True)
    assert select_backend(call, A100, SdpaSwitches(flash=False))[0] == "efficient"
    assert select_backend(call, A100, SdpaSwitches(flash=False, efficient=False))[0] == "math"
    assert select_backend(call, A100, SdpaSwitches(flash=False, efficient=False, math=False))[0] == "cudnn"
    assert select_backend(call, A100, SdpaSwitches(False, False, False, False))[0] == "error"
    backend, reasons = select_backend(_call(mask="float32"), A100)
    assert backend == "efficient" and "mask" in reasons["flash"]


@pytest.mark.parametrize(
    "dtype, mask, op, saved_extra",
    [
        (torch.float32, False, "efficient", "logsumexp padded to 32"),
        (torch.bfloat16, False, "flash", "logsumexp"),
        (torch.float32, True, "efficient", "bias"),
    ],
)
def test_each_backend_keeps_its_own_tensors(dtype, mask, op, saved_extra):
    batch, heads, length, head = 2, 4, 100, 64
    with FakeTensorMode(), cuda_kernel_emulation(gpus.find_arch("a100-80gb")) as report:
        q = torch.empty(batch, heads, length, head, dtype=dtype, requires_grad=True)
        bias = torch.zeros(1, heads, length, length, dtype=dtype, requires_grad=True) if mask else None
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append((tuple(t.shape), t.dtype)) or t, lambda t: t
        ):
            out = nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=bias)
        assert list(report.sdpa.values()) == [op]
        lse = [s for s in saved if s[1] == torch.float32 and len(s[0]) == 3]
        assert lse == [((batch, heads, 128 if op == "efficient" else length), torch.float32)]
        assert not any(s[0][-2:] == (length, length) and len(s[0]) == 4 and s[0][0] == batch for s in saved if not mask)
        out.sum().backward()
        if mask:
            assert bias.grad is not None and bias.grad.shape == bias.shape


# ---------------------------------------------------------------------------
# trainable masks and named GPUs through the estimator
# ---------------------------------------------------------------------------
class PositionBiasAttention(nn.Module):
    """T5-style: a learned additive bias passed to SDPA as attn_mask."""

    def __init__(self, heads: int = 4, length: int = 32, dim: int = 64):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.bias = nn.Parameter(torch.zeros(1, heads, length, length))
        self.out = nn.Linear(dim, 10)

    def forward(self, x):
        b, length, dim = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)
        return self.out(y.transpose(1, 2).reshape(b, length, dim)).mean()


def test_a_trainable_mask_traces_for_a_cuda_target_without_fallback():
    with _no_fallback_warning():
        est = estimate_training(
            PositionBiasAttention(), torch.randn(8, 32, 64), optimizer="adam", device="cuda", loss_fn=lambda m, b: m(b)
        )
    assert est.method == "trace"
    assert est.extra["cuda_emulation"]["attention_backends"] == {"efficient": 1}
    bias_bytes = 4 * 32 * 32 * 4
    assert est.breakdown["parameters"] >= bias_bytes


class _no_fallback_warning:
    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        self.records = self._catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)
        assert not [r for r in self.records if "closed-form" in str(r.message)]
        return False


def test_hf_t5_traces_for_a_cuda_target():
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(
        vocab_size=256,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
        pad_token_id=0,
        use_cache=False,
    )
    model = transformers.T5ForConditionalGeneration(config)
    ids = torch.randint(1, 256, (2, 16))
    with _no_fallback_warning():
        est = estimate_training(
            model,
            {"input_ids": ids, "labels": ids[:, :8]},
            optimizer="adamw",
            device="cuda",
            loss_fn=lambda m, b: m(**b).loss,
        )
    assert est.method == "trace"
    assert est.extra["cuda_emulation"]["attention_backends"].get("efficient", 0) >= 1


class BfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(64, 192)

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 4, 16).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).float().mean()


def test_a_named_gpu_selects_its_architecture():
    batch = torch.randn(8, 128, 64)
    kwargs = dict(optimizer="sgd", precision="bf16-mixed", loss_fn=lambda m, b: m(b), check_scaling=False)
    a100 = estimate_training(BfAttention(), batch, device="cuda:a100-80gb", **kwargs)
    t4 = estimate_training(BfAttention(), batch, device="t4", **kwargs)
    assert a100.device.startswith("cuda") and t4.device.startswith("cuda")
    assert a100.extra["cuda_emulation"]["attention_backends"] == {"flash": 1}
    assert t4.extra["cuda_emulation"]["attention_backends"] == {"math": 1}
    probabilities = 8 * 4 * 128 * 128 * 2  # bf16 probabilities kept by the math path
    assert t4.breakdown["activations"] - a100.breakdown["activations"] >= probabilities
    assert any("sm80 (Ampere)" in note for note in a100.notes) and any("sm75 (Turing)" in note for note in t4.notes)
    assert not any("no GPU named" in note for note in a100.notes)
    unnamed = estimate_training(BfAttention(), batch, device="cuda", **kwargs)
    assert any("no GPU named" in note and "sm75" in note for note in unnamed.notes)
    assert "7.5" in unnamed.extra["cuda_emulation"]["uncovered_capabilities"]


class GroupedQueryAttention(nn.Module):
    """Llama's attention shape: 4 query heads share 2 key/value heads (``enable_gqa``)."""

    def __init__(self):
        super().__init__()
        self.q, self.kv = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x):
        q = self.q(x).view(x.shape[0], x.shape[1], 4, 16).transpose(1, 2)
        k, v = self.kv(x).view(x.shape[0], x.shape[1], 2, 2, 16).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.float().mean()


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_grouped_query_attention_traces_for_a_named_gpu(precision):
    """fp32 GQA on a GPU runs the math kernel (efficient attention takes no grouped heads); it picked the efficient
    kernel, whose backward failed on the grouped key, and every Llama-3/Mistral/Qwen2 estimate for a named GPU fell
    back to parameters and optimizer state only."""
    batch = torch.randn(4, 64, 64)
    kwargs = dict(optimizer="adamw", loss_fn=lambda m, b: m(b), check_scaling=False, probe_kernels=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the fallback's warning
        est = estimate_training(GroupedQueryAttention(), batch, device="cuda:h100", precision=precision, **kwargs)
    assert est.method == "trace"
    expected = {"32-true": "math", "bf16-mixed": "cudnn"}[precision]
    assert est.extra["cuda_emulation"]["attention_backends"] == {expected: 1}


def test_an_unknown_gpu_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown CUDA architecture 'b9000'.*H100"):
        estimate_training(BfAttention(), torch.randn(2, 8, 64), device="cuda:b9000", loss_fn=lambda m, b: m(b))


def test_the_emulation_leaves_cpu_kernels_alone_afterwards():
    estimate_training(
        BfAttention(), torch.randn(2, 8, 64), device="cuda", precision="bf16-mixed", loss_fn=lambda m, b: m(b)
    )
    q = torch.randn(1, 2, 8, 16)
    assert nn.functional.scaled_dot_product_attention(q, q, q).shape == q.shape  # the CPU kernel runs again
    assert nn.functional.dropout(torch.ones(1000), 0.5).eq(0).any()
    with torch.autocast("cpu", dtype=BF16):
        assert torch.softmax(q @ q.transpose(-1, -2), -1).dtype == BF16


# ---------------------------------------------------------------------------
# the "which GPU fits" table
# ---------------------------------------------------------------------------
ATTENTION_FACTORY = """
import torch
from torch import nn

class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(64, 192)

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 4, 16).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).float().mean()
"""


def test_which_gpu_fits_marks_cards_whose_kernels_differ(tmp_path, capsys):
    import json

    from nnmem_callbacks import cli

    path = tmp_path / "attention_model.py"
    path.write_text(ATTENTION_FACTORY)
    argv = ["estimate", f"{path}:Attention", "-i", "32,64", "-b", "8", "--precision", "bf16-mixed"]
    assert cli.main([*argv, "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["fit"]["gpus"]}
    assert rows["T4 16GB"]["covered"] is False  # bf16 attention runs the math kernel below sm80
    assert rows["A100 80GB"]["covered"] is True and rows["H100 80GB"]["covered"] is True
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    t4_lines = [line for line in out.splitlines() if "T4 16GB" in line]
    assert t4_lines and all("*" in line for line in t4_lines)
    assert not any("*" in line for line in out.splitlines() if "A100 80GB" in line)
    assert "estimate for it with --device" in " ".join(out.split())


def test_a_backend_switch_in_the_forward_is_honoured():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with FakeTensorMode(), cuda_kernel_emulation(gpus.find_arch("a100-80gb")) as report:
        q = torch.empty(2, 4, 64, 32, dtype=BF16, requires_grad=True)
        with sdpa_kernel(SDPBackend.MATH):
            nn.functional.scaled_dot_product_attention(q, q, q)
    assert list(report.sdpa.values()) == ["math"]


def test_probing_is_invisible_to_dispatch_modes():
    from torch.utils._python_dispatch import TorchDispatchMode

    from nnmem_callbacks.estimators.torch.cuda import autocast as cuda_autocast

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.devices = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.devices.update(
                t.device.type for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
            )
            return out

    cuda_autocast._PLANS.clear()  # force a probe
    seen = Seen()
    with cuda_autocast_on_cpu(), torch.autocast("cpu", dtype=BF16), seen:
        torch.randn(4, 8) @ torch.randn(8, 3)
    assert seen.devices == {"cpu"}
