"""The allocations of a training step as functions of the batch size, and their replay.

A traced training step is a log of allocations and frees. Traced at batch
``B`` and again at ``2B`` (and ``B/4``), the two logs pair one to one wherever
the step runs the same ops, and each allocation's size becomes a function of
the batch: a straight line through its sizes at ``B`` and ``2B`` (and, below
``B``, through its sizes at ``B/4`` and ``B``). :class:`AllocationLog` holds
those sizes; :meth:`AllocationLog.events_at` rebuilds the log at any batch and
:meth:`AllocationLog.replay_at` runs it through an allocator model, so that a
caching allocator's reserve at batch ``n`` is predicted from the allocations at
``n`` (rounding, segment sizes, splitting), not as a ratio of the tensor peak.

The allocator model is injected (``replay``): this module is framework-free;
the PyTorch estimator passes :func:`nnmem_callbacks.allocators.cuda_caching.replay`.

Example:
    >>> from nnmem_callbacks.core.allocation_log import AllocationLog
    >>> def total(events):  # a toy allocator: everything ever allocated stays reserved
    ...     return AllocatorPeaks(0, sum(size for _, size in events if size >= 0))
    >>> log = AllocationLog(batch_size=4, keys=(1, 1, 2), sizes=(100, -1, 400),
    ...                     fit_size=8, fit_sizes=(100, -1, 800), replay=total)
    >>> [size for _, size in log.events_at(6)]
    [100, -1, 600]
    >>> log.replay_at(6).peak_reserved
    700
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

__all__ = ["AllocationLog", "pair_phase_sizes", "ReplayFn", "AllocatorPeaks"]

#: A replay: time-ordered ``(key, size)`` events (``size`` -1 frees ``key``) ->
#: an object with ``peak_allocated`` and ``peak_reserved``.
ReplayFn = Callable[[Iterable[tuple[int, int]]], Any]


@dataclasses.dataclass(frozen=True)
class AllocatorPeaks:
    """Peaks an allocator model reports for one log."""

    peak_allocated: int
    peak_reserved: int


@dataclasses.dataclass(frozen=True)
class AllocationLog:
    """A training step's allocation log with each allocation's size as a function of the batch.

    The log has the event order of the trace at :attr:`batch_size`; only the
    sizes change with the batch. An allocation's size at batch ``n`` is
    interpolated (or extrapolated) linearly through its sizes at
    :attr:`batch_size` and :attr:`fit_size` for ``n >= batch_size``, and through
    its sizes at :attr:`check_size` and :attr:`batch_size` below it when a
    smaller trace was paired (growth that is not linear, such as a workspace
    that saturates, then stays exact at the three traced sizes).

    Attributes:
        batch_size: The batch of the main trace (the estimate's batch).
        keys: The storage key of each event.
        sizes: Each event's size at ``batch_size``; ``-1`` frees the key.
        fit_size: The batch of the trace above ``batch_size``.
        fit_sizes: Each event's size at ``fit_size`` (``-1`` for frees).
        check_size: The batch of a trace below ``batch_size``, or ``None``.
        check_sizes: Each event's size at ``check_size``, or ``None``.
        replay: The allocator model (see :data:`ReplayFn`); excluded from
            comparisons.
        model: A name for the allocator model, for reports.
    """

    batch_size: int
    keys: tuple[int, ...]
    sizes: tuple[int, ...]
    fit_size: int
    fit_sizes: tuple[int, ...]
    replay: ReplayFn = dataclasses.field(compare=False, repr=False)
    check_size: int | None = None
    check_sizes: tuple[int, ...] | None = None
    model: str = ""
    _cache: dict = dataclasses.field(default_factory=dict, compare=False, repr=False, init=False)

    def __post_init__(self) -> None:
        count = len(self.keys)
        if len(self.sizes) != count or len(self.fit_sizes) != count:
            raise ValueError(
                f"keys, sizes and fit_sizes must have one entry per event; got {count}, {len(self.sizes)}, {len(self.fit_sizes)}"
            )
        if self.check_sizes is not None and (self.check_size is None or len(self.check_sizes) != count):
            raise ValueError("check_sizes needs check_size and one entry per event")
        if self.fit_size == self.batch_size or (self.check_size is not None and self.check_size >= self.batch_size):
            raise ValueError(
                f"fit_size must differ from batch_size and check_size must be below it; got batch {self.batch_size}, "
                f"fit {self.fit_size}, check {self.check_size}"
            )
        for name, values in (
            ("sizes", self.sizes),
            ("fit_sizes", self.fit_sizes),
            ("check_sizes", self.check_sizes or self.sizes),
        ):
            if any((a < 0) != (b < 0) for a, b in zip(self.sizes, values)):
                raise ValueError(f"{name} must free (-1) exactly where sizes frees")

    def __len__(self) -> int:
        return len(self.keys)

    def sizes_at(self, batch_size: int) -> list[int]:
        """Each event's size at ``batch_size`` (``-1`` for frees; an allocation is at least 0)."""
        base = self.batch_size
        if batch_size == base:
            return list(self.sizes)
        if batch_size < base and self.check_sizes is not None:
            other, other_sizes = self.check_size, self.check_sizes
        else:
            other, other_sizes = self.fit_size, self.fit_sizes
        span = other - base
        step = batch_size - base
        if span < 0:
            span, step = -span, -step
        # size + delta * step / span, rounded half up: exact at both traced batches
        return [
            size
            if size < 0 or size == other_size
            else max(0, size + (2 * (other_size - size) * step + span) // (2 * span))
            for size, other_size in zip(self.sizes, other_sizes)
        ]

    def events_at(self, batch_size: int) -> list[tuple[int, int]]:
        """The log at ``batch_size``: ``(key, size)`` events, ``-1`` freeing ``key``."""
        return list(zip(self.keys, self.sizes_at(batch_size)))

    def replay_at(self, batch_size: int) -> AllocatorPeaks:
        """The allocator model's peaks for the log at ``batch_size`` (cached per batch)."""
        cached = self._cache.get(batch_size)
        if cached is None:
            result = self.replay(self.events_at(batch_size))
            cached = self._cache[batch_size] = AllocatorPeaks(int(result.peak_allocated), int(result.peak_reserved))
        return cached

    def summary(self) -> dict[str, Any]:
        """Plain values describing the log (for ``MemoryEstimate.to_dict``)."""
        return {
            "events": len(self),
            "batch_sizes": [size for size in (self.check_size, self.batch_size, self.fit_size) if size is not None],
            "model": self.model,
        }

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def pair_phase_sizes(sizes_a: Sequence[int], sizes_b: Sequence[int]) -> bool:
    """Whether two event-size sequences pair one to one (same length, frees at the same places).

    Example:
        >>> pair_phase_sizes([10, -1, 20], [20, -1, 40]), pair_phase_sizes([10, -1], [20, 30])
        (True, False)
    """
    return len(sizes_a) == len(sizes_b) and all((a < 0) == (b < 0) for a, b in zip(sizes_a, sizes_b))
