"""Backend-neutral helpers of the Keras estimators: input specs, variable bytes, the optimizer.

Nothing here imports tensorflow, jax or torch; keras is imported lazily.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from nnmem_callbacks.core.estimate import Category

#: Packages whose frames lie between the user's call (``model.fit(...)``, ``estimate_training(...)``,
#: ``fit_plan(...)``) and a warning of the Keras estimator or callback (Keras' trainer, callback list and traceback
#: filter, the backend's own frames, ``contextlib`` and ``functools`` wrappers): :mod:`nnmem_callbacks.core.warning_site`
#: skips them.
INTERNAL_PACKAGES = ("keras", "tensorflow", "jax", "jaxlib", "torch", "optree", "contextlib", "functools")

__all__ = [
    "accumulation_steps",
    "backend_name",
    "clone_optimizer",
    "has_symbolic_inputs",
    "input_specs",
    "INTERNAL_PACKAGES",
    "is_compiled",
    "KerasEstimationError",
    "optimizer_variables_of",
    "precision_of",
    "Spec",
    "static_bytes",
    "tree_leaves",
    "tree_map",
    "unique",
    "variable_bytes",
]


class KerasEstimationError(ValueError):
    """Invalid input to the Keras ``estimate_training`` (never triggers the fallback)."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """Shape (batch dimension ``None``) and dtype of one input or target array."""

    shape: tuple[Any, ...]
    dtype: str

    def at(self, batch_size: int) -> tuple[int, ...]:
        return tuple(batch_size if d is None else int(d) for d in self.shape)

    def nbytes(self, batch_size: int) -> int:
        return int(np.prod(self.at(batch_size), dtype=np.int64)) * np.dtype(self.dtype).itemsize


def backend_name() -> str:
    import keras

    return str(keras.backend.backend())


def tree_map(function: Any, structure: Any) -> Any:
    """``function`` over the leaves of nested lists, tuples and dicts (``None`` kept)."""
    if structure is None:
        return None
    if isinstance(structure, dict):
        return {k: tree_map(function, v) for k, v in structure.items()}
    if isinstance(structure, (list, tuple)):
        return type(structure)(tree_map(function, v) for v in structure)
    return function(structure)


def tree_leaves(structure: Any) -> list[Any]:
    if structure is None:
        return []
    if isinstance(structure, dict):
        return [leaf for v in structure.values() for leaf in tree_leaves(v)]
    if isinstance(structure, (list, tuple)):
        return [leaf for v in structure for leaf in tree_leaves(v)]
    return [structure]


def _spec_of_array(array: Any) -> Spec:
    shape = tuple(int(d) if d is not None else None for d in getattr(array, "shape", np.shape(array)))
    if not shape:
        raise KerasEstimationError("example arrays need a batch dimension (got a scalar)")
    dtype = getattr(array, "dtype", None)
    name = getattr(dtype, "name", None) or str(np.asarray(array).dtype)
    name = {"float": "float32", "int": "int64"}.get(name, name)
    return Spec((None,) + shape[1:], str(name))


def _spec_of_keras_tensor(tensor: Any) -> Spec:
    shape = tuple(tensor.shape)
    return Spec((None,) + tuple(shape[1:]), str(tensor.dtype))


def is_compiled(model: Any) -> bool:
    return bool(getattr(model, "compiled", False)) and getattr(model, "optimizer", None) is not None


def _is_sparse_loss(loss: Any) -> bool:
    losses = loss if isinstance(loss, (list, tuple)) else list(loss.values()) if isinstance(loss, dict) else [loss]
    for item in losses:
        name = item if isinstance(item, str) else type(item).__name__ + " " + getattr(item, "__name__", "")
        if "sparse" in str(name).lower():
            return True
    return False


def input_specs(model: Any, x: Any = None, y: Any = None) -> tuple[Any, Any, int | None]:
    """Specs of the data passed to ``train_step``: ``(x_specs, y_specs, batch size of x)``.

    With ``x``/``y`` omitted, the model's symbolic inputs give ``x``; ``y``
    follows the output shape (dtype ``float32``), or drops the last axis with
    an ``int32`` dtype for sparse losses.
    """
    example_batch = None
    if x is not None:
        x_specs = tree_map(_spec_of_array, x)
        leaves = tree_leaves(x)
        first = tuple(np.shape(leaves[0])) if leaves else ()
        example_batch = int(first[0]) if first and first[0] is not None else None  # a TensorSpec's may be None
    else:
        inputs = _symbolic(model, "inputs")
        if inputs is None:
            raise KerasEstimationError(
                f"{type(model).__name__} has no symbolic inputs (a subclassed or unbuilt model); pass an example "
                f"batch x=... (and y=...) to estimate_training"
            )
        x_specs = tree_map(_spec_of_keras_tensor, inputs)
    if y is not None:
        y_specs = tree_map(_spec_of_array, y)
    else:
        outputs = _symbolic(model, "outputs")
        if outputs is None:
            if x is not None:
                outputs = _symbolic_outputs(model, x_specs)
            else:  # pragma: no cover - handled above
                raise KerasEstimationError("pass y=... for a model without symbolic outputs")
        sparse = _is_sparse_loss(getattr(model, "loss", None))

        def target(tensor: Any) -> Spec:
            spec = _spec_of_keras_tensor(tensor)
            if sparse:
                return Spec(spec.shape[:-1], "int32")
            return Spec(spec.shape, "float32")

        y_specs = tree_map(target, outputs)
    return x_specs, y_specs, example_batch


def has_symbolic_inputs(model: Any) -> bool:
    """Whether the model's inputs are known without an example batch (Sequential with an ``Input``, Functional)."""
    return _symbolic(model, "inputs") is not None


