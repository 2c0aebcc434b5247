"""Piecewise-linear curves through probed points.

A kernel's bytes are probed at a few per-sample multiples ``n`` of its
batch-scaled dims. :class:`Curve` interpolates linearly between the probed
points and extrapolates with the last (or first) segment.

Example:
    >>> curve = Curve({1: 100, 2: 150, 4: 250})
    >>> curve.at(3), curve.at(8), curve.is_linear()
    (200, 450, True)
    >>> Curve({1: 100_000, 2: 200_000, 4: 300_000}).is_linear()  # saturates
    False
"""

from __future__ import annotations

import bisect
import dataclasses

__all__ = ["ABS_TOLERANCE", "Curve", "REL_TOLERANCE"]


#: a probe at n = 4 within this fraction (or :data:`ABS_TOLERANCE` bytes) of the line through 1 and 2 confirms it
REL_TOLERANCE = 0.01
ABS_TOLERANCE = 4096


@dataclasses.dataclass
class Curve:
    """Probed ``n -> bytes`` points; :meth:`at` interpolates between them."""

    points: dict[int, int] = dataclasses.field(default_factory=dict)

    def at(self, n: float) -> int:
        """The bytes at ``n`` (piecewise linear; the end segments extrapolate)."""
        if not self.points:
            raise ValueError("no probed points")
        xs = sorted(self.points)
        if n in self.points:
            return int(self.points[n])
        if len(xs) == 1:
            return int(self.points[xs[0]])
        index = bisect.bisect_left(xs, n)
        index = min(max(index, 1), len(xs) - 1)
        x0, x1 = xs[index - 1], xs[index]
        y0, y1 = self.points[x0], self.points[x1]
        return max(0, int(round(y0 + (y1 - y0) * (n - x0) / (x1 - x0))))

    def is_linear(self) -> bool:
        """Whether the point at 4 lies on the line through 1 and 2 (within tolerance)."""
        if not all(n in self.points for n in (1, 2, 4)):
            return False
        predicted = self.points[2] + 2 * (self.points[2] - self.points[1])
        actual = self.points[4]
        return abs(predicted - actual) <= max(REL_TOLERANCE * actual, ABS_TOLERANCE)

    def to_json(self) -> list[list[int]]:
        return [[n, int(self.points[n])] for n in sorted(self.points)]

    @staticmethod
    def from_json(points: list) -> "Curve":
        return Curve({int(n): int(v) for n, v in points})
