"""Keras quickstart: predict the training memory, then check it while fitting (CPU, synthetic data).

    pip install -e ".[tensorflow]"        # Keras on TensorFlow (or ".[jax]" / ".[torch,keras]")
    KERAS_BACKEND=tensorflow python examples/keras_quickstart.py   # or jax, torch

Once its caches are warm it takes seconds (8 s on a 2-core Zen 4 with TensorFlow). The first run on a machine takes
longer, a few minutes (92 s on that host with oneDNN on, 131 s with it off, 2026-11-29): the TensorFlow estimator
measures its kernels and checks the estimate by real ``fit`` epochs of fresh copies of the model in child processes
(three estimates here, each with its own check), and caches both for later runs.

1. The seed question's MLP (1000 -> 4 x 100 -> 10) at batch 256: estimate, and
   the batch size that fits a budget (``fit_plan``).
2. A small CNN trained with ``MemoryBudgetCallback``: predicted and measured
   peaks land in ``history.history`` (and in TensorBoard with ``log_dir``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

import numpy as np

BACKEND = os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
#: The install line for each Keras backend (the project's extras).
INSTALL = {"tensorflow": '".[tensorflow]"', "jax": '".[jax]"', "torch": '".[torch,keras]"'}

try:
    import keras
except ImportError as error:  # no Keras, or Keras without the backend it was asked for
    print(
        f"This quickstart needs Keras and its {BACKEND!r} backend ({error}). Install them with:\n"
        f"    pip install -e {INSTALL.get(BACKEND, INSTALL['tensorflow'])}\n"
        f"or choose an installed backend: KERAS_BACKEND=jax|torch|tensorflow python examples/keras_quickstart.py",
        file=sys.stderr,
    )
    sys.exit(2)

from nnmem_callbacks import format_bytes, format_summary  # noqa: E402
from nnmem_callbacks.keras import MemoryBudgetCallback, estimate_training, fit_plan  # noqa: E402

L = keras.layers


def seed_mlp() -> keras.Model:
    model = keras.Sequential(
        [keras.Input((1000,))] + [L.Dense(100, activation="relu") for _ in range(4)] + [L.Dense(10)]
    )
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def small_cnn() -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            L.Conv2D(32, 3, activation="relu"),
            L.MaxPooling2D(),
            L.Conv2D(64, 3, activation="relu"),
            L.GlobalAveragePooling2D(),
            L.Dense(10),
        ]
    )
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main() -> None:
    print(f"Keras backend: {keras.backend.backend()}")
    # 1. the seed MLP, before training
    model = seed_mlp()
    estimate = estimate_training(model, batch_size=256)
    print(format_summary(estimate))
    # planning budgets with the upper bound (what an unlucky run of this step may take) and keeps a 5% margin free.
    # upper_bytes_at(n) follows the line fitted through the estimated batches; the batch the plan picks is then
    # estimated directly, and that direct estimate decides. It can be above the line (TensorFlow schedules another
    # batch differently), so the batch chosen for a budget 1/0.85 of batch 64's bound may be well below 64.
    budget = int(estimate.upper_bytes_at(64) / 0.85)
    plan = fit_plan(model, budget=budget, batch_size=256)
    print(f"\nTo fit {format_bytes(budget)}: fits={plan.fits}, largest batch {plan.max_batch_size}; use\n{plan.code}")
    if plan.verification is not None:
        print(f"checked: {plan.verification.text}\n")

    # 2. a small CNN, checked every epoch
    rng = np.random.default_rng(0)
    x = rng.random((512, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, 512).astype("int32")
    log_dir = tempfile.mkdtemp(prefix="nnmem_keras_")
    callback = MemoryBudgetCallback(batch_size=64, budget="2GiB", log_dir=log_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        history = small_cnn().fit(x, y, batch_size=64, epochs=2, callbacks=[callback], verbose=0)
    for warning in caught:
        if "cannot read" in str(warning.message):  # the meter fell back to process RSS: say why
            print(f"note: {warning.message}\n")
    names = callback.metric_names
    if "rss_rise" in names.measured:
        compared = (
            "the rise of the process RSS above its level at fit start (predicted: tensor peak minus what was resident)"
        )
    else:
        compared = "the allocator's peak"
    print(f"Compared each epoch: {compared}")
    logged = history.history
    for epoch, (tensor_peak, predicted, measured) in enumerate(
        zip(logged[names.predicted_peak], logged[names.predicted], logged[names.measured])
    ):
        print(
            f"epoch {epoch}: tensor peak predicted {tensor_peak:.1f} MiB; compared figure predicted {predicted:.1f} MiB, "
            f"measured {measured:.1f} MiB ({names.measured})"
        )
    print(f"TensorBoard: tensorboard --logdir {log_dir}")


if __name__ == "__main__":
    main()
