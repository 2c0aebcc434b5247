"""JAX backend: compile the stateless Keras train step and read XLA's buffer assignment.

The step Keras' JAX trainer jits (``model.train_step`` on the state and the batch, the state donated) is lowered on
:class:`jax.ShapeDtypeStruct` arguments (nothing is allocated, nothing runs) and compiled at the batch and at twice
it; ``memory_analysis()`` gives ``arguments + outputs - aliases + temporaries``. Where JAX's GPU allocator is a BFC
allocator (preallocated or growing on demand), the state's, the batch's and the step's allocations are also replayed
through it (:mod:`nnmem_callbacks.allocators.bfc`; ``extra["xla_allocator_peak_bytes"]``), and planning allows for
the temporary buffer being charged up to twice its size.

Design and evidence: docs/keras-jax-xla.md.

Known limitations:
    * XLA's temporary buffer holds activations, gradients and temporaries together; gradients are reported as the
      trainable parameters' size and the rest of the buffer as activations.
    * On CPU, JAX has no allocator statistics; the prediction is what XLA assigns, and the measurable truth (the
      process RSS) also holds compiled code and runtime overheads.
    * The allocator replay knows only the state, the batch and the step's buffers, in that order (not arrays the
      process allocated before); with ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` or ``cuda_async`` there is no BFC
      allocator, and the buffers' peak is the prediction.
    * ``fit`` prefetches batches onto the device: its peak was up to 3.1 MiB above two ``train_on_batch`` steps.
    * The first ``fit`` step also keeps the model's own (non-donated) copy of the variables until Keras purges them;
      that copy is counted once in ``parameters``/``optimizer_state``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from nnmem_callbacks.allocators.bfc import BFCSimulator
from nnmem_callbacks.core.estimate import Category, MemoryEstimate, PhaseLine, upper_envelope
from nnmem_callbacks.core.units import format_bytes

__all__ = [
    "allocator_peak",
    "compile_train_step",
    "DEFAULT_MEM_FRACTION",
    "estimate_jax",
    "state_array_bytes",
    "xla_allocator_mode",
]

#: JAX's default share of the GPU that its allocator preallocates (``XLA_PYTHON_CLIENT_MEM_FRACTION``).
DEFAULT_MEM_FRACTION = 0.75


def xla_allocator_mode(platform: str) -> str:
    """How JAX's allocator on ``platform`` hands out memory, read from the environment JAX reads.

    Returns:
        ``"none"`` on CPU (no allocator statistics), ``"platform"`` or ``"cuda_async"``
        (``XLA_PYTHON_CLIENT_ALLOCATOR``: no BFC allocator), ``"bfc-growth"``
        (``XLA_PYTHON_CLIENT_PREALLOCATE=false``: regions on demand) or
        ``"bfc-preallocated"`` (JAX's default).

    Example:
        >>> xla_allocator_mode("cpu")
        'none'
    """
    if platform == "cpu":
        return "none"
    allocator = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").strip().lower()
    if allocator in ("platform", "cuda_async"):
        return allocator
    preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").strip().lower() not in ("0", "false")
    return "bfc-preallocated" if preallocate else "bfc-growth"


def allocator_peak(
    resident: list[int], step_buffers: list[int], mode: str, pool_bytes: int | None = None
) -> tuple[int, int]:
    """What the device's allocator reports at the step's peak: ``(peak_bytes_in_use, bytes reserved)``.

    Args:
        resident: Bytes of each array alive before the step, in the order they were
            allocated (the state, then the batch).
        step_buffers: Bytes of each buffer the step allocates (its outputs that do not
            reuse a donated argument, then XLA's temporary buffer).
        mode: :func:`xla_allocator_mode`.
        pool_bytes: The preallocated region (``"bfc-preallocated"``); default: as large as needed.

    Example:
        >>> MiB = 1 << 20
        >>> allocator_peak([3 * MiB], [17 * MiB], "bfc-growth")[0] // MiB  # the 17 MiB buffer takes a 32 MiB region
        36
        >>> allocator_peak([3 * MiB], [17 * MiB], "bfc-preallocated")[0] // MiB
        20
    """
    if mode not in ("bfc-growth", "bfc-preallocated"):
        total = sum(resident) + sum(step_buffers)
        return total, total
    if mode == "bfc-preallocated":
        needed = sum(BFCSimulator.rounded(b) for b in resident + step_buffers)
        bfc = BFCSimulator(preallocated_bytes=max(int(pool_bytes or 0), needed))
    else:
        bfc = BFCSimulator()
    for size in resident:
        if size > 0:
            bfc.alloc(size)
    for size in step_buffers:
        if size > 0:
            bfc.alloc(size)
    return bfc.peak, bfc.reserved


def state_array_bytes(model: Any) -> list[int]:
    """Bytes of each array of the train step's state, in the order Keras creates them (the allocator's order).

    The model's variables, then the optimizer's and the metrics'.
    """
    from nnmem_callbacks.estimators.keras.common import unique, variable_bytes

    variables = model.trainable_variables + model.non_trainable_variables
    variables += unique(model.optimizer.variables) + model.metrics_variables
    return [variable_bytes(v) for v in variables]


def _struct(variable: Any) -> Any:
    import jax

    value = variable.value
    return jax.ShapeDtypeStruct(tuple(value.shape), value.dtype)


def compile_train_step(model: Any, batch_size: int, x_specs: Any, y_specs: Any) -> Any:
    """The compiled Keras JAX train step for this batch size."""
    import jax
    import numpy as np

    from nnmem_callbacks.estimators.keras.common import tree_map

    state = (
        [_struct(v) for v in model.trainable_variables],
        [_struct(v) for v in model.non_trainable_variables],
        [_struct(v) for v in model.optimizer.variables],
        [_struct(v) for v in model.metrics_variables],
    )

    def data_struct(spec: Any) -> Any:
        return jax.ShapeDtypeStruct(spec.at(batch_size), np.dtype(spec.dtype))

    data = (tree_map(data_struct, x_specs), tree_map(data_struct, y_specs))
    return jax.jit(model.train_step, donate_argnums=0).lower(state, data).compile()


def estimate_jax(
    model: Any, batch_size: int, x_specs: Any, y_specs: Any, notes: list[str], check_scaling: bool = True
) -> MemoryEstimate:
    """Estimates the JAX train step from XLA's memory analysis."""
    import jax

    from nnmem_callbacks.estimators.keras.common import (
        accumulation_steps,
        precision_of,
        static_bytes,
        tree_leaves,
        unique,
    )

    started = time.perf_counter()
    analyses = {}
    for n in (batch_size, 2 * batch_size) if check_scaling else (batch_size,):
        analysis = compile_train_step(model, n, x_specs, y_specs).memory_analysis()
        if analysis is None:
            raise RuntimeError("this JAX/XLA build gives no memory_analysis() for compiled functions")
        analyses[n] = analysis

    def peak_of(analysis: Any) -> int:
        return int(
            analysis.argument_size_in_bytes
            + analysis.output_size_in_bytes
            - analysis.alias_size_in_bytes
            + analysis.temp_size_in_bytes
        )

    main = analyses[batch_size]
    peak = peak_of(main)
    static = static_bytes(model, unique(model.optimizer.variables))
    inputs = sum(spec.nbytes(batch_size) for spec in tree_leaves(x_specs) + tree_leaves(y_specs))
    if check_scaling:
        slope = max(int(round((peak_of(analyses[2 * batch_size]) - peak) / batch_size)), 0)
    else:
        # one compile: the temporary buffer and the batch are assumed to grow linearly from zero
        slope = int((main.temp_size_in_bytes + inputs) // batch_size)
        notes.append("batch scaling not compiled (check_scaling=False): growth per sample assumed from the temporaries")
    temp = int(main.temp_size_in_bytes)
    gradients = min(static[Category.PARAMETERS.value], temp)
    breakdown = dict(static)
    breakdown[Category.INPUTS.value] = inputs
    breakdown[Category.GRADIENTS.value] = gradients
    breakdown[Category.ACTIVATIONS.value] = temp - gradients
    # what remains: metrics state, non-aliased outputs (logs), argument padding
    breakdown[Category.TEMPORARIES.value] = max(peak - sum(breakdown.values()), 0)
    if sum(breakdown.values()) != peak:
        breakdown[Category.ACTIVATIONS.value] -= sum(breakdown.values()) - peak
    notes.append("XLA's temporary buffer holds activations, gradients and temporaries together (split approximately)")
    accumulate = accumulation_steps(model)
    if accumulate > 1:
        notes.append(f"gradient_accumulation_steps={accumulate}: accumulators are counted in optimizer_state")
    device = jax.devices()[0]
    line = PhaseLine("step", peak - slope * batch_size, slope)
    mode = xla_allocator_mode(device.platform)
    extra: dict[str, Any] = {"xla_allocator": mode}
    variability = None
    if mode.startswith("bfc"):
        # the state's and the batch's arrays, then what the step allocates: what peak_bytes_in_use will count
        resident = state_array_bytes(model)
        resident += [spec.nbytes(batch_size) for spec in tree_leaves(x_specs) + tree_leaves(y_specs)]
        outputs = max(int(main.output_size_in_bytes - main.alias_size_in_bytes), 0)
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        pool = int((stats or {}).get("bytes_limit", 0)) or None
        charged, reserved = allocator_peak(resident, [outputs, int(main.temp_size_in_bytes)], mode, pool)
        extra["xla_allocator_peak_bytes"] = max(int(charged), 0)
        if mode == "bfc-growth":
            extra["xla_allocator_reserved_bytes"] = int(reserved)
            # a buffer that needs more than half of a free chunk is charged all of it: up to twice the temporaries
            temp_slope = 0
            if 2 * batch_size in analyses:
                temp_slope = max(int(round((analyses[2 * batch_size].temp_size_in_bytes - temp) / batch_size)), 0)
            variability = PhaseLine("allocator regions", temp - temp_slope * batch_size, temp_slope)
            notes.append(
                f"JAX allocates on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false): its allocator charges whole regions, "
                f"so peak_bytes_in_use is predicted at {format_bytes(charged)} for buffers of {format_bytes(peak)}; "
                f"planning allows for the temporary buffer ({format_bytes(temp)}) being charged twice"
            )
    return MemoryEstimate(
        peak_bytes=peak,
        breakdown=breakdown,
        batch_size=batch_size,
        phases=tuple(upper_envelope([line])),
        peak_phase="step",
        device=f"{device.platform}:{device.id}" if device.platform != "cpu" else "cpu",
        precision=precision_of(model),
        method="xla-memory-analysis",
        notes=tuple(notes),
        variability=variability,
        extra={
            **extra,
            "backend": "jax",
            "argument_bytes": int(main.argument_size_in_bytes),
            "output_bytes": int(main.output_size_in_bytes),
            "alias_bytes": int(main.alias_size_in_bytes),
            "temp_bytes": temp,
            "generated_code_bytes": int(getattr(main, "generated_code_size_in_bytes", 0) or 0),
            "seconds": round(time.perf_counter() - started, 3),
        },
    )
