"""Acting on a Lightning plan: warn, raise, or change the batch size and accumulation and rebuild the loaders.

Part of the Lightning ``MemoryBudgetCallback`` (see :mod:`nnmem_callbacks.adapters.lightning.callback`).
The batch size is changed the way Lightning's own ``BatchSizeFinder`` does it:
``lightning_setattr`` sets it wherever Lightning keeps it (model, ``hparams``,
datamodule, datamodule ``hparams``), then the fit loop's train and validation
loaders are dropped and set up again. :func:`batch_change_blocker` says when
that cannot work (loaders passed straight to ``fit``, no such attribute, an
attribute that is not the loader's batch size, manual optimization with
``accumulate``) and how to make it possible; the policy then falls back to a
warning. Lightning is reached only through the callback's ``Namespace``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.plan import MemoryBudgetExceeded, Plan, describe_plan

if TYPE_CHECKING:
    from nnmem_callbacks.adapters.lightning.namespace import Namespace

__all__ = ["act", "batch_change_blocker", "reset_dataloaders", "restore", "restored_plan", "set_batch_size"]


def batch_change_blocker(
    ns: Namespace, trainer: Any, pl_module: Any, estimate: MemoryEstimate, *, batch_size_attr: str, policy: str
) -> str | None:
    """Why the batch size cannot be changed, with how to make it possible; ``None`` when it can."""
    if not trainer.fit_loop._data_source.is_module():
        return (
            "the train dataloaders were passed straight to `trainer.fit(...)`, so Lightning cannot rebuild them "
            f"with another batch size. Return the DataLoader from `LightningModule.train_dataloader()` or a "
            f"`LightningDataModule.train_dataloader()` that reads `self.{batch_size_attr}` (or "
            f"`self.hparams.{batch_size_attr}`)"
        )
    if not ns.lightning_hasattr(pl_module, batch_size_attr):
        return (
            f"no attribute {batch_size_attr!r} was found on the model, `model.hparams`, the datamodule or "
            f"`datamodule.hparams`. Store the batch size there (e.g. `self.save_hyperparameters()` with a "
            f"`{batch_size_attr}` argument), use it in `train_dataloader()`, or pass "
            f"`batch_size_attr=` naming the attribute you use"
        )
    value = ns.lightning_getattr(pl_module, batch_size_attr)
    if value != estimate.batch_size:
        return (
            f"`{batch_size_attr}` is {value!r} but the train dataloader's first batch has "
            f"{estimate.batch_size} samples; `batch_size_attr` must name the per-device batch size that "
            f"`train_dataloader()` uses"
        )
    if policy == "accumulate" and not pl_module.automatic_optimization:
        return (
            "the module uses manual optimization, where Lightning does not support `accumulate_grad_batches`; "
            "use policy='shrink' and accumulate inside `training_step`"
        )
    return None


def act(
    ns: Namespace,
    trainer: Any,
    pl_module: Any,
    plan: Plan,
    estimate: MemoryEstimate,
    *,
    policy: str,
    batch_size_attr: str,
    apply: Callable[[int, int], None],
    warn: Callable[[str], None],
) -> None:
    """Applies ``policy`` to a plan that does not fit.

    ``raise`` raises :class:`~nnmem_callbacks.MemoryBudgetExceeded`;
    ``shrink``/``accumulate`` call ``apply(batch_size, accumulate)`` when the
    batch size can be changed (else they say why and fall back to a warning);
    ``warn`` warns with the plan's description.
    """
    message = describe_plan(plan, estimate)
    if policy == "raise":
        raise MemoryBudgetExceeded(
            f"MemoryBudgetCallback(policy='raise'): the predicted peak exceeds the budget.\n{message}"
        )
    if policy in ("shrink", "accumulate") and plan.changed:
        blocker = batch_change_blocker(ns, trainer, pl_module, estimate, batch_size_attr=batch_size_attr, policy=policy)
        if blocker is None:
            apply(plan.batch_size, plan.accumulate_grad_batches)
            warn(f"MemoryBudgetCallback(policy={policy!r}) changed the run: {plan.decision}.\n{message}")
            return
        warn(
            f"MemoryBudgetCallback(policy={policy!r}) cannot change the batch size: {blocker}. "
            f"Falling back to policy='warn'.\n{message}"
        )
        return
    warn(f"MemoryBudgetCallback: the predicted peak exceeds the budget.\n{message}")


def set_batch_size(ns: Namespace, trainer: Any, pl_module: Any, batch_size_attr: str, batch_size: int) -> None:
    """Sets the batch size wherever Lightning keeps it and has the fit loop rebuild its loaders."""
    ns.lightning_setattr(pl_module, batch_size_attr, int(batch_size))
    reset_dataloaders(trainer)


def reset_dataloaders(trainer: Any) -> None:
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


def restore(ns: Namespace, trainer: Any, pl_module: Any, restored: Mapping[str, Any], batch_size_attr: str) -> bool:
    """Trains with the batch size and accumulation a checkpoint's ``state_dict`` holds.

    Returns:
        Whether the batch size was set (it is only where ``batch_size_attr`` exists).
    """
    found = bool(ns.lightning_hasattr(pl_module, batch_size_attr))
    if found:
        set_batch_size(ns, trainer, pl_module, batch_size_attr, restored["batch_size"])
    if restored.get("accumulate_grad_batches"):
        trainer.accumulate_grad_batches = int(restored["accumulate_grad_batches"])
    return found


def restored_plan(plan: Plan, restored: Mapping[str, Any]) -> Plan:
    """``plan`` with the batch size and accumulation a checkpoint's ``state_dict`` holds.

    Example:
        >>> plan = Plan(budget_bytes=100, predicted_bytes=150, fits=False, policy="shrink", original_batch_size=64,
        ...             batch_size=64, accumulate_grad_batches=1, max_fitting_batch_size=16)
        >>> again = restored_plan(plan, {"batch_size": 16, "accumulate_grad_batches": 4})
        >>> again.batch_size, again.original_batch_size, again.accumulate_grad_batches
        (16, 64, 4)
    """
    return dataclasses.replace(
        plan,
        batch_size=int(restored["batch_size"]),
        original_batch_size=int(restored.get("original_batch_size") or plan.original_batch_size),
        accumulate_grad_batches=int(restored.get("accumulate_grad_batches") or plan.accumulate_grad_batches),
    )
