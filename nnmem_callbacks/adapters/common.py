"""What both ``MemoryBudgetCallback`` classes share, framework-free: the guarded call, warn-once, the prediction.

* :class:`Guard` says each warning once, and runs measuring and logging so that a
  failure never breaks training and is never silent (:meth:`Guard.safe`). Each
  callback hands it the way it warns: ``warnings.warn`` in Keras, Lightning's
  rank-zero warning in Lightning.
* :func:`predicted_peak` is the peak predicted at the batch size trained with;
  :func:`compared_prediction` is the prediction of what the meter measures: that
  peak, or for process RSS its predicted rise above the fit-start level.

Example:
    >>> said = []
    >>> guard = Guard(said.append, logging.getLogger("example"))
    >>> guard.warn("careful"); guard.warn("careful")
    >>> guard.safe(lambda: 1 / 0, "dividing")
    >>> said
    ['careful', 'MemoryBudgetCallback: dividing failed (ZeroDivisionError: division by zero); training goes on.']
    >>> from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
    >>> est = MemoryEstimate(peak_bytes=900, breakdown={"parameters": 100, "activations": 800}, batch_size=8,
    ...                      phases=(PhaseLine("step/backward", 100, 100),), peak_phase="step/backward")
    >>> predicted_peak(est, 4), compared_prediction(est, 4, process_level=True, resident_bytes=100)
    (500, 400)
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.monitoring.meters import predicted_rss_rise

__all__ = ["compared_prediction", "Guard", "predicted_peak"]


class Guard:
    """Warns once per message, and runs what must never break training.

    Args:
        emit: Says a message (it is called once per distinct message).
        log: Where a failure's traceback goes, at debug level.
    """

    def __init__(self, emit: Callable[[str], None], log: logging.Logger) -> None:
        self._emit = emit
        self._log = log
        self._said: set[str] = set()

    def warn(self, message: str) -> None:
        """Says ``message`` unless it was said already."""
        if message in self._said:
            return
        self._said.add(message)
        self._emit(message)

    def safe(self, function: Callable[[], Any], what: str) -> Any:
        """Runs ``function``; a failure never breaks training, and is said once (never silently).

        Returns:
            What ``function`` returned, or ``None`` when it failed.
        """
        try:
            return function()
        except Exception as error:  # noqa: BLE001 - measuring and logging must never break training
            self._log.debug("MemoryBudgetCallback: %s failed", what, exc_info=True)
            self.warn(f"MemoryBudgetCallback: {what} failed ({type(error).__name__}: {error}); training goes on.")
            return None

    def notes(self, estimate: MemoryEstimate) -> None:
        """Says the estimate's own warnings: a measurement that went missing or was cut short is never silent."""
        for note in estimate.warnings:
            self.warn(f"MemoryBudgetCallback: {note}")


def predicted_peak(estimate: MemoryEstimate | None, batch_size: int | None) -> int | None:
    """The peak predicted at ``batch_size`` (the estimate's own batch when ``None``); ``None`` without an estimate."""
    if estimate is None:
        return None
    size = batch_size or estimate.batch_size
    return int(estimate.peak_bytes_at(size)) if size else int(estimate.peak_bytes)


def compared_prediction(
    estimate: MemoryEstimate | None, batch_size: int | None, *, process_level: bool, resident_bytes: int
) -> int | None:
    """The prediction of what the meter measures, at ``batch_size``.

    Args:
        estimate: The estimate (``None``: there is no prediction).
        batch_size: The batch size trained with.
        process_level: Whether the meter reads process RSS, compared as its rise
            above the fit-start level (see :func:`~nnmem_callbacks.monitoring.meters.metric_names`).
        resident_bytes: What the process already holds at fit start of the
            predicted peak (parameters, buffers, eager optimizer state).

    Returns:
        The predicted peak, or its predicted rise above the fit-start RSS.
    """
    peak = predicted_peak(estimate, batch_size)
    if peak is None or not process_level:
        return peak
    return predicted_rss_rise(peak, resident_bytes)
