"""benchmarks.investigations.keras_recorded_checks: re-estimates judged against recorded step checks and truth runs."""

from __future__ import annotations

import json

import pytest

from benchmarks.investigations.keras_recorded_checks import FIRST_RUNS, compare, recorded_rows, summarize, to_markdown

MiB = 2**20


def _recorded(case: str, predicted: float, upper: float, runs: list[float]) -> dict:
    truth = sorted(runs)[len(runs) // 2]
    return {
        "case": case,
        "predicted_bytes": int(predicted * MiB),
        "predicted_upper_bytes": int(upper * MiB),
        "measured_runs": [int(r * MiB) for r in runs],
        "error": (predicted - truth) / truth,
        "step_check_runs": [1, 2, 3],
        "step_check_batch_size": 4,
    }


def _now(case: str, predicted: float, upper: float, offset: float = 0.0) -> dict:
    return {
        "case": case,
        "batch_size": 8,
        "predicted_bytes": int(predicted * MiB),
        "predicted_upper_bytes": int(upper * MiB),
        "step_check_offset_bytes": int(offset * MiB),
        "replay_counted_bytes": int((predicted - offset) * MiB),
    }


def test_a_re_estimate_is_judged_against_the_recorded_truth_runs():
    row = compare(_now("mlp", 11.0, 12.0, offset=1.0), _recorded("mlp", 9.0, 10.5, [10.0, 9.0, 11.0]))
    assert row["measured_bytes"] == 10 * MiB  # the median run
    assert row["error"] == pytest.approx(0.1)
    assert row["replay_alone_error"] == pytest.approx(0.0)  # 11 - 1 MiB of the check's offset
    assert row["upper_covers_runs"] and row["upper_margin"] == pytest.approx(12 / 11 - 1)
    assert row["recorded_error"] == pytest.approx(-0.1)


def test_the_summary_names_the_cases_over_15_percent_and_the_upper_bounds_misses():
    rows = [
        compare(_now("a", 10.0, 12.0), _recorded("a", 10.0, 9.0, [10.0, 10.0, 11.0])),
        compare(_now("b", 13.0, 13.5), _recorded("b", 10.0, 14.0, [10.0, 10.0, 14.0])),
        compare({"case": "c", "error_text": "no such case"}, _recorded("c", 1.0, 1.0, [1.0, 1.0, 1.0])),
    ]
    summary = summarize(rows)
    assert summary["n"] == 2  # the failed case is not summarized
    assert summary["over_15_percent_now"] == ["b"]
    assert summary["upper_misses_now"] == ["b"] and summary["upper_covers_now"] == 1
    assert summary["upper_covers_recorded"] == 1  # "a" was recorded under its largest run
    text = to_markdown(rows, summary, {"commit": "abc"})
    assert "| c | - |" in text and "misses now: b" in text


def test_only_rows_with_a_step_check_and_truth_runs_are_replayed(tmp_path):
    path = tmp_path / "recorded.json"
    rows = [_recorded("a", 1, 1, [1, 1, 1]), {"case": "b", "measured_runs": [1]}, {"case": "c", "error_text": "x"}]
    path.write_text(json.dumps({"meta": {"TF_ENABLE_ONEDNN_OPTS": "0"}, "rows": rows}))
    meta, kept = recorded_rows(str(path))
    assert meta["TF_ENABLE_ONEDNN_OPTS"] == "0" and [r["case"] for r in kept] == ["a"]
    assert FIRST_RUNS == 3  # the adaptive check measures 3 runs before it asks for more
