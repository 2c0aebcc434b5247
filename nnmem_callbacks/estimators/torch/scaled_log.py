"""The traced allocation log as a function of the batch size (for the CUDA allocator replay).

The traces at ``B`` (two steps, with the optimizer), ``2B`` and ``B/4`` (step 1's forward and backward) are paired
event by event, phase by phase, so that each allocation's size is known at any batch
(:class:`~nnmem_callbacks.core.allocation_log.AllocationLog`).

Design (the pairing rules): docs/torch-estimator.md, "The allocation log at any batch".

Known limitations:
    * A phase that runs different events at another batch cannot be paired; the log is then not built and the
      estimate scales the reserve as a ratio of the peak (the estimator notes which phases).

Example:
    >>> from nnmem_callbacks.estimators.torch.tracer import TraceResult
    >>> def trace(n):  # setup: a parameter and the batch; one forward phase
    ...     events = [(1, 400), (2, 8 * n), (3, 100 * n), (4, 50 * n), (3, -1), (4, -1)]
    ...     return TraceResult({"step1/forward": 0}, {}, events, [], {"step1/forward": (2, 6)}, 0, None, 0)
    >>> log, unpaired = build_allocation_log(trace(4), 4, trace(8), 8)
    >>> unpaired, [size for _, size in log.events_at(6)] == [size for _, size in trace(6).events]
    ([], True)
"""

from __future__ import annotations

from nnmem_callbacks.allocators import cuda_caching as allocator
from nnmem_callbacks.core.allocation_log import AllocationLog, pair_phase_sizes
from nnmem_callbacks.estimators.torch.tracer import TraceResult

__all__ = ["build_allocation_log"]


def _sizes(trace: TraceResult, start: int, end: int) -> list[int]:
    return [size for _, size in trace.events[start:end]]


def _setup_end(trace: TraceResult) -> int:
    return min((start for start, _ in trace.phase_ranges.values()), default=len(trace.events))


def _other_sizes(main: TraceResult, other: TraceResult) -> tuple[list[int] | None, list[str]]:
    """Each event of ``main`` sized as in ``other``, or ``None`` with the phases that do not pair."""
    sizes = [size for _, size in main.events]
    paired = list(sizes)
    unpaired: list[str] = []
    setup_main, setup_other = _setup_end(main), _setup_end(other)
    shared = _sizes(other, 0, setup_other)
    if setup_other > setup_main or not pair_phase_sizes(sizes[:setup_other], shared):
        unpaired.append("setup")
    else:
        paired[:setup_other] = shared
    growth: dict[str, list[int]] = {}  # step 1's phases: size in other minus size in main, per event
    for phase, (start, end) in main.phase_ranges.items():
        if not phase.startswith("step1/") or phase not in other.phase_ranges:
            continue
        theirs = _sizes(other, *other.phase_ranges[phase])
        if not pair_phase_sizes(sizes[start:end], theirs):
            unpaired.append(phase)
            continue
        paired[start:end] = theirs
        growth[phase.split("/", 1)[1]] = [b - a if a >= 0 else 0 for a, b in zip(sizes[start:end], theirs)]
    for phase, (start, end) in main.phase_ranges.items():
        base = phase.split("/", 1)[1]
        if phase.startswith("step1/") or base not in growth:
            continue
        reference = main.phase_ranges["step1/" + base]
        if pair_phase_sizes(sizes[start:end], _sizes(main, *reference)):
            deltas = growth[base]
        else:
            deltas = _growth_by_size(_sizes(main, *reference), growth[base], sizes[start:end])
            if deltas is None:
                unpaired.append(f"{phase} (against step 1)")
                continue
        paired[start:end] = [a if a < 0 else max(0, a + delta) for a, delta in zip(sizes[start:end], deltas)]
    return (None if unpaired else paired), unpaired


def _growth_by_size(reference: list[int], growth: list[int], sizes: list[int]) -> list[int] | None:
    """Growth for a step-2 phase whose events are ordered differently from step 1's.

    Step 2 can order its allocations and frees differently from step 1
    (FakeTensorMode's first, uncached call of an op may alias two outputs that
    later calls return separately; an LSTM's backward frees in another order).
    Step 1 also makes the one-time allocations of a process (the cuBLAS
    workspace at the first GEMM of each thread). The k-th allocation of a size
    in step 2 takes the growth of the k-th allocation of that size in step 1;
    ``None`` when step 2 allocates a size, or more of a size, than step 1.

    Example:
        >>> _growth_by_size([10, 20, -1, 10], [0, 5, 0, 7], [10, -1, 20, 10])
        [0, 0, 5, 7]
        >>> _growth_by_size([99, 10, 20], [0, 1, 2], [10, 20]), _growth_by_size([10], [1], [10, 10])
        ([1, 2], None)
    """
    queues: dict[int, list[int]] = {}
    for size, delta in zip(reference, growth):
        if size >= 0:
            queues.setdefault(size, []).append(delta)
    positions: dict[int, int] = {}
    deltas = []
    for size in sizes:
        if size < 0:
            deltas.append(0)
            continue
        index = positions.get(size, 0)
        queue = queues.get(size, [])
        if index >= len(queue):
            return None
        positions[size] = index + 1
        deltas.append(queue[index])
    return deltas


def build_allocation_log(
    main: TraceResult,
    batch_size: int,
    fit: TraceResult,
    fit_size: int,
    check: TraceResult | None = None,
    check_size: int | None = None,
) -> tuple[AllocationLog | None, list[str]]:
    """The main trace's log with every allocation's size as a function of the batch.

    Args:
        main: The trace at ``batch_size`` (what the estimate replays).
        batch_size: Its batch.
        fit: The trace at ``fit_size`` (paired for every batch above
            ``batch_size``, and below it without ``check``).
        check: A trace at ``check_size < batch_size``, paired below
            ``batch_size`` when its phases pair (ignored otherwise, or when
            ``check_size`` is not below ``batch_size``).

    Returns:
        The :class:`AllocationLog` replayed through
        :func:`nnmem_callbacks.allocators.cuda_caching.replay`, or ``None`` with the
        phases that do not pair (with ``fit``, or step 2 with step 1).
    """
    fit_sizes, unpaired = _other_sizes(main, fit)
    if fit_sizes is None:
        return None, unpaired
    check_sizes = None
    if check is not None and check_size is not None and check_size < batch_size:
        check_sizes, _ = _other_sizes(main, check)
    log = AllocationLog(
        batch_size=batch_size,
        keys=tuple(key for key, _ in main.events),
        sizes=tuple(size for _, size in main.events),
        fit_size=fit_size,
        fit_sizes=tuple(fit_sizes),
        replay=allocator.replay,
        check_size=check_size if check_sizes is not None else None,
        check_sizes=tuple(check_sizes) if check_sizes is not None else None,
        model="CUDA caching allocator",
    )
    return log, []
