"""Keras accuracy benchmark: predicted vs measured peak memory per backend, each case in its own process.

    python -m benchmarks.suites.keras_accuracy --backend tensorflow|jax|torch [--cases mlp,lstm] [--repeats 3] [--host-tag HOST]
    python -m benchmarks.suites.keras_accuracy --backend tensorflow --onednn 0   # and --onednn 1: both TF CPU kernel paths
    python -m benchmarks.suites.keras_accuracy --backend tensorflow --onednn 1 --host-tag zen4-avx512   # keras_tensorflow_cpu/zen4-avx512_onednn1
    python -m benchmarks.suites.keras_accuracy --backend jax --device gpu --jobs 4 --host-tag h100_growth   # keras_jax_gpu/h100_growth

A run writes ``benchmarks/results/keras_<backend>_<device>/<host-tag>[_onednn<0|1>].{md,json}``
(``<host-tag>`` defaults to the device, ``cpu`` or ``gpu``). A host measured in sets
(``--cases``, a ``--host-tag`` per set) is joined into one table by
:mod:`benchmarks.tools.merge_results`.

On TensorFlow, ``--onednn 0|1`` sets ``TF_ENABLE_ONEDNN_OPTS`` in every worker
(default: the host's own default, which is on only on AVX-512-class CPUs) and
names the result ``..._onednn{0,1}``. With oneDNN off the
workers set ``TF_CPU_ALLOCATOR_USE_BFC=true``, without which TensorFlow's CPU
allocator keeps no statistics to measure.

Cases come in two groups: the zoo the estimator was developed on, and models from
outside it (``keras.applications`` architectures and layer-built models that no
rule was written for), reported separately.

Each case runs ``--repeats`` times, each time in a fresh process; the measured truth is
the median of those runs (the allocator's peak over the same steps varies with the
executor's thread interleaving), and the Markdown shows the range. On TensorFlow the
estimate runs once, in its own process with an empty probe cache (a cold estimate:
kernel probes and the step check of :mod:`nnmem_callbacks.estimators.keras.tensorflow.step_check` run),
and the truth comes from ``--repeats`` other processes that never ran the estimator.

Truth per backend (CPU):

* **tensorflow**: ``tf.config.experimental.get_memory_info('CPU:0')['peak']`` over
  real ``train_on_batch`` steps, after ``reset_memory_stats`` with the model and
  optimizer built and the batch created. TensorFlow's CPU allocator reports only
  allocations of at least 256 KiB, so the comparable prediction is the
  estimator's ``extra["tf_allocator_peak_bytes"]`` (the same replay, counting
  what the allocator counts). Measured = allocator-counted bytes of the
  variables, optimizer slots and batch (exact, known before the steps) + (peak -
  current) over the steps. Two windows: the first two steps of the fresh model
  (the package's definition of the peak) and steps 3-4 (steady state; the first
  step also keeps copies of some variable buffers alive, see the notes column).
* **jax**: ``memory_stats()`` is ``None`` on CPU. The truth is the process's peak
  RSS (``VmHWM`` after ``clear_refs``) over two steps after one warm-up step
  (compilation excluded), minus the RSS before, plus the bytes of the state and
  the batch: an RSS figure, which includes allocator slack and page rounding.
* **torch**: the torch profiler's allocation events over two real
  ``train_on_batch`` steps (as in ``benchmarks/common/groundtruth.py``) plus the bytes
  live before (variables, optimizer slots, batch).

Truth per backend (GPU, ``--device gpu``; every case as one estimating process and
``--repeats`` measuring processes, since the estimator's compilation and probes would
leave autotuning peaks and library workspaces in a process it measured):

* **jax**: ``peak_bytes_in_use`` of the device over two real ``train_on_batch``
  steps (state, batch and everything XLA allocates). It cannot be reset, so each
  measuring process first compiles the step as the estimator does, with XLA's
  autotuning results loaded from the estimating process
  (``--xla_gpu_per_fusion_autotune_cache_dir``), and the column "peak is the
  step's" says whether the peak rose above that compilation's in every run.
* **torch**: ``torch.cuda.max_memory_allocated`` over two real steps, the model's
  variables and the batch already on the GPU (library workspaces that the first
  steps allocate through the caching allocator included).

The rule of thumb beside ours: ``4 B x (3 x params + 2 x activations x batch)``
with activations = the sum of the layers' output elements per sample.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from benchmarks.common.keras_blind_cases import (
    BLIND_CASES,
    JUDGED2_CASES,
    JUDGED3_CASES,
    JUDGED_CASES,
    TUNE_CASES,
    build_any_case,
    describe,
)
from benchmarks.common.keras_cases import CASES, rule_of_thumb
from benchmarks.common.keras_env import gpu_environment, host_fingerprint, mode_environment
from benchmarks.common.keras_results import summarize, to_markdown
from benchmarks.common.keras_truth import device_name, measure_jax, measure_tensorflow, measure_torch, measure_worker
from benchmarks.common.paths import RESULTS
from benchmarks.tools.provenance import commit_stamp, write_result

__all__ = ["BACKENDS", "worker", "run_isolated", "run_repeated", "main"]

BACKENDS = ("tensorflow", "jax", "torch")


def relative_error(predicted: int, measured: int) -> float | None:
    """``(predicted - measured) / measured``; ``None`` when nothing was measured.

    With oneDNN on, TensorFlow's allocator counts only allocations of 256 KiB and more: a model whose every tensor
    is smaller reads a peak of 0 (a bidirectional GRU of 18k parameters at batch 32), where no relative error exists.
    Such a row stays in the table, outside the summary's medians.

    Example:
        >>> relative_error(110, 100), relative_error(5, 0)
        (0.1, None)
    """
    return (predicted - measured) / measured if measured else None


def worker(name: str, part: str = "both", truth: str = "fit") -> dict[str, Any]:
    """One case in this process: ``part`` is ``"both"``, ``"estimate"`` or ``"measure"`` (TensorFlow)."""
    import keras

    from nnmem_callbacks.keras import estimate_training

    if part == "measure":
        return measure_worker(name, truth)
    backend = keras.backend.backend()
    model, x, y, batch = build_any_case(name)
    started = time.perf_counter()
    estimate = estimate_training(model, batch, x=x, y=y)
    seconds = time.perf_counter() - started
    row: dict[str, Any] = {
        "case": name,
        "backend": backend,
        "batch_size": batch,
        "description": describe(name),
        "method": estimate.method,
        "estimate_s": round(seconds, 2),
        "predicted_peak_bytes": int(estimate.peak_bytes),
        "peak_phase": estimate.peak_phase,
        "notes": list(estimate.notes),
    }
    row["rule_of_thumb_bytes"] = rule_of_thumb(model, batch)
    if backend == "tensorflow":
        row["predicted_bytes"] = int(estimate.extra.get("tf_allocator_peak_bytes", estimate.peak_bytes))
        row["predicted_upper_bytes"] = int(estimate.extra.get("tf_allocator_peak_upper_bytes", row["predicted_bytes"]))
        from nnmem_callbacks.allocators.tensorflow_cpu import tf_cpu_allocator

        row["allocator"] = tf_cpu_allocator()
        for key in (
            "step_check_batch_size",
            "step_check_runs",
            "step_check_runs_missing",
            "step_check_offset_bytes",
            "step_check_difference_bytes",
            "step_check_optimizer_built",
            "replay_peak_bytes",
        ):
            if key in estimate.extra:
                row[key] = estimate.extra[key]
        if part == "estimate":
            return row
        row.update(measure_tensorflow(model, x, y))
    else:
        row["predicted_bytes"] = int(estimate.peak_bytes)
        row["device"] = device_name()
        # what the estimate holds beyond the peak: XLA's buffer sizes, CUDA workspaces and reserve
        row["estimate_extra"] = {
            k: v for k, v in estimate.extra.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        row["estimate_breakdown"] = {str(getattr(k, "value", k)): int(v) for k, v in estimate.breakdown.items()}
        if part == "estimate":
            return row
        if backend == "jax":
            row.update(measure_jax(model, x, y))
        else:
            row.update(measure_torch(model, x, y))
    measured = row["measured_bytes"]
    row["error"] = relative_error(row["predicted_bytes"], measured)
    row["rule_error"] = relative_error(row["rule_of_thumb_bytes"], measured)
    if "measured_steady_bytes" in row:
        row["error_steady"] = relative_error(row["predicted_bytes"], row["measured_steady_bytes"])
        row["rule_error_steady"] = relative_error(row["rule_of_thumb_bytes"], row["measured_steady_bytes"])
    return row


def run_isolated(
    name: str,
    backend: str,
    timeout: int = 900,
    onednn: str | None = None,
    part: str = "both",
    device: str = "cpu",
    autotune_cache: str | None = None,
    truth: str = "fit",
) -> dict[str, Any]:
    """Runs one case in a fresh process (TensorFlow's allocator keeps memory across models).

    An estimating process gets an empty probe cache of its own (``NNMEM_CACHE_DIR``), so every
    estimate is a cold one: kernel probes and step checks run, nothing comes from an earlier run.
    """
    import tempfile

    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    env.update(mode_environment(onednn))
    if device == "gpu":
        env.update(gpu_environment(backend, autotune_cache, part))
    if part != "measure":
        env["NNMEM_CACHE_DIR"] = tempfile.mkdtemp(prefix="nnmem-bench-cache-")
    from benchmarks.common.isolated import run_worker

    started = time.perf_counter()
    row = run_worker(
        "benchmarks.suites.keras_accuracy",
        ["--worker", name, "--part", part, "--truth", truth],
        env=env,
        timeout=timeout,
    )
    if "error_text" in row:
        return {"case": name, "backend": backend, **row}
    row["wall_s"] = round(time.perf_counter() - started, 1)
    return row


def run_repeated(
    name: str, backend: str, repeats: int, onednn: str | None = None, device: str = "cpu", truth: str = "fit"
) -> dict[str, Any]:
    """Runs a case ``repeats`` times (fresh processes); the truth is the median measurement.

    On TensorFlow the allocator's peak over the same first two steps varies from run to
    run (the executor's thread interleaving decides which chunks are free when): the
    benchmark LSTM measured 7.3 to 12.0 MiB over six runs. The median of a few runs is
    the figure compared; the runs are kept in ``measured_runs``.
    """
    if backend == "tensorflow" or device == "gpu":
        # one estimate (cold cache); the truth from processes that never ran the estimator (on a GPU its
        # probes and compilation would leave workspaces and an autotuning peak in the measured process)
        import tempfile

        cache = tempfile.mkdtemp(prefix=f"nnmem-xla-autotune-{name}-") if device == "gpu" else None
        kwargs = {"onednn": onednn, "device": device, "autotune_cache": cache, "truth": truth}
        estimate = run_isolated(name, backend, part="estimate", **kwargs)
        if "error_text" in estimate:
            return estimate
        rows = [run_isolated(name, backend, part="measure", **kwargs) for _ in range(max(repeats, 1))]
        good = [{**estimate, **r} for r in rows if "error_text" not in r]
        rows.append(estimate)
    else:
        rows = [run_isolated(name, backend, onednn=onednn) for _ in range(max(repeats, 1))]
        good = [r for r in rows if "error_text" not in r]
    if not good:
        return rows[0]
    row = dict(good[0])
    for key in ("measured_bytes", "measured_steady_bytes"):
        values = [r[key] for r in good if key in r]
        if values:
            row[key.replace("_bytes", "_runs")] = values
            row[key] = int(statistics.median(values))
    if any("exact_peak" in r for r in good):
        # JAX on a GPU: every run's peak must have risen above its compilation's to be the step's
        row["exact_peak"] = all(r.get("exact_peak", False) for r in good)
    measured = row["measured_bytes"]
    row["error"] = relative_error(row["predicted_bytes"], measured)
    row["rule_error"] = relative_error(row["rule_of_thumb_bytes"], measured)
    if "predicted_upper_bytes" in row:
        row["upper_covers_runs"] = row["predicted_upper_bytes"] >= max(row["measured_runs"])
    if "measured_steady_bytes" in row:
        steady = row["measured_steady_bytes"]
        row["error_steady"] = relative_error(row["predicted_bytes"], steady)
        row["rule_error_steady"] = relative_error(row["rule_of_thumb_bytes"], steady)
    row["wall_s"] = round(sum(r.get("wall_s", 0) for r in rows), 1)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS, default="tensorflow")
    parser.add_argument("--cases", help="comma-separated case names (default: those of --set)")
    parser.add_argument(
        "--set",
        choices=("developed", "tune", "judged", "judged2", "judged3"),
        default="developed",
        help="the 23 models the estimator was developed on, or issue #46's tuning set or first, second or third judged set "
        "(benchmarks.common.keras_blind_cases)",
    )
    parser.add_argument(
        "--truth",
        choices=("fit", "steps"),
        default="fit",
        help="TensorFlow: fit = the peak of a warm fit epoch less the data beyond one batch (what the callback "
        "compares with); steps = the first two train_on_batch steps of a fresh model",
    )
    parser.add_argument(
        "--out", default=str(RESULTS), help="the results folder (the run goes to OUT/keras_<backend>_<device>/)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--part", default="both", choices=("both", "estimate", "measure"), help=argparse.SUPPRESS)
    parser.add_argument("--render", action="store_true", help="rewrite the Markdown from the committed JSON")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per case; the truth is their median")
    parser.add_argument(
        "--onednn", choices=("0", "1"), help="TensorFlow: run every worker with TF_ENABLE_ONEDNN_OPTS=0 or 1"
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="gpu: JAX and torch train on the GPU; the truth is the device allocator's peak, measured in processes "
        "that never ran the estimator (results keras_<backend>_gpu/...)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="cases run at once (GPU only: each process has its own allocator statistics; on a CPU, concurrent "
        "cases would disturb each other's measurements)",
    )
    parser.add_argument("--note", help="a line for the results header (the run's conditions)")
    parser.add_argument(
        "--host-tag",
        default="",
        help="the result's file name: the host (zen4-avx512, h100_growth, ...; default: the device), so that results "
        "of another host sit beside the committed ones instead of replacing them",
    )
    args = parser.parse_args(argv)
    if args.device == "gpu" and args.backend == "tensorflow":
        parser.error("--device gpu measures JAX and torch; TensorFlow's GPU path is not benchmarked (use --device cpu)")
    if args.jobs < 1 or (args.jobs > 1 and args.device != "gpu"):
        parser.error(f"--jobs must be 1 on a CPU (concurrent cases disturb each other's peaks), got {args.jobs}")
    suffix = f"_onednn{args.onednn}" if args.onednn is not None and args.backend == "tensorflow" else ""
    out_dir = os.path.join(args.out, f"keras_{args.backend}_{args.device}")
    name = f"{args.host_tag or args.device}{suffix}"
    if args.render:
        stem = os.path.join(out_dir, name)
        with open(stem + ".json", encoding="utf-8") as handle:
            saved = json.load(handle)
        with open(stem + ".md", "w", encoding="utf-8") as handle:
            rows = saved["rows"]
            handle.write(
                to_markdown(args.backend, rows, summarize([r for r in rows if "error_text" not in r]), saved["meta"])
            )
        return 0
    if args.worker:
        print(json.dumps(worker(args.worker, args.part, args.truth)), flush=True)
        return 0
    started = time.perf_counter()
    sets = {
        "developed": CASES,
        "tune": TUNE_CASES,
        "judged": JUDGED_CASES,
        "judged2": JUDGED2_CASES,
        "judged3": JUDGED3_CASES,
    }
    if args.cases is None:
        args.cases = ",".join(sets[args.set])
    names = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(names) - set(CASES) - set(BLIND_CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; valid cases: {', '.join([*CASES, *BLIND_CASES])}")
    onednn = args.onednn if args.backend == "tensorflow" else None

    def run_case(name: str) -> dict[str, Any]:
        row = run_repeated(name, args.backend, args.repeats, onednn=onednn, device=args.device, truth=args.truth)
        print(json.dumps(row), flush=True)  # notes included: a run that dies later can be rebuilt from its log
        return row

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(run_case, names))  # the table keeps the order of --cases
    summary = summarize([r for r in rows if "error_text" not in r])
    os.environ.setdefault("KERAS_BACKEND", args.backend)  # Keras' default backend may not be installed here
    import keras  # noqa: F401 - versions for the record

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "keras": __import__("keras").__version__,
        "backend": args.backend,
        "python": sys.version.split()[0],
        **host_fingerprint(),
        "cases": args.cases,
        "repeats": args.repeats,
        "elapsed_s": round(time.perf_counter() - started, 1),
        "commit": commit_stamp(),
    }
    if args.device == "gpu":
        meta["device"] = next((r["device"] for r in rows if r.get("device")), "gpu (no case ran)")
        meta["jobs"] = args.jobs
        meta["XLA_PYTHON_CLIENT_PREALLOCATE"] = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        if os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"):
            meta["XLA_PYTHON_CLIENT_MEM_FRACTION"] = os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"]
    if args.note:
        meta["note"] = args.note
    if args.backend == "tensorflow":
        import tensorflow as tf

        meta["tensorflow"] = tf.__version__
        meta["TF_ENABLE_ONEDNN_OPTS"] = args.onednn if args.onednn is not None else "host default"
        meta["truth"] = "median of the fresh processes' allocator peaks; range and every run in the JSON; " + (
            "fit: the peak of fit's second epoch of 8 batches above the level before the model, less the data "
            "beyond one batch"
            if args.truth == "fit"
            else "steps: the first two train_on_batch steps of a fresh model"
        )
        meta["truth_window"] = args.truth
    write_result(
        out_dir,
        name,
        {"meta": meta, "summary": summary, "rows": rows},
        to_markdown(args.backend, rows, summary, meta),
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
