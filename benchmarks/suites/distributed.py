"""Per-rank predicted vs measured peak memory under DDP and FSDP2, on CPU processes with gloo.

Run ``python -m benchmarks.suites.distributed --out benchmarks/results/distributed/<host>`` (writes
``<host>.md`` and ``.json``; default ``distributed/cpu``). For each case, strategy and world size, ``world_size`` processes
(``torch.multiprocessing`` spawn, gloo, 127.0.0.1) build the same seeded model,
wrap it (``DistributedDataParallel`` or ``fully_shard`` on each block and the
root), and run two real training steps under ``torch.profiler`` with
``profile_memory=True``. Each rank's peak is the largest running sum of its
allocation events during the steps plus the bytes live before profiling
(parameters, buffers, the batch), the CPU ground truth of
:mod:`benchmarks.common.groundtruth`.

One repair is needed: gloo's collectives keep a temporary (a copy of the
buffer) in their work object, and the work is sometimes destroyed on gloo's
own thread, where the profiler records no free. Such a free is put back in two
ways: when the block's address is handed out again, the old block was freed
just before; and a block allocated inside a ``c10d::``/``gloo:`` op that is
still open when the profile ends is freed at the end of that op (the
collective is synchronous; its work has finished). The count of repaired
frees is reported per run.

Set ``NNMEM_DIST_DUMP=/some/prefix`` to write each rank's allocation timeline
(``prefix.<pid>``: size, running total, the ops around it) for debugging.

The prediction is :func:`nnmem_callbacks.estimators.torch.distributed.estimate_per_rank`
with the same model, one rank's batch and the rank's index, made in the parent
process before the workers start.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from benchmarks.common.paths import result_dir
from benchmarks.tools.provenance import commit_stamp

__all__ = [
    "RESULTS",
    "Block",
    "ResMLP",
    "TinyTransformer",
    "CASES",
    "STRATEGIES",
    "DEFAULT_MATRIX",
    "build",
    "loss_fn",
    "units_of",
    "rank_peak",
    "measure",
    "predict",
    "host_meta",
    "to_markdown",
    "main",
]

RESULTS = result_dir("distributed")
_MARK = "nnmem_gt/"


# ---------------------------------------------------------------------------
# cases: small models, so that every run fits CI's time
# ---------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class ResMLP(nn.Module):
    """Residual MLP blocks with a head: FSDP units are the blocks."""

    def __init__(self, width: int = 128, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 500, width: int = 64, depth: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True) for _ in range(depth)
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    return ResMLP(128, 4), torch.randn(96, 128)


def _mlp_odd() -> tuple[nn.Module, torch.Tensor]:
    # widths that do not divide by the world size: padded shards
    return ResMLP(99, 3, classes=7), torch.randn(64, 99)


def _transformer() -> tuple[nn.Module, torch.Tensor]:
    return TinyTransformer(), torch.randint(0, 500, (8, 32))


CASES: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "resmlp": _mlp,
    "resmlp_odd": _mlp_odd,
    "transformer": _transformer,
}

#: Strategy name -> (kind, options) for nnmem_callbacks.core.strategy.Strategy
STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp": {"kind": "ddp"},
    "ddp_bucket_view": {"kind": "ddp", "gradient_as_bucket_view": True},
    "fsdp": {"kind": "fsdp", "reshard_after_forward": True},
    "fsdp_no_reshard": {"kind": "fsdp", "reshard_after_forward": False},
}


#: The (case, strategy) pairs run by default: every strategy on one case, FSDP on uneven
#: (padded) shards, DDP and FSDP on a transformer.
DEFAULT_MATRIX = [("resmlp", name) for name in STRATEGIES] + [
    ("resmlp_odd", "ddp"),
    ("resmlp_odd", "fsdp"),
    ("transformer", "ddp_bucket_view"),
    ("transformer", "fsdp"),
    ("transformer", "fsdp_no_reshard"),
]


def build(case: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return CASES[case]()


def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).float().pow(2).mean()


def units_of(model: nn.Module) -> list[nn.Module]:
    blocks = getattr(model, "blocks", None) or model.layers
    return list(blocks)


# ---------------------------------------------------------------------------
# ground truth in each rank
# ---------------------------------------------------------------------------


def _ancestors(node: Any) -> list[Any]:
    chain = []
    while node is not None:
        chain.append(node)
        node = node.parent
    return chain


def rank_peak(prof: Any, baseline: int) -> dict[str, Any]:
    """The rank's peak from its profile, with gloo's unrecorded frees repaired (see the module docstring)."""
    from torch._C._profiler import _EventType

    allocations, marks = [], []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            allocations.append(node)
        elif node.tag == _EventType.TorchOp and node.name.startswith(_MARK):
            marks.append((node.start_time_ns, node.end_time_ns, node.name[len(_MARK) :]))
        stack.extend(node.children)
    allocations.sort(key=lambda n: n.start_time_ns)
    open_blocks: dict[int, Any] = {}
    events = [(n.start_time_ns, 0, n.extra_fields.alloc_size) for n in allocations]  # (time, order, delta)
    repaired = 0
    for node in allocations:
        size = node.extra_fields.alloc_size
        if size > 0:
            old = open_blocks.get(node.extra_fields.ptr)
            if old is not None:  # its address came back: the old block was freed unseen before this
                events.append((node.start_time_ns, -1, -old.extra_fields.alloc_size))
                repaired += 1
            open_blocks[node.extra_fields.ptr] = node
        else:
            open_blocks.pop(node.extra_fields.ptr, None)
    for node in open_blocks.values():
        # never freed and its address never came back: a collective's temporary is freed when the collective ends
        collective = next((a for a in _ancestors(node.parent) if a.name.startswith(("c10d::", "gloo:"))), None)
        if collective is not None:
            events.append((collective.end_time_ns, -1, -node.extra_fields.alloc_size))
            repaired += 1
    events.sort()  # the repairs were appended after the allocations: one time order for the running sum
    if os.environ.get("NNMEM_DIST_DUMP"):
        with open(os.environ["NNMEM_DIST_DUMP"] + f".{os.getpid()}", "w") as handle:
            total = baseline
            names = {n.start_time_ns: " < ".join(a.name for a in _ancestors(n.parent)[:3]) for n in allocations}
            for time_ns, _, delta in events:
                total += delta
                handle.write(f"{delta:>10} {total:>10} {names.get(time_ns, '?')}\n")
    step_start = min(start for start, _, name in marks if name.startswith("step"))
    phases = sorted(marks)
    running, peak, peak_phase = 0, 0, ""
    phase_peaks: dict[str, int] = {}
    index = 0
    for time_ns, _, delta in events:
        running += delta
        if time_ns < step_start:
            continue
        while index + 1 < len(phases) and phases[index + 1][0] <= time_ns:
            index += 1
        phase = phases[index][2] if phases[index][0] <= time_ns <= phases[index][1] else "between"
        phase_peaks[phase] = max(phase_peaks.get(phase, 0), baseline + running)
        if running > peak:
            peak, peak_phase = running, phase
    return {
        "peak_bytes": baseline + peak,
        "peak_phase": peak_phase,
        "phase_peaks": phase_peaks,
        "repaired_frees": repaired,
        "baseline_bytes": baseline,
    }


def _worker(rank: int, world_size: int, port: int, case: str, strategy: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    from benchmarks.common.groundtruth import live_bytes

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        model, batch = build(case)
        options = STRATEGIES[strategy]
        if options["kind"] == "fsdp":
            # fully_shard frees the full parameters, and the profiler drops frees of blocks allocated
            # before it started: shard first, then count the shards (padded local storages) as live
            from torch.distributed.fsdp import fully_shard

            reshard = options.get("reshard_after_forward", True)
            for unit in units_of(model):
                fully_shard(unit, reshard_after_forward=reshard)
            wrapped = fully_shard(model, reshard_after_forward=reshard)
        local = [getattr(t, "_local_tensor", t) for t in list(model.parameters()) + list(model.buffers())]
        baseline = live_bytes(local + [batch])
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with record_function(_MARK + "setup"):
                if options["kind"] == "ddp":
                    from torch.nn.parallel import DistributedDataParallel

                    # the reducer's buckets are allocated here, inside the profile
                    wrapped = DistributedDataParallel(
                        model, gradient_as_bucket_view=options.get("gradient_as_bucket_view", False)
                    )
                optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
            for step in (1, 2):
                with record_function(f"{_MARK}step{step}/forward"):
                    loss = loss_fn(wrapped, batch)
                with record_function(f"{_MARK}step{step}/backward"):
                    loss.backward()
                with record_function(f"{_MARK}step{step}/optimizer"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                del loss
        result = rank_peak(prof, baseline)
        result["rank"] = rank
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(case: str, strategy: str, world_size: int, out_dir: str, timeout: float = 300.0) -> list[dict[str, Any]]:
    """Runs ``world_size`` gloo processes; returns each rank's measurement."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    port = _free_port()
    processes = [
        context.Process(target=_worker, args=(r, world_size, port, case, strategy, out_dir)) for r in range(world_size)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(1.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
    failed = [p.exitcode for p in processes if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"{case}/{strategy}/x{world_size}: worker exit codes {failed}")
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world_size)]


