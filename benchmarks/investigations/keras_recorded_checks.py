"""Question (2026-11-25): do the upper bound's unlucky runs cover the runs recorded in the committed tables?

The TensorFlow estimator re-run against recorded measurements: its step checks and truths held fixed
(answer: 20 of 20 in both modes against the 20-model tables at af46a37, 19 and 18 before;
``benchmarks/results/investigations/keras_recorded_checks/avx512_onednn{0,1}.md``).

    python -m benchmarks.investigations.keras_recorded_checks --recorded benchmarks/results/keras_tensorflow_cpu/zen5-avx512_onednn1.json

A full :mod:`benchmarks.suites.keras_accuracy` run measures two noisy things: the step
check's real runs at half the batch (inside the estimate) and the truth's fresh
processes at the batch. TensorFlow's peak moves between identical runs (the
executor's interleaving), so two runs of the same estimator differ by more
than many changes to it, and judging a change by a new full run mixes the
change with a new draw of that noise.

This benchmark replays a committed result instead. Each case is estimated in a
fresh process, in the recorded oneDNN mode, by the current code, except that
the step check does not run: :func:`~nnmem_callbacks.estimators.keras.tensorflow.step_check.measure_steps`
returns the runs the recorded estimate measured (its first runs on the first
call, the further runs on the second, as the adaptive check asks for them).
The prediction is compared with the recorded truth runs. So the only thing
that differs from the recorded table is the code. It is a development tool:
its figures say how a change behaves on draws already seen, and every figure
that goes into the README still comes from a full run with new draws.

A case whose check would now run at another batch than recorded (the cap
depends on the predicted peak) cannot be replayed and is reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

__all__ = ["FIRST_RUNS", "recorded_rows", "worker", "compare", "summarize", "to_markdown", "main"]

#: Step-check runs the recorded estimate measured first (the rest came from the adaptive further runs).
FIRST_RUNS = 3


def recorded_rows(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``meta`` and the rows with a step check and truth runs of a committed ``keras_accuracy`` JSON."""
    with open(path, encoding="utf-8") as handle:
        saved = json.load(handle)
    rows = [r for r in saved["rows"] if r.get("step_check_runs") and r.get("measured_runs")]
    return saved["meta"], rows


def worker(case: str, batch: int, runs: list[int]) -> dict[str, Any]:
    """Estimates ``case`` in this process with the step check answered by ``runs`` (recorded at ``batch``)."""
    from benchmarks.common.keras_cases import build_case
    from nnmem_callbacks.estimators.keras.tensorflow import step_check as tf_step_check
    from nnmem_callbacks.estimators.keras.tensorflow.step_check import StepCheckError, StepMeasurement
    from nnmem_callbacks.keras import estimate_training

    answers = [tuple(runs[:FIRST_RUNS]), tuple(runs[FIRST_RUNS:])]
    asked: list[int] = []

    def recorded(
        model: Any, x_specs: Any, y_specs: Any, batch_size: int, optimizer_built: bool = True, **_: Any
    ) -> StepMeasurement:
        if batch_size != batch:
            raise StepCheckError(f"the check would run at batch {batch_size}, recorded at {batch}")
        # the recorded runs (before 2026-11-27) had their copies' optimizer built before the first step
        tf_step_check.require_same_start(optimizer_built, True)
        asked.append(batch_size)
        if len(asked) > len(answers) or not answers[len(asked) - 1]:
            raise StepCheckError("no further recorded runs")
        return StepMeasurement(batch_size, answers[len(asked) - 1], 0.0, tf_step_check.child_allocator(), cached=True)

    tf_step_check.measure_steps = recorded  # type: ignore[assignment]
    model, x, y, batch_size = build_case(case)
    started = time.perf_counter()
    estimate = estimate_training(model, batch_size, x=x, y=y)
    extra = estimate.extra
    return {
        "case": case,
        "batch_size": batch_size,
        "predicted_bytes": int(extra["tf_allocator_peak_bytes"]),
        "predicted_upper_bytes": int(extra["tf_allocator_peak_upper_bytes"]),
        "step_check_batch_size": extra.get("step_check_batch_size"),
        "step_check_runs_used": extra.get("step_check_runs"),
        "step_check_offset_bytes": extra.get("step_check_offset_bytes"),
        "replay_counted_bytes": int(extra["tf_allocator_peak_bytes"]) - int(extra.get("step_check_offset_bytes") or 0),
        "estimate_s": round(time.perf_counter() - started, 1),
        "notes": list(estimate.notes),
    }


