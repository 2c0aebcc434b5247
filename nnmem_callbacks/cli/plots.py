"""``--plot``: the breakdown and the peak against the batch size, drawn with matplotlib."""

from __future__ import annotations

from nnmem_callbacks.cli.compute import FitSummary
from nnmem_callbacks.cli.errors import CliError
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.formatting import breakdown_rows
from nnmem_callbacks.core.units import format_bytes

__all__ = ["plot_estimate"]

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
    rows = breakdown_rows(estimate)
    top = max(2 * estimate.batch_size, int((fit.max_batch_size or 0) * 1.25), 8)
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
        right.plot(sizes, [estimate.device_bytes_at(n) / right_scale for n in sizes], label="device total", linestyle="--")
    if fit.budget_bytes is not None:
        right.axhline(fit.budget_bytes / right_scale, color="tab:red", label=f"budget {format_bytes(fit.budget_bytes)}")
        if fit.max_batch_size:
            right.axvline(fit.max_batch_size, color="tab:red", linestyle=":", label=f"max batch {fit.max_batch_size} (keeps {fit.margin:.0%} of the budget free)")
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


