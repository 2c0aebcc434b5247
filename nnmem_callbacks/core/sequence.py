"""The sequence length as a second axis of an estimate: each phase's peak as a quadratic in the length.

An estimator traces the step at the user's length ``s0`` and at a quarter, a half
and twice it, at the same batch. Each phase's peak is then a quadratic
``q(s) = a + b*s + c*s*s``: through the traces at ``s0/2``, ``s0`` and ``2*s0`` for
lengths above ``s0``, through ``s0/4``, ``s0/2`` and ``s0`` below it (which moment of a
phase is its peak can change with the length: a fixed workspace at short
lengths, the activations at long ones). Attention with the math kernel keeps
``batch x heads x s x s`` scores (the ``c`` term), flash and memory-efficient
kernels keep only what grows linearly (``c`` near 0), so the curve comes from
the traces, not from an assumption about the kernel. Against the batch, a phase
keeps its fixed bytes and scales the rest:

    peak_p(batch, s) = fixed_p + batch / b0 * (q_p(s) - fixed_p)

and the step's peak is the largest phase's. At ``s0`` this is the estimate's own
batch line. Nothing here imports a framework.

Example:
    >>> curve = SequenceCurve(seq_len=128, batch_size=4, phases=(
    ...     SequencePhase("forward", fixed_bytes=1_000, coefficients=(1_000.0, 10.0, 0.5)),))  # one curve both ways
    >>> curve.peak_bytes_at(4, 128)  # 1000 + 1280 + 8192
    10472
    >>> curve.peak_bytes_at(8, 128)  # the batch doubles what is not fixed
    19944
    >>> curve.max_sequence_length(10_472, batch_size=4)
    128

Known limitations:
    * A quadratic is exact where every tensor's size is a polynomial of degree
      two or less in the length and the schedule does not change with it;
      kernel workspaces measured by probes may not follow it.
    * The tensor peak only: the allocator reserve and the device total at
      another length are not modelled.
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
        fixed_bytes: What does not grow with the batch (the phase's batch line at the traced length).
        coefficients: ``(a, b, c)``: the phase's peak at the traced batch is ``a + b*s + c*s*s`` above the
            traced length.
        coefficients_below: The same at and below the traced length (``None``: ``coefficients``).
    """

    phase: str
    fixed_bytes: int
    coefficients: tuple[float, float, float]
    coefficients_below: tuple[float, float, float] | None = None

    def at(self, batch_size: int, seq_len: int, traced_batch: int, below: bool = False) -> int:
        a, b, c = self.coefficients_below if below and self.coefficients_below is not None else self.coefficients
        at_traced_batch = a + b * seq_len + c * seq_len * seq_len
        return int(round(self.fixed_bytes + batch_size / traced_batch * (at_traced_batch - self.fixed_bytes)))


@dataclasses.dataclass(frozen=True)
class SequenceCurve:
    """The step's peak against the batch and the sequence length.

    Attributes:
        seq_len: The traced (the user's) length.
        batch_size: The batch of the traces at other lengths.
        phases: One :class:`SequencePhase` per phase.
        traced_lengths: The lengths the curve was fitted through.
        dim: The input dimension that holds the sequence (``1`` for token ids ``(batch, length)``).
    """

    seq_len: int
    batch_size: int
    phases: tuple[SequencePhase, ...]
    traced_lengths: tuple[int, ...] = ()
    dim: int = 1

    def peak_bytes_at(self, batch_size: int, seq_len: int) -> int:
        """The largest phase's peak at ``batch_size`` and ``seq_len``."""
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        below = seq_len <= self.seq_len
        return max(phase.at(batch_size, seq_len, self.batch_size, below) for phase in self.phases)

    def max_sequence_length(self, budget_bytes: int, batch_size: int, limit: int = MAX_SEQUENCE_SEARCH_LIMIT) -> int:
        """The longest sequence whose peak at ``batch_size`` is within ``budget_bytes`` (0: not even a length of 1).

        The peak grows with the length (a quadratic with non-negative growth above the traced lengths), so the
        answer is found by doubling and bisection.
        """
        if self.peak_bytes_at(batch_size, 1) > budget_bytes:
            return 0
        low, high = 1, 2
        while high <= limit and self.peak_bytes_at(batch_size, high) <= budget_bytes:
            low, high = high, high * 2
        if high > limit:
            return limit
        while high - low > 1:
            middle = (low + high) // 2
            if self.peak_bytes_at(batch_size, middle) <= budget_bytes:
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
            "phases": [
                {
                    "phase": p.phase,
                    "fixed_bytes": p.fixed_bytes,
                    "coefficients": list(p.coefficients),
                    "coefficients_below": list(p.coefficients_below) if p.coefficients_below is not None else None,
                }
                for p in self.phases
            ],
        }
