"""The largest batch checked by direct estimates: step-down, plans, records (framework-free fakes)."""

from __future__ import annotations

import json
import math

import pytest

from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
from nnmem_callbacks.core.plan import describe_plan, make_plan
from nnmem_callbacks.core.verification import MAX_VERIFY_STEPS, verify_batch_size

KiB = 1024


def line_estimate(batch_size, fixed=100 * KiB, per_sample=2 * KiB, reserve_extra=None, verifier=None):
    """An estimate whose peak is ``fixed + per_sample * n``; ``reserve_extra(n)`` adds an allocator reserve."""
    peak = fixed + per_sample * batch_size
    return MemoryEstimate(
        peak_bytes=peak,
        breakdown={"parameters": fixed, "activations": per_sample * batch_size},
        batch_size=batch_size,
        phases=(PhaseLine("step1/backward", fixed, per_sample),),
        peak_phase="step1/backward",
        reserved_bytes=None if reserve_extra is None else peak + reserve_extra(batch_size),
        verifier=verifier,
    )


class FakeTracer:
    """A direct estimate whose growth per sample is larger than the lines said (and counts its calls)."""

    def __init__(self, per_sample=2 * KiB + 300, fixed=100 * KiB, extra=0):
        self.per_sample, self.fixed, self.extra, self.calls = per_sample, fixed, extra, []

    def __call__(self, batch_size):
        self.calls.append(batch_size)
        return line_estimate(batch_size, self.fixed + self.extra, self.per_sample)


def truth_max(tracer, budget):
    return (budget - tracer.fixed - tracer.extra) // tracer.per_sample


@pytest.mark.parametrize("budget", [300 * KiB, 1000 * KiB, 10_000 * KiB])
def test_step_down_ends_at_a_batch_the_direct_estimate_fits(budget):
    tracer = FakeTracer()
    est = line_estimate(64, verifier=tracer)
    lines = est.max_batch_size(budget, verify=False)
    check = est.verify_max_batch_size(budget)
    assert check.predicted_batch_size == lines > truth_max(tracer, budget)
    assert check.verified and check.stepped_down
    assert tracer(check.batch_size).peak_bytes <= budget
    # tight: the step-down lands on the true largest batch or within 2% of it
    assert truth_max(tracer, budget) * 0.98 <= check.batch_size <= truth_max(tracer, budget)
    assert len(check.checks) <= MAX_VERIFY_STEPS
    assert [c.fits for c in check.checks][0] is False
    assert est.max_batch_size(budget) == check.batch_size  # max_batch_size verifies by default


def test_a_constant_miss_steps_down_safely():
    tracer = FakeTracer(per_sample=2 * KiB, extra=150 * KiB)  # same growth, 150 KiB more fixed
    est = line_estimate(64, verifier=tracer)
    check = est.verify_max_batch_size(1000 * KiB)
    assert check.verified and check.batch_size == truth_max(tracer, 1000 * KiB)
    assert len(check.checks) == 2  # the miss taken as constant is right at once


def test_an_answer_that_fits_is_checked_once_and_kept():
    tracer = FakeTracer(per_sample=2 * KiB - 100)  # the direct estimate is smaller: no step up past the lines
    est = line_estimate(64, verifier=tracer)
    check = est.verify_max_batch_size(1000 * KiB)
    assert check.verified and not check.stepped_down and tracer.calls == [check.batch_size]
    assert check.batch_size == est.max_batch_size(1000 * KiB, verify=False)


def test_step_down_is_bounded_and_says_when_nothing_was_verified():
    tracer = FakeTracer()
    est = line_estimate(64, verifier=tracer)
    check = verify_batch_size(
        est, 1000 * KiB, verifier=tracer, candidate=est.max_batch_size(1000 * KiB, verify=False), max_steps=1
    )
    assert len(tracer.calls) == 1 and not check.verified
    assert 1 <= check.batch_size < check.predicted_batch_size  # stepped down once, not checked again
    assert check.text.startswith(f"batch {check.batch_size} not verified")
    with pytest.raises(ValueError, match="max_steps"):
        verify_batch_size(est, 1000 * KiB, verifier=tracer, candidate=10, max_steps=0)


