"""A new user's walk through the Keras front door (2026-11-30): the defects it found, each pinned.

The runs use the JAX backend in a subprocess (Keras picks its backend at import; JAX estimates take seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_jax(tmp_path, body: str) -> dict:
    """Runs ``body`` as a script file under Keras on JAX; it prints one JSON line, returned."""
    pytest.importorskip("keras")
    pytest.importorskip("jax")
    script = tmp_path / "user_script.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, math, warnings
            import numpy as np, keras
            from nnmem_callbacks.keras import MemoryBudgetCallback, estimate_training, fit_plan
            L = keras.layers
            """
        )
        + textwrap.dedent(body)
    )
    env = dict(
        os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, NNMEM_CACHE_DIR=str(tmp_path / "cache")
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1])


def test_the_callbacks_warnings_point_at_the_users_fit_line(tmp_path):
    """They pointed at keras/src/callbacks/callback_list.py (the hook's caller), not at the user's code."""
    out = run_jax(
        tmp_path,
        """
        model = keras.Sequential([keras.Input((16,)), L.Dense(32), L.Dense(4)])
        model.compile("adam", loss="sparse_categorical_crossentropy")
        x, y = np.zeros((64, 16), "float32"), np.zeros(64, "int32")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[MemoryBudgetCallback(budget="1KiB")])
        ours = [w for w in caught if "MemoryBudgetCallback" in str(w.message)]
        print(json.dumps({"files": sorted({w.filename for w in ours}), "count": len(ours)}))
        """,
    )
    assert out["count"] >= 2  # the CPU's RSS note and the over-budget warning
    assert out["files"] == [str(tmp_path / "user_script.py")]


def _line(batch: int, fixed: int, per_sample: int, parameters: int) -> MemoryEstimate:
    return MemoryEstimate(
        peak_bytes=fixed + per_sample * batch,
        breakdown={"parameters": parameters, "activations": per_sample * batch},
        batch_size=batch,
        phases=(PhaseLine("step", fixed, per_sample),),
        peak_phase="step",
    )


def test_the_accumulate_suggestion_keeps_the_effective_batch_and_fits_with_its_accumulators():
    """It suggested 22 x 3 (effective 66) for a batch of 64 whose largest fit was 22, and did so even when the
    accumulators did not fit ("saves -347.23 KiB")."""
    from nnmem_callbacks.adapters.keras.planning import keras_suggestions

    estimate = _line(64, fixed=10_000, per_sample=1_000, parameters=1_000)
    usable = estimate.upper_bytes_at(22) + 1
    budget = int(usable / 0.95) + 2
    (accumulate,) = [s for s in keras_suggestions(estimate, budget) if s.kind == "accumulate"]
    assert "gradient_accumulation_steps=4" in accumulate.text and "batch_size=16" in accumulate.text
    assert "keeps the effective batch of 64" in accumulate.text
    assert estimate.upper_bytes_at(16) + 1_000 <= int(budget * 0.95) and accumulate.saving_bytes > 0
    # accumulators as large as the room the batch leaves: no accumulated run fits, none is suggested
    heavy = _line(64, fixed=10_000, per_sample=1_000, parameters=40_000)
    kinds = [s.kind for s in keras_suggestions(heavy, budget)]
    assert "batch_size" in kinds and "accumulate" not in kinds


