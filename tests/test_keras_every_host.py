"""The Keras callback on TensorFlow in every allocator mode a host can give, each in a fresh process.

TensorFlow's CPU allocator keeps statistics only with oneDNN on (its default on
AVX-512-class CPUs) or with ``TF_CPU_ALLOCATOR_USE_BFC=true``. Without them the
callback measures process RSS, warns once, and still logs every key every epoch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")
pytestmark = pytest.mark.keras

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, os, sys, warnings
import numpy as np
import keras
from nnmem_callbacks.keras import MemoryBudgetCallback
from nnmem_callbacks.monitoring.meters import TensorFlowMeter

rng = np.random.default_rng(0)
# ~9 MiB of parameters, gradients and Adam slots: a 0.3 MiB model's epoch peaks moved by a quarter of its size between
# epochs (2.0, 2.0, 1.5 MiB in one CI run, against 2.4 predicted), which is noise, not what this test checks
x, y = rng.random((256, 512), dtype=np.float32), rng.integers(0, 10, 256).astype("int32")
model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
callback = MemoryBudgetCallback(batch_size=64, budget="8GiB", log_dir=os.environ["LOG_DIR"])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    history = model.fit(x, y, batch_size=64, epochs=3, callbacks=[callback], verbose=0)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
accumulator = EventAccumulator(os.environ["LOG_DIR"])
accumulator.Reload()
names = callback.metric_names
print("RESULT " + json.dumps({
    "stats_unavailable": TensorFlowMeter.unavailable("CPU:0"),
    "meter": callback._meter.kind,
    "names": [names.predicted_peak, names.measured, names.predicted, names.relative_error, names.budget],
    "history": {k: [float(v) for v in values] for k, values in history.history.items()},
    "warnings": [str(w.message) for w in caught if "MemoryBudgetCallback" in str(w.message)],
    "scalars": sorted(accumulator.Tags()["scalars"]),
    "measurements": callback.measurements,
}))
"""


def run_fit(tmp_path: Path, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CPU_ALLOCATOR_USE_BFC", "TF_ENABLE_ONEDNN_OPTS")}
    environ.update(env, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3", LOG_DIR=str(tmp_path / "tb"))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=environ, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(f"subprocess failed:\n{done.stderr[-4000:]}")


def test_without_allocator_statistics_the_callback_measures_rss_and_says_so(tmp_path):
    result = run_fit(tmp_path, TF_ENABLE_ONEDNN_OPTS="0")
    if result["stats_unavailable"] is None:  # pragma: no cover - a TensorFlow build with stats by default
        pytest.skip("this TensorFlow keeps CPU allocator statistics even with oneDNN off")
    assert result["meter"] == "rss"
    fallback = [w for w in result["warnings"] if "cannot read TensorFlow's allocator peak" in w]
    assert len(fallback) == 1, result["warnings"]
    assert "TF_CPU_ALLOCATOR_USE_BFC=true" in fallback[0] and "memory_measured_rss_rise_mib" in fallback[0]
    assert "no relative error is logged" in fallback[0]
    for name in result["names"][:3] + result["names"][4:]:
        assert len(result["history"][name]) == 3, (name, result["history"].keys())
    # RSS also holds code, caches and freed memory: no relative error is logged from it
    assert result["names"][3] not in result["history"] and "relative_error" not in result["measurements"][-1]
    assert "rss" in result["names"][1] and all(v >= 0 for v in result["history"][result["names"][1]])
    assert {"memory/measured_rss_rise_mib", "memory/predicted_rss_rise_mib", "memory/predicted_peak_mib"} <= set(
        result["scalars"]
    )
    # the rise is compared with a rise: not a GiB-sized RSS against a MiB-sized tensor peak
    row = result["measurements"][-1]
    assert row["predicted_bytes"] < 512 * 2**20 and row["measured_bytes"] < 1024 * 2**20


@pytest.mark.parametrize(
    "mode", [{"TF_ENABLE_ONEDNN_OPTS": "1"}, {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPU_ALLOCATOR_USE_BFC": "true"}]
)
def test_with_allocator_statistics_the_callback_reads_the_allocator(tmp_path, mode):
    result = run_fit(tmp_path, **mode)
    assert result["stats_unavailable"] is None
    assert result["meter"] == "tensorflow"
    assert not [w for w in result["warnings"] if "cannot read" in w or "failed" in w], result["warnings"]
    assert result["names"][1] == "memory_measured_peak_mib"
    for name in result["names"]:
        assert len(result["history"][name]) == 3, name
    error = result["history"]["memory_relative_error"][-1]
    assert abs(error) < 0.5, result["measurements"]
    assert {"memory/measured_peak_mib", "memory/predicted_peak_mib", "memory/relative_error"} <= set(result["scalars"])
