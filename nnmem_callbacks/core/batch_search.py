"""Finding the largest batch whose predicted bytes fit a budget, for any ``batch -> bytes`` function.

The searches assume the bytes grow with the batch (the lines of a
:class:`~nnmem_callbacks.core.estimate.MemoryEstimate` do) and call the
function only O(log n) times, so an expensive one (an allocator replay) stays cheap.

Example:
    >>> search_largest(lambda n: 100 + 10 * n, 1_000, limit=1 << 24)
    90
    >>> gallop_largest(lambda n: 100 + 10 * n, 1_000, start=50, bound=1_000)
    90
"""

from __future__ import annotations

from typing import Callable

__all__ = ["MAX_BATCH_SEARCH_LIMIT", "gallop_largest", "largest_fitting", "search_largest"]

#: Upper bound of :meth:`~nnmem_callbacks.core.estimate.MemoryEstimate.max_batch_size`'s search.
MAX_BATCH_SEARCH_LIMIT = 1 << 24


def largest_fitting(measure: Callable[[int], int], budget_bytes: int, low: int, high: int) -> int:
    """The largest ``n`` in ``[low, high)`` with ``measure(n) <= budget_bytes``, by bisection.

    ``measure(low)`` is taken to fit (or ``low`` is 0) and ``measure(high)`` not to.

    Example:
        >>> largest_fitting(lambda n: 10 * n, 55, 0, 100)
        5
    """
    while high - low > 1:
        middle = (low + high) // 2
        if measure(middle) <= budget_bytes:
            low = middle
        else:
            high = middle
    return low


def search_largest(measure: Callable[[int], int], budget_bytes: int, limit: int) -> int:
    """The largest ``n <= limit`` with ``measure(n) <= budget_bytes``, given that ``measure(1)`` fits."""
    low, high = 1, 2
    while high <= limit and measure(high) <= budget_bytes:
        low, high = high, high * 2
    if high > limit:
        return limit
    return largest_fitting(measure, budget_bytes, low, high)


def gallop_largest(measure: Callable[[int], int], budget_bytes: int, start: int, bound: int) -> int:
    """The largest ``n <= bound`` with ``measure(n) <= budget_bytes``, searched outward from ``start``.

    ``measure(1)`` must fit; steps double away from ``start`` until the answer is bracketed, then bisect.
    """
    if measure(start) <= budget_bytes:
        low, step = start, 1
        while low + step <= bound and measure(low + step) <= budget_bytes:
            low, step = low + step, step * 2
        return largest_fitting(measure, budget_bytes, low, min(low + step, bound + 1))
    high, step = start, 1
    while high - step > 1 and measure(high - step) > budget_bytes:
        high, step = high - step, step * 2
    return largest_fitting(measure, budget_bytes, max(high - step, 1), high)
