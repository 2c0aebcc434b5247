"""The sequence-length axis of a PyTorch estimate: the traces at shorter lengths and the curve through them.

:func:`sequence_curve` traces the step at a quarter and half the batch's
sequence length (same batch, one step) and fits each phase's peak as a quadratic
in the length (:mod:`nnmem_callbacks.core.sequence`), anchored on the main
trace. ``estimate_training(..., sequence_dim=...)`` calls it.

Example:
    >>> import torch
    >>> from nnmem_callbacks.estimators.torch.estimator import estimate_training
    >>> lin = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 4))
    >>> est = estimate_training(lin, torch.zeros(2, 32, dtype=torch.long), "sgd", sequence_dim="auto")
    >>> est.sequence.traced_lengths, est.peak_bytes_at(2, seq_len=32) == est.peak_bytes
    ((8, 16, 32, 64), True)

Known limitations:
    * Phases the shorter traces do not run (the optimizer step) are taken as
      independent of the length.
    * The length must be 4 or more; above twice it and below a quarter of it
      the quadratics are extrapolated.
"""

from __future__ import annotations

from typing import Any, Callable

from nnmem_callbacks.core.estimate import PhaseLine
from nnmem_callbacks.core.sequence import SequenceCurve, SequencePhase, fit_quadratic
from nnmem_callbacks.estimators.torch.tracer import TraceResult

__all__ = ["sequence_curve"]


def sequence_curve(
    batch: Any, main: TraceResult, lines: list[PhaseLine], notes: list[str], trace_at: Callable[[int], TraceResult]
) -> SequenceCurve:
    """Each phase's peak against the sequence length, from traces (``trace_at(length)``: one step at the main
    batch) at a quarter, half and twice ``batch.seq_len``; ``lines`` are the main trace's batch lines per phase."""
    batch_size, length = batch.batch_size, batch.seq_len
    quarter, half, double = max(1, length // 4), max(2, length // 2), 2 * length
    traces = {s: trace_at(s) for s in sorted({quarter, half, double})}
    phases = []
    for phase, peak in main.phase_peaks.items():
        fixed = max((line.fixed_bytes for line in lines if line.phase == phase and line.covers(batch_size)), default=0)
        first = "step1/" + phase.split("/", 1)[1] if phase.startswith("step") and "/" in phase else phase
        at = {s: trace.phase_peaks.get(first) for s, trace in traces.items()}
        at[length] = main.phase_peaks.get(first)
        if all(value is not None for value in at.values()) and len({quarter, half, length, double}) == 4:
            curves = []
            for points in ((half, length, double), (quarter, half, length)):
                a, b, c = fit_quadratic([(s, at[s]) for s in points])
                # the same growth, from this phase's own peak at the traced length (step 2 holds the optimizer state)
                curves.append((round(a + peak - at[length], 6), b, c))
            phases.append(SequencePhase(phase, int(fixed), curves[0], curves[1]))
        else:  # a phase the other traces do not run (the optimizer): it does not depend on the length
            phases.append(SequencePhase(phase, int(fixed), (float(peak), 0.0, 0.0)))
    lengths = (quarter, half, length, double)
    notes.append(
        f"sequence axis: dim {batch.seq_dim} of the batch (length {length}); each phase's peak is a quadratic in the "
        f"length through the traces at {', '.join(str(s) for s in lengths)} (above {length}: the upper three)"
    )
    return SequenceCurve(length, batch_size, tuple(phases), lengths, batch.seq_dim or 1)
