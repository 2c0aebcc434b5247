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

Known limitations:
    * Keras metrics updated during ``train_step`` are not traced (a few bytes).
    * Keras builds the slot variables before ``fit``; the trace creates them at
      the first step (same bytes; they are counted from the start).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nnmem_callbacks.estimate import Category, MemoryEstimate, PhaseLine



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


def estimate_torch(
    model: Any, batch_size: int, x_specs: Any, y_specs: Any, notes: list[str], check_scaling: bool = True
) -> MemoryEstimate:
    import keras
    import numpy as np
    import torch

    from nnmem_callbacks.keras.common import (
        precision_of,
        tree_map,
        unique,
        variable_bytes,
    )
    from nnmem_callbacks.torch import estimate_training as torch_estimate

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

    def make_optimizer(params: Any) -> Any:
        return shim(params, keras_optimizer, location_of)

    device = str(next(iter(model.parameters())).device) if any(True for _ in model.parameters()) else "cpu"
    estimate = torch_estimate(model, batch, optimizer=make_optimizer, loss_fn=loss_fn, device=device, check_scaling=check_scaling)
    if estimate.method != "trace":
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
        method="torch-trace",
        notes=tuple(notes) + tuple(estimate.notes),
        extra={**dict(estimate.extra), "backend": "torch", "keras_optimizer_state_bytes": keras_state},
    )
