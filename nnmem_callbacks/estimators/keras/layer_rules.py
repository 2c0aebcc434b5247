"""The closed-form Keras estimate: per-layer rules for the tensors saved for backward.

Used when the backend's own estimator cannot run (no graph, an unsupported
backend, a failing trace). Parameters, buffers, optimizer state and gradients
are exact (the optimizer is built on a clone); activations follow from every
layer's output shape (``layer.output`` or ``compute_output_spec``) and the rule
registered for its class in :data:`LAYER_RULES`.

A rule has one signature, ``rule(layer, input_bytes, output_bytes) -> bytes``
(per sample), and returns what the layer keeps alive for the backward pass.
Layers without a rule are charged their output size and named in ``notes``
(never silently zero); :data:`IGNORED_LAYERS` keep nothing.

Known limitations:
    * Temporaries of the backward pass are approximated by twice the largest
      layer output; the optimizer's update temporaries by twice the largest
      variable.
    * Subclassed models without symbolic outputs only get the static categories
      unless an example batch lets ``compute_output_spec`` run layer by layer.

Example:
    >>> sorted(LAYER_RULES)[:3]
    ['Activation', 'Add', 'AlphaDropout']
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import numpy as np

from nnmem_callbacks.core.estimate import Category, MemoryEstimate, PhaseLine, upper_envelope

__all__ = ["estimate_layer_rules", "IGNORED_LAYERS", "layer_activation_bytes", "LAYER_RULES", "register", "Rule"]

Rule = Callable[[Any, int, int], int]

LAYER_RULES: dict[str, Rule] = {}

#: Layers that keep nothing for backward (views, shape changes without copies).
IGNORED_LAYERS = frozenset({"InputLayer", "Flatten", "Reshape", "Permute", "RepeatVector", "Identity"})


def register(*names: str) -> Callable[[Rule], Rule]:
    """Registers a rule for the named layer classes."""

    def decorate(rule: Rule) -> Rule:
        for name in names:
            LAYER_RULES[name] = rule
        return rule

    return decorate


@register(
    "Dense",
    "EinsumDense",
    "Conv1D",
    "Conv2D",
    "Conv3D",
    "SeparableConv1D",
    "SeparableConv2D",
    "DepthwiseConv1D",
    "DepthwiseConv2D",
    "Conv1DTranspose",
    "Conv2DTranspose",
    "Conv3DTranspose",
)
def _linear(layer: Any, input_bytes: int, output_bytes: int) -> int:
    # the input is saved for the weight gradient; a fused activation keeps its output too
    activation = getattr(getattr(layer, "activation", None), "__name__", "linear")
    return input_bytes + (output_bytes if activation not in ("linear", None) else 0)


@register("Activation", "ReLU", "LeakyReLU", "ELU", "PReLU", "Softmax")
def _activation(layer: Any, input_bytes: int, output_bytes: int) -> int:
    return output_bytes


@register("BatchNormalization", "LayerNormalization", "GroupNormalization", "UnitNormalization")
def _normalization(layer: Any, input_bytes: int, output_bytes: int) -> int:
    return input_bytes + output_bytes


@register("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianDropout", "AlphaDropout")
def _dropout(layer: Any, input_bytes: int, output_bytes: int) -> int:
    return output_bytes + output_bytes // 4  # the output and a boolean mask


@register(
    "MaxPooling1D",
    "MaxPooling2D",
    "MaxPooling3D",
    "AveragePooling1D",
    "AveragePooling2D",
    "AveragePooling3D",
    "GlobalAveragePooling1D",
    "GlobalAveragePooling2D",
    "GlobalMaxPooling1D",
    "GlobalMaxPooling2D",
    "ZeroPadding1D",
    "ZeroPadding2D",
    "Cropping1D",
    "Cropping2D",
    "UpSampling2D",
)
def _pooling(layer: Any, input_bytes: int, output_bytes: int) -> int:
    return input_bytes


@register("Add", "Subtract", "Average", "Maximum", "Minimum", "Concatenate")
def _merge(layer: Any, input_bytes: int, output_bytes: int) -> int:
    return output_bytes


@register("Multiply", "Dot")
def _product(layer: Any, input_bytes: int, output_bytes: int) -> int:
    return input_bytes + output_bytes


@register("Embedding")
def _embedding(layer: Any, input_bytes: int, output_bytes: int) -> int:
    return input_bytes


@register("LSTM", "GRU", "SimpleRNN", "Bidirectional")
def _recurrent(layer: Any, input_bytes: int, output_bytes: int) -> int:
    # every time step keeps its gate activations: about (gates + 2) x units per step
    cell = getattr(layer, "cell", None) or getattr(getattr(layer, "forward_layer", None), "cell", None)
    units = int(getattr(cell, "units", 0) or 0)
    gates = {"LSTMCell": 4, "GRUCell": 3}.get(type(cell).__name__, 1)
    steps = _steps(layer)
    return input_bytes + steps * units * 4 * (2 * gates + 4) * (2 if type(layer).__name__ == "Bidirectional" else 1)


@register("MultiHeadAttention")
def _attention(layer: Any, input_bytes: int, output_bytes: int) -> int:
    heads = int(getattr(layer, "num_heads", 1))
    steps = _steps(layer)
    return 4 * input_bytes + 3 * heads * steps * steps * 4 + output_bytes


def _steps(layer: Any) -> int:
    try:
        shape = layer.input.shape if not isinstance(layer.input, (list, tuple)) else layer.input[0].shape
        return int(shape[1]) if len(shape) > 2 and shape[1] is not None else 1
    except Exception:  # noqa: BLE001
        return 1


def _bytes_per_sample(tensors: Any) -> int:
    from nnmem_callbacks.estimators.keras.common import tree_leaves

    total = 0
    for tensor in tree_leaves(tensors):
        shape = [1 if d is None else int(d) for d in tuple(tensor.shape)[1:]]
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(str(tensor.dtype)).itemsize
    return total


def layer_activation_bytes(model: Any) -> tuple[int, int, Counter, int]:
    """Per sample: (saved activations, largest layer output, layers without a rule, sum of outputs)."""
    saved, largest, total_outputs = 0, 0, 0
    unknown: Counter = Counter()
    for layer in _leaf_layers(model):
        name = type(layer).__name__
        if name in IGNORED_LAYERS:
            continue
        try:
            output = _bytes_per_sample(layer.output)
            inputs = _bytes_per_sample(layer.input)
        except Exception:  # noqa: BLE001 - layers used more than once, subclassed models
            continue
        rule = LAYER_RULES.get(name)
        if rule is None:
            unknown[name] += 1
            kept = output
        else:
            kept = rule(layer, inputs, output)
        saved += kept
        largest = max(largest, output)
        total_outputs += output
    return saved, largest, unknown, total_outputs


def _leaf_layers(model: Any) -> list[Any]:
    layers = []
    for layer in model._flatten_layers(include_self=False, recursive=True):  # noqa: SLF001
        if not list(layer._flatten_layers(include_self=False, recursive=False)) or type(layer).__name__ in LAYER_RULES:  # noqa: SLF001
            layers.append(layer)
    return layers


def estimate_layer_rules(model: Any, batch_size: int, x_specs: Any, y_specs: Any, notes: list[str]) -> MemoryEstimate:
    """The closed-form estimate (see the module docstring)."""
    from nnmem_callbacks.estimators.keras.common import (
        precision_of,
        static_bytes,
        tree_leaves,
        unique,
        variable_bytes,
    )

    static = static_bytes(model)
    gradients = static[Category.PARAMETERS.value]
    inputs_per_sample = sum(spec.nbytes(1) for spec in tree_leaves(x_specs) + tree_leaves(y_specs))
    try:
        saved, largest, unknown, _ = layer_activation_bytes(model)
    except Exception as error:  # noqa: BLE001
        saved, largest, unknown = 0, 0, Counter()
        notes.append(f"layer outputs unavailable ({type(error).__name__}); activations not counted")
    if unknown:
        notes.append(
            "no layer rule for "
            + ", ".join(f"{k} x{v}" for k, v in sorted(unknown.items()))
            + " (charged their output size)"
        )
    largest_variable = max((variable_bytes(v) for v in unique(model.trainable_variables)), default=0)
    fixed = static[Category.PARAMETERS.value] + static[Category.BUFFERS.value] + static[Category.OPTIMIZER_STATE.value]
    backward_slope = inputs_per_sample + saved + 2 * largest
    backward = PhaseLine("step/backward", fixed + gradients, backward_slope)
    optimizer = PhaseLine("step/optimizer", fixed + gradients + 2 * largest_variable, inputs_per_sample)
    lines = upper_envelope([backward, optimizer])
    peak_line = max((backward, optimizer), key=lambda line: line.at(batch_size))
    breakdown = dict(static)
    breakdown[Category.GRADIENTS.value] = gradients
    breakdown[Category.INPUTS.value] = inputs_per_sample * batch_size
    if peak_line is backward:
        breakdown[Category.ACTIVATIONS.value] = saved * batch_size
        breakdown[Category.TEMPORARIES.value] = 2 * largest * batch_size
    else:
        breakdown[Category.TEMPORARIES.value] = 2 * largest_variable
    return MemoryEstimate(
        peak_bytes=int(peak_line.at(batch_size)),
        breakdown=breakdown,
        batch_size=batch_size,
        phases=tuple(lines),
        peak_phase=peak_line.phase,
        device="cpu",
        precision=precision_of(model),
        method="layer-rules",
        notes=tuple(notes),
        extra={"unknown_layers": dict(unknown)},
    )
