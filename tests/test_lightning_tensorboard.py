"""The callback's TensorBoard output, read back from the event files."""

from __future__ import annotations

import glob
import math
import os
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")
pytest.importorskip("tensorboard")

sys.path.insert(0, os.path.dirname(__file__))
from _lightning_models import MLP, DataModule, trainer_kwargs  # noqa: E402

from nnmem_callbacks.lightning import MemoryBudgetCallback  # noqa: E402
from nnmem_callbacks.monitoring.tensorboard import custom_scalars_layout  # noqa: E402

pytestmark = pytest.mark.lightning


def test_tensorboard_series_layout_text_and_figure(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2

    logger = pl.loggers.TensorBoardLogger(str(tmp_path), name="tb")
    callback = MemoryBudgetCallback(budget="1TiB")
    trainer = pl.Trainer(
        **trainer_kwargs(tmp_path, logger=logger, max_epochs=3, limit_train_batches=4), callbacks=[callback]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(MLP(), datamodule=DataModule(batch_size=32))
    (run,) = glob.glob(os.path.join(str(tmp_path), "tb", "version_*"))
    events = EventAccumulator(run, size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    events.Reload()
    tags = events.Tags()

    # on CPU the measured peak is the tensor peak of a sampled step, compared with the predicted peak
    predicted_peak = events.Scalars("memory/predicted_peak_mib")
    measured_peak = events.Scalars("memory/measured_peak_mib")
    peak_errors = events.Scalars("memory/relative_error")
    assert len(predicted_peak) == len(measured_peak) == len(peak_errors) == 3  # one per epoch
    assert [s.step for s in measured_peak] == [4, 8, 12]
    for p, m, e in zip(predicted_peak, measured_peak, peak_errors):
        assert p.value == pytest.approx(callback.estimate.peak_bytes / 2**20, rel=1e-5)
        assert e.value == pytest.approx((p.value - m.value) / m.value, rel=1e-3, abs=1e-6)
        assert abs(e.value) < 0.1
    # the rise of the process RSS above fit start is logged beside it, under its own names, with no relative
    # error: it also holds allocator caches and freed memory kept resident (as the Keras callback logs it)
    predicted = events.Scalars("memory/predicted_rss_rise_mib")
    measured = events.Scalars("memory/measured_rss_rise_mib")
    assert len(predicted) == len(measured) == 3
    assert "memory/rss_rise_relative_error" not in tags["scalars"]
    expected = callback._predicted_comparable() / 2**20
    for p, m in zip(predicted, measured):
        assert p.value == pytest.approx(expected, rel=1e-5)
        # the rise is clipped at 0: a tiny MLP's epoch can stay within pages already resident at fit start (seen on
        # an Intel host, 2026-11-30), so only its sign is certain
        assert m.value >= 0 and math.isfinite(m.value)
    tensor_peak = events.Scalars("memory/predicted_tensor_peak_mib")[0].value
    assert tensor_peak == pytest.approx(callback.estimate.peak_bytes / 2**20, rel=1e-5)

    # the custom-scalars layout puts predicted and measured on one chart
    config = events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0]
    layout = layout_pb2.Layout.FromString(config)
    charts = {chart.title: list(chart.multiline.tag) for category in layout.category for chart in category.chart}
    assert ["memory/predicted_peak_mib", "memory/measured_peak_mib"] in charts.values()
    assert ["memory/predicted_rss_rise_mib", "memory/measured_rss_rise_mib"] in charts.values()
    charted = {tag for series in charts.values() for tag in series}
    assert charted <= set(tags["scalars"]), charted - set(tags["scalars"])

    text = events.Tensors("memory/estimate/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| parameters |" in text and "predicted peak" in text
    assert "memory/breakdown" in tags["images"]


def test_layout_for_cuda_has_reserve_and_device_charts():
    charts = custom_scalars_layout("cuda")["memory"]
    tags = [tag for _, (_, series) in charts.items() for tag in series]
    assert "memory/measured_reserved_mib" in tags and "memory/predicted_device_mib" in tags
