"""Estimating a LightningModule's training step from one batch and the trainer's facts: an estimate or why not.

Part of the Lightning ``MemoryBudgetCallback`` (see :mod:`nnmem_callbacks.adapters.lightning.callback`).
:func:`estimate_module` takes the module, one batch (as
:func:`~nnmem_callbacks.adapters.lightning.trainer_io.first_train_batch` took it)
and the :class:`~nnmem_callbacks.adapters.lightning.trainer_io.TrainerFacts`, and
returns ``(estimate, None)`` or ``(None, why)``; it never raises:

* the loss traced is the module's own ``training_step`` on that batch
  (:func:`training_step_loss`), with ``log`` silenced and, under manual
  optimization, :class:`ManualOptimizationShim` recording the losses given to
  ``manual_backward`` instead of stepping the optimizers; without a batch it is
  ``forward(example_input_array)`` with a sum-of-outputs loss;
* the estimator is :func:`~nnmem_callbacks.estimators.torch.estimator.estimate_training`
  (per rank for DDP, FSDP and ZeRO:
  :func:`~nnmem_callbacks.estimators.torch.distributed.estimate_per_rank`), with
  the trainer's optimizers, precision, accumulation and clipping, and every
  module's ``training`` flag restored afterwards.

Nothing of the real run changes: parameters, optimizer state and BN statistics
are left as they were (the callback isolates the RNG around the call).

Known limitations:
    * Under manual optimization the losses given to ``manual_backward`` are
      summed into one backward, and each optimizer steps once: a
      ``training_step`` that steps one optimizer between two backwards peaks
      differently.
    * Without an optimizer from the trainer or ``configure_optimizers``, the
      estimate assumes SGD.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from nnmem_callbacks.adapters.lightning.strategy import units_for
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.estimators.torch.distributed import estimate_per_rank
from nnmem_callbacks.estimators.torch.estimator import estimate_training
from nnmem_callbacks.estimators.torch.tracer import sharing_traced_ops

if TYPE_CHECKING:  # the same classes serve lightning.pytorch
    import pytorch_lightning as pl

    from nnmem_callbacks.adapters.lightning.trainer_io import TrainBatch, TrainerFacts

__all__ = [
    "batch_and_loss",
    "configured_optimizers",
    "estimate_changed_run",
    "estimate_module",
    "instance_patches",
    "log",
    "ManualOptimizationShim",
    "model_resident_bytes",
    "sharing_traced_ops",
    "sum_outputs",
    "training_step_loss",
]

log = logging.getLogger(__name__)


class ManualOptimizationShim:
    """Stands in for the optimizers while a manual-optimization ``training_step`` is traced.

    ``manual_backward`` records the loss instead of running backward, and
    ``optimizers()``/``lr_schedulers()`` return objects whose ``step`` does
    nothing; the estimator then runs one backward over the recorded losses and
    steps all optimizers on fake tensors.
    """

    class _Stub:
        def __init__(self, wrapped: Any) -> None:
            self._wrapped = wrapped

        def step(self, *args: Any, **kwargs: Any) -> None:
            closure = kwargs.get("closure") or (args[0] if args and callable(args[0]) else None)
            if closure is not None:
                closure()

        def zero_grad(self, *args: Any, **kwargs: Any) -> None:
            return None

        def __getattr__(self, name: str) -> Any:
            return getattr(self._wrapped, name)

    def __init__(self, module: Any) -> None:
        self.module = module
        self.losses: list[Any] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        module = self.module
        real_optimizers = module.optimizers
        real_schedulers = module.lr_schedulers

        def optimizers(use_pl_optimizer: bool = True) -> Any:
            result = real_optimizers(use_pl_optimizer=use_pl_optimizer)
            if isinstance(result, list):
                return [self._Stub(opt) for opt in result]
            return self._Stub(result)

        def lr_schedulers() -> Any:
            result = real_schedulers()
            if result is None:
                return None
            if isinstance(result, list):
                return [self._Stub(s) for s in result]
            return self._Stub(result)

        def manual_backward(loss: Any, *args: Any, **kwargs: Any) -> None:
            self.losses.append(loss)

        patches = {
            "optimizers": optimizers,
            "lr_schedulers": lr_schedulers,
            "manual_backward": manual_backward,
            "toggle_optimizer": lambda *a, **k: None,
            "untoggle_optimizer": lambda *a, **k: None,
            "toggled_optimizer": lambda *a, **k: contextlib.nullcontext(),
            "clip_gradients": lambda *a, **k: None,
        }
        with instance_patches(module, patches):
            yield


@contextlib.contextmanager
def instance_patches(obj: Any, patches: Mapping[str, Any]) -> Iterator[None]:
    """Sets instance attributes for the duration, then removes them (or restores the old ones)."""
    saved: dict[str, Any] = {}
    missing = object()
    for name, value in patches.items():
        saved[name] = obj.__dict__.get(name, missing)
        object.__setattr__(obj, name, value)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is missing:
                with contextlib.suppress(AttributeError):
                    object.__delattr__(obj, name)
            else:
                object.__setattr__(obj, name, old)


def model_resident_bytes(module: Any, device_kind: str) -> int:
    """Bytes of parameters and buffers already resident on a device of ``device_kind``."""
    total = 0
    seen: set[int] = set()
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.device.type != device_kind or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        total += tensor.numel() * tensor.element_size()
    return total


def training_step_loss(pl_module: Any) -> Callable[[Any, Any], Any]:
    """The loss function the estimator traces: the module's own ``training_step`` on batch index 0."""
    manual = not pl_module.automatic_optimization

    def loss_fn(model: Any, batch: Any) -> Any:
        no_log = {"log": lambda *a, **k: None, "log_dict": lambda *a, **k: None}
        with instance_patches(model, no_log):
            if not manual:
                return model.training_step(batch, 0)
            shim = ManualOptimizationShim(model)
            with shim.installed():
                out = model.training_step(batch, 0)
            losses = list(shim.losses)
            if isinstance(out, Mapping):
                out = out.get("loss")
            if out is not None and not any(out is loss for loss in losses):
                losses.append(out)
            if not losses:
                raise RuntimeError("manual-optimization training_step called manual_backward on no loss")
            total = losses[0]
            for loss in losses[1:]:
                total = total + loss
            return total

    return loss_fn


