"""Budgets, policies and plans (framework-free)."""

from __future__ import annotations

import math

import pytest

from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
from nnmem_callbacks.core.plan import (
    POLICIES,
    MemoryBudgetExceeded,
    check_budget,
    check_margin,
    check_policy,
    describe_plan,
    make_plan,
    parse_budget_text,
    resolve_budget,
)

KiB = 1024


def linear_estimate(batch_size=64, fixed=100 * KiB, per_sample=2 * KiB, activations_share=True):
    peak = fixed + per_sample * batch_size
    breakdown = {"parameters": fixed // 4, "gradients": fixed // 4, "optimizer_state": fixed // 2}
    breakdown["activations" if activations_share else "temporaries"] = per_sample * batch_size
    return MemoryEstimate(
        peak_bytes=peak,
        breakdown=breakdown,
        batch_size=batch_size,
        phases=(PhaseLine("step1/backward", fixed, per_sample), PhaseLine("step2/optimizer", fixed + 10 * KiB, 0)),
        peak_phase="step1/backward",
    )


def test_exception_is_runtime_error():
    assert issubclass(MemoryBudgetExceeded, RuntimeError)


@pytest.mark.parametrize("policy", POLICIES)
def test_valid_policies(policy):
    assert check_policy(policy) == policy


def test_invalid_values_name_the_valid_ones():
    with pytest.raises(ValueError, match="'warn', 'raise', 'shrink', 'accumulate'"):
        check_policy("shrinkify")
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        check_margin(1.0)
    for bad in (0, -5, 0.0, 1.5, True, "0GiB", [1]):
        with pytest.raises(ValueError, match="10GiB"):
            check_budget(bad)


def test_resolve_budget_spellings():
    assert resolve_budget(None, capacity_bytes=1000, free_bytes=800, margin=0.1) == 720
    assert resolve_budget(None, capacity_bytes=1000) == 950
    assert resolve_budget(0.25, capacity_bytes=1000) == 250
    assert resolve_budget(1.0, capacity_bytes=1000) == 1000
    assert resolve_budget("2KiB", capacity_bytes=1) == 2048
    assert resolve_budget(4096, capacity_bytes=1) == 4096


def test_fits_changes_nothing():
    est = linear_estimate()
    for policy in POLICIES:
        plan = make_plan(est, est.peak_bytes * 2, policy)
        assert plan.fits and not plan.changed and plan.batch_size == 64 and plan.accumulate_grad_batches == 1
        assert plan.decision == "fits: training unchanged"


@pytest.mark.parametrize("accumulate", [1, 3])
def test_shrink_and_accumulate(accumulate):
    est = linear_estimate()
    budget = 180 * KiB
    usable = int(budget * 0.95)
    expected = (usable - 100 * KiB) // (2 * KiB)
    warn = make_plan(est, budget, "warn", accumulate_grad_batches=accumulate)
    shrink = make_plan(est, budget, "shrink", accumulate_grad_batches=accumulate)
    acc = make_plan(est, budget, "accumulate", accumulate_grad_batches=accumulate)
    assert not warn.fits and warn.batch_size == 64 and warn.max_fitting_batch_size == expected
    assert shrink.batch_size == expected and shrink.accumulate_grad_batches == accumulate
    assert est.peak_bytes_at(shrink.batch_size) <= usable < est.peak_bytes_at(shrink.batch_size + 1)
    steps = math.ceil(64 / expected)
    assert acc.batch_size == math.ceil(64 / steps) <= expected  # the effective batch stays as close as it can
    assert acc.accumulate_grad_batches == accumulate * steps
    assert acc.batch_size * acc.accumulate_grad_batches >= 64 * accumulate


def test_the_accumulate_policy_keeps_the_effective_batch_where_a_divisor_fits():
    est = linear_estimate()  # 100 KiB fixed, 2 KiB a sample, batch 64
    budget = math.ceil((100 + 22 * 2 + 1) * KiB / 0.95)  # the largest batch that fits: 22
    plan = make_plan(est, budget, "accumulate")
    assert plan.max_fitting_batch_size == 22
    assert (plan.batch_size, plan.accumulate_grad_batches) == (16, 4)  # 64 kept, not 22 x 3 = 66
    (suggested,) = [s for s in plan.suggestions if s.kind == "accumulate"]
    assert "batch size 16 with gradient accumulation x4 keeps the effective batch of 64" in suggested.text


def test_nothing_fits():
    est = linear_estimate()
    plan = make_plan(est, 50 * KiB, "shrink")
    assert plan.max_fitting_batch_size == 0 and plan.batch_size == 64
    assert plan.decision == "does not fit even at batch size 1"


def test_suggestions_keep_effective_batch_and_use_alternatives():
    est = linear_estimate()
    bf16 = linear_estimate(fixed=60 * KiB, per_sample=1 * KiB)
    plan = make_plan(est, 180 * KiB, "warn", alternatives={"bf16-mixed": bf16})
    by_kind = {s.kind: s for s in plan.suggestions}
    assert set(by_kind) == {"accumulate", "checkpointing", "bf16-mixed"}
    assert by_kind["bf16-mixed"].saving_bytes == est.peak_bytes - bf16.peak_bytes
    text = by_kind["accumulate"].text
    words = text.split()
    smaller, factor = int(words[2]), int(words[6].lstrip("x"))
    assert smaller <= plan.max_fitting_batch_size and smaller * factor >= 64
    assert by_kind["accumulate"].saving_bytes == est.peak_bytes - est.peak_bytes_at(smaller)


def test_no_checkpointing_advice_when_activations_are_small():
    est = linear_estimate(activations_share=False)
    plan = make_plan(est, 180 * KiB, "warn")
    assert "checkpointing" not in {s.kind for s in plan.suggestions}


def test_describe_plan_has_breakdown_and_advice():
    est = linear_estimate()
    plan = make_plan(est, 180 * KiB, "warn")
    text = describe_plan(plan, est)
    assert "Predicted peak 228.00 KiB at batch size 64 vs budget 180.00 KiB" in text
    assert "activations" in text and f"Largest batch size that fits: {plan.max_fitting_batch_size}" in text
    assert "(171.00 KiB usable, keeping 5% free)" in text  # the margin, stated once
    assert text.count("\n- ") == len(plan.suggestions)


def test_describe_plan_names_the_figure_the_budget_was_checked_against():
    """On CUDA the callbacks budget what the device shows; the first line must not call that the peak, which the
    breakdown's ``peak`` row states as the tensor peak."""
    from nnmem_callbacks.core.formatting import format_breakdown
    from nnmem_callbacks.core.units import format_bytes

    base = linear_estimate()
    device = MemoryEstimate(
        peak_bytes=base.peak_bytes,
        breakdown=base.breakdown,
        batch_size=base.batch_size,
        phases=base.phases,
        reserved_bytes=base.peak_bytes + 32 * KiB,
        overhead_bytes=500 * KiB,
    )
    plan = make_plan(device, 600 * KiB, "warn", include_reserve=True)
    first = describe_plan(plan, device).splitlines()[0]
    assert plan.predicted_bytes == device.device_bytes != device.peak_bytes
    assert first.startswith(
        f"Predicted device use {format_bytes(plan.predicted_bytes)} (tensor peak "
        f"{format_bytes(device.peak_bytes)}, allocator reserve {format_bytes(device.reserved_bytes)}"
    )
    assert format_bytes(device.peak_bytes) in format_breakdown(device)

    varying = MemoryEstimate(
        peak_bytes=base.peak_bytes,
        breakdown=base.breakdown,
        batch_size=base.batch_size,
        phases=base.phases,
        variability=PhaseLine("scheduling", 8 * KiB, 0),
    )
    first = describe_plan(make_plan(varying, 180 * KiB, "warn"), varying).splitlines()[0]
    assert first.startswith(
        f"Predicted peak: estimate {format_bytes(varying.peak_bytes)}, upper bound "
        f"{format_bytes(varying.upper_bytes)} (+8.00 KiB for scheduling"
    )


def test_no_budget_keeps_the_margin_once():
    from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
    from nnmem_callbacks.core.plan import make_plan, planning_margin, resolve_budget

    estimate = MemoryEstimate(
        peak_bytes=1000 + 10 * 64,
        breakdown={"parameters": 1640},
        batch_size=64,
        phases=(PhaseLine("step1/forward", 1000, 10),),
    )
    budget = resolve_budget(None, capacity_bytes=2000, free_bytes=2000, margin=0.1)  # 1800: the margin is out
    plan = make_plan(estimate, budget, "shrink", planning_margin(None, 0.1))
    assert plan.max_fitting_batch_size == estimate.max_batch_size(budget) == 80
    twice = make_plan(estimate, budget, "shrink", 0.1)  # the old behaviour took 10% of 1800 again
    assert twice.max_fitting_batch_size == 62 < plan.max_fitting_batch_size
    assert planning_margin("1GiB", 0.1) == 0.1
    with pytest.raises(ValueError, match="margin"):
        planning_margin("1GiB", 1.5)


def test_the_accumulate_policy_checks_each_batch_at_the_accumulation_it_would_train_with():
    import torch
    from torch import nn

    from nnmem_callbacks.core.plan import make_plan
    from nnmem_callbacks.estimators.torch.estimator import estimate_training

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))

    def loss(m, batch):
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    def batch(n):
        return (torch.empty(n, 2048), torch.zeros(n, dtype=torch.long))

    estimate = estimate_training(model, batch(64), optimizer="sgd", loss_fn=loss)
    accumulated = estimate_training(model, batch(32), optimizer="sgd", loss_fn=loss, accumulate_grad_batches=2)
    # the lines say batch 32 fits; trained as 32 x 2, the first micro-batch's gradients stay live through the second
    budget = (estimate.peak_bytes_at(32) + estimate.peak_bytes) // 2
    assert estimate.peak_bytes_at(32) <= budget < accumulated.peak_bytes
    plan = make_plan(estimate, budget, "accumulate", margin=0.0)
    checked = plan.verification.checks[0]
    assert (checked.batch_size, checked.traced_bytes) == (32, accumulated.peak_bytes)
    assert not plan.fits and plan.accumulate_grad_batches == 1  # no accumulation of this model fits: none is set


