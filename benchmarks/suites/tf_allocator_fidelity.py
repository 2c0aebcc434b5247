"""How much of the TensorFlow estimate's error is the allocator model's, and how much is the request stream's.

    python -m benchmarks.suites.tf_allocator_fidelity --cases mobilenetv3small,cnn_bilstm_text --host-tag zen4-avx512

Writes ``benchmarks/results/tf_allocator_fidelity/<host-tag>.{json,md}`` (default ``cpu``).

The replay predicts what ``get_memory_info('CPU:0')['peak']`` reports over the
first two train steps in two parts: the stream of allocation requests the
kernels make (the graph replay), and what the best-fit-with-coalescing allocator
charges for that stream (:class:`~nnmem_callbacks.allocators.tensorflow_cpu.BFCSimulator`,
whole chunks, doubling regions). This benchmark separates them. Each case runs
in a fresh process with oneDNN off and ``TF_CPU_ALLOCATOR_USE_BFC=true`` under
``tf.profiler.experimental``, from before the model is built to after the two
steps; the profiler's ``MemoryAllocation``/``MemoryDeallocation`` events give
every request in order. Four figures for the steps' window (peak bytes in use
minus bytes in use when the window opens):

* **real**: the allocator's own ``bytes_allocated`` in the events;
* **simulator, full history**: the real requests, from the first event of the
  process, fed to :class:`BFCSimulator` (the allocator model alone: its error
  is what the chunk and region rules get wrong);
* **simulator, live buffers only**: the window's real requests fed to a
  simulator that holds only the buffers live when the window opens (the
  variables, slots, batch), allocated in their real order, as if nothing had
  been freed before (the difference from the full history is what the
  process's earlier, freed allocations change in where the chunks lie);
* **simulator, as the replay starts**: the same, from
  :func:`~nnmem_callbacks.allocators.tensorflow_cpu.allocator_after_build` of the
  model's variables (the estimator's own start: each randomly initialized
  variable made through its initializer's two temporaries).

In the last two, a live buffer that the window frees (a variable's old value,
replaced by its first update) is freed in the simulator too: it is matched to
its chunk (by order and size for the replay's start). Until 2026-11-25 the
"state only" column ignored those frees, which left up to 60 MiB of old
values allocated in the simulator (ResNet-50: +83 %); that was the column's
error, not the start state's.

What the replay adds beyond these (its own request stream: the executor's
order, scratch, lists) is the rest of the error in
``benchmarks/results/keras_tensorflow_cpu/*_onednn0.md``.

Known limitations:
    * oneDNN off only: with oneDNN on, TensorFlow's ``MklCPUAllocator`` sends
      allocations under 256 KiB to another pool, and the events do not say which
      pool served a request.
    * The profiler slows the executor, which changes which of two racing
      kernels allocates first: the window's peak under the profiler is one
      draw of the real distribution (the three figures share the draw).
    * The optimizer is built before the window (its slots are state), as the
      replay assumes; the accuracy benchmark's first window builds it inside.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from benchmarks.common.tf_profiler import MARKER_ELEMENTS, memory_events

__all__ = ["feed_events", "start_from_build", "worker", "run_isolated", "STARTS", "to_markdown", "main"]


def feed_events(simulator: Any, events: list[dict[str, Any]], live: dict[Any, int]) -> int:
    """Feeds ``events`` to ``simulator``; returns its peak bytes in use above where it started."""
    base, peak = simulator.in_use, 0
    for event in events:
        address = event.get("addr")
        if event["kind"] == "MemoryAllocation":
            live[address] = simulator.alloc(int(event.get("requested_bytes", 0) or 0))
        else:
            chunk = live.pop(address, None)
            if chunk is not None:
                simulator.free(chunk)
        peak = max(peak, simulator.in_use - base)
    return peak


def _live_at(events: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """The allocation events still live after ``events``, by address, in allocation order."""
    live: dict[Any, dict[str, Any]] = {}
    for event in events:
        if event["kind"] == "MemoryAllocation":
            live[event.get("addr")] = event
        else:
            live.pop(event.get("addr"), None)
    return live


def start_from_build(state: list[tuple[int, bool]], live: dict[Any, dict[str, Any]]) -> tuple[Any, dict[Any, int]]:
    """The replay's start (:func:`allocator_after_build` of ``state``) with the real ``live`` buffers mapped onto it.

    The real buffers are matched to the state's chunks in order, by rounded size;
    those that match none (the batch, resource handles) are allocated after.

    Example:
        >>> live = {"w": {"requested_bytes": 1000}, "h": {"requested_bytes": 8}, "x": {"requested_bytes": 4000}}
        >>> bfc, chunks = start_from_build([(1000, True)], live)
        >>> sorted(chunks), bfc.in_use  # w on the state's chunk; h and x after it
        (['h', 'w', 'x'], 5376)
    """
    from nnmem_callbacks.allocators.bfc import BFCSimulator
    from nnmem_callbacks.allocators.tensorflow_cpu import allocator_after_build

    simulator, state_chunks = allocator_after_build(state, min_bytes=0)
    placed = [(BFCSimulator.rounded(size), chunk) for (size, _), chunk in zip(state, state_chunks) if chunk is not None]
    chunks: dict[Any, int] = {}
    rest = []
    index = 0
    for address, event in live.items():
        rounded = BFCSimulator.rounded(int(event.get("requested_bytes", 0) or 0))
        if index < len(placed) and placed[index][0] == rounded:
            chunks[address] = placed[index][1]
            index += 1
        else:
            rest.append((address, event))
    for address, event in rest:
        chunks[address] = simulator.alloc(int(event.get("requested_bytes", 0) or 0))
    return simulator, chunks


def worker(name: str, batch_size: int | None = None) -> dict[str, Any]:
    """One case in this (fresh) process: the window peaks in bytes."""
    import tensorflow as tf

    from benchmarks.common.keras_cases import CASES, build_case
    from nnmem_callbacks.allocators.bfc import BFCSimulator
    from nnmem_callbacks.estimators.keras.tensorflow.state import build_state

    if batch_size is not None:
        CASES[name] = (batch_size, CASES[name][1])
    logdir = tempfile.mkdtemp(prefix="tf-fidelity-")
    tf.profiler.experimental.start(logdir)
    model, x, y, batch = build_case(name)
    xt, yt = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))
    model.optimizer.build(model.trainable_variables)
    state = build_state(model)  # before the steps change the values
    marker = tf.zeros([MARKER_ELEMENTS])
    del marker
    for _ in range(2):
        model.train_on_batch(xt, yt)
    tf.profiler.experimental.stop()
    events = memory_events(logdir)
    marker_bytes = MARKER_ELEMENTS * 4
    start = next(i for i, e in enumerate(events) if int(e.get("requested_bytes", 0) or 0) == marker_bytes)
    in_use_at_start = int(events[start - 1].get("bytes_allocated", 0) or 0) if start else 0
    real = max(int(e.get("bytes_allocated", 0) or 0) for e in events[start:]) - in_use_at_start

    history = BFCSimulator()
    live: dict[Any, int] = {}
    feed_events(history, events[:start], live)
    full_history = feed_events(history, events[start:], live)

    live_events = _live_at(events[:start])
    live_only = BFCSimulator()
    chunks = {address: live_only.alloc(int(e.get("requested_bytes", 0) or 0)) for address, e in live_events.items()}
    live_only_peak = feed_events(live_only, events[start:], chunks)

    from_build, chunks = start_from_build(state, live_events)
    from_build_peak = feed_events(from_build, events[start:], chunks)
    return {
        "case": name,
        "batch_size": batch,
        "events": len(events),
        "window_events": len(events) - start,
        "real_bytes": real,
        "full_history_bytes": full_history,
        "live_only_bytes": live_only_peak,
        "replay_start_bytes": from_build_peak,
    }


def run_isolated(name: str, batch_size: int | None, timeout: int = 900) -> dict[str, Any]:
    from benchmarks.common.isolated import run_worker

    env = dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONWARNINGS="ignore",
        TF_ENABLE_ONEDNN_OPTS="0",
        TF_CPU_ALLOCATOR_USE_BFC="true",
    )
    arguments = ["--worker", name] + (["--batch", str(batch_size)] if batch_size is not None else [])
    row = run_worker("benchmarks.suites.tf_allocator_fidelity", arguments, env=env, timeout=timeout)
    return {"case": name, **row} if "error_text" in row else row


def _relative(row: dict[str, Any], key: str) -> float:
    return (row[key] - row["real_bytes"]) / row["real_bytes"] if row["real_bytes"] else 0.0


#: The simulated start states: result key and column title.
STARTS = (
    ("full_history_bytes", "full history"),
    ("live_only_bytes", "live buffers only"),
    ("replay_start_bytes", "as the replay starts"),
)


def to_markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    mib = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
    lines = ["# TensorFlow allocator model vs the real allocator (oneDNN off, BFC)", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    header = "| case | batch | real (MiB) | " + " | ".join(f"simulator, {title} | error" for _, title in STARTS) + " |"
    lines += ["", header, "|" + "---|" * (3 + 2 * len(STARTS))]
    good = [r for r in rows if "error_text" not in r and all(key in r for key, _ in STARTS)]
    for row in rows:
        if row not in good:
            lines.append(
                f"| {row['case']} | - | failed: {row.get('error_text', 'incomplete row')} |" + " |" * (2 * len(STARTS))
            )
            continue
        cells = " | ".join(f"{mib(row[key])} | {_relative(row, key) * 100:+.2f}%" for key, _ in STARTS)
        lines.append(f"| {row['case']} | {row['batch_size']} | {mib(row['real_bytes'])} | {cells} |")
    if good:
        lines.append("")
        for key, label in STARTS:
            errors = [abs(_relative(r, key)) for r in good]
            lines.append(
                f"- {label}: median |error| {statistics.median(errors) * 100:.2f}%, worst {max(errors) * 100:.2f}% over {len(good)} cases"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common.keras_cases import CASES
    from benchmarks.common.keras_env import host_fingerprint
    from benchmarks.common.paths import result_dir
    from benchmarks.tools.provenance import commit_stamp, write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", default=str(result_dir("tf_allocator_fidelity")), help="where <host-tag>.{json,md} go")
    parser.add_argument("--host-tag", default="cpu", help="the result's file name: the host (zen4-avx512, ...)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=None, help="the batch size instead of each case's own")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch)), flush=True)
        return 0
    unknown = [c for c in args.cases.split(",") if c and c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; valid: {', '.join(CASES)}")
    started = time.perf_counter()
    rows = []
    for name in [c for c in args.cases.split(",") if c]:
        row = run_isolated(name, args.batch)
        rows.append(row)
        print(json.dumps(row), flush=True)
    import tensorflow as tf

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "tensorflow": tf.__version__,
        "keras": __import__("keras").__version__,
        **host_fingerprint(),
        "TF_ENABLE_ONEDNN_OPTS": "0",
        "TF_CPU_ALLOCATOR_USE_BFC": "true",
        "window": "the first two train_on_batch steps (optimizer built before), one fresh process per case, under the profiler",
        "elapsed_s": round(time.perf_counter() - started, 1),
        "commit": commit_stamp(),
    }
    write_result(args.out, args.host_tag, {"meta": meta, "rows": rows}, to_markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
