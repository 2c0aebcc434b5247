"""Planning for the Lightning ``MemoryBudgetCallback``: the budget on the training device, and the plan.

Part of the Lightning callback (see :mod:`nnmem_callbacks.adapters.lightning.callback`).
The policies themselves live in :mod:`nnmem_callbacks.core.plan`; this module adds
what only the trainer knows:

* :func:`budget_bytes` resolves the user's budget against the training
  device, counting memory the process already holds (on CUDA the caching
  allocator's reserve and the context; on CPU the model) as available to the
  run, since the prediction includes it.
* :func:`make_lightning_plan` makes the plan with the trainer's gradient
  accumulation, and when a full-precision run does not fit, offers
  ``bf16-mixed`` as an alternative, estimated again at that precision.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from nnmem_callbacks.hardware import devices
from nnmem_callbacks.adapters.lightning.estimation import model_resident_bytes
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.plan import Plan, make_plan, planning_margin, resolve_budget

__all__ = ["budget_bytes", "FP32_PRECISIONS", "log", "make_lightning_plan"]

log = logging.getLogger(__name__)

#: The trainer precisions that train in full precision (where ``bf16-mixed`` is offered).
FP32_PRECISIONS = {"32-true", "32", 32}


def budget_bytes(
    trainer: Any, pl_module: Any, estimate: MemoryEstimate, *, budget: Any, margin: float, device_kind: str
) -> tuple[int, bool]:
    """``(budget bytes, include_reserve)`` for the training device.

    Args:
        trainer: The Trainer (its strategy's root device).
        pl_module: The LightningModule (its parameters already on the device).
        estimate: The estimate (its CUDA overhead, and whether it predicts the reserve).
        budget: The user's budget (see :func:`~nnmem_callbacks.core.plan.resolve_budget`).
        margin: Headroom kept below free memory when ``budget`` is ``None``.
        device_kind: ``"cuda"`` or ``"cpu"``.
    """
    device = trainer.strategy.root_device
    capacity, free = devices.device_capacity(device)
    if device_kind == "cuda":
        import torch

        # memory this process already holds (the model) is part of the predicted peak
        free += int(torch.cuda.memory_reserved(device)) + int(estimate.overhead_bytes)
        include_reserve = estimate.reserved_bytes is not None
    else:
        free += model_resident_bytes(pl_module, "cpu")
        include_reserve = False
    resolved = resolve_budget(budget, capacity_bytes=capacity, free_bytes=min(free, capacity), margin=margin)
    return resolved, include_reserve


def make_lightning_plan(
    trainer: Any,
    estimate: MemoryEstimate,
    *,
    budget: Any,
    budget_and_reserve: tuple[int, bool],
    policy: str,
    margin: float,
    bf16_alternative: Callable[[], MemoryEstimate | None],
) -> Plan:
    """The plan for ``estimate`` under the budget, with the trainer's accumulation.

    Args:
        trainer: The Trainer (``accumulate_grad_batches``, ``precision``).
        estimate: The estimate at the training precision.
        budget: The user's budget (it decides the planning margin).
        budget_and_reserve: What :func:`budget_bytes` returned.
        policy: The callback's policy.
        margin: The callback's margin.
        bf16_alternative: Estimates the step again under ``bf16-mixed``
            (``None`` when that fails); called only when a full-precision run
            does not fit.
    """
    budget_value, include_reserve = budget_and_reserve
    accumulate = int(trainer.accumulate_grad_batches)
    planning = planning_margin(budget, margin)
    plan = make_plan(
        estimate, budget_value, policy, planning, accumulate_grad_batches=accumulate, include_reserve=include_reserve
    )
    if not plan.fits and str(trainer.precision) in {str(p) for p in FP32_PRECISIONS}:
        alternative = bf16_alternative()
        if alternative is not None:
            plan = make_plan(
                estimate,
                budget_value,
                policy,
                planning,
                accumulate_grad_batches=accumulate,
                alternatives={"bf16-mixed": alternative},
                include_reserve=include_reserve,
            )
    return plan
