"""``--plot``: the breakdown and the peak against the batch size, drawn with matplotlib."""

from __future__ import annotations

from nnmem_callbacks.cli.compute import FitSummary
from nnmem_callbacks.cli.errors import CliError
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.formatting import breakdown_rows
from nnmem_callbacks.core.units import format_bytes

__all__ = ["budget_labels", "check_plot_path", "plot_estimate"]


def check_plot_path(path: str) -> None:
    """Checks ``--plot FILE`` before any estimate is made: matplotlib is there and can write that format.

    Raises:
        CliError: Without matplotlib, for a folder or a path in a folder that is missing or not writable, or for
            a suffix matplotlib cannot write (naming the ones it can).
    """
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise CliError("--plot needs matplotlib: pip install matplotlib") from None
    import os

    if os.path.isdir(path):
        raise CliError(f"--plot {path} is a folder; name a file in it, e.g. --plot {os.path.join(path, 'memory.png')}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        why = "does not exist" if not os.path.isdir(folder) else "is not writable"
        raise CliError(f"--plot {path}: the folder {folder} {why}; name a file in a folder you can write to")
    supported = FigureCanvasBase.get_supported_filetypes()
    suffix = path.rsplit(".", 1)[-1].lower() if "." in os.path.basename(path) else ""
    if suffix not in supported:
        what = f": format {suffix!r} is not an image format matplotlib writes" if suffix else " has no file suffix"
        raise CliError(f"--plot {path}{what}; use one of {', '.join(sorted(supported))}, e.g. --plot memory.png")


def budget_labels(fit: FitSummary) -> tuple[str, str]:
    """The legend of the budget line and of the largest batch, saying where the margin was kept free.

    A ``--budget`` keeps the margin free below the line drawn; a budget resolved from the device's memory is
    that memory less the margin already, and the largest batch fits under the line itself.
    """
    batch = f"max batch {'unknown' if fit.max_batch_size is None else fit.max_batch_size}"
    if fit.budget_named:
        return f"budget {format_bytes(fit.budget_bytes)}", f"{batch} (keeps {fit.margin:.0%} of the budget free)"
    where = fit.target.where
    return (
        f"budget {format_bytes(fit.budget_bytes)} ({where}'s {fit.target.memory_word} less {fit.margin:.0%})",
        f"{batch} (the largest under the budget line)",
    )


def plot_estimate(estimate: MemoryEstimate, fit: FitSummary, path: str, *, title: str = "") -> str:
    """Draws the breakdown and the peak against the batch size (with the budget) to ``path``.

    Returns:
        The path written.
    """
    try:
        import matplotlib
    except ImportError:
        raise CliError("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nnmem_callbacks.core.units import GiB, MiB

    scale, unit = (GiB, "GiB") if estimate.peak_bytes >= GiB else (MiB, "MiB")  # the breakdown's unit
    from nnmem_callbacks.core.batch_search import MAX_BATCH_SEARCH_LIMIT

    rows = breakdown_rows(estimate)
    capped = (fit.max_batch_size or 0) >= MAX_BATCH_SEARCH_LIMIT  # no batch up to the search's cap exceeds the budget
    shown_max = 0 if capped else (fit.max_batch_size or 0)
    top = max(2 * estimate.batch_size, int(shown_max * 1.25), 8)
    sizes = sorted({max(1, round(top * i / 60)) for i in range(61)})
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, 4.5), layout="constrained")
    left.barh([name for name, _, _ in rows], [value / scale for _, value, _ in rows], color="tab:blue")
    left.invert_yaxis()
    left.set_xlabel(unit)
    left.set_title(f"breakdown at batch {estimate.batch_size} (peak {format_bytes(estimate.peak_bytes)})")
    highest = max(estimate.device_bytes_at(sizes[-1]), fit.budget_bytes or 0)
    right_scale, right_unit = (GiB, "GiB") if highest >= GiB else (MiB, "MiB")
    right.plot(sizes, [estimate.peak_bytes_at(n) / right_scale for n in sizes], label="peak (tensors)")
    if estimate.reserved_bytes is not None or estimate.overhead_bytes:
        right.plot(
            sizes, [estimate.device_bytes_at(n) / right_scale for n in sizes], label="device total", linestyle="--"
        )
    if fit.budget_bytes is not None:
        budget_label, max_label = budget_labels(fit)
        right.axhline(fit.budget_bytes / right_scale, color="tab:red", label=budget_label)
        if capped:
            right.plot(
                [],
                [],
                " ",
                label=f"max batch >= {MAX_BATCH_SEARCH_LIMIT:,} (the search's cap: every batch up to it fits)",
            )
        elif fit.max_batch_size:
            right.axvline(
                fit.max_batch_size,
                color="tab:red",
                linestyle=":",
                label=max_label,
            )
    right.axvline(estimate.batch_size, color="gray", linestyle=":", label=f"batch {estimate.batch_size}")
    right.set_xlabel("batch size")
    right.set_ylabel(right_unit)
    right.set_title("peak against batch size")
    right.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize="small", frameon=False)
    if title:
        figure.suptitle(title)
    try:
        figure.savefig(path, dpi=110)
    except OSError as error:
        raise CliError(f"--plot: cannot write {path!r}: {error.strerror or error}") from None
    finally:
        plt.close(figure)
    return path
