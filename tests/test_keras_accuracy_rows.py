"""benchmarks.suites.keras_accuracy rows: a truth of 0 bytes (oneDNN on, a model of tensors under 256 KiB)."""

from benchmarks.common.keras_results import summarize, to_markdown
from benchmarks.suites.keras_accuracy import relative_error


def _row(case, predicted, runs):
    measured = sorted(runs)[len(runs) // 2]
    return {
        "case": case,
        "batch_size": 32,
        "method": "tf-graph",
        "predicted_bytes": predicted,
        "predicted_upper_bytes": predicted + 2**20,
        "measured_bytes": measured,
        "measured_runs": runs,
        "rule_of_thumb_bytes": 2 * predicted,
        "step_check_offset_bytes": 0,
        "step_check_batch_size": 32,
        "estimate_s": 1.0,
        "predicted_peak_bytes": predicted,
        "upper_covers_runs": predicted + 2**20 >= max(runs),
        "error": relative_error(predicted, measured),
        "rule_error": relative_error(2 * predicted, measured),
    }


def test_a_model_the_allocator_counted_nothing_of_stays_in_the_table_outside_the_medians():
    rows = [_row("counted", 110 * 2**20, [100 * 2**20] * 3), _row("tiny", 2**18, [0, 0, 0])]
    summary = summarize(rows)
    assert rows[1]["error"] is None
    assert summary["ours"] == {"n": 1, "median_abs": 0.1, "worst_abs": 0.1}
    assert summary["lean"]["n"] == 1 and summary["upper_bound_covers_every_run"]["covered"] == 2
    table = to_markdown("tensorflow", rows, summary, {"truth_window": "fit"})
    tiny = next(line for line in table.splitlines() if line.startswith("| tiny |"))
    assert "| - |" in tiny and "| +10.0% |" in table


def test_a_run_of_only_such_models_is_summarized_without_medians():
    summary = summarize([_row("tiny", 2**18, [0, 0, 0])])
    assert summary["ours"] == {"n": 0} and summary["upper_bound_covers_every_run"] == {"n": 1, "covered": 1}