def test_the_accumulate_suggestion_counts_the_gradients_that_stay_through_the_micro_batches():
    import torch
    from torch import nn

    from nnmem_callbacks.core.plan import make_plan
    from nnmem_callbacks.estimators.torch.estimator import estimate_training

    def loss(m, batch):
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    def batch(n, width):
        return (torch.empty(n, width), torch.zeros(n, dtype=torch.long))

    def suggestions(model, width, size):
        estimate = estimate_training(model, batch(size, width), optimizer="sgd", loss_fn=loss)
        plan = make_plan(estimate, estimate.peak_bytes_at(size // 2) + 1, "warn", margin=0.0)
        accumulated = estimate_training(
            model, batch(size // 2, width), optimizer="sgd", loss_fn=loss, accumulate_grad_batches=2
        )
        return estimate, [s for s in plan.suggestions if s.kind == "accumulate"], accumulated

    torch.manual_seed(0)
    # activations dominate: half the batch twice saves memory, and the saving promised is what the step keeps
    wide = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    estimate, (suggestion,), accumulated = suggestions(wide, 64, 2048)
    assert "with gradient accumulation x2" in suggestion.text
    promised = estimate.peak_bytes - suggestion.saving_bytes
    assert accumulated.peak_bytes <= promised < 1.05 * accumulated.peak_bytes
    # parameters dominate: 256 x 2 keeps more than 512 x 1 (the first micro-batch's gradients), so no such offer
    heavy = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    estimate, offered, accumulated = suggestions(heavy, 1024, 512)
    assert accumulated.peak_bytes > estimate.peak_bytes and offered == []


def test_every_size_the_budget_error_suggests_is_a_budget():
    import re

    with pytest.raises(ValueError) as info:
        parse_budget_text("abc")
    examples = re.findall(r"'([^']+)'", str(info.value).split("; ", 1)[1])
    assert "1048576B" in examples and "1048576" not in examples
    for example in examples:
        assert parse_budget_text(example) > 0  # each one the message offers is read


def test_no_checkpointing_advice_to_a_step_that_already_checkpoints():
    est = linear_estimate()
    assert "checkpointing" in {s.kind for s in make_plan(est, 180 * KiB, "warn").suggestions}
    checkpointed = MemoryEstimate(
        peak_bytes=est.peak_bytes,
        breakdown=est.breakdown,
        batch_size=est.batch_size,
        phases=est.phases,
        extra={"activation_checkpointing": True},
    )
    assert "checkpointing" not in {s.kind for s in make_plan(checkpointed, 180 * KiB, "warn").suggestions}
