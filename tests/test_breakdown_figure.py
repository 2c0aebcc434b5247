"""The TensorBoard ``memory/breakdown`` image, looked at: rendered to PNG, the pixels of each bar counted."""

from __future__ import annotations

import io
import os

import pytest

matplotlib = pytest.importorskip("matplotlib")

from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine  # noqa: E402
from nnmem_callbacks.core.units import GiB, MiB  # noqa: E402
from nnmem_callbacks.monitoring.tensorboard import breakdown_figure  # noqa: E402

#: matplotlib's default colour cycle, in the order the bars are drawn
CYCLE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]


def estimate_of(parameters: int, gradients: int, state: int, activations: int, batch: int = 64) -> MemoryEstimate:
    peak = parameters + gradients + state + activations
    return MemoryEstimate(
        peak_bytes=peak,
        breakdown={
            "parameters": parameters,
            "gradients": gradients,
            "optimizer_state": state,
            "activations": activations,
        },
        batch_size=batch,
        phases=(PhaseLine("step1/backward", peak - activations, activations // batch),),
        peak_phase="step1/backward",
    )


def render(figure, name: str):
    """The figure as an RGB array (also saved under NNMEM_FIGURE_DIR, to look at)."""
    import numpy as np
    from matplotlib.image import imread

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    if os.environ.get("NNMEM_FIGURE_DIR"):
        with open(os.path.join(os.environ["NNMEM_FIGURE_DIR"], name), "wb") as handle:
            handle.write(buffer.getvalue())
    buffer.seek(0)
    return (np.asarray(imread(buffer))[..., :3] * 255).round().astype(int)


def bar_widths(image, colours, figure) -> list[int]:
    """Width in pixels of each colour's bar inside the axes: its pixels on the row where it is widest."""
    import numpy as np

    box = figure.axes[0].get_window_extent()
    height = image.shape[0]
    image = image[int(height - box.y1) : int(height - box.y0), int(box.x0) : int(box.x1)]
    widths = []
    for colour in colours:
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
        mask = np.abs(image - rgb).max(axis=-1) <= 6
        widths.append(int(mask.sum(axis=1).max()))
    return widths


def axes_width_px(figure) -> float:
    return figure.axes[0].get_window_extent().width


def with_canvas(figure):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.canvas.draw()
    return figure


def test_a_40_mib_peak_under_a_21_gib_budget_has_visible_bars():
    est = estimate_of(10 * MiB, 10 * MiB, 15 * MiB, 5 * MiB)  # 40 MiB
    figure = with_canvas(breakdown_figure(est, budget_bytes=21 * GiB))
    image = render(figure, "breakdown_40MiB_of_21GiB.png")
    width = axes_width_px(figure)
    widths = bar_widths(image, CYCLE[:4], figure)
    shares = [10 / 40, 10 / 40, 15 / 40, 5 / 40]
    for share, got in zip(shares, widths):
        # each bar is drawn at least at 80% of its share of the axis: the axis is scaled to the peak, not the budget
        assert got >= 0.8 * share * width / 1.08, (widths, width)
    assert sum(widths) >= 0.8 * width
    # the budget is off the axis, so it is written (with the peak's share of it), not drawn as a red line
    title = figure.axes[0].get_title()
    assert "budget 21.00 GiB" in title and "0.19% of it" in title
    assert figure.axes[0].get_xlabel() == "MiB"


def test_a_peak_near_the_budget_shows_bars_and_the_budget_line():
    est = estimate_of(4 * GiB, 4 * GiB, 8 * GiB, 4 * GiB)  # 20 GiB
    figure = with_canvas(breakdown_figure(est, budget_bytes=21 * GiB))
    image = render(figure, "breakdown_20GiB_of_21GiB.png")
    width = axes_width_px(figure)
    widths = bar_widths(image, CYCLE[:4], figure)
    assert all(got >= 0.8 * share * width * 20 / (21 * 1.08) for share, got in zip([0.2, 0.2, 0.4, 0.2], widths)), (
        widths
    )
    # the budget is a dashed black line at 21 GiB: its column is mostly dark inside the axes
    axes = figure.axes[0]
    x, _ = axes.transData.transform((21, 0))
    box = axes.get_window_extent()
    height = image.shape[0]
    column = image[int(height - box.y1) + 2 : int(height - box.y0) - 2, int(round(x)) - 1 : int(round(x)) + 2]
    dark = (column.max(axis=-1) < 80).any(axis=1).mean()
    assert dark >= 0.4, dark
    # and nothing is drawn right of it but the axes frame and the legend
    assert widths[-1] > 0 and x > box.x0 + sum(widths) - 2
    assert figure.axes[0].get_xlabel() == "GiB"


@pytest.mark.parametrize("budget", [21 * GiB, 41 * MiB, None])
def test_the_legend_does_not_cover_the_axis_label_or_the_bars(budget):
    est = estimate_of(10 * MiB, 10 * MiB, 15 * MiB, 5 * MiB)
    figure = with_canvas(breakdown_figure(est, budget_bytes=budget, batch_size=32))
    renderer = figure.canvas.get_renderer()
    axes = figure.axes[0]
    legend = axes.get_legend().get_window_extent(renderer)
    assert not legend.overlaps(axes.xaxis.label.get_window_extent(renderer))
    assert not legend.overlaps(axes.get_window_extent(renderer))
    # everything is inside the image
    assert legend.x1 <= figure.bbox.x1 and legend.y0 >= figure.bbox.y0
