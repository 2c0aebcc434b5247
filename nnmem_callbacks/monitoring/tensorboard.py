"""TensorBoard output of both callbacks: a custom-scalars layout, text, a figure, and a framework-free event writer.

* :func:`write_fit_start` (the Lightning callback) writes the layout, the
  breakdown figure and the fit-start text to any object with the
  ``SummaryWriter`` methods (``add_custom_scalars``, ``add_text``,
  ``add_figure``), which is what ``TensorBoardLogger.experiment`` returns for
  both ``torch.utils.tensorboard`` and ``tensorboardX``. matplotlib is imported
  lazily, with the ``Agg`` backend.
* :class:`EventWriter` (the Keras callback) writes scalars and text to an event
  file with the ``tensorboard`` package alone: no TensorFlow, no torch (its
  docstring says why).

Example:
    >>> layout = custom_scalars_layout("cuda")
    >>> layout["memory"]["peak: predicted vs measured (MiB)"]
    ['Multiline', ['memory/predicted_peak_mib', 'memory/measured_peak_mib']]
    >>> custom_scalars_layout("cpu")["memory"]["process RSS rise above fit start: predicted vs measured (MiB)"][1]
    ['memory/predicted_rss_rise_mib', 'memory/measured_rss_rise_mib']
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.formatting import format_markdown_breakdown, format_summary
from nnmem_callbacks.core.plan import Plan, describe_plan
from nnmem_callbacks.core.units import GiB, KiB, MiB, format_bytes

__all__ = [
    "breakdown_figure",
    "BUDGET",
    "BUDGET_ON_AXIS_RATIO",
    "custom_scalars_layout",
    "EventWriter",
    "MEASURED_DEVICE",
    "MEASURED_PEAK",
    "MEASURED_RESERVED",
    "PREDICTED_DEVICE",
    "PREDICTED_PEAK",
    "PREDICTED_RESERVED",
    "PREDICTED_TENSOR_PEAK",
    "RELATIVE_ERROR",
    "write_fit_start",
]

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
            fit-start level beside the peak (on CPU the measured peak is the
            tensor peak of one sampled step per epoch).

    Returns:
        A layout for ``SummaryWriter.add_custom_scalars``.
    """
    error_chart = "relative error of the prediction: (predicted - measured) / measured"
    charts: dict[str, list[Any]] = {
        "peak: predicted vs measured (MiB)": ["Multiline", [PREDICTED_PEAK, MEASURED_PEAK]],
        error_chart: ["Multiline", [RELATIVE_ERROR]],
    }
    if kind == "cpu":  # the sampled step's tensor peak, and process RSS beside it (nnmem_callbacks.monitoring)
        from nnmem_callbacks.monitoring.meters import RssMeter, metric_names

        names = metric_names(RssMeter()).for_lightning()
        charts["process RSS rise above fit start: predicted vs measured (MiB)"] = [
            "Multiline",
            [names.predicted, names.measured],
        ]  # no relative error: the rise also holds allocator caches and freed memory kept resident
    if kind == "cuda":
        charts["allocator reserve: predicted vs measured (MiB)"] = [
            "Multiline",
            [PREDICTED_RESERVED, MEASURED_RESERVED],
        ]
        charts["device total: predicted vs measured (MiB)"] = ["Multiline", [PREDICTED_DEVICE, MEASURED_DEVICE]]
    return {"memory": charts}


#: The budget is drawn on the bar's axis only when it is at most this many times the largest bar;
#: beyond, a 40 MiB bar on a 21 GiB axis would be a few pixels wide, so the budget is written instead.
BUDGET_ON_AXIS_RATIO = 2.0


def _axis_unit(largest: float) -> tuple[float, str]:
    for factor, unit in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if largest >= factor:
            return factor, unit
    return 1, "B"


