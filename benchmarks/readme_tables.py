"""Renders the README's accuracy table from a committed accuracy result.

Usage::

    python -m benchmarks.readme_tables [benchmarks/results/cpu.json]

Prints Markdown: per zoo case, the median and worst absolute error over its
optimizers and precisions, for nnmem_callbacks, the seeds' rule of thumb and
PyTorch's MemTracker, and an overall summary. Nothing is computed that the
JSON does not hold.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

DEFAULT = Path(__file__).resolve().parent / "results" / "cpu.json"


def _cell(errors: Sequence[float | None]) -> str:
    values = [abs(e) for e in errors if e is not None]
    missing = sum(1 for e in errors if e is None)
    if not values:
        return f"crash x{missing}" if missing else "-"
    text = f"{statistics.median(values):.1f}% / {max(values):.1f}%"
    return text + (f" (crash x{missing})" if missing else "")


def render(result: dict[str, Any]) -> str:
    """The per-case table and the summary lines, as Markdown."""
    rows = result["rows"]
    cases: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        cases.setdefault(row["case"], []).append(row)
    lines = [
        "| model | runs | nnmem_callbacks median / worst | rule of thumb median / worst | MemTracker median / worst |",
        "|---|---:|---|---|---|",
    ]
    for case, group in cases.items():
        name = case + (" (data-dependent: fallback)" if group[0].get("data_dependent") else "")
        lines.append(
            f"| {name} | {len(group)} | {_cell([r.get('error_pct') for r in group])} | "
            f"{_cell([r.get('rule_of_thumb_error_pct') for r in group])} | "
            f"{_cell([r.get('memtracker_error_pct') for r in group])} |"
        )
    static = [r for r in rows if not r.get("data_dependent")]
    dynamic = [r for r in rows if r.get("data_dependent")]
    lines.append(
        f"| **all static-shape runs** | {len(static)} | **{_cell([r.get('error_pct') for r in static])}** | "
        f"{_cell([r.get('rule_of_thumb_error_pct') for r in static])} | {_cell([r.get('memtracker_error_pct') for r in static])} |"
    )
    lines.append(
        f"| **data-dependent runs** | {len(dynamic)} | **{_cell([r.get('error_pct') for r in dynamic])}** | "
        f"{_cell([r.get('rule_of_thumb_error_pct') for r in dynamic])} | {_cell([r.get('memtracker_error_pct') for r in dynamic])} |"
    )
    seconds = [r["estimate_s"] for r in rows if r.get("estimate_s") is not None]
    meta = result.get("meta", {})
    lines.append("")
    lines.append(
        f"Device {meta.get('device', 'cpu')}, torch {meta.get('torch', '?')}, {meta.get('date', '?')}; "
        f"median estimate time {statistics.median(seconds):.2f} s (each case in a fresh process, first call included)."
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = Path(args[0]) if args else DEFAULT
    print(render(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
