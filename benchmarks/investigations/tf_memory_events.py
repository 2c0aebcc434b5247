"""Question (2026-11-23): which buffers make up a TensorFlow step's measured peak, and which does the replay miss?

Per-buffer evidence for the TensorFlow replay: the allocator's events at the measured peak vs the replay's. Its
committed outputs are in ``benchmarks/results/investigations/`` (``tf_memory_events/``, ``unet_filter_gradient/``).

    TF_ENABLE_ONEDNN_OPTS=1 python -m benchmarks.investigations.tf_memory_events gru_text
    TF_ENABLE_ONEDNN_OPTS=0 TF_CPU_ALLOCATOR_USE_BFC=true python -m benchmarks.investigations.tf_memory_events audio_cnn

Runs two ``train_on_batch`` steps of a :mod:`benchmarks.suites.keras_accuracy` case under
``tf.profiler.experimental`` and reads the ``MemoryAllocation``/``MemoryDeallocation``
events of the CPU allocator from the trace (``*.xplane.pb``): each event carries the
op (``tf_op``), the shape, the requested and charged bytes, and the bytes in use
after it. Prints the buffers live at the measured peak (by op, largest first), then
the buffers live at the replay's peak (``GraphReplayer.trace`` of the estimate) for
comparison. Investigation only: the numbers depend on the executor's interleaving.

``--per-step N`` profiles N warm steps one at a time instead, without estimating,
and prints each step's peak with its large allocations (``--large`` MiB and more):
the bytes requested beside the bytes the allocator charged. A chunk charged well
above its request is the BFC allocator's split rule at work (a free chunk under
twice the request is handed out whole), which moves a step's peak by whole work
buffers from one step to the next:

    TF_ENABLE_ONEDNN_OPTS=0 TF_CPU_ALLOCATOR_USE_BFC=true python -m benchmarks.investigations.tf_memory_events mobilenetv3small --per-step 8 --large 8

``--regions`` says why a chunk was handed out whole: it profiles the process
from before the model is built through its first two steps, feeds every
request to :class:`~nnmem_callbacks.allocators.bfc.BFCSimulator` (which
reproduces the allocator's own charges, ``benchmarks/results/tf_allocator_fidelity/avx512.md``),
and for each large request charged a whole free chunk prints the region it
landed in: each chunk, free or held, and the op that holds it (with how many
events earlier it was allocated):

    TF_ENABLE_ONEDNN_OPTS=0 TF_CPU_ALLOCATOR_USE_BFC=true python -m benchmarks.investigations.tf_memory_events mobilenetv3small --regions --large 8

(oneDNN off with the BFC allocator only: with oneDNN on, requests under 256 KiB go
to another pool, and the events do not say which.)

``--timeline`` prints when each kernel of the kinds the probes measure ran in
one warm step (start and end in ms from the first, and the executor thread):
which kernels' work buffers were alive together, the evidence for the replay's
waves and for the kernel that outlives its wave
(:meth:`~nnmem_callbacks.estimators.keras.tensorflow.replay.ReplayRun.op_done`):

    TF_ENABLE_ONEDNN_OPTS=0 TF_CPU_ALLOCATOR_USE_BFC=true python -m benchmarks.investigations.tf_memory_events unet_small --timeline
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
from collections import Counter
from typing import Any

from benchmarks.common.tf_profiler import MARKER_ELEMENTS, memory_events

__all__ = [
    "live_at_peak",
    "main",
    "kernel_intervals",
    "large_allocations",
    "WHOLE_CHUNK_RATIO",
    "whole_chunk_regions",
    "UPDATE_OPS",
    "update_copies",
]


def live_at_peak(events: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """The largest ``bytes_allocated`` reached and the allocations live right after it."""
    live: dict[Any, dict[str, Any]] = {}
    best, best_live = -1, []
    for row in events:
        address = row.get("addr")
        if row["kind"] == "MemoryAllocation":
            live[address] = row
        else:
            live.pop(address, None)
        in_use = int(row.get("bytes_allocated", 0) or 0)
        if in_use > best:
            best, best_live = in_use, list(live.values())
    return best, best_live


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--fresh", action="store_true", help="profile the first two steps (no warm-up step)")
    parser.add_argument("--grep", default=None, help="also list every event whose op contains this text")
    parser.add_argument("--batch", type=int, default=None, help="the batch size instead of the case's own")
    parser.add_argument(
        "--per-step", type=int, default=0, metavar="N", help="profile N warm steps one by one, no estimate"
    )
    parser.add_argument(
        "--large", type=float, default=4.0, help="with --per-step or --regions: allocations of this many MiB or more"
    )
    parser.add_argument(
        "--regions", action="store_true", help="the regions where large requests were charged a whole free chunk"
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="when each probed kind of kernel ran in a warm step, and on which thread",
    )
    args = parser.parse_args(argv)
    import tensorflow as tf

    from benchmarks.common.keras_cases import CASES, build_case
    from nnmem_callbacks.estimators.keras.tensorflow import graph as tf_graph
    from nnmem_callbacks.keras import estimate_training

    if args.batch is not None:
        CASES[args.case] = (args.batch, CASES[args.case][1])
    if args.regions:
        return _regions(args.case, args.large)
    model, x, y, batch = build_case(args.case)
    if args.timeline:
        return _timeline(model, x, y)
    if args.per_step:
        return _per_step(model, x, y, args.per_step, args.large)
    traces: list = []
    original = tf_graph.GraphReplayer.replay

    def traced(self: Any, graph: Any, **kwargs: Any) -> Any:
        if (
            kwargs.get("track_phases", True)
            and self.n == batch
            and not (self.unlucky or self.newest_first or not self.forwarding)
        ):
            self.trace = []
            traces.append(self.trace)
        return original(self, graph, **kwargs)

    tf_graph.GraphReplayer.replay = traced  # type: ignore[method-assign]
    estimate = estimate_training(model, batch, x=x, y=y, probe_kernels=True)
    tf_graph.GraphReplayer.replay = original  # type: ignore[method-assign]
    print(
        f"predicted allocator peak {estimate.extra['tf_allocator_peak_bytes'] / 2**20:.2f} MiB "
        f"(static {estimate.extra['tf_allocator_static_bytes'] / 2**20:.2f}), upper "
        f"{estimate.extra['tf_allocator_peak_upper_bytes'] / 2**20:.2f}"
    )
    x_t, y_t = tf.constant(x), tf.constant(y)
    if not args.fresh:
        model.train_on_batch(x_t, y_t)  # warm: trace and build outside the profile
    logdir = tempfile.mkdtemp(prefix="tfmem-")
    tf.profiler.experimental.start(logdir)
    for _ in range(2):
        model.train_on_batch(x_t, y_t)
    tf.profiler.experimental.stop()
    events = memory_events(logdir)
    peak, live = live_at_peak(events)
    window = "steps 1-2 of the fresh model" if args.fresh else "steps 2-3 of a warm model"
    print(f"measured: {len(events)} events, peak bytes_allocated {peak / 2**20:.2f} MiB ({window})")
    if args.grep is not None:
        for row in events:
            if args.grep in str(row.get("tf_op", "")):
                print(
                    f"  {row['kind'][6:]:>12} {int(row.get('allocation_bytes', 0) or 0) / 2**20:7.2f} MiB "
                    f"in use {int(row.get('bytes_allocated', 0) or 0) / 2**20:7.2f}  {row.get('tf_op')} "
                    f"{row.get('tensor_shape', '')} {row.get('region_type', '')}"
                )
    by_op: Counter = Counter()
    for row in live:
        by_op[(row.get("tf_op", "?"), row.get("shape", ""))] += int(row.get("allocation_bytes", 0) or 0)
    during = sum(by_op.values())
    print(f"  {(peak - during) / 2**20:8.2f} MiB  allocated before the profile (variables, slots, batch...)")
    for (op, shape), size in by_op.most_common(args.top):
        print(f"  {size / 2**20:8.2f} MiB  {op}  {shape}")
    if traces:
        trace = traces[-1]
        live_r: dict[str, int] = {}
        best, best_live = -1, {}
        for sign, name, _, charged, in_use in trace:
            if sign == "+":
                live_r[name] = charged
            else:
                live_r.pop(name, None)
            if in_use > best:
                best, best_live = in_use, dict(live_r)
        print(f"replay: peak allocator in use {best / 2**20:.2f} MiB (variables and slots included)")
        for name, size in sorted(best_live.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"  {size / 2**20:8.2f} MiB  {name}")
    return 0


def kernel_intervals(space: Any, kinds: frozenset[str]) -> list[tuple[int, int, str, str]]:
    """``(start_ps, end_ps, thread, op name)`` of every op event of ``kinds`` in a profile's ``XSpace``, by start.

    TensorFlow's executor names an op event ``"<op name>:<op type>"``.

    Example:
        >>> from types import SimpleNamespace as N
        >>> meta = {1: N(name="g/conv/Conv2DBackpropFilter:Conv2DBackpropFilter"), 2: N(name="g/relu:ReluGrad")}
        >>> line = N(name="tf_Compute/12", timestamp_ns=10, events=[N(metadata_id=1, offset_ps=5, duration_ps=7),
        ...                                                        N(metadata_id=2, offset_ps=0, duration_ps=1)])
        >>> kernel_intervals(N(planes=[N(event_metadata=meta, lines=[line])]), frozenset({"Conv2DBackpropFilter"}))
        [(10005, 10012, 'tf_Compute/12', 'g/conv/Conv2DBackpropFilter')]
    """
    rows = []
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name, _, kind = plane.event_metadata[event.metadata_id].name.rpartition(":")
                if kind in kinds and name:
                    start = line.timestamp_ns * 1000 + event.offset_ps
                    rows.append((start, start + event.duration_ps, line.name, name))
    return sorted(rows)


def _timeline(model: Any, x: Any, y: Any) -> int:
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from nnmem_callbacks.estimators.keras.tensorflow.probes import PROBED_OPS

    x_t, y_t = tf.constant(x), tf.constant(y)
    for _ in range(2):
        model.train_on_batch(x_t, y_t)  # warm: trace, build, the first step's copies
    logdir = tempfile.mkdtemp(prefix="tfmem-")
    tf.profiler.experimental.start(logdir)
    model.train_on_batch(x_t, y_t)
    tf.profiler.experimental.stop()
    rows = []
    for path in glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as handle:
            space.ParseFromString(handle.read())
        rows += kernel_intervals(space, PROBED_OPS | {"_FusedConv2D"})
    rows.sort()
    if not rows:
        print("no kernel events in the profile")
        return 1
    first = rows[0][0]
    threads = {thread: index for index, thread in enumerate(dict.fromkeys(row[2] for row in rows))}
    print("start ms    end ms   ms  thread  op")
    for start, end, thread, name in rows:
        print(
            f"{(start - first) / 1e9:8.2f} {(end - first) / 1e9:8.2f} {(end - start) / 1e9:5.2f}  {threads[thread]:>6}  {name}"
        )
    return 0


def large_allocations(events: list[dict[str, Any]], min_bytes: int) -> list[dict[str, Any]]:
    """The allocations of at least ``min_bytes`` requested, in time order, with what the allocator charged for each.

    Example:
        >>> rows = large_allocations([{"kind": "MemoryAllocation", "requested_bytes": 21_888_000,
        ...     "allocation_bytes": 40_500_000, "tf_op": "a/Conv2DBackpropFilter", "bytes_allocated": 9}], 2**20)
        >>> rows[0]["op"], round(rows[0]["charged_over_requested"], 2)
        ('a/Conv2DBackpropFilter', 1.85)
    """
    rows = []
    for event in events:
        requested = int(event.get("requested_bytes", 0) or 0)
        if event["kind"] != "MemoryAllocation" or requested < min_bytes:
            continue
        charged = int(event.get("allocation_bytes", 0) or 0)
        rows.append(
            {
                "op": event.get("tf_op", "?"),
                "shape": event.get("shape", ""),
                "requested": requested,
                "charged": charged,
                "charged_over_requested": charged / requested,
                "in_use_after": int(event.get("bytes_allocated", 0) or 0),
            }
        )
    return rows


#: A request charged at least this many times its size was handed a whole free chunk (the split rule declined).
WHOLE_CHUNK_RATIO = 1.25


def whole_chunk_regions(events: list[dict[str, Any]], min_bytes: int, first: int = 0) -> list[dict[str, Any]]:
    """Each request of at least ``min_bytes`` (from event ``first`` on) charged a whole free chunk, with its region.

    Every event is fed to a :class:`~nnmem_callbacks.allocators.bfc.BFCSimulator`
    in order (the full history decides where the chunks lie). For each such
    request (charged a whole chunk by the simulator or, where the event has
    ``allocation_bytes``, by the allocator itself): the simulator's charge, the
    allocator's (0 when the event lacks it), and the simulator's chunks of its
    region at that moment, in address order: ``(bytes, op holding it or None
    when free, index of the event that allocated it)``.

    Example:
        >>> def alloc(addr, mib, op): return {"kind": "MemoryAllocation", "addr": addr, "requested_bytes": mib << 20, "tf_op": op}
        >>> events = [alloc(1, 2, "keep"), alloc(2, 30, "a"), {"kind": "MemoryDeallocation", "addr": 2},
        ...           alloc(3, 12, "b"), alloc(4, 12, "c")]  # a 32 MiB region: b splits it, c gets the 20 MiB left
        >>> [(row["op"], row["charged"] >> 20) for row in whole_chunk_regions(events, 8 << 20)]
        [('c', 20)]
        >>> [(size >> 20, op, at) for size, op, at in whole_chunk_regions(events, 8 << 20)[0]["region"]]
        [(12, 'b', 3), (20, 'c', 4)]
    """
    from nnmem_callbacks.allocators.bfc import BFCSimulator

    simulator = BFCSimulator()
    live: dict[Any, int] = {}
    made: dict[int, tuple[str, int]] = {}
    rows = []
    for index, event in enumerate(events):
        address = event.get("addr")
        if event["kind"] != "MemoryAllocation":
            chunk = live.pop(address, None)
            if chunk is not None:
                simulator.free(chunk)
            continue
        requested = int(event.get("requested_bytes", 0) or 0)
        chunk = live[address] = simulator.alloc(requested)
        made[chunk] = (str(event.get("tf_op", "?")), index)
        charged = simulator.chunks[chunk][1]
        real = int(event.get("allocation_bytes", 0) or 0)  # the allocator's own charge, where the event has it
        if index < first or requested < min_bytes or max(charged, real) < WHOLE_CHUNK_RATIO * requested:
            continue
        head = chunk
        while simulator.chunks[head][3] is not None:
            head = simulator.chunks[head][3]
        region = []
        while head is not None:
            _, size, in_use, _, following = simulator.chunks[head]
            op, at = made.get(head, ("?", -1)) if in_use else (None, -1)
            region.append((size, op, at))
            head = following
        rows.append(
            {
                "op": made[chunk][0],
                "index": index,
                "requested": requested,
                "charged": charged,
                "real_charged": real,
                "region": region,
            }
        )
    return rows


#: Ops that update a variable: an allocation of theirs is a copy of the variable (copy-on-write: a read of the old
#: value was still alive), which the variable keeps.
UPDATE_OPS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceApply")


def update_copies(events: list[dict[str, Any]], min_bytes: int, first: int = 0) -> list[dict[str, Any]]:
    """The allocations of at least ``min_bytes`` made by variable updates (copy-on-write copies), from event ``first``.

    Example:
        >>> events = [{"kind": "MemoryAllocation", "requested_bytes": 3 << 20, "tf_op": "adam/AssignSubVariableOp_7"},
        ...           {"kind": "MemoryAllocation", "requested_bytes": 3 << 20, "tf_op": "model/dense/MatMul"}]
        >>> [(row["op"], row["index"], row["requested"] >> 20) for row in update_copies(events, 1 << 20)]
        [('adam/AssignSubVariableOp_7', 0, 3)]
    """
    rows = []
    for index, event in enumerate(events[first:], start=first):
        op = str(event.get("tf_op", ""))
        requested = int(event.get("requested_bytes", 0) or 0)
        if event["kind"] == "MemoryAllocation" and requested >= min_bytes and any(kind in op for kind in UPDATE_OPS):
            rows.append({"op": op, "index": index, "requested": requested})
    return rows


def _regions(case: str, large_mib: float) -> int:
    """Profiles a fresh process from before the build through two steps; prints the whole-chunk charges' regions."""
    import tensorflow as tf

    from benchmarks.common.keras_cases import build_case
    from benchmarks.common.keras_env import host_fingerprint
    from benchmarks.tools.provenance import commit_stamp
    from nnmem_callbacks.allocators.tensorflow_cpu import tf_cpu_allocator

    if tf_cpu_allocator() != "bfc":
        print(
            "--regions needs every request in the events: run with TF_ENABLE_ONEDNN_OPTS=0 and "
            "TF_CPU_ALLOCATOR_USE_BFC=true (oneDNN's allocator sends requests under 256 KiB to another pool, "
            "and the events do not say which)",
            file=sys.stderr,
        )
        return 2
    host = ", ".join(f"{k} {v}" for k, v in host_fingerprint().items())
    print(
        f"# {host}; tensorflow {tf.__version__}; TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default')}, "
        f"TF_CPU_ALLOCATOR_USE_BFC={os.environ.get('TF_CPU_ALLOCATOR_USE_BFC', 'unset')}; commit {commit_stamp()}"
    )
    logdir = tempfile.mkdtemp(prefix="tfmem-")
    tf.profiler.experimental.start(logdir)
    model, x, y, _ = build_case(case)
    x_t, y_t = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))
    for step in range(2):
        marker = tf.zeros([MARKER_ELEMENTS + step])  # where each step's events start
        del marker
        model.train_on_batch(x_t, y_t)
    tf.profiler.experimental.stop()
    events = memory_events(logdir)
    starts = [
        next(
            (i for i, e in enumerate(events) if int(e.get("requested_bytes", 0) or 0) == 4 * (MARKER_ELEMENTS + step)),
            0,
        )
        for step in range(2)
    ]
    first = starts[0]

    def step_of(index: int) -> int:
        return 2 if index >= starts[1] else 1

    peaks = [
        max((int(e.get("bytes_allocated", 0) or 0) for e in window), default=0)
        for window in (events[starts[0] : starts[1]], events[starts[1] :])
    ]
    print(
        f"first two steps: {len(events) - first} events, peak bytes_allocated {max(peaks) / 2**20:.2f} MiB "
        f"(step 1 {peaks[0] / 2**20:.2f}, step 2 {peaks[1] / 2**20:.2f})"
    )
    copies = update_copies(events, 2**20, first)
    print(f"variable updates that copied a variable of 1 MiB or more (a read still alive): {len(copies)}")
    for row in copies:
        print(f"    {row['requested'] / 2**20:8.2f} MiB  {row['op']} (step {step_of(row['index'])})")
    rows = whole_chunk_regions(events, int(large_mib * 2**20), first)
    if not rows:
        print(f"no request of {large_mib} MiB or more was charged a whole free chunk")
    for row in rows:
        print(
            f"{row['requested'] / 2**20:.2f} MiB requested, {row['charged'] / 2**20:.2f} charged by the simulator, "
            f"{row['real_charged'] / 2**20:.2f} by the allocator (step {step_of(row['index'])}): "
            f"{row['op']}; its region:"
        )
        for size, op, at in row["region"]:
            holder = "free" if op is None else f"{op} (allocated {row['index'] - at} events before)"
            print(f"    {size / 2**20:8.2f} MiB  {holder}")
    return 0


