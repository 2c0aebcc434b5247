"""torch backend: trace the Keras-on-torch train step with the PyTorch estimator.

Keras models on the torch backend are ``torch.nn.Module`` s whose variables
are ``torch.nn.Parameter`` s. The PyTorch estimator
(:func:`nnmem_callbacks.torch.estimate_training`) swaps them for fake tensors;
Keras layers read their variables through ``KerasVariable.value``, so the loss
function runs the model inside a ``keras.StatelessScope`` that maps every
variable to its fake substitute. The loss is Keras' own ``compute_loss``.

The optimizer is Keras', not ``torch.optim``: a small ``torch.optim.Optimizer``
shim hands the fake parameters, their fake gradients and fake slot variables to
the Keras optimizer's own ``stateless_apply``, so its real update code (the
``torch._foreach_*`` ops of Adam, the accumulators of
``gradient_accumulation_steps``...) runs on fake tensors and every temporary is
seen. The slot variables count exactly what Keras builds.

Keras' LSTM and GRU take their cuDNN path (``torch._VF.lstm``/``gru`` with
separate, unflattened weights) when the inputs are on CUDA; the PyTorch
estimator traces that path as cuDNN allocates
(:mod:`nnmem_callbacks.estimators.torch.cuda.cudnn_rnn`). For a CUDA target traced on a
machine without one, :func:`cuda_rnn_paths` makes Keras choose the same path
on the CPU's fake tensors.

Known limitations:
    * Keras metrics updated during ``train_step`` are not traced (a few bytes).
    * For a CUDA target without a GPU, ``Bidirectional`` LSTM/GRU layers keep
      Keras' CPU path (its ``bidirectional_lstm``/``gru`` are not redirected).
    * Keras builds the slot variables before ``fit``; the trace creates them at
      the first step (same bytes; they are counted from the start).
    * ``jit_compile=True``: the forward and loss are estimated compiled, the
      optimizer update eagerly (the figure errs high where the update peaks).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

from nnmem_callbacks.core.estimate import Category, MemoryEstimate, PhaseLine

__all__ = ["cuda_rnn_paths", "estimate_torch"]


def _make_shim_class() -> Any:
    import torch

    class _Shim(torch.optim.Optimizer):
        """Runs the Keras optimizer's own update (``stateless_apply``) on the estimator's fake tensors."""

        def __init__(self, params: Any, keras_optimizer: Any, location_of: dict) -> None:
            super().__init__(list(params), {})
            self._keras = keras_optimizer
            self._location_of = location_of
            self._slots: list | None = None

        def _current(self, variable: Any) -> Any:
            slots, name = self._location_of[id(variable)]
            return slots[name]

        @torch.no_grad()
        def step(self, closure: Any = None) -> None:
            from keras.src.backend.torch.core import to_torch_dtype

            optimizer = self._keras
            anchor = self.param_groups[0]["params"][0]
            if self._slots is None:
                self._slots = [
                    torch.zeros(tuple(v.shape), dtype=to_torch_dtype(v.dtype), device=anchor.device)
                    for v in optimizer.variables
                ]
            trainable = [self._current(v) for v in optimizer._trainable_variables]  # noqa: SLF001
            grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in trainable]
            new_trainable, new_slots = optimizer.stateless_apply(self._slots, grads, trainable)
            for old, new in zip(trainable, new_trainable):
                if new is not old:
                    old.copy_(new)
            del new_trainable
            self._slots = list(new_slots)
            self.state[anchor] = {f"slot{i}": t for i, t in enumerate(self._slots)}

    return _Shim


@contextlib.contextmanager
def cuda_rnn_paths(enabled: bool = True) -> Iterator[None]:
    """Makes Keras' torch ``lstm``/``gru`` take their cuDNN branch on CPU tensors.

    Keras chooses the branch by ``inputs.device.type == "cuda"`` and
    ``torch.cuda.is_available()``; a CUDA target traced with CPU kernels has
    neither. Inside the block, when Keras' own ``cudnn_ok`` accepts the layer
    (and no mask is given), the inputs are prepared as Keras does and its own
    ``_cudnn_lstm``/``_cudnn_gru`` run; anything else goes to Keras' function.

    Args:
        enabled: ``False`` makes this a no-op.
    """
    if not enabled:
        yield
        return
    import importlib

    from keras.src import backend as keras_backend
    from keras.src.backend.torch.core import convert_to_tensor

    # the module, not the function ``rnn`` that keras.src.backend.torch exports under the same name
    keras_rnn = importlib.import_module("keras.src.backend.torch.rnn")

    original_lstm, original_gru = keras_backend.lstm, keras_backend.gru

    def eligible(activation: Any, recurrent_activation: Any, unroll: bool, bias: Any, mask: Any) -> bool:
        saved = keras_rnn._is_cuda_cudnn_available  # noqa: SLF001
        keras_rnn._is_cuda_cudnn_available = lambda: True  # noqa: SLF001
        try:
            return mask is None and keras_rnn.cudnn_ok(
                activation, recurrent_activation, unroll, use_bias=bias is not None
            )
        finally:
            keras_rnn._is_cuda_cudnn_available = saved  # noqa: SLF001

    def lstm(
        inputs,
        initial_state_h,
        initial_state_c,
        mask,
        kernel,
        recurrent_kernel,
        bias,
        activation,
        recurrent_activation,
        return_sequences=False,
        go_backwards=False,
        unroll=False,
        batch_first=True,
    ):
        if not eligible(activation, recurrent_activation, unroll, bias, mask):
            return original_lstm(
                inputs,
                initial_state_h,
                initial_state_c,
                mask,
                kernel,
                recurrent_kernel,
                bias,
                activation,
                recurrent_activation,
                return_sequences,
                go_backwards,
                unroll,
                batch_first,
            )
        kernel = convert_to_tensor(kernel)
        inputs = convert_to_tensor(inputs).to(kernel.dtype)
        if go_backwards:
            inputs = _flip(inputs, 1 if batch_first else 0)
        cudnn_inputs = inputs if batch_first else inputs.permute(1, 0, 2)
        last, outputs, states = keras_rnn._cudnn_lstm(  # noqa: SLF001
            cudnn_inputs,
            convert_to_tensor(initial_state_h).to(kernel.dtype),
            convert_to_tensor(initial_state_c).to(kernel.dtype),
            kernel,
            convert_to_tensor(recurrent_kernel),
            convert_to_tensor(bias) if bias is not None else None,
            return_sequences=return_sequences,
            device=inputs.device,
        )
        return last, (outputs if batch_first else outputs.permute(1, 0, 2)), states

    def gru(
        inputs,
        initial_state,
        mask,
        kernel,
        recurrent_kernel,
        bias,
        activation,
        recurrent_activation,
        return_sequences=False,
        go_backwards=False,
        unroll=False,
        reset_after=True,
    ):
        if not reset_after or not eligible(activation, recurrent_activation, unroll, bias, mask):
            return original_gru(
                inputs,
                initial_state,
                mask,
                kernel,
                recurrent_kernel,
                bias,
                activation,
                recurrent_activation,
                return_sequences,
                go_backwards,
                unroll,
                reset_after,
            )
        kernel = convert_to_tensor(kernel)
        inputs = convert_to_tensor(inputs).to(kernel.dtype)
        if go_backwards:
            inputs = _flip(inputs, 1)
        return keras_rnn._cudnn_gru(  # noqa: SLF001
            inputs,
            convert_to_tensor(initial_state).to(kernel.dtype),
            kernel,
            convert_to_tensor(recurrent_kernel),
            convert_to_tensor(bias) if bias is not None else None,
            return_sequences=return_sequences,
            device=inputs.device,
        )

    keras_backend.lstm, keras_backend.gru = lstm, gru
    try:
        yield
    finally:
        keras_backend.lstm, keras_backend.gru = original_lstm, original_gru


def _flip(tensor: Any, dim: int) -> Any:
    import torch

    return torch.flip(tensor, dims=[dim])


def estimate_torch(
    model: Any,
    batch_size: int,
    x_specs: Any,
    y_specs: Any,
    notes: list[str],
    check_scaling: bool = True,
    device: str | None = None,
) -> MemoryEstimate:
    """Traces the Keras-on-torch train step with the PyTorch estimator.

    Args:
        device: The training device (default: the model's); ``"cuda"`` on a
            machine without one traces CPU kernels for a CUDA target.
    """
    import keras
    import numpy as np
    import torch

    from nnmem_callbacks.estimators.keras.common import precision_of, tree_map, unique, variable_bytes
    from nnmem_callbacks.estimators.torch.estimator import estimate_training as torch_estimate

    variables = unique(model.variables)
    # where each Keras variable's Parameter sits in the module tree (the estimator swaps those slots)
    locations = []
    for module in model.modules():
        for name, tensor in module._parameters.items():  # noqa: SLF001
            for variable in variables:
                if getattr(variable, "_value", None) is tensor:
                    locations.append((variable, module._parameters, name))  # noqa: SLF001

    def loss_fn(module: Any, batch: Any) -> Any:
        x, y = batch
        mapping = [(variable, slots[name]) for variable, slots, name in locations]
        with keras.StatelessScope(state_mapping=mapping):
            y_pred = module(x, training=True)
            return module.compute_loss(x=x, y=y, y_pred=y_pred, training=True)

    def meta(spec: Any) -> Any:
        dtype = getattr(torch, np.dtype(spec.dtype).name)
        return torch.empty(spec.at(batch_size), dtype=dtype, device="meta")

    batch = (tree_map(meta, x_specs), tree_map(meta, y_specs))
    keras_optimizer = model.optimizer
    if not getattr(keras_optimizer, "built", False):
        keras_optimizer.build(model.trainable_variables)  # pragma: no cover - estimate_training builds it
    keras_state = sum(variable_bytes(v) for v in unique(keras_optimizer.variables))
    location_of = {id(variable): (slots, name) for variable, slots, name in locations}

    shim = _make_shim_class()

    jit = getattr(model, "jit_compile", False) is True

    def make_optimizer(params: Any) -> Any:
        return shim(params, keras_optimizer, location_of)

    traced_loss = loss_fn
    if jit:
        # Keras compiles its whole train step with torch.compile (keras/src/backend/torch/trainer.py); backward()
        # breaks the graph, so the forward with the loss is a compiled graph of its own
        traced_loss = torch.compile(loss_fn)
        notes.append(
            "jit_compile=True: Keras torch.compile's its train step; the forward and loss were estimated from their "
            "compiled graphs, the optimizer update as the eager update, whose temporaries Keras' compiled update "
            "fuses away: where the update is the peak, the figure errs high (+59% on a 2-layer MLP with Adam)"
        )
    if device is None:
        device = str(next(iter(model.parameters())).device) if any(True for _ in model.parameters()) else "cpu"
    emulated = torch.device(device).type == "cuda" and not torch.cuda.is_available()
    with cuda_rnn_paths(enabled=emulated):
        estimate = torch_estimate(
            model, batch, optimizer=make_optimizer, loss_fn=traced_loss, device=device, check_scaling=check_scaling
        )
    if not estimate.method.startswith("trace"):
        raise RuntimeError(
            f"the PyTorch estimator could not trace the Keras step ({estimate.extra.get('fallback_reason', estimate.method)})"
        )
    # the shim creates the slots at the first step; Keras builds them before fit: same bytes
    delta = keras_state - estimate.breakdown[str(Category.OPTIMIZER_STATE)]
    notes.append(f"the Keras {type(keras_optimizer).__name__} update ran on fake tensors (stateless_apply)")
    breakdown = dict(estimate.breakdown)
    breakdown[str(Category.OPTIMIZER_STATE)] += delta
    phases = tuple(PhaseLine(p.phase, p.fixed_bytes + delta, p.per_sample_bytes) for p in estimate.phases)
    return dataclasses.replace(
        estimate,
        peak_bytes=estimate.peak_bytes + delta,
        breakdown=breakdown,
        phases=phases,
        precision=precision_of(model),
        method="torch-" + estimate.method,
        notes=tuple(notes) + tuple(estimate.notes),
        extra={**dict(estimate.extra), "backend": "torch", "keras_optimizer_state_bytes": keras_state},
    )
