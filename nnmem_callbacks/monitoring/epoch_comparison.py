"""Each epoch's measurement beside the prediction comparable to it: a row, logged metrics, a miss warning.

Both callbacks end every epoch the same way, through :func:`compare_epoch`:

* the **measured** figure is what the meter can compare honestly: the
  allocator's peak, or for process RSS its rise above the fit-start level (the
  interpreter and libraries are no part of any prediction);
* the **prediction** is the one comparable to it (the adapter computes it, e.g.
  :func:`~nnmem_callbacks.monitoring.meters.predicted_rss_rise` for RSS);
* the **metrics** are named by :class:`~nnmem_callbacks.monitoring.meters.MetricNames` in
  the adapter's spelling (Keras ``memory_...``, Lightning ``memory/...``), all in
  MiB except the relative error; a figure that could not be measured is NaN, so
  every key is present every epoch;
* the **row** holds the same figures in bytes for ``callback.measurements``;
* the **relative error** is ``(predicted - measured) / measured``, the sign the
  benchmarks use: positive when the prediction is above the measurement
  (:func:`relative_error`); none for process RSS, whose rise also holds
  allocator caches and freed memory kept resident (no measure of the estimate);
* a second figure can be kept **beside** the compared one (:func:`beside`: on
  CPU the rise of process RSS beside the sampled step's tensor peak).

:func:`miss_warning` says when the measurement exceeds the prediction by more
than :data:`MISS_TOLERANCE`, with the phase in which memory rose most.

Framework-free: the figures come from a :class:`~nnmem_callbacks.monitoring.meters.Meter`.

Example:
    >>> from nnmem_callbacks.monitoring.meters import CudaMeter, PeakReading, metric_names
    >>> MiB = 2**20
    >>> meter = CudaMeter("cuda:0")
    >>> reading = PeakReading(kind="cuda", peak_bytes=550 * MiB, reserved_bytes=600 * MiB, device_used_bytes=1024 * MiB)
    >>> comparison = compare_epoch(meter, reading, epoch=0, names=metric_names(meter), predicted_bytes=500 * MiB,
    ...                            predicted_peak_bytes=500 * MiB, budget_bytes=2048 * MiB)
    >>> comparison.metrics  # doctest: +ELLIPSIS
    {'memory_measured_peak_mib': 550.0, 'memory_predicted_peak_mib': 500.0, 'memory_relative_error': -0.0909..., 'memory_budget_mib': 2048.0}
    >>> miss_warning(comparison, predicted_phase="step1/backward") is None  # within MISS_TOLERANCE
    True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from nnmem_callbacks.core.units import MiB, format_bytes
from nnmem_callbacks.monitoring.meters import Meter, MetricNames, PeakReading, metric_names
from nnmem_callbacks.monitoring.step_sampling import TensorPeakMeter

__all__ = [
    "beside",
    "beside_sampled_step",
    "compare_epoch",
    "EpochComparison",
    "MISS_CAUSES",
    "MISS_TOLERANCE",
    "miss_warning",
    "missed",
    "relative_error",
]

#: A measurement above the prediction by more than this fraction of it is a miss (:func:`miss_warning`).
MISS_TOLERANCE = 0.10
#: The usual causes of a miss, as :func:`miss_warning` says them by default.
MISS_CAUSES = (
    "Memory allocated outside the training step (hooks, callbacks, data on the device) or ops the estimator does "
    "not model are the usual causes."
)


@dataclasses.dataclass(frozen=True)
class EpochComparison:
    """One epoch's measurement beside its prediction.

    Attributes:
        row: The figures in bytes (``callback.measurements`` holds one per
            epoch): ``epoch``, ``kind``, ``measured_bytes`` (``None`` when
            unmeasured), ``exact``, and with a prediction ``predicted_bytes``
            and ``relative_error``; with ``details`` also
            ``measured_peak_bytes``, ``predicted_peak_bytes``, the phase books
            and on CUDA ``measured_reserved_bytes`` and
            ``measured_device_used_bytes``.
        metrics: The values to log, keyed by metric name (MiB; the relative
            error is a fraction; NaN where unmeasured).
        measured_bytes: The measured figure that is compared (``None`` when
            the meter could not be read).
        predicted_bytes: The prediction of that figure (``None`` without one).
        baseline_bytes: The fit-start level a process-level figure is taken above.
        process_level: Whether the meter reads the whole process (RSS).
        source: What the meter reads, in words.
        epoch: The epoch's index.
        phase_rises: The largest rise per phase of the step (empty when the
            adapter tracked no phases).
        phase_peaks: The largest peak per phase of the step (likewise).
    """

    row: dict[str, Any]
    metrics: dict[str, float]
    measured_bytes: int | None
    predicted_bytes: int | None
    baseline_bytes: int
    process_level: bool
    source: str
    epoch: int
    phase_rises: Mapping[str, int] = dataclasses.field(default_factory=dict)
    phase_peaks: Mapping[str, int] = dataclasses.field(default_factory=dict)


def compare_epoch(
    meter: Meter,
    reading: PeakReading | None,
    *,
    epoch: int,
    names: MetricNames,
    baseline_bytes: int = 0,
    measured_peak_bytes: int | None = None,
    predicted_bytes: int | None = None,
    predicted_peak_bytes: int | None = None,
    budget_bytes: int | None = None,
    phase_peaks: Mapping[str, int] | None = None,
    phase_rises: Mapping[str, int] | None = None,
    predicted_reserved_bytes: int | None = None,
    predicted_device_bytes: int | None = None,
    details: bool = False,
) -> EpochComparison:
    """Puts an epoch's measurement beside the prediction comparable to it.

    Args:
        meter: The meter that measured the epoch (its kind, and whether it
            reads the whole process).
        reading: The meter's figures at the end of the epoch; ``None`` when
            it could not be read (the measured figures are then NaN).
        epoch: The epoch's index.
        names: The metric names, in the adapter's spelling.
        baseline_bytes: For a process-level meter, the fit-start level the
            peak is taken above.
        measured_peak_bytes: The epoch's peak when the adapter knows better
            than ``reading`` (the largest phase peak, the largest over ranks);
            ``reading.peak_bytes`` otherwise.
        predicted_bytes: The prediction comparable to the measured figure
            (the allocator peak, or the rise of process RSS); ``None`` without
            an estimate: then no prediction or error is logged.
        predicted_peak_bytes: The estimate's tensor peak at the training batch.
        budget_bytes: The budget of the plan, logged when given.
        phase_peaks, phase_rises: The books of a
            :class:`~nnmem_callbacks.monitoring.phase_tracking.PhaseTracker` (row only,
            with ``details``).
        predicted_reserved_bytes, predicted_device_bytes: CUDA: the predicted
            allocator reserve and device total, logged with ``details`` on a
            CUDA reading.
        details: Also the figures behind the comparison: the raw measured and
            predicted peaks in the row, the predicted tensor peak under its
            own name, and on CUDA the measured and predicted reserve and
            device total (the Lightning TensorBoard layout charts them). The
            Keras callback leaves them out, so the keys it logs stay the
            comparison's.

    Returns:
        The :class:`EpochComparison`.

    Example:
        >>> from nnmem_callbacks.monitoring.meters import RssMeter, metric_names
        >>> MiB = 2**20
        >>> meter = RssMeter()
        >>> names = metric_names(meter).for_lightning()
        >>> reading = PeakReading(kind="rss", peak_bytes=1300 * MiB, current_bytes=1200 * MiB)
        >>> done = compare_epoch(meter, reading, epoch=3, names=names, baseline_bytes=1000 * MiB,
        ...                      predicted_bytes=250 * MiB, predicted_peak_bytes=400 * MiB)
        >>> done.measured_bytes // MiB, done.metrics["memory/measured_rss_rise_mib"], "relative_error" in done.row
        (300, 300.0, False)
        >>> compare_epoch(meter, None, epoch=4, names=names, predicted_bytes=250 * MiB,
        ...               predicted_peak_bytes=400 * MiB).metrics["memory/measured_rss_rise_mib"]
        nan
    """
    measured: int | None = None
    if reading is not None:
        peak = int(reading.peak_bytes if measured_peak_bytes is None else measured_peak_bytes)
        # process RSS holds the interpreter and libraries: compare its rise above the fit-start level
        measured = max(peak - int(baseline_bytes), 0) if meter.process_level else max(peak, 0)
    row: dict[str, Any] = {"epoch": int(epoch), "kind": meter.kind}
    if details and reading is not None:
        row["measured_peak_bytes"] = peak
    row["measured_bytes"] = measured
    if details and phase_peaks is not None:
        row["phase_peaks"] = dict(phase_peaks)
    if details and phase_rises is not None:
        row["phase_rises"] = dict(phase_rises)
    row["exact"] = bool(reading.exact) if reading is not None else False

    metrics: dict[str, float] = {names.measured: measured / MiB if measured is not None else math.nan}
    if predicted_bytes is not None:
        predicted_peak = int(predicted_peak_bytes or 0)
        row["predicted_bytes"] = int(predicted_bytes)
        if details:
            row["predicted_peak_bytes"] = predicted_peak_bytes
        metrics[names.predicted_peak] = predicted_peak / MiB
        metrics[names.predicted] = predicted_bytes / MiB
        if details:
            metrics[names.predicted_tensor_peak] = predicted_peak / MiB
        if not meter.process_level:  # RSS holds more than tensors: its rise is no measure of the estimate's error
            error = relative_error(predicted_bytes, measured)
            metrics[names.relative_error] = error
            row["relative_error"] = error
    if budget_bytes is not None:
        metrics[names.budget] = budget_bytes / MiB
    if details and reading is not None and reading.kind == "cuda":
        metrics[names.measured_reserved] = (reading.reserved_bytes or 0) / MiB
        metrics[names.measured_device] = (reading.device_used_bytes or 0) / MiB
        row["measured_reserved_bytes"] = reading.reserved_bytes
        row["measured_device_used_bytes"] = reading.device_used_bytes
        if predicted_reserved_bytes is not None:
            metrics[names.predicted_reserved] = predicted_reserved_bytes / MiB
        if predicted_device_bytes is not None:
            metrics[names.predicted_device] = predicted_device_bytes / MiB
    return EpochComparison(
        row=row,
        metrics=metrics,
        measured_bytes=measured,
        predicted_bytes=None if predicted_bytes is None else int(predicted_bytes),
        baseline_bytes=int(baseline_bytes),
        process_level=meter.process_level,
        source=meter.source,
        epoch=int(epoch),
        phase_rises=dict(phase_rises or {}),
        phase_peaks=dict(phase_peaks or {}),
    )


def relative_error(predicted: int, measured: int | None) -> float:
    """``(predicted - measured) / measured``: positive when the prediction is above the measurement (NaN unmeasured).

    Example:
        >>> relative_error(110, 100), relative_error(90, 100), relative_error(90, None)
        (0.1, -0.1, nan)
    """
    if measured is None or measured <= 0:
        return math.nan
    return (int(predicted) - int(measured)) / int(measured)


def beside(comparison: EpochComparison, other: EpochComparison) -> EpochComparison:
    """``comparison`` with ``other``'s figures beside it: its metrics added (the compared ones win) and its row
    figures under their own names (``rss_rise_bytes``, ``predicted_rss_rise_bytes``,
    for process RSS, which has no relative error; ``<kind>_...`` otherwise).

    Example:
        >>> from nnmem_callbacks.monitoring.meters import RssMeter, metric_names
        >>> from nnmem_callbacks.monitoring.step_sampling import TensorPeakMeter
        >>> tensors, rss = TensorPeakMeter(), RssMeter()
        >>> main = compare_epoch(tensors, PeakReading(kind="tensors", peak_bytes=100), epoch=0,
        ...                      names=metric_names(tensors), predicted_bytes=110, predicted_peak_bytes=110)
        >>> extra = compare_epoch(rss, PeakReading(kind="rss", peak_bytes=1050), epoch=0, names=metric_names(rss),
        ...                       baseline_bytes=1000, predicted_bytes=80, predicted_peak_bytes=110)
        >>> both = beside(main, extra)
        >>> both.row["relative_error"], both.row["rss_rise_bytes"], both.row["predicted_rss_rise_bytes"]
        (0.1, 50, 80)
        >>> sorted(both.metrics)[:3]
        ['memory_measured_peak_mib', 'memory_measured_rss_rise_mib', 'memory_predicted_peak_mib']
    """
    prefix = "rss_rise" if other.process_level else other.row.get("kind", "other")
    row = dict(comparison.row)
    row[f"{prefix}_bytes"] = other.measured_bytes
    if other.predicted_bytes is not None:
        row[f"predicted_{prefix}_bytes"] = other.predicted_bytes
        if "relative_error" in other.row:  # (none for process RSS)
            row[f"{prefix}_relative_error"] = other.row["relative_error"]
    metrics = {**other.metrics, **comparison.metrics}
    return dataclasses.replace(comparison, row=row, metrics=metrics)


def beside_sampled_step(
    rss: EpochComparison,
    sampled_bytes: int,
    *,
    predicted_bytes: int,
    budget_bytes: int | None,
    sampled_seconds: float | None,
) -> EpochComparison:
    """CPU: the sampled step's tensor peak compared with the estimate's peak, with ``rss`` (the process RSS rise)
    beside it (:func:`beside`); Lightning's metric names (``memory/...``), its cost in the row.

    Example:
        >>> from nnmem_callbacks.monitoring.meters import RssMeter, metric_names
        >>> rss = compare_epoch(RssMeter(), PeakReading(kind="rss", peak_bytes=1050), epoch=0,
        ...                     names=metric_names(RssMeter()), baseline_bytes=1000, predicted_bytes=80)
        >>> both = beside_sampled_step(rss, 100, predicted_bytes=110, budget_bytes=None, sampled_seconds=0.5)
        >>> both.row["relative_error"], both.row["rss_rise_bytes"], both.row["sampled_step_seconds"]
        (0.1, 50, 0.5)
    """
    tensors = TensorPeakMeter(sampled_bytes)
    comparison = compare_epoch(
        tensors,
        tensors.read(),
        epoch=rss.epoch,
        names=metric_names(tensors).for_lightning(),
        predicted_bytes=predicted_bytes,
        predicted_peak_bytes=predicted_bytes,
        budget_bytes=budget_bytes,
        phase_peaks=rss.phase_peaks,
        phase_rises=rss.phase_rises,
        details=True,
    )
    comparison.row["sampled_step_seconds"] = sampled_seconds
    return beside(comparison, rss)


def missed(comparison: EpochComparison, tolerance: float = MISS_TOLERANCE) -> bool:
    """Whether the measurement exceeds the prediction by more than ``tolerance``.

    The tolerance is a fraction of the prediction; for process RSS, of the
    fit-start RSS as well when that is larger, since RSS also grows with the
    runtime's own first-step costs (kernels, thread pools, allocator caches).

    Example:
        >>> from nnmem_callbacks.monitoring.meters import CudaMeter, PeakReading, metric_names
        >>> meter = CudaMeter("cuda:0")
        >>> def at(peak):
        ...     return compare_epoch(meter, PeakReading(kind="cuda", peak_bytes=peak), epoch=0,
        ...                          names=metric_names(meter), predicted_bytes=1000, predicted_peak_bytes=1000)
        >>> missed(at(1100)), missed(at(1101))
        (False, True)
    """
    measured, predicted = comparison.measured_bytes, comparison.predicted_bytes
    if measured is None or predicted is None:
        return False
    reference = max(predicted, comparison.baseline_bytes if comparison.process_level else 0)
    return measured > predicted + tolerance * reference


def miss_warning(
    comparison: EpochComparison,
    *,
    predicted_phase: str | None,
    tolerance: float = MISS_TOLERANCE,
    causes: str = MISS_CAUSES,
) -> str | None:
    """The warning for a miss (see :func:`missed`), naming the phase in which memory rose most; ``None`` otherwise.

    Args:
        comparison: The epoch's comparison.
        predicted_phase: The phase the estimate predicts the peak in.
        tolerance: The fraction of the prediction a measurement may exceed it by.
        causes: The closing sentence on the usual causes.

    Example:
        >>> from nnmem_callbacks.monitoring.meters import CudaMeter, PeakReading, metric_names
        >>> meter = CudaMeter("cuda:0")
        >>> done = compare_epoch(meter, PeakReading(kind="cuda", peak_bytes=3 * 2**20), epoch=2,
        ...                      names=metric_names(meter), predicted_bytes=2**20, predicted_peak_bytes=2**20,
        ...                      phase_rises={"forward": 2**20, "backward": 2 * 2**20}, details=True)
        >>> print(miss_warning(done, predicted_phase="step1/backward", causes="..."))
        MemoryBudgetCallback: the estimate missed. Measured CUDA max_memory_allocated 3.00 MiB in epoch 2 exceeds the prediction 1.00 MiB by 2.00 MiB (200%); memory rose most in the 'backward' phase (predicted peak phase: 'step1/backward'). Largest rise by phase: forward=+1.00 MiB, backward=+2.00 MiB. ...
    """
    if not missed(comparison, tolerance):
        return None
    measured, predicted = comparison.measured_bytes, comparison.predicted_bytes
    assert measured is not None and predicted is not None
    books = comparison.phase_rises or comparison.phase_peaks
    phase = max(books, key=books.get) if books else "unknown"
    what = "rise of the process's peak RSS above fit start" if comparison.process_level else comparison.source
    return (
        f"MemoryBudgetCallback: the estimate missed. Measured {what} {format_bytes(measured)} in epoch "
        f"{comparison.epoch} exceeds the prediction {format_bytes(predicted)} by "
        f"{format_bytes(measured - predicted)} ({(measured - predicted) / max(predicted, 1):.0%}); "
        f"memory rose most in the '{phase}' phase (predicted peak phase: "
        f"'{'?' if predicted_phase is None else predicted_phase}'). Largest rise by phase: "
        + ", ".join(f"{k}=+{format_bytes(v)}" for k, v in comparison.phase_rises.items())
        + ". "
        + causes
    )
