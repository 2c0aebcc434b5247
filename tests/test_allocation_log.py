"""The allocation log scaled to another batch and replayed through the CUDA allocator model.

Every expected reserve below is worked out by hand from the caching allocator's
rules as :mod:`nnmem_callbacks.allocators.cuda_caching` states them (512-byte rounding;
requests up to 1 MiB in 2 MiB small-pool segments; larger ones in a 20 MiB
segment below 10 MiB and in a segment rounded up to 2 MiB from 10 MiB; best fit;
large blocks split only when more than 1 MiB remains).
"""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from nnmem_callbacks.allocators import cuda_caching as allocator
from nnmem_callbacks.core.allocation_log import AllocationLog
from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine

MiB = 2**20


def line_log(batch_size, fit_size, events, check_size=None):
    """A log whose allocations are ``fixed + per_sample * n``: ``events`` is ``(key, fixed, per_sample)``, per_sample -1 frees."""

    def at(n):
        return tuple(-1 if per_sample == -1 else fixed + per_sample * n for _, fixed, per_sample in events)

    return AllocationLog(
        batch_size=batch_size,
        keys=tuple(key for key, _, _ in events),
        sizes=at(batch_size),
        fit_size=fit_size,
        fit_sizes=at(fit_size),
        replay=allocator.replay,
        check_size=check_size,
        check_sizes=at(check_size) if check_size is not None else None,
    )


# a parameter of 8 MiB, then two activations of 3 MiB per sample alive together
TWO_ACTIVATIONS = [(1, 8 * MiB, 0), (2, 0, 3 * MiB), (3, 0, 3 * MiB), (2, 0, -1), (3, 0, -1)]


def two_activation_estimate():
    log = line_log(2, 4, TWO_ACTIVATIONS)
    return MemoryEstimate(
        peak_bytes=20 * MiB,
        breakdown={"parameters": 8 * MiB, "activations": 12 * MiB},
        batch_size=2,
        phases=(PhaseLine("step1/forward", 8 * MiB, 6 * MiB),),
        peak_phase="step1/forward",
        reserved_bytes=allocator.replay(log.events_at(2)).peak_reserved,
        allocation_log=log,
    )


def test_reserve_at_another_batch_follows_the_allocator_not_the_peak_ratio():
    est = two_activation_estimate()
    # batch 2: the parameter opens a 20 MiB segment and is split off it (12 MiB left); the two
    # 6 MiB activations take 6 MiB of the rest (split) and then the last 6 MiB exactly
    assert est.reserved_bytes == 20 * MiB and est.peak_bytes == 20 * MiB
    # batch 3: the first 9 MiB activation splits the 12 MiB block (3 MiB left, more than 1 MiB);
    # the second finds only 3 MiB free and, being below 10 MiB, opens another 20 MiB segment
    assert est.peak_bytes_at(3) == 26 * MiB
    assert est.reserved_bytes_at(3) == 40 * MiB
    ratio = est.peak_bytes_at(3) * est.reserved_bytes // est.peak_bytes
    assert ratio == 26 * MiB  # what scaling the reserve as a ratio of the peak said
    # batch 4: 12 MiB fits the 12 MiB block exactly; the second 12 MiB (>= 10 MiB) gets a 12 MiB segment
    assert est.reserved_bytes_at(4) == 32 * MiB
    # batch 5: 15 MiB each, two new segments rounded to 16 MiB (1 MiB left in each: not split)
    assert est.reserved_bytes_at(5) == 52 * MiB
    assert est.allocation_log.replay_at(5).peak_allocated == (8 + 16 + 16) * MiB
    # a reserve that falls from batch 3 to batch 4 is no multiple of the peak at all
    assert est.reserved_bytes_at(3) > est.reserved_bytes_at(4)


def test_small_pool_segments_fill_by_whole_blocks():
    # 30 activations of 1000 bytes per sample, alive together
    events = [(k, 0, 1000) for k in range(1, 31)] + [(k, 0, -1) for k in range(1, 31)]
    log = line_log(50, 100, events)
    # batch 50: 50000 B rounds to 50176 (98 x 512); 30 of them (1.44 MiB) share one 2 MiB segment
    assert log.replay_at(50).peak_reserved == 2 * MiB
    # batch 70: 70144 B each (137 x 512); a 2 MiB segment holds 29 of them (the rest, 63 KiB, is too small)
    assert log.replay_at(70) == log.replay_at(70)
    assert log.replay_at(70).peak_reserved == 4 * MiB
    assert log.replay_at(70).peak_allocated == 30 * 70144
    est = MemoryEstimate(
        peak_bytes=30 * 50176,
        breakdown={"activations": 30 * 50176},
        batch_size=50,
        phases=(PhaseLine("step1/forward", 0, 30 * 1000),),
        reserved_bytes=2 * MiB,
        allocation_log=log,
    )
    assert est.reserved_bytes_at(70) == 4 * MiB
    assert (
        est.reserved_bytes_at(70) > est.peak_bytes_at(70) * est.reserved_bytes / est.peak_bytes
    )  # the ratio: 2.93 MiB


