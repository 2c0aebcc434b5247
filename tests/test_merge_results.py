"""benchmarks.tools.merge_results: one table from runs of disjoint case sets, refusing runs that are not comparable."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from benchmarks.tools.merge_results import main, merge

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
FIRST = "keras_tensorflow_cpu_avx2_subset_onednn0.json"
SECOND = "keras_tensorflow_cpu_avx2_subset_b_onednn0.json"
OTHER_MODE = "keras_tensorflow_cpu_avx2_subset_onednn1.json"


def _load(name: str) -> dict:
    path = RESULTS / name
    if not path.exists():
        pytest.skip(f"{name} is not in benchmarks/results")
    return json.loads(path.read_text())


def test_the_summary_covers_every_row_of_every_run_and_each_row_names_its_run():
    first, second = _load(FIRST), _load(SECOND)
    merged = merge({FIRST: first, SECOND: second})
    rows = merged["rows"]
    assert [r["case"] for r in rows] == [r["case"] for r in first["rows"] + second["rows"]]
    errors = [abs(r["error"]) for r in first["rows"] + second["rows"]]
    assert merged["summary"]["ours"]["n"] == len(errors)
    assert merged["summary"]["ours"]["median_abs"] == pytest.approx(statistics.median(errors))
    assert merged["summary"]["ours"]["worst_abs"] == pytest.approx(max(errors))
    commits = {FIRST: first["meta"]["commit"], SECOND: second["meta"]["commit"]}
    for row, source in zip(rows, [FIRST] * len(first["rows"]) + [SECOND] * len(second["rows"])):
        assert row["run"] == f"{source} ({commits[source]})"
    assert FIRST in merged["meta"]["merged_from"] and SECOND in merged["meta"]["merged_from"]


def test_runs_of_another_mode_or_overlapping_cases_are_refused():
    first = _load(FIRST)
    with pytest.raises(ValueError, match="TF_ENABLE_ONEDNN_OPTS"):
        merge({FIRST: first, OTHER_MODE: _load(OTHER_MODE)})
    with pytest.raises(ValueError, match="is in both"):
        merge({FIRST: first, "copy.json": first})
    with pytest.raises(ValueError, match="no results"):
        merge({})


def test_the_command_writes_the_table_with_a_run_column(tmp_path, capsys):
    _load(FIRST), _load(SECOND)
    out = tmp_path / "merged"
    assert main([str(out), str(RESULTS / FIRST), str(RESULTS / SECOND)]) == 0
    table = (tmp_path / "merged.md").read_text()
    assert "| run |" in table and f"{SECOND} (" in table
    assert json.loads((tmp_path / "merged.json").read_text())["summary"]["ours"]["n"] > 0
    with pytest.raises(SystemExit):
        main([str(out), str(RESULTS / FIRST), str(RESULTS / FIRST)])
    assert "given twice" in capsys.readouterr().err
