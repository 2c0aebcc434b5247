"""Question (2026-11-24): how does the verified step-down behave when the direct estimates are noisy?

A framework-free simulation (``benchmarks/results/investigations/step_down_noise/simulation.md``).

TensorFlow's direct estimates run real steps whose peak moves from run to run, so
a direct estimate at a batch misses the lines by a different amount each time.
This simulates the plan of ``tests/test_keras_tensorflow.py``'s
``test_fit_plan_keeps_the_effective_batch`` as it failed in CI (lines
``1.80 MiB + 8.4 KiB/sample``, requested batch 512 with gradient accumulation,
3.76 MiB usable) with misses drawn uniformly from a range, and counts the plans
that end at batch 0 ("nothing fits") and those left unverified.

Run::

    python -m benchmarks.investigations.step_down_noise --out benchmarks/results/investigations/step_down_noise --stem simulation

The same at the commit before the step-down's fallback for noisy misses (8d9fc5b),
from a worktree of it with this file and ``provenance.py`` copied in:
``python -m benchmarks.investigations.step_down_noise --out /tmp --stem step_down_noise_8d9fc5b`` (that run is in git:
``git show d8e87ea:benchmarks/results/step_down_noise_8d9fc5b.md``: 121 and 283 of 2000 plans ended at batch 0).

The figures are a property of :func:`nnmem_callbacks.core.verification.verify_batch_size`
alone: they do not depend on the host.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from pathlib import Path

from benchmarks.tools.provenance import commit_stamp
from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
from nnmem_callbacks.core.verification import verify_batch_size

__all__ = ["NOISE_RANGES_MIB", "lines_at", "simulate", "main"]

FIXED, PER_SAMPLE, USABLE, REQUESTED = 1_884_664, 8_558, 3_939_384, 512
MiB = 2**20
NOISE_RANGES_MIB = ((0.3, 0.6), (0.3, 1.2), (0.3, 1.6))


def lines_at(batch_size: int, fixed: int = FIXED) -> MemoryEstimate:
    return MemoryEstimate(
        peak_bytes=fixed + PER_SAMPLE * batch_size,
        breakdown={"parameters": fixed},
        batch_size=batch_size,
        phases=(PhaseLine("step/backward", fixed, PER_SAMPLE),),
    )


def simulate(low_mib: float, high_mib: float, trials: int) -> dict:
    lines = lines_at(REQUESTED)
    candidate = lines.max_batch_size(USABLE, verify=False)

    def choose(largest: int) -> int:  # the accumulate policy: fewest steps, then the smallest batch keeping 512
        return math.ceil(REQUESTED / math.ceil(REQUESTED / largest))

    ends: list[int] = []
    unverified = 0
    for trial in range(trials):
        rng = random.Random(trial)
        verification = verify_batch_size(
            lines,
            USABLE,
            candidate=candidate,
            choose=choose,
            verifier=lambda n: lines_at(n, FIXED + int(rng.uniform(low_mib, high_mib) * MiB)),
        )
        ends.append(verification.batch_size)
        unverified += not verification.verified
    # the largest batch that fits even the worst miss: what a step-down should reach
    safe = max((n for n in range(1, REQUESTED) if FIXED + PER_SAMPLE * n + high_mib * MiB <= USABLE), default=0)
    return {
        "miss_mib": [low_mib, high_mib],
        "trials": trials,
        "ended_at_zero": ends.count(0),
        "unverified": unverified,
        "median_batch": statistics.median(ends),
        "largest_safe_batch": safe,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--out", help="folder for STEM.{json,md}; default: print only")
    parser.add_argument("--stem", default="step_down_noise", help="file name of the results (another commit's run)")
    args = parser.parse_args()
    commit = commit_stamp()
    rows = [simulate(low, high, args.trials) for low, high in NOISE_RANGES_MIB]
    lines = [
        f"# Verified step-down with noisy direct estimates (simulation, commit {commit})",
        "",
        "| miss range MiB | plans | ended at 0 | unverified | median batch | largest batch safe for any miss |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['miss_mib'][0]}-{r['miss_mib'][1]} | {r['trials']} | {r['ended_at_zero']} | {r['unverified']} | "
        f"{r['median_batch']:g} | {r['largest_safe_batch']} |"
        for r in rows
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        (out / f"{args.stem}.json").write_text(json.dumps({"commit": commit, "rows": rows}, indent=1) + "\n")
        (out / f"{args.stem}.md").write_text(text)


if __name__ == "__main__":
    main()
