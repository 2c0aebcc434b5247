"""Question (2026-11-22): which CPU kernels take workspaces that a fake-tensor trace cannot see, and how large?

The answer became the per-op rules of :mod:`nnmem_callbacks.estimators.torch.rules`
(``benchmarks/results/investigations/workspaces/avx512.md``).

A tracer running under a ``TorchDispatchMode`` / ``FakeTensorMode`` sees the
outputs of every op that reaches the dispatcher's Python key: the outermost op
of each call stack that is not ``CompositeImplicitAutograd`` (``aten::conv2d``
and ``aten::linear`` decompose; ``aten::convolution``, ``aten::addmm``,
``aten::convolution_backward`` ... are seen). Whatever such an op allocates and
frees again before it returns (oneDNN reorders, im2col columns, contiguous
copies, per-op scratch) never shows up in the trace.

This script profiles real training steps with ``profile_memory=True``, pairs
every allocation with its free (by pointer), attributes it to that outermost
visible op, and calls it a *workspace* when it is freed before the op ends. It
prints, per op: how often it ran, how often it used a workspace, the largest
workspace and its size relative to the op's inputs and outputs, and which inner
kernels allocated it. Per model it prints the measured peak, the peak with the
workspaces removed (what a perfect fake-tensor trace would report), and the
difference.

Usage::

    python -m benchmarks.investigations.workspaces                 # micro-ops and zoo cases, fp32 and bf16
    python -m benchmarks.investigations.workspaces --only micro    # or: --only zoo
    python -m benchmarks.investigations.workspaces --json benchmarks/results/investigations/workspaces/avx512.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import dataclasses
import json
import os
import statistics
import sys
from typing import Any, Callable, Iterable, Sequence

os.environ.setdefault("KINETO_LOG_LEVEL", "5")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.common import zoo  # noqa: E402
from benchmarks.common.groundtruth import autocast_for  # noqa: E402

__all__ = ["MIN_WS_BYTES", "OpCall", "analyse_profile", "profile_step", "micro_cases", "print_op_table", "main"]

MiB = 1 << 20
MIN_WS_BYTES = 4096  # smaller in-op temporaries (scalars, index buffers) are not reported
_IMPLICIT: dict[str, bool] = {}


def _is_visible(name: str) -> bool:
    """Would a dispatch-mode tracer see this op (a non-CompositeImplicit dispatcher op)?"""
    if "::" not in name or name.startswith(("autograd::", "torch::autograd", "nnmem_ws/")):
        return False
    if name not in _IMPLICIT:
        try:
            implicit = torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")
            _IMPLICIT[name] = not implicit
        except RuntimeError:  # not a registered operator (e.g. a record_function label)
            _IMPLICIT[name] = False
    return _IMPLICIT[name]


def _tensor_bytes(meta: Any) -> int:
    if meta is None:
        return 0
    if isinstance(meta, (list, tuple)):
        return sum(_tensor_bytes(m) for m in meta)
    sizes = getattr(meta, "sizes", None)
    dtype = getattr(meta, "dtype", None)
    if sizes is None or dtype is None:
        return 0
    n = 1
    for s in sizes:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()


@dataclasses.dataclass
class OpCall:
    name: str
    start: int
    end: int
    input_bytes: int
    allocs: list = dataclasses.field(default_factory=list)  # (alloc_t, free_t|None, size, inner_op)

    @property
    def output_bytes(self) -> int:
        return sum(size for _t, f, size, _inner in self.allocs if f is None or f > self.end)

    def workspace_peak(self) -> tuple[int, collections.Counter]:
        events = []
        inner: collections.Counter = collections.Counter()
        for t, f, size, inner_name in self.allocs:
            if f is not None and f <= self.end:
                events += [(t, size), (f, -size)]
                inner[inner_name] += size
        running = peak = 0
        for _t, delta in sorted(events):
            running += delta
            peak = max(peak, running)
        return peak, inner


def analyse_profile(prof: Any) -> tuple[list[OpCall], dict[str, int]]:
    """Pairs allocations with frees and attributes them to the outermost visible op."""
    from torch._C._profiler import _EventType

    calls: dict[int, OpCall] = {}
    allocs = []  # (t, size, ptr, visible_op_id, inner_name)
    frees = []
    stack = [(root, None, None) for root in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, visible, inner = stack.pop()
        if node.tag == _EventType.Allocation:
            ef = node.extra_fields
            if ef.device.type != "cpu":
                continue
            if ef.alloc_size > 0:
                allocs.append((node.start_time_ns, ef.alloc_size, ef.ptr, visible, inner))
            else:
                frees.append((node.start_time_ns, -ef.alloc_size, ef.ptr))
            continue
        if node.tag == _EventType.TorchOp:
            if visible is None and _is_visible(node.name):
                visible = id(node)
                calls[visible] = OpCall(
                    node.name,
                    node.start_time_ns,
                    node.end_time_ns,
                    _tensor_bytes(list(getattr(node.extra_fields, "inputs", []) or [])),
                )
            inner = node.name
        stack.extend((child, visible, inner) for child in node.children)

    # pair frees with allocations by pointer, in time order
    allocs.sort()
    frees.sort()
    timeline = [(t, 0, i) for i, (t, *_rest) in enumerate(allocs)] + [(t, 1, i) for i, (t, *_rest) in enumerate(frees)]
    timeline.sort()
    live: dict[int, int] = {}
    free_time: dict[int, int] = {}
    for t, kind, i in timeline:
        if kind == 0:
            live[allocs[i][2]] = i
        else:
            j = live.pop(frees[i][2], None)
            if j is not None:
                free_time[j] = t
    for i, (t, size, _ptr, visible, inner) in enumerate(allocs):
        if visible is not None:
            calls[visible].allocs.append((t, free_time.get(i), size, inner))

    # peaks with and without workspaces
    ws_ids = set()
    for i, (t, size, _ptr, visible, _inner) in enumerate(allocs):
        f = free_time.get(i)
        if visible is not None and f is not None and f <= calls[visible].end:
            ws_ids.add(i)
    events_all, events_visible = [], []
    for i, (t, size, *_rest) in enumerate(allocs):
        f = free_time.get(i)
        for target in (events_all,) if i in ws_ids else (events_all, events_visible):
            target.append((t, size))
            if f is not None:
                target.append((f, -size))
    peaks = {}
    for key, events in (("peak", events_all), ("peak_without_workspaces", events_visible)):
        running = peak = 0
        for _t, delta in sorted(events):
            running += delta
            peak = max(peak, running)
        peaks[key] = peak
    return list(calls.values()), peaks


def profile_step(model: nn.Module, batch: Any, loss_fn: Callable, precision: str) -> Any:
    from torch.profiler import ProfilerActivity, profile

    model = copy.deepcopy(model).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # one warm-up step outside the profiler (lazy init, oneDNN primitive creation)
    with autocast_for(precision, "cpu"):
        loss = loss_fn(model, batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del loss
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        with autocast_for(precision, "cpu"):
            loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return prof


# ---------------------------------------------------------------------------
# Micro cases: one op family each, forward + backward
# ---------------------------------------------------------------------------
def _sum_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    out = model(batch)
    if isinstance(out, tuple):
        out = out[0]
    return out.float().pow(2).mean()


class _SDPA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 3 * 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.proj(x).view(x.shape[0], x.shape[1], 3, 4, 16).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def micro_cases() -> dict[str, tuple[Callable[[], nn.Module], Callable[[], Any]]]:
    g = torch.Generator().manual_seed(0)
    return {
        "conv3x3 64->64 @32x32 b8": (
            lambda: nn.Conv2d(64, 64, 3, padding=1),
            lambda: torch.randn(8, 64, 32, 32, generator=g),
        ),
        "conv1x1 256->64 @16x16 b8": (lambda: nn.Conv2d(256, 64, 1), lambda: torch.randn(8, 256, 16, 16, generator=g)),
        "conv7x7/2 3->64 @64x64 b8": (
            lambda: nn.Conv2d(3, 64, 7, 2, 3),
            lambda: torch.randn(8, 3, 64, 64, generator=g),
        ),
        "conv_transpose 64->32 k2s2 @16 b8": (
            lambda: nn.ConvTranspose2d(64, 32, 2, 2),
            lambda: torch.randn(8, 64, 16, 16, generator=g),
        ),
        "batchnorm2d 64 @32x32 b8": (lambda: nn.BatchNorm2d(64), lambda: torch.randn(8, 64, 32, 32, generator=g)),
        "maxpool 3/2 64 @32 b8": (
            lambda: nn.Sequential(nn.Conv2d(64, 64, 1), nn.MaxPool2d(3, 2, 1)),
            lambda: torch.randn(8, 64, 32, 32, generator=g),
        ),
        "linear 2D 1024->1024 b256": (lambda: nn.Linear(1024, 1024), lambda: torch.randn(256, 1024, generator=g)),
        "linear 3D 256->1024 b16x128": (lambda: nn.Linear(256, 1024), lambda: torch.randn(16, 128, 256, generator=g)),
        "layer_norm 256 b16x128": (
            lambda: nn.Sequential(nn.Linear(256, 256), nn.LayerNorm(256)),
            lambda: torch.randn(16, 128, 256, generator=g),
        ),
        "lstm 2x(128->256) b32x64": (
            lambda: nn.LSTM(128, 256, 2, batch_first=True),
            lambda: torch.randn(32, 64, 128, generator=g),
        ),
        "embedding 50k x 128 b32x64": (
            lambda: nn.Embedding(50_000, 128),
            lambda: torch.randint(0, 50_000, (32, 64), generator=g),
        ),
        "embedding_bag 200k x 64 b256x32": (
            lambda: nn.EmbeddingBag(200_000, 64, mode="mean"),
            lambda: torch.randint(0, 200_000, (256, 32), generator=g),
        ),
        "sdpa causal 4h x 16d b16x128": (_SDPA, lambda: torch.randn(16, 128, 64, generator=g)),
    }


def _rows(calls: Iterable[OpCall], source: str, precision: str) -> list[dict[str, Any]]:
    by_op: dict[str, list] = collections.defaultdict(list)
    for call in calls:
        peak, inner = call.workspace_peak()
        by_op[call.name].append((peak, call.input_bytes, call.output_bytes, inner))
    rows = []
    for name, items in by_op.items():
        with_ws = [it for it in items if it[0] >= MIN_WS_BYTES]
        if not with_ws:
            continue
        biggest = max(with_ws, key=lambda it: it[0])
        inner: collections.Counter = collections.Counter()
        for it in with_ws:
            inner.update(it[3])
        ratios_out = [it[0] / it[2] for it in with_ws if it[2]]
        ratios_in = [it[0] / it[1] for it in with_ws if it[1]]
        rows.append(
            {
                "source": source,
                "precision": precision,
                "op": name,
                "calls": len(items),
                "calls_with_ws": len(with_ws),
                "max_ws_bytes": biggest[0],
                "ws_total_bytes": sum(it[0] for it in with_ws),
                "in_bytes_at_max": biggest[1],
                "out_bytes_at_max": biggest[2],
                "ws_over_out_median": statistics.median(ratios_out) if ratios_out else None,
                "ws_over_out_max": max(ratios_out) if ratios_out else None,
                "ws_over_in_median": statistics.median(ratios_in) if ratios_in else None,
                "ws_over_in_max": max(ratios_in) if ratios_in else None,
                "allocated_in": ", ".join(f"{k}" for k, _v in inner.most_common(3)),
            }
        )
    rows.sort(key=lambda r: -r["max_ws_bytes"])
    return rows


def _fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def print_op_table(rows: list[dict[str, Any]], title: str) -> None:
    print(f"\n## {title}\n")
    print(
        "| source | prec | op (visible to tracer) | calls | w/ ws | max ws KiB | in KiB | out KiB | ws/out med | ws/out max | ws/in med | allocated in |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['source']} | {r['precision']} | {r['op']} | {r['calls']} | {r['calls_with_ws']} | "
            f"{r['max_ws_bytes'] / 1024:.0f} | {r['in_bytes_at_max'] / 1024:.0f} | {r['out_bytes_at_max'] / 1024:.0f} | "
            f"{_fmt_ratio(r['ws_over_out_median'])} | {_fmt_ratio(r['ws_over_out_max'])} | "
            f"{_fmt_ratio(r['ws_over_in_median'])} | {r['allocated_in']} |",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.investigations.workspaces",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", choices=("micro", "zoo"), default=None)
    parser.add_argument(
        "--cases",
        default="mlp,bn_cnn,resnet18,resnet50,lstm,transformer_encoder,gpt2,vit,unet,embedding_heavy,checkpointed",
    )
    parser.add_argument("--precisions", default=",".join(zoo.PRECISIONS))
    parser.add_argument("--json", default=None, help="also write all rows to this JSON file")
    parser.add_argument("--md", default=None, help="also write the printed tables to this Markdown file")
    args = parser.parse_args(argv)
    if args.md:
        with open(args.md, "w") as fh, contextlib.redirect_stdout(_Tee(sys.stdout, fh)):
            print("# CPU kernel workspaces invisible to a fake-tensor trace\n")
            print(
                f"torch {torch.__version__}, {torch.get_num_threads()} threads; generated by "
                "`python -m benchmarks.investigations.workspaces`. A workspace is an allocation made inside the outermost "
                "dispatcher-visible op and freed before that op returns (ops with < 4 KiB omitted). "
                "in/out = the op's input tensors / the bytes it leaves allocated."
            )
            return _run(args)
    return _run(args)


class _Tee:
    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def _run(args: argparse.Namespace) -> int:
    torch.set_flush_denormal(True)
    precisions = [p for p in args.precisions.split(",") if p]
    out: dict[str, Any] = {"micro": [], "zoo_ops": [], "zoo_peaks": []}

    if args.only in (None, "micro"):
        rows = []
        for label, (make_model, make_input) in micro_cases().items():
            for precision in precisions:
                try:
                    torch.manual_seed(0)
                    calls, _ = analyse_profile(profile_step(make_model(), make_input(), _sum_loss, precision))
                    rows += _rows(calls, label, precision)
                except Exception as exc:  # noqa: BLE001
                    print(f"{label} {precision}: {type(exc).__name__}: {exc}", file=sys.stderr)
        out["micro"] = rows
        print_op_table(rows, "Micro-ops: in-kernel workspaces (forward + backward + SGD step)")

    if args.only in (None, "zoo"):
        all_rows, peaks = [], []
        for name in [c for c in args.cases.split(",") if c]:
            case = zoo.get_case(name)
            torch.manual_seed(0)
            model = case.make_model()
            batch = case.make_batch(case.batch_size, "cpu")
            for precision in precisions:
                try:
                    calls, pk = analyse_profile(profile_step(model, batch, case.loss_fn, precision))
                except Exception as exc:  # noqa: BLE001
                    print(f"{name} {precision}: {type(exc).__name__}: {exc}", file=sys.stderr)
                    continue
                all_rows += _rows(calls, name, precision)
                peaks.append(
                    {
                        "case": name,
                        "precision": precision,
                        **pk,
                        "workspace_share_pct": 100.0
                        * (pk["peak"] - pk["peak_without_workspaces"])
                        / max(pk["peak"], 1),
                    }
                )
            del model, batch
        out["zoo_ops"], out["zoo_peaks"] = all_rows, peaks
        # aggregate per op across the zoo
        agg: dict[tuple[str, str], dict[str, Any]] = {}
        for r in all_rows:
            key = (r["op"], r["precision"])
            a = agg.setdefault(key, {**r, "source": r["source"]})
            if a is r:
                continue
            a["calls"] += r["calls"]
            a["calls_with_ws"] += r["calls_with_ws"]
            if r["max_ws_bytes"] > a["max_ws_bytes"]:
                a.update({k: r[k] for k in ("max_ws_bytes", "in_bytes_at_max", "out_bytes_at_max", "source")})
            for k in ("ws_over_out_max",):
                if r[k] is not None and (a[k] is None or r[k] > a[k]):
                    a[k] = r[k]
        agg_rows = sorted(agg.values(), key=lambda r: -r["max_ws_bytes"])
        print_op_table(agg_rows, "Zoo: in-kernel workspaces per op (largest call; source = case of the largest)")
        print("\n## Zoo: effect on the peak of one SGD step (delta over params+batch)\n")
        print("| case | prec | measured peak MiB | without workspaces MiB | workspace share of peak |")
        print("|---|---|---|---|---|")
        for p in peaks:
            print(
                f"| {p['case']} | {p['precision']} | {p['peak'] / MiB:.2f} | {p['peak_without_workspaces'] / MiB:.2f} | "
                f"{p['workspace_share_pct']:.1f}% |",
                flush=True,
            )

    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
