"""The Keras callback inside a real ``fit``: fit's batch size, what is logged from process RSS, the over-budget text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
from nnmem_callbacks.core.formatting import format_breakdown
from nnmem_callbacks.core.plan import make_plan
from nnmem_callbacks.core.units import format_bytes

pytestmark = pytest.mark.keras

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_over_budget_text_labels_the_upper_bound_and_the_estimate():
    pytest.importorskip("keras")
    from nnmem_callbacks.adapters.keras.planning import describe

    estimate = MemoryEstimate(
        peak_bytes=112_840,
        breakdown={"parameters": 40_000, "activations": 72_840},
        batch_size=64,
        phases=(PhaseLine("step", 40_000, 1_138),),
        variability=PhaseLine("scheduling", 54_500, 0),
    )
    plan = make_plan(estimate, 10_000, margin=0.0)
    first = describe(plan, estimate, []).splitlines()[0]
    table_peak = format_breakdown(estimate).splitlines()[-1].split()[1:3]  # the breakdown's 'peak' row
    assert f"estimate {' '.join(table_peak)}" in first
    assert f"upper bound {format_bytes(estimate.upper_bytes)}" in first and "scheduling" in first
    # without variation there is one figure, as before
    plain = dataclasses_replace(estimate, variability=None)
    assert describe(make_plan(plain, 10_000, margin=0.0), plain, []).startswith(
        f"Predicted peak {format_bytes(plain.peak_bytes)} at batch size 64"
    )


def dataclasses_replace(estimate: MemoryEstimate, **changes) -> MemoryEstimate:
    import dataclasses

    return dataclasses.replace(estimate, **changes)


SCRIPT = textwrap.dedent(
    """
    import json, warnings
    import numpy as np, keras
    from nnmem_callbacks.keras import MemoryBudgetCallback
    L = keras.layers
    rng = np.random.default_rng(0)
    x = rng.random((512, 20), dtype=np.float32)
    y = rng.integers(0, 5, 512).astype("int32")

    def model():
        m = keras.Sequential([keras.Input((20,)), L.Dense(64, activation="relu"), L.Dense(5)])
        m.compile("adam", "sparse_categorical_crossentropy")
        return m

    def fit(callback, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = model().fit(callbacks=[callback], epochs=2, verbose=0, **kwargs)
        said = [str(w.message) for w in caught if "MemoryBudgetCallback" in str(w.message)]
        estimate = callback.estimate
        return {
            "keys": sorted(k for k in history.history if k.startswith("memory_")),
            "warnings": said,
            "estimated_at": estimate.batch_size if estimate is not None else None,
            "rows": callback.measurements,
            "meter": callback._meter.kind,
        }

    out = {
        "mismatch": fit(MemoryBudgetCallback(batch_size=8, budget="2GiB"), x=x, y=y, batch_size=256),
        "no_batch": fit(MemoryBudgetCallback(budget="2GiB"), x=x, y=y, batch_size=64),
        "agrees": fit(MemoryBudgetCallback(batch_size=64, budget="2GiB"), x=x, y=y, batch_size=64),
    }

    def batches():
        while True:
            yield x[:32], y[:32]

    out["few_samples"] = fit(MemoryBudgetCallback(batch_size=16, budget="2GiB"), x=x[:16], y=y[:16], batch_size=64)
    out["generator"] = fit(MemoryBudgetCallback(budget="2GiB"), x=batches(), steps_per_epoch=2)

    class Unsized(keras.utils.PyDataset):  # no batch_size attribute: nothing tells the batch without drawing one
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return x[:32], y[:32]

    out["unsized"] = fit(MemoryBudgetCallback(budget="2GiB"), x=Unsized())
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_callback_in_fit(backend, tmp_path):
    pytest.importorskip("keras")
    pytest.importorskip(backend)
    env = dict(
        os.environ, KERAS_BACKEND=backend, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="", NNMEM_CACHE_DIR=str(tmp_path)
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-4000:]
    out = json.loads(lines[0][len("RESULT ") :])
    # a callback batch size that disagrees with fit's is said once, and fit's is estimated
    mismatch = out["mismatch"]
    assert mismatch["estimated_at"] == 256
    said = [w for w in mismatch["warnings"] if "batch_size=8" in w]
    assert len(said) == 1 and "batch_size=256" in said[0], mismatch["warnings"]
    assert not [w for w in out["agrees"]["warnings"] if "this fit trains with" in w]
    # fewer samples than fit's batch_size: the batch is the samples, and a callback that says so is right
    assert out["few_samples"]["estimated_at"] == 16
    assert not [w for w in out["few_samples"]["warnings"] if "this fit trains with" in w]
    # without one, the callback reads fit's
    assert out["no_batch"]["estimated_at"] == 64
    # on CPU only the RSS rise is measured: said once per process, on every backend, and no relative error logged
    assert mismatch["meter"] == "rss"
    rss_notes = [w for run in out.values() for w in run["warnings"] if "keeps no allocator statistics" in w]
    assert len(rss_notes) == 1 and "no relative error is logged" in rss_notes[0], rss_notes
    for run in ("mismatch", "no_batch", "agrees"):
        assert out[run]["keys"] == [
            "memory_budget_mib",
            "memory_measured_rss_rise_mib",
            "memory_predicted_peak_mib",
            "memory_predicted_rss_rise_mib",
        ], out[run]["keys"]
        assert all("relative_error" not in row for row in out[run]["rows"])
    # a generator's first batch, which Keras drew to read its structure, gives the batch size
    assert out["generator"]["estimated_at"] == 32
    # a PyDataset without a batch_size tells none: no estimate, only the measured figure is logged (as the docstring
    # says)
    unsized = out["unsized"]
    assert unsized["estimated_at"] is None
    assert unsized["keys"] == ["memory_measured_rss_rise_mib"]
    assert any("the batch size is unknown" in w for w in unsized["warnings"])
