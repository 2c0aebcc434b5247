"""What to do about a Lightning plan that does not fit: keep, warn, raise, or change the batch size and accumulation.

Part of the Lightning ``MemoryBudgetCallback`` (see :mod:`nnmem_callbacks.adapters.lightning.callback`).
:func:`decide` returns a :class:`Decision` with its message; the callback
applies it (through :mod:`~nnmem_callbacks.adapters.lightning.trainer_io`: the
batch size set wherever Lightning keeps it, the loaders rebuilt).
:func:`batch_change_blocker` says when the batch size cannot be changed
(loaders passed straight to ``fit``, no such attribute, an attribute that is not
the loader's batch size, manual optimization with ``accumulate``) and how to
make it possible; the policy then falls back to a warning.
:func:`restored_plan` is the plan with the decisions a checkpoint holds.

Example:
    >>> from nnmem_callbacks.core.estimate import MemoryEstimate
    >>> est = MemoryEstimate(peak_bytes=3 * 2**20, breakdown={"activations": 3 * 2**20}, batch_size=8)
    >>> plan = Plan(budget_bytes=2**20, predicted_bytes=est.peak_bytes, fits=False, policy="shrink",
    ...             original_batch_size=8, batch_size=2, accumulate_grad_batches=1, max_fitting_batch_size=2)
    >>> blocked = BatchSizeSetting(loaders_from_module=False, found=True, value=8, automatic_optimization=True)
    >>> decision = decide(plan, est, blocked, policy="shrink", batch_size_attr="batch_size")
    >>> decision.action, "Falling back to policy='warn'" in decision.message, "8 -> 2" in decision.message
    ('warn', True, False)
    >>> decision.message.splitlines()[0].split(": training goes on ")[1]
    'at batch size 8; set batch size 2 yourself to fit.'
    >>> free = dataclasses.replace(blocked, loaders_from_module=True)
    >>> decision = decide(plan, est, free, policy="shrink", batch_size_attr="batch_size")
    >>> decision.action, decision.batch_size, decision.accumulate_grad_batches
    ('change', 2, None)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.plan import Plan, describe_plan

__all__ = ["batch_change_blocker", "BatchSizeSetting", "decide", "Decision", "restored_plan", "unchanged_plan"]


@dataclasses.dataclass(frozen=True)
class BatchSizeSetting:
    """Where the run's batch size comes from, as the trainer and the module say.

    Attributes:
        loaders_from_module: Whether the train loaders come from the module or
            datamodule (Lightning can rebuild them), not from ``fit``.
        found: Whether the batch-size attribute exists (model, ``hparams``,
            datamodule, datamodule ``hparams``).
        value: Its value (``None`` when it does not exist).
        automatic_optimization: The module's ``automatic_optimization``.
    """

    loaders_from_module: bool
    found: bool
    value: Any
    automatic_optimization: bool


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the callback does about its plan.

    Attributes:
        action: ``"keep"`` (nothing), ``"warn"``, ``"raise"``
            (:class:`~nnmem_callbacks.MemoryBudgetExceeded` with the message) or
            ``"change"`` (set the batch size and accumulation, then warn).
        message: What to warn or raise with (empty for ``"keep"``).
        batch_size: ``"change"``: the batch size to train with.
        accumulate_grad_batches: ``"change"``: the accumulation to set
            (``None``: leave the trainer's).
    """

    action: str
    message: str = ""
    batch_size: int | None = None
    accumulate_grad_batches: int | None = None


