"""TensorBoard artefacts for memory estimates: a custom-scalars layout, text and a figure.

The functions take any object with the ``SummaryWriter`` methods
(``add_custom_scalars``, ``add_text``, ``add_figure``), which is what
``TensorBoardLogger.experiment`` returns for both ``torch.utils.tensorboard`` and
``tensorboardX``. matplotlib is imported lazily, with the ``Agg`` backend.

Example:
    >>> layout = custom_scalars_layout("cuda")
    >>> layout["memory"]["peak: predicted vs measured (MiB)"]
    ['Multiline', ['memory/predicted_peak_mib', 'memory/measured_peak_mib']]
    >>> custom_scalars_layout("cpu")["memory"]["process RSS rise above fit start: predicted vs measured (MiB)"][1]
    ['memory/predicted_rss_rise_mib', 'memory/measured_rss_rise_mib']
"""

from __future__ import annotations

from typing import Any

from nnmem_callbacks.estimate import MemoryEstimate
from nnmem_callbacks.units import MiB, format_bytes

#: Metric names logged every epoch (all in MiB, except the relative error).
PREDICTED_PEAK = "memory/predicted_peak_mib"
MEASURED_PEAK = "memory/measured_peak_mib"
RELATIVE_ERROR = "memory/relative_error"
PREDICTED_TENSOR_PEAK = "memory/predicted_tensor_peak_mib"
PREDICTED_RESERVED = "memory/predicted_reserved_mib"
MEASURED_RESERVED = "memory/measured_reserved_mib"
PREDICTED_DEVICE = "memory/predicted_device_mib"
MEASURED_DEVICE = "memory/measured_device_used_mib"
BUDGET = "memory/budget_mib"


def custom_scalars_layout(kind: str = "cpu") -> dict[str, dict[str, list[Any]]]:
    """The custom-scalars layout: predicted and measured series share one chart.

    Args:
        kind: ``"cuda"`` adds charts for the allocator reserve and the device
            total; ``"cpu"`` charts the rise of the process RSS above its
            fit-start level, beside the predicted tensor peak.

    Returns:
        A layout for ``SummaryWriter.add_custom_scalars``.
    """
    if kind == "cpu":  # process RSS: what is compared is its rise above the fit-start level (nnmem_callbacks.monitor)
        from nnmem_callbacks.monitor import RssMeter, metric_names

        names = metric_names(RssMeter()).for_lightning()
        return {
            "memory": {
                "process RSS rise above fit start: predicted vs measured (MiB)": [
                    "Multiline",
                    [names.predicted, names.measured],
                ],
                "relative error of the prediction": ["Multiline", [names.relative_error]],
                "predicted tensor peak (MiB)": ["Multiline", [PREDICTED_TENSOR_PEAK]],
            }
        }
    charts: dict[str, list[Any]] = {
        "peak: predicted vs measured (MiB)": ["Multiline", [PREDICTED_PEAK, MEASURED_PEAK]],
        "relative error of the prediction": ["Multiline", [RELATIVE_ERROR]],
    }
    if kind == "cuda":
        charts["allocator reserve: predicted vs measured (MiB)"] = [
            "Multiline",
            [PREDICTED_RESERVED, MEASURED_RESERVED],
        ]
        charts["device total: predicted vs measured (MiB)"] = ["Multiline", [PREDICTED_DEVICE, MEASURED_DEVICE]]
    return {"memory": charts}


def breakdown_figure(estimate: MemoryEstimate, *, budget_bytes: int | None = None, batch_size: int | None = None) -> Any:
    """A matplotlib figure of the predicted breakdown (one stacked bar) and the budget.

    Args:
        estimate: The estimate to draw.
        budget_bytes: Drawn as a dashed line when given.
        batch_size: The batch size trained with, if the plan changed it; the
            bar then shows the peak predicted at that size.

    Returns:
        A ``matplotlib.figure.Figure`` (Agg canvas; close it after use).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 3.2))
    axes = figure.add_subplot(1, 1, 1)
    left = 0.0
    for name, value in estimate.breakdown.items():
        if not value:
            continue
        axes.barh([0], [value / MiB], left=[left], label=f"{name} ({format_bytes(value)})")
        left += value / MiB
    if batch_size is not None and batch_size != estimate.batch_size:
        peak = estimate.peak_bytes_at(batch_size)
        axes.barh([1], [peak / MiB], color="grey", label=f"peak at batch {batch_size} ({format_bytes(peak)})")
    if budget_bytes is not None:
        axes.axvline(budget_bytes / MiB, color="red", linestyle="--", label=f"budget ({format_bytes(budget_bytes)})")
    axes.set_yticks([])
    axes.set_xlabel("MiB")
    axes.set_title(f"predicted peak {format_bytes(estimate.peak_bytes)} at batch {estimate.batch_size} [{estimate.peak_phase}]")
    axes.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2)
    figure.tight_layout()
    return figure


def write_fit_start(
    writer: Any,
    estimate: MemoryEstimate | None,
    *,
    kind: str,
    text: str,
    budget_bytes: int | None = None,
    batch_size: int | None = None,
    step: int = 0,
) -> list[str]:
    """Writes the layout, the breakdown text and the figure to a SummaryWriter.

    Each artefact is written independently; a writer without one of the
    methods (or a failing matplotlib) skips that artefact.

    Returns:
        The names of the artefacts written (``"layout"``, ``"text"``, ``"figure"``).
    """
    written: list[str] = []
    if hasattr(writer, "add_custom_scalars"):
        writer.add_custom_scalars(custom_scalars_layout(kind))
        written.append("layout")
    if hasattr(writer, "add_text"):
        writer.add_text("memory/estimate", text, global_step=step)
        written.append("text")
    if estimate is not None and hasattr(writer, "add_figure"):
        try:
            figure = breakdown_figure(estimate, budget_bytes=budget_bytes, batch_size=batch_size)
        except ImportError:
            return written
        writer.add_figure("memory/breakdown", figure, global_step=step, close=True)
        written.append("figure")
    return written
