"""Renders the README's accuracy table from a committed accuracy result.

Usage::

    python -m benchmarks.tools.readme_tables [benchmarks/results/accuracy/zen3-avx2.json]

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

from benchmarks.common.paths import result_dir

__all__ = ["DEFAULT", "group_is_dynamic", "render", "main"]

#: The result the README's PyTorch accuracy table is rendered from.
DEFAULT = result_dir("accuracy") / "zen3-avx2.json"


def _cell(errors: Sequence[float | None]) -> str:
    values = [abs(e) for e in errors if e is not None]
    missing = sum(1 for e in errors if e is None)
    if not values:
        return f"crash x{missing}" if missing else "-"
    text = f"{statistics.median(values):.1f}% / {max(values):.1f}%"
    return text + (f" (crash x{missing})" if missing else "")


def group_is_dynamic(rows: list[dict[str, Any]]) -> bool:
    return bool(rows[0].get("data_dependent"))


def _not_runnable(row: dict[str, Any]) -> bool:
    """The estimator refused a kernel the host cannot run, and the real step failed too."""
    return row.get("method") == "unsupported" and row.get("measured") is None


def _refusal(rows: list[dict[str, Any]]) -> str:
    precisions = sorted({str(r.get("precision")) for r in rows if _not_runnable(r)})
    return "the real step cannot run in " + ", ".join(precisions)


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
    for case, all_rows in cases.items():
        name = case + (" (data-dependent: fallback)" if group_is_dynamic(all_rows) else "")
        group = [r for r in all_rows if not _not_runnable(r)]
        refused = len(all_rows) - len(group)
        runs = f"{len(group)}" + (f" (+{refused} refused: {_refusal(all_rows)})" if refused else "")
        lines.append(
            f"| {name} | {runs} | {_cell([r.get('error_pct') for r in group])} | "
            f"{_cell([r.get('rule_of_thumb_error_pct') for r in group])} | "
            f"{_cell([r.get('memtracker_error_pct') for r in group])} |"
        )
    static = [r for r in rows if not r.get("data_dependent") and not _not_runnable(r)]
    dynamic = [r for r in rows if r.get("data_dependent") and not _not_runnable(r)]
    refused = [r for r in rows if _not_runnable(r)]
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
    if refused:
        lines.append(
            f"{len(refused)} run(s) refused with `UnsupportedKernelError`, where the real step fails on this host too "
            f"({_refusal(refused)}): an agreement, not an error."
        )
        lines.append("")
    lines.append(
        f"Device {meta.get('device', 'cpu')}, torch {meta.get('torch', '?')}, {meta.get('date', '?')}; "
        f"median estimate time {statistics.median(seconds):.2f} s (each case in a fresh process, first call included)."
    )
    if meta.get("kernel_fingerprint"):
        lines.append(f"Host kernel fingerprint: {meta['kernel_fingerprint']}.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = Path(args[0]) if args else DEFAULT
    print(render(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