def test_noisy_misses_that_grow_as_the_batch_shrinks_do_not_end_at_zero():
    # a runtime whose peak moves from run to run (TensorFlow's scheduling): the direct estimate at 450 misses by
    # 60 KiB, the one at 420 by 120 KiB. The line through the two misses grows by 2 KiB per sample removed, as fast
    # as the lines fall, so it leaves no batch; the largest miss taken as constant leaves 390, which fits
    misses = iter([60 * KiB, 120 * KiB, 120 * KiB, 120 * KiB])
    calls = []

    def noisy(n):
        calls.append(n)
        return line_estimate(n, fixed=100 * KiB + next(misses))

    est = line_estimate(64, verifier=noisy)
    check = est.verify_max_batch_size(1000 * KiB)
    assert calls == [450, 420, 390]
    assert check.verified and check.batch_size == 390


def test_a_step_that_never_fits_ends_at_zero_after_checking_one_sample():
    est = line_estimate(64, verifier=lambda n: line_estimate(n, fixed=10**9))
    check = est.verify_max_batch_size(1000 * KiB)
    assert check.batch_size == 0 and not check.verified
    assert [c.batch_size for c in check.checks] == [450, 1]


def test_nothing_fits_is_said_only_after_a_batch_of_one_was_checked():
    # noisy direct estimates (JAX's on a walkthrough): 500 KiB over the lines at 450, 900 KiB at 200, nothing at
    # one sample. Neither the line through the two misses nor the worse one taken as constant leaves a batch
    misses = {450: 500 * KiB, 200: 900 * KiB}

    def direct(n):
        return line_estimate(n, fixed=100 * KiB + misses.get(n, 0))

    est = line_estimate(64, verifier=direct)
    check = est.verify_max_batch_size(1000 * KiB)
    assert [c.batch_size for c in check.checks][:3] == [450, 200, 1] and check.checks[2].fits
    assert (
        check.verified
        and check.batch_size >= 1
        and all(c.fits for c in check.checks if c.batch_size <= check.batch_size)
    )


def test_a_failing_direct_estimate_keeps_the_answer_unverified():
    def broken(n):
        raise RuntimeError("no trace today")

    est = line_estimate(64, verifier=broken)
    check = est.verify_max_batch_size(1000 * KiB)
    assert not check.verified and check.batch_size == est.max_batch_size(1000 * KiB, verify=False)
    assert check.checks[0].traced_bytes is None and "no trace today" in check.checks[0].error
    assert "failed" in check.text


def test_nothing_fits_gives_zero_without_tracing():
    tracer = FakeTracer()
    est = line_estimate(64, verifier=tracer)
    assert est.verify_max_batch_size(50 * KiB).batch_size == 0 and tracer.calls == []
    with pytest.raises(ValueError, match="no verifier"):
        line_estimate(64).verify_max_batch_size(1000 * KiB)


