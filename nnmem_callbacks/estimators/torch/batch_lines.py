"""How a traced step's memory grows with the batch: lines through the moments of traces at two batch sizes.

Each moment of a phase (an allocation or free in the step's log) is paired with the same moment of a trace at
another batch size, which gives its bytes per sample; a phase's peak at any batch is the upper envelope of its
moments' lines. Design: ``docs/torch-estimator.md`` (the allocation log at any batch and its pairing rules).

Known limitations:
    * A phase whose allocations do not pair one to one between the traces scales by its peak alone (the caller
      notes it).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from nnmem_callbacks.core.estimate import Category, PhaseLine, upper_envelope
from nnmem_callbacks.estimators.torch.tracer import TraceResult

__all__ = [
    "aligned",
    "base_phase",
    "category_line",
    "event_lines",
    "moment_slopes",
    "paired_lines",
    "phase_values",
    "scaling_sizes",
]


def base_phase(phase: str) -> str:
    """``"step2/backward.2"`` -> ``"backward.2"``: the batch-dependent part of a phase."""
    return phase.split("/", 1)[1]


def category_line(trace: TraceResult, phase: str, batch_size: int) -> PhaseLine:
    """A phase's peak as a line whose slope is its batch-dependent bytes per sample."""
    breakdown = trace.phase_breakdowns[phase]
    dependent = breakdown[str(Category.INPUTS)] + breakdown[str(Category.ACTIVATIONS)]
    if not phase.endswith("/optimizer"):
        dependent += breakdown[str(Category.TEMPORARIES)]
    slope = round(dependent / batch_size)
    peak = trace.phase_peaks[phase]
    return PhaseLine(phase, int(peak - slope * batch_size), int(slope))


def event_lines(phase: str, values: Sequence[int], slopes: Sequence[float], batch_size: int) -> list[PhaseLine]:
    """One line per moment of a phase, through its live bytes at ``batch_size``."""
    lines = []
    for value, slope in zip(values, slopes):
        per_sample = int(round(slope))
        lines.append(PhaseLine(phase, int(value - per_sample * batch_size), per_sample))
    return upper_envelope(lines)


def aligned(first: TraceResult, second: TraceResult, phase: str, other_phase: str | None = None) -> bool:
    """Whether ``phase`` of ``first`` and ``other_phase`` (default: the same) of
    ``second`` run the same sequence of allocations and frees.

    Only then can their moments be paired one to one. (FakeTensorMode's first,
    uncached call of an op can alias two outputs that later cached calls
    return separately, so even two runs of one model can differ.)
    """
    other_phase = other_phase or phase
    if other_phase not in second.phase_ranges:
        return False
    start_a, end_a = first.phase_ranges[phase]
    start_b, end_b = second.phase_ranges[other_phase]
    if end_a - start_a != end_b - start_b:
        return False
    events_a, events_b = first.events[start_a:end_a], second.events[start_b:end_b]
    return all((a[1] < 0) == (b[1] < 0) for a, b in zip(events_a, events_b))


def phase_values(trace: TraceResult, phase: str) -> list[int]:
    start, end = trace.phase_ranges[phase]
    return trace.trajectory[start : end + 1]


def moment_slopes(main: TraceResult, other: TraceResult, phase: str, span: int) -> list[float]:
    """Each moment's bytes per sample between ``main`` and ``other``, whose batch is ``span`` samples larger
    (the phase must be :func:`aligned` between them)."""
    return [(o - v) / span for o, v in zip(phase_values(other, phase), phase_values(main, phase))]


def paired_lines(
    main: TraceResult, other: TraceResult, batch_size: int, other_size: int, low: int, high: int | None
) -> tuple[list[PhaseLine], list[str]]:
    """Lines through each moment of ``main`` and the same moment of ``other``.

    Forward and backward phases of step 1 are paired moment by moment with the
    other trace (which ran step 1 only); step 2's moments reuse step 1's
    growth per sample, since they differ only by the optimizer state alive.
    Phases whose moments cannot be paired scale by their peaks; the optimizer
    phases by the batch-dependent categories alive at their peaks.

    Returns:
        The lines, valid for batch sizes ``low``..``high``, and the phases that
        could not be paired.
    """
    lines: list[PhaseLine] = []
    step1_slopes: dict[str, list[float]] = {}
    peak_slopes: dict[str, int] = {}
    unaligned = []
    span = other_size - batch_size
    for phase in main.phase_peaks:
        base = base_phase(phase)
        values = phase_values(main, phase)
        slopes = None
        if phase.startswith("step1/") and phase in other.phase_ranges:
            peak_slopes[base] = round((other.phase_peaks[phase] - main.phase_peaks[phase]) / span)
            candidate = moment_slopes(main, other, phase, span)
            if aligned(main, other, phase) and min(candidate) >= 0:
                slopes = step1_slopes[base] = candidate
            else:
                unaligned.append(phase)
        elif base in step1_slopes and aligned(main, main, "step1/" + base, phase):
            slopes = step1_slopes[base]
        if slopes is not None:
            phase_lines = event_lines(phase, values, slopes, batch_size)
        elif base in peak_slopes:
            slope = peak_slopes[base]
            phase_lines = [PhaseLine(phase, int(main.phase_peaks[phase] - slope * batch_size), int(slope))]
        else:
            phase_lines = [category_line(main, phase, batch_size)]
        lines.extend(dataclasses.replace(line, min_batch=low, max_batch=high) for line in phase_lines)
    return lines, unaligned


def scaling_sizes(batch_size: int) -> tuple[int, int]:
    """The batch sizes of the trace above the batch and of the one below it.

    The one below (a quarter of the batch) checks the lines fitted above and,
    where growth is not linear, gives the lines that hold below the batch.
    A batch of one has nothing below it; a trace at three checks instead.
    """
    fit = 2 * batch_size
    check = max(1, batch_size // 4) if batch_size >= 2 else 3
    return fit, check
