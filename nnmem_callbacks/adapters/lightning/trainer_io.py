"""Reading from and applying to a Lightning Trainer: the one place, beside the callback's hooks, that touches it.

Part of the Lightning ``MemoryBudgetCallback`` (see :mod:`nnmem_callbacks.adapters.lightning.callback`).
The other modules of the callback take data and return decisions; this one
turns the Trainer into data and applies what was decided:

* :func:`read_facts` reads what estimating, planning and acting need, once, into
  a frozen :class:`TrainerFacts`; :func:`read_strategy` reads the strategy;
  :func:`first_train_batch` takes one batch the way the fit loop would (the
  module's or datamodule's ``train_dataloader``, combined loaders, the
  batch-transfer hooks), without starting worker processes for map-style
  datasets, and says why when there is none.
* :func:`set_batch_size` sets the batch size the way Lightning's own
  ``BatchSizeFinder`` does (``lightning_setattr`` wherever Lightning keeps it,
  then the fit loop's train and validation loaders are dropped and set up
  again); :func:`set_accumulation` sets ``accumulate_grad_batches``.
* :func:`reduce_max` reduces ints over the ranks (``trainer.strategy.reduce``);
  :func:`tensorboard_loggers` lists the trainer's ``TensorBoardLogger`` objects.

Lightning itself is reached through the callback's ``Namespace`` (``ns``), so
this works for ``pytorch_lightning`` and ``lightning.pytorch`` alike; the
annotations name ``pytorch_lightning`` classes, which stand for both.

Known limitations:
    * The train loader is read through the fit loop's private ``_data_source``
      and its loaders are dropped through ``_combined_loader``, as Lightning's
      ``BatchSizeFinder`` does: a Lightning release that renames them breaks
      taking a batch (then the callback falls back to ``example_input_array``)
      and changing the batch size.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any, Sequence

from nnmem_callbacks.adapters.lightning.actions import BatchSizeSetting
from nnmem_callbacks.adapters.lightning.strategy import StrategyReading
from nnmem_callbacks.adapters.lightning.strategy import read_strategy as read_lightning_strategy

if TYPE_CHECKING:  # the same classes serve lightning.pytorch
    import pytorch_lightning as pl

    from nnmem_callbacks.adapters.lightning.namespace import Namespace

__all__ = [
    "batch_size_attr_found",
    "first_train_batch",
    "one_batch",
    "read_facts",
    "read_strategy",
    "reduce_max",
    "reset_dataloaders",
    "set_accumulation",
    "set_batch_size",
    "tensorboard_loggers",
    "TrainBatch",
    "TrainerFacts",
]


@dataclasses.dataclass(frozen=True)
class TrainerFacts:
    """What the callback reads from the Trainer at a hook, once.

    Attributes:
        device: The strategy's root device (a ``torch.device``; Lightning's ``root_device`` is one).
        device_kind: ``"cuda"`` or ``"cpu"``: what is measured and budgeted.
        precision: The trainer's precision (``"32-true"``, ``"bf16-mixed"``...).
        accumulate_grad_batches: Micro-batches per optimizer step.
        gradient_clip_val: The clipping value (``None``: no clipping).
        gradient_clip_algorithm: ``"norm"`` or ``"value"``.
        world_size: The number of ranks.
        global_rank: This rank.
        is_global_zero: Whether this is rank zero.
        optimizers: The optimizers the strategy has set up (empty before it has).
        strategy: The strategy as :func:`read_strategy` read it (``None``: not
            read, treated as a single device).
        batch_size: Where the batch size comes from: whether the train loaders
            come from the module, the batch-size attribute and its value.
    """

    device: Any
    device_kind: str
    precision: Any
    accumulate_grad_batches: int
    gradient_clip_val: Any
    gradient_clip_algorithm: Any
    world_size: int
    global_rank: int
    is_global_zero: bool
    optimizers: tuple[Any, ...]
    strategy: StrategyReading | None
    batch_size: BatchSizeSetting


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """One batch of the train loader, or why there is none.

    Attributes:
        batch: The batch as ``training_step`` would get it (``None``: none).
        missing: Why there is no batch (``None`` when there is one).
    """

    batch: Any
    missing: str | None = None


def read_strategy(trainer: pl.Trainer) -> StrategyReading:
    """The trainer's strategy for this rank (see :func:`~nnmem_callbacks.adapters.lightning.strategy.read_strategy`)."""
    return read_lightning_strategy(
        trainer.strategy,
        world_size=int(getattr(trainer, "world_size", 1) or 1),
        global_rank=int(getattr(trainer, "global_rank", 0) or 0),
    )


def read_facts(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    ns: Namespace,
    *,
    strategy: StrategyReading | None,
    batch_size_attr: str,
) -> TrainerFacts:
    """Reads the facts of ``trainer`` (see :class:`TrainerFacts`); ``strategy`` is what :func:`read_strategy` read."""
    device = trainer.strategy.root_device
    found = batch_size_attr_found(pl_module, ns, batch_size_attr)
    return TrainerFacts(
        device=device,
        device_kind="cuda" if device.type == "cuda" else "cpu",
        precision=trainer.precision,
        accumulate_grad_batches=int(trainer.accumulate_grad_batches),
        gradient_clip_val=trainer.gradient_clip_val,
        gradient_clip_algorithm=trainer.gradient_clip_algorithm or "norm",
        world_size=int(getattr(trainer, "world_size", 1)),
        global_rank=int(getattr(trainer, "global_rank", 0)),
        is_global_zero=bool(getattr(trainer, "is_global_zero", True)),
        optimizers=tuple(trainer.optimizers),
        strategy=strategy,
        batch_size=BatchSizeSetting(
            loaders_from_module=bool(trainer.fit_loop._data_source.is_module()),
            found=found,
            value=ns.lightning_getattr(pl_module, batch_size_attr) if found else None,
            automatic_optimization=bool(pl_module.automatic_optimization),
        ),
    )


