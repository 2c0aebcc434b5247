"""Defects a new-user walkthrough found in the Lightning callback's messages and predictions (CPU, tiny models)."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

sys.path.insert(0, os.path.dirname(__file__))
from _lightning_models import MLP, DataModule, make_dataset, trainer_kwargs  # noqa: E402

from nnmem_callbacks import format_bytes  # noqa: E402
from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine  # noqa: E402
from nnmem_callbacks.core.plan import accumulated_gradient_bytes, make_plan  # noqa: E402
from nnmem_callbacks.lightning import MemoryBudgetCallback  # noqa: E402

pytestmark = pytest.mark.lightning


def _fit(tmp_path, callback, module=None, datamodule=None, ckpt_path=None, **overrides):
    trainer = pl.Trainer(**trainer_kwargs(tmp_path, **overrides), callbacks=[callback])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module or MLP(), datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer, [w for w in caught if "MemoryBudgetCallback" in str(w.message)]


@pytest.fixture(scope="module")
def estimate(tmp_path_factory):
    probe = MemoryBudgetCallback(budget="1TiB")
    _fit(tmp_path_factory.mktemp("probe"), probe, datamodule=DataModule(batch_size=64), limit_train_batches=1)
    assert probe.estimate is not None
    return probe.estimate


def _accumulating_budget(estimate):
    # at batch 16 the lines fit with the gradients the accumulation keeps live; 64 does not
    return int((estimate.peak_bytes_at(16) + estimate.breakdown["parameters"]) / 0.95) + 1


def _direct_peak(estimate, batch_size, accumulate):
    return estimate.verifier.accumulating(accumulate)(batch_size).peak_bytes_at(batch_size)


def test_accumulate_predicts_and_logs_the_direct_estimate_of_the_changed_run(tmp_path, estimate):
    callback = MemoryBudgetCallback(budget=_accumulating_budget(estimate), policy="accumulate")
    trainer, caught = _fit(tmp_path, callback, datamodule=DataModule(batch_size=64), limit_train_batches=2)
    batch, accumulate = callback.plan.batch_size, trainer.accumulate_grad_batches
    assert batch < 64 and accumulate > 1
    direct = _direct_peak(estimate, batch, accumulate)
    lines = callback.estimate.peak_bytes_at(batch)
    assert direct > lines  # the lines (traced without the accumulation) miss the accumulated gradients
    assert callback.measurements[0]["predicted_peak_bytes"] == direct
    assert callback.state_dict()["predicted_peak_bytes"] == direct
    assert f"accumulate_grad_batches {accumulate} (predicted peak there {format_bytes(direct)}" in callback.summary
    # the check compares the direct estimate with the lines of the accumulating step, and says so
    check = callback.plan.verification.checks[-1]
    assert check.predicted_bytes == callback.estimate.upper_bytes_at(batch) + accumulated_gradient_bytes(
        callback.estimate, batch
    )
    assert any(f"Checked at accumulate_grad_batches {accumulate}:" in str(w.message) for w in caught)


def test_a_resumed_run_predicts_the_restored_batch_and_accumulation(tmp_path, estimate):
    callback = MemoryBudgetCallback(budget=_accumulating_budget(estimate), policy="accumulate")
    trainer, _ = _fit(tmp_path, callback, datamodule=DataModule(batch_size=64), limit_train_batches=2)
    ckpt = str(tmp_path / "run.ckpt")
    trainer.save_checkpoint(ckpt)
    batch, accumulate = callback.plan.batch_size, trainer.accumulate_grad_batches

    resumed = MemoryBudgetCallback(budget="1TiB", policy="accumulate")
    _fit(tmp_path, resumed, datamodule=DataModule(batch_size=64), ckpt_path=ckpt, max_epochs=2, limit_train_batches=2)
    direct = _direct_peak(estimate, batch, accumulate)
    assert resumed.measurements[-1]["predicted_peak_bytes"] == direct != resumed.estimate.peak_bytes_at(batch)


def test_fallback_to_warn_suggests_the_batch_instead_of_claiming_the_change(tmp_path, estimate):
    callback = MemoryBudgetCallback(budget=_accumulating_budget(estimate), policy="shrink")
    trainer = pl.Trainer(**trainer_kwargs(tmp_path, limit_train_batches=1), callbacks=[callback])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(MLP(), train_dataloaders=torch.utils.data.DataLoader(make_dataset(), batch_size=64))
    text = "\n".join(str(w.message) for w in caught if "Falling back" in str(w.message))
    largest = callback.plan.max_fitting_batch_size
    assert 1 <= largest < 64
    assert f"set batch size {largest} yourself" in text
    assert "64 -> " not in text and f"does not fit; largest fitting batch size is {largest}" in text


def test_warn_suggests_an_optimizer_with_less_state_when_no_batch_fits(tmp_path, estimate):
    budget = int(estimate.peak_bytes_at(1) * 0.9)  # not even batch 1 fits
    callback = MemoryBudgetCallback(budget=budget, policy="warn")
    _, caught = _fit(tmp_path, callback, datamodule=DataModule(batch_size=64), limit_train_batches=1)
    assert callback.plan.max_fitting_batch_size == 0
    text = "\n".join(str(w.message) for w in caught)
    state = estimate.breakdown["optimizer_state"]
    assert "does not fit even at batch size 1" in text
    assert f"an optimizer without state (SGD without momentum) saves about {format_bytes(state)}" in text
    assert any(s.kind == "optimizer" and s.saving_bytes == state for s in callback.plan.suggestions)


def test_warnings_point_at_the_users_code(tmp_path, estimate):
    callback = MemoryBudgetCallback(budget=_accumulating_budget(estimate), policy="warn")
    _, caught = _fit(tmp_path, callback, datamodule=DataModule(batch_size=64), limit_train_batches=1)
    assert caught and {w.filename for w in caught} == {__file__}


# -- the accumulation suggestion's effective batch (shared with the other callbacks) --------------------------------
def _lines(batch_size):
    return MemoryEstimate(
        peak_bytes=1_000 + 100 * batch_size,
        breakdown={"parameters": 1_000, "activations": 100 * batch_size},
        batch_size=batch_size,
        phases=(PhaseLine("step", 1_000, 100),),
    )


@pytest.mark.parametrize(
    "batch, budget, wanted",
    [
        (64, 4_000, "batch size 16 with gradient accumulation x4 keeps the effective batch of 64"),  # 30 fit
        (8, 1_300, "batch size 2 with gradient accumulation x4 keeps the effective batch of 8"),  # 3 fit
        (61, 4_000, "batch size 21 with gradient accumulation x3 makes the effective batch 63 (was 61)"),  # prime
    ],
)
def test_the_accumulation_suggestion_keeps_the_effective_batch_or_says_it_does_not(batch, budget, wanted):
    plan = make_plan(_lines(batch), budget, "warn", margin=0.0, verify=False)
    texts = [s.text for s in plan.suggestions if s.kind == "accumulate"]
    assert len(texts) == 1 and texts[0].startswith(wanted), texts


def test_shortening_the_sequence_says_one_decision_and_the_summary_records_it(tmp_path):
    from test_lightning_sequence import Tokens
    from test_lightning_sequence import _estimate as sequence_estimate
    from test_lightning_sequence import _fit as fit_sequence

    long = sequence_estimate(tmp_path, 256)
    budget = int(long.peak_bytes_at(4, seq_len=128) / 0.95) + 1  # 128 fits with the margin, 256 does not
    callback = MemoryBudgetCallback(budget=budget, policy="shrink", seq_len_attr="max_length")
    datamodule = Tokens(max_length=256)
    _, messages = fit_sequence(tmp_path, callback, datamodule, limit_train_batches=1)
    length = datamodule.max_length
    changed = [m for m in messages if "changed the run" in m]
    assert len(changed) == 1 and f"`max_length` 256 -> {length} (batch size 4 kept)" in changed[0]
    assert "batch size 4 -> " not in changed[0]  # the batch change the first plan proposed was not made
    assert f"At `max_length` 256: Predicted peak {format_bytes(long.peak_bytes)} at batch size 4" in changed[0]
    assert f"decision: `max_length` 256 -> {length} (predicted peak {format_bytes(long.peak_bytes)} at 256)" in (
        callback.summary
    )
    assert "training unchanged" not in callback.summary and callback.plan.batch_size == 4
    assert callback.measurements[0]["predicted_peak_bytes"] == callback.estimate.peak_bytes_at(4)
    assert callback.estimate.sequence.seq_len == length
