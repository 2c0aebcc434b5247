"""Formatting: rich tables, JSON (equal to the API's ``to_dict``) and the ``--plot`` hand-off."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Sequence

from nnmem_callbacks.cli.compute import FitSummary
from nnmem_callbacks.cli.plots import plot_estimate
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.formatting import breakdown_rows
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.hardware import gpus as gpu_table

__all__ = [
    "emit_estimate",
    "estimate_to_json",
    "make_console",
    "readable_note",
    "render_estimate",
    "sequence_text",
    "BASIS_MARKS",
    "USABLE_NOTE",
    "usable_text",
]

#: Under a table of GPUs: which of a card's two sizes a fit is checked against, and where it comes from.
USABLE_NOTE = (
    'CUDA total: what torch.cuda.mem_get_info() reports (an out-of-memory message\'s "total capacity"), which '
    f"fits are checked against; measured here on {', '.join(g.name for g in gpu_table.GPUS if g.capacity_measured)}; "
    "^ reported: the lowest figure found in public out-of-memory messages on such a card (one user's driver; "
    "`nnmem gpus --json` names the sources); "
    f"~ assumed: nvidia-smi's total less the driver's reserve, {gpu_table.driver_reserve_rule()}"
)

#: The mark before a CUDA total in the tables, by :attr:`~nnmem_callbacks.hardware.gpus.GpuSpec.capacity_basis`.
BASIS_MARKS = {"measured": "", "reported": "^", "assumed": "~"}


def usable_text(capacity_bytes: int, basis: str) -> str:
    """A card's CUDA total for the tables: ``^`` marks a reported one, ``~`` an assumed one.

    ``basis`` is ``"measured"``, ``"reported"`` or ``"assumed"`` (:attr:`~nnmem_callbacks.hardware.gpus.GpuSpec.capacity_basis`).

    Example:
        >>> usable_text(85_017_493_504, "measured"), usable_text(15_628_828_672, "reported")
        ('79.18 GiB', '^14.56 GiB')
        >>> usable_text(15_456_010_240, "assumed")
        '~14.39 GiB'
    """
    if basis not in BASIS_MARKS:
        raise ValueError(f"unknown CUDA total basis {basis!r}; use one of {', '.join(BASIS_MARKS)}")
    return BASIS_MARKS[basis] + format_bytes(capacity_bytes)


def estimate_to_json(estimate: MemoryEstimate, fit: FitSummary, **extra: Any) -> str:
    """The estimate and the fit as one JSON document (bytes as integers)."""
    document = estimate.to_dict()
    document["fit"] = fit.to_dict()
    document.update(extra)
    return json.dumps(document, indent=2, default=str)


def make_console(file: Any = None) -> Any:
    """A rich console for the command's output; a reader that goes away (``| head``) ends the command quietly.

    rich answers a closed pipe by exiting with status 1 (``Console.on_broken_pipe``); here it raises
    ``BrokenPipeError`` instead, which :func:`nnmem_callbacks.cli.main` turns into status 0, as for JSON output.
    """
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return PipeConsole(file=file or sys.stdout, highlight=False, width=None if (file or sys.stdout).isatty() else 110)


#: The largest batch of an estimate whose step could not run (method ``static-only``: ``FitSummary.max_batch_size``
#: is ``None`` with a budget).
UNKNOWN_LARGEST = "unknown (the step could not run, so activations are not counted: see the notes)"


def _batch_text(batch_size: int | None) -> str:
    """A batch size for the tables; the search's upper bound reads as "at least", ``None`` (not known) "unknown".

    Example:
        >>> _batch_text(1 << 24), _batch_text(12), _batch_text(0), _batch_text(None)
        ('>= 16,777,216', '12', '0 (not even 1)', 'unknown')
    """
    from nnmem_callbacks.core.batch_search import MAX_BATCH_SEARCH_LIMIT

    if batch_size is None:
        return "unknown"
    if batch_size >= MAX_BATCH_SEARCH_LIMIT:
        return f">= {MAX_BATCH_SEARCH_LIMIT:,}"
    if batch_size == 0:
        return "0 (not even 1)"
    return str(batch_size)


_RAW_BYTES = re.compile(r"\b(\d{4,}) bytes\b")


def readable_note(note: str) -> str:
    """A note with raw byte counts written with units.

    Example:
        >>> readable_note("rounding adds 28971460 bytes to the peak")
        'rounding adds 27.63 MiB to the peak'
    """
    return _RAW_BYTES.sub(lambda match: format_bytes(int(match.group(1))), note)


def render_estimate(
    estimate: MemoryEstimate, fit: FitSummary, *, title: str, why: Sequence[str] = (), console: Any = None
) -> None:
    """Prints the breakdown, device figures, fits and notes as rich tables."""
    from rich.table import Table

    console = console or make_console()
    console.print(f"[bold]{title}[/bold]")
    table = Table()
    table.add_column("category")
    table.add_column("size", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("share", justify="right")
    for name, value, share in breakdown_rows(estimate):
        table.add_row(name, format_bytes(value), f"{value:,}", f"{share:.1%}")
    table.add_section()
    table.add_row(
        "[bold]peak (tensors)[/bold]",
        f"[bold]{format_bytes(estimate.peak_bytes)}[/bold]",
        f"{estimate.peak_bytes:,}",
        "100.0%",
    )
    if estimate.reserved_bytes is not None:
        table.add_row("allocator reserve", format_bytes(estimate.reserved_bytes), f"{estimate.reserved_bytes:,}", "")
    if estimate.overhead_bytes:
        table.add_row(
            "CUDA context + libraries", format_bytes(estimate.overhead_bytes), f"{estimate.overhead_bytes:,}", ""
        )
    if estimate.reserved_bytes is not None or estimate.overhead_bytes:
        table.add_row(
            "[bold]device total[/bold]",
            f"[bold]{format_bytes(estimate.device_bytes)}[/bold]",
            f"{estimate.device_bytes:,}",
            "",
        )
    console.print(table)
    console.print(
        f"peak phase {estimate.peak_phase}: {format_bytes(estimate.fixed_bytes)} fixed + "
        f"{format_bytes(estimate.per_sample_bytes)} per sample; method {estimate.method}"
    )
    if fit.budget_bytes is not None:
        where = fit.target.where
        what = "device total" if fit.compared == "device" else "peak"
        verdict = "fits" if fit.fits else "does NOT fit"
        if fit.budget_named:
            budget = (
                f"budget {format_bytes(fit.budget_bytes)} ({where}), keeping {fit.margin:.0%} free: "
                f"{format_bytes(fit.usable_bytes)} usable"
            )
        else:
            budget = (
                f"budget {format_bytes(fit.budget_bytes)}: {where}'s {fit.target.memory_word} less {fit.margin:.0%}"
            )
            gpu = fit.target.gpu
            if gpu is not None:
                how = gpu.capacity_basis
                budget += f" ({format_bytes(gpu.capacity_bytes)}, {how}: see `nnmem gpus`)"
        console.print(budget)
        largest = UNKNOWN_LARGEST if fit.max_batch_size is None else _batch_text(fit.max_batch_size)
        console.print(
            f"batch {estimate.batch_size} {verdict} ({what} {format_bytes(fit.predicted_bytes)}); "
            f"largest batch that fits: [bold]{largest}[/bold]"
        )
        if fit.plan is not None and fit.plan.verification is not None:
            console.print(fit.plan.verification.text, markup=False)
    if fit.gpus:
        gpu_rows = Table(
            title=f"Which GPU fits (device total vs CUDA total minus {fit.margin:.0%})", title_justify="left"
        )
        gpu_rows.add_column("GPU")
        gpu_rows.add_column("nvidia-smi", justify="right")
        gpu_rows.add_column("CUDA total", justify="right")
        gpu_rows.add_column(f"batch {estimate.batch_size}", justify="center")
        gpu_rows.add_column("max batch", justify="right")
        counts = any(row.gpus_needed is not None for row in fit.gpus)
        if counts:
            gpu_rows.add_column(f"GPUs for batch {estimate.batch_size} per rank", justify="right")
        for row in fit.gpus:
            mark = "" if row.covered else " *"
            cells = [
                row.name + mark,
                format_bytes(row.memory_bytes),
                usable_text(row.capacity_bytes, row.capacity_basis),
                "yes" if row.fits else "no",
                _batch_text(row.max_batch_size),
            ]
            if counts:
                cells.append(str(row.gpus_needed) if row.gpus_needed is not None else "none (a rank alone exceeds it)")
            gpu_rows.add_row(*cells)
        console.print(gpu_rows)
        console.print(USABLE_NOTE, markup=False)
        if not all(row.covered for row in fit.gpus):
            console.print(
                "* this card's architecture runs other kernels (attention) than the one estimated; "
                "estimate for it with --device <that GPU>"
            )
    for line in why:
        console.print(line)
    for note in estimate.notes:
        console.print(f"[dim]note: {readable_note(note)}[/dim]")


def emit_estimate(
    estimate: MemoryEstimate,
    fit: FitSummary,
    args: argparse.Namespace,
    *,
    title: str,
    why: Sequence[str] = (),
    **json_extra: Any,
) -> None:
    if args.plot:
        plot_estimate(estimate, fit, args.plot, title=title)
    if args.json:
        if why:
            json_extra["why"] = list(why)
        if args.plot:
            json_extra["plot"] = args.plot
        print(estimate_to_json(estimate, fit, **json_extra))
        return
    render_estimate(estimate, fit, title=title, why=why)
    if args.plot:
        print(f"plot written to {args.plot}")


def sequence_text(answer: dict[str, Any]) -> str:
    """The ``--seq-len`` lines of ``nnmem estimate``.

    Example:
        >>> print(sequence_text({"traced_seq_len": 128, "traced_lengths": [64, 128, 256], "seq_len": 512,
        ...                      "batch_size": 4, "peak_bytes": 3 * 2**30, "max_sequence_length": 700,
        ...                      "usable_peak_bytes": 4 * 2**30}))
        at sequence length 512 (traced at 64, 128 and 256): peak 3.00 GiB at batch 4
        longest sequence that fits 4.00 GiB at batch 4: 700
        >>> print(sequence_text({"traced_seq_len": 64, "seq_len": 128, "batch_size": 2, "peak_bytes": 2**20,
        ...                      "max_sequence_length": 1024, "usable_peak_bytes": 2**30, "max_positions": 1024}))
        at sequence length 128 (traced at 64): peak 1.00 MiB at batch 2
        longest sequence that fits 1.00 GiB at batch 2: 1024 (the model takes no more positions)
    """
    limit = answer.get("max_positions")

    def longest(length: int, grouped: bool = False) -> str:
        return (f"{length:,}" if grouped else str(length)) + (
            " (the model takes no more positions)" if limit is not None and length >= limit else ""
        )

    traced = [int(n) for n in answer.get("traced_lengths") or (answer["traced_seq_len"],)]
    lengths = traced[0] if len(traced) == 1 else f"{', '.join(map(str, traced[:-1]))} and {traced[-1]}"
    lines = [
        f"at sequence length {answer['seq_len']} (traced at {lengths}): peak {format_bytes(answer['peak_bytes'])} "
        f"at batch {answer['batch_size']}"
    ]
    if answer.get("max_sequence_length") is not None:
        lines.append(
            f"longest sequence that fits {format_bytes(answer['usable_peak_bytes'])} at batch "
            f"{answer['batch_size']}: {longest(answer['max_sequence_length'])}"
        )
    if answer.get("gpus"):
        lines.append(
            f"which GPU fits length {answer['seq_len']} at batch {answer['batch_size']} (nvidia-smi's memory, "
            f"and the CUDA total it is checked against; ^ reported, ~ assumed):"
        )
        for row in answer["gpus"]:
            cuda = usable_text(row["capacity_bytes"], row["capacity_basis"])
            lines.append(
                f"  {row['name']:<24} {format_bytes(row['memory_bytes']):>10} {cuda:>11}  "
                f"{'fits' if row['fits'] else 'no':<4}  longest length {longest(row['max_sequence_length'], grouped=True)}"
            )
    return "\n".join(lines)
