"""Screens a change to the TensorFlow estimate against committed measurements, without measuring again.

    python -m benchmarks.tools.tf_repredict benchmarks/results/keras_tensorflow_cpu/zen3-avx2_onednn0.json --host-tag zen4

Writes ``benchmarks/results/investigations/screens/<suite>_<result>[_<host-tag>].{json,md}``; a screen
quoted as evidence moves beside the investigation it belongs to (``benchmarks/README.md``). To check that a
change predicts the same bytes as a committed result, use :mod:`benchmarks.tools.repredict` instead.

For each TensorFlow row of a committed :mod:`benchmarks.suites.keras_accuracy` result, a
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
      or for copies whose optimizer starts otherwise than the row's did
      (rows measured before 2026-11-27 have no ``step_check_optimizer_built``:
      their copies had it built before the first step; the estimator's check
      now builds it in the first step when the model's was unbuilt), the row
      is reported as not comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

__all__ = ["worker", "compare", "summary", "to_markdown", "main"]


def worker(case: str, row: dict[str, Any]) -> dict[str, Any]:
    """Re-estimates ``case`` in this process with the row's step-check runs injected."""
    from benchmarks.common.keras_cases import build_case
    from nnmem_callbacks.estimators.keras.tensorflow import step_check as tf_step_check
    from nnmem_callbacks.keras import estimate_training

    runs = row.get("step_check_runs")
    check_batch = row.get("step_check_batch_size")
    asked: list[int] = []

    # rows measured before 2026-11-27 have no such key: their check's copies had the optimizer built first
    row_built = bool(row.get("step_check_optimizer_built", True))

    def committed_runs(
        model: Any, x_specs: Any, y_specs: Any, batch_size: int, optimizer_built: bool = True, **_: Any
    ) -> Any:
        asked.append(batch_size)
        if batch_size != check_batch:
            raise tf_step_check.StepCheckError(f"the check asked for batch {batch_size}, the row has {check_batch}")
        tf_step_check.require_same_start(optimizer_built, row_built)
        return tf_step_check.StepMeasurement(
            batch_size, tuple(int(r) for r in runs), 0.0, row.get("allocator", "?"), optimizer_built=row_built
        )

    tf_step_check.measure_steps = committed_runs  # type: ignore[assignment]
    tf_step_check.unsettled = lambda *_: False  # type: ignore[assignment] - the row's runs hold any extra ones
    model, x, y, batch = build_case(case)
    started = time.perf_counter()
    estimate = estimate_training(model, batch, x=x, y=y, check_steps=bool(runs))
    if runs and "step_check_runs" not in estimate.extra:
        reason = next((note for note in estimate.notes if note.startswith("not checked")), "the check did not run")
        raise RuntimeError(f"{case} is not comparable: {reason}")
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


def summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst absolute errors of the committed and the new predictions, and the bound's coverage.

    Example:
        >>> summary([{"old_error": -0.2, "new_error": 0.01, "new_upper_covers": True},
        ...          {"old_error": 0.02, "new_error": -0.03, "new_upper_covers": True}])
        {'cases': 2, 'committed_median': 0.11, 'committed_worst': 0.2, 'new_median': 0.02, 'new_worst': 0.03, 'new_upper_covers': 2}
    """
    old = [abs(line["old_error"]) for line in lines]
    new = [abs(line["new_error"]) for line in lines]
    return {
        "cases": len(lines),
        "committed_median": round(statistics.median(old), 6),
        "committed_worst": round(max(old), 6),
        "new_median": round(statistics.median(new), 6),
        "new_worst": round(max(new), 6),
        "new_upper_covers": sum(bool(line["new_upper_covers"]) for line in lines),
    }


def to_markdown(lines: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The screen as a table: each case's truth, the committed and the new prediction's errors."""
    mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    out = ["# Screen: this estimator against committed TensorFlow runs (not an accuracy result)", ""]
    out += [f"- {key}: {value}" for key, value in meta.items()]
    out += [
        "",
        "| case | truth MiB | largest run MiB | committed error | new prediction MiB | new error | new upper >= largest run |",
        "|---|---|---|---|---|---|---|",
    ]
    for line in lines:
        out.append(
            f"| {line['case']} | {mib(line['truth'])} | {mib(line['largest_run'])} | {line['old_error']:+.1%} | "
            f"{mib(line['predicted_bytes'])} | {line['new_error']:+.1%} | {'yes' if line['new_upper_covers'] else 'NO'} |"
        )
    if lines:
        total = summary(lines)
        out += [
            "",
            f"Over {total['cases']} cases: committed median {total['committed_median']:.1%}, worst "
            f"{total['committed_worst']:.1%}; new median {total['new_median']:.1%}, worst {total['new_worst']:.1%}; "
            f"the new upper bound at or above the largest run for {total['new_upper_covers']}.",
        ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common.isolated import run_worker
    from benchmarks.common.keras_env import host_fingerprint, mode_environment
    from benchmarks.common.paths import result_dir
    from benchmarks.tools.provenance import commit_stamp, file_commit, write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", nargs="?", help="a committed keras_accuracy JSON (TensorFlow)")
    parser.add_argument("--cases", default="", help="comma-separated cases (default: every row)")
    parser.add_argument("--lines", default=None, help="also append each case's line to this file as it is screened")
    parser.add_argument("--from-lines", default=None, help="render the result from such a file instead of screening")
    parser.add_argument(
        "--out", default=str(result_dir("investigations") / "screens"), help="where the screen's .json and .md go"
    )
    parser.add_argument("--host-tag", default="", help="a name for the host in the output file name")
    parser.add_argument("--note", default="", help="a note for the result's header")
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
    started = time.perf_counter()
    screened = []
    if args.from_lines:
        with open(args.from_lines) as handle:
            screened = [json.loads(text) for text in handle if text.strip()]
    else:
        env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3", **mode_environment(onednn))
        for row in rows:
            if wanted and row["case"] not in wanted:
                continue
            keep = {
                k: row[k]
                for k in ("step_check_runs", "step_check_batch_size", "allocator", "step_check_optimizer_built")
                if k in row
            }
            new = run_worker(
                "benchmarks.tools.tf_repredict",
                ["--worker", row["case"], "--row", json.dumps(keep)],
                env=env,
                timeout=3600,
            )
            if "error_text" in new:
                print(json.dumps({"case": row["case"], "error": new["error_text"]}), flush=True)
                continue
            line = {**compare(row, new), **{k: new[k] for k in ("predicted_bytes", "estimate_s")}}
            screened.append(line)
            print(json.dumps(line), flush=True)
            if args.lines:
                with open(args.lines, "a") as handle:
                    handle.write(json.dumps(line) + "\n")
    import keras
    import tensorflow as tf

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "against": f"{os.path.basename(args.result)} (as committed at {file_commit(args.result)})",
        "estimator": commit_stamp("nnmem_callbacks")
        if not args.from_lines
        else "as the notes say (rendered from a run's lines)",
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        **host_fingerprint(),
        "TF_ENABLE_ONEDNN_OPTS": onednn,
        "method": "each case estimated again in a fresh process; the step check's runs are the committed row's "
        "(not run again); truth and runs are the committed row's",
        **({} if args.from_lines else {"elapsed_s": round(time.perf_counter() - started, 1)}),
        **({"notes": args.note} if args.note else {}),
    }
    stem = os.path.splitext(os.path.basename(args.result))[0]
    suite = os.path.basename(os.path.dirname(os.path.abspath(args.result)))
    name = f"{suite}_{stem}" + (f"_{args.host_tag}" if args.host_tag else "")
    record = {"meta": meta, "rows": screened, "summary": summary(screened) if screened else {}}
    print(write_result(args.out, name, record, to_markdown(screened, meta)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
