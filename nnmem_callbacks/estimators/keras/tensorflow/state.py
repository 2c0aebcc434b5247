"""The model's variables as the TensorFlow replay's allocator finds them: which exist, in which order, which were
made through a random initializer's temporaries, and which graph placeholder reads each.

Design: ``docs/keras-tensorflow-replay.md`` (the allocator after the model is built).
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_state", "initialized_at_random", "resource_indices", "state_variables"]


def initialized_at_random(variable: Any) -> bool:
    """Whether ``variable`` holds values of a random initializer (not all equal), as Keras' build left it.

    Tells :func:`~nnmem_callbacks.allocators.tensorflow_cpu.allocator_after_build`
    which variables were made through an initializer's temporaries. It reads
    the values (two reductions to scalars); a variable already trained or
    loaded reads as random. A variable that cannot be reduced (booleans,
    strings) counts as constant.

    Example:
        >>> import tensorflow as tf
        >>> initialized_at_random(tf.Variable(tf.zeros([3]))), initialized_at_random(tf.Variable([1.0, 2.0]))
        (False, True)
    """
    import tensorflow as tf

    value = getattr(variable, "value", variable)  # a property of Keras variables, a method of ``tf.Variable``
    try:
        value = value() if callable(value) else value
        if int(tf.size(value)) < 2:
            return False
        return bool(tf.reduce_max(value) != tf.reduce_min(value))
    except Exception:  # noqa: BLE001 - a dtype without an order
        return False


def state_variables(model: Any) -> tuple[list, list]:
    """The model's variables and the optimizer's own, each in creation order (the order of :func:`build_state`)."""
    from nnmem_callbacks.estimators.keras.common import unique

    model_variables = unique(model.variables)
    seen = {id(v) for v in model_variables}
    return model_variables, [v for v in unique(model.optimizer.variables) if id(v) not in seen]


def build_state(model: Any) -> list[tuple[int, bool]]:
    """``(bytes, initialized_at_random)`` of the model's variables, then the optimizer's, in creation order."""
    from nnmem_callbacks.estimators.keras.common import variable_bytes

    model_variables, optimizer_variables = state_variables(model)
    return [(variable_bytes(v), initialized_at_random(v)) for v in model_variables] + [
        (variable_bytes(v), False) for v in optimizer_variables
    ]


def resource_indices(graph: Any, model: Any) -> dict[Any, int]:
    """The :func:`build_state` index of the variable behind each resource placeholder of ``graph`` (by tensor ref).

    A traced step captures each variable's handle; the graph reads and updates
    the variable through the placeholder the capture made. Captures of no
    model or optimizer variable (metrics' counters) are left out.
    """
    model_variables, optimizer_variables = state_variables(model)
    index_of_handle = {}
    for index, variable in enumerate(model_variables + optimizer_variables):
        handle = getattr(getattr(variable, "value", variable), "handle", None)
        if handle is not None:
            index_of_handle[id(handle)] = index
    return {
        internal.ref(): index_of_handle[id(external)]
        for external, internal in getattr(graph, "captures", ())
        if id(external) in index_of_handle
    }
