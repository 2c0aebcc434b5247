"""The simulated training step's definition, shared by the trace and the fallback.

:class:`StepConfig` (built and checked by :func:`make_config`), the dtype each
precision gives parameters and inputs, the optimizers rebuilt on the estimate's
own tensors, and the call of the user's loss. Both
:mod:`nnmem_callbacks.estimators.torch.estimator` (the fake-tensor trace) and
:mod:`nnmem_callbacks.estimators.torch.fallback` (the closed-form estimate) import them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from nnmem_callbacks.estimators.torch.inputs import (
    OPTIMIZER_NAMES,
    BatchSpec,
    PrecisionSpec,
    check_optimizer_spec,
    describe_batch,
    named_cuda_arch,
    resolve_device,
    resolve_precision,
)

__all__ = [
    "build_optimizers",
    "call_loss_fn",
    "check_zero_grad",
    "default_loss",
    "EstimationInputError",
    "forward_loss",
    "input_dtype",
    "input_dtype_map",
    "LossFn",
    "make_config",
    "optimizer_state_tensors",
    "parameter_dtype",
    "scalar_loss",
    "StepConfig",
    "ZERO_GRAD_POINTS",
]

LossFn = Callable[[nn.Module, Any], Any]

#: When a training loop frees the gradients (``optimizer.zero_grad()``): after the optimizer step (a plain loop, the
#: Hugging Face Trainer), or between the forward and the backward (Lightning's automatic optimization, whose closure
#: runs ``training_step``, then ``zero_grad``, then ``backward``).
ZERO_GRAD_POINTS = ("after_step", "before_backward")


def check_zero_grad(value: Any) -> str:
    """``value`` if it is one of :data:`ZERO_GRAD_POINTS`.

    Example:
        >>> check_zero_grad("sometime")
        Traceback (most recent call last):
        ...
        ValueError: zero_grad must be 'after_step' or 'before_backward', got 'sometime'
    """
    if value not in ZERO_GRAD_POINTS:
        raise ValueError(f"zero_grad must be 'after_step' or 'before_backward', got {value!r}")
    return value


class EstimationInputError(ValueError):
    """Invalid input to ``estimate_training`` (never triggers the fallback)."""


@dataclasses.dataclass
class StepConfig:
    """Everything that defines the simulated training step."""

    model: nn.Module
    batch: BatchSpec
    optimizer: Any
    loss_fn: LossFn
    precision: PrecisionSpec
    target_device: torch.device
    trace_device: torch.device
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str = "norm"
    example_batch: Any = None  # the user's batch: the fallback's small real probe, compat's mask check
    cuda_arch: Any = None  # gpus.CudaArch named by the device ("cuda:h100"), None when not named
    compiled: Any = None  # compiled.CompiledStep: the torch.compile'd parts of the step, None when eager
    zero_grad: str = "after_step"  # when the loop frees the gradients (ZERO_GRAD_POINTS)

    @property
    def op_context(self) -> tuple:
        """What a traced op's outputs depend on besides the op and its inputs (``tracer.sharing_traced_ops``)."""
        arch = self.cuda_arch.capability if self.cuda_arch is not None else None
        return (self.target_device.type, self.trace_device.type, arch, self.compiled is not None)


