"""The truth of the Keras benchmarks: each backend's measured peak over two real steps, run inside a worker process.

See :mod:`benchmarks.suites.keras_accuracy` for what each truth is and why it is measured in a fresh process.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "state_bytes",
    "measure_tensorflow",
    "measure_tensorflow_fit",
    "measure_jax",
    "measure_jax_device",
    "measure_torch_cuda",
    "largest_live_at_peak",
    "device_name",
    "measure_torch",
    "measure_worker",
]


def state_bytes(model: Any, arrays: list[Any], counted: bool = False) -> int:
    from nnmem_callbacks.allocators.tensorflow_cpu import tf_allocator_bytes
    from nnmem_callbacks.estimators.keras.common import unique, variable_bytes

    sizes = [variable_bytes(v) for v in unique(model.variables) + unique(model.optimizer.variables)]
    sizes += [int(a.nbytes) for a in arrays]
    return sum(tf_allocator_bytes(s) for s in sizes) if counted else sum(sizes)


def measure_tensorflow(model: Any, x: Any, y: Any) -> dict[str, Any]:
    import tensorflow as tf

    info = tf.config.experimental.get_memory_info
    xt, yt = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))
    windows = {}
    for window in ("first", "steady"):
        # counted per window: the first steps build the optimizer, whose slots are then in `current`
        state = state_bytes(model, [x, y], counted=True)
        tf.config.experimental.reset_memory_stats("CPU:0")
        current = info("CPU:0")["current"]
        model.train_on_batch(xt, yt)
        model.train_on_batch(xt, yt)
        after = info("CPU:0")
        windows[window] = {"measured": int(state + after["peak"] - current), "growth": int(after["current"] - current)}
    return {
        "measured_bytes": windows["first"]["measured"],
        "measured_steady_bytes": windows["steady"]["measured"],
        "persistent_growth_first_steps": windows["first"]["growth"],
        "truth": "tf get_memory_info('CPU:0') peak delta + counted state",
    }


def measure_tensorflow_fit(name: str) -> dict[str, Any]:
    """The ``fit`` truth (issue #46): the allocator's peak over a warm ``fit`` epoch, less the data beyond one batch.

    In this fresh process: the level before the model is built, then the case's model compiled with
    :data:`~benchmarks.common.keras_blind_cases.FIT_BATCHES` batches of data, ``fit`` for two epochs (the first
    traces the step, builds the optimizer and warms the allocator), and the peak of the second epoch above that
    level, less ``fit``'s copy of the data beyond one batch. What the Keras callback compares its prediction with.
    """
    import tensorflow as tf

    from benchmarks.common.keras_blind_cases import FIT_BATCHES, build_fit_case
    from nnmem_callbacks.estimators.keras.common import tree_leaves
    from nnmem_callbacks.estimators.keras.tensorflow.step_check import dataset_beyond_one_batch, fit_epoch_peak

    level_before = int(tf.config.experimental.get_memory_info("CPU:0")["current"])
    model, x, y, batch = build_fit_case(name, FIT_BATCHES)
    peak_less_data = fit_epoch_peak(model, x, y, batch, FIT_BATCHES)  # the step check's own measurement
    data = dataset_beyond_one_batch(tree_leaves(x) + tree_leaves(y), FIT_BATCHES)
    return {
        "measured_bytes": peak_less_data - level_before,
        "level_before_bytes": level_before,
        "dataset_beyond_one_batch_bytes": data,
        "truth": f"fit: allocator peak of epoch 2 of {FIT_BATCHES} batches above the level before the model, less "
        "the data beyond one batch",
    }


def measure_jax(model: Any, x: Any, y: Any) -> dict[str, Any]:
    import jax.numpy as jnp

    from nnmem_callbacks.hardware import devices

    xj, yj = jnp.asarray(x), jnp.asarray(y)
    model.train_on_batch(xj, yj)  # compile + one step
    state = state_bytes(model, [x, y])
    exact = devices.reset_rss_peak()
    before = devices.current_rss()
    model.train_on_batch(xj, yj)
    model.train_on_batch(xj, yj)
    peak = devices.read_status_bytes("VmHWM") or devices.current_rss()
    return {
        "measured_bytes": int(state + max(peak - before, 0)),
        "rss_delta_bytes": int(peak - before),
        "exact_rss_peak": bool(exact),
        "truth": "process peak RSS delta over 2 steps after a warm-up step + state bytes",
    }


def measure_jax_device(model: Any, x: Any, y: Any, batch: int) -> dict[str, Any]:
    """The truth on a JAX device with allocator statistics (GPU): ``peak_bytes_in_use`` over two real steps.

    The peak is process-wide and cannot be reset, and XLA's autotuning at compile time can set
    it. So the step is first compiled as the estimator compiles it (XLA's autotuning runs here,
    or its results load from the estimating process's cache), the peak after that compilation
    is read, and then two real ``train_on_batch`` steps run (Keras' own compile finds the
    autotuning results in the process's cache). The peak is the training step's only when it
    rose above the compilation's: ``exact_peak`` says whether it did.
    """
    import jax

    from nnmem_callbacks.estimators.keras.common import input_specs
    from nnmem_callbacks.estimators.keras.estimator import build_like_fit
    from nnmem_callbacks.estimators.keras.jax_xla import compile_train_step

    device = jax.devices()[0]

    def stats() -> dict[str, int]:
        return dict(device.memory_stats() or {})

    if "peak_bytes_in_use" not in stats():
        raise RuntimeError(f"{device.platform} device {device} keeps no memory_stats(); use --device cpu")
    xj, yj = jax.device_put(x), jax.device_put(y)
    x_specs, y_specs, _ = input_specs(model, x, y)
    build_like_fit(model, batch, x_specs, y_specs)  # builds the optimizer's slots, as fit does before its steps
    built = stats()
    compile_train_step(model, batch, x_specs, y_specs)
    compiled = stats()
    model.train_on_batch(xj, yj)  # returns the logs as NumPy values: the step has finished
    first = stats()
    model.train_on_batch(xj, yj)
    after = stats()
    peak = int(after["peak_bytes_in_use"])
    # then fit, whose steps Keras dispatches without waiting for each to finish: kept apart from the truth
    import numpy as np

    steps = 4
    model.fit(np.concatenate([x] * steps), np.concatenate([y] * steps), batch_size=batch, epochs=1, verbose=0)
    fitted = stats()
    return {
        "measured_bytes": peak,
        "peak_after_first_step": int(first["peak_bytes_in_use"]),
        "peak_after_fit": int(fitted["peak_bytes_in_use"]),
        "exact_peak": peak > int(compiled["peak_bytes_in_use"]),
        "bytes_in_use_before_steps": int(compiled["bytes_in_use"]),
        "peak_after_build": int(built["peak_bytes_in_use"]),
        "peak_after_compile": int(compiled["peak_bytes_in_use"]),
        "bytes_in_use_after_steps": int(after["bytes_in_use"]),
        "truth": "JAX peak_bytes_in_use over 2 train_on_batch steps, after the step was compiled (autotuning results "
        "from the estimating process)",
    }


def measure_torch_cuda(model: Any, x: Any, y: Any) -> dict[str, Any]:
    """The truth on CUDA: ``max_memory_allocated`` over two real steps (state and batch already on the device)."""
    import torch

    xt, yt = torch.as_tensor(x, device="cuda"), torch.as_tensor(y, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    record = os.environ.get("NNMEM_BENCH_SNAPSHOT", "")
    if record:
        # "cpp" records the C++ frames too, to name a library call that holds a block (slower)
        stacks = "all" if record == "cpp" else "python"
        torch.cuda.memory._record_memory_history(max_entries=200000, stacks=stacks)  # noqa: SLF001 - PyTorch's documented debugging API
    model.train_on_batch(xt, yt)
    model.train_on_batch(xt, yt)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    extra = {}
    if record:
        extra["largest_live_at_peak"] = largest_live_at_peak(torch.cuda.memory._snapshot())  # noqa: SLF001
        torch.cuda.memory._record_memory_history(enabled=None)  # noqa: SLF001
    return {
        **extra,
        "measured_bytes": int(torch.cuda.max_memory_allocated()),
        "allocated_before_steps": int(before),
        "measured_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        "device_used_bytes": int(total - free),
        "truth": "torch.cuda.max_memory_allocated over 2 train_on_batch steps (fresh process, state and batch on the GPU)",
    }


def largest_live_at_peak(snapshot: dict[str, Any], top: int = 6) -> list[dict[str, Any]]:
    """The largest blocks alive at the peak of a CUDA memory snapshot's trace, with the code that allocated them."""
    live: dict[int, tuple[int, str]] = {}
    running = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}

    def where(frames: list[dict[str, Any]]) -> str:
        python = ""
        for frame in frames:
            name = frame.get("filename", "")
            if "keras" in name or "nnmem" in name or "benchmarks" in name:
                python = f"{name.split('site-packages/')[-1]}:{frame.get('line')} {frame.get('name')}"
                break
        # C++ frames (NNMEM_BENCH_SNAPSHOT=cpp): the library functions below the allocator
        native = [
            str(frame.get("name", ""))[:90]
            for frame in frames
            if any(
                word in str(frame.get("name", "")) for word in ("cudnn", "cublas", "at::native", "autograd", "Cudnn")
            )
        ][:4]
        found = " | ".join(part for part in (python, " < ".join(native)) if part)
        return found or (frames[0].get("name", "?") if frames else "?")

    for event in (snapshot.get("device_traces") or [[]])[0]:
        action, addr, size = event.get("action"), event.get("addr"), int(event.get("size", 0))
        if action == "alloc":
            live[addr] = (size, where(event.get("frames", [])))
            running += size
            if running > peak:
                peak, at_peak = running, dict(live)
        elif action == "free_completed" and addr in live:
            running -= live.pop(addr)[0]
    blocks = sorted(at_peak.values(), reverse=True)[:top]
    return [{"mib": round(size / 2**20, 2), "where": place} for size, place in blocks]


def device_name() -> str:
    """The accelerator the active Keras backend trains on, or ``"cpu"``."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return "cpu" if device.platform == "cpu" else f"{device.device_kind} (jax {jax.__version__})"
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            return (
                f"{torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda}, "
                f"cuDNN {torch.backends.cudnn.version()})"
            )
    return "cpu"


def measure_torch(model: Any, x: Any, y: Any) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.common.groundtruth import allocation_events

    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    state = state_bytes(model, [x, y])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model.train_on_batch(xt, yt)
        model.train_on_batch(xt, yt)
    running, peak = 0, 0
    for event in allocation_events(prof, "cpu"):
        running += event.extra_fields.alloc_size
        peak = max(peak, running)
    return {"measured_bytes": int(state + peak), "truth": "torch profiler allocation events over 2 steps + state bytes"}


def measure_worker(name: str, truth: str = "steps") -> dict[str, Any]:
    """The truth alone, in a process that never ran the estimator (TensorFlow; JAX and torch on a GPU).

    ``truth="fit"`` (TensorFlow): :func:`measure_tensorflow_fit`; ``"steps"``: the first two ``train_on_batch`` steps.
    """
    import keras

    if truth == "fit" and keras.backend.backend() == "tensorflow":
        from benchmarks.common.keras_blind_cases import BLIND_CASES
        from benchmarks.common.keras_cases import CASES

        batch = (BLIND_CASES.get(name) or CASES[name])[0]
        return {"case": name, "batch_size": batch, **measure_tensorflow_fit(name)}

    from benchmarks.common.keras_blind_cases import build_any_case

    model, x, y, batch = build_any_case(name)
    backend = keras.backend.backend()
    if backend == "jax":
        return {"case": name, "batch_size": batch, **measure_jax_device(model, x, y, batch)}
    if backend == "torch":
        return {"case": name, "batch_size": batch, **measure_torch_cuda(model, x, y)}
    return {"case": name, "batch_size": batch, **measure_tensorflow(model, x, y)}
