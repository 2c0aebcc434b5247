"""Speed benchmark: one estimate of ResNet-50 against MemTracker in the same run (target: at least 4x faster).

Usage::

    python -m benchmarks.suites.speed [--batch-size 32] [--image-size 224] [--repeats 3] [--memtracker-runs 2]

Times ``nnmem_callbacks.estimate_training`` on the zoo's hand-written ResNet-50
at batch 32, 3x224x224, Adam, fp32 (median of ``--repeats`` after one warm-up),
and PyTorch's MemTracker under FakeTensorMode on the same step (its time
includes converting the model to fake tensors). Writes
``benchmarks/results/speed/<stem>.md`` and ``.json`` (``--stem``, the host such as
``zen4-avx512``, default ``cpu``).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Sequence

os.environ.setdefault("KINETO_LOG_LEVEL", "5")

import torch  # noqa: E402

from benchmarks.common import zoo  # noqa: E402
from benchmarks.common.baselines import memtracker_peak  # noqa: E402
from benchmarks.common.paths import result_dir  # noqa: E402

__all__ = ["RESULTS_DIR", "TARGET_RATIO", "main"]

RESULTS_DIR = result_dir("speed")
#: How many times faster than MemTracker on the same step, in the same run, a warm-cache estimate must be
#: (a ratio against a peer, not a time: the machine's load slows both).
TARGET_RATIO = 4.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.suites.speed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memtracker-runs", type=int, default=2)
    parser.add_argument("--stem", default="cpu", help="the result's file name: the host (zen4-avx512, ...)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = zoo.make_resnet50()
    batch = zoo.image_batch(3, args.image_size, 1000)(args.batch_size, "cpu")
    make_opt = zoo.OPTIMIZERS["adam"]
    loss_fn = zoo.ZOO["resnet50"].loss_fn
    result: dict[str, Any] = {
        "model": "resnet50 (benchmarks.common.zoo, hand-written torchvision layout)",
        "batch_size": args.batch_size,
        "input": f"3x{args.image_size}x{args.image_size}",
        "optimizer": "adam",
        "precision": "32-true",
        "target_ratio": TARGET_RATIO,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
        "load_average_1min_at_start": round(os.getloadavg()[0], 2),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }

    # ours
    try:
        from nnmem_callbacks import estimate_training

        times = []
        est = None
        probes = []
        for i in range(args.repeats + 1):
            m = copy.deepcopy(model)
            t0 = time.perf_counter()
            est = estimate_training(m, batch, optimizer=make_opt, loss_fn=loss_fn, precision="32-true")
            dt = time.perf_counter() - t0
            probes.append(dict(est.extra.get("kernel_probes") or {}))
            print(f"ours run {i}{' (warm-up)' if i == 0 else ''}: {dt:.3f} s; kernel probes {probes[-1]}", flush=True)
            if i:
                times.append(dt)
            else:
                cold_s = dt
        result["ours"] = {
            "median_s": statistics.median(times),
            "runs_s": times,
            "warmup_excluded": True,
            "peak_bytes": est.peak_bytes,
            "method": est.method,
            # the warm-up is the first estimate of this process: with an empty probe cache
            # (NNMEM_CACHE_DIR pointing at an empty directory) it is the cold-cache time
            "first_run_s": cold_s,
            "first_run_kernel_probes": probes[0],
            "later_runs_kernel_probes": probes[1:],
            "cache_dir": os.environ.get("NNMEM_CACHE_DIR"),
        }
    except Exception as exc:  # noqa: BLE001
        result["ours"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print("ours:", result["ours"]["error"], flush=True)

    # MemTracker
    runs = []
    for i in range(args.memtracker_runs):
        mt = memtracker_peak(model, batch, make_opt, loss_fn, "32-true")
        print(f"memtracker run {i}: {mt['seconds']:.3f} s peak={mt['peak_bytes']} error={mt['error']}", flush=True)
        runs.append(mt)
    ok = [r for r in runs if r["error"] is None]
    result["memtracker"] = {
        "median_s": statistics.median(r["seconds"] for r in ok) if ok else None,
        "runs_s": [r["seconds"] for r in runs],
        "peak_bytes": ok[0]["peak_bytes"] if ok else None,
        "error": None if ok else runs[0]["error"] if runs else "not run",
    }

    ours, mt = result["ours"], result["memtracker"]
    if "error" not in ours and mt["median_s"]:
        ours["speedup_vs_memtracker"] = mt["median_s"] / ours["median_s"]
        ours["meets_target"] = ours["speedup_vs_memtracker"] >= TARGET_RATIO
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{args.stem}.json").write_text(json.dumps(result, indent=1, default=str))
    lines = [
        "# Speed benchmark",
        "",
        f"ResNet-50 (hand-written), batch {args.batch_size}, 3x{args.image_size}x{args.image_size}, "
        f"Adam, fp32; torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {result['date']}, "
        f"load average at start {result['load_average_1min_at_start']} (other work on the machine slows both).",
        "",
        "| estimator | median s | runs s | peak MiB | note |",
        "|---|---|---|---|---|",
    ]
    if "error" in ours:
        lines.append(f"| nnmem_callbacks | - | - | - | crash: {ours['error']} |")
    else:
        lines.append(
            f"| nnmem_callbacks (method={ours['method']}) | {ours['median_s']:.3f} | "
            f"{', '.join(f'{t:.3f}' for t in ours['runs_s'])} | {ours['peak_bytes'] / 2**20:.1f} | "
            + (
                f"{ours['speedup_vs_memtracker']:.1f}x faster than MemTracker, target >= {TARGET_RATIO:.0f}x: "
                f"{'met' if ours['meets_target'] else 'MISSED'}"
                if "meets_target" in ours
                else "no MemTracker time"
            )
            + " (probe cache warm) |"
        )
        first = ours["first_run_kernel_probes"]
        lines.append(
            f"| nnmem_callbacks, first run | {ours['first_run_s']:.3f} | {ours['first_run_s']:.3f} | "
            f"{ours['peak_bytes'] / 2**20:.1f} | kernel probes: {first.get('probed', 0)} op shapes measured "
            f"({first.get('kernel_runs', 0)} runs, {first.get('seconds', 0):.1f} s), {first.get('from_cache', 0)} "
            f"from the cache (cold when the cache dir started empty) |"
        )
    if mt["median_s"] is None:
        lines.append(f"| MemTracker (FakeTensorMode) | - | - | - | crash: {mt['error']} |")
    else:
        lines.append(
            f"| MemTracker (FakeTensorMode) | {mt['median_s']:.3f} | "
            f"{', '.join(f'{t:.3f}' for t in mt['runs_s'])} | {mt['peak_bytes'] / 2**20:.1f} | "
            "includes fake conversion |"
        )
    (RESULTS_DIR / f"{args.stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
