"""An estimate never changes the user's run: a seeded ``fit`` after ``estimate_training`` trains as without it.

Each backend runs in its own subprocess (Keras picks its backend at import).
"""

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

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np, keras
    from nnmem_callbacks.keras import estimate_training
    L = keras.layers
    kwargs = json.loads(sys.argv[1])

    def run(estimate, outputs):
        keras.utils.set_random_seed(7)
        inputs = keras.Input((20,))
        hidden = L.Dense(16, activation="relu")(inputs)
        if outputs == 1:
            model = keras.Model(inputs, L.Dense(5)(hidden))
            model.compile("adam", "mse", metrics=["mae"])
            y = np.random.default_rng(1).random((128, 5), dtype=np.float32)
        else:  # two outputs: the compiled loss tracks a Mean per output
            model = keras.Model(inputs, [L.Dense(5)(hidden), L.Dense(3)(hidden)])
            model.compile("adam", ["mse", "mae"])
            y = [np.random.default_rng(1).random((128, n), dtype=np.float32) for n in (5, 3)]
        x = np.random.default_rng(0).random((128, 20), dtype=np.float32)
        metrics = model._compile_metrics  # None without metrics
        flags = lambda: [model._compile_loss.built, bool(metrics and metrics.built), model.optimizer.built]
        before = flags()
        if estimate:
            estimate_training(model, batch_size=32, **kwargs)
        after = flags()
        history = model.fit(x, y, batch_size=32, epochs=2, shuffle=True, verbose=0)
        return before, after, [w.tolist() for w in model.get_weights()], history.history["loss"]

    out = {}
    for outputs in (1, 2):
        out[outputs] = {"without": run(False, outputs), "with": run(True, outputs)}
    print("RESULT " + json.dumps(out))
    """
)


def run_backend(backend: str, tmp_path, **kwargs) -> dict:
    env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        TF_CPP_MIN_LOG_LEVEL="3",
        NNMEM_CACHE_DIR=os.environ.get("NNMEM_CACHE_DIR", str(tmp_path / "cache")),
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(kwargs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(f"subprocess failed ({backend}):\n{done.stderr[-4000:]}")


def check_same_training(result: dict, optimizer_left_built: bool) -> None:
    for outputs, runs in result.items():
        before, after, weights, losses = runs["with"]
        assert before == [False, False, False], outputs
        # the compiled loss and metrics are put back unbuilt (the optimizer too, except on TensorFlow)
        assert after == [False, False, optimizer_left_built], outputs
        assert losses == runs["without"][3], outputs
        assert weights == runs["without"][2], outputs


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_seeded_fit_after_an_estimate_trains_identically(backend, tmp_path):
    pytest.importorskip(backend)
    check_same_training(run_backend(backend, tmp_path), optimizer_left_built=False)


@pytest.mark.slow
def test_seeded_fit_after_an_estimate_trains_identically_tensorflow(tmp_path):
    pytest.importorskip("tensorflow")
    result = run_backend("tensorflow", tmp_path, check_steps=False, probe_kernels=False)
    check_same_training(result, optimizer_left_built=True)
