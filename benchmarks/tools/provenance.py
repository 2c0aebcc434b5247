"""Which code a benchmark result came from: the commit, and whether the working tree differed from it.

Every committed result names its commit. A run made with uncommitted changes says
so (``+changes``), because its figures then belong to no commit. Results files do
not count as changes: one run of a benchmark rewrites them before the next starts,
and they hold no code.

Example:
    >>> stamp = commit_stamp()
    >>> stamp == "unknown" or len(stamp.split()[0]) >= 7
    True
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common import paths

__all__ = ["ROOT", "RESULTS_PATHS", "changed_files", "head_commit", "commit_stamp", "file_commit", "write_result"]

#: The repository root (the folder above ``benchmarks/``).
ROOT = paths.ROOT
#: Changes under these paths do not mark a result ``+changes``.
RESULTS_PATHS = ("benchmarks/results",)


def _git(root: Path, *args: str) -> str:
    """``git args`` in ``root``; raises ``OSError`` or ``CalledProcessError`` outside git."""
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=30)
    return done.stdout


def changed_files(*paths: str, root: Path = ROOT) -> list[str]:
    """Tracked files under ``paths`` (default: the whole tree) that differ from the commit, results excluded.

    Returns an empty list outside git.
    """
    pathspec = list(paths) or ["."]
    excluded = [f":(exclude){path}" for path in RESULTS_PATHS]
    try:
        text = _git(root, "status", "--porcelain", "--untracked-files=no", "--", *pathspec, *excluded)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line[3:] for line in text.splitlines() if line.strip()]


def head_commit(root: Path = ROOT) -> str | None:
    """The checked-out commit's short hash; ``None`` outside git."""
    try:
        return _git(root, "rev-parse", "--short", "HEAD").strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def commit_stamp(*paths: str, root: Path = ROOT) -> str:
    """The checked-out commit, marked ``+changes`` when tracked files under ``paths`` differ; ``unknown`` outside git."""
    head = head_commit(root)
    if head is None:
        return "unknown"
    return head + (" +changes" if changed_files(*paths, root=root) else "")


def file_commit(path: str, root: Path = ROOT) -> str:
    """The last commit that changed ``path`` (a committed result a later run reads), ``+changes`` if it differs now.

    ``uncommitted`` for a file git has no commit of; ``unknown`` outside git.
    """
    try:
        last = _git(root, "log", "-1", "--format=%h", "--", path).strip()
        dirty = _git(root, "status", "--porcelain", "--", path).strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (last or "uncommitted") + (" +changes" if dirty else "")


def write_result(out_dir: str, name: str, record: dict[str, Any], markdown: str) -> str:
    """Writes a benchmark's result as ``<out_dir>/<name>.json`` (the record) and ``.md`` (its table).

    Returns:
        The path without extension.

    Example:
        >>> import tempfile
        >>> stem = write_result(tempfile.mkdtemp(), "run", {"meta": {}, "rows": []}, "# run\\n")
        >>> open(stem + ".json").read().startswith("{"), open(stem + ".md").read()
        (True, '# run\\n')
    """
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, name)
    with open(stem + ".json", "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=2)
    with open(stem + ".md", "w", encoding="utf-8") as handle:
        handle.write(markdown)
    return stem
