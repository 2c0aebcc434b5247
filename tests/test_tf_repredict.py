"""The comparison and rendering of benchmarks/tools/tf_repredict.py, on made-up rows (no TensorFlow)."""

from __future__ import annotations

from benchmarks.tools.tf_repredict import compare, summary, to_markdown

MiB = 2**20


def test_compare_takes_the_committed_truth_and_checks_the_new_bound_against_the_largest_run() -> None:
    committed = {
        "case": "m",
        "measured_bytes": 100 * MiB,
        "measured_runs": [98 * MiB, 100 * MiB, 104 * MiB],
        "predicted_bytes": 77 * MiB,
    }
    line = compare(committed, {"predicted_bytes": 99 * MiB, "predicted_upper_bytes": 103 * MiB})
    assert line["truth"] == 100 * MiB and line["largest_run"] == 104 * MiB
    assert round(line["old_error"], 4) == -0.23 and round(line["new_error"], 4) == -0.01
    assert line["new_upper_covers"] is False  # 103 < the largest run, 104
    assert (
        compare({**committed, "measured_runs": []}, {"predicted_bytes": 1, "predicted_upper_bytes": 100 * MiB})[
            "new_upper_covers"
        ]
        is True
    )  # no runs listed: the truth itself is the largest


def test_the_markdown_says_it_is_a_screen_and_carries_the_summary() -> None:
    lines = [
        {
            "case": "a",
            "truth": 100 * MiB,
            "largest_run": 101 * MiB,
            "old_error": -0.2,
            "new_error": 0.01,
            "new_upper_covers": True,
            "predicted_bytes": 101 * MiB,
        },
        {
            "case": "b",
            "truth": 10 * MiB,
            "largest_run": 12 * MiB,
            "old_error": 0.05,
            "new_error": -0.08,
            "new_upper_covers": False,
            "predicted_bytes": 9.2 * MiB,
        },
    ]
    assert summary(lines) == {
        "cases": 2,
        "committed_median": 0.125,
        "committed_worst": 0.2,
        "new_median": 0.045,
        "new_worst": 0.08,
        "new_upper_covers": 1,
    }
    text = to_markdown(lines, {"against": "x.json"})
    assert "not an accuracy result" in text.splitlines()[0]
    assert "| b | 10.0 | 12.0 | +5.0% | 9.2 | -8.0% | NO |" in text
    assert "new median 4.5%, worst 8.0%" in text
