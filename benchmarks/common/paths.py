"""Where the repository and the committed results are, for every benchmark module.

Example:
    >>> (ROOT / "benchmarks" / "results") == RESULTS
    True
    >>> result_dir("accuracy").relative_to(ROOT).as_posix()
    'benchmarks/results/accuracy'
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT", "RESULTS", "result_dir"]

#: The repository root: workers run from here, so ``benchmarks`` and the package import from this checkout.
ROOT = Path(__file__).resolve().parents[2]
#: The committed results: one folder per suite, one file per host (``benchmarks/README.md``).
RESULTS = ROOT / "benchmarks" / "results"


def result_dir(suite: str) -> Path:
    """The folder of a suite's results (``benchmarks/results/<suite>``)."""
    return RESULTS / suite
