"""The sequence-length axis of a PyTorch estimate: traces at other lengths, moment by moment.

:func:`sequence_curve` traces the step at half and twice the batch's sequence
length (same batch, one step) and pairs each moment of a phase with the same
moment of those traces (as :mod:`~nnmem_callbacks.estimators.torch.batch_lines`
does across batch sizes), which gives every moment a quadratic in the length
(:mod:`nnmem_callbacks.core.sequence`). ``estimate_training(..., sequence_dim=...)``
calls it.

Example:
    >>> import torch
    >>> from nnmem_callbacks.estimators.torch.estimator import estimate_training
    >>> lin = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 4))
    >>> est = estimate_training(lin, torch.zeros(2, 32, dtype=torch.long), "sgd", sequence_dim="auto")
    >>> est.sequence.traced_lengths, est.peak_bytes_at(2, seq_len=32) == est.peak_bytes
    ((16, 32, 64), True)

Known limitations:
    * A phase whose allocations do not pair one to one between the lengths is
      fitted by its peaks alone (a note says so): where its peak moment changes
      with the length, that curve can miss far from the traced lengths.
    * Phases the other traces do not run (the optimizer step) are taken as
      independent of the length.
    * The length must be 4 or more.
"""

from __future__ import annotations

from typing import Any, Callable

from nnmem_callbacks.core.estimate import PhaseLine
from nnmem_callbacks.core.sequence import SequenceCurve, SequencePhase, fit_quadratic
from nnmem_callbacks.estimators.torch.batch_lines import aligned, base_phase, moment_slopes, phase_values
from nnmem_callbacks.estimators.torch.tracer import TraceResult

__all__ = ["KEPT_AT", "sequence_curve"]


#: Lengths, as multiples of the traced one, at which the moments that are a phase's peak are found and kept.
KEPT_AT = (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8, 16, 32, 64)


def _quadratics(values: dict[int, list[int]]) -> list[tuple[float, float, float]]:
    """One quadratic per moment through its live bytes at the three lengths."""
    lengths = sorted(values)
    return [fit_quadratic(list(zip(lengths, moment))) for moment in zip(*(values[s] for s in lengths))]


def _dominant(curves: list[tuple[float, float, float]], length: int) -> list[int]:
    """The moments whose curve is the largest at some length of :data:`KEPT_AT` (the traced length's first)."""
    kept: dict[int, None] = {}
    for factor in (1, *KEPT_AT):
        s = max(1.0, factor * length)
        kept.setdefault(max(range(len(curves)), key=lambda i: curves[i][0] + curves[i][1] * s + curves[i][2] * s * s))
    return list(kept)


def sequence_curve(
    batch: Any,
    main: TraceResult,
    lines: list[PhaseLine],
    notes: list[str],
    trace_at: Callable[[int], TraceResult],
    fit: tuple[int, TraceResult] | None = None,
) -> SequenceCurve:
    """Each phase's peak against the sequence length, from one-step traces (``trace_at(length)``, at the main
    batch) at half and twice ``batch.seq_len``.

    Args:
        lines: The main trace's batch lines per phase (a phase's fixed bytes where its moments do not pair).
        fit: ``(batch size, trace)``: the one-step trace at another batch size that gave the batch lines;
            each moment's fixed bytes come from it.
    """
    batch_size, length = batch.batch_size, batch.seq_len
    half, double = length // 2, 2 * length
    traces = {half: trace_at(half), double: trace_at(double)}
    phases, step1, unpaired = [], {}, []
    for phase, peak in main.phase_peaks.items():
        phase_fixed = max(
            (line.fixed_bytes for line in lines if line.phase == phase and line.covers(batch_size)), default=0
        )
        base = base_phase(phase) if "/" in phase else phase
        values = phase_values(main, phase)
        curves, slopes = None, None
        if phase.startswith("step1/") and all(phase in trace.phase_ranges for trace in traces.values()):
            if all(aligned(main, trace, phase) for trace in traces.values()):
                at = {s: phase_values(trace, phase) for s, trace in traces.items()}
                at[length] = values
                curves = _quadratics(at)
                slopes = _slopes(main, fit, phase, batch_size)
                # each moment's growth, for the later steps' same moments
                step1[base] = ([(b, c, b * length + c * length * length) for _, b, c in curves], slopes)
            else:
                unpaired.append(phase)
                at = {s: [trace.phase_peaks[phase]] for s, trace in traces.items()}
                at[length] = [peak]
                curves = _quadratics(at)
                values = [peak]
        elif base in step1 and aligned(main, main, "step1/" + base, phase):
            growth, slopes = step1[base]
            curves = [(v - grown, b, c) for v, (b, c, grown) in zip(values, growth)]
        if curves is None:  # a phase the other traces do not run (the optimizer): it does not depend on the length
            phases.append(SequencePhase(phase, ((float(peak), 0.0, 0.0, float(phase_fixed)),)))
            continue
        kept = []
        for i in _dominant(curves, length):
            fixed = values[i] - slopes[i] * batch_size if slopes is not None else phase_fixed
            kept.append((*curves[i], round(float(fixed), 3)))
        phases.append(SequencePhase(phase, tuple(kept)))
    lengths = (half, length, double)
    notes.append(
        f"sequence axis: dim {batch.seq_dim} of the batch (length {length}); each moment of the step is a quadratic "
        f"in the length through the traces at {', '.join(str(s) for s in lengths)}"
        + (f"; {', '.join(unpaired)} did not pair moment by moment and follow their peaks" if unpaired else "")
    )
    return SequenceCurve(length, batch_size, tuple(phases), lengths, batch.seq_dim or 1)


def _slopes(main: TraceResult, fit: tuple[int, TraceResult] | None, phase: str, batch_size: int) -> list[float] | None:
    """Each moment's bytes per sample, from the trace at another batch size (``None`` where they do not pair)."""
    if fit is None or fit[0] == batch_size or phase not in fit[1].phase_ranges or not aligned(main, fit[1], phase):
        return None
    return moment_slopes(main, fit[1], phase, fit[0] - batch_size)
