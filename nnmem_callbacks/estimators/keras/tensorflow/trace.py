"""Collecting the TensorFlow graph of a train step, and reading what it fixes statically.

:func:`trace_train_step` traces ``model.train_step`` into a ``FuncGraph``;
:func:`function_lookup` finds the graphs of the functions it calls (``If``
branches, ``While`` bodies, ``PartitionedCall``); the helpers below read tensor
sizes (:class:`Size`, a polynomial in the batch size) and constant values from
the graph. :func:`~nnmem_callbacks.allocators.tensorflow_cpu.onednn_enabled` and :func:`inter_op_threads` read how this
process's TensorFlow runs the graph.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

__all__ = [
    "const_value",
    "constant_array",
    "dtype_size",
    "element_bytes",
    "function_lookup",
    "identity_permutation",
    "inter_op_threads",
    "reads_variable",
    "shape_size",
    "Size",
    "tensor_input_name",
    "trace_train_step",
]


@dataclasses.dataclass
class Size:
    """Bytes of a tensor as a polynomial in the batch size: ``sum(coef[k] * n**k)``."""

    coefs: tuple[int, ...]

    def at(self, n: int) -> int:
        return int(sum(c * n**k for k, c in enumerate(self.coefs)))


def shape_size(shape: Any, dtype_size: int) -> Size | None:
    """The size of a static shape whose unknown dimensions equal the batch size."""
    if shape.rank is None:
        return None
    known = dtype_size
    unknown = 0
    for dim in shape.as_list():
        if dim is None:
            unknown += 1
        else:
            known *= int(dim)
    coefs = [0] * (unknown + 1)
    coefs[unknown] = known
    return Size(tuple(coefs))


def dtype_size(dtype: Any) -> int:
    if dtype.name in ("resource", "variant", "string"):
        return 0
    try:
        return int(dtype.size)
    except Exception:  # noqa: BLE001 - exotic dtypes
        return 0


def tensor_input_name(tensor: Any) -> str:
    """The name a ``GraphDef`` input string gives ``tensor`` (``op`` for output 0, ``op:i`` else)."""
    return tensor.op.name if tensor.value_index == 0 else f"{tensor.op.name}:{tensor.value_index}"


def constant_array(tensor: Any) -> Any:
    """The value of ``tensor`` when the graph fixes it (a numpy array), else ``None``."""
    from tensorflow.python.framework import tensor_util

    try:
        return tensor_util.constant_value(tensor)
    except Exception:  # noqa: BLE001
        return None


def identity_permutation(op: Any) -> bool:
    perm = constant_array(op.inputs[1])
    return perm is not None and [int(v) for v in perm.reshape(-1)] == list(range(int(perm.size)))


def reads_variable(tensor: Any) -> bool:
    while (
        tensor.op.type in ("Identity", "Cast")
        and tensor.op.inputs
        and (tensor.op.type == "Identity" or tensor.op.inputs[0].dtype == tensor.dtype)
    ):
        tensor = tensor.op.inputs[0]
    return tensor.op.type == "ReadVariableOp"


def const_value(tensor: Any) -> Any:
    value = constant_array(tensor)
    if value is None:
        return None
    try:
        return int(value)
    except Exception:  # noqa: BLE001
        return None


def element_bytes(op: Any, batch_size: int) -> int:
    from tensorflow.python.framework import tensor_util

    shape = tensor_util.constant_value(op.inputs[0])
    dtype = op.get_attr("element_dtype")
    if shape is None:
        return 0
    total = dtype_size(dtype)
    for dim in list(shape.reshape(-1)) if getattr(shape, "ndim", 0) else []:
        total *= batch_size if int(dim) < 0 else int(dim)
    return total


def function_lookup(root_graph: Any) -> Callable[[str], Any]:
    """Finds the ``FuncGraph`` of a function called anywhere inside ``root_graph``."""
    cache: dict[str, Any] = {}
    graphs = [root_graph]

    def lookup(name: str) -> Any:
        if name in cache:
            return cache[name]
        for graph in list(graphs):
            functions = getattr(graph, "_functions", {}) or {}
            function = functions.get(name)
            if function is None:
                continue
            inner = getattr(function, "graph", None)
            if inner is None:
                from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

                inner = function_def_to_graph(function.definition)
            cache[name] = inner
            graphs.append(inner)
            return inner
        from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

        for graph in list(graphs):
            try:
                function = graph._get_function(name)  # noqa: SLF001 - no public accessor
            except Exception:  # noqa: BLE001
                function = None
            if function is not None:
                inner = getattr(function, "graph", None) or function_def_to_graph(function.definition)
                cache[name] = inner
                graphs.append(inner)
                return inner
        raise KeyError(f"function {name!r} not found in the traced graph")

    return lookup


def inter_op_threads() -> int:
    """The size of TensorFlow's inter-op thread pool: the configured value, else the usable CPUs."""

    import tensorflow as tf

    configured = int(tf.config.threading.get_inter_op_parallelism_threads() or 0)
    if configured > 0:
        return configured
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def trace_train_step(model: Any, x_specs: Any, y_specs: Any, batch_size: int | None = None) -> Any:
    """The concrete graph of ``model.train_step`` on ``(x, y)`` specs.

    With ``batch_size`` the batch dimension is that number, as in the function
    TensorFlow runs (Keras calls it with concrete tensors, and the runtime
    specializes the graph to their shapes); without it, it stays ``None``.
    """
    import tensorflow as tf

    from nnmem_callbacks.estimators.keras.common import tree_map

    def tensor_spec(spec: Any) -> Any:
        shape = spec.shape if batch_size is None else spec.at(batch_size)
        return tf.TensorSpec(shape, tf.as_dtype(spec.dtype))

    data = (tree_map(tensor_spec, x_specs), tree_map(tensor_spec, y_specs))
    function = tf.function(model.train_step, autograph=False)
    return function.get_concrete_function(data)