def test_fit_plans_accumulated_run_fits_with_the_accumulators(tmp_path):
    """fit_plan chose 32 x 8 for a budget that batch 128 just fits; the run its code describes (the optimizer with
    gradient_accumulation_steps=8, whose accumulators are the parameters' size) was estimated at 42 MiB against
    24 MiB usable. Now each batch is checked as the plan would train it."""
    out = run_jax(
        tmp_path,
        """
        def build(steps=None):
            model = keras.Sequential([keras.Input((512,)), L.Dense(1024, activation="relu"),
                                      L.Dense(1024, activation="relu"), L.Dense(10)])
            optimizer = keras.optimizers.Adam(gradient_accumulation_steps=steps) if steps else keras.optimizers.Adam()
            model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            return model

        model = build()
        estimate = estimate_training(model, 256)
        budget = math.ceil((estimate.upper_bytes_at(128) + 1) / 0.95) + 1
        plan = fit_plan(model, budget=budget, batch_size=256)
        steps = plan.gradient_accumulation_steps
        as_run = estimate_training(build(steps if steps > 1 else None), plan.batch_size, check_scaling=False)
        print(json.dumps({"usable": int(budget * 0.95), "as_run": as_run.upper_bytes, "code": plan.code,
                          "batch": plan.batch_size, "steps": steps, "max": plan.max_batch_size,
                          "model_steps": model.optimizer.gradient_accumulation_steps,
                          "kinds": [s.kind for s in plan.suggestions]}))
        """,
    )
    assert out["batch"] >= 1 and out["max"] >= 1
    assert out["as_run"] <= out["usable"], out
    assert out["model_steps"] is None  # the user's model and optimizer are not changed
    if out["steps"] == 1 and out["batch"] < 256:
        assert "the effective batch becomes" in out["code"]
    # accumulation is decided by the direct estimates (plan.code); the lines' accumulate suggestion, which they
    # refuted, is not offered beside it
    assert "accumulate" not in out["kinds"]


def test_the_callback_reads_the_batch_size_of_datasets_generators_and_py_datasets(tmp_path):
    """``tf.data`` batched without ``drop_remainder`` (the common case), a generator and a ``PyDataset`` with a
    ``batch_size``: the callback said "the batch size is unknown ... the value given to fit" and only measured."""
    pytest.importorskip("tensorflow")
    out = run_jax(
        tmp_path,
        """
        import tensorflow as tf
        model = keras.Sequential([keras.Input((16,)), L.Dense(32), L.Dense(4)])
        model.compile("adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        X, Y = np.random.rand(200, 16).astype("float32"), np.random.randint(0, 4, 200)

        def generator():
            for i in range(0, 200, 20):
                yield X[i : i + 20], Y[i : i + 20]

        class Batches(keras.utils.PyDataset):
            def __init__(self, batch_size):
                super().__init__()
                self.batch_size = batch_size

            def __len__(self):
                return 200 // self.batch_size

            def __getitem__(self, i):
                return X[i * self.batch_size : (i + 1) * self.batch_size], Y[i * self.batch_size : (i + 1) * self.batch_size]

        cases = {
            "tf.data": dict(x=tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(200).batch(40).prefetch(2)),
            "generator": dict(x=generator(), steps_per_epoch=10),
            "PyDataset": dict(x=Batches(50)),
            "unbatched again": dict(x=tf.data.Dataset.from_tensor_slices((X, Y)).batch(8).unbatch().batch(25)),
        }
        out = {}
        for name, data in cases.items():
            callback = MemoryBudgetCallback()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.fit(**data, epochs=1, verbose=0, callbacks=[callback])
            out[name] = [callback._train_batch_size, callback.estimate and callback.estimate.batch_size]
        print(json.dumps(out))
        """,
    )
    assert out == {"tf.data": [40, 40], "generator": [20, 20], "PyDataset": [50, 50], "unbatched again": [25, 25]}


def test_the_callback_estimates_a_subclassed_model_from_fits_data(tmp_path):
    """A subclassed model has no symbolic inputs: the callback failed with "pass an example batch x=... to
    estimate_training" (an argument of another function) and only measured, though fit's data hold the shapes."""
    pytest.importorskip("tensorflow")
    out = run_jax(
        tmp_path,
        """
        import tensorflow as tf

        class Net(keras.Model):
            def __init__(self):
                super().__init__()
                self.hidden, self.head = L.Dense(64), L.Dense(4)

            def call(self, x):
                return self.head(self.hidden(x))

        X, Y = np.random.rand(128, 16).astype("float32"), np.random.randint(0, 4, 128).astype("int32")

        class Batches(keras.utils.PyDataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                return X[i * 32 : (i + 1) * 32], Y[i * 32 : (i + 1) * 32]

        out = {}
        for name, data in {
            "arrays": dict(x=X, y=Y, batch_size=32),
            "tf.data": dict(x=tf.data.Dataset.from_tensor_slices((X, Y)).batch(32)),
            "PyDataset": dict(x=Batches()),
        }.items():
            model = Net()
            model.compile("adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            callback = MemoryBudgetCallback(batch_size=32)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.fit(**data, epochs=1, verbose=0, callbacks=[callback])
            direct = estimate_training(model, 32, X[:32], Y[:32])
            out[name] = [callback.estimate and callback.estimate.peak_bytes, direct.peak_bytes, callback.failure]
            out[name + " kept"] = callback._adapter is not None  # fit's data are not held after the hook
        print(json.dumps(out))
        """,
    )
    for name in ("arrays", "tf.data"):
        assert out[name][0] == out[name][1] and out[name][2] is None, (name, out[name])
        assert out[name + " kept"] is False
    # a PyDataset gives no shapes without drawing a batch: the message names the callback's own arguments
    assert out["PyDataset"][0] is None and "MemoryBudgetCallback(x=..., y=...)" in out["PyDataset"][2]


