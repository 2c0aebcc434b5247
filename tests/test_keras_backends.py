"""Keras on JAX and on torch: each in its own subprocess (Keras picks its backend at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("keras")
pytestmark = pytest.mark.keras

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMMON = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np, keras
    from nnmem_callbacks.keras import MemoryBudgetCallback, estimate_training
    L = keras.layers
    out = {}

    def mlp(hidden=100):
        model = keras.Sequential([keras.Input((1000,))] + [L.Dense(hidden, activation="relu") for _ in range(4)] + [L.Dense(10)])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        return model

    rng = np.random.default_rng(0)
    x = rng.random((256, 1000), dtype=np.float32)
    y = rng.integers(0, 10, 256).astype("int32")
    """
)

CALLBACK = textwrap.dedent(
    """
    def callback_checks(log_dir):
        callback = MemoryBudgetCallback(batch_size=64, budget="8GiB", log_dir=log_dir)
        history = mlp().fit(x, y, batch_size=64, epochs=2, callbacks=[callback], verbose=0)
        names = callback.metric_names
        out["meter"] = callback._meter.kind
        out["names"] = [names.predicted_peak, names.measured, names.predicted, names.relative_error, names.budget]
        out["logged"] = sorted(k for k in history.history if k.startswith("memory_"))
        out["epochs_logged"] = len(history.history[names.measured])
        callback.batch_size = 32
        mlp(50).fit(x, y, batch_size=32, epochs=1, callbacks=[callback], verbose=0)
        out["reused_batch"] = callback.estimate.batch_size
        out["reused_measurements"] = len(callback.measurements)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tight = MemoryBudgetCallback(batch_size=64, budget=callback.estimate.static_bytes)
            mlp().fit(x, y, batch_size=64, epochs=1, callbacks=[tight], verbose=0)
        out["warnings"] = sum("MemoryBudgetCallback" in str(w.message) for w in caught)
        out["tensorflow_imported"] = "tensorflow" in sys.modules
    """
)


def run_backend(backend: str, body: str, tmp_path, timeout: int = 300) -> dict:
    code = COMMON + CALLBACK + textwrap.dedent(body) + "\nprint('RESULT ' + json.dumps(out))\n"
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", LOG_DIR=str(tmp_path / "tb"))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(f"subprocess failed ({backend}):\n{done.stderr[-4000:]}")


def read_scalars(log_dir: str) -> set:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(log_dir)
    accumulator.Reload()
    return set(accumulator.Tags()["scalars"])


def _check_callback(result: dict, tmp_path) -> None:
    # the names say what was measured: the backend's allocator, or (on CPU) the rise of process RSS
    if result["meter"] == "rss":
        # RSS holds more than tensors: its rise is logged beside the prediction, but no relative error from it
        assert result["logged"] == sorted(set(result["names"]) - {result["names"][3]})
        assert "rss" in result["names"][1]
    else:
        assert result["logged"] == sorted(set(result["names"]))
        assert result["names"][1] == "memory_measured_peak_mib"
    assert result["epochs_logged"] == 2
    assert result["reused_batch"] == 32 and result["reused_measurements"] == 1
    assert result["warnings"] == 1
    assert not result["tensorflow_imported"]
    scalars = {name.replace("memory_", "memory/", 1) for name in result["logged"]}
    assert scalars <= read_scalars(str(tmp_path / "tb"))


def test_jax_backend(tmp_path):
    pytest.importorskip("jax")
    result = run_backend(
        "jax",
        """
        import os
        from nnmem_callbacks.estimators.keras.jax_xla import compile_train_step
        from nnmem_callbacks.estimators.keras.common import input_specs
        model = mlp(1000)
        est = estimate_training(model, batch_size=256)
        out["method"] = est.method
        out["peak"] = est.peak_bytes
        out["sum"] = sum(est.breakdown.values())
        out["static"] = est.static_bytes
        out["grows"] = est.peak_bytes_at(512) > est.peak_bytes
        out["heavy_imports"] = [m for m in ("torch", "tensorflow") if m in sys.modules]
        out["left_unbuilt"] = not model.optimizer.built and not model._compile_loss.built  # the estimate puts it back
        xs, ys, _ = input_specs(model)
        from nnmem_callbacks.estimators.keras.estimator import build_like_fit
        build_like_fit(model, 256, xs, ys)  # as fit does before its first step
        analysis = compile_train_step(model, 256, xs, ys).memory_analysis()
        out["xla"] = int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes
                         - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)
        from benchmarks.common.keras_truth import measure_jax
        out["rss_truth"] = measure_jax(model, x, y)["measured_bytes"]
        callback_checks(os.environ["LOG_DIR"])
        """,
        tmp_path,
    )
    assert result["method"] == "xla-memory-analysis"
    assert result["peak"] == result["sum"] == result["xla"]
    assert result["static"] >= 3 * (1000 * 1000 * 3 + 1000 * 1000 + 10 * 1000) * 4 * 0.99
    assert result["grows"]
    assert result["heavy_imports"] == []  # estimating on JAX imports neither torch nor tensorflow
    assert result["left_unbuilt"]
    # the truth on CPU is process RSS (no allocator statistics): a loose check
    assert abs(result["peak"] - result["rss_truth"]) / result["rss_truth"] < 0.35, result
    _check_callback(result, tmp_path)