def _per_step(model: Any, x: Any, y: Any, steps: int, large_mib: float) -> int:
    """Profiles ``steps`` warm steps one by one: each step's peak and its large allocations."""
    import tensorflow as tf

    from benchmarks.common.keras_env import host_fingerprint
    from benchmarks.tools.provenance import commit_stamp

    host = ", ".join(f"{k} {v}" for k, v in host_fingerprint().items())
    print(
        f"# {host}; tensorflow {tf.__version__}; TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default')}, "
        f"TF_CPU_ALLOCATOR_USE_BFC={os.environ.get('TF_CPU_ALLOCATOR_USE_BFC', 'unset')}; commit {commit_stamp()}"
    )
    x_t, y_t = tf.constant(x), tf.constant(y)
    model.train_on_batch(x_t, y_t)  # warm: trace and build outside the profiles
    for step in range(steps):
        logdir = tempfile.mkdtemp(prefix="tfmem-")
        tf.profiler.experimental.start(logdir)
        model.train_on_batch(x_t, y_t)
        tf.profiler.experimental.stop()
        events = memory_events(logdir)
        peak, _ = live_at_peak(events)
        print(f"step {step}: peak bytes_allocated {peak / 2**20:.2f} MiB")
        for row in large_allocations(events, int(large_mib * 2**20)):
            marker = "  <- charged a whole free chunk" if row["charged_over_requested"] > 1.25 else ""
            print(
                f"  {row['requested'] / 2**20:7.2f} MiB requested {row['charged'] / 2**20:7.2f} charged, in use after "
                f"{row['in_use_after'] / 2**20:7.2f}  {row['op']} {row['shape']}{marker}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
