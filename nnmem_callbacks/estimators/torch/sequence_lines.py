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
    * The longest sequence a model takes (:func:`position_limit`) is found from its table of learned positions,
      an ``nn.Embedding`` named like one (``wpe``, ``position_embeddings``, ``embed_positions``, ``pos_emb``);
      a table under another name is not found, and the curve then answers at lengths the model refuses. A PEFT
      prompt-learning adapter's virtual tokens take positions too: they come off the longest length.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from nnmem_callbacks.core.estimate import PhaseLine
from nnmem_callbacks.core.sequence import SequenceCurve, SequencePhase, fit_quadratic
from nnmem_callbacks.estimators.torch.batch_lines import aligned, base_phase, moment_slopes, phase_values
from nnmem_callbacks.estimators.torch.tracer import TraceResult

__all__ = ["KEPT_AT", "position_limit", "sequence_curve"]

#: The names of tables of learned positions (GPT-2's ``wpe``, BERT's ``position_embeddings``, BART's and OPT's
#: ``embed_positions``, ``pos_emb``), matched against a module's own name.
_POSITION_TABLE = re.compile(r"^wpe$|position|(^|_)pos(_|$)")


def position_limit(model: Any) -> tuple[int, str] | None:
    """The longest sequence ``model`` takes and where that comes from: the rows of its table of learned positions.

    A row per position (less the rows before the first position: ``padding_idx`` + 1 for RoBERTa, the ``offset``
    of BART's and OPT's tables). ``None`` when the model has no such table (rotary or relative positions).

    Example:
        >>> import torch
        >>> class Tiny(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.wte, self.wpe = torch.nn.Embedding(100, 8), torch.nn.Embedding(32, 8)
        >>> position_limit(Tiny())
        (32, "the position embedding 'wpe', 32 rows")
        >>> position_limit(torch.nn.Embedding(100, 8)) is None
        True
    """
    import torch

    found = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Embedding) or not _POSITION_TABLE.search(name.rsplit(".", 1)[-1].lower()):
            continue
        offset = getattr(module, "offset", 0)
        before = (module.padding_idx + 1 if module.padding_idx is not None else 0) + (
            offset if isinstance(offset, int) and not isinstance(offset, bool) else 0
        )
        found.append((module.num_embeddings - before, name, module.num_embeddings))
    if not found:
        return None
    rows, name, table = min(found)
    kept = f", less {table - rows} before the first position" if table != rows else ""
    virtual = _virtual_tokens(model)
    if virtual:
        return rows - virtual, f"the position embedding {name!r}, {table} rows{kept}, less {virtual} virtual tokens"
    return rows, f"the position embedding {name!r}, {table} rows{kept}"


def _virtual_tokens(model: Any) -> int:
    """The positions a PEFT prompt-learning adapter (prompt tuning, P-tuning, prefix tuning) takes before the
    batch's tokens: its ``num_virtual_tokens`` (0 without one)."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict):
        return 0
    active = getattr(model, "active_adapter", None)
    config = configs.get(active) if isinstance(active, str) else None
    if config is None or not getattr(config, "is_prompt_learning", False):
        return 0
    virtual = getattr(config, "num_virtual_tokens", 0)
    return virtual if isinstance(virtual, int) and not isinstance(virtual, bool) else 0


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
    model: Any = None,
) -> SequenceCurve:
    """Each phase's peak against the sequence length, from one-step traces (``trace_at(length)``, at the main
    batch) at half and twice ``batch.seq_len``.

    Args:
        lines: The main trace's batch lines per phase (a phase's fixed bytes where its moments do not pair).
        fit: ``(batch size, trace)``: the one-step trace at another batch size that gave the batch lines;
            each moment's fixed bytes come from it.
        model: The traced model, whose table of learned positions caps the length (:func:`position_limit`).
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
    limit = position_limit(model) if model is not None else None
    if limit is not None:
        notes.append(f"sequence axis: at most {limit[0]} positions, from {limit[1]}")
        if length > limit[0]:
            notes.append(
                f"warning: the batch's length {length} is longer than the model takes ({limit[0]} positions, "
                f"{limit[1]}): a real step fails"
            )
    cap = (None, "") if limit is None else limit
    return SequenceCurve(length, batch_size, tuple(phases), lengths, batch.seq_dim or 1, *cap)


def _slopes(main: TraceResult, fit: tuple[int, TraceResult] | None, phase: str, batch_size: int) -> list[float] | None:
    """Each moment's bytes per sample, from the trace at another batch size (``None`` where they do not pair)."""
    if fit is None or fit[0] == batch_size or phase not in fit[1].phase_ranges or not aligned(main, fit[1], phase):
        return None
    return moment_slopes(main, fit[1], phase, fit[0] - batch_size)