def test_sizes_are_exact_at_every_traced_batch_and_interpolated_between():
    log = AllocationLog(
        batch_size=8,
        keys=(1, 2, 2),
        sizes=(4096, 800, -1),
        fit_size=16,
        fit_sizes=(4096, 1600, -1),
        replay=allocator.replay,
        check_size=2,
        check_sizes=(4096, 500, -1),
    )
    assert log.sizes_at(8) == [4096, 800, -1]
    assert log.sizes_at(16) == [4096, 1600, -1]
    assert log.sizes_at(2) == [4096, 500, -1]
    assert log.sizes_at(32) == [4096, 3200, -1]  # above: through batch 8 and 16
    assert log.sizes_at(4) == [4096, 600, -1]  # below: through batch 2 and 8 (50 per sample, not 100)
    assert log.sizes_at(1) == [4096, 450, -1]


def test_a_log_that_does_not_pair_is_refused():
    with pytest.raises(ValueError, match="free"):
        AllocationLog(
            batch_size=1, keys=(1, 1), sizes=(10, -1), fit_size=2, fit_sizes=(20, 30), replay=allocator.replay
        )
    with pytest.raises(ValueError, match="one entry per event"):
        AllocationLog(batch_size=1, keys=(1,), sizes=(10, -1), fit_size=2, fit_sizes=(20, -1), replay=allocator.replay)
    with pytest.raises(ValueError, match="below"):
        AllocationLog(
            batch_size=4,
            keys=(1,),
            sizes=(10,),
            fit_size=8,
            fit_sizes=(20,),
            replay=allocator.replay,
            check_size=4,
            check_sizes=(10,),
        )


def test_replays_are_cached_per_batch():
    calls = []

    def counting(events):
        calls.append(1)
        return allocator.replay(events)

    log = dataclasses.replace(line_log(2, 4, TWO_ACTIVATIONS), replay=counting)
    for _ in range(3):
        log.replay_at(3)
    log.replay_at(4)
    assert len(calls) == 2


def test_max_batch_size_uses_the_replayed_reserve():
    est = two_activation_estimate()
    # budget 30 MiB: by the peak ratio, batch 3 (26 MiB) fits; the replay says batch 3 needs 40 MiB,
    # batch 2 needs 20 MiB, batch 4 needs 32 MiB
    assert est.max_batch_size(30 * MiB, include_reserve=True) == 2
    assert est.max_batch_size(30 * MiB) == 3  # the tensor peak alone


def test_the_estimate_pickles_with_its_log_and_without_its_verifier():
    est = dataclasses.replace(two_activation_estimate(), verifier=lambda n: None)
    copy = pickle.loads(pickle.dumps(est))
    assert copy.verifier is None
    assert copy.reserved_bytes_at(3) == 40 * MiB
    assert est.to_dict()["allocation_log"] == {"events": 5, "batch_sizes": [2, 4], "model": ""}


# -- the log built from traces ---------------------------------------------------------------


def _trace(events, phase_ranges):
    from nnmem_callbacks.estimators.torch.tracer import TraceResult

    return TraceResult({phase: 0 for phase in phase_ranges}, {}, events, [], phase_ranges, 0, None, 0)


def _step_events(n, extra_free=False):
    """Setup (a parameter, the batch), step 1 (forward, backward), step 2 (forward, optimizer)."""
    setup = [(1, 4096), (2, 64 * n)]
    forward = [(3, 1000 * n), (4, 500)]
    backward = [(4, -1), (5, 4096), (3, -1)] + ([(5, -1)] if extra_free else [])
    forward2 = [(6, 1000 * n), (7, 500)]
    optimizer = [(8, 4096), (8, -1)]
    events = setup + forward + backward
    ranges = {"step1/forward": (2, 4), "step1/backward": (4, len(events))}
    return events, ranges, forward2, optimizer


def test_build_log_pairs_step_one_and_reuses_its_growth_in_step_two():
    from nnmem_callbacks.estimators.torch.scaled_log import build_allocation_log

    events, ranges, forward2, optimizer = _step_events(8)
    start = len(events)
    main_events = events + forward2 + optimizer
    main_ranges = dict(ranges, **{"step2/forward": (start, start + 2), "step2/optimizer": (start + 2, start + 4)})
    main = _trace(main_events + [(9, 7)], main_ranges)  # one setup-free event after the last phase (teardown)
    fit_events, fit_ranges, _, _ = _step_events(16)
    log, unpaired = build_allocation_log(main, 8, _trace(fit_events, fit_ranges), 16)
    assert unpaired == []
    sizes = log.sizes_at(24)
    # batch, activations of step 1 and 2 scale; parameter, step-1 temporaries, optimizer, teardown do not
    assert sizes == [4096, 64 * 24, 24000, 500, -1, 4096, -1, 24000, 500, 4096, -1, 7]


def test_build_log_refuses_phases_that_run_other_events_at_another_batch():
    from nnmem_callbacks.estimators.torch.scaled_log import build_allocation_log

    events, ranges, _, _ = _step_events(8)
    fit_events, fit_ranges, _, _ = _step_events(16, extra_free=True)
    log, unpaired = build_allocation_log(_trace(events, ranges), 8, _trace(fit_events, fit_ranges), 16)
    assert log is None and unpaired == ["step1/backward"]


