"""benchmarks.tools.merge_results: one table from runs of disjoint case sets, refusing runs that are not comparable.

The runs are the sets a committed merged result was joined from (each row names its run), split back apart.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from benchmarks.tools.merge_results import SAME_IN_EVERY_RUN, main, merge

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "keras_tensorflow_cpu"
MERGED = "zen4-avx512_onednn0.json"
OTHER_MODE = "zen4-avx512_onednn1.json"


def _runs(name: str) -> dict[str, dict]:
    """The runs a committed merged result was joined from, keyed by their file names, in the merged order."""
    path = RESULTS / name
    if not path.exists():
        pytest.skip(f"{name} is not in benchmarks/results/keras_tensorflow_cpu")
    merged = json.loads(path.read_text())
    runs: dict[str, dict] = {}
    for row in merged["rows"]:
        file_name, commit = row["run"].rsplit(" (", 1)
        meta = {field: merged["meta"][field] for field in SAME_IN_EVERY_RUN if field in merged["meta"]}
        run = runs.setdefault(file_name, {"meta": {**meta, "commit": commit.rstrip(")")}, "rows": []})
        run["rows"].append({k: v for k, v in row.items() if k != "run"})
    assert len(runs) > 1, f"{name} was not merged from several runs"
    return runs


def test_the_summary_covers_every_row_of_every_run_and_each_row_names_its_run():
    runs = _runs(MERGED)
    (first_name, first), (second_name, second) = list(runs.items())[:2]
    merged = merge({first_name: first, second_name: second})
    rows = merged["rows"]
    assert [r["case"] for r in rows] == [r["case"] for r in first["rows"] + second["rows"]]
    errors = [abs(r["error"]) for r in first["rows"] + second["rows"]]
    assert merged["summary"]["ours"]["n"] == len(errors)
    assert merged["summary"]["ours"]["median_abs"] == pytest.approx(statistics.median(errors))
    assert merged["summary"]["ours"]["worst_abs"] == pytest.approx(max(errors))
    commits = {first_name: first["meta"]["commit"], second_name: second["meta"]["commit"]}
    for row, source in zip(rows, [first_name] * len(first["rows"]) + [second_name] * len(second["rows"])):
        assert row["run"] == f"{source} ({commits[source]})"
    assert first_name in merged["meta"]["merged_from"] and second_name in merged["meta"]["merged_from"]


def test_merging_the_runs_again_gives_the_committed_table():
    committed = json.loads((RESULTS / MERGED).read_text()) if (RESULTS / MERGED).exists() else None
    merged = merge(_runs(MERGED))
    assert merged["rows"] == committed["rows"]
    # the committed table predates the summary's count of models under and over the truth ("lean", 2026-11-28)
    assert {key: merged["summary"][key] for key in committed["summary"]} == committed["summary"]
    assert merged["summary"]["lean"]["n"] == merged["summary"]["ours"]["n"]


def test_runs_of_another_mode_or_overlapping_cases_are_refused():
    first_name, first = next(iter(_runs(MERGED).items()))
    other_name, other = next(iter(_runs(OTHER_MODE).items()))
    with pytest.raises(ValueError, match="TF_ENABLE_ONEDNN_OPTS"):
        merge({first_name: first, f"other_{other_name}": other})
    with pytest.raises(ValueError, match="is in both"):
        merge({first_name: first, "copy.json": first})
    with pytest.raises(ValueError, match="no results"):
        merge({})


def test_the_command_writes_the_table_with_a_run_column(tmp_path, capsys):
    (first_name, first), (second_name, second) = list(_runs(MERGED).items())[:2]
    for name, run in ((first_name, first), (second_name, second)):
        (tmp_path / name).write_text(json.dumps(run))
    out = tmp_path / "merged"
    assert main([str(out), str(tmp_path / first_name), str(tmp_path / second_name)]) == 0
    table = (tmp_path / "merged.md").read_text()
    assert "| run |" in table and f"{second_name} (" in table
    assert json.loads((tmp_path / "merged.json").read_text())["summary"]["ours"]["n"] > 0
    with pytest.raises(SystemExit):
        main([str(out), str(tmp_path / first_name), str(tmp_path / first_name)])
    assert "given twice" in capsys.readouterr().err


def test_a_merged_result_merges_again_keeping_where_each_row_came_from():
    runs = _runs(MERGED)
    names = list(runs)
    first_two = merge({name: runs[name] for name in names[:2]})
    rest = {name: runs[name] for name in names[2:]} or {"extra.json": {"meta": runs[names[0]]["meta"], "rows": []}}
    again = merge({"first_two.json": first_two, **rest})
    assert again["rows"] == merge(runs)["rows"]  # every row still names its own run, not "first_two.json"
    assert "first_two.json" not in again["meta"]["merged_from"]
    assert all(name in again["meta"]["merged_from"] for name in names)
