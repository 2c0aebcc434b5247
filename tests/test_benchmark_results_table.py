"""benchmarks/README.md names every committed result, and every result it names is committed.

The tables' "result" columns hold paths under ``benchmarks/results/`` in backticks; ``name.{json,md}`` stands for
``name.json`` and ``name.md``.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "benchmarks" / "README.md"
RESULTS = ROOT / "benchmarks" / "results"


def expand(token: str) -> list[str]:
    """``a/{b,c}.{json,md}`` -> ``a/b.json, a/b.md, a/c.json, a/c.md``."""
    parts = re.split(r"(\{[^}]*\})", token)
    choices = [part[1:-1].split(",") if part.startswith("{") else [part] for part in parts]
    return ["".join(combo) for combo in itertools.product(*choices)]


def table_results(text: str) -> dict[str, int]:
    """Every path in a "result" column of a Markdown table, with the line that names it."""
    named: dict[str, int] = {}
    columns: list[int] = []
    previous = ""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            columns, previous = [], line
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if re.fullmatch(r"[-:| ]+", line):  # the separator: the line before it is the header
            header = [cell.strip().lower() for cell in re.split(r"(?<!\\)\|", previous.strip().strip("|"))]
            columns = [i for i, name in enumerate(header) if "result" in name]
        elif columns:
            for index in columns:
                if index < len(cells):
                    for token in re.findall(r"`([^`]+)`", cells[index]):
                        for path in expand(token):
                            named.setdefault(path, number)
        previous = line
    return named


def test_expand_and_the_table_reader():
    assert expand("a/{b,c}.{json,md}") == ["a/b.json", "a/b.md", "a/c.json", "a/c.md"]
    text = "| suite | command | result |\n|---|---|---|\n| x | `run 0\\|1` | `s/h.{json,md}`, `s/h.log` |\n\nprose `s/not.md`\n"
    assert table_results(text) == {"s/h.json": 3, "s/h.md": 3, "s/h.log": 3}


def test_every_result_file_is_in_the_readme_table_and_every_table_entry_exists():
    if not README.exists():
        pytest.skip("benchmarks/README.md is not in this checkout")
    named = table_results(README.read_text(encoding="utf-8"))
    committed = {path.relative_to(RESULTS).as_posix() for path in RESULTS.rglob("*") if path.is_file()}
    missing_from_table = sorted(committed - set(named))
    missing_files = sorted(f"{path} (README line {line})" for path, line in named.items() if path not in committed)
    assert not missing_from_table, f"results no table of benchmarks/README.md names: {missing_from_table}"
    assert not missing_files, f"benchmarks/README.md names results that are not there: {missing_files}"