def batch_change_blocker(
    estimate: MemoryEstimate, setting: BatchSizeSetting, *, batch_size_attr: str, policy: str
) -> str | None:
    """Why the batch size cannot be changed, with how to make it possible; ``None`` when it can."""
    if not setting.loaders_from_module:
        return (
            "the train dataloaders were passed straight to `trainer.fit(...)`, so Lightning cannot rebuild them "
            f"with another batch size. Return the DataLoader from `LightningModule.train_dataloader()` or a "
            f"`LightningDataModule.train_dataloader()` that reads `self.{batch_size_attr}` (or "
            f"`self.hparams.{batch_size_attr}`)"
        )
    if not setting.found:
        return (
            f"no attribute {batch_size_attr!r} was found on the model, `model.hparams`, the datamodule or "
            f"`datamodule.hparams`. Store the batch size there (e.g. `self.save_hyperparameters()` with a "
            f"`{batch_size_attr}` argument), use it in `train_dataloader()`, or pass "
            f"`batch_size_attr=` naming the attribute you use"
        )
    if setting.value != estimate.batch_size:
        return (
            f"`{batch_size_attr}` is {setting.value!r} but the train dataloader's first batch has "
            f"{estimate.batch_size} samples; `batch_size_attr` must name the per-device batch size that "
            f"`train_dataloader()` uses"
        )
    if policy == "accumulate" and not setting.automatic_optimization:
        return (
            "the module uses manual optimization, where Lightning does not support `accumulate_grad_batches`; "
            "use policy='shrink' and accumulate inside `training_step`"
        )
    return None


def decide(
    plan: Plan, estimate: MemoryEstimate, setting: BatchSizeSetting, *, policy: str, batch_size_attr: str
) -> Decision:
    """What ``policy`` does about ``plan``.

    A plan that fits is kept. Otherwise ``raise`` raises; ``shrink`` and
    ``accumulate`` change the batch size (and, for ``accumulate``, the
    accumulation) when it can be changed, else say why and fall back to a
    warning; ``warn`` warns with the plan's description.
    """
    if plan.fits:
        return Decision("keep")
    message = describe_plan(plan, estimate)
    if policy == "raise":
        return Decision(
            "raise", f"MemoryBudgetCallback(policy='raise'): the predicted peak exceeds the budget.\n{message}"
        )
    if policy in ("shrink", "accumulate") and plan.changed:
        blocker = batch_change_blocker(estimate, setting, batch_size_attr=batch_size_attr, policy=policy)
        if blocker is None:
            return Decision(
                "change",
                f"MemoryBudgetCallback(policy={policy!r}) changed the run: {plan.decision}.\n{message}",
                batch_size=plan.batch_size,
                accumulate_grad_batches=plan.accumulate_grad_batches if policy == "accumulate" else None,
            )
        # nothing is changed: the message describes the run as it trains, and the change as a suggestion
        kept = dataclasses.replace(plan, batch_size=plan.original_batch_size)
        setting = f"batch size {plan.batch_size}"
        if policy == "accumulate":
            setting += f" with `Trainer(accumulate_grad_batches={plan.accumulate_grad_batches})`"
        return Decision(
            "warn",
            f"MemoryBudgetCallback(policy={policy!r}) cannot change the batch size: {blocker}. "
            f"Falling back to policy='warn': training goes on at batch size {plan.original_batch_size}; set "
            f"{setting} yourself to fit.\n{describe_plan(kept, estimate)}",
        )
    return Decision("warn", f"MemoryBudgetCallback: the predicted peak exceeds the budget.\n{message}")


def unchanged_plan(plan: Plan, accumulate_grad_batches: int) -> Plan:
    """``plan`` as the run really goes on when the callback does not change it: the original batch and accumulation.

    A ``shrink`` or ``accumulate`` plan that cannot be applied (the loaders came
    from ``fit``, no batch-size attribute) falls back to a warning; the plan kept
    on the callback (its summary, ``state_dict``, the epoch comparison) must then
    describe the run that trains, not the change that was not made.

    Example:
        >>> plan = Plan(budget_bytes=100, predicted_bytes=150, fits=False, policy="shrink", original_batch_size=64,
        ...             batch_size=41, accumulate_grad_batches=1, max_fitting_batch_size=41)
        >>> plan.decision
        'batch size 64 -> 41'
        >>> unchanged_plan(plan, 1).decision
        'does not fit; largest fitting batch size is 41'
    """
    return dataclasses.replace(
        plan,
        batch_size=plan.original_batch_size,
        accumulate_grad_batches=int(accumulate_grad_batches),
        verification=None,
    )


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
