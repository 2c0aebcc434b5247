"""The sequence length as a second axis of an estimate: each phase's peak as the largest of a few quadratics.

An estimator traces the step at the user's length ``s0`` and at half and twice
it, at the same batch. Each moment of a phase (the live bytes after one
allocation or free) is paired with the same moment of the other traces, which
gives it a quadratic ``q(s) = a + b*s + c*s*s`` in the length: attention with the
math kernel keeps ``batch x heads x s x s`` scores (the ``c`` term), flash and
memory-efficient kernels keep only what grows linearly, so the curve comes from
the traces, not from an assumption about the kernel. Against the batch,
a moment keeps its fixed bytes (from the traces at other batch sizes) and
scales the rest:

    bytes_i(batch, s) = fixed_i + batch / b0 * (q_i(s) - fixed_i)

and a phase's peak is its largest moment's (which moment is the peak can change
with the length: the logits at short lengths, attention at long ones); only the
moments that are the largest somewhere are kept. At ``s0`` this is the
estimate's own batch lines. Nothing here imports a framework.

Example:
    >>> curve = SequenceCurve(seq_len=128, batch_size=4, phases=(
    ...     SequencePhase("forward", curves=((1_000.0, 10.0, 0.5, 1_000), (5_000.0, 20.0, 0.0, 1_000))),))
    >>> curve.peak_bytes_at(4, 128)  # the quadratic: 1000 + 1280 + 8192
    10472
    >>> curve.peak_bytes_at(4, 16)  # the line is the larger at short lengths
    5320
    >>> curve.peak_bytes_at(8, 128)  # the batch doubles what is not fixed
    19944
    >>> curve.max_sequence_length(10_472, batch_size=4)
    128
    >>> capped = dataclasses.replace(curve, max_positions=100, max_positions_source="the position embedding 'wpe'")
    >>> capped.max_sequence_length(10**9, batch_size=4)  # the model takes no longer sequence
    100

Known limitations:
    * Exact where every tensor's size is a polynomial of degree two or less in
      the length and the step runs the same allocations at every length; kernel
      workspaces measured by probes may not follow it.
    * The tensor peak only: the allocator reserve and the device total at
      another length are not modelled.
    * A model's longest sequence (:attr:`SequenceCurve.max_positions`) is known only where the estimator found a
      table of learned positions (GPT-2, BERT); rotary or relative positions (Llama, T5) have no hard limit here,
      and lengths beyond what the model was trained on are answered as any other.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

__all__ = ["fit_quadratic", "MAX_SEQUENCE_SEARCH_LIMIT", "SequenceCurve", "SequencePhase"]

#: The longest sequence :meth:`SequenceCurve.max_sequence_length` searches up to.
MAX_SEQUENCE_SEARCH_LIMIT = 1 << 24


def fit_quadratic(points: Sequence[tuple[int, int]]) -> tuple[float, float, float]:
    """``(a, b, c)`` of the quadratic ``a + b*s + c*s*s`` through three ``(s, bytes)`` points (distinct ``s``).

    Example:
        >>> fit_quadratic([(1, 6), (2, 11), (3, 18)])  # 3 + 2s + s^2
        (3.0, 2.0, 1.0)
    """
    if len(points) != 3 or len({s for s, _ in points}) != 3:
        raise ValueError(f"a quadratic needs three points at distinct lengths, got {list(points)!r}")
    (x0, y0), (x1, y1), (x2, y2) = ((float(s), float(v)) for s, v in points)
    d0, d1, d2 = (x0 - x1) * (x0 - x2), (x1 - x0) * (x1 - x2), (x2 - x0) * (x2 - x1)
    c = y0 / d0 + y1 / d1 + y2 / d2
    b = -(y0 * (x1 + x2) / d0 + y1 * (x0 + x2) / d1 + y2 * (x0 + x1) / d2)
    a = y0 * x1 * x2 / d0 + y1 * x0 * x2 / d1 + y2 * x0 * x1 / d2
    return (round(a, 6), round(b, 6), round(c, 6))


@dataclasses.dataclass(frozen=True)
class SequencePhase:
    """One phase of the step against the sequence length.

    Attributes:
        phase: The phase's name.
        curves: One ``(a, b, c, fixed)`` per kept moment: its live bytes at the traced batch are
            ``a + b*s + c*s*s``, of which ``fixed`` do not grow with the batch. The phase's peak is the largest.
    """

    phase: str
    curves: tuple[tuple[float, float, float, float], ...]

    def at(self, batch_size: int, seq_len: int, traced_batch: int) -> int:
        scale = batch_size / traced_batch
        return int(
            round(
                max(fixed + scale * (a + b * seq_len + c * seq_len * seq_len - fixed) for a, b, c, fixed in self.curves)
            )
        )


@dataclasses.dataclass(frozen=True)
class SequenceCurve:
    """The step's peak against the batch and the sequence length.

    Attributes:
        seq_len: The traced (the user's) length.
        batch_size: The batch of the traces at other lengths.
        phases: One :class:`SequencePhase` per phase.
        traced_lengths: The lengths the curve was fitted through.
        dim: The input dimension that holds the sequence (``1`` for token ids ``(batch, length)``).
        max_positions: The longest sequence the model takes (its table of learned positions), ``None`` when it
            has no such table: :meth:`peak_bytes_at` refuses longer ones and :meth:`max_sequence_length` stops there.
        max_positions_source: Where :attr:`max_positions` comes from, for messages.
    """

    seq_len: int
    batch_size: int
    phases: tuple[SequencePhase, ...]
    traced_lengths: tuple[int, ...] = ()
    dim: int = 1
    max_positions: int | None = None
    max_positions_source: str = ""

    def peak_bytes_at(self, batch_size: int, seq_len: int) -> int:
        """The largest phase's peak at ``batch_size`` and ``seq_len``.

        Raises:
            ValueError: If either is not a positive integer, or ``seq_len`` is longer than the model takes
                (:attr:`max_positions`).
        """
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_positions is not None and seq_len > self.max_positions:
            raise ValueError(
                f"seq_len {seq_len} is longer than the model takes: at most {self.max_positions} positions "
                f"({self.max_positions_source}); a real step at that length fails"
            )
        return self._peak(batch_size, seq_len)

    def _peak(self, batch_size: int, seq_len: int) -> int:
        return max(phase.at(batch_size, seq_len, self.batch_size) for phase in self.phases)

    def max_sequence_length(self, budget_bytes: int, batch_size: int, limit: int = MAX_SEQUENCE_SEARCH_LIMIT) -> int:
        """The longest sequence whose peak at ``batch_size`` is within ``budget_bytes`` (0: not even a length of 1).

        The peak grows with the length (a quadratic with non-negative growth above the traced lengths), so the
        answer is found by doubling and bisection. It is at most :attr:`max_positions`, the longest sequence the
        model takes, when that is known.
        """
        if self.peak_bytes_at(batch_size, 1) > budget_bytes:
            return 0
        if self.max_positions is not None:
            limit = min(limit, self.max_positions)

        def fits(length: int) -> bool:
            return length <= limit and self._peak(batch_size, length) <= budget_bytes

        low, high = 1, 2
        while fits(high):
            low, high = high, high * 2
        while high - low > 1:  # low fits, high does not
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
        return low

    def to_dict(self) -> dict:
        return {
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "dim": self.dim,
            "traced_lengths": list(self.traced_lengths),
            "max_positions": self.max_positions,
            "max_positions_source": self.max_positions_source,
            "phases": [{"phase": p.phase, "curves": [list(curve) for curve in p.curves]} for p in self.phases],
        }