def make_config(
    model, batch, optimizer, loss_fn, precision, device, accumulate, clip_val, clip_algorithm, sequence_dim=None
) -> StepConfig:
    """Checks ``estimate_training``'s arguments and returns the step they define.

    Raises:
        ValueError: Naming the invalid argument and what is valid.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    spec = resolve_precision(precision)
    check_optimizer_spec(optimizer)
    batch_spec = describe_batch(batch, sequence_dim)
    if loss_fn is not None and not callable(loss_fn):
        raise ValueError(f"loss_fn must be a callable (model, batch) -> scalar loss, got {type(loss_fn).__name__}")
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError(f"accumulate_grad_batches must be a positive integer, got {accumulate!r}")
    if clip_val is not None and (isinstance(clip_val, bool) or not isinstance(clip_val, (int, float)) or clip_val <= 0):
        raise ValueError(f"gradient_clip_val must be a positive number or None, got {clip_val!r}")
    if clip_algorithm not in ("norm", "value"):
        raise ValueError(f"gradient_clip_algorithm must be 'norm' or 'value', got {clip_algorithm!r}")
    target = resolve_device(device, model, batch_spec)
    arch = named_cuda_arch(device)
    local_differs = (
        arch is not None and torch.cuda.is_available() and torch.cuda.get_device_capability() != arch.capability
    )
    if target.type == "cuda" and torch.cuda.is_available() and not local_differs:
        trace_device = torch.device("cuda", target.index if target.index is not None else torch.cuda.current_device())
    else:
        trace_device = torch.device("cpu")
    for parameter in model.parameters():
        if isinstance(parameter, nn.parameter.UninitializedParameter):
            raise ValueError("the model has uninitialised (lazy) parameters; run one forward pass before estimating")
    return StepConfig(
        model,
        batch_spec,
        optimizer,
        loss_fn or default_loss,
        spec,
        target,
        trace_device,
        accumulate,
        clip_val,
        clip_algorithm,
        batch,
        arch,
    )


def checkpoints_activations(model: nn.Module) -> bool:
    """Whether the model runs activation checkpointing as libraries switch it on: a layer's
    ``gradient_checkpointing`` (or ``activation_checkpointing``) flag, as ``transformers``'
    ``gradient_checkpointing_enable()`` sets it on each layer (also inside PEFT and Lightning modules).
    ``torch.utils.checkpoint`` called in a model's own ``forward`` sets no flag and is not seen here
    (the trace still measures it).
    """
    return any(
        getattr(module, flag, False) is True
        for module in model.modules()
        for flag in ("gradient_checkpointing", "activation_checkpointing")
    )


def default_loss(model: nn.Module, batch: Any) -> Any:
    """Calls ``model`` on ``batch`` and returns the output (reduced by the caller).

    A tensor is passed as is, a dict as keyword arguments, a tuple or list as
    positional arguments.
    """
    if isinstance(batch, torch.Tensor):
        return model(batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def scalar_loss(value: Any, *, default_reduction: bool) -> torch.Tensor:
    """Extracts and checks the scalar loss from what a loss function returned."""
    if isinstance(value, Mapping) and "loss" in value:
        value = value["loss"]
    elif not isinstance(value, torch.Tensor) and getattr(value, "loss", None) is not None:
        value = value.loss
    if default_reduction and not (isinstance(value, torch.Tensor) and value.numel() == 1):
        tensors = [
            t
            for t in tree_flatten(value)[0]
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
        ]
        if tensors:
            total = tensors[0].sum()
            for tensor in tensors[1:]:
                total = total + tensor.sum()
            value = total
    if not isinstance(value, torch.Tensor):
        raise EstimationInputError(
            f"the loss must be a scalar tensor (or a dict with 'loss'); loss_fn returned {type(value).__name__}"
        )
    if value.numel() != 1:
        raise EstimationInputError(
            f"the loss must be a scalar tensor; loss_fn returned a tensor of shape {tuple(value.shape)}; "
            f"reduce it (e.g. .mean()) or pass a loss_fn that returns a scalar"
        )
    if not value.requires_grad:
        raise EstimationInputError(
            "the loss does not require grad: no parameter of the model takes part in it "
            "(are all parameters frozen, or does loss_fn detach?)"
        )
    return value


def call_loss_fn(config: StepConfig, batch: Any, device_type: str | None = None) -> Any:
    """Runs the user's forward and loss, under autocast for the ``*-mixed`` precisions."""
    precision = config.precision
    if precision.autocast_dtype is None:
        return config.loss_fn(config.model, batch)
    with torch.autocast(device_type=device_type or config.trace_device.type, dtype=precision.autocast_dtype):
        return config.loss_fn(config.model, batch)


def forward_loss(config: StepConfig, batch: Any) -> torch.Tensor:
    """The checked scalar loss of one traced forward."""
    value = call_loss_fn(config, batch)
    return scalar_loss(value, default_reduction=config.loss_fn is default_loss)


def parameter_dtype(dtype: torch.dtype, precision: PrecisionSpec) -> torch.dtype:
    """The dtype a parameter or buffer of ``dtype`` has under ``precision``.

    The ``-true`` precisions other than ``32-true`` convert floating tensors
    (``model.half()``, ``.bfloat16()``, ``.double()``); the others keep them.

    Example:
        >>> from nnmem_callbacks.estimators.torch.inputs import resolve_precision
        >>> parameter_dtype(torch.float32, resolve_precision("bf16-true"))
        torch.bfloat16
        >>> parameter_dtype(torch.int64, resolve_precision("bf16-true"))
        torch.int64
        >>> parameter_dtype(torch.float32, resolve_precision("bf16-mixed"))
        torch.float32
    """
    if dtype.is_floating_point and precision.param_dtype != torch.float32:
        return precision.param_dtype
    return dtype