def configured_optimizers(pl_module: Any) -> list[Any]:
    """The optimizers ``configure_optimizers`` returns (before the strategy has set them up).

    They are only read (class and hyper-parameters) by the estimator, never stepped.
    """
    try:
        configured = pl_module.configure_optimizers()
    except Exception as error:  # noqa: BLE001 - the estimate then assumes SGD and says so
        log.debug("configure_optimizers failed while estimating: %s", error)
        return []
    if isinstance(configured, Mapping):
        configured = configured.get("optimizer")
    if isinstance(configured, (list, tuple)):
        if configured and isinstance(configured[0], (list, tuple)):
            configured = configured[0]
        configured = [c.get("optimizer") if isinstance(c, Mapping) else c for c in configured]
    else:
        configured = [configured]
    import torch

    return [c for c in configured if isinstance(c, torch.optim.Optimizer)]


def estimate_changed_run(
    estimate: MemoryEstimate, batch_size: int, accumulate_grad_batches: int, traced_accumulation: int
) -> MemoryEstimate | None:
    """The direct estimate of the run the callback changed: ``batch_size`` with ``accumulate_grad_batches``.

    ``estimate`` was traced at the configured batch and ``traced_accumulation``; its lines do not hold the
    gradients that more accumulation keeps live through the next micro-batch, so the figure to predict and
    compare after a change is a direct estimate of the changed step (the estimate's verifier). ``None``: the
    run is unchanged, or the estimate has no verifier (or none at that accumulation).
    """
    verifier: Any = estimate.verifier
    if batch_size == estimate.batch_size and accumulate_grad_batches == traced_accumulation:
        return None
    if verifier is not None and accumulate_grad_batches != traced_accumulation:
        accumulating = getattr(verifier, "accumulating", None)
        verifier = accumulating(int(accumulate_grad_batches)) if accumulating is not None else None
    return verifier(int(batch_size)) if verifier is not None else None


def sum_outputs(out: Any) -> Any:
    """A scalar from a model output (tensor, or nested collection of tensors) for a surrogate loss."""
    import torch

    if isinstance(out, torch.Tensor):
        return out.float().sum()
    if isinstance(out, Mapping):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        parts = [sum_outputs(item) for item in out]
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total
    return None


