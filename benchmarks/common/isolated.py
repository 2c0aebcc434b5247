"""One benchmark worker in a fresh Python process, its result read from the last JSON line it prints.

The accuracy benchmarks measure allocators that keep memory across models (TensorFlow's
BFC regions, CUDA's caching allocator), so every measurement runs in a process of its own:

    python -m benchmarks.suites.keras_accuracy --worker mlp --part measure

:func:`run_worker` starts such a worker from the repository root and returns the record
it printed last; a worker that fails or times out gives a record saying why, so one
broken case never stops a benchmark.

Example:
    >>> record = run_worker("json.tool", ["--help"], timeout=60)  # prints usage, no JSON line
    >>> sorted(record)
    ['error_text']
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from benchmarks.common import paths

__all__ = ["ROOT", "run_worker"]

#: The repository root: workers run from here, so ``benchmarks`` and the package import from this checkout.
ROOT = str(paths.ROOT)


def run_worker(
    module: str,
    arguments: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 900,
    cwd: str = ROOT,
) -> dict[str, Any]:
    """Runs ``python -m module *arguments`` in a fresh process; returns the last line of its output that is a JSON object.

    Args:
        module: The module to run (``benchmarks.suites.keras_accuracy``).
        arguments: Its command-line arguments.
        env: The whole environment of the process (default: this process's).
        timeout: Seconds before the process is killed.
        cwd: Where it runs (default: the repository root).

    Returns:
        The worker's record, or ``{"error_text": ...}``: the timeout, or the last line of its
        standard error (or output) when it printed no JSON object.
    """
    command = [sys.executable, "-m", module, *arguments]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return {"error_text": f"timeout after {timeout:g}s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.returncode}, no output"]
    return {"error_text": last[0][:300]}
