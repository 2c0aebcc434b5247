"""Memory peaks and rises per phase of a training step, over the first batches of each epoch.

An adapter marks the phase boundaries of a step (forward, backward, after
backward, optimizer, between steps) by calling :meth:`PhaseTracker.enter`. For
the first :data:`PHASE_TRACKED_BATCHES` batches of an epoch the tracker reads the
meter at every boundary, books the interval's peak and its rise above the memory
in use when the interval began under the phase that just ended, and resets the
meter. Later batches only sample the meter between steps: reading and resetting
at every boundary costs a device synchronisation on CUDA.

Framework-free: the tracker reaches the runtime only through a
:class:`~nnmem_callbacks.monitoring.meters.Meter`. The Lightning callback drives it from
its hooks; Keras has no phase hooks (``on_train_batch_begin``/``end`` only), so
its callback measures whole epochs.

Example:
    >>> from nnmem_callbacks.monitoring.meters import Meter, PeakReading
    >>> class Scripted(Meter):
    ...     kind = "cuda"
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.current, self.peak = 100, 100
    ...     def use(self, delta):
    ...         self.current += delta
    ...         self.peak = max(self.peak, self.current)
    ...     def reset(self):
    ...         self.peak = self.current
    ...     def read(self):
    ...         return PeakReading(kind=self.kind, peak_bytes=self.peak, current_bytes=self.current)
    >>> meter = Scripted()
    >>> tracker = PhaseTracker()
    >>> tracker.start_epoch(meter)
    >>> tracker.enter("forward"); meter.use(50)
    >>> tracker.enter("backward"); meter.use(200); meter.use(-220)
    >>> tracker.end_batch()
    >>> tracker.peaks, tracker.rises
    ({'between steps': 100, 'forward': 150, 'backward': 350}, {'between steps': 0, 'forward': 50, 'backward': 200})
    >>> tracker.peak_bytes(tracker.finish_epoch())
    350
"""

from __future__ import annotations

from typing import Any, Callable

from nnmem_callbacks.monitoring.meters import Meter, PeakReading

__all__ = ["BETWEEN_STEPS", "Guard", "PHASE_TRACKED_BATCHES", "PhaseTracker"]

#: Number of batches per epoch whose phases (forward, backward, optimizer) are measured separately.
PHASE_TRACKED_BATCHES = 8
#: The phase between the end of one step and the start of the next (data loading, hooks, logging).
BETWEEN_STEPS = "between steps"

#: ``guard(function, what)`` runs ``function`` and returns its result, or ``None`` after reporting a failure.
Guard = Callable[[Callable[[], Any], str], Any]


def _unguarded(function: Callable[[], Any], what: str) -> Any:
    return function()


class PhaseTracker:
    """Books the peak and the rise of memory per phase of the step, for the first batches of an epoch.

    Args:
        meter: The meter to read (``None`` until :meth:`start_epoch` gives one;
            until then :meth:`enter` only remembers the phase).
        tracked_batches: How many batches per epoch are tracked phase by phase.
        guard: Runs each meter call: ``guard(function, what)`` returns the
            result, or ``None`` when the call failed (the adapter warns once
            and training goes on). By default failures propagate.

    Attributes:
        phase: The phase the step is in now (named in out-of-memory diagnoses).
        peaks: The largest peak per phase, in bytes, over the tracked batches.
        rises: The largest rise per phase above the memory in use when an
            interval of that phase began, in bytes.
        batches: How many batches of this epoch were tracked.
    """

    def __init__(
        self, meter: Meter | None = None, *, tracked_batches: int = PHASE_TRACKED_BATCHES, guard: Guard = _unguarded
    ) -> None:
        if isinstance(tracked_batches, bool) or not isinstance(tracked_batches, int) or tracked_batches < 0:
            raise ValueError(f"tracked_batches must be a non-negative integer, got {tracked_batches!r}")
        self.meter = meter
        self.tracked_batches = tracked_batches
        self._guard = guard
        self.phase = BETWEEN_STEPS
        self.peaks: dict[str, int] = {}
        self.rises: dict[str, int] = {}
        self.batches = 0
        self._interval_start = 0

    def start_epoch(self, meter: Meter) -> None:
        """Starts an epoch on ``meter``: clears the books, resets the meter and reads the memory in use."""
        self.meter = meter
        self.peaks, self.rises = {}, {}
        self.batches = 0
        self.phase = BETWEEN_STEPS
        self._guard(meter.reset, "resetting the memory peak")
        start = self._guard(meter.read, "reading the memory in use")
        self._interval_start = start.current_bytes if start is not None else 0

    def enter(self, phase: str) -> None:
        """Ends the current phase (books its peak and rise while batches are tracked) and begins ``phase``."""
        if self.meter is None or self.batches >= self.tracked_batches:
            self.phase = phase
            return
        reading = self._guard(self.meter.read, "reading the memory peak")
        if reading is not None:
            self.record(self.phase, reading)
            self._guard(self.meter.reset, "resetting the memory peak")
            self._interval_start = reading.current_bytes
        self.phase = phase

    def end_batch(self) -> None:
        """Ends a batch: enters the between-steps phase, counts a tracked batch, or samples the meter after them."""
        tracking = self.batches < self.tracked_batches
        self.enter(BETWEEN_STEPS)
        if tracking:
            self.batches += 1
        elif self.meter is not None:
            self._guard(self.meter.sample, "sampling the memory in use")

    def record(self, phase: str, reading: PeakReading) -> None:
        """Books ``reading`` (an interval's figures) under ``phase``."""
        peak = int(reading.peak_bytes)
        self.peaks[phase] = max(peak, self.peaks.get(phase, 0))
        rise = max(peak - int(self._interval_start), 0)
        self.rises[phase] = max(rise, self.rises.get(phase, 0))

    def read(self) -> PeakReading | None:
        """The meter's figures now, without booking them (``None`` without a meter or when reading failed)."""
        if self.meter is None:
            return None
        return self._guard(self.meter.read, "reading the memory peak")

    def finish_epoch(self) -> PeakReading | None:
        """Reads the meter at the end of an epoch and books the last interval under the current phase."""
        reading = self.read()
        if reading is not None:
            self.record(self.phase, reading)
        return reading

    def peak_bytes(self, reading: PeakReading) -> int:
        """The epoch's peak: the largest phase peak (the meter was reset at each boundary), else ``reading``'s."""
        return max(self.peaks.values()) if self.peaks else int(reading.peak_bytes)

    def largest_rise_phase(self) -> str:
        """The phase in which memory rose most (by peak where no rise was booked; ``"unknown"`` without books)."""
        books = self.rises or self.peaks
        return max(books, key=books.get) if books else "unknown"
