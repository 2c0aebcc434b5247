"""Screens a change to the TensorFlow estimate against committed measurements, without measuring again.

    python -m benchmarks.tf_repredict benchmarks/results/keras_tensorflow_cpu_avx2_all_onednn0.json --out /tmp/screen0

For each TensorFlow row of a committed :mod:`benchmarks.keras_accuracy` result, a
fresh process (in the result's oneDNN mode) estimates the case again with this
checkout's estimator, but the step check's real runs are not run: the committed
row's ``step_check_runs`` are handed to the estimator instead (so only the replay
and the probes run; the correction is recomputed from those runs and the new
replay of the check's batch). The new prediction is compared with the committed
truth (the median of the row's fresh processes), beside the committed prediction.

A screen, not a result: it says which models a replay change moves and which
way, so that the full benchmark is run on a change worth it. Its figures are
not the accuracy figures (the truth is an earlier session's, the probes are
this host's, the check's runs are reused).

Known limitations:
    * Rows without ``step_check_runs`` (the check skipped or failed there) are
      re-estimated without the check.
    * If the new estimate asks for the check at another batch than the row's,
      the row is reported as not comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any


def worker(case: str, row: dict[str, Any]) -> dict[str, Any]:
    """Re-estimates ``case`` in this process with the row's step-check runs injected."""
    from benchmarks.keras_accuracy import build_case
    from nnmem_callbacks.keras import estimate_training
    from nnmem_callbacks.keras import tf_step_check

    runs = row.get("step_check_runs")
    check_batch = row.get("step_check_batch_size")
    asked: list[int] = []

    def committed_runs(model: Any, x_specs: Any, y_specs: Any, batch_size: int, **_: Any) -> Any:
        asked.append(batch_size)
        if batch_size != check_batch:
            raise tf_step_check.StepCheckError(f"the check asked for batch {batch_size}, the row has {check_batch}")
        return tf_step_check.StepMeasurement(batch_size, tuple(int(r) for r in runs), 0.0, row.get("allocator", "?"))

    tf_step_check.measure_steps = committed_runs  # type: ignore[assignment]
    tf_step_check.unsettled = lambda *_: False  # type: ignore[assignment] - the row's runs hold any extra ones
    model, x, y, batch = build_case(case)
    started = time.perf_counter()
    estimate = estimate_training(model, batch, x=x, y=y, check_steps=bool(runs))
    return {
        "case": case,
        "predicted_bytes": int(estimate.extra["tf_allocator_peak_bytes"]),
        "predicted_upper_bytes": int(estimate.extra["tf_allocator_peak_upper_bytes"]),
        "replay_peak_bytes": estimate.extra.get("replay_peak_bytes"),
        "check_batches_asked": asked,
        "estimate_s": round(time.perf_counter() - started, 1),
    }


def compare(committed: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The committed and the new prediction against the committed truth.

    Example:
        >>> compare({"case": "a", "measured_bytes": 100, "measured_runs": [90, 100, 120], "predicted_bytes": 80,
        ...          "predicted_upper_bytes": 130}, {"case": "a", "predicted_bytes": 95, "predicted_upper_bytes": 125})
        {'case': 'a', 'truth': 100, 'largest_run': 120, 'old_error': -0.2, 'new_error': -0.05, 'new_upper_covers': True}
    """
    truth = int(committed["measured_bytes"])
    largest = max(int(r) for r in committed.get("measured_runs") or [truth])
    return {
        "case": committed["case"],
        "truth": truth,
        "largest_run": largest,
        "old_error": (committed["predicted_bytes"] - truth) / truth,
        "new_error": (new["predicted_bytes"] - truth) / truth,
        "new_upper_covers": new["predicted_upper_bytes"] >= largest,
    }


def main(argv: list[str] | None = None) -> int:
    from benchmarks.isolated import run_worker
    from benchmarks.keras_accuracy import mode_environment

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", nargs="?", help="a committed keras_accuracy JSON (TensorFlow)")
    parser.add_argument("--cases", default="", help="comma-separated cases (default: every row)")
    parser.add_argument("--out", default=None, help="write the screen's JSON lines here (a file)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, json.loads(args.row))), flush=True)
        return 0
    if not args.result:
        parser.error("the committed result to screen against is required")
    with open(args.result) as handle:
        result = json.load(handle)
    rows = [r for r in result["rows"] if r.get("backend") == "tensorflow" and "measured_bytes" in r]
    wanted = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(wanted) - {r["case"] for r in rows})
    if unknown:
        parser.error(f"case(s) not in {args.result}: {', '.join(unknown)}; valid: {', '.join(r['case'] for r in rows)}")
    onednn = str(result["meta"].get("TF_ENABLE_ONEDNN_OPTS", "0"))
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3", **mode_environment(onednn))
    screened = []
    for row in rows:
        if wanted and row["case"] not in wanted:
            continue
        keep = {k: row.get(k) for k in ("step_check_runs", "step_check_batch_size", "allocator")}
        new = run_worker("benchmarks.tf_repredict", ["--worker", row["case"], "--row", json.dumps(keep)], env=env,
                         timeout=3600)
        if "error_text" in new:
            print(json.dumps({"case": row["case"], "error": new["error_text"]}), flush=True)
            continue
        line = {**compare(row, new), **{k: new[k] for k in ("predicted_bytes", "estimate_s")}}
        screened.append(line)
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a") as handle:
                handle.write(json.dumps(line) + "\n")
    if screened:
        old = [abs(s["old_error"]) for s in screened]
        new_errors = [abs(s["new_error"]) for s in screened]
        print(f"{len(screened)} cases: committed median {statistics.median(old):.1%} worst {max(old):.1%}; "
              f"new median {statistics.median(new_errors):.1%} worst {max(new_errors):.1%}; "
              f"new upper bound covers the largest run for {sum(s['new_upper_covers'] for s in screened)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
