"""What the ranks of a distributed Lightning run agree on: one plan for all, and the largest measured peak.

Part of the Lightning ``MemoryBudgetCallback`` (see :mod:`nnmem_callbacks.adapters.lightning.callback`).
Each rank estimates and plans on its own; before anything changes, all ranks
train with the smallest batch size any rank chose, and a failure on any rank
disables the callback's actions on all of them. The epoch's measured peak is
the largest over the ranks. Both go through ``trainer.strategy.reduce`` (one
``max`` reduction of an int64 tensor), so they work for every strategy
Lightning can reduce with; a single-device run reduces nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from nnmem_callbacks.core.plan import Plan

__all__ = ["agree_on_plan", "reduce_max"]


def agree_on_plan(
    trainer: Any, plan: Plan | None, failed: bool, *, policy: str, warn: Callable[[str], None]
) -> Plan | None:
    """All ranks train with one batch size: the smallest any rank chose; any failure disables all.

    Args:
        trainer: The Trainer (``world_size``, ``strategy``, ``accumulate_grad_batches``).
        plan: This rank's plan (``None`` when it has none).
        failed: Whether this rank's estimate or plan failed.
        policy: The callback's policy (``"accumulate"`` raises the accumulation
            so that the effective batch stays at least the original one).
        warn: Says that the ranks could not agree (this rank's plan is kept).

    Returns:
        The plan every rank uses, or ``None`` when any rank failed.
    """
    if int(getattr(trainer, "world_size", 1)) <= 1:
        return plan
    import torch

    local_batch = plan.batch_size if plan is not None else 0
    unfit = 0 if (plan is None or plan.fits) else 1
    flags = torch.tensor(
        [1 if (failed or plan is None) else 0, -local_batch, unfit],
        dtype=torch.int64,
        device=trainer.strategy.root_device,
    )
    try:
        reduced = trainer.strategy.reduce(flags, reduce_op="max")
    except Exception as error:  # pragma: no cover - depends on the backend
        warn(f"MemoryBudgetCallback: ranks could not agree on a batch size ({error}); using this rank's plan")
        return plan
    any_failed, agreed_batch, any_unfit = (int(v) for v in reduced.tolist())
    agreed_batch = -agreed_batch
    if any_failed or plan is None:
        return None
    if agreed_batch == plan.batch_size and bool(any_unfit) == (not plan.fits):
        return plan
    accumulate = plan.accumulate_grad_batches
    if policy == "accumulate" and agreed_batch != plan.original_batch_size:
        accumulate = int(trainer.accumulate_grad_batches) * math.ceil(plan.original_batch_size / agreed_batch)
    # this rank's direct check was of its own batch; another rank's smaller one was checked there, not here
    verification = plan.verification
    if verification is not None and verification.batch_size != agreed_batch:
        verification = None
    return dataclasses.replace(
        plan,
        batch_size=agreed_batch,
        accumulate_grad_batches=accumulate,
        fits=plan.fits and not any_unfit,
        verification=verification,
    )


def reduce_max(trainer: Any, value: int) -> int:
    """The largest ``value`` over the ranks (``value`` itself on one device or when the reduction fails)."""
    if int(getattr(trainer, "world_size", 1)) <= 1:
        return value
    import torch

    try:
        tensor = torch.tensor([int(value)], dtype=torch.int64, device=trainer.strategy.root_device)
        return int(trainer.strategy.reduce(tensor, reduce_op="max").item())
    except Exception:  # pragma: no cover - depends on the backend
        return value
