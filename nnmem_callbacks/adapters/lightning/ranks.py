"""What the ranks of a distributed Lightning run agree on: one plan for all.

Part of the Lightning ``MemoryBudgetCallback`` (see :mod:`nnmem_callbacks.adapters.lightning.callback`).
Each rank estimates and plans on its own; before anything changes, all ranks
train with the smallest batch size any rank chose, and a failure on any rank
disables the callback's actions on all of them. Each rank sends
:func:`what_this_rank_sends` (a list of ints); the callback reduces the lists
by ``max`` over the ranks (``trainer.strategy.reduce``, one int64 tensor), and
:func:`agreed_plan` makes the plan from what came back. On one device what
comes back is what was sent, and the plan stays as it is.

Example:
    >>> plan = Plan(budget_bytes=100, predicted_bytes=150, fits=False, policy="accumulate", original_batch_size=64,
    ...             batch_size=16, accumulate_grad_batches=4, max_fitting_batch_size=16)
    >>> what_this_rank_sends(plan)
    [0, -16, 1]
    >>> agreed = agreed_plan(plan, [0, -8, 1], policy="accumulate", accumulate_grad_batches=1)
    >>> agreed.batch_size, agreed.accumulate_grad_batches
    (8, 8)
    >>> agreed_plan(plan, [1, -16, 1], policy="accumulate", accumulate_grad_batches=1) is None
    True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from nnmem_callbacks.core.plan import Plan

__all__ = ["agreed_plan", "what_this_rank_sends"]


def what_this_rank_sends(plan: Plan | None) -> list[int]:
    """``[no plan here, -batch size, does not fit]``: the ``max`` over ranks of each says what all must know.

    The batch size is sent negated so that ``max`` picks the smallest.
    """
    if plan is None:
        return [1, 0, 0]
    return [0, -plan.batch_size, 0 if plan.fits else 1]


def agreed_plan(
    plan: Plan | None, received: Sequence[int], *, policy: str, accumulate_grad_batches: int
) -> Plan | None:
    """The plan every rank uses: the smallest batch size any rank chose; ``None`` when any rank has no plan.

    Args:
        plan: This rank's plan (``None`` when it has none).
        received: The ``max`` over ranks of what :func:`what_this_rank_sends` sent.
        policy: The callback's policy (``"accumulate"`` raises the accumulation
            so that the effective batch stays at least the original one).
        accumulate_grad_batches: The trainer's accumulation before any change.
    """
    any_failed, agreed_batch, any_unfit = (int(v) for v in received)
    agreed_batch = -agreed_batch
    if any_failed or plan is None:
        return None
    if agreed_batch == plan.batch_size and bool(any_unfit) == (not plan.fits):
        return plan
    accumulate = plan.accumulate_grad_batches
    if policy == "accumulate" and agreed_batch != plan.original_batch_size:
        accumulate = int(accumulate_grad_batches) * math.ceil(plan.original_batch_size / agreed_batch)
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
