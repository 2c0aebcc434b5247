"""Estimating a LightningModule's training step: one real batch, the loss to trace, the estimator call.

Part of the Lightning ``MemoryBudgetCallback`` (see :mod:`nnmem_callbacks.adapters.lightning.callback`):

* :meth:`ModuleEstimation.batch_and_loss` takes one batch the way the fit loop
  would (``train_dataloader`` of the module or datamodule, combined loaders,
  the batch-transfer hooks), without starting worker processes for map-style
  datasets; without one it falls back to ``example_input_array`` and a
  sum-of-outputs loss.
* :func:`training_step_loss` traces the module's own ``training_step``, with
  ``log`` silenced and, under manual optimization,
  :class:`ManualOptimizationShim` recording the losses given to
  ``manual_backward`` instead of stepping the optimizers.
* :meth:`ModuleEstimation.run` calls the PyTorch estimator (per rank for DDP,
  FSDP and ZeRO) with the trainer's optimizers, precision, accumulation and
  clipping, under Lightning's ``isolate_rng`` and with every module's
  ``training`` flag restored.

Lightning is reached only through the callback's ``Namespace`` (``ns``), so
this works for ``pytorch_lightning`` and ``lightning.pytorch`` alike. Nothing of
the real run changes: parameters, optimizer state, RNG and BN statistics are
left as they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from nnmem_callbacks.core.estimate import MemoryEstimate

if TYPE_CHECKING:
    from nnmem_callbacks.adapters.lightning.namespace import Namespace

__all__ = [
    "configured_optimizers",
    "instance_patches",
    "log",
    "ManualOptimizationShim",
    "model_resident_bytes",
    "ModuleEstimation",
    "one_batch",
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


def one_batch(loader: Any) -> Any:
    """One batch from a DataLoader; for map-style datasets without starting worker processes."""
    import torch.utils.data as data

    dataset = loader.dataset
    batch_sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(dataset, data.IterableDataset) and batch_sampler is not None:
        indices = next(iter(batch_sampler))
        return loader.collate_fn([dataset[i] for i in indices])
    return next(iter(loader))


@dataclasses.dataclass
class ModuleEstimation:
    """Estimates a LightningModule's training step on one of its own batches.

    Args:
        ns: The callback's Lightning ``Namespace`` (``root``, ``isolate_rng``).
        estimator: Returns the PyTorch estimator (``estimate_training``).
        per_rank_estimator: Returns the per-rank estimator for DDP, FSDP and
            ZeRO (``estimate_per_rank``).
        one_batch: Takes one batch from a DataLoader.
        strategy_reading: The strategy as
            :func:`~nnmem_callbacks.adapters.lightning.strategy.read_strategy` read it
            (``None``: a single device).
    """

    ns: Namespace
    estimator: Callable[[], Callable[..., MemoryEstimate]]
    per_rank_estimator: Callable[[], Callable[..., MemoryEstimate]]
    one_batch: Callable[[Any], Any] = one_batch
    strategy_reading: Any = None

    def from_module(self, trainer: Any, pl_module: Any) -> tuple[MemoryEstimate | None, int | None, str | None]:
        """Returns ``(estimate, batch size, failure reason)``; never raises."""
        try:
            batch, loss_fn, source = self.batch_and_loss(trainer, pl_module)
        except Exception as error:
            return None, None, f"no batch to estimate with ({type(error).__name__}: {error})"
        try:
            estimate = self.run(trainer, pl_module, batch, loss_fn, trainer.precision)
        except Exception as error:
            return None, None, f"the estimator failed on {source}: {type(error).__name__}: {error}"
        return estimate, estimate.batch_size, None  # the estimator reads it from the batch (dim 0 of the first tensor)

    def at_precision(self, trainer: Any, pl_module: Any, precision: str) -> MemoryEstimate | None:
        """The estimate under another precision (the ``bf16-mixed`` offer); ``None`` when that fails."""
        try:
            batch, loss_fn, _ = self.batch_and_loss(trainer, pl_module)
            return self.run(trainer, pl_module, batch, loss_fn, precision)
        except Exception as error:
            log.debug("%s re-estimate failed: %s", precision, error)
            return None

    def batch_and_loss(self, trainer: Any, pl_module: Any) -> tuple[Any, Callable[[Any, Any], Any], str]:
        """One real batch and the loss function to trace, with a description of their source."""
        batch, error = None, None
        try:
            with self.ns.isolate_rng():
                batch = self.first_train_batch(trainer, pl_module)
        except Exception as caught:  # fall back to example_input_array
            error = caught
        if batch is not None:
            return batch, training_step_loss(pl_module), "LightningModule.training_step with one train batch"
        example = getattr(pl_module, "example_input_array", None)
        if example is None:
            why = f"{type(error).__name__}: {error}" if error else "the train dataloader gave no batch"
            raise RuntimeError(f"{why}; and the module has no example_input_array")

        def forward_loss(model: Any, inputs: Any) -> Any:
            if isinstance(inputs, tuple):
                out = model(*inputs)
            elif isinstance(inputs, dict):
                out = model(**inputs)
            else:
                out = model(inputs)
            return sum_outputs(out)

        return example, forward_loss, "forward(example_input_array) with a sum-of-outputs loss"

    def first_train_batch(self, trainer: Any, pl_module: Any) -> Any:
        """The first train batch, through the batch-transfer hooks, as the fit loop would see it."""
        import torch.utils.data as data

        if trainer.limit_train_batches == 0:
            raise RuntimeError("limit_train_batches=0")
        loader = trainer.fit_loop._data_source.dataloader()
        if isinstance(loader, data.DataLoader):
            batch = self.one_batch(loader)
        else:  # collections of loaders: let Lightning combine them like the fit loop does
            combined_cls = importlib.import_module(f"{self.ns.root}.utilities.combined_loader").CombinedLoader
            combined = loader if isinstance(loader, combined_cls) else combined_cls(loader, "max_size_cycle")
            iterator = iter(combined)
            batch = next(iterator)
            if isinstance(batch, tuple) and len(batch) == 3:
                batch = batch[0]
        batch = pl_module.on_before_batch_transfer(batch, 0)
        return pl_module.on_after_batch_transfer(batch, 0)

    def run(self, trainer: Any, pl_module: Any, batch: Any, loss_fn: Any, precision: Any) -> MemoryEstimate:
        """Runs the estimator with the trainer's optimizers, precision, accumulation and clipping."""
        optimizers = list(trainer.optimizers) or configured_optimizers(pl_module)
        optimizer: Any = optimizers[0] if len(optimizers) == 1 else (optimizers or "sgd")
        training = {name: module.training for name, module in pl_module.named_modules()}
        pl_module.train()
        reading = self.strategy_reading
        kwargs = dict(
            optimizer=optimizer,
            loss_fn=loss_fn,
            precision=precision,
            device=str(trainer.strategy.root_device),
            accumulate_grad_batches=int(trainer.accumulate_grad_batches),
            gradient_clip_val=trainer.gradient_clip_val,
            gradient_clip_algorithm=trainer.gradient_clip_algorithm or "norm",
        )
        try:
            with self.ns.isolate_rng():
                if reading is None or reading.strategy is None or reading.strategy.kind == "single":
                    return self.estimator()(pl_module, batch, **kwargs)
                from nnmem_callbacks.adapters.lightning.strategy import units_for

                return self.per_rank_estimator()(
                    pl_module, batch, strategy=reading.strategy, units=units_for(pl_module, reading), **kwargs
                )
        finally:
            for name, module in pl_module.named_modules():
                if name in training:
                    module.training = training[name]
