"""Question (2026-11-28, issue #46): why did the Keras/TensorFlow estimate come out under ``fit``'s peak on models
nobody tuned on, when it met the first two ``train_on_batch`` steps?

    TF_ENABLE_ONEDNN_OPTS=0 TF_CPU_ALLOCATOR_USE_BFC=true python -m benchmarks.investigations.keras_fit_gap
    TF_ENABLE_ONEDNN_OPTS=1 python -m benchmarks.investigations.keras_fit_gap --stem zen4-avx512_onednn1

For each of issue #46's three tuning models (:data:`benchmarks.common.keras_blind_cases.TUNE_CASES`), in fresh
processes (no estimator runs; the estimate's figures are in the suite's results):

* ``fit``: the allocator peak of the second epoch of 8 batches above the level before the model, less ``fit``'s
  copy of the data beyond one batch (:func:`benchmarks.common.keras_truth.measure_tensorflow_fit`), 3 processes;
* ``first two steps``: the first two ``train_on_batch`` steps of the fresh model, the suite's truth until this
  day (:func:`benchmarks.common.keras_truth.measure_tensorflow`), 2 processes;
* ``per step``: the allocator's peak of every step of three ``fit`` epochs of 8 batches, one process, absolute
  (the data's copy beyond one batch subtracted), to show how a step's peak moves over an epoch.

Writes ``benchmarks/results/investigations/keras_fit_gap/<stem>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from benchmarks.common.paths import RESULTS

MiB = 2**20


def _per_step(name: str) -> list[int]:
    import keras
    import tensorflow as tf

    from benchmarks.common.keras_blind_cases import FIT_BATCHES, build_fit_case
    from nnmem_callbacks.estimators.keras.tensorflow.step_check import dataset_beyond_one_batch

    model, x, y, batch = build_fit_case(name, FIT_BATCHES)
    info = tf.config.experimental.get_memory_info
    data = dataset_beyond_one_batch([x, y], FIT_BATCHES)
    peaks: list[int] = []

    class EveryStep(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            tf.config.experimental.reset_memory_stats("CPU:0")

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            peaks.append(int(info("CPU:0")["peak"]) - data)

    model.fit(x, y, batch_size=batch, epochs=3, verbose=0, callbacks=[EveryStep()])
    return peaks


def worker(name: str, part: str) -> dict[str, Any]:
    from benchmarks.common.keras_blind_cases import build_any_case
    from benchmarks.common.keras_truth import measure_tensorflow, measure_tensorflow_fit

    if part == "fit":
        return {"fit": measure_tensorflow_fit(name)["measured_bytes"]}
    if part == "steps":
        model, x, y, _ = build_any_case(name)
        return {"steps": measure_tensorflow(model, x, y)["measured_bytes"]}
    return {"per_step": _per_step(name)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stem", default="zen4-avx512_onednn" + os.environ.get("TF_ENABLE_ONEDNN_OPTS", "host"))
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker)), flush=True)
        return 0
    from benchmarks.common.isolated import run_worker
    from benchmarks.common.keras_blind_cases import TUNE_CASES
    from benchmarks.tools.provenance import commit_stamp

    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    lines = [
        f"# Keras/TensorFlow: fit's epoch peak against the first two steps ({args.stem})",
        "",
        f"Question: {__doc__.splitlines()[0][len('Question (2026-11-28, issue #46): ') :]}",
        "",
        f"- commit: {commit_stamp()}; TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'host default')}; "
        f"python {sys.version.split()[0]}",
        "- command: `python -m benchmarks.investigations.keras_fit_gap` (see its docstring)",
        "",
        "| model | batch | fit epoch 2 (3 processes) MiB | first two steps (2 processes) MiB | fit over steps |",
        "|---|---|---|---|---|",
    ]
    per_step_lines = []
    for name, (batch, _, _) in TUNE_CASES.items():

        def run(part: str, name: str = name) -> dict[str, Any]:
            return run_worker("benchmarks.investigations.keras_fit_gap", ["--worker", name, part], env=env)

        fits = [run("fit")["fit"] for _ in range(3)]
        steps = [run("steps")["steps"] for _ in range(2)]
        per_step = run("per_step")["per_step"]
        fit, first = statistics.median(fits), statistics.median(steps)
        lines.append(
            f"| {name} | {batch} | {fit / MiB:.1f} ({', '.join(f'{v / MiB:.1f}' for v in fits)}) | "
            f"{first / MiB:.1f} ({', '.join(f'{v / MiB:.1f}' for v in steps)}) | {100 * (fit - first) / first:+.1f}% |"
        )
        per_step_lines.append(f"- {name}: " + " ".join(f"{v / MiB:.0f}" for v in per_step))
    lines += [
        "",
        "Each step's allocator peak over three `fit` epochs of 8 batches (MiB, absolute, the data beyond one batch "
        "subtracted; one process):",
        "",
        *per_step_lines,
        "",
    ]
    folder = os.path.join(RESULTS, "investigations", "keras_fit_gap")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{args.stem}.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
