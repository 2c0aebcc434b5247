"""Formatting of estimates: plain-text tables for logs, warnings and the CLI.

Collecting (the estimators) and computing (``estimate.py``, ``plan.py``) live
elsewhere; this module only turns numbers into text.

Example:
    >>> from nnmem_callbacks.core.estimate import MemoryEstimate
    >>> print(format_breakdown(MemoryEstimate(peak_bytes=3 * 1024**2,
    ...       breakdown={"parameters": 1024**2, "activations": 2 * 1024**2}, batch_size=4)))
    category                bytes  share
    parameters           1.00 MiB  33.3%
    activations          2.00 MiB  66.7%
    peak                 3.00 MiB  100.0%
"""

from __future__ import annotations

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.units import format_bytes

__all__ = ["breakdown_rows", "first_line", "format_breakdown", "format_markdown_breakdown", "format_summary"]


def first_line(error: BaseException) -> str:
    """The first line of an error's message, at most 300 characters (for one-line warnings and notes).

    Example:
        >>> first_line(ValueError("bad shape" + chr(10) + "see the docs"))
        'bad shape'
    """
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else ""


def breakdown_rows(estimate: MemoryEstimate, *, include_zero: bool = False) -> list[tuple[str, int, float]]:
    """Rows of (category, bytes, share of the peak), in category order."""
    total = max(estimate.peak_bytes, 1)
    return [(name, value, value / total) for name, value in estimate.breakdown.items() if value or include_zero]


def format_breakdown(estimate: MemoryEstimate, *, include_zero: bool = False) -> str:
    """A fixed-width table of the breakdown at the peak."""
    lines = [f"{'category':<16}{'bytes':>13}  share"]
    for name, value, share in breakdown_rows(estimate, include_zero=include_zero):
        lines.append(f"{name:<16}{format_bytes(value):>13}  {share:.1%}")
    lines.append(f"{'peak':<16}{format_bytes(estimate.peak_bytes):>13}  100.0%")
    return "\n".join(lines)


def format_summary(estimate: MemoryEstimate) -> str:
    """The breakdown plus device figures, scaling and notes, as text."""
    lines = [
        f"Estimated training memory on {estimate.device} ({estimate.precision}, batch {estimate.batch_size}, "
        f"method {estimate.method}):",
        format_breakdown(estimate),
        f"peak phase: {estimate.peak_phase}; fixed {format_bytes(estimate.fixed_bytes)} "
        f"+ {format_bytes(estimate.per_sample_bytes)} per sample",
    ]
    if estimate.reserved_bytes is not None:
        lines.append(f"allocator reserve: {format_bytes(estimate.reserved_bytes)}")
    if estimate.overhead_bytes:
        lines.append(f"CUDA context + libraries: {format_bytes(estimate.overhead_bytes)}")
    if estimate.reserved_bytes is not None or estimate.overhead_bytes:
        lines.append(f"device total: {format_bytes(estimate.device_bytes)}")
    for note in estimate.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def format_markdown_breakdown(estimate: MemoryEstimate) -> str:
    """The breakdown as a Markdown table (TensorBoard text, READMEs)."""
    lines = ["| category | bytes | share |", "|---|---:|---:|"]
    for name, value, share in breakdown_rows(estimate):
        lines.append(f"| {name} | {format_bytes(value)} | {share:.1%} |")
    lines.append(f"| **peak** | **{format_bytes(estimate.peak_bytes)}** | 100% |")
    return "\n".join(lines)
