"""Checking a chosen batch size with a direct estimate at that batch, and stepping down when it does not fit.

The lines of a :class:`~nnmem_callbacks.core.estimate.MemoryEstimate` come from
traces at a few batch sizes; a kernel that changes its behaviour at another
batch, or an allocator that fragments differently there, can make the largest
batch they predict too large. A *verifier* (``batch_size -> MemoryEstimate``,
a direct estimate of the same step at that batch; the PyTorch estimator
attaches one as ``MemoryEstimate.verifier``) checks the answer. When the direct
estimate does not fit, the search is repeated with the miss added (as a
constant after one check, as a line in the batch through the last two after
more), and the smaller answer is checked again, a bounded number of times
(:data:`MAX_VERIFY_STEPS`).

Example:
    >>> from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
    >>> def line_estimate(batch_size, per_sample):
    ...     return MemoryEstimate(peak_bytes=1_000 + per_sample * batch_size, breakdown={"parameters": 1_000},
    ...                           batch_size=batch_size, phases=(PhaseLine("step", 1_000, per_sample),))
    >>> estimate = line_estimate(10, 100)          # the lines say 100 bytes per sample
    >>> truth = lambda n: line_estimate(n, 120)    # a direct trace finds 120
    >>> check = verify_batch_size(estimate, 5_000, verifier=truth, candidate=estimate.max_batch_size(5_000, verify=False))
    >>> check.predicted_batch_size, check.batch_size, check.verified, [c.batch_size for c in check.checks]
    (40, 33, True, [40, 32, 33])
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Protocol

from nnmem_callbacks.core.batch_search import largest_fitting
from nnmem_callbacks.core.units import format_bytes

__all__ = [
    "BatchLines",
    "DirectEstimator",
    "MAX_VERIFY_STEPS",
    "Verification",
    "VerificationCheck",
    "Verifier",
    "verify_batch_size",
]

#: How many direct estimates one verification may run before giving up.
MAX_VERIFY_STEPS = 4


class BatchLines(Protocol):
    """What a check reads of an estimate: its predicted bytes at any batch (a
    :class:`~nnmem_callbacks.core.estimate.MemoryEstimate` is one), and the method that made it."""

    method: str

    def upper_bytes_at(self, batch_size: int) -> int: ...

    def device_bytes_at(self, batch_size: int) -> int: ...


#: ``batch_size -> estimate at that batch`` (a direct estimate of the same step).
Verifier = Callable[[int], BatchLines]


class DirectEstimator:
    """Base of an estimator's :attr:`~nnmem_callbacks.core.estimate.MemoryEstimate.verifier`.

    Calling it with a batch size validates the size and returns
    :meth:`estimate_at`. It holds the model and the step's configuration, so a
    copied estimate shares it and a pickled one drops it (unpickles as ``None``).

    Example:
        >>> class Doubling(DirectEstimator):
        ...     def estimate_at(self, batch_size):
        ...         return 2 * batch_size
        >>> Doubling()(4)
        8
        >>> import pickle
        >>> pickle.loads(pickle.dumps(Doubling())) is None
        True
        >>> Doubling()(0)
        Traceback (most recent call last):
        ...
        ValueError: batch_size must be a positive integer, got 0
    """

    def estimate_at(self, batch_size: int) -> BatchLines:  # pragma: no cover - every subclass defines it
        """The direct estimate at ``batch_size`` (a positive int)."""
        raise NotImplementedError

    def accumulating(self, accumulate_grad_batches: int) -> "DirectEstimator | None":
        """The direct estimator of the same step with ``accumulate_grad_batches`` micro-batches per optimizer
        step (accumulated gradients stay live through the next micro-batch); ``None`` where it cannot."""
        return None

    def __call__(self, batch_size: int) -> BatchLines:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        return self.estimate_at(batch_size)

    def __deepcopy__(self, memo: dict) -> "DirectEstimator":
        return self

    def __reduce__(self):
        return (_dropped, ())


def _dropped() -> None:
    return None


@dataclasses.dataclass(frozen=True)
class VerificationCheck:
    """One direct estimate at one batch size.

    Attributes:
        batch_size: The batch estimated directly.
        predicted_bytes: What the original estimate's lines predict there.
        traced_bytes: What the direct estimate gives (``None``: it failed).
        fits: Whether ``traced_bytes`` is within the budget.
        method: The direct estimate's method (``"trace"``, or a fallback).
        error: Why the direct estimate failed, if it did.
    """

    batch_size: int
    predicted_bytes: int
    traced_bytes: int | None
    fits: bool
    method: str = ""
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Verification:
    """The record of checking a batch size by direct estimates.

    Attributes:
        budget_bytes: The budget the checks compared against.
        measure: ``"device"`` (allocator reserve plus context) or ``"peak"``
            (tensor peak, with run-to-run variability).
        predicted_batch_size: The batch the estimate's lines chose.
        batch_size: The batch after verification (``0``: none fits).
        checks: The direct estimates run, in order.
        verified: Whether a direct estimate at ``batch_size`` fits.
        seconds: Time spent in direct estimates.
    """

    budget_bytes: int
    measure: str
    predicted_batch_size: int
    batch_size: int
    checks: tuple[VerificationCheck, ...]
    verified: bool
    seconds: float = 0.0

    @property
    def stepped_down(self) -> bool:
        """Whether verification chose a smaller batch than the lines."""
        return self.batch_size < self.predicted_batch_size

    @property
    def text(self) -> str:
        """One line for warnings and reports."""
        if not self.checks:
            return "not verified"
        parts = []
        for check in self.checks:
            if check.traced_bytes is None:
                parts.append(f"batch {check.batch_size}: direct estimate failed ({check.error})")
            else:
                parts.append(
                    f"batch {check.batch_size}: predicted {format_bytes(check.predicted_bytes)}, direct "
                    f"{format_bytes(check.traced_bytes)} ({'fits' if check.fits else 'over'} {format_bytes(self.budget_bytes)})"
                )
        verdict = f"verified batch {self.batch_size}" if self.verified else f"batch {self.batch_size} not verified"
        return f"{verdict} by direct estimate ({self.measure} bytes): " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready)."""
        document = dataclasses.asdict(self)
        document["stepped_down"] = self.stepped_down
        return document


