"""The Lightning callback's shrink/accumulate batch is checked by a direct estimate (through ``make_plan``)."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

sys.path.insert(0, os.path.dirname(__file__))
from _lightning_models import MLP, DataModule, trainer_kwargs  # noqa: E402

from nnmem_callbacks.estimators.torch.estimator import TraceVerifier  # noqa: E402
from nnmem_callbacks.lightning import MemoryBudgetCallback  # noqa: E402

pytestmark = pytest.mark.lightning


def _fit(tmp_path, callback, batch_size=64, **overrides):
    trainer = pl.Trainer(**trainer_kwargs(tmp_path, **overrides), callbacks=[callback])
    trainer.fit(MLP(), datamodule=DataModule(batch_size=batch_size))
    return trainer


@pytest.mark.parametrize("policy", ["shrink", "accumulate"])
def test_callback_steps_down_when_the_direct_estimate_does_not_fit(tmp_path, monkeypatch, policy):
    probe = MemoryBudgetCallback(budget="1TiB")
    _fit(tmp_path / "probe", probe, limit_train_batches=1)
    estimate = probe.estimate
    assert isinstance(estimate.verifier, TraceVerifier)
    # accumulating, the first micro-batch's gradients stay live through the next: the budget leaves room for them
    gradients = estimate.breakdown["parameters"] if policy == "accumulate" else 0
    budget = int((estimate.peak_bytes_at(16) + gradients) / 0.95) + 1

    # direct estimates grow by a quarter more per sample than the lines: the lines' answer cannot fit
    def extra(batch_size):
        return estimate.per_sample_bytes * batch_size // 4

    direct_calls = []
    original = TraceVerifier.__call__

    def larger(self, batch_size):
        direct_calls.append(batch_size)
        direct = original(self, batch_size)
        return dataclasses.replace(direct, peak_bytes=direct.peak_bytes + extra(batch_size))

    monkeypatch.setattr(TraceVerifier, "__call__", larger)
    callback = MemoryBudgetCallback(budget=budget, policy=policy)
    trainer = _fit(tmp_path, callback, limit_train_batches=2)
    plan = callback.plan
    check = plan.verification
    assert check is not None and check.verified and check.stepped_down and direct_calls
    assert plan.batch_size == check.batch_size < check.predicted_batch_size
    usable = int(budget * 0.95)
    checked = estimate.verifier
    if policy == "accumulate":  # checked at the accumulation it trains with
        checked = checked.accumulating(trainer.accumulate_grad_batches)
    assert original(checked, plan.batch_size).peak_bytes + extra(plan.batch_size) <= usable
    if policy == "accumulate":
        assert plan.batch_size * trainer.accumulate_grad_batches >= 64
