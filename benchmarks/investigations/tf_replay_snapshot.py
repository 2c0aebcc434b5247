"""Question (2026-11-23): does a refactoring of the TensorFlow graph replay change any of its numbers?

A snapshot of the replay's numbers, before and after (the op-handler registry refactor, c79eb5a: identical in both
modes, ``benchmarks/results/investigations/tf_replay_snapshot/refactor_equivalence.md``). To check a change against
committed accuracy results instead, see :mod:`benchmarks.tools.repredict`.

    python -m benchmarks.investigations.tf_replay_snapshot --onednn 0 --out /tmp/before0.json
    python -m benchmarks.investigations.tf_replay_snapshot --onednn 1 --out /tmp/before1.json
    # ... refactor ...
    python -m benchmarks.investigations.tf_replay_snapshot --onednn 0 --out /tmp/after0.json --compare /tmp/before0.json

Each mode runs in a fresh process (``TF_ENABLE_ONEDNN_OPTS`` is read when TensorFlow
starts; with oneDNN off ``TF_CPU_ALLOCATOR_USE_BFC=true`` as in the accuracy benchmark).
Every case of :mod:`benchmarks.suites.keras_accuracy` (zoo and outside models) is estimated
twice: with the graph's own rules (``probe_kernels=False``) and with a fixed, made-up
kernel scratch for every op the probes would measure (so that the measured-scratch path
of the replay is exercised without running probes, whose measurements vary), and
without the step check (real steps, which vary too). The
snapshot holds the estimate's peak, allocator peak, upper bound, phase lines,
breakdowns, variability and notes, and the order the replay ran the ops in;
``--compare`` exits non-zero when any of it differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from typing import Any

from benchmarks.common.keras_cases import CASES
from benchmarks.common.keras_env import mode_environment

__all__ = ["run_cases", "main"]


class _FixedCurve:
    """A made-up scratch curve: deterministic bytes per sample from the probe's key."""

    def __init__(self, key: str) -> None:
        self.per_sample = 4096 * (1 + int(hashlib.sha1(key.encode()).hexdigest()[:4], 16) % 97)

    def at(self, samples: int) -> int:
        return self.per_sample * samples


def _fixed_measure(probes: dict[str, Any], batch_sizes: tuple[int, ...], **_: Any) -> tuple[dict[str, Any], Any]:
    from nnmem_callbacks.estimators.keras.tensorflow.probes import ProbeReport

    report = ProbeReport()
    report.probed = len(probes)
    return {name: _FixedCurve(probe.key()) for name, probe in probes.items()}, report


def _snapshot_estimate(estimate: Any) -> dict[str, Any]:
    extra = {k: v for k, v in estimate.extra.items() if k != "seconds"}
    return {
        "peak_bytes": int(estimate.peak_bytes),
        "peak_phase": estimate.peak_phase,
        "breakdown": {str(k): int(v) for k, v in estimate.breakdown.items()},
        "phases": [[p.phase, p.fixed_bytes, p.per_sample_bytes, p.min_batch, p.max_batch] for p in estimate.phases],
        "phase_breakdowns": {k: {str(a): int(b) for a, b in v.items()} for k, v in estimate.phase_breakdowns.items()},
        "variability": [
            estimate.variability.phase,
            estimate.variability.fixed_bytes,
            estimate.variability.per_sample_bytes,
        ]
        if estimate.variability is not None
        else None,
        "notes": [n for n in estimate.notes if "kernel scratch" not in n],
        "extra": extra,
    }


def run_cases(cases: list[str]) -> dict[str, Any]:
    import hashlib as _hashlib

    from benchmarks.common.keras_cases import build_case
    from nnmem_callbacks.estimators.keras.tensorflow import graph as tf_graph
    from nnmem_callbacks.estimators.keras.tensorflow import probes as tf_probes
    from nnmem_callbacks.keras import estimate_training

    orders: list[list[str]] = []
    original_replay = tf_graph.GraphReplayer.replay

    def recording_replay(self: Any, graph: Any, **kwargs: Any) -> Any:
        out = original_replay(self, graph, **kwargs)
        if kwargs.get("track_phases", True):
            orders.append(list(self.order))
        return out

    tf_graph.GraphReplayer.replay = recording_replay  # type: ignore[method-assign]
    snapshot: dict[str, Any] = {}
    for name in cases:
        model, x, y, batch = build_case(name)
        row: dict[str, Any] = {"batch_size": batch}
        for label, probe in (("rules", False), ("fixed_scratch", True)):
            orders.clear()
            saved = tf_probes.measure
            tf_probes.measure = _fixed_measure  # type: ignore[assignment]
            try:
                estimate = estimate_training(model, batch, x=x, y=y, probe_kernels=probe, check_steps=False)
            finally:
                tf_probes.measure = saved  # type: ignore[assignment]
            row[label] = _snapshot_estimate(estimate)
            row[label]["orders_sha1"] = [_hashlib.sha1("\n".join(o).encode()).hexdigest() for o in orders]
        snapshot[name] = row
        print(
            name,
            row["rules"]["extra"]["tf_allocator_peak_bytes"],
            row["fixed_scratch"]["extra"]["tf_allocator_peak_bytes"],
            flush=True,
        )
    return snapshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onednn", choices=("0", "1"), required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", help="a snapshot to compare with (exact equality)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.worker:
        env = {
            **os.environ,
            **mode_environment(args.onednn),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "KERAS_BACKEND": "tensorflow",
        }
        command = [
            sys.executable,
            "-m",
            "benchmarks.investigations.tf_replay_snapshot",
            "--worker",
            *(sys.argv[1:] if argv is None else argv),
        ]
        return subprocess.run(command, env=env, check=False).returncode
    snapshot = {"onednn": args.onednn, "cases": run_cases([c for c in args.cases.split(",") if c])}
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(snapshot, handle, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare, encoding="utf-8") as handle:
            before = json.load(handle)
        differing = [
            name
            for name in snapshot["cases"]
            if before["cases"].get(name) != json.loads(json.dumps(snapshot["cases"][name]))
        ]
        missing = [name for name in before["cases"] if name not in snapshot["cases"]]
        if differing or missing:
            print(f"DIFFERENT: {differing}; missing: {missing}")
            return 1
        print(f"identical: {len(snapshot['cases'])} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