# ---------------------------------------------------------------------------
# prediction
# ---------------------------------------------------------------------------


def predict(case: str, strategy: str, world_size: int, rank: int) -> dict[str, Any]:
    from nnmem_callbacks.core.strategy import Strategy
    from nnmem_callbacks.estimators.torch.distributed import estimate_per_rank

    model, batch = build(case)
    options = dict(STRATEGIES[strategy])
    spec = Strategy(options.pop("kind"), world_size=world_size, rank=rank, backend="gloo", **options)
    started = time.perf_counter()
    estimate = estimate_per_rank(
        model, batch, "adam", loss_fn, strategy=spec, units=units_of(model) if spec.kind == "fsdp" else None
    )
    return {
        "predicted_bytes": estimate.peak_bytes,
        "predicted_phase": estimate.peak_phase,
        "single_device_bytes": estimate.extra["single_device_peak_bytes"],
        "estimate_s": time.perf_counter() - started,
    }


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------


def host_meta(elapsed: float) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_threads_per_rank": 1,
        "backend": "gloo",
        "elapsed_s": round(elapsed, 1),
        "commit": commit_stamp(),
    }
    try:
        from nnmem_callbacks.probes.fingerprint import cpu_isa_extensions, cpu_model_name

        meta["cpu"] = cpu_model_name()
        meta["isa"] = ",".join(cpu_isa_extensions())
    except (ImportError, OSError):
        pass
    return meta


