"""JAX backend: compile the stateless Keras train step and read XLA's buffer assignment.

Keras' JAX trainer runs ``jax.jit(model.train_step, donate_argnums=0)`` on
``state = (trainable, non_trainable, optimizer, metrics variables)`` and the
batch. The same function is lowered here on :class:`jax.ShapeDtypeStruct`
arguments (nothing is allocated, nothing runs) and compiled; the compiled
executable's ``memory_analysis()`` gives the bytes of the arguments, outputs,
aliases (donated state updated in place) and XLA's temporary buffer. The peak is
``arguments + outputs - aliases + temporaries``.

The step is compiled at the requested batch size and at twice it, which gives
the growth per sample.

Known limitations:
    * XLA's temporary buffer holds activations, gradients and temporaries
      together; gradients are reported as the trainable parameters' size (they
      are all live before the update) and the rest of the buffer as activations.
    * On CPU, JAX has no allocator statistics (``memory_stats()`` is ``None``);
      the prediction is what XLA assigns, and the measurable truth is the
      process RSS, which also holds compiled code and runtime overheads.
    * The first ``fit`` step on JAX also keeps the model's own (non-donated)
      copy of the variables until Keras purges them; that copy is counted once
      in ``parameters``/``optimizer_state``.
"""

from __future__ import annotations

import time
from typing import Any

from nnmem_callbacks.estimate import Category, MemoryEstimate, PhaseLine, upper_envelope


def _struct(variable: Any) -> Any:
    import jax

    value = variable.value
    return jax.ShapeDtypeStruct(tuple(value.shape), value.dtype)


def compile_train_step(model: Any, batch_size: int, x_specs: Any, y_specs: Any) -> Any:
    """The compiled Keras JAX train step for this batch size."""
    import jax
    import numpy as np

    from nnmem_callbacks.keras.common import tree_map

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

    from nnmem_callbacks.keras.common import accumulation_steps, precision_of, static_bytes, tree_leaves, unique

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
        extra={
            "backend": "jax",
            "argument_bytes": int(main.argument_size_in_bytes),
            "output_bytes": int(main.output_size_in_bytes),
            "alias_bytes": int(main.alias_size_in_bytes),
            "temp_bytes": temp,
            "generated_code_bytes": int(getattr(main, "generated_code_size_in_bytes", 0) or 0),
            "seconds": round(time.perf_counter() - started, 3),
        },
    )
