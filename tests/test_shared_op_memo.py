"""Estimates that share their op memo (``tracer.sharing_traced_ops``): the same bytes, fewer first passes."""

from __future__ import annotations

import torch
from torch import nn

from nnmem_callbacks import estimate_training
from nnmem_callbacks.estimators.torch import tracer


def _xent(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.GroupNorm(4, 16),
        nn.GELU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.LayerNorm(128),
        nn.Linear(128, 10),
    )


def _digest(estimate):
    return (
        estimate.peak_bytes,
        estimate.reserved_bytes,
        estimate.breakdown,
        estimate.phases,
        estimate.phase_breakdowns,
    )


#: the callbacks' order: the estimate, then its bf16-mixed offer; then the same for an emulated CUDA target
CASES = [("cpu", "32-true"), ("cpu", "bf16-mixed"), ("cuda:h100", "32-true"), ("cuda:h100", "bf16-mixed")]


def test_estimates_sharing_traced_ops_give_the_bytes_of_estimates_made_alone(monkeypatch):
    first_passes = []
    record = tracer.OpMemo.record

    def counted(self, key, *args):
        if key is not None:
            first_passes.append(key)
        return record(self, key, *args)

    monkeypatch.setattr(tracer.OpMemo, "record", counted)
    model, batch = _model(), (torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,)))

    def run_cases():
        digests, passes = [], []
        for device, precision in CASES:
            first_passes.clear()
            estimate = estimate_training(
                model, batch, optimizer="adamw", loss_fn=_xent, device=device, precision=precision
            )
            digests.append(_digest(estimate))
            passes.append(len(first_passes))
        return digests, passes

    alone, alone_passes = run_cases()
    with tracer.sharing_traced_ops():
        shared, shared_passes = run_cases()
        contexts = dict(tracer._SHARED_ENTRIES.get())
    assert shared == alone
    assert tracer._SHARED_ENTRIES.get() is None  # the entries go with the context
    assert len(contexts) == 2  # a CPU and a CUDA target never share: a kernel's outputs may differ
    assert shared_passes[0] == alone_passes[0] and shared_passes[2] == alone_passes[2]
    # the offers replay what the estimate before them saw (the optimizer's step on fp32 weights and gradients)
    assert shared_passes[1] < alone_passes[1]
    assert shared_passes[3] < alone_passes[3]


def test_a_nested_context_shares_the_outer_one():
    with tracer.sharing_traced_ops():
        outer = tracer._SHARED_ENTRIES.get()
        with tracer.sharing_traced_ops():
            assert tracer._SHARED_ENTRIES.get() is outer
        assert tracer._SHARED_ENTRIES.get() is outer
    assert tracer._SHARED_ENTRIES.get() is None


def test_a_memo_without_a_context_keeps_its_entries():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with tracer.sharing_traced_ops():
        mode = FakeTensorMode()
        assert tracer.OpMemo(mode).entries is not tracer.OpMemo(mode).entries
        assert tracer.OpMemo(mode, ("cpu",)).entries is tracer.OpMemo(mode, ("cpu",)).entries
