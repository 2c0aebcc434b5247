"""benchmarks.investigations.keras_check_statistic: other statistics of the step check's runs, on made-up rows."""

from benchmarks.investigations.keras_check_statistic import errors_by_statistic, summarize


def _row(case, runs, measured, batch=8, checked_at=8):
    runs = list(runs)
    median = sorted(runs)[len(runs) // 2]
    return {
        "case": case,
        "batch_size": batch,
        "step_check_batch_size": checked_at,
        "step_check_runs": runs,
        "predicted_bytes": median + 10,  # the replay's share of the estimate stays as it was
        "measured_bytes": measured,
    }


def test_each_statistic_replaces_the_median_run_and_rows_checked_at_another_batch_are_left_out():
    bimodal = _row("gru", [60, 60, 60, 60, 140, 140, 140], measured=150)
    elsewhere = _row("big", [100, 100, 100], measured=100, checked_at=4)
    errors = errors_by_statistic([bimodal, elsewhere])
    assert [case for case, _ in errors["median (until 2026-11-29)"]] == ["gru"]
    assert errors["median (until 2026-11-29)"][0][1] == (70 - 150) / 150
    assert errors["upper median (since)"][0][1] == (150 - 150) / 150  # the 5th of 7 runs: the upper mode
    assert errors["largest run"][0][1] == 0.0
    assert errors["mean"][0][1] == ((60 * 4 + 140 * 3) / 7 + 10 - 150) / 150


def test_summary_counts_sides_and_names_the_worst_case():
    summary = summarize([("a", -0.02), ("b", 0.05), ("c", -0.3)])
    assert (summary["under"], summary["over"], summary["worst_case"], summary["worst_error"]) == (2, 1, "c", -0.3)
    assert summary["median_abs_error"] == 0.05