def test_the_reserve_is_what_is_verified_with_include_reserve():
    # lines: reserve 10% above the peak; the direct estimate: 25% above it
    def direct(n):
        return line_estimate(n, reserve_extra=lambda m: (100 * KiB + 2 * KiB * m) // 4)

    est = line_estimate(64, reserve_extra=lambda m: (100 * KiB + 2 * KiB * m) // 10, verifier=direct)
    check = est.verify_max_batch_size(2000 * KiB, include_reserve=True)
    assert check.measure == "device" and check.stepped_down and check.verified
    assert direct(check.batch_size).device_bytes <= 2000 * KiB < direct(check.batch_size + 1).device_bytes


# -- plans ------------------------------------------------------------------------------------


def test_shrink_plan_steps_down_and_records_the_checks():
    tracer = FakeTracer()
    est = line_estimate(512, verifier=tracer)
    plan = make_plan(est, 1000 * KiB, "shrink", margin=0.05)
    usable = int(1000 * KiB * 0.95)
    assert plan.verification is not None and plan.verification.verified
    assert plan.batch_size == plan.max_fitting_batch_size == truth_max(tracer, usable)
    assert plan.verification.predicted_batch_size == est.max_batch_size(usable, verify=False) > plan.batch_size
    assert tracer(plan.batch_size).peak_bytes <= usable
    assert "Checked: verified batch" in describe_plan(plan, est)
    json.dumps(plan.verification.to_dict())


def test_accumulate_plan_verifies_the_batch_it_trains_with():
    tracer = FakeTracer()
    est = line_estimate(512, verifier=tracer)
    plan = make_plan(est, 1000 * KiB, "accumulate", margin=0.0)
    assert plan.verification.verified
    assert tracer.calls[-1] == plan.batch_size or plan.batch_size in tracer.calls
    assert tracer(plan.batch_size).peak_bytes <= 1000 * KiB
    assert plan.batch_size * (plan.accumulate_grad_batches) >= 512
    assert plan.accumulate_grad_batches == math.ceil(512 / plan.batch_size)


def test_plans_that_change_nothing_trace_nothing_unless_asked():
    tracer = FakeTracer()
    est = line_estimate(512, verifier=tracer)
    assert make_plan(est, 1000 * KiB, "warn").verification is None  # warn: nothing changes
    assert make_plan(est, 10_000 * KiB, "shrink").verification is None  # fits as it is
    assert make_plan(est, 1000 * KiB, "shrink", verify=False).verification is None
    assert tracer.calls == []
    plan = make_plan(est, 1000 * KiB, "warn", margin=0.0, verify=True)
    assert plan.batch_size == 512 and plan.max_fitting_batch_size == truth_max(tracer, 1000 * KiB)


def test_an_explicit_verifier_replaces_the_estimates_own():
    own, explicit = FakeTracer(), FakeTracer(per_sample=3 * KiB)
    est = line_estimate(512, verifier=own)
    plan = make_plan(est, 1000 * KiB, "shrink", margin=0.0, verifier=explicit)
    assert own.calls == [] and explicit.calls
    assert plan.batch_size == truth_max(explicit, 1000 * KiB)


def test_a_flat_phase_below_does_not_end_the_search_at_zero():
    # lines: backward 100 KiB + 2 KiB/sample, an optimizer phase flat at 180 KiB; truth: 2.5 KiB/sample
    def estimate(n, per_sample, verifier=None):
        phases = (PhaseLine("step1/backward", 100 * KiB, per_sample), PhaseLine("step2/optimizer", 180 * KiB, 0))
        peak = max(line.at(n) for line in phases)
        return MemoryEstimate(
            peak_bytes=peak, breakdown={"parameters": peak}, batch_size=n, phases=phases, verifier=verifier
        )

    truth = []
    est = estimate(64, 2 * KiB, verifier=lambda n: truth.append(n) or estimate(n, 2 * KiB + KiB // 2))
    check = est.verify_max_batch_size(200 * KiB)
    # a constant miss of 25 KiB (at 50) would leave nothing above the flat 180 KiB; the miss in proportion
    # to the batch gives 40, which the direct estimate confirms (exactly 200 KiB)
    assert check.predicted_batch_size == 50 and truth == [50, 40]
    assert check.verified and check.batch_size == 40


def test_verify_true_checks_the_reported_largest_batch_even_when_the_run_fits():
    tracer = FakeTracer()
    est = line_estimate(16, verifier=tracer)
    plan = make_plan(est, 1000 * KiB, "warn", margin=0.0, verify=True)
    assert plan.fits and plan.batch_size == 16
    assert plan.verification.verified and plan.max_fitting_batch_size == truth_max(tracer, 1000 * KiB)
