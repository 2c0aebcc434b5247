"""Question (2026-11-29): would another statistic of the TensorFlow step check's runs make a better estimate?

With oneDNN on, a model's real ``fit`` epochs can split between two peaks (the allocator's 256 KiB-and-up chunks,
an executor race). The estimate takes the median of the check's runs at the batch (3, or 7 when the first 3 spread
wider than they lie from the replay). The judged GRU stack (1.4 MiB) read -58.6% on zen4-avx512: 4 of its 7 check
runs sat in the lower mode, all 3 truth runs in the upper one. This asks, from the committed runs alone (no new
measurement), what the mean, the upper median (the run two thirds up) or the largest run would have given instead,
per set and mode. The tuning set decides; the judged set is only reported (choosing on it would fit its GRU).

    python -m benchmarks.investigations.keras_check_statistic --host-tag zen4-avx512

Reads ``benchmarks/results/keras_tensorflow_cpu/<host>_{tune,judged,developed10}_onednn{0,1}.json`` (those present)
and writes ``benchmarks/results/investigations/keras_check_statistic/<host>.{json,md}``.

Known limitations:
    * Only rows whose check ran at the batch itself are compared (at a smaller batch the estimate carries the
      nearest run's difference, not a statistic of the runs).
    * The runs are those the median rule asked for: a rule that asked for more runs might have seen others.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any, Callable, Sequence

from benchmarks.common.paths import result_dir
from benchmarks.tools.provenance import write_result
from nnmem_callbacks.estimators.keras.tensorflow.step_check import upper_median

__all__ = ["STATISTICS", "SETS", "errors_by_statistic", "summarize", "to_markdown", "main"]

SETS = ("tune", "judged", "developed10")


#: Name -> statistic of the check's runs that the estimate would carry to the batch.
STATISTICS: dict[str, Callable[[Sequence[int]], float]] = {
    "median (until 2026-11-29)": statistics.median,
    "mean": statistics.mean,
    "upper median (since)": upper_median,  # the estimator's own rule
    "largest run": max,
}


def errors_by_statistic(rows: list[dict[str, Any]]) -> dict[str, list[tuple[str, float]]]:
    """Per statistic, ``(case, relative error against the truth)`` of each row checked at its batch.

    The estimate is the committed prediction with the median run swapped for the statistic: the replay and the
    rest of the estimate stay as they were.

    Example:
        >>> row = {"case": "m", "batch_size": 8, "step_check_batch_size": 8, "step_check_runs": [90, 100, 140],
        ...        "predicted_bytes": 100, "measured_bytes": 100}
        >>> errors_by_statistic([row])["largest run"]
        [('m', 0.4)]
    """
    found: dict[str, list[tuple[str, float]]] = {name: [] for name in STATISTICS}
    for row in rows:
        runs = row.get("step_check_runs")
        if not runs or row.get("step_check_batch_size") != row["batch_size"] or not row.get("measured_bytes"):
            continue
        median = statistics.median(runs)
        for name, statistic in STATISTICS.items():
            predicted = row["predicted_bytes"] - median + statistic(runs)
            found[name].append((row["case"], (predicted - row["measured_bytes"]) / row["measured_bytes"]))
    return found


def summarize(errors: list[tuple[str, float]]) -> dict[str, Any]:
    """Median and worst absolute error, the worst case, and how many lie under and over."""
    magnitudes = [abs(e) for _, e in errors]
    worst_case, worst = max(errors, key=lambda item: abs(item[1]))
    return {
        "cases": len(errors),
        "median_abs_error": statistics.median(magnitudes),
        "worst_error": worst,
        "worst_case": worst_case,
        "under": sum(e < 0 for _, e in errors),
        "over": sum(e > 0 for _, e in errors),
    }


def to_markdown(host: str, table: list[dict[str, Any]], sources: list[str]) -> str:
    lines = [
        f"# Which statistic of the step check's runs? ({host}, from committed runs)",
        "",
        "The estimate with the median run (the rule of the runs' commits) swapped for another statistic of the same "
        "runs; the truth is the committed one. Since 2026-11-29 the estimator takes the upper median. Module "
        "docstring: `benchmarks/investigations/keras_check_statistic.py`.",
        "",
        "| set | oneDNN | statistic | cases | median | worst | under / over |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in table:
        lines.append(
            f"| {row['set']} | {row['onednn']} | {row['statistic']} | {row['cases']} | "
            f"{100 * row['median_abs_error']:.1f}% | {100 * row['worst_error']:+.1f}% ({row['worst_case']}) | "
            f"{row['under']} / {row['over']} |"
        )
    lines += ["", "Sources (the commit that measured them): " + ", ".join(sources), ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-tag", default="zen4-avx512", help="the results' host tag (zen4-avx512, zen3-avx2)")
    args = parser.parse_args(argv)
    folder = result_dir("keras_tensorflow_cpu")
    table, sources = [], []
    for name in SETS:
        for mode in ("0", "1"):
            path = folder / f"{args.host_tag}_{name}_onednn{mode}.json"
            if not path.exists():
                continue
            with open(path, encoding="utf-8") as handle:
                saved = json.load(handle)
            rows = saved["rows"]
            sources.append(f"`{path.relative_to(folder.parent.parent.parent)}` ({saved['meta'].get('commit', '?')})")
            for statistic, errors in errors_by_statistic(rows).items():
                if errors:
                    table.append({"set": name, "onednn": mode, "statistic": statistic, **summarize(errors)})
    if not table:
        parser.error(f"no {args.host_tag}_<set>_onednn<mode>.json results in {folder}")
    markdown = to_markdown(args.host_tag, table, sources)
    stem = write_result(
        str(result_dir("investigations") / "keras_check_statistic"),
        args.host_tag,
        {"meta": {"host": args.host_tag, "sources": sources}, "rows": table},
        markdown,
    )
    print(markdown)
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