# -- the log of a real trace (CPU kernels, CUDA target) -----------------------------------------


def _mlp():
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(1000, 300),
        torch.nn.ReLU(),
        torch.nn.Linear(300, 300),
        torch.nn.ReLU(),
        torch.nn.Linear(300, 10),
    )


def test_scaled_replay_at_the_estimate_batch_is_the_estimate_reserve():
    import torch

    from nnmem_callbacks import estimate_training

    est = estimate_training(_mlp(), torch.empty(64, 1000, device="meta"), optimizer="adam", device="cuda")
    assert est.allocation_log is not None and len(est.allocation_log) > 10
    assert est.allocation_log.replay_at(64).peak_reserved == est.reserved_bytes
    assert est.reserved_bytes_at(64) == est.reserved_bytes


@pytest.mark.parametrize("batch_size", [5, 100, 1000])
def test_scaled_replay_equals_a_direct_trace_of_a_linear_model(batch_size):
    import torch

    from nnmem_callbacks import estimate_training

    est = estimate_training(_mlp(), torch.empty(64, 1000, device="meta"), optimizer="adam", device="cuda")
    direct = est.verifier(batch_size)
    assert direct.batch_size == batch_size
    assert est.allocation_log.replay_at(batch_size).peak_reserved == direct.reserved_bytes
    assert est.reserved_bytes_at(batch_size) == max(direct.reserved_bytes, est.peak_bytes_at(batch_size))


def test_without_scaling_traces_the_reserve_scales_by_ratio_and_says_so():
    import torch

    from nnmem_callbacks import estimate_training

    est = estimate_training(
        _mlp(), torch.empty(64, 1000, device="meta"), optimizer="adam", device="cuda", check_scaling=False
    )
    assert est.allocation_log is None
    assert any("ratio of the peak" in note for note in est.notes)
    assert est.reserved_bytes_at(128) == round(est.peak_bytes_at(128) * est.reserved_bytes / est.peak_bytes)


@pytest.mark.parametrize("budget_mib", range(10, 200, 7))
def test_the_search_over_replays_ends_on_a_fitting_batch_whose_next_does_not(budget_mib):
    # the reserve of this log is not monotone in the batch (40 MiB at 3, 32 MiB at 4): whatever the
    # search visits, its answer fits and one more sample does not
    est = two_activation_estimate()
    budget = budget_mib * MiB
    answer = est.max_batch_size(budget, include_reserve=True)
    if answer == 0:
        assert est.device_bytes_at(1) > budget
    else:
        assert est.device_bytes_at(answer) <= budget < est.device_bytes_at(answer + 1)


def test_the_search_replays_the_log_at_few_batch_sizes():
    events = [(1, 8 * MiB, 0)] + [(k, 0, 3 * MiB + 4096 * k) for k in range(2, 40)] + [(k, 0, -1) for k in range(2, 40)]
    log = line_log(4, 8, events)
    est = MemoryEstimate(
        peak_bytes=log.replay_at(4).peak_allocated,
        breakdown={"activations": 1},
        batch_size=4,
        phases=(PhaseLine("step", 8 * MiB, sum(3 * MiB + 4096 * k for k in range(2, 40))),),
        reserved_bytes=log.replay_at(4).peak_reserved,
        allocation_log=log,
    )
    answer = est.max_batch_size(64 * 2**30, include_reserve=True)
    assert est.device_bytes_at(answer) <= 64 * 2**30 < est.device_bytes_at(answer + 1)
    assert len(log._cache) <= 8  # a bisection from batch 1 would replay about 2 * log2(answer) = 16 times


def _two_step_trace(n, reorder=False, extra=False):
    setup = [(1, 4096), (2, 64 * n)]
    forward1 = [(3, 1000 * n), (4, 4096), (4, -1), (5, 1000 * n)]
    # step 2 frees the temporary after the second activation (another order) or allocates another size
    forward2 = (
        [(6, 1000 * n), (7, 4096), (8, 1000 * n), (7, -1)]
        if reorder
        else [(6, 1000 * n), (7, 4096), (7, -1), (8, 1000 * n)]
    )
    if extra:
        forward2 = forward2 + [(9, 123)]
    events = setup + forward1 + forward2
    ranges = {"step1/forward": (2, 6), "step2/forward": (6, len(events))}
    return _trace(events, ranges)


def test_step_two_in_another_order_pairs_by_size_and_rank():
    from nnmem_callbacks.estimators.torch.scaled_log import build_allocation_log

    fit = _trace(_two_step_trace(16).events[:6], {"step1/forward": (2, 6)})
    log, unpaired = build_allocation_log(_two_step_trace(8, reorder=True), 8, fit, 16)
    assert unpaired == [] and log.sizes_at(24) == [size for _, size in _two_step_trace(24, reorder=True).events]
    log, unpaired = build_allocation_log(_two_step_trace(8, extra=True), 8, fit, 16)
    assert log is None and unpaired == ["step2/forward (against step 1)"]
