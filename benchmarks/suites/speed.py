"""Speed of an estimate, as ratios against peers in the same run (issue #45's measurements).

Usage::

    python -m benchmarks.suites.speed --stem zen4-avx512 [--repeats 5] [--against /path/to/other/checkout]

What it measures (every figure a ratio of two timings taken in this run, so the machine's load cancels):

* **against MemTracker**: ``estimate_training`` of the zoo's ResNet-50 (batch 32, 3x224x224, Adam, fp32) and of
  a GPT-2 small built from ``transformers.GPT2Config()`` (8 x 128 tokens, AdamW, fp32), each the median of
  ``--repeats`` warm estimates in one process, beside PyTorch's ``MemTracker`` under ``FakeTensorMode`` on the same
  two steps (median of ``--repeats``; its time includes converting the model to fake tensors). Target: 10x.
* **first estimate of a process**: fresh processes, one with an empty probe cache (``NNMEM_CACHE_DIR`` a new
  directory) and one with the cache the first left, each timing its first and a second ResNet-50 estimate.
  Target: the cold first estimate at most 2x a warm one.
* **probe memory**: a ResNet-50 estimate at a meta batch of 512 x 3 x 512 x 512 in a fresh process with an empty
  cache, then in another with the cache it filled; the difference of their peak-RSS rises (the probes' share)
  against the probe cap (with ``--against``, for that checkout too).
* **Lightning fit start**: the time ``MemoryBudgetCallback.on_fit_start`` takes (budget under the estimate, so it
  plans and suggests) against one estimate of the same module and batch in the same process. Target: 1.5x.
* **7B-shaped LoRA** (``--against``): a Llama-2-7B-shaped LoRA from meta tensors (bf16 base, checkpointing, 1 x
  2048 tokens, AdamW, for a CUDA device), timed in fresh processes with this checkout and with the other one,
  alternating. Target: 3x faster than the main it was filed against.

Writes ``benchmarks/results/speed/<stem>.md`` and ``.json``.

Known limitations:
    * Timings on a 2-core host move with other work on it: the ratios are what to compare, and each names the
      runs behind its medians.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("KINETO_LOG_LEVEL", "5")

import torch  # noqa: E402

from benchmarks.common.isolated import run_worker  # noqa: E402
from benchmarks.common.paths import ROOT, result_dir  # noqa: E402
from benchmarks.tools.provenance import commit_stamp, head_commit, write_result  # noqa: E402

__all__ = ["RESULTS_DIR", "TARGETS", "main"]

RESULTS_DIR = result_dir("speed")

#: Issue #45's targets: times faster than MemTracker; cold first estimate / warm one; fit start / one estimate;
#: times faster than the checkout given with --against on the 7B-shaped LoRA.
TARGETS = {"memtracker_ratio": 10.0, "cold_over_warm": 2.0, "fit_start_over_estimate": 1.5, "lora_7b_speedup": 3.0}


# ---------------------------------------------------------------------------------------------- cases


def _resnet50() -> tuple[Any, Any, Any, Any]:
    from benchmarks.common import zoo

    torch.manual_seed(0)
    model = zoo.make_resnet50()
    batch = zoo.image_batch(3, 224, 1000)(32, "cpu")
    return model, batch, zoo.OPTIMIZERS["adam"], zoo.ZOO["resnet50"].loss_fn


def _gpt2_small() -> tuple[Any, Any, Any, Any]:
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    ids = torch.randint(0, 50257, (8, 128))
    batch = {"input_ids": ids, "labels": ids.clone()}

    def loss_fn(module: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return module(**inputs).loss

    return model, batch, lambda params: torch.optim.AdamW(params, lr=1e-3), loss_fn


CASES = {"resnet50 b32": _resnet50, "gpt2-small 8x128": _gpt2_small}


def _estimate(
    model: Any, batch: Any, make_opt: Any, loss_fn: Any, precision: str = "32-true", **kwargs: Any
) -> tuple[float, Any]:
    from nnmem_callbacks import estimate_training

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.perf_counter()
        est = estimate_training(model, batch, optimizer=make_opt, loss_fn=loss_fn, precision=precision, **kwargs)
    return time.perf_counter() - started, est


def against_memtracker(name: str, repeats: int) -> dict[str, Any]:
    """Median warm estimate and median MemTracker run of one case, in this process."""
    from benchmarks.common.baselines import memtracker_peak

    model, batch, make_opt, loss_fn = CASES[name]()
    ours = []
    est = None
    for i in range(repeats + 1):  # the first is the warm-up
        seconds, est = _estimate(copy.deepcopy(model), batch, make_opt, loss_fn)
        print(f"{name}: ours run {i}{' (warm-up)' if i == 0 else ''} {seconds:.3f} s", flush=True)
        if i:
            ours.append(seconds)
    theirs = []
    peak = error = None
    for i in range(repeats):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = memtracker_peak(model, batch, make_opt, loss_fn, "32-true")
        print(f"{name}: MemTracker run {i} {run['seconds']:.3f} s error={run['error']}", flush=True)
        if run["error"] is not None:
            error = run["error"]
            break
        theirs.append(run["seconds"])
        peak = run["peak_bytes"]
    row: dict[str, Any] = {
        "case": name,
        "ours_runs_s": [round(t, 4) for t in ours],
        "ours_median_s": statistics.median(ours),
        "ours_peak_bytes": est.peak_bytes,
        "ours_method": est.method,
        "memtracker_runs_s": [round(t, 4) for t in theirs],
        "memtracker_median_s": statistics.median(theirs) if theirs else None,
        "memtracker_peak_bytes": peak,
        "memtracker_error": error,
    }
    if theirs:
        row["ratio"] = row["memtracker_median_s"] / row["ours_median_s"]
    return row


# ------------------------------------------------------------------------------------ fresh processes


def _worker_first_estimates() -> dict[str, Any]:
    """(In a fresh process) the first and the second ResNet-50 estimate, with their probe counters."""
    model, batch, make_opt, loss_fn = _resnet50()
    runs = []
    for _ in range(2):
        seconds, est = _estimate(copy.deepcopy(model), batch, make_opt, loss_fn)
        runs.append({"seconds": seconds, "kernel_probes": dict(est.extra.get("kernel_probes") or {})})
    return {"runs": runs}


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak_rss() -> bool:
    """Resets the process's peak RSS (Linux: ``VmHWM``), so a rise is measured from the level now, not an old peak."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def _worker_probe_memory() -> dict[str, Any]:
    """(In a fresh process, empty cache) peak-RSS rise of a ResNet-50 estimate at a meta batch of 512 x 3 x 512 x 512."""
    from benchmarks.common import zoo
    from nnmem_callbacks.probes.session import default_memory_cap

    torch.manual_seed(0)
    model = zoo.make_resnet50()
    batch = (torch.empty(512, 3, 512, 512, device="meta"), torch.empty(512, dtype=torch.long, device="meta"))
    reset = _reset_peak_rss()
    before = _status_bytes("VmRSS") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seconds, est = _estimate(model, batch, zoo.OPTIMIZERS["adam"], zoo.ZOO["resnet50"].loss_fn)
    after = _status_bytes("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "seconds": seconds,
        "peak_rss_rise_bytes": after - before,
        "measured_as": "VmHWM after (reset before) - VmRSS before" if reset else "ru_maxrss after - before",
        "probe_cap_bytes": default_memory_cap(),
        "peak_bytes": est.peak_bytes,
        "kernel_probes": dict(est.extra.get("kernel_probes") or {}),
    }