def test_jax_estimate_predicts_what_a_gpu_allocator_reports(tmp_path):
    """On a GPU (faked: the compile runs on CPU), the estimate says what peak_bytes_in_use will count."""
    pytest.importorskip("jax")
    result = run_backend(
        "jax",
        """
        import os, jax
        from nnmem_callbacks.monitoring import meters as monitor

        class FakeGpu:
            platform, id = "gpu", 0
            def memory_stats(self):
                return {"bytes_limit": 16 << 30, "bytes_in_use": 0, "peak_bytes_in_use": 0}

        real_devices = jax.devices
        for mode in ("false", "true"):
            os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = mode
            jax.devices = lambda *args: [FakeGpu()]
            try:
                est = estimate_training(mlp(1000), batch_size=256)
            finally:
                jax.devices = real_devices
            out[mode] = {
                "mode": est.extra["xla_allocator"], "device": est.device, "peak": est.peak_bytes,
                "allocator": est.extra["xla_allocator_peak_bytes"], "upper": est.upper_bytes,
                "temp": est.extra["temp_bytes"], "noted": any("PREALLOCATE=false" in n for n in est.notes),
                "batch": est.breakdown["inputs"],
            }
            callback = MemoryBudgetCallback(batch_size=256)
            callback.estimate, callback._train_batch_size = est, 256
            callback._meter = monitor.JaxMeter(FakeGpu(), sample_interval_s=None)
            callback._names = monitor.metric_names(callback._meter)
            out[mode]["compared"] = callback._predicted_comparable()
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices("cpu")[:1]))
            try:  # a distribution feeds batches without fit's one-batch look-ahead
                out[mode]["compared_distributed"] = callback._predicted_comparable()
            finally:
                keras.distribution.set_distribution(None)
            callback._meter.start()
            callback.on_epoch_begin(0)
            logs = {}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                callback.on_epoch_end(0, logs)  # the process peak never rose: the reading is a floor, said so
            out[mode]["floor_warned"] = sum("a floor of the training peak" in str(w.message) for w in caught)
            out[mode]["logged"] = sorted(k for k in logs if k.startswith("memory_"))
        """,
        tmp_path,
    )
    growth, pooled = result["false"], result["true"]
    assert growth["mode"] == "bfc-growth" and pooled["mode"] == "bfc-preallocated"
    assert growth["device"] == "gpu:0"
    # on demand: the allocator charges whole chunks, never less than the buffers, less than twice them
    assert growth["peak"] <= growth["allocator"] < 2 * growth["peak"]
    assert growth["noted"] and not pooled["noted"]
    # planning allows for the temporary buffer being charged twice; a preallocated pool only rounds
    assert growth["upper"] == growth["peak"] + growth["temp"]
    assert pooled["upper"] == pooled["peak"]
    assert pooled["peak"] <= pooled["allocator"] <= pooled["peak"] * 1.001
    # the callback compares the meter's reading with what the allocator will count, plus the batch that
    # fit moves to the device one step ahead (not under a distribution, which feeds batches without it)
    assert growth["batch"] == 256 * (1000 + 1) * 4
    assert growth["compared"] == growth["allocator"] + growth["batch"]
    assert pooled["compared"] == pooled["allocator"] + pooled["batch"]
    assert growth["compared_distributed"] == growth["allocator"]
    # a reading that is only a floor is logged under the same keys, and said once
    assert growth["floor_warned"] == 1
    assert "memory_measured_peak_mib" in growth["logged"] and "memory_relative_error" in growth["logged"]


def test_torch_backend(tmp_path):
    pytest.importorskip("torch")
    result = run_backend(
        "torch",
        """
        import os
        model = mlp(1000)
        est = estimate_training(model, batch_size=256)
        out["method"] = est.method
        out["peak"] = est.peak_bytes
        out["optimizer_state"] = est.breakdown["optimizer_state"]
        out["keras_state"] = est.extra["keras_optimizer_state_bytes"]
        out["torch_imported"] = "torch" in sys.modules
        from benchmarks.common.keras_truth import measure_torch
        out["truth"] = measure_torch(model, x, y)["measured_bytes"]
        sgd = mlp()
        sgd.compile(optimizer=keras.optimizers.RMSprop(), loss="sparse_categorical_crossentropy")
        other = estimate_training(sgd, batch_size=64)
        out["rmsprop_method"] = other.method
        out["rmsprop_notes"] = list(other.notes)
        jit = mlp(1000)
        jit.compile(optimizer="adam", loss="sparse_categorical_crossentropy", jit_compile=True)
        compiled = estimate_training(jit, batch_size=256, check_steps=False)
        out["jit_method"] = compiled.method
        out["jit_notes"] = list(compiled.notes)
        callback_checks(os.environ["LOG_DIR"])
        """,
        tmp_path,
    )
    assert result["method"] == "torch-trace"
    assert result["optimizer_state"] == result["keras_state"]
    assert abs(result["peak"] - result["truth"]) / result["truth"] < 0.15, result
    assert result["rmsprop_method"] == "torch-trace"
    assert any("RMSprop update ran on fake tensors" in note for note in result["rmsprop_notes"])
    assert result["jit_method"] == "torch-trace+inductor"  # Keras torch.compile's its step: so does the estimate
    assert any("jit_compile=True" in note and "errs high" in note for note in result["jit_notes"])
    _check_callback(result, tmp_path)
