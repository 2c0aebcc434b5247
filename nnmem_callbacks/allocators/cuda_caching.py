"""A model of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``).

Given the sequence of tensor allocations and frees of a training step, it
predicts what ``torch.cuda.max_memory_allocated()`` and
``torch.cuda.max_memory_reserved()`` will report, with the allocator's default rules (512-byte rounding, small and
large pools, best fit, splitting, merging; segments never returned). Pure Python; no torch import.

Design (the rules, with their constants): docs/cuda-model.md, "The caching allocator replay".

Known limitations:
    * Single stream only; ``expandable_segments``, ``max_split_size_mb`` and garbage-collection thresholds are not
      modelled.
    * OOM-triggered cache flushes are not modelled: a largest batch chosen by this model's peak reserve trains
      without them (safe, at most a few segments short of the largest that runs at all).

Example:
    >>> sim = CachingAllocatorModel()
    >>> a = sim.malloc(1000)        # small pool: 1024 bytes in a new 2 MiB segment
    >>> b = sim.malloc(5 * 2**20)   # large pool: new 20 MiB segment
    >>> sim.allocated, sim.reserved == 2 * 2**20 + 20 * 2**20
    (5243904, True)
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from typing import Iterable

__all__ = [
    "AllocatorPrediction",
    "CachingAllocatorModel",
    "LARGE_BUFFER",
    "MIN_BLOCK_SIZE",
    "MIN_LARGE_ALLOC",
    "replay",
    "ROUND_LARGE",
    "round_size",
    "segment_size",
    "SMALL_BUFFER",
    "SMALL_SIZE",
]

MIN_BLOCK_SIZE = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(size: int) -> int:
    """Rounds a request the way the caching allocator does (multiple of 512).

    Example:
        >>> round_size(1), round_size(512), round_size(513), round_size(0)
        (512, 512, 1024, 512)
    """
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((size + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def segment_size(rounded: int) -> int:
    """The size of the segment ``cudaMalloc`` gets for a rounded request.

    Example:
        >>> segment_size(4096) == 2 * 2**20, segment_size(5 * 2**20) == 20 * 2**20
        (True, True)
        >>> segment_size(11 * 2**20) == 12 * 2**20
        True
    """
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


@dataclasses.dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    prev: "_Block | None" = None
    next: "_Block | None" = None

    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


class CachingAllocatorModel:
    """Simulates the CUDA caching allocator's pools and statistics.

    Attributes:
        allocated: Bytes currently allocated (block sizes).
        reserved: Bytes currently reserved in segments.
        peak_allocated: Largest ``allocated`` seen.
        peak_reserved: Largest ``reserved`` seen.
    """

    def __init__(self) -> None:
        self._free_small: list[tuple[tuple[int, int, int], _Block]] = []
        self._free_large: list[tuple[tuple[int, int, int], _Block]] = []
        self._handles: dict[int, _Block] = {}
        self._ids = itertools.count(1)
        self._segments = itertools.count(0)
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0

    # -- free lists ----------------------------------------------------------
    def _pool(self, small: bool) -> list[tuple[tuple[int, int, int], _Block]]:
        return self._free_small if small else self._free_large

    def _insert_free(self, block: _Block) -> None:
        block.free = True
        bisect.insort(self._pool(block.small), (block.key(), block), key=lambda item: item[0])

    def _remove_free(self, block: _Block) -> None:
        pool = self._pool(block.small)
        index = bisect.bisect_left(pool, block.key(), key=lambda item: item[0])
        assert pool[index][1] is block
        del pool[index]

    # -- public API ------------------------------------------------------------
    def malloc(self, size: int) -> int:
        """Allocates ``size`` bytes; returns a handle for :meth:`free`."""
        rounded = round_size(size)
        small = rounded <= SMALL_SIZE
        pool = self._pool(small)
        index = bisect.bisect_left(pool, (rounded, -1, -1), key=lambda item: item[0])
        if index < len(pool):
            block = pool[index][1]
            del pool[index]
        else:
            seg_size = segment_size(rounded)
            block = _Block(next(self._segments), 0, seg_size, small)
            self.reserved += seg_size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        remaining = block.size - rounded
        if (small and remaining >= MIN_BLOCK_SIZE) or (not small and remaining > SMALL_SIZE):
            rest = _Block(block.segment, block.offset + rounded, remaining, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            self._insert_free(rest)
        block.free = False
        handle = next(self._ids)
        self._handles[handle] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return handle

    def free(self, handle: int) -> None:
        """Returns a block to its pool, merging it with free neighbours."""
        block = self._handles.pop(handle)
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._remove_free(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._insert_free(block)


@dataclasses.dataclass(frozen=True)
class AllocatorPrediction:
    """Peaks the caching allocator reports for a sequence of events."""

    peak_allocated: int
    peak_reserved: int


def replay(events: Iterable[tuple[int, int]], initial: Iterable[int] = ()) -> AllocatorPrediction:
    """Replays allocation events through :class:`CachingAllocatorModel`.

    Args:
        events: ``(key, size)`` pairs in time order; a positive ``size`` allocates
            ``key``, a size of ``-1`` frees it.
        initial: Sizes already allocated before the events (parameters, the
            batch); they count toward the reserve but are allocated first.

    Returns:
        The peak allocated and reserved bytes.

    Example:
        >>> replay([(1, 4 * 2**20), (1, -1), (2, 4 * 2**20)]).peak_reserved == 20 * 2**20
        True
    """
    sim = CachingAllocatorModel()
    for size in initial:
        sim.malloc(size)
    sim.peak_allocated = sim.allocated
    handles: dict[int, int] = {}
    for key, size in events:
        if size >= 0:
            handles[key] = sim.malloc(size)
        elif key in handles:
            sim.free(handles.pop(key))
    return AllocatorPrediction(sim.peak_allocated, sim.peak_reserved)