def breakdown_figure(
    estimate: MemoryEstimate, *, budget_bytes: int | None = None, batch_size: int | None = None
) -> Any:
    """A matplotlib figure of the predicted breakdown (one stacked bar) and the budget.

    The axis is scaled to the bars, not to the budget: when the budget is more
    than :data:`BUDGET_ON_AXIS_RATIO` times the peak, it is written in the
    title (with the peak's share of it) instead of being drawn as a line far to
    the right. The legend sits right of the axes, clear of the axis label.

    Args:
        estimate: The estimate to draw.
        budget_bytes: Drawn as a dashed line (or written, see above) when given.
        batch_size: The batch size trained with, if the plan changed it; a
            second bar then shows the peak predicted at that size.

    Returns:
        A ``matplotlib.figure.Figure`` (Agg canvas; close it after use).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    rows = [(name, value) for name, value in estimate.breakdown.items() if value]
    other_peak = None
    if batch_size is not None and batch_size != estimate.batch_size:
        other_peak = estimate.peak_bytes_at(batch_size)
    largest = max(estimate.peak_bytes, other_peak or 0, 1)
    budget_on_axis = budget_bytes is not None and budget_bytes <= BUDGET_ON_AXIS_RATIO * largest
    axis_max = max(largest, budget_bytes if budget_on_axis else 0) * 1.08
    scale, unit = _axis_unit(axis_max)

    figure = Figure(figsize=(8.0, 3.0), layout="constrained")
    axes = figure.add_subplot(1, 1, 1)
    left = 0.0
    for name, value in rows:
        axes.barh([0], [value / scale], left=[left], height=0.6, label=f"{name} ({format_bytes(value)})")
        left += value / scale
    labels = [f"batch {estimate.batch_size}"]
    if other_peak is not None:
        axes.barh(
            [1],
            [other_peak / scale],
            height=0.6,
            color="grey",
            label=f"peak at batch {batch_size} ({format_bytes(other_peak)})",
        )
        labels.append(f"batch {batch_size}")
    axes.set_yticks(range(len(labels)), labels)
    axes.invert_yaxis()
    axes.set_xlim(0, axis_max / scale)
    title = f"predicted peak {format_bytes(estimate.peak_bytes)} at batch {estimate.batch_size} [{estimate.peak_phase}]"
    if budget_bytes is not None:
        if budget_on_axis:
            axes.axvline(
                budget_bytes / scale,
                color="black",
                linestyle="--",
                linewidth=2,
                label=f"budget ({format_bytes(budget_bytes)})",
            )
        else:
            title += (
                f"\nbudget {format_bytes(budget_bytes)} (off the axis: the peak is "
                f"{estimate.peak_bytes / budget_bytes:.2%} of it)"
            )
    axes.set_xlabel(unit)
    axes.set_title(title, fontsize="medium")
    axes.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return figure


def write_fit_start(
    writer: Any,
    estimate: MemoryEstimate,
    plan: Plan,
    *,
    kind: str,
    summary: str,
    batch_size: int | None = None,
    step: int = 0,
) -> list[str]:
    """Writes the custom-scalars layout, the breakdown figure and the fit-start text to a SummaryWriter.

    The text is ``summary`` (without its ``MemoryBudgetCallback:`` prefix), the
    breakdown as a Markdown table and as plain text, and, when the plan does not
    fit, the plan's description. Each artefact is written independently; a
    writer without one of the methods (or a missing matplotlib) skips that
    artefact.

    Args:
        writer: A ``SummaryWriter`` (``TensorBoardLogger.experiment``).
        estimate: The estimate made at fit start.
        plan: The plan decided on it (its budget is drawn on the figure).
        kind: The training device's kind (see :func:`custom_scalars_layout`).
        summary: The callback's one-line summary.
        batch_size: The batch size trained with (see :func:`breakdown_figure`).
        step: The global step to write at.

    Returns:
        The names of the artefacts written (``"layout"``, ``"figure"``, ``"text"``).
    """
    written: list[str] = []
    if hasattr(writer, "add_custom_scalars"):
        writer.add_custom_scalars(custom_scalars_layout(kind))
        written.append("layout")
    if hasattr(writer, "add_figure"):
        try:
            figure = breakdown_figure(estimate, budget_bytes=plan.budget_bytes, batch_size=batch_size)
        except ImportError:  # no matplotlib: no figure
            figure = None
        if figure is not None:
            writer.add_figure("memory/breakdown", figure, global_step=step, close=True)
            written.append("figure")
    if hasattr(writer, "add_text"):
        parts = [
            summary.replace("MemoryBudgetCallback: ", ""),
            format_markdown_breakdown(estimate),
            "```\n" + format_summary(estimate) + "\n```",
        ]
        if not plan.fits:
            parts.append("```\n" + describe_plan(plan, estimate) + "\n```")
        writer.add_text("memory/estimate", "\n\n".join(parts), global_step=step)
        written.append("text")
    return written


class EventWriter:
    """Scalars and text as TensorBoard event files, with the ``tensorboard`` package only (no TensorFlow).

    The library writers do not fit a backend-neutral callback: tensorboard's
    ``EventFileWriter`` (behind ``tensorboard.summary.Writer``, which writes no
    text either, and behind ``torch.utils.tensorboard``, which needs torch)
    imports TensorFlow through ``tensorboard.compat`` whenever it is installed,
    which under the JAX and torch backends costs seconds and inflates the
    process RSS the Keras callback measures. tensorboard's ``RecordWriter`` and
    protos import no framework, so the file is written with them here.

    Args:
        log_dir: The folder of the event file (made when missing).

    Example:
        >>> import os, tempfile
        >>> writer = EventWriter(tempfile.mkdtemp())
        >>> writer.scalar("memory/budget_mib", 2048.0, step=0)
        >>> writer.text("memory/estimate", "predicted peak 1.00 GiB", step=0)
        >>> writer.close()
        >>> os.path.getsize(writer.path) > 0
        True
    """

    def __init__(self, log_dir: str) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.summary.writer.record_writer import RecordWriter

        os.makedirs(log_dir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.nnmem"
        self.path = os.path.join(log_dir, name)
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._writer = RecordWriter(self._file)
        self._writer.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())

    def _write(self, summary: Any, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        self._writer.write(Event(wall_time=time.time(), step=int(step), summary=summary).SerializeToString())

    def scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._write(Summary(value=[Summary.Value(tag=tag, simple_value=float(value))]), step)

    def text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(dtype=7, string_val=[text.encode("utf-8")], tensor_shape=TensorShapeProto())  # DT_STRING
        self._write(Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)]), step)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