def _measure(estimate: BatchLines, include_reserve: bool) -> Callable[[int], int]:
    return estimate.device_bytes_at if include_reserve else estimate.upper_bytes_at


def _miss_at(misses: list[tuple[int, int]], batch_size: int) -> int:
    """How far the direct estimate at ``batch_size`` is taken to exceed the lines' prediction.

    One check: its miss, taken as constant (a smaller batch is not assumed to
    miss by less, which keeps the step down safe; where that leaves no batch,
    :func:`verify_batch_size` tries a miss in proportion to the batch before
    giving up). Two or more: the line through the last two misses, never
    below 0 (where that line leaves no batch and none has fitted yet,
    :func:`verify_batch_size` tries the largest miss seen, taken as constant,
    before giving up: noisy direct estimates make such lines).
    """
    if len(misses) == 1:
        return max(misses[0][1], 0)
    (n1, m1), (n2, m2) = misses[-2], misses[-1]
    return max(0, m2 + (m1 - m2) * (batch_size - n2) // (n1 - n2))


def verify_batch_size(
    estimate: BatchLines,
    budget_bytes: int,
    *,
    verifier: Verifier,
    candidate: int,
    include_reserve: bool = False,
    choose: Callable[[int], int] | None = None,
    max_steps: int = MAX_VERIFY_STEPS,
) -> Verification:
    """Checks ``choose(candidate)`` by a direct estimate, stepping down until one fits.

    Args:
        estimate: The estimate whose lines chose ``candidate``.
        budget_bytes: The budget the batch must fit.
        verifier: ``batch_size -> MemoryEstimate`` at that batch.
        candidate: The largest batch the lines say fits.
        include_reserve: Compare device bytes (reserve and context) instead of
            the tensor peak.
        choose: Maps a largest fitting batch to the batch actually used (for
            gradient accumulation, the smallest batch that keeps the effective
            batch); default: the largest fitting batch itself.
        max_steps: Most direct estimates to run.

    Returns:
        The :class:`Verification`. When a direct estimate fails (raises), the
        last choice is kept unverified.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps!r}")
    choose = choose or (lambda largest: largest)
    predicted = _measure(estimate, include_reserve)
    started = time.perf_counter()
    checks: list[VerificationCheck] = []
    misses: list[tuple[int, int]] = []
    best: int | None = None  # the largest batch a direct estimate fits
    over: int | None = None  # the smallest batch a direct estimate does not fit
    batch = choose(candidate) if candidate >= 1 else 0
    first = batch
    while batch >= 1 and len(checks) < max_steps:
        expected = predicted(batch)
        try:
            direct = verifier(batch)
        except Exception as error:  # noqa: BLE001 - a failed check keeps the answer, unverified
            checks.append(
                VerificationCheck(batch, expected, None, False, error=f"{type(error).__name__}: {error}"[:300])
            )
            break
        traced = _measure(direct, include_reserve)(batch)
        fits = traced <= budget_bytes
        checks.append(VerificationCheck(batch, expected, traced, fits, method=direct.method))
        misses.append((batch, traced - expected))
        if fits:
            best = batch if best is None else max(best, batch)
            if over is None:  # the lines' own answer fits: never go above it
                break
        else:
            over = batch if over is None else min(over, batch)
        # the largest batch below the smallest failing one once the misses are added to the lines
        largest = largest_fitting(lambda n: predicted(n) + _miss_at(misses, n), budget_bytes, 0, over)
        if largest < 1 and len(misses) == 1 and misses[0][1] > 0:
            # a constant miss leaves nothing (the lines are flat below, e.g. an optimizer phase): before
            # concluding that nothing fits, check the batch a miss growing with the batch would allow
            miss, at = misses[0][1], misses[0][0]
            largest = largest_fitting(lambda n: predicted(n) + -(-miss * n // at), budget_bytes, 0, over)  # noqa: B023 - called here
        elif largest < 1 and best is None and len(misses) >= 2:
            # the line through two misses leaves nothing when the miss grows as the batch shrinks: with noisy
            # direct estimates (a runtime whose peak moves from run to run) that is the noise, not a trend.
            # Before concluding that nothing fits, take the largest miss seen as constant
            worst = max(miss for _, miss in misses)
            largest = largest_fitting(lambda n: predicted(n) + max(worst, 0), budget_bytes, 0, over)  # noqa: B023 - called here
        following = min(choose(largest), over - 1) if largest >= 1 else 0
        if following < 1 and best is None and over is not None and over > 1:
            # "nothing fits" is said only of a batch of one checked directly: lines that miss by much (a runtime
            # whose fixed cost the lines do not hold) can leave nothing where one sample fits
            following = 1
        if best is not None and following <= best:
            break  # nothing between the largest that fits and the smallest that does not is left to try
        batch = following
    return Verification(
        budget_bytes=int(budget_bytes),
        measure="device" if include_reserve else "peak",
        predicted_batch_size=first,
        batch_size=best if best is not None else max(batch, 0),
        checks=tuple(checks),
        verified=best is not None,
        seconds=round(time.perf_counter() - started, 4),
    )