def batch_size_attr_found(pl_module: pl.LightningModule, ns: Namespace, batch_size_attr: str) -> bool:
    """Whether ``batch_size_attr`` exists on the model, ``model.hparams``, the datamodule or ``datamodule.hparams``."""
    return bool(ns.lightning_hasattr(pl_module, batch_size_attr))


def one_batch(loader: Any) -> Any:
    """One batch from a DataLoader; for map-style datasets without starting worker processes."""
    import torch.utils.data as data

    dataset = loader.dataset
    batch_sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(dataset, data.IterableDataset) and batch_sampler is not None:
        indices = next(iter(batch_sampler))
        return loader.collate_fn([dataset[i] for i in indices])
    return next(iter(loader))


def first_train_batch(trainer: pl.Trainer, pl_module: pl.LightningModule, ns: Namespace) -> TrainBatch:
    """The first train batch, through the batch-transfer hooks, as the fit loop would see it; the RNG is left alone."""
    try:
        with ns.isolate_rng():
            batch = _first_train_batch(trainer, pl_module, ns)
    except Exception as error:  # noqa: BLE001 - the estimate falls back to example_input_array
        return TrainBatch(None, f"{type(error).__name__}: {error}")
    return TrainBatch(batch, None if batch is not None else "the train dataloader gave no batch")


def _first_train_batch(trainer: pl.Trainer, pl_module: pl.LightningModule, ns: Namespace) -> Any:
    import torch.utils.data as data

    if trainer.limit_train_batches == 0:
        raise RuntimeError("limit_train_batches=0")
    loader = trainer.fit_loop._data_source.dataloader()
    if isinstance(loader, data.DataLoader):
        batch = one_batch(loader)
    else:  # collections of loaders: let Lightning combine them like the fit loop does
        combined_cls = importlib.import_module(f"{ns.root}.utilities.combined_loader").CombinedLoader
        combined = loader if isinstance(loader, combined_cls) else combined_cls(loader, "max_size_cycle")
        batch = next(iter(combined))
        if isinstance(batch, tuple) and len(batch) == 3:
            batch = batch[0]
    batch = pl_module.on_before_batch_transfer(batch, 0)
    return pl_module.on_after_batch_transfer(batch, 0)


def set_batch_size(
    trainer: pl.Trainer, pl_module: pl.LightningModule, ns: Namespace, batch_size_attr: str, batch_size: int
) -> None:
    """Sets the batch size wherever Lightning keeps it and has the fit loop rebuild its loaders."""
    set_loader_setting(trainer, pl_module, ns, batch_size_attr, batch_size)


def set_loader_setting(
    trainer: pl.Trainer, pl_module: pl.LightningModule, ns: Namespace, attr: str, value: int
) -> None:
    """Sets an attribute the loaders read (batch size, sequence length) wherever Lightning keeps it; rebuilds them."""
    ns.lightning_setattr(pl_module, attr, int(value))
    reset_dataloaders(trainer)


def read_setting(pl_module: pl.LightningModule, ns: Namespace, attr: str) -> Any:
    """The value of ``attr`` on the model, ``hparams``, the datamodule or its ``hparams``; ``None`` when absent."""
    if not ns.lightning_hasattr(pl_module, attr):
        return None
    return ns.lightning_getattr(pl_module, attr)


def set_accumulation(trainer: pl.Trainer, accumulate_grad_batches: int) -> None:
    """Sets ``trainer.accumulate_grad_batches``."""
    trainer.accumulate_grad_batches = int(accumulate_grad_batches)


def reset_dataloaders(trainer: pl.Trainer) -> None:
    """Drops built train/val loaders so the fit loop rebuilds them with the new batch size."""
    loop = trainer.fit_loop
    rebuild = loop._combined_loader is not None
    loop._combined_loader = None
    val_loop = loop.epoch_loop.val_loop
    val_rebuild = val_loop._combined_loader is not None
    val_loop._combined_loader = None
    if rebuild:
        loop.setup_data()
    if val_rebuild:
        val_loop.setup_data()


def reduce_max(trainer: pl.Trainer, values: Sequence[int]) -> list[int]:
    """The largest of each value over the ranks (``values`` itself on one device); raises when the reduction fails."""
    if int(getattr(trainer, "world_size", 1)) <= 1:
        return [int(v) for v in values]
    import torch

    tensor = torch.tensor([int(v) for v in values], dtype=torch.int64, device=trainer.strategy.root_device)
    return [int(v) for v in trainer.strategy.reduce(tensor, reduce_op="max").tolist()]


def tensorboard_loggers(trainer: pl.Trainer, ns: Namespace) -> list[Any]:
    """The trainer's ``TensorBoardLogger`` objects."""
    return [logger for logger in trainer.loggers if isinstance(logger, ns.TensorBoardLogger)]