def estimate_module(
    pl_module: pl.LightningModule,
    batch: TrainBatch,
    facts: TrainerFacts,
    *,
    precision: Any = None,
    sequence_dim: int | str | None = None,
    batch_lines: bool = True,
    probe_kernels: Any = True,
) -> tuple[MemoryEstimate | None, str | None]:
    """The estimate of ``pl_module``'s training step on ``batch``, or why there is none; never raises.

    Args:
        pl_module: The LightningModule.
        batch: One train batch, or why there is none (then ``example_input_array`` serves).
        facts: The trainer's facts: optimizers, precision, accumulation, clipping, device and strategy.
        precision: Another precision to estimate at (the ``bf16-mixed`` offer); default: the trainer's.
        sequence_dim: Give the estimate a sequence-length axis (``"auto"``; single device only).
        batch_lines: Trace the two other batch sizes the batch lines come from; ``False`` for an estimate
            read only at ``batch`` (the ``bf16-mixed`` offer's peak: the same figure, in about half the time).
        probe_kernels: The estimator's ``probe_kernels`` (the callback's).

    Returns:
        ``(estimate, None)``, or ``(None, why)``.
    """
    try:
        inputs, loss_fn, source = batch_and_loss(pl_module, batch)
    except Exception as error:  # noqa: BLE001 - never harm the run
        return None, f"no batch to estimate with ({type(error).__name__}: {error})"
    precision = facts.precision if precision is None else precision
    try:
        return (
            run_estimator(
                pl_module,
                inputs,
                loss_fn,
                facts,
                precision,
                sequence_dim,
                batch_lines=batch_lines,
                probe_kernels=probe_kernels,
            ),
            None,
        )
    except Exception as error:  # noqa: BLE001 - never harm the run
        return None, f"the estimator failed on {source}: {type(error).__name__}: {error}"


def batch_and_loss(pl_module: pl.LightningModule, batch: TrainBatch) -> tuple[Any, Callable[[Any, Any], Any], str]:
    """The inputs and the loss function to trace, with a description of their source.

    Raises:
        RuntimeError: When there is no batch and the module has no ``example_input_array``.
    """
    if batch.batch is not None:
        return batch.batch, training_step_loss(pl_module), "LightningModule.training_step with one train batch"
    example = getattr(pl_module, "example_input_array", None)
    if example is None:
        raise RuntimeError(f"{batch.missing}; and the module has no example_input_array")

    def forward_loss(model: Any, inputs: Any) -> Any:
        if isinstance(inputs, tuple):
            out = model(*inputs)
        elif isinstance(inputs, dict):
            out = model(**inputs)
        else:
            out = model(inputs)
        return sum_outputs(out)

    return example, forward_loss, "forward(example_input_array) with a sum-of-outputs loss"


def run_estimator(
    pl_module: pl.LightningModule,
    inputs: Any,
    loss_fn: Callable[[Any, Any], Any],
    facts: TrainerFacts,
    precision: Any,
    sequence_dim: int | str | None = None,
    *,
    batch_lines: bool = True,
    probe_kernels: Any = True,
) -> MemoryEstimate:
    """Runs the estimator with the trainer's optimizers, precision, accumulation and clipping."""
    optimizers = list(facts.optimizers) or configured_optimizers(pl_module)
    optimizer: Any = optimizers[0] if len(optimizers) == 1 else (optimizers or "sgd")
    training = {name: module.training for name, module in pl_module.named_modules()}
    pl_module.train()
    kwargs = dict(
        optimizer=optimizer,
        loss_fn=loss_fn,
        precision=precision,
        device=str(facts.device),
        accumulate_grad_batches=facts.accumulate_grad_batches,
        gradient_clip_val=facts.gradient_clip_val,
        gradient_clip_algorithm=facts.gradient_clip_algorithm,
        check_scaling=batch_lines,
        probe_kernels=probe_kernels,
        # automatic optimization's closure: training_step, zero_grad, backward (manual: the user's own calls)
        zero_grad="before_backward" if pl_module.automatic_optimization else "after_step",
    )
    reading = facts.strategy
    try:
        if reading is None or reading.strategy is None or reading.strategy.kind == "single":
            return estimate_training(pl_module, inputs, sequence_dim=sequence_dim, **kwargs)
        units = units_for(pl_module, reading)
        estimate = estimate_per_rank(pl_module, inputs, strategy=reading.strategy, units=units, **kwargs)
        if reading.reason:  # what the reading assumed: in the notes, and warned by the callback
            estimate = dataclasses.replace(estimate, notes=(*estimate.notes, f"{reading.name}: {reading.reason}"))
        return estimate
    finally:
        for name, module in pl_module.named_modules():
            if name in training:
                module.training = training[name]