def _worker_lora_7b() -> dict[str, Any]:
    """(In a fresh process, with whichever checkout ``--package-from`` names) one 7B-shaped LoRA estimate for a CUDA device."""
    import nnmem_callbacks
    from benchmarks.suites import napkin_vs_trace

    case = next(c for c in napkin_vs_trace.CASES if c.name == "7B LoRA bf16 base, checkpointing")
    seconds, est = _estimate(case.make_model(), case.make_batch(), case.optimizer, None, case.precision, device="cuda")
    return {"seconds": seconds, "peak_bytes": est.peak_bytes, "package": nnmem_callbacks.__file__}


WORKERS = {"first-estimates": _worker_first_estimates, "probe-memory": _worker_probe_memory, "lora-7b": _worker_lora_7b}


def _in_fresh_process(worker: str, *, checkout: Path = ROOT, cache_dir: str | None = None) -> dict[str, Any]:
    """A worker's record (``{"error_text": ...}`` when it failed), run with ``nnmem_callbacks`` from ``checkout``."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["NNMEM_CACHE_DIR"] = cache_dir
    arguments = ["--worker", worker, "--package-from", str(checkout)]
    return run_worker("benchmarks.suites.speed", arguments, env=env, timeout=1800)


def first_estimates() -> dict[str, Any]:
    cache = tempfile.mkdtemp(prefix="nnmem-speed-cache-")
    cold = _in_fresh_process("first-estimates", cache_dir=cache)
    warm_cache = _in_fresh_process("first-estimates", cache_dir=cache)
    result: dict[str, Any] = {"empty_cache": cold, "filled_cache": warm_cache}
    if "error_text" not in cold:
        first, second = (run["seconds"] for run in cold["runs"])
        result["cold_over_warm"] = first / second
    if "error_text" not in warm_cache:
        first, second = (run["seconds"] for run in warm_cache["runs"])
        result["first_of_process_over_warm"] = first / second
    return result


def probe_memory(checkout: Path = ROOT) -> dict[str, Any]:
    """The probe-memory worker with an empty probe cache, then again with the cache it filled (fresh processes).

    The second run's rise is what the estimate holds without probing (the first fake-tensor trace of a process
    imports Dynamo, about 90 MiB); the difference is the probes' share, which the cap is about.
    """
    cache = tempfile.mkdtemp(prefix="nnmem-speed-cache-")
    cold = _in_fresh_process("probe-memory", checkout=checkout, cache_dir=cache)
    warm = _in_fresh_process("probe-memory", checkout=checkout, cache_dir=cache)
    result: dict[str, Any] = {"empty_cache": cold, "filled_cache": warm}
    if "peak_rss_rise_bytes" in cold and "peak_rss_rise_bytes" in warm:
        result["probe_share_bytes"] = cold["peak_rss_rise_bytes"] - warm["peak_rss_rise_bytes"]
        result["probe_cap_bytes"] = cold["probe_cap_bytes"]
    return result


def _describe(checkout: Path) -> str:
    """``<path> (<short commit>)`` of a checkout."""
    return f"{checkout} ({head_commit(checkout) or 'not a git checkout'})"


def lora_7b(against: Path | None, repeats: int) -> dict[str, Any]:
    ours, theirs = [], []
    for i in range(repeats):
        ours.append(_in_fresh_process("lora-7b"))
        print(f"7B LoRA, this checkout, run {i}: {ours[-1]}", flush=True)
        if against is not None:
            theirs.append(_in_fresh_process("lora-7b", checkout=against))
            print(f"7B LoRA, {against}, run {i}: {theirs[-1]}", flush=True)
    result: dict[str, Any] = {
        "this_checkout": ours,
        "against": _describe(against) if against else None,
        "theirs": theirs,
    }
    ok = [r["seconds"] for r in ours if "seconds" in r]
    if ok:
        result["ours_median_s"] = statistics.median(ok)
    ok_theirs = [r["seconds"] for r in theirs if "seconds" in r]
    if ok and ok_theirs:
        result["theirs_median_s"] = statistics.median(ok_theirs)
        result["speedup"] = result["theirs_median_s"] / result["ours_median_s"]
        result["same_bytes"] = {r.get("peak_bytes") for r in ours} == {r.get("peak_bytes") for r in theirs}
    return result


# -------------------------------------------------------------------------------------- Lightning


def lightning_fit_start(repeats: int) -> dict[str, Any]:
    """The callback's on_fit_start time against one estimate of the same module and batch (same process)."""
    import lightning.pytorch as pl

    from nnmem_callbacks.lightning import MemoryBudgetCallback

    model, batch, make_opt, loss_fn = _resnet50()
    images, labels = batch

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = copy.deepcopy(model)
            self.batch_size = 32

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, b: Any, _: int) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self(b[0]), b[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

        def train_dataloader(self) -> Any:
            data = torch.utils.data.TensorDataset(images, labels)
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size)

    fit_start, single = [], []
    for i in range(repeats + 1):
        module = Module()
        callback = MemoryBudgetCallback(budget="2GiB", policy="warn")
        timed = callback.on_fit_start

        def on_fit_start(trainer: Any, pl_module: Any, timed: Any = timed) -> None:
            started = time.perf_counter()
            timed(trainer, pl_module)
            fit_start.append(time.perf_counter() - started)
            raise KeyboardInterrupt  # stop before the real step: only the fit start is timed

        callback.on_fit_start = on_fit_start
        trainer = pl.Trainer(
            max_steps=1,
            callbacks=[callback],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                trainer.fit(module)
            except (KeyboardInterrupt, SystemExit):
                pass
        seconds, _ = _estimate(Module(), (images, labels), make_opt, lambda m, b: loss_fn(m.net, b))
        single.append(seconds)
        print(f"Lightning run {i}: on_fit_start {fit_start[-1]:.3f} s, one estimate {seconds:.3f} s", flush=True)
    fit_start, single = fit_start[1:], single[1:]  # the first of each is the process's warm-up
    return {
        "on_fit_start_runs_s": [round(t, 4) for t in fit_start],
        "estimate_runs_s": [round(t, 4) for t in single],
        "ratio": statistics.median(fit_start) / statistics.median(single),
        "budget": "2GiB (under the estimate: the callback plans and suggests)",
    }


# ------------------------------------------------------------------------------------------ report


def _verdict(value: float | None, target: float, higher_is_better: bool) -> str:
    if value is None:
        return "not measured"
    met = value >= target if higher_is_better else value <= target
    return f"{value:.2f}x (target {'>=' if higher_is_better else '<='} {target:g}x: {'met' if met else 'MISSED'})"


def to_markdown(result: dict[str, Any]) -> list[str]:
    meta = result["meta"]
    lines = [
        "# Speed",
        "",
        f"{meta['date']}; torch {meta['torch']}, transformers {meta.get('transformers')}, Python {meta['python']}, "
        f"{meta['cpu_threads']} CPU threads, {meta['cpu']}; load average at start {meta['load_average_1min_at_start']}. "
        f"Commit {meta['commit']}. Ratios of timings taken in this run.",
        "",
        "| measurement | ours | peer | ratio |",
        "|---|---|---|---|",
    ]
    for row in result.get("memtracker", []):
        if row.get("memtracker_median_s") is None:
            lines.append(
                f"| {row['case']} vs MemTracker | {row['ours_median_s']:.3f} s | crash: {row['memtracker_error']} | - |"
            )
            continue
        lines.append(
            f"| {row['case']} vs MemTracker (median of {len(row['ours_runs_s'])}) | {row['ours_median_s']:.3f} s | "
            f"{row['memtracker_median_s']:.3f} s | {_verdict(row.get('ratio'), TARGETS['memtracker_ratio'], True)} |"
        )
    first = result.get("first_estimates")
    if first and "runs" in first.get("empty_cache", {}) and "runs" in first.get("filled_cache", {}):
        runs = first["empty_cache"]["runs"]
        probes = runs[0]["kernel_probes"]
        lines.append(
            f"| first ResNet-50 estimate of a process, empty probe cache, vs the second | {runs[0]['seconds']:.2f} s "
            f"({probes.get('probed', 0)} op shapes probed, {probes.get('seconds', 0):.1f} s) | {runs[1]['seconds']:.2f} s | "
            f"{_verdict(first.get('cold_over_warm'), TARGETS['cold_over_warm'], False)} |"
        )
        runs = first["filled_cache"]["runs"]
        lines.append(
            f"| first ResNet-50 estimate of a process, filled cache, vs the second | {runs[0]['seconds']:.2f} s | "
            f"{runs[1]['seconds']:.2f} s | {first['first_of_process_over_warm']:.2f}x |"
        )
    fit = result.get("lightning")
    if fit:
        lines.append(
            f"| Lightning on_fit_start (ResNet-50 b32, over budget) vs one estimate | "
            f"{statistics.median(fit['on_fit_start_runs_s']):.3f} s | {statistics.median(fit['estimate_runs_s']):.3f} s | "
            f"{_verdict(fit['ratio'], TARGETS['fit_start_over_estimate'], False)} |"
        )
    lora = result.get("lora_7b")
    if lora and "ours_median_s" in lora:
        if "speedup" in lora:
            lines.append(
                f"| 7B-shaped LoRA, fresh processes, vs {lora['against']} | {lora['ours_median_s']:.2f} s | "
                f"{lora['theirs_median_s']:.2f} s | {_verdict(lora['speedup'], TARGETS['lora_7b_speedup'], True)}; "
                f"same bytes: {lora['same_bytes']} |"
            )
        else:
            lines.append(
                f"| 7B-shaped LoRA, fresh processes | {lora['ours_median_s']:.2f} s | - | no --against checkout |"
            )
    memory = result.get("probe_memory") or {}
    if "probe_share_bytes" in memory:
        cap = memory["probe_cap_bytes"]
        cold, warm = memory["empty_cache"], memory["filled_cache"]
        against = result.get("probe_memory_against") or {}
        before = ""
        if "probe_share_bytes" in against and result.get("lora_7b"):
            before = f"; {against['probe_share_bytes'] / 2**20:.0f} MiB with {result['lora_7b']['against']}"
        share = memory["probe_share_bytes"]
        lines.append(
            f"| probe memory: peak-RSS rise of a ResNet-50 estimate at 512 x 3 x 512 x 512, empty cache less filled "
            f"cache | {share / 2**20:.0f} MiB ({cold['peak_rss_rise_bytes'] / 2**20:.0f} - "
            f"{warm['peak_rss_rise_bytes'] / 2**20:.0f}; {cold['kernel_probes'].get('probed', 0)} op shapes "
            f"probed{before}) | probe cap {cap / 2**20:.0f} MiB | {share / cap:.2f} of the cap "
            f"({'within' if share <= cap else 'OVER'}) |"
        )
    return lines


def _meta() -> dict[str, Any]:
    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:
        transformers_version = None
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "transformers": transformers_version,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
        "cpu": cpu,
        "commit": commit_stamp(),
        "load_average_1min_at_start": round(os.getloadavg()[0], 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.suites.speed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per median (e.g. 5)")
    parser.add_argument("--against", type=Path, help="another checkout for the 7B LoRA comparison (e.g. /tmp/main)")
    parser.add_argument("--parts", default="memtracker,first,lightning,lora,memory", help="e.g. memtracker,lora")
    parser.add_argument("--stem", default="cpu", help="the result's file name: the host (e.g. zen4-avx512)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--package-from", type=Path, help=argparse.SUPPRESS)  # a worker's nnmem_callbacks checkout
    args = parser.parse_args(argv)
    if args.worker:
        if args.package_from is not None:  # before anything imports nnmem_callbacks (nothing above does)
            sys.path.insert(0, str(args.package_from))
        print(json.dumps(WORKERS[args.worker](), default=str))
        return 0
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {"meta": _meta(), "targets": TARGETS}
    if "memtracker" in parts:
        result["memtracker"] = [against_memtracker(name, args.repeats) for name in CASES]
    if "first" in parts:
        result["first_estimates"] = first_estimates()
    if "lightning" in parts:
        result["lightning"] = lightning_fit_start(max(3, args.repeats // 2))
    if "lora" in parts:
        result["lora_7b"] = lora_7b(args.against, 3)
    if "memory" in parts:
        result["probe_memory"] = probe_memory()
        if args.against is not None:
            result["probe_memory_against"] = probe_memory(args.against)
    lines = to_markdown(result)
    write_result(str(RESULTS_DIR), args.stem, result, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