def to_markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = ["# Distributed per-rank benchmark (CPU, gloo)", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += [
        "",
        "Measured: each rank's peak of live CPU tensor bytes over two real steps (profiler allocation events "
        "plus bytes live before; gloo frees recorded on no thread repaired, see benchmarks/suites/distributed.py). "
        "Predicted: `estimate_per_rank` for that rank. Error = (predicted - measured) / measured.",
        "",
        "| case | strategy | world size | rank | single device | predicted | measured | error | repaired frees |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['strategy']} | {r['world_size']} | {r['rank']} | {r['single_device_bytes'] / 2**20:.3f} MiB | "
            f"{r['predicted_bytes'] / 2**20:.3f} MiB | {r['peak_bytes'] / 2**20:.3f} MiB | {r['error_pct']:+.2f}% | {r['repaired_frees']} |"
        )
    errors = [abs(r["error_pct"]) for r in rows]
    if errors:
        lines += [
            "",
            f"- per-rank median abs error: {statistics.median(errors):.2f}%, worst: {max(errors):.2f}% over {len(errors)} rank runs",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.suites.distributed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--cases", default=None, help="comma-separated: " + ", ".join(CASES) + " (default: DEFAULT_MATRIX)"
    )
    parser.add_argument("--strategies", default=None, help="comma-separated: " + ", ".join(STRATEGIES))
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="runs per configuration; each rank's smallest peak is kept (a free gloo's thread makes "
        "late can only add to a run's peak)",
    )
    parser.add_argument("--out", default=str(RESULTS / "cpu"), help="output stem (.md and .json): the host's name")
    args = parser.parse_args(argv)
    import tempfile

    started = time.perf_counter()
    rows = []
    if args.cases or args.strategies:
        matrix = [
            (c, s)
            for c in (args.cases or ",".join(CASES)).split(",")
            for s in (args.strategies or ",".join(STRATEGIES)).split(",")
        ]
    else:
        matrix = DEFAULT_MATRIX
    for case, strategy in matrix:
        for world_size in (int(w) for w in args.world_sizes.split(",")):
            measured = []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as tmp:
                    runs = measure(case, strategy, world_size, tmp)
                measured = (
                    [min(pair, key=lambda m: m["peak_bytes"]) for pair in zip(measured, runs)] if measured else runs
                )
            for m in measured:
                p = predict(case, strategy, world_size, m["rank"])
                row = {"case": case, "strategy": strategy, "world_size": world_size, **m, **p}
                row["error_pct"] = 100.0 * (p["predicted_bytes"] - m["peak_bytes"]) / m["peak_bytes"]
                rows.append(row)
                print(
                    f"{case:12s} {strategy:16s} x{world_size} rank {m['rank']}: predicted {p['predicted_bytes']} "
                    f"measured {m['peak_bytes']} ({row['error_pct']:+.2f}%) [{p['predicted_phase']} / {m['peak_phase']}]",
                    file=sys.stderr,
                )
    meta = host_meta(time.perf_counter() - started)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(to_markdown(rows, meta))
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
