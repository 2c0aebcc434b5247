"""Question (2026-11-29, issue #46): is a model's miss against ``fit``'s peak the step check's bias, or the spread of
that peak from one fresh process to the next?

    TF_ENABLE_ONEDNN_OPTS=0 TF_CPU_ALLOCATOR_USE_BFC=true python -m benchmarks.investigations.tf_fit_spread \\
        --case mobilenetv3small --runs 6 --stem mobilenetv3small_zen3-avx2_onednn0

For one case of the Keras accuracy suite, alternating, in fresh processes (no estimator runs):

* ``truth``: the suite's truth measurement (:func:`benchmarks.common.keras_truth.measure_tensorflow_fit`: the
  allocator peak of ``fit``'s second epoch of 8 batches, less the data beyond one batch), ``--runs`` processes;
* ``check``: the step check's own child (``python -m nnmem_callbacks.estimators.keras.tensorflow.step_check``) on
  the request the estimator builds for the case at its batch (the copy rebuilt from the model's configuration,
  synthetic data), ``--runs`` processes, as the estimate runs them.

If the two measure the same figure, their runs are draws from one distribution; the estimate takes the check's upper
median (of 3 runs the median, of 7 the 5th), the truth is the median of 3.

Writes ``benchmarks/results/investigations/tf_fit_spread/<stem>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from benchmarks.common.paths import RESULTS

MiB = 2**20
CHILD = "nnmem_callbacks.estimators.keras.tensorflow.step_check"


def worker(name: str, part: str) -> dict[str, Any]:
    """(In a fresh process) the truth's measurement, or the step check's request for the case (with the versions)."""
    if part == "truth":
        from benchmarks.common.keras_truth import measure_tensorflow_fit

        return {"measured": measure_tensorflow_fit(name)["measured_bytes"]}
    from benchmarks.common.keras_blind_cases import FIT_BATCHES, build_fit_case
    from nnmem_callbacks.estimators.keras.common import Spec
    from nnmem_callbacks.estimators.keras.tensorflow import step_check

    model, x, y, batch = build_fit_case(name, FIT_BATCHES)
    spec = [Spec((None, *a.shape[1:]), str(a.dtype)) for a in (x, y)]
    request = step_check.request_for(model, spec[0], spec[1], batch, 1, model.optimizer.built)
    import keras
    import tensorflow as tf

    return {"request": request, "tensorflow": tf.__version__, "keras": keras.__version__}


def _check_run(request: dict[str, Any], env: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, "-m", CHILD], input=json.dumps(request), env=env, capture_output=True, text=True, timeout=900
    )
    for line in done.stdout.splitlines():
        if line.startswith("{") and "measured" in line:
            return int(json.loads(line)["measured"])
    raise RuntimeError(f"the step check's child measured nothing: {done.stderr.strip().splitlines()[-1:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="mobilenetv3small")
    parser.add_argument("--runs", type=int, default=6, help="fresh processes of each kind")
    parser.add_argument("--stem", help="result file name (default: <case>_onednn<mode>)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker)), flush=True)
        return 0
    from benchmarks.common.isolated import run_worker
    from benchmarks.common.keras_env import host_fingerprint
    from benchmarks.tools.provenance import commit_stamp

    mode = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "host default")
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    request = run_worker("benchmarks.investigations.tf_fit_spread", ["--worker", args.case, "request"], env=env)
    if "request" not in request:
        raise SystemExit(f"could not build the step check's request: {request.get('error_text')}")
    runs: dict[str, list[int]] = {"truth": [], "check": []}
    for _ in range(args.runs):
        truth = run_worker("benchmarks.investigations.tf_fit_spread", ["--worker", args.case, "truth"], env=env)
        if "measured" not in truth:
            raise SystemExit(f"a truth process failed: {truth.get('error_text')}")
        runs["truth"].append(truth["measured"])
        runs["check"].append(_check_run(request["request"], env))
        print(json.dumps({k: [round(v / MiB, 1) for v in vs] for k, vs in runs.items()}), flush=True)
    meta = {
        "commit": commit_stamp(),
        **host_fingerprint(),
        "TF_ENABLE_ONEDNN_OPTS": mode,
        "python": sys.version.split()[0],
        "tensorflow": request["tensorflow"],
        "keras": request["keras"],
        "case": args.case,
        "batch_size": request["request"]["batch_size"],
    }
    stem = args.stem or f"{args.case}_onednn{mode}"
    folder = os.path.join(RESULTS, "investigations", "tf_fit_spread")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{stem}.json"), "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "runs": runs}, handle, indent=1)
    lines = [
        f"# `fit`'s peak: the truth's processes against the step check's ({stem})",
        "",
        f"Question: {__doc__.splitlines()[0][len('Question (2026-11-29, issue #46): ') :]} " + __doc__.splitlines()[1],
        "",
        f"- {json.dumps(meta)}",
        f"- command: `python -m benchmarks.investigations.tf_fit_spread --case {args.case} --runs {args.runs}`"
        " (see its docstring)",
        "",
        "| kind | processes | median MiB | range MiB | every run MiB (in order) |",
        "|---|---|---|---|---|",
    ]
    for kind, values in runs.items():
        lines.append(
            f"| {kind} | {len(values)} | {statistics.median(values) / MiB:.1f} | {min(values) / MiB:.1f} - "
            f"{max(values) / MiB:.1f} | {', '.join(f'{v / MiB:.1f}' for v in values)} |"
        )
    with open(os.path.join(folder, f"{stem}.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
