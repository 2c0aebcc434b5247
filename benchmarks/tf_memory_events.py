"""Per-buffer evidence for the TensorFlow replay: the allocator's events at the measured peak vs the replay's.

    TF_ENABLE_ONEDNN_OPTS=1 python -m benchmarks.tf_memory_events gru_text
    TF_ENABLE_ONEDNN_OPTS=0 TF_CPU_ALLOCATOR_USE_BFC=true python -m benchmarks.tf_memory_events audio_cnn

Runs two ``train_on_batch`` steps of a :mod:`benchmarks.keras_accuracy` case under
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

    TF_ENABLE_ONEDNN_OPTS=0 TF_CPU_ALLOCATOR_USE_BFC=true python -m benchmarks.tf_memory_events mobilenetv3small --per-step 8 --large 8
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
from collections import Counter
from typing import Any


def _stats(plane: Any, event: Any) -> dict[str, Any]:
    out = {}
    for stat in event.stats:
        name = plane.stat_metadata[stat.metadata_id].name
        which = stat.WhichOneof("value")
        value = getattr(stat, which) if which else None
        if which == "ref_value":
            value = plane.stat_metadata[stat.ref_value].name
        out[name] = value
    return out


def memory_events(logdir: str) -> list[dict[str, Any]]:
    """The allocator's memory events of the profile in ``logdir``, in time order."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    events = []
    for path in glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as handle:
            space.ParseFromString(handle.read())
        for plane in space.planes:
            for line in plane.lines:
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    if name not in ("MemoryAllocation", "MemoryDeallocation"):
                        continue
                    row = _stats(plane, event)
                    row["kind"] = name
                    row["time"] = line.timestamp_ns * 1000 + event.offset_ps
                    events.append(row)
    events.sort(key=lambda r: r["time"])
    return events


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
    parser.add_argument("--per-step", type=int, default=0, metavar="N", help="profile N warm steps one by one, no estimate")
    parser.add_argument("--large", type=float, default=4.0, help="with --per-step: list allocations of this many MiB or more")
    args = parser.parse_args(argv)
    import tensorflow as tf

    from benchmarks.keras_accuracy import CASES, build_case
    from nnmem_callbacks.keras import estimate_training
    from nnmem_callbacks.keras import tf_graph

    if args.batch is not None:
        CASES[args.case] = (args.batch, CASES[args.case][1])
    model, x, y, batch = build_case(args.case)
    if args.per_step:
        return _per_step(model, x, y, args.per_step, args.large)
    traces: list = []
    original = tf_graph.GraphReplayer.replay

    def traced(self: Any, graph: Any, **kwargs: Any) -> Any:
        if kwargs.get("track_phases", True) and self.n == batch and not (self.unlucky or self.newest_first or not self.forwarding):
            self.trace = []
            traces.append(self.trace)
        return original(self, graph, **kwargs)

    tf_graph.GraphReplayer.replay = traced  # type: ignore[method-assign]
    estimate = estimate_training(model, batch, x=x, y=y, probe_kernels=True)
    tf_graph.GraphReplayer.replay = original  # type: ignore[method-assign]
    print(f"predicted allocator peak {estimate.extra['tf_allocator_peak_bytes'] / 2**20:.2f} MiB "
          f"(static {estimate.extra['tf_allocator_static_bytes'] / 2**20:.2f}), upper "
          f"{estimate.extra['tf_allocator_peak_upper_bytes'] / 2**20:.2f}")
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
                print(f"  {row['kind'][6:]:>12} {int(row.get('allocation_bytes', 0) or 0) / 2**20:7.2f} MiB "
                      f"in use {int(row.get('bytes_allocated', 0) or 0) / 2**20:7.2f}  {row.get('tf_op')} "
                      f"{row.get('tensor_shape', '')} {row.get('region_type', '')}")
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
        rows.append({"op": event.get("tf_op", "?"), "shape": event.get("shape", ""), "requested": requested,
                     "charged": charged, "charged_over_requested": charged / requested,
                     "in_use_after": int(event.get("bytes_allocated", 0) or 0)})
    return rows


def _per_step(model: Any, x: Any, y: Any, steps: int, large_mib: float) -> int:
    """Profiles ``steps`` warm steps one by one: each step's peak and its large allocations."""
    import tensorflow as tf

    from benchmarks.keras_accuracy import host_fingerprint
    from benchmarks.provenance import commit_stamp

    host = ", ".join(f"{k} {v}" for k, v in host_fingerprint().items())
    print(f"# {host}; tensorflow {tf.__version__}; TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default')}, "
          f"TF_CPU_ALLOCATOR_USE_BFC={os.environ.get('TF_CPU_ALLOCATOR_USE_BFC', 'unset')}; commit {commit_stamp()}")
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
            print(f"  {row['requested'] / 2**20:7.2f} MiB requested {row['charged'] / 2**20:7.2f} charged, in use after "
                  f"{row['in_use_after'] / 2**20:7.2f}  {row['op']} {row['shape']}{marker}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
