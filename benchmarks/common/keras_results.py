"""The Keras accuracy tables: the summary (median and worst errors, the upper bound's coverage) and the Markdown.

Shared by :mod:`benchmarks.suites.keras_accuracy`, which writes a run's result, and
:mod:`benchmarks.tools.merge_results`, which joins runs of one host and mode.

Example:
    >>> summarize([{"case": "mlp", "error": 0.02, "rule_error": 0.4}, {"case": "lstm", "error": -0.1, "rule_error": 0.5}])["ours"]
    {'n': 2, 'median_abs': 0.060000000000000005, 'worst_abs': 0.1}
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.common.keras_cases import (
    FIRST_MEASURED_2026_11_24,
    FIRST_MEASURED_2026_11_25,
    FIRST_MEASURED_2026_11_25_LATER,
    OUTSIDE_CASES,
    ZOO_CASES,
)

__all__ = ["summarize_rows", "summarize", "to_markdown"]


def summarize_rows(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Median and worst absolute value of ``key`` over ``rows``."""
    values = [abs(r[key]) for r in rows if r.get(key) is not None]
    if not values:
        return {"n": 0}
    return {"n": len(values), "median_abs": statistics.median(values), "worst_abs": max(values)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(key: str) -> dict[str, Any]:
        values = [abs(r[key]) for r in rows if r.get(key) is not None]
        if not values:
            return {"n": 0}
        return {"n": len(values), "median_abs": statistics.median(values), "worst_abs": max(values)}

    summary = {"ours": stats("error"), "rule_of_thumb": stats("rule_error")}
    errors = [r["error"] for r in rows if r.get("error") is not None]
    if errors:
        # a systematic lean shows as most models on one side (issue #46 allows at most 60% on either)
        summary["lean"] = {
            "n": len(errors),
            "under": sum(e < 0 for e in errors),
            "over": sum(e > 0 for e in errors),
            "larger_side_share": max(sum(e < 0 for e in errors), sum(e > 0 for e in errors)) / len(errors),
        }
    checked = [r for r in rows if r.get("step_check_offset_bytes") is not None and r.get("measured_bytes")]
    if checked:
        # the same estimate without the step check's correction (the replay alone), from the same runs
        alone = [
            {"error": (r["predicted_bytes"] - r["step_check_offset_bytes"] - r["measured_bytes"]) / r["measured_bytes"]}
            for r in checked
        ]
        summary["replay_alone"] = summarize_rows(alone, "error")
    zoo = [r for r in rows if r.get("case") in ZOO_CASES]
    outside = [r for r in rows if r.get("case") in OUTSIDE_CASES]
    if zoo and outside:
        summary["ours_zoo"] = summarize_rows(zoo, "error")
        summary["ours_outside_zoo"] = summarize_rows(outside, "error")
    blind = [r for r in rows if r.get("case") in FIRST_MEASURED_2026_11_24]
    if blind:
        summary["ours_first_measured_2026_11_24"] = summarize_rows(blind, "error")
    blind = [r for r in rows if r.get("case") in FIRST_MEASURED_2026_11_25]
    if blind:
        summary["ours_first_measured_2026_11_25"] = summarize_rows(blind, "error")
    blind = [r for r in rows if r.get("case") in FIRST_MEASURED_2026_11_25_LATER]
    if blind:
        summary["ours_first_measured_2026_11_25_later"] = summarize_rows(blind, "error")
    if any("upper_covers_runs" in r for r in rows):
        covered = [r for r in rows if "upper_covers_runs" in r]
        # what the bound costs a plan: how far it lies above the largest run
        margins = [r["predicted_upper_bytes"] / max(r["measured_runs"]) - 1 for r in covered if max(r["measured_runs"])]
        summary["upper_bound_covers_every_run"] = {
            "n": len(covered),
            "covered": sum(bool(r["upper_covers_runs"]) for r in covered),
        }
        if margins:  # none where every covered run read 0 bytes
            summary["upper_bound_covers_every_run"].update(
                median_margin_over_largest_run=statistics.median(margins),
                largest_margin_over_largest_run=max(margins),
            )
    if any("error_steady" in r for r in rows):
        summary["ours_steady"] = stats("error_steady")
        summary["rule_of_thumb_steady"] = stats("rule_error_steady")
    return summary


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def to_markdown(backend: str, rows: list[dict[str, Any]], summary: dict[str, Any], meta: dict[str, Any]) -> str:
    device = meta.get("device", "cpu")
    lines = [f"# Keras accuracy benchmark ({backend}, {'CPU' if device == 'cpu' else device})", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "Error = (predicted - measured) / measured. " + (rows[0].get("truth", "") if rows else "")]
    lines += ["Measured = the median over `repeats` fresh processes (range in its own column).", ""]
    steady = backend == "tensorflow" and any("measured_steady_bytes" in r for r in rows)
    columns = ["case", "batch", "method", "pred MiB", "meas MiB", "meas range MiB", "error"]
    upper = any("predicted_upper_bytes" in r for r in rows)
    if upper:
        columns += ["upper MiB", "upper >= every run"]
    if steady:
        columns += ["meas steps 3-4 MiB", "error steady"]
    checked = any("step_check_offset_bytes" in r for r in rows)
    if checked:
        columns += ["replay MiB", "step check: batch, correction MiB"]
    exact = any("exact_peak" in r for r in rows)
    if exact:
        columns += ["peak is the step's"]
    columns += ["rule MiB", "rule err", "est s", "full-peak pred MiB"]
    merged = any("run" in r for r in rows)  # benchmarks.tools.merge_results: which run measured the row
    if merged:
        columns += ["run"]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for r in rows:
        if "error_text" in r:
            lines.append(f"| {r['case']} | - | failed: {r['error_text']} |")
            continue
        runs = r.get("measured_runs") or [r["measured_bytes"]]
        spread = f"{_mib(min(runs))}-{_mib(max(runs))}" if len(runs) > 1 else "-"
        case = r["case"] + (" (outside zoo)" if r["case"] in OUTSIDE_CASES else "")
        cells = [
            case,
            str(r["batch_size"]),
            r["method"],
            _mib(r["predicted_bytes"]),
            _mib(r["measured_bytes"]),
            spread,
            _pct(r["error"]),
        ]
        if upper:
            cells += [_mib(r.get("predicted_upper_bytes")), "yes" if r.get("upper_covers_runs") else "NO"]
        if steady:
            cells += [_mib(r.get("measured_steady_bytes")), _pct(r.get("error_steady"))]
        if checked:
            offset = r.get("step_check_offset_bytes")
            replay = r["predicted_bytes"] - offset if offset is not None else None
            check = f"{r['step_check_batch_size']}, {offset / 2**20:+.1f}" if offset is not None else "not run"
            cells += [_mib(replay), check]
        if exact:
            cells += ["yes" if r.get("exact_peak") else "NO (a floor)"]
        cells += [
            _mib(r["rule_of_thumb_bytes"]),
            _pct(r["rule_error"]),
            f"{r['estimate_s']:.2f}",
            _mib(r["predicted_peak_bytes"]),
        ]
        if merged:
            cells.append(r.get("run", "-"))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Summary", "", "| estimator | n | median abs error | worst abs error |", "|---|---|---|---|"]
    for key, value in summary.items():
        if value.get("n") and "median_abs" in value:
            lines.append(f"| {key} | {value['n']} | {value['median_abs']:.1%} | {value['worst_abs']:.1%} |")
    lean = summary.get("lean")
    if lean:
        lines += [
            "",
            f"Under the truth: {lean['under']} of {lean['n']} models; over it: {lean['over']} "
            f"(the larger side {lean['larger_side_share']:.0%}).",
        ]
    covered = summary.get("upper_bound_covers_every_run")
    if covered:
        lines += [
            "",
            f"The upper bound is at or above every measured run for {covered['covered']} of {covered['n']} models.",
        ]
        if "median_margin_over_largest_run" in covered:
            lines.append(
                f"It lies {covered['median_margin_over_largest_run']:+.1%} above the largest run at the median, "
                f"{covered['largest_margin_over_largest_run']:+.1%} at most (what planning with it gives away)."
            )
    notes = sorted({note for r in rows for note in r.get("notes", [])})
    if notes:
        lines += ["", "Estimator notes:"] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"
