"""How much of the TensorFlow estimate's error is the allocator model's, and how much is the request stream's.

    python -m benchmarks.tf_allocator_fidelity --cases mobilenetv3small,cnn_bilstm_text --host-tag avx512

The replay predicts what ``get_memory_info('CPU:0')['peak']`` reports over the
first two train steps in two parts: the stream of allocation requests the
kernels make (the graph replay), and what the best-fit-with-coalescing allocator
charges for that stream (:class:`~nnmem_callbacks.keras.tf_allocator.BFCSimulator`,
whole chunks, doubling regions). This benchmark separates them. Each case runs
in a fresh process with oneDNN off and ``TF_CPU_ALLOCATOR_USE_BFC=true`` under
``tf.profiler.experimental``, from before the model is built to after the two
steps; the profiler's ``MemoryAllocation``/``MemoryDeallocation`` events give
every request in order. Three figures for the steps' window (peak bytes in use
minus bytes in use when the window opens):

* **real**: the allocator's own ``bytes_allocated`` in the events;
* **simulator, full history**: the real requests, from the first event of the
  process, fed to :class:`BFCSimulator` (the allocator model alone: its error
  is what the chunk and region rules get wrong);
* **simulator, state only**: the window's real requests fed to a simulator that
  holds only the variables, optimizer slots and batch, as the replay's does
  (the difference from the full history is what the process's earlier
  allocations, such as the initializers' temporaries, change in the regions).

What the replay adds beyond these (its own request stream: the executor's
order, scratch, lists) is the rest of the error in
``benchmarks/results/keras_tensorflow_cpu_*_onednn0.md``.

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
import subprocess
import sys
import tempfile
import time
from typing import Any

#: The request size of the marker tensor allocated right before the window (12345 float32 elements).
MARKER_ELEMENTS = 12345


def _feed(simulator: Any, events: list[dict[str, Any]], live: dict[Any, int]) -> int:
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


def worker(name: str, batch_size: int | None = None) -> dict[str, Any]:
    """One case in this (fresh) process: the three window peaks in bytes."""
    import tensorflow as tf

    from benchmarks.keras_accuracy import CASES, build_case
    from benchmarks.tf_memory_events import memory_events
    from nnmem_callbacks.keras.common import unique, variable_bytes
    from nnmem_callbacks.keras.tf_allocator import BFCSimulator, tf_allocator_bytes

    if batch_size is not None:
        CASES[name] = (batch_size, CASES[name][1])
    logdir = tempfile.mkdtemp(prefix="tf-fidelity-")
    tf.profiler.experimental.start(logdir)
    model, x, y, batch = build_case(name)
    xt, yt = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))
    model.optimizer.build(model.trainable_variables)
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
    _feed(history, events[:start], live)
    full_history = _feed(history, events[start:], live)

    state_only = BFCSimulator()
    sizes = [variable_bytes(v) for v in unique(model.variables) + unique(model.optimizer.variables)]
    for size in sizes + [int(x.nbytes), int(y.nbytes)]:
        if tf_allocator_bytes(size, min_bytes=0):
            state_only.alloc(size)
    state = _feed(state_only, events[start:], {})
    return {
        "case": name, "batch_size": batch, "events": len(events), "window_events": len(events) - start,
        "real_bytes": real, "full_history_bytes": full_history, "state_only_bytes": state,
    }


def run_isolated(name: str, batch_size: int | None, timeout: int = 900) -> dict[str, Any]:
    env = dict(
        os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore",
        TF_ENABLE_ONEDNN_OPTS="0", TF_CPU_ALLOCATOR_USE_BFC="true",
    )
    command = [sys.executable, "-m", "benchmarks.tf_allocator_fidelity", "--worker", name]
    if batch_size is not None:
        command += ["--batch", str(batch_size)]
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
    except subprocess.TimeoutExpired:
        return {"case": name, "error_text": f"timeout after {timeout}s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"case": name, "error_text": (done.stderr or done.stdout).strip().splitlines()[-1:]}


def _relative(row: dict[str, Any], key: str) -> float:
    return (row[key] - row["real_bytes"]) / row["real_bytes"] if row["real_bytes"] else 0.0


def to_markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    mib = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
    lines = ["# TensorFlow allocator model vs the real allocator (oneDNN off, BFC)", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "| case | batch | real (MiB) | simulator, full history | error | simulator, state only | error |", "|---|---|---|---|---|---|---|"]
    good = [r for r in rows if "error_text" not in r]
    for row in rows:
        if "error_text" in row:
            lines.append(f"| {row['case']} | - | failed: {row['error_text']} | | | | |")
            continue
        lines.append(
            f"| {row['case']} | {row['batch_size']} | {mib(row['real_bytes'])} | {mib(row['full_history_bytes'])} | "
            f"{_relative(row, 'full_history_bytes') * 100:+.2f}% | {mib(row['state_only_bytes'])} | "
            f"{_relative(row, 'state_only_bytes') * 100:+.2f}% |"
        )
    if good:
        lines.append("")
        for key, label in (("full_history_bytes", "full history"), ("state_only_bytes", "state only")):
            errors = [abs(_relative(r, key)) for r in good]
            lines.append(f"- {label}: median |error| {statistics.median(errors) * 100:.2f}%, worst {max(errors) * 100:.2f}% over {len(good)} cases")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.keras_accuracy import CASES, _commit, host_fingerprint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--host-tag", default="", help="a name for the host in the output file names")
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
        "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPU_ALLOCATOR_USE_BFC": "true",
        "window": "the first two train_on_batch steps (optimizer built before), one fresh process per case, under the profiler",
        "elapsed_s": round(time.perf_counter() - started, 1),
        "commit": _commit(),
    }
    stem = os.path.join(args.out, "tf_allocator_fidelity_cpu" + (f"_{args.host_tag}" if args.host_tag else ""))
    os.makedirs(args.out, exist_ok=True)
    with open(stem + ".json", "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "rows": rows}, handle, indent=2)
    with open(stem + ".md", "w", encoding="utf-8") as handle:
        handle.write(to_markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
