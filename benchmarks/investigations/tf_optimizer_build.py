"""Question (2026-11-27): does it matter when the optimizer's slots are made? A Keras model's first two TF steps, both ways.

    TF_ENABLE_ONEDNN_OPTS=1 python -m benchmarks.investigations.tf_optimizer_build gru_text --batches 16,32 --repeats 3

Keras's TensorFlow ``fit`` (and ``train_on_batch``) builds an unbuilt optimizer
when it traces the first step: the slot variables are made then, after the model's
variables and the batch. ``compile_from_config`` (and the estimate, which builds
the optimizer as ``fit``'s symbolic build does) makes them before. Each process
here builds a :mod:`benchmarks.suites.keras_accuracy` case, optionally builds the
optimizer (``built before``) or leaves it to the first step (``built by the
first step``, as the benchmark's truth and a fresh ``fit`` do), and measures the
first two steps as the truth does (allocator-counted state plus the allocator's
peak over the steps), then each of four steps alone (peak above the bytes in use
before the first). ``--inter-op 1`` adds runs with one inter-op thread, which
takes the executor's races out. ``--after-estimate`` adds processes that run
``estimate_training`` first (which builds the optimizer), as the Keras
callback's run does.

Found on 2026-11-27 for the GRU text model with oneDNN on
(``benchmarks/results/investigations/tf_optimizer_build/gru_text_zen3-avx2_onednn1.md``):
with the slots built before, every process peaked at the replay's figure; with
them built by the first step, higher. The step check's copies
(:func:`nnmem_callbacks.estimators.keras.tensorflow.step_check.compiled_copy`) now start as the
user's model does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

__all__ = ["PATHS", "worker", "to_markdown", "main"]

PATHS = ("built before", "built by the first step", "built by the estimate")


def worker(case: str, batch: int, path: str, inter_op: int) -> dict[str, Any]:
    """One fresh process: the case at ``batch``, its optimizer built as ``path`` (one of :data:`PATHS`) says."""
    import tensorflow as tf

    if inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    from benchmarks.common import keras_cases
    from benchmarks.common.keras_truth import state_bytes

    keras_cases.CASES[case] = (batch, keras_cases.CASES[case][1])  # this worker process only
    model, x, y, _ = keras_cases.build_case(case)
    if path == PATHS[0]:
        model.optimizer.build(model.trainable_variables)
    elif path == PATHS[2]:
        # what a run after the estimate in the same process finds (the Keras callback's run)
        from nnmem_callbacks.keras import estimate_training

        estimate_training(model, batch, x=x, y=y)
    info = tf.config.experimental.get_memory_info
    xt, yt = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))
    state = state_bytes(model, [x, y], counted=True)
    tf.config.experimental.reset_memory_stats("CPU:0")
    base = info("CPU:0")["current"]
    step_peaks = []
    for _ in range(4):
        tf.config.experimental.reset_memory_stats("CPU:0")
        model.train_on_batch(xt, yt)
        step_peaks.append(int(info("CPU:0")["peak"] - base))
    return {
        "case": case,
        "batch_size": batch,
        "path": path,
        "inter_op": inter_op or "default",
        "first_two_steps_bytes": int(state + max(step_peaks[:2])),
        "step_peaks_above_start": step_peaks,
    }


def to_markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """Each setting's processes: the first two steps as the benchmark's truth counts them, and each step alone."""
    mib = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
    out = ["# When the optimizer's slots are made: a model's first two TensorFlow steps", ""]
    out += [f"- {key}: {value}" for key, value in meta.items()]
    out += [
        "",
        "| batch | optimizer | inter-op threads | first two steps MiB (per process) | median | each of 4 steps above the start MiB (per process) |",
        "|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(
            (row["batch_size"], row["inter_op"] != "default", row["path"], str(row["inter_op"])), []
        ).append(row)
    for (batch, _, path, inter_op), group in sorted(groups.items()):
        firsts = [r["first_two_steps_bytes"] for r in group]
        steps = "; ".join(" ".join(mib(p) for p in r["step_peaks_above_start"]) for r in group)
        out.append(
            f"| {batch} | {path} | {inter_op} | {', '.join(mib(f) for f in firsts)} | {mib(statistics.median(firsts))} | {steps} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common.isolated import run_worker
    from benchmarks.common.keras_cases import CASES
    from benchmarks.common.keras_env import host_fingerprint, mode_environment
    from benchmarks.common.paths import result_dir
    from benchmarks.tools.provenance import commit_stamp, write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", nargs="?", help=f"a benchmarks.suites.keras_accuracy case: {', '.join(CASES)}")
    parser.add_argument("--batches", default="", help="comma-separated batch sizes (default: the case's)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per setting")
    parser.add_argument("--inter-op", type=int, default=0, help="also run with this many inter-op threads (0: no)")
    parser.add_argument("--host-tag", default="", help="a name for the host in the output file")
    parser.add_argument("--out", default=str(result_dir("investigations") / "tf_optimizer_build"))
    parser.add_argument(
        "--after-estimate",
        action="store_true",
        help="also run processes that estimate first (estimate_training, as the Keras callback does)",
    )
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        case, batch, path, inter_op = args.worker
        print(json.dumps(worker(case, int(batch), PATHS[int(path)], int(inter_op))), flush=True)
        return 0
    if args.case not in CASES:
        parser.error(f"unknown case {args.case!r}; valid: {', '.join(CASES)}")
    if args.repeats < 1:
        parser.error(f"--repeats must be 1 or more, got {args.repeats}")
    try:
        batches = [int(b) for b in args.batches.split(",") if b] or [CASES[args.case][0]]
    except ValueError:
        parser.error(f"--batches takes comma-separated integers, got {args.batches!r}")
    if any(b < 1 for b in batches):
        parser.error(f"batch sizes must be positive, got {batches}")
    import tensorflow as tf

    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "")
    if onednn not in ("0", "1"):
        parser.error("set TF_ENABLE_ONEDNN_OPTS=0 or 1: the oneDNN mode decides the allocator this measures")
    env = {**os.environ, **mode_environment(onednn)}
    rows = []
    for batch in batches:
        for path in range(3 if args.after_estimate else 2):
            for inter_op in (0, args.inter_op) if args.inter_op and path < 2 else (0,):
                for _ in range(args.repeats):
                    row = run_worker(
                        "benchmarks.investigations.tf_optimizer_build",
                        ["--worker", args.case, str(batch), str(path), str(inter_op)],
                        env=env,
                    )
                    print(json.dumps(row), flush=True)
                    if "error_text" not in row:
                        rows.append(row)
    meta = {
        **host_fingerprint(),
        "tensorflow": tf.__version__,
        "TF_ENABLE_ONEDNN_OPTS": onednn,
        "allocator": "bfc (TF_CPU_ALLOCATOR_USE_BFC=true)"
        if onednn == "0"
        else "oneDNN's (counts allocations of 256 KiB and more)",
        "repeats": args.repeats,
        "python": sys.version.split()[0],
        "commit": commit_stamp("benchmarks", "nnmem_callbacks"),
        "command": f"TF_ENABLE_ONEDNN_OPTS={onednn} python -m benchmarks.investigations.tf_optimizer_build {args.case} --batches "
        f"{','.join(map(str, batches))} --repeats {args.repeats}"
        + (f" --inter-op {args.inter_op}" if args.inter_op else "")
        + (" --after-estimate" if args.after_estimate else ""),
    }
    tag = f"_{args.host_tag}" if args.host_tag else ""
    stem = write_result(
        args.out, f"{args.case}{tag}_onednn{onednn}", {"meta": meta, "rows": rows}, to_markdown(rows, meta)
    )
    print(stem)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