def test_a_fit_plan_prints_on_one_line_and_its_code_agrees_with_its_checks():
    """``print(fit_plan(...))`` printed the whole estimate (its phases, breakdown and notes); and where direct
    estimates found no batch, ``plan.code`` said "no batch size fits 2.08 MiB: batch size 1 is predicted to take up
    to 1.90 MiB", a figure under the budget (the lines' figure, which the direct estimates had refuted)."""
    from nnmem_callbacks.adapters.keras.planning import FitPlan
    from nnmem_callbacks.core.units import format_bytes
    from nnmem_callbacks.core.verification import Verification, VerificationCheck

    estimate = _line(64, fixed=1_900_000, per_sample=5_000, parameters=500_000)
    budget = 2_180_000
    checks = (VerificationCheck(16, 1_980_000, 2_150_000, False), VerificationCheck(8, 1_940_000, 2_130_000, False))
    verification = Verification(int(budget * 0.95), "peak", 16, 0, checks, verified=False)
    plan = FitPlan(
        64, 1, fits=False, max_batch_size=0, budget_bytes=budget, estimate=estimate, verification=verification
    )
    assert "\n" not in repr(plan) and "PhaseLine" not in repr(plan) and "batch_size=64" in repr(plan)
    assert estimate.upper_bytes_at(1) < budget * 0.95  # what the old text quoted
    assert format_bytes(estimate.upper_bytes_at(1)) not in plan.code
    assert f"{format_bytes(2_150_000)} at batch size 16" in plan.code and "batch size 8" in plan.code


def test_fit_plan_does_not_suggest_mixed_precision_to_a_mixed_precision_model(tmp_path):
    """Under ``mixed_float16`` fit_plan's suggestions said "keras.mixed_precision.set_global_policy('mixed_bfloat16')
    ... save about 803 KiB" (the callback, given the same estimate, did not)."""
    out = run_jax(
        tmp_path,
        """
        keras.mixed_precision.set_global_policy("mixed_float16")
        model = keras.Sequential([keras.Input((64,)), L.Dense(256, activation="relu"), L.Dense(10)])
        model.compile("adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        estimate = estimate_training(model, 256)
        plan = fit_plan(model, budget=estimate.upper_bytes_at(64), batch_size=256)
        print(json.dumps({"precision": estimate.precision, "kinds": [s.kind for s in plan.suggestions]}))
        """,
    )
    assert out["precision"] == "16-mixed" and out["kinds"], out
    assert "mixed_precision" not in out["kinds"]


def test_fit_plans_code_says_when_its_batch_was_not_verified():
    """After its budget of direct estimates, all over the budget, the plan keeps the lines' batch unverified;
    ``plan.code`` gave it as any other."""
    from nnmem_callbacks.adapters.keras.planning import FitPlan
    from nnmem_callbacks.core.verification import Verification, VerificationCheck

    estimate = _line(256, fixed=390_000, per_sample=7_000, parameters=120_000)
    checks = tuple(VerificationCheck(n, 400_000 + n * 7_000, 1_120_000, False) for n in (64, 32, 16, 8))
    verification = Verification(1_090_000, "peak", 64, 4, checks, verified=False)
    plan = FitPlan(
        4, 64, fits=False, max_batch_size=4, budget_bytes=1_150_000, estimate=estimate, verification=verification
    )
    assert "batch_size=4" in plan.code and "not verified at batch size 4" in plan.code
    verified = Verification(1_090_000, "peak", 64, 8, checks[:3] + (VerificationCheck(8, 0, 900_000, True),), True)
    assert "not verified" not in FitPlan(8, 32, False, 8, 1_150_000, estimate, verification=verified).code