def _symbolic(model: Any, which: str) -> Any:
    """The model's symbolic inputs or outputs (structure kept), or ``None`` (subclassed, unbuilt)."""
    functional = getattr(model, "_functional", None) or model  # Sequential wraps a Functional
    structured = getattr(functional, f"_{which}_struct", None)
    if structured is not None:
        return structured
    try:
        flat = getattr(model, which)
    except Exception:  # noqa: BLE001 - subclassed models raise
        return None
    if not flat:
        return None
    return flat[0] if len(flat) == 1 else list(flat)


def _symbolic_outputs(model: Any, x_specs: Any) -> Any:
    import keras

    def to_keras(spec: Spec) -> Any:
        return keras.KerasTensor(spec.at(2), dtype=spec.dtype)

    out = model.compute_output_spec(tree_map(to_keras, x_specs))
    return tree_map(lambda t: keras.KerasTensor((None,) + tuple(t.shape[1:]), dtype=t.dtype), out)


def variable_bytes(variable: Any) -> int:
    shape = tuple(int(d) for d in variable.shape)
    dtype = getattr(variable, "dtype", "float32")
    name = getattr(dtype, "name", None) or str(dtype)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(name).itemsize


def unique(variables: Any) -> list[Any]:
    seen: set[int] = set()
    out = []
    for variable in variables:
        key = id(variable)
        if key not in seen:
            seen.add(key)
            out.append(variable)
    return out


def static_bytes(model: Any, optimizer_variables: Any = None) -> dict[str, int]:
    """Parameters (trainable), buffers (non-trainable) and optimizer state in bytes."""
    trainable = unique(model.trainable_variables)
    trainable_ids = {id(v) for v in trainable}
    non_trainable = [v for v in unique(model.variables) if id(v) not in trainable_ids]
    if optimizer_variables is None:
        optimizer_variables = optimizer_variables_of(model)
    return {
        Category.PARAMETERS.value: sum(variable_bytes(v) for v in trainable),
        Category.BUFFERS.value: sum(variable_bytes(v) for v in non_trainable),
        Category.OPTIMIZER_STATE.value: sum(variable_bytes(v) for v in optimizer_variables),
    }


def optimizer_variables_of(model: Any) -> list[Any]:
    """The optimizer's variables once built; an unbuilt optimizer is built on a clone.

    The model's own optimizer is never changed here.
    """
    optimizer = model.optimizer
    if getattr(optimizer, "built", False):
        return unique(optimizer.variables)
    clone = clone_optimizer(optimizer)
    clone.build(model.trainable_variables)
    return unique(clone.variables)


def clone_optimizer(optimizer: Any) -> Any:
    import keras

    return keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))


def accumulation_steps(model: Any) -> int:
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", None) or optimizer
    return int(getattr(inner, "gradient_accumulation_steps", None) or 1)


def precision_of(model: Any) -> str:
    policy = getattr(model, "dtype_policy", None)
    name = getattr(policy, "name", None) or "float32"
    return {
        "float32": "32-true",
        "mixed_float16": "16-mixed",
        "mixed_bfloat16": "bf16-mixed",
        "float16": "16-true",
        "bfloat16": "bf16-true",
        "float64": "64-true",
    }.get(name, name)