def input_dtype(dtype: torch.dtype, precision: PrecisionSpec) -> torch.dtype:
    """The dtype a batch tensor of ``dtype`` has under ``precision``
    (floating inputs follow :attr:`PrecisionSpec.input_dtype` when it is set).

    Example:
        >>> from nnmem_callbacks.estimators.torch.inputs import resolve_precision
        >>> input_dtype(torch.float32, resolve_precision("16-true"))
        torch.float16
        >>> input_dtype(torch.float32, resolve_precision("16-mixed"))
        torch.float32
    """
    target = precision.input_dtype
    if target is not None and dtype.is_floating_point:
        return target
    return dtype


def input_dtype_map(precision: PrecisionSpec) -> Callable[[torch.dtype], torch.dtype]:
    """:func:`input_dtype` for one precision, as ``BatchSpec.build`` takes it."""
    return lambda dtype: input_dtype(dtype, precision)


def build_optimizers(
    spec: Any, trainable: list[torch.Tensor], fake_of: dict[int, torch.Tensor], make_fake, target: torch.device
) -> list[torch.optim.Optimizer]:
    if spec is None:
        return []
    if isinstance(spec, str):
        optimizers = [OPTIMIZER_NAMES[spec.lower()](trainable)]
    elif isinstance(spec, torch.optim.Optimizer):
        optimizers = [_clone_optimizer(spec, fake_of, make_fake)]
    elif isinstance(spec, (list, tuple)):
        optimizers = [_clone_optimizer(o, fake_of, make_fake) for o in spec]
    else:
        made = spec(trainable)
        if isinstance(made, torch.optim.Optimizer):
            optimizers = [made]
        elif isinstance(made, (list, tuple)) and all(isinstance(o, torch.optim.Optimizer) for o in made):
            optimizers = list(made)
        else:
            raise EstimationInputError(
                f"the optimizer callable must return a torch.optim.Optimizer (or a list of them), got {type(made).__name__}"
            )
    for optimizer in optimizers:
        _apply_default_implementation(optimizer, target)
    if any(type(optimizer).__module__.startswith("bitsandbytes") for optimizer in optimizers):
        from nnmem_callbacks.estimators.torch import quantized

        quantized.install_rules()  # its CPU update kernels' temporaries
    return optimizers


def _clone_optimizer(
    optimizer: torch.optim.Optimizer, fake_of: dict[int, torch.Tensor], make_fake
) -> torch.optim.Optimizer:
    groups = []
    for group in optimizer.param_groups:
        params = []
        for parameter in group["params"]:
            if id(parameter) not in fake_of:
                fake_of[id(parameter)] = make_fake(parameter, True)
            params.append(fake_of[id(parameter)])
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    cls = type(optimizer)
    kept = _constructor_state(optimizer)
    try:
        clone = cls(groups, **optimizer.defaults, **kept)
    except TypeError:
        try:
            clone = cls(groups, **kept)
        except TypeError:
            clone = cls(groups)
    for parameter, state in optimizer.state.items():
        fake = fake_of.get(id(parameter))
        if fake is None:
            continue
        clone.state[fake] = {
            key: (_fake_state_tensor(value, fake) if isinstance(value, torch.Tensor) else value)
            for key, value in state.items()
        }
    return clone


def _constructor_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What an optimizer's constructor took and keeps outside ``defaults``, for its clone: bitsandbytes' ``args``
    (``optim_bits``, ``min_8bit_size``, percentile clipping, block-wise) and ``is_paged``. Without them the
    Trainer's ``optim="adamw_8bit"`` (``bnb.optim.AdamW(optim_bits=8)``) was cloned as a 32-bit AdamW."""
    import inspect

    try:
        accepted = inspect.signature(type(optimizer).__init__).parameters
    except (TypeError, ValueError):  # pragma: no cover - a constructor without a signature
        return {}
    return {
        name: getattr(optimizer, name)
        for name in ("args", "is_paged")
        if name in accepted and name not in optimizer.defaults and hasattr(optimizer, name)
    }


def _fake_state_tensor(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    device = like.device if value.device.type != "cpu" or value.dim() > 0 else value.device
    return torch.empty_strided(tuple(value.shape), value.stride(), dtype=value.dtype, device=device)


def _apply_default_implementation(optimizer: torch.optim.Optimizer, target: torch.device) -> None:
    """Makes the foreach default match the target device.

    PyTorch picks ``foreach=True`` for CUDA tensors of the plain tensor type;
    fake tensors are a subclass, so the default would silently become the
    single-tensor path and miss the foreach temporaries.
    """
    for group in optimizer.param_groups:
        if (
            "foreach" in group
            and group["foreach"] is None
            and not group.get("fused")
            and not group.get("differentiable")
        ):
            group["foreach"] = target.type == "cuda"


def optimizer_state_tensors(optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.Tensor]:
    return [
        value
        for optimizer in optimizers
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ]
