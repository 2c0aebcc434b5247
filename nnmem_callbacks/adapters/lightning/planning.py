"""Planning for the Lightning ``MemoryBudgetCallback``: the budget on the training device, and the plan.

Part of the Lightning callback (see :mod:`nnmem_callbacks.adapters.lightning.callback`).
The policies themselves live in :mod:`nnmem_callbacks.core.plan`; this module adds
what only the training device and the trainer's settings say:

* :func:`device_budget` resolves the user's budget against the training
  device, counting memory the process already holds (on CUDA the caching
  allocator's reserve and the context; on CPU the model) as available to the
  run, since the prediction includes it.
* :func:`plan_on_device` makes the plan under that budget with the trainer's
  gradient accumulation. When a full-precision run does not fit,
  :func:`offers_bf16` says so; the callback then estimates again under
  ``bf16-mixed``, and :func:`with_bf16_offer` makes the plan again, under the
  same budget, with that estimate as an alternative.
* :func:`with_optimizer_suggestion` adds, to a plan that does not fit, what
  an optimizer with less state saves (the optimizer state in the peak's
  breakdown), a suggestion that holds even where no batch size fits.
* :func:`longest_sequence` is the longest sequence length whose step fits the
  plan's usable budget at the configured batch (``seq_len_attr``).

Example:
    >>> from nnmem_callbacks.core.estimate import MemoryEstimate
    >>> est = MemoryEstimate(peak_bytes=3 * 2**20, breakdown={"activations": 3 * 2**20}, batch_size=8)
    >>> plan = plan_on_device(est, device="cpu", device_kind="cpu", resident_bytes=0, budget="1MiB", margin=0.05,
    ...                       policy="warn")
    >>> plan.budget_bytes, plan.fits, offers_bf16(plan, "32-true"), offers_bf16(plan, "bf16-mixed")
    (1048576, False, True, False)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nnmem_callbacks.core.estimate import Category, MemoryEstimate
from nnmem_callbacks.core.plan import Plan, Suggestion, make_plan, planning_margin, resolve_budget
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.hardware import devices

__all__ = [
    "device_budget",
    "FP32_PRECISIONS",
    "includes_reserve",
    "longest_sequence",
    "longest_sequence_line",
    "offers_bf16",
    "plan_on_device",
    "shorten_blocker",
    "with_bf16_offer",
    "with_optimizer_suggestion",
]

#: The trainer precisions that train in full precision (where ``bf16-mixed`` is offered).
FP32_PRECISIONS = {"32-true", "32", 32}


def includes_reserve(estimate: MemoryEstimate, device_kind: str) -> bool:
    """Whether plans compare the predicted CUDA reserve (the estimate predicts it) rather than the tensor peak."""
    return device_kind == "cuda" and estimate.reserved_bytes is not None


def device_budget(
    estimate: MemoryEstimate, *, device: Any, device_kind: str, resident_bytes: int, budget: Any, margin: float
) -> int:
    """The budget in bytes on the training device.

    Args:
        estimate: The estimate (its CUDA overhead).
        device: The training device (the strategy's root device).
        device_kind: ``"cuda"`` or ``"cpu"``.
        resident_bytes: CPU: the bytes of the model already in memory.
        budget: The user's budget (see :func:`~nnmem_callbacks.core.plan.resolve_budget`).
        margin: Headroom kept below free memory when ``budget`` is ``None``.
    """
    capacity, free = devices.device_capacity(device)
    if device_kind == "cuda":
        import torch

        # memory this process already holds (the model) is part of the predicted peak
        free += int(torch.cuda.memory_reserved(device)) + int(estimate.overhead_bytes)
    else:
        free += resident_bytes
    return resolve_budget(budget, capacity_bytes=capacity, free_bytes=min(free, capacity), margin=margin)


def plan_on_device(
    estimate: MemoryEstimate,
    *,
    device: Any,
    device_kind: str,
    resident_bytes: int,
    budget: Any,
    margin: float,
    policy: str,
    accumulate_grad_batches: int = 1,
) -> Plan:
    """The plan for ``estimate`` under the budget on the training device, with the trainer's accumulation.

    Args:
        estimate: The estimate at the training precision.
        device, device_kind, resident_bytes: As :func:`device_budget` takes them.
        budget: The user's budget (it also decides the planning margin).
        margin: The callback's margin.
        policy: The callback's policy.
        accumulate_grad_batches: The trainer's accumulation.
    """
    include_reserve = includes_reserve(estimate, device_kind)
    budget_bytes = device_budget(
        estimate, device=device, device_kind=device_kind, resident_bytes=resident_bytes, budget=budget, margin=margin
    )
    return make_plan(
        estimate,
        budget_bytes,
        policy,
        planning_margin(budget, margin),
        accumulate_grad_batches=int(accumulate_grad_batches),
        include_reserve=include_reserve,
    )


def offers_bf16(plan: Plan, precision: Any) -> bool:
    """Whether to offer ``bf16-mixed``: the plan does not fit and the trainer trains in full precision."""
    return not plan.fits and str(precision) in {str(p) for p in FP32_PRECISIONS}


def with_bf16_offer(
    plan: Plan, estimate: MemoryEstimate, bf16: MemoryEstimate, *, device_kind: str, accumulate_grad_batches: int = 1
) -> Plan:
    """``plan`` made again (same budget, margin and policy) with ``bf16`` as the ``bf16-mixed`` alternative."""
    return make_plan(
        estimate,
        plan.budget_bytes,
        plan.policy,
        plan.margin,
        accumulate_grad_batches=int(accumulate_grad_batches),
        alternatives={"bf16-mixed": bf16},
        include_reserve=includes_reserve(estimate, device_kind),
    )


def longest_sequence(estimate: MemoryEstimate, plan: Plan, device_kind: str) -> int | None:
    """The longest sequence length that fits ``plan``'s usable budget at the estimate's batch (``None``: no axis).

    On CUDA the plan compares the device total; the tensor peak allowed is the
    usable budget less the context, shrunk by the traced length's reserve ratio.

    Example:
        >>> est = MemoryEstimate(peak_bytes=2**20, breakdown={"activations": 2**20}, batch_size=8)
        >>> plan = make_plan(est, 2**19, "warn", 0.0)
        >>> longest_sequence(est, plan, "cpu") is None  # an estimate without a sequence axis
        True
    """
    if estimate.sequence is None:
        return None
    usable = plan.usable_bytes
    if includes_reserve(estimate, device_kind) and estimate.peak_bytes > 0:
        usable = estimate.tensor_share_of_device(usable)
    if usable <= 0:
        return 0
    return estimate.max_sequence_length(usable, estimate.batch_size)


def shorten_blocker(
    longest: int | None, current: Any, estimate: MemoryEstimate, *, attr: str, loaders_rebuilt: bool
) -> str | None:
    """Why ``shrink`` cannot shorten the sequence to ``longest`` (``None``: it can).

    Args:
        longest: :func:`longest_sequence` (``None``: the estimate has no sequence axis).
        current: The value of ``attr`` (``seq_len_attr``) where Lightning keeps it.
        estimate: The estimate (its traced sequence length).
        attr: The ``seq_len_attr``.
        loaders_rebuilt: Whether the train loaders come from the module or datamodule (not from ``fit``).

    Example:
        >>> est = MemoryEstimate(peak_bytes=1, breakdown={}, batch_size=8)
        >>> shorten_blocker(None, 128, est, attr="max_length", loaders_rebuilt=True)[:37]
        'the estimate has no sequence axis (no'
    """
    if longest is None or estimate.sequence is None:
        return "the estimate has no sequence axis (no (batch, length) token ids in the batch, or a sharded strategy)"
    if not loaders_rebuilt:
        return "the train dataloaders were passed straight to `trainer.fit(...)`, so they cannot be rebuilt"
    if not isinstance(current, int) or isinstance(current, bool):
        return f"`{attr}` is {current!r}, not a length on the model, its hparams or the datamodule"
    if current != estimate.sequence.seq_len:
        return (
            f"`{attr}` is {current} but the first batch's sequence has length {estimate.sequence.seq_len}; name the "
            "attribute the loaders cut or pad to"
        )
    if longest < 1:
        return "not even a sequence of length 1 fits at this batch size"
    return None


def with_optimizer_suggestion(plan: Plan, estimate: MemoryEstimate) -> Plan:
    """``plan`` with the saving of an optimizer that keeps less state, when the plan does not fit.

    The saving is the optimizer state in the peak's breakdown (an optimizer without state, such as SGD without
    momentum, keeps none of it; an 8-bit Adam about a quarter); offered when the state is at least a tenth of
    the peak. It holds where no batch size fits, as the state does not depend on the batch.

    Example:
        >>> est = MemoryEstimate(peak_bytes=3 * 2**20, breakdown={"optimizer_state": 2**20, "parameters": 2**21},
        ...                      batch_size=8)
        >>> plan = make_plan(est, 2**20, "warn")
        >>> print(with_optimizer_suggestion(plan, est).suggestions[-1].text)
        the optimizer state is 1.00 MiB (33% of the peak): an optimizer without state (SGD without momentum) saves about 1.00 MiB, an 8-bit Adam (e.g. bitsandbytes.optim.Adam8bit) about 768.00 KiB
    """
    state = int(estimate.breakdown.get(str(Category.OPTIMIZER_STATE), 0))
    if plan.fits or state < 0.1 * max(estimate.peak_bytes, 1):
        return plan
    text = (
        f"the optimizer state is {format_bytes(state)} ({state / max(estimate.peak_bytes, 1):.0%} of the peak): an "
        f"optimizer without state (SGD without momentum) saves about {format_bytes(state)}, an 8-bit Adam (e.g. "
        f"bitsandbytes.optim.Adam8bit) about {format_bytes(state * 3 // 4)}"
    )
    return dataclasses.replace(plan, suggestions=(*plan.suggestions, Suggestion("optimizer", state, text)))


def longest_sequence_line(estimate: MemoryEstimate, plan: Plan, device_kind: str, attr: str) -> str:
    """The warning's line on the sequence (``seq_len_attr`` ``attr``): the longest length that fits at the batch.

    Example:
        >>> est = MemoryEstimate(peak_bytes=2**20, breakdown={"activations": 2**20}, batch_size=8)
        >>> longest_sequence_line(est, make_plan(est, 2**19, "warn", 0.0), "cpu", "max_length")[:40]
        '\\n`max_length`: the estimate has no seque'
    """
    longest = longest_sequence(estimate, plan, device_kind)
    if longest is None or estimate.sequence is None:
        return f"\n`{attr}`: the estimate has no sequence axis (no (batch, length) token ids in the batch, or a sharded strategy)"
    return (
        f"\nLongest sequence that fits at batch size {estimate.batch_size}: {longest} "
        f"(`{attr}`; traced at {estimate.sequence.seq_len})."
    )
