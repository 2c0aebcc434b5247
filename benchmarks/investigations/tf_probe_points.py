"""Question (2026-11-29): how many kernel-probe points, and how many seconds of probing, does a cold Keras/TensorFlow
estimate take? It sizes the probes' point budget (``probes.DEFAULT_POINT_BUDGET``), which replaced a 90 s time
budget so that an estimate no longer depends on the host's load, and the probe process's time limit.

    TF_ENABLE_ONEDNN_OPTS=0 python -m benchmarks.investigations.tf_probe_points --stem zen3-avx2_onednn0

Each case of the Keras accuracy suite (the 23 developed models and the 27 blind ones) runs in a fresh process with
an empty probe cache: its train step is traced as the estimator traces it, the probes are collected, and the points
the estimate wants (per distinct op: 1, 2 and 4 samples and the replay's batch sizes under the memory cap) are
counted; then the probes run in their child process (timed), and the process exits before the replay.

Writes ``benchmarks/results/investigations/tf_probe_points/<stem>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from benchmarks.common.paths import RESULTS

MARK = "PROBE-POINTS "


def worker(name: str) -> None:
    """(In a fresh process, with an empty probe cache) prints the case's probe counts and exits before the replay."""
    from nnmem_callbacks.estimators.keras.tensorflow import probes

    measure = probes.measure

    def counted(found: dict, batch_sizes: tuple, **kwargs: Any) -> Any:
        started = time.perf_counter()
        # without a budget, the report counts every point the estimate wants
        _, report = measure(found, batch_sizes, **{**kwargs, "point_budget": sys.maxsize})
        row = {
            "case": name,
            "ops": len(found),
            "distinct": len({probe.key() for probe in found.values()}),
            "points": report.points,
            "over_cap": report.over_cap,
            "seconds": round(time.perf_counter() - started, 2),
            "note": report.note(),
        }
        print(MARK + json.dumps(row), flush=True)
        os._exit(0)  # the replay is not needed

    probes.measure = counted
    from benchmarks.common.keras_blind_cases import build_any_case
    from nnmem_callbacks.keras import estimate_training

    model, x, y, batch = build_any_case(name)
    estimate_training(model, batch, x=x, y=y, check_steps=False)


def run_case(name: str) -> dict[str, Any]:
    import tempfile

    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    env["NNMEM_CACHE_DIR"] = tempfile.mkdtemp(prefix="nnmem-probe-points-")
    command = [sys.executable, "-m", "benchmarks.investigations.tf_probe_points", "--worker", name]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    return {"case": name, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}


def to_markdown(record: dict[str, Any]) -> str:
    meta, rows = record["meta"], [r for r in record["rows"] if "points" in r]
    lines = [
        "# TensorFlow kernel-probe points of a cold estimate",
        "",
        f"{meta['date']}; {meta['host']['cpu']} ({meta['host']['isa']}, {meta['host']['cpu_threads']} threads); TensorFlow {meta['tensorflow']}, Keras {meta['keras']}; oneDNN "
        f"{'on' if meta['onednn'] == '1' else 'off'}; commit {meta['commit']}. {meta.get('how', '')}".rstrip(),
        "",
        f"{len(rows)} cases: {min(r['points'] for r in rows)} to {max(r['points'] for r in rows)} points, at most "
        f"{max(r['seconds'] for r in rows):g} s of probing (the child's TensorFlow import included); "
        f"{sum(1 for r in rows if r['over_cap'])} with an op over the memory cap.",
        "",
        "| case | probed ops | distinct | points | ops over the cap | probing s |",
        "|---|---|---|---|---|---|",
    ]
    for row in sorted(rows, key=lambda r: -r["points"]):
        lines.append(
            f"| {row['case']} | {row['ops']} | {row['distinct']} | {row['points']} | {row['over_cap']} | "
            f"{row['seconds']:g} |"
        )
    for row in record["rows"]:
        if "error" in row:
            lines.append(f"| {row['case']} | failed: {row['error']} | | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--cases", help="comma-separated case names (default: every developed and blind case)")
    parser.add_argument("--stem", default="cpu")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 1  # the worker exits from inside the estimate; reaching here means the probes never ran
    from benchmarks.common.keras_blind_cases import BLIND_CASES
    from benchmarks.common.keras_cases import CASES
    from benchmarks.common.keras_env import host_fingerprint
    from benchmarks.tools.provenance import commit_stamp, write_result
    from nnmem_callbacks.allocators.tensorflow_cpu import onednn_enabled

    names = args.cases.split(",") if args.cases else [*CASES, *BLIND_CASES]
    rows = []
    for name in names:
        rows.append(run_case(name))
        print(json.dumps(rows[-1]), flush=True)
    import keras
    import tensorflow as tf

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": host_fingerprint(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "onednn": "1" if onednn_enabled() else "0",  # the mode this process's TensorFlow runs (the workers' too)
        "commit": commit_stamp(),
    }
    record = {"meta": meta, "rows": rows}
    stem = write_result(str(RESULTS / "investigations" / "tf_probe_points"), args.stem, record, to_markdown(record))
    print(stem)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
