"""The MLP row of ``benchmarks/suites/seeds.py``: ``nnmem calc`` and ``nnmem estimate`` against two real CPU steps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # benchmarks/ is not an installed package
    sys.path.insert(0, str(_ROOT))

from benchmarks.suites import seeds  # noqa: E402


def test_mlp_seed_row_napkin_and_trace_match_measured(monkeypatch):
    monkeypatch.chdir(_ROOT)  # the commands name examples/models.py relative to the repository root
    napkin = seeds.nnmem_json(seeds.COMMANDS["mlp_napkin"])
    trace = seeds.nnmem_json(seeds.COMMANDS["mlp_trace"])
    measured = seeds.measure_mlp()["peak_bytes"]
    assert napkin["command"] == "nnmem calc --layers 1000,100,100,100,100,10 -b 256 --optimizer sgd --device cpu"
    assert trace["method"] == "trace"
    assert abs(trace["peak_bytes"] - measured) <= 0.02 * measured
    assert abs(napkin["peak_bytes"] - measured) <= 0.02 * measured
    # the seed's activations-only count misses the input batch and parameters + gradients
    assert measured > seeds.SEED_MLP["bytes"]