def compare(row: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    """``row`` (a re-estimate) beside the recorded estimate and truth runs."""
    runs = recorded["measured_runs"]
    truth = statistics.median(runs)
    out = dict(row)
    out["measured_runs"] = runs
    out["measured_bytes"] = int(truth)
    out["recorded_predicted_bytes"] = recorded["predicted_bytes"]
    out["recorded_upper_bytes"] = recorded["predicted_upper_bytes"]
    out["recorded_error"] = recorded["error"]
    if "predicted_bytes" in row:
        out["error"] = (row["predicted_bytes"] - truth) / truth
        out["upper_covers_runs"] = row["predicted_upper_bytes"] >= max(runs)
        out["upper_margin"] = row["predicted_upper_bytes"] / max(runs) - 1
        out["replay_alone_error"] = (row["replay_counted_bytes"] - truth) / truth
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst |error|, upper-bound coverage and margins, for the re-estimates and the recorded ones."""
    done = [r for r in rows if "error" in r]
    if not done:
        return {"n": 0}

    def stats(values: list[float]) -> dict[str, float]:
        values = [abs(v) for v in values]
        return {"median_abs": statistics.median(values), "worst_abs": max(values)}

    margins = [r["upper_margin"] for r in done]
    recorded_margins = [r["recorded_upper_bytes"] / max(r["measured_runs"]) - 1 for r in done]
    return {
        "n": len(done),
        "now": stats([r["error"] for r in done]),
        "recorded": stats([r["recorded_error"] for r in done]),
        "replay_alone_now": stats([r["replay_alone_error"] for r in done]),
        "upper_covers_now": sum(bool(r["upper_covers_runs"]) for r in done),
        "upper_covers_recorded": sum(r["recorded_upper_bytes"] >= max(r["measured_runs"]) for r in done),
        "upper_margin_now": {"median": statistics.median(margins), "max": max(margins)},
        "upper_margin_recorded": {"median": statistics.median(recorded_margins), "max": max(recorded_margins)},
        "over_15_percent_now": sorted(r["case"] for r in done if abs(r["error"]) > 0.15),
        "upper_misses_now": sorted(r["case"] for r in done if not r["upper_covers_runs"]),
    }


def to_markdown(rows: list[dict[str, Any]], summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """The table: recorded vs re-estimated prediction, error and upper bound per case."""
    mib = lambda v: "-" if v is None else f"{v / 2**20:.1f}"  # noqa: E731
    pct = lambda v: "-" if v is None else f"{v * 100:+.1f}%"  # noqa: E731
    lines = ["# Keras/TensorFlow estimator re-run against recorded step checks and truths", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += [
        "",
        "Each case estimated by the code at `commit`, with the step check answered by the runs recorded in",
        "`recorded`; error against the recorded truth runs' median. Development figures, not a new measurement.",
        "",
        "| case | batch | truth runs MiB | recorded pred | recorded error | pred now | error now | replay alone now "
        "| upper now | upper >= every run | upper margin |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" not in r:
            lines.append(f"| {r['case']} | - | - | - | - | {r.get('error_text', 'failed')} | | | | | |")
            continue
        runs = ", ".join(f"{v / 2**20:.1f}" for v in r["measured_runs"])
        lines.append(
            f"| {r['case']} | {r['batch_size']} | {runs} | {mib(r['recorded_predicted_bytes'])} | {pct(r['recorded_error'])} "
            f"| {mib(r['predicted_bytes'])} | {pct(r['error'])} | {pct(r['replay_alone_error'])} "
            f"| {mib(r['predicted_upper_bytes'])} | {'yes' if r['upper_covers_runs'] else 'NO'} | {pct(r['upper_margin'])} |"
        )
    if summary.get("n"):
        lines += [
            "",
            f"- now: median |error| {summary['now']['median_abs']:.1%}, worst {summary['now']['worst_abs']:.1%} "
            f"(recorded: {summary['recorded']['median_abs']:.1%}, {summary['recorded']['worst_abs']:.1%}; "
            f"replay alone now: {summary['replay_alone_now']['median_abs']:.1%}, "
            f"{summary['replay_alone_now']['worst_abs']:.1%}) over {summary['n']} cases",
            f"- over 15% now: {', '.join(summary['over_15_percent_now']) or 'none'}",
            f"- upper bound at or above every run: {summary['upper_covers_now']} of {summary['n']} now "
            f"(recorded {summary['upper_covers_recorded']}); misses now: {', '.join(summary['upper_misses_now']) or 'none'}",
            f"- upper bound over the largest run: median {summary['upper_margin_now']['median']:+.1%}, "
            f"max {summary['upper_margin_now']['max']:+.1%} (recorded {summary['upper_margin_recorded']['median']:+.1%}, "
            f"{summary['upper_margin_recorded']['max']:+.1%})",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recorded", required=True, help="a committed keras_accuracy JSON (TensorFlow backend)")
    parser.add_argument("--cases", default=None, help="comma-separated cases (default: every recorded one)")
    parser.add_argument("--out", default=None, help="output stem (default: print only)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--runs", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch, json.loads(args.runs))), flush=True)
        return 0
    from benchmarks.common.isolated import run_worker
    from benchmarks.common.keras_env import host_fingerprint, mode_environment
    from benchmarks.tools.provenance import commit_stamp, file_commit

    meta_recorded, recorded = recorded_rows(args.recorded)
    wanted = set(args.cases.split(",")) if args.cases else None
    onednn = str(meta_recorded.get("TF_ENABLE_ONEDNN_OPTS"))
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    env.update(mode_environment(onednn if onednn in ("0", "1") else None))
    env["NNMEM_CACHE_DIR"] = tempfile.mkdtemp(prefix="nnmem-recorded-")  # kernel probes cold, as in the benchmark
    started = time.perf_counter()
    rows = []
    for row in recorded:
        if wanted is not None and row["case"] not in wanted:
            continue
        result = run_worker(
            "benchmarks.investigations.keras_recorded_checks",
            [
                "--recorded",
                args.recorded,
                "--worker",
                row["case"],
                "--batch",
                str(row["step_check_batch_size"]),
                "--runs",
                json.dumps(row["step_check_runs"]),
            ],
            env=env,
            timeout=1200,
        )
        result.setdefault("case", row["case"])
        rows.append(compare(result, row))
        print(json.dumps(rows[-1]), flush=True)  # notes included: a run that dies later can be rebuilt from its log
    summary = summarize(rows)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "recorded": f"{args.recorded} as committed at {file_commit(args.recorded)} (estimator {meta_recorded.get('commit')}, "
        f"{meta_recorded.get('date')})",
        "commit": commit_stamp(),
        "TF_ENABLE_ONEDNN_OPTS": onednn,
        **host_fingerprint(),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    text = to_markdown(rows, summary, meta)
    if args.out:
        with open(args.out + ".json", "w", encoding="utf-8") as handle:
            json.dump({"meta": meta, "summary": summary, "rows": rows}, handle, indent=2)
        with open(args.out + ".md", "w", encoding="utf-8") as handle:
            handle.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
