"""One Keras accuracy table from several runs of the same benchmark on the same host and mode.

A slow host may not measure every case in one session; ``keras_accuracy --cases``
then runs them in sets, each written to its own file. This joins the sets into one
table and one summary (median and worst over every case), without measuring
anything: every row names the run that measured it (its file and commit) in a
``run`` column, and the header lists the runs with their dates.

    python -m benchmarks.tools.merge_results benchmarks/results/keras_tensorflow_cpu/zen4-avx512_onednn0 \\
        benchmarks/results/keras_tensorflow_cpu/zen4-avx512-p1_onednn0.json \\
        benchmarks/results/keras_tensorflow_cpu/zen4-avx512-p2_onednn0.json \\
        benchmarks/results/keras_tensorflow_cpu/zen4-avx512-p3_onednn0.json

(the sets run as ``--host-tag zen4-avx512-p1`` and so on; once merged, the set files leave the tree:
``benchmarks/README.md`` lists one current result per suite and host).

The runs must agree on what makes their figures comparable (backend, device, CPU,
instruction set, threads, TensorFlow and Keras versions, oneDNN mode, repeats);
otherwise the merge stops and names the field that differs. A case measured by two
runs stops it too: choosing one would be choosing a result.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from benchmarks.common.keras_results import summarize, to_markdown
from benchmarks.tools.provenance import write_result

__all__ = ["SAME_IN_EVERY_RUN", "merge", "main"]

#: Header fields that must be equal in every merged run.
SAME_IN_EVERY_RUN = (
    "backend",
    "device",
    "cpu",
    "isa",
    "cpu_threads",
    "keras",
    "tensorflow",
    "TF_ENABLE_ONEDNN_OPTS",
    "repeats",
    "python",
)


def merge(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The merged record (``meta``, ``summary``, ``rows``) of several results, keyed by their file names.

    Raises:
        ValueError: when the runs differ in a field of :data:`SAME_IN_EVERY_RUN`, or measured the same case.

    Example:
        >>> row = {"case": "mlp", "error": 0.05, "rule_error": 0.4, "measured_bytes": 1, "measured_runs": [1]}
        >>> one = {"meta": {"backend": "tensorflow", "commit": "aaa", "date": "d1"}, "rows": [row]}
        >>> two = {"meta": {"backend": "tensorflow", "commit": "bbb", "date": "d2"},
        ...        "rows": [dict(row, case="lstm", error=-0.1)]}
        >>> merged = merge({"a.json": one, "b.json": two})
        >>> [(r["case"], r["run"]) for r in merged["rows"]], merged["summary"]["ours"]["worst_abs"]
        ([('mlp', 'a.json (aaa)'), ('lstm', 'b.json (bbb)')], 0.1)
        >>> again = merge({"ab.json": merged, "c.json": dict(two, rows=[dict(row, case="gru")])})  # a merged result
        >>> [r["run"] for r in again["rows"]]
        ['a.json (aaa)', 'b.json (bbb)', 'c.json (bbb)']
        >>> merge({"a.json": one, "c.json": dict(one, meta={"backend": "jax"})})
        Traceback (most recent call last):
        ...
        ValueError: the runs differ in backend: a.json has 'tensorflow', c.json has 'jax'; merge only runs of one host and mode
    """
    if not records:
        raise ValueError("no results to merge: give at least one results JSON")
    names = list(records)
    first = records[names[0]]["meta"]
    for name in names[1:]:
        meta = records[name]["meta"]
        for field in SAME_IN_EVERY_RUN:
            if first.get(field) != meta.get(field):
                raise ValueError(
                    f"the runs differ in {field}: {names[0]} has {first.get(field)!r}, {name} has "
                    f"{meta.get(field)!r}; merge only runs of one host and mode"
                )
    rows: list[dict[str, Any]] = []
    measured_by: dict[str, str] = {}
    for name in names:
        meta = records[name]["meta"]
        for row in records[name]["rows"]:
            if row["case"] in measured_by:
                raise ValueError(
                    f"case {row['case']!r} is in both {measured_by[row['case']]} and {name}; merge disjoint sets"
                )
            measured_by[row["case"]] = name
            # a result merged before keeps the run each of its rows came from
            rows.append({**row, "run": row.get("run") or f"{name} ({meta.get('commit', 'no commit')})"})
    merged_meta = {field: first[field] for field in SAME_IN_EVERY_RUN if field in first}
    merged_meta["cases"] = ",".join(r["case"] for r in rows)
    merged_meta["merged_from"] = "; ".join(
        records[name]["meta"].get("merged_from")
        or (
            f"{name}: {len(records[name]['rows'])} cases, commit {records[name]['meta'].get('commit')}, "
            f"{records[name]['meta'].get('date')}"
        )
        for name in names
    )
    notes = sorted(
        {
            note
            for name in names
            for note in (records[name]["meta"].get("notes", "").split(" | ") + [records[name]["meta"].get("note", "")])
            if note
        }
    )
    if notes:
        merged_meta["notes"] = " | ".join(notes)
    if "truth" in first:
        merged_meta["truth"] = first["truth"]
    return {"meta": merged_meta, "summary": summarize([r for r in rows if "error_text" not in r]), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the merged result's path without extension (.json and .md are written)")
    parser.add_argument("results", nargs="+", help="results JSON files written by benchmarks.suites.keras_accuracy")
    args = parser.parse_args(argv)
    records = {}
    for path in args.results:
        if os.path.basename(path) in records:
            parser.error(f"{os.path.basename(path)} is given twice; give each run's results once")
        with open(path, encoding="utf-8") as handle:
            records[os.path.basename(path)] = json.load(handle)
    try:
        merged = merge(records)
    except ValueError as error:
        parser.error(str(error))
    out_dir, name = os.path.split(args.out)
    write_result(
        out_dir or ".",
        name,
        merged,
        to_markdown(merged["meta"].get("backend", "?"), merged["rows"], merged["summary"], merged["meta"]),
    )
    print(json.dumps(merged["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
