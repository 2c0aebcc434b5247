"""The framework-free core: MemoryEstimate, batch scaling lines, units, plans."""

from __future__ import annotations

import pytest

from nnmem_callbacks.core.estimate import Category, MemoryEstimate, PhaseLine, upper_envelope
from nnmem_callbacks.core.plan import check_budget, make_plan, resolve_budget
from nnmem_callbacks.core.units import format_bytes, parse_bytes


def _estimate(**overrides):
    fields = dict(
        peak_bytes=1_300,
        breakdown={"parameters": 300, "activations": 1_000},
        batch_size=10,
        phases=(PhaseLine("step1/backward", 300, 100), PhaseLine("step2/optimizer", 900, 5)),
        peak_phase="step1/backward",
    )
    fields.update(overrides)
    return MemoryEstimate(**fields)


def test_breakdown_accepts_enum_and_string_keys_and_fills_missing_categories():
    est = _estimate()
    assert est.breakdown["activations"] == 1_000
    assert est.breakdown[Category.ACTIVATIONS] == 1_000
    assert set(est.breakdown) == {c.value for c in Category}
    assert est.breakdown["optimizer_state"] == 0


def test_unknown_category_is_rejected():
    with pytest.raises(ValueError):
        _estimate(breakdown={"weights": 3})


def test_peak_bytes_at_takes_the_largest_phase_line():
    est = _estimate()
    assert est.peak_bytes_at(10) == 1_300
    assert est.peak_bytes_at(20) == 2_300
    # at batch 1 the optimizer phase dominates: 900 + 5 > 300 + 100
    assert est.peak_bytes_at(1) == 905
    assert (est.fixed_bytes, est.per_sample_bytes) == (300, 100)


def test_max_batch_size_is_the_largest_fitting_batch():
    est = _estimate()
    for budget in (905, 1_000, 1_299, 1_300, 5_000, 10**9):
        best = est.max_batch_size(budget)
        assert est.peak_bytes_at(best) <= budget
        assert est.peak_bytes_at(best + 1) > budget
    assert est.max_batch_size(904) == 0


def test_max_batch_size_with_constant_peak_is_capped():
    est = MemoryEstimate(peak_bytes=10, breakdown={"parameters": 10}, batch_size=1)
    assert est.max_batch_size(100, limit=1024) == 1024


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_peak_bytes_at_rejects_non_positive_batch(bad):
    with pytest.raises(ValueError, match="positive integer"):
        _estimate().peak_bytes_at(bad)


def test_upper_envelope_keeps_only_lines_that_are_ever_the_maximum():
    lines = [
        PhaseLine("a", 100, 1),
        PhaseLine("b", 50, 2),
        PhaseLine("c", 10, 2),
        PhaseLine("d", 0, 1),
        PhaseLine("e", 0, 3),
    ]
    hull = upper_envelope(lines)
    for n in range(1, 400):
        assert max(line.at(n) for line in hull) == max(line.at(n) for line in lines)
    assert {line.phase for line in hull} <= {"a", "b", "e"}


def test_reserved_and_device_bytes_scale_with_the_peak():
    est = _estimate(reserved_bytes=2_600, overhead_bytes=1_000)
    assert est.device_bytes == 3_600
    assert est.reserved_bytes_at(20) == 2 * 2_300
    assert est.max_batch_size(3_600, include_reserve=True) == 10


def test_to_dict_is_json_ready():
    import json

    data = json.loads(json.dumps(_estimate().to_dict()))
    assert data["peak_bytes"] == 1_300
    assert data["per_sample_bytes"] == 100


def test_units_round_trip_and_errors():
    assert parse_bytes("10GiB") == 10 * 1024**3
    assert parse_bytes("16 GB") == 16 * 1000**3
    assert parse_bytes("512") == 512
    assert format_bytes(1536) == "1.50 KiB"
    with pytest.raises(ValueError, match="valid units"):
        parse_bytes("3 parsecs")
    with pytest.raises(ValueError, match="e.g."):
        parse_bytes("lots")


def test_budget_spellings():
    assert resolve_budget("1KiB", capacity_bytes=10) == 1024
    assert resolve_budget(0.25, capacity_bytes=1000) == 250
    assert resolve_budget(None, capacity_bytes=1000, free_bytes=500, margin=0.1) == 450
    assert resolve_budget(123, capacity_bytes=1) == 123
    for bad in (0, -5, 1.5, 0.0, True, [1]):
        with pytest.raises(ValueError, match="budget"):
            check_budget(bad)


def test_plan_policies():
    est = MemoryEstimate(
        peak_bytes=9_000,
        breakdown={"parameters": 1_000, "activations": 8_000},
        batch_size=8,
        phases=(PhaseLine("step1/backward", 1_000, 1_000),),
        peak_phase="step1/backward",
    )
    warn = make_plan(est, 5_300, "warn")
    assert (warn.batch_size, warn.accumulate_grad_batches, warn.fits) == (8, 1, False)
    assert warn.max_fitting_batch_size == 4
    kinds = {s.kind for s in warn.suggestions}
    assert {"accumulate", "checkpointing"} <= kinds
    shrink = make_plan(est, 5_300, "shrink")
    assert (shrink.batch_size, shrink.accumulate_grad_batches) == (4, 1)
    accumulate = make_plan(est, 5_300, "accumulate")
    assert accumulate.batch_size * accumulate.accumulate_grad_batches >= 8
    fits = make_plan(est, 10_000, "shrink")
    assert fits.fits and fits.batch_size == 8
    with pytest.raises(ValueError, match="valid policies"):
        make_plan(est, 1, "explode")
