"""Question (2026-11-28): where does a warm PyTorch estimate spend its time, and how close is it to the floor?

    python -m benchmarks.investigations.estimate_profile --stem zen4-avx512

For the speed suite's ResNet-50 (batch 32) and GPT-2 small (8 x 128 tokens), after one warm-up estimate in the
process (probe cache filled): the time of each trace the estimate runs (the main trace of two steps, the traces
at other batch sizes), the ops dispatched and how the op memo served them, and the cProfile functions with the
most time of their own. Beside it, the floor: the same model's forward, backward and optimizer step under a bare
``FakeTensorMode`` with its own cache warm (no tracker), which any trace on fake tensors pays. Writes
``benchmarks/results/investigations/estimate_profile/<stem>.md``.

Answer on zen4-avx512 (``benchmarks/results/investigations/estimate_profile/zen4-avx512.md``): the traces run at
the bare fake-tensor floor (the same passes under a bare FakeTensorMode take 95% of the ResNet-50 estimate's time and
117% of GPT-2's: the op memo more than pays for the tracker), so an estimate's time is the number of fake passes it
runs: the main trace's two steps (62% of ResNet-50's time; its optimizer steps alone 40%) and two forward/backward
passes at other batch sizes. Ten times MemTracker needs fewer passes, not cheaper bookkeeping.
"""

from __future__ import annotations

import argparse
import collections
import copy
import cProfile
import io
import pstats
import statistics
import sys
import time
import warnings
from typing import Any, Sequence

import torch
from torch.utils._pytree import tree_map

from benchmarks.common.paths import result_dir

__all__ = ["main"]


def _floor(model: Any, batch: Any, make_opt: Any, loss_fn: Any, steps: int = 4) -> dict[str, float]:
    """Median seconds of forward, backward and optimizer step under a bare FakeTensorMode (its cache warm)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_model = copy.deepcopy(model)
    with mode:
        fake_model = fake_model.to_empty(device="cpu")
        fake_batch = tree_map(torch.zeros_like, batch)
        optimizer = make_opt(fake_model.parameters())
        times: dict[str, list[float]] = collections.defaultdict(list)
        for _ in range(steps):
            started = time.perf_counter()
            loss = loss_fn(fake_model, fake_batch)
            forward = time.perf_counter()
            loss.backward()
            backward = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times["forward"].append(forward - started)
            times["backward"].append(backward - forward)
            times["optimizer"].append(time.perf_counter() - backward)
    return {k: statistics.median(v[1:]) for k, v in times.items()}  # the first step warms the cache


def profile_case(name: str) -> list[str]:
    from benchmarks.suites.speed import CASES
    from nnmem_callbacks import estimate_training
    from nnmem_callbacks.estimators.torch import estimator, tracer

    model, batch, make_opt, loss_fn = CASES[name]()

    def estimate(copied: Any = None) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return estimate_training(
                copied or copy.deepcopy(model), batch, optimizer=make_opt, loss_fn=loss_fn, precision="32-true"
            )

    estimate()  # warm-up: probe cache, imports, fake-tensor caches
    traces: list[tuple[int, int, bool, float]] = []
    original = estimator._run_trace

    def timed(config: Any, batch_size: int, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = original(config, batch_size, **kwargs)
        traces.append((batch_size, kwargs["steps"], kwargs["optimizer_steps"], time.perf_counter() - started))
        return result

    served: collections.Counter = collections.Counter()
    original_key = tracer.OpMemo.key

    def counted_key(self: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        key = original_key(self, func, args, kwargs)
        entry = self.entries.get(key) if key is not None else None
        served[
            "no key"
            if key is None
            else "new"
            if entry is None
            else "uncacheable"
            if entry is tracer._UNCACHEABLE
            else "replayed"
        ] += 1
        return key

    estimator._run_trace = timed
    tracer.OpMemo.key = counted_key
    try:
        copied = copy.deepcopy(model)
        started = time.perf_counter()
        est = estimate(copied)
        total = time.perf_counter() - started
    finally:
        estimator._run_trace = original
        tracer.OpMemo.key = original_key
    copied = copy.deepcopy(model)
    profiler = cProfile.Profile()
    profiler.enable()
    estimate(copied)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
    top = [line for line in text.getvalue().splitlines() if line.strip() and "(" in line and "/" in line][:15]
    floor = _floor(model, batch, make_opt, loss_fn)
    step = floor["forward"] + floor["backward"]
    ops = sum(served.values())
    lines = [
        f"## {name}",
        "",
        f"One warm estimate: {total:.3f} s, {est.extra.get('ops')} ops in the main trace; {ops} reached the op memo "
        f"(op memo: "
        + ", ".join(f"{k} {v}" for k, v in served.most_common())
        + f"); {1e6 * total / ops:.0f} us per op.",
        "",
        "| trace | batch | steps | optimizer | seconds |",
        "|---|---|---|---|---|",
    ]
    for index, (size, steps, with_opt, seconds) in enumerate(traces):
        label = "main" if index == 0 else "other batch size"
        lines.append(f"| {label} | {size} | {steps} | {'yes' if with_opt else 'no'} | {seconds:.3f} |")
    fake_steps = sum(steps * ((step + floor["optimizer"]) if with_opt else step) for _, steps, with_opt, _ in traces)
    lines += [
        "",
        f"Bare FakeTensorMode (no tracker, its cache warm): forward {floor['forward']:.3f} s, backward "
        f"{floor['backward']:.3f} s, optimizer step {floor['optimizer']:.3f} s. The same passes as the traces above, "
        f"at that speed: {fake_steps:.3f} s, {fake_steps / total:.0%} of the estimate.",
        "",
        "cProfile, most time of their own (one more warm estimate; the profiler slows Python calls):",
        "",
        "```",
        *top,
        "```",
        "",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.investigations.estimate_profile", description=__doc__)
    parser.add_argument("--stem", default="cpu", help="the host, e.g. zen4-avx512")
    parser.add_argument("--cases", default="resnet50 b32,gpt2-small 8x128", help="e.g. 'resnet50 b32'")
    args = parser.parse_args(argv)
    lines = [
        "# Where a warm estimate's time goes",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Question and method: "
        "`benchmarks/investigations/estimate_profile.py`.",
        "",
    ]
    for name in args.cases.split(","):
        lines += profile_case(name)
    out = result_dir("investigations") / "estimate_profile"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
