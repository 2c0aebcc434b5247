"""Planning a Hugging Face run: the plan at the callback's budget, and :func:`plan_training_arguments`.

* :func:`plan_step` makes the :class:`~nnmem_callbacks.core.plan.Plan` of an
  estimate under the budget on the training device (the same budget rules as
  the Lightning callback), with the suggestions of the core (accumulation,
  activation checkpointing, ``bf16`` when an estimate at ``bf16-mixed`` is
  given) and the saving of an 8-bit optimizer (:func:`eight_bit_suggestion`).
* :func:`keep_effective_batch` picks the largest per-device batch that fits
  and divides the configured one, so that ``batch * accumulation`` stays
  exactly the effective batch (``auto_find_batch_size`` halves the batch and
  leaves the accumulation, so the effective batch shrinks).
* :func:`plan_training_arguments` returns a copy of the ``TrainingArguments``
  (or of a TRL config, which subclasses them) with that batch and
  accumulation, and the estimate it was decided on. When no per-device batch
  fits it warns (the budget, the smallest predicted peak, what to try:
  :func:`nothing_fits`) and returns the arguments unchanged; the function has
  no policy, so it never raises for a budget it cannot meet.
  ``print(plan)`` shows the decision on one line.

Example:
    >>> keep_effective_batch(16, 2, largest=6)
    (4, 8)
    >>> keep_effective_batch(12, 1, largest=5)
    (4, 3)

Known limitations:
    * The batch is chosen among the divisors of the configured per-device
      batch; a prime batch that does not fit falls to 1. Each candidate is
      estimated directly at its own accumulation (accumulated gradients stay
      live through the next micro-batch), largest first.
    * The 8-bit saving is arithmetic (Adam's two moments at one byte each
      instead of four), not a traced estimate of ``bitsandbytes``' kernels.
    * Planned per rank under DDP, FSDP and DeepSpeed ZeRO, as the arguments
      say (:mod:`~nnmem_callbacks.adapters.transformers.ranks`); hybrid
      sharding as one device holding a full replica.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from nnmem_callbacks.adapters.lightning.planning import device_budget
from nnmem_callbacks.adapters.transformers import estimation, warning_site
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.plan import (
    DEFAULT_MARGIN,
    Plan,
    Suggestion,
    check_budget,
    check_margin,
    make_plan,
    planning_margin,
)
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.hardware import devices
from nnmem_callbacks.probes.session import check_probe_kernels

__all__ = [
    "checked_setting",
    "checkpointing_argument",
    "eight_bit_suggestion",
    "keep_effective_batch",
    "nothing_fits",
    "plan_step",
    "plan_training_arguments",
    "sample_at",
    "TrainingPlan",
]

#: Optimizer classes whose two moments an 8-bit optimizer keeps at one byte per element.
_ADAM_LIKE = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax")


def keep_effective_batch(batch_size: int, accumulate: int, *, largest: int) -> tuple[int, int]:
    """The largest divisor of ``batch_size`` at most ``largest``, and the accumulation keeping the effective batch.

    Returns:
        ``(per-device batch, accumulation)`` with ``batch * accumulation == batch_size * accumulate``.
    """
    batch_size, accumulate = int(batch_size), max(int(accumulate), 1)
    if largest >= batch_size:
        return batch_size, accumulate
    divisor = max((d for d in range(1, max(int(largest), 1) + 1) if batch_size % d == 0), default=1)
    return divisor, accumulate * (batch_size // divisor)


def eight_bit_suggestion(estimate: MemoryEstimate) -> Suggestion | None:
    """The saving of an 8-bit optimizer (``optim="adamw_8bit"``) when the optimizer state is Adam's moments."""
    state = int(estimate.breakdown.get("optimizer_state", 0))
    optimizer = str((getattr(estimate, "extra", None) or {}).get("optimizer") or "")  # the estimator's label
    if state <= 0 or (optimizer and not any(name.lower() in optimizer.lower() for name in _ADAM_LIKE)):
        return None
    if "8bit" in optimizer.replace("-", "").lower():  # already one (AdamW8bit, the Trainer's "AdamW (8-bit)")
        return None
    saving = int(state * 0.75)
    return Suggestion(
        "8-bit optimizer",
        saving,
        f"an 8-bit optimizer (optim='adamw_8bit' or 'paged_adamw_8bit', needs bitsandbytes) keeps the optimizer "
        f"state at about a quarter of {format_bytes(state)}, saving about {format_bytes(saving)}",
    )


def plan_step(
    estimate: MemoryEstimate,
    *,
    device: Any,
    resident_bytes: int,
    budget: Any,
    margin: float,
    policy: str = "warn",
    accumulate: int = 1,
    bf16: MemoryEstimate | None = None,
    verify: bool | None = None,
) -> Plan:
    """The plan of ``estimate`` under ``budget`` on ``device``, with the suggestions to fit.

    Args:
        estimate: The estimate at the configured per-device batch.
        device: The training device.
        resident_bytes: CPU: the model's bytes already in memory (counted as available, the prediction holds them).
        budget, margin: The callback's budget and margin.
        policy: ``"warn"`` or ``"raise"`` (the Trainer's batch is never changed by the callback).
        accumulate: ``gradient_accumulation_steps``.
        bf16: The estimate at ``bf16-mixed``, offered as an alternative.
        verify: As :func:`~nnmem_callbacks.core.plan.make_plan` takes it.

    A step that already checkpoints (on the model, or turned on for the estimate by the arguments) is not offered
    checkpointing: the estimate says so (``extra["activation_checkpointing"]``) and the core's suggestions read it.
    """
    kind = devices.device_type(device)
    include_reserve = kind == "cuda" and estimate.reserved_bytes is not None
    budget_bytes = device_budget(
        estimate, device=device, device_kind=kind, resident_bytes=resident_bytes, budget=budget, margin=margin
    )
    plan = make_plan(
        estimate,
        budget_bytes,
        policy,
        planning_margin(budget, margin),
        accumulate_grad_batches=int(accumulate),
        alternatives={"bf16": bf16} if bf16 is not None else None,
        include_reserve=include_reserve,
        verify=verify,
    )
    extra = eight_bit_suggestion(estimate)
    if extra is not None and not plan.fits:
        plan = dataclasses.replace(plan, suggestions=plan.suggestions + (extra,))
    return plan


def sample_at(sample: Any, batch_size: int) -> Any:
    """``sample`` (a collated batch) with ``batch_size`` rows: its rows repeated or cut along dim 0."""
    import torch

    def resize(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            rows = value.shape[0]
            if rows == batch_size:
                return value
            repeats = -(-batch_size // max(rows, 1))
            return torch.cat([value] * repeats)[:batch_size] if repeats > 1 else value[:batch_size]
        if isinstance(value, dict):
            return {k: resize(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(resize(v) for v in value)
        return value

    if hasattr(sample, "keys") and not isinstance(sample, dict):
        sample = dict(sample)
    return resize(sample)


@dataclasses.dataclass(frozen=True, repr=False)
class TrainingPlan:
    """What :func:`plan_training_arguments` decided.

    ``print(plan)`` shows the decision on one line (the arguments and the estimate are attributes).

    Attributes:
        args: A copy of the arguments with :attr:`batch_size` and :attr:`accumulate`.
        estimate: The estimate at the configured per-device batch.
        plan: The plan under the budget (its suggestions, the largest batch that fits).
        batch_size: The per-device batch to train with.
        accumulate: The ``gradient_accumulation_steps`` to train with.
        changed: Whether the arguments differ from the configured ones.
        checked: The direct estimate at the chosen batch and accumulation (``None`` when unchanged, or when
            no per-device batch fits).
    """

    args: Any
    estimate: MemoryEstimate
    plan: Plan
    batch_size: int
    accumulate: int
    changed: bool
    checked: MemoryEstimate | None = None

    @property
    def predicted_peak_bytes(self) -> int:
        """The predicted peak at the chosen per-device batch and accumulation."""
        if self.checked is not None:
            return int(self.checked.peak_bytes_at(self.batch_size))
        return int(self.estimate.peak_bytes_at(self.batch_size))

    @property
    def fits(self) -> bool:
        """Whether the chosen batch and accumulation fit the budget (``plan.fits`` is about the configured ones)."""
        return bool(self.plan.fits or self.checked is not None)

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step on each device: :attr:`batch_size` times :attr:`accumulate`."""
        return self.batch_size * self.accumulate

    def __repr__(self) -> str:
        return (
            f"TrainingPlan(batch_size={self.batch_size}, accumulate={self.accumulate}, "
            f"effective_batch={self.effective_batch_size}, predicted_peak={format_bytes(self.predicted_peak_bytes)}, "
            f"budget={format_bytes(self.plan.budget_bytes)}, fits={self.fits}, changed={self.changed})"
        )


@estimation.sharing_traced_ops()  # the estimate and the direct checks of smaller batches share their op memo
def plan_training_arguments(
    model: Any,
    args: Any,
    budget: int | float | str | None = None,
    sample: Any = None,
    *,
    margin: float = DEFAULT_MARGIN,
    trainer: Any = None,
    device: Any = None,
    probe_kernels: Any = True,
) -> TrainingPlan:
    """A copy of ``args`` with the per-device batch and accumulation that fit ``budget`` and keep the effective batch.

    Args:
        model: The model as it will be trained (PEFT, quantized, gradient checkpointing as set).
        args: ``transformers.TrainingArguments`` or a subclass (TRL's ``SFTConfig``...); it is not changed.
        budget: ``None``: the device's free memory less ``margin``; bytes; a fraction of the device; ``"2GiB"``.
        sample: One collated batch (any number of rows; resized to ``per_device_train_batch_size``). Default:
            the first batch of ``trainer``'s dataset.
        margin: Headroom kept below the budget.
        trainer: A Trainer whose collator, loss and optimizer are used (optional).
        device: Where training runs (default ``args.device``).
        probe_kernels: The estimator's ``probe_kernels`` (``True``, ``False`` or a ``ProbeSettings``).

    Returns:
        The :class:`TrainingPlan`; ``plan.args`` is the copy to train with. When no per-device batch fits (not
        even 1, at the accumulation that keeps the effective batch), the arguments are returned unchanged,
        ``TrainingPlan.fits`` is ``False``, and a ``UserWarning`` names the budget, the smallest predicted peak
        and what to try.

    Raises:
        ValueError: For an invalid budget or margin, or without ``sample`` and ``trainer``.

    Example:
        >>> import torch, transformers
        >>> config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=128, n_positions=64)
        >>> model = transformers.GPT2LMHeadModel(config)
        >>> args = transformers.TrainingArguments("out", per_device_train_batch_size=8, report_to=[], use_cpu=True)
        >>> ids = torch.randint(0, 128, (8, 32))
        >>> planned = plan_training_arguments(model, args, budget="1GiB", sample={"input_ids": ids, "labels": ids})
        >>> planned.args.per_device_train_batch_size, planned.args.gradient_accumulation_steps
        (8, 1)
    """
    check_budget(budget)
    check_margin(margin)
    check_probe_kernels(probe_kernels)
    batch_size = int(args.per_device_train_batch_size)
    accumulate = max(int(getattr(args, "gradient_accumulation_steps", 1) or 1), 1)
    if sample is None:
        if trainer is None:
            raise ValueError("plan_training_arguments needs `sample` (one collated batch) or `trainer`")
        sample = estimation.first_batch(trainer, batch_size)
    batch = sample_at(sample, batch_size)
    if device is None:
        device = getattr(args, "device", None) or "cpu"
    optimizer = getattr(trainer, "optimizer", None) if trainer is not None else None
    facts = estimation.read_facts(
        args, model, optimizer=optimizer, device=device, batch_size=batch_size, trainer=trainer
    )
    for note in facts.notes:  # what was assumed (an unmodelled strategy, an optimizer not built) is never silent
        warning_site.warn(f"plan_training_arguments: {note}.")
    loss_fn = estimation.trainer_loss(trainer) if trainer is not None else None
    estimate = estimation.estimate_step(model, batch, facts, loss_fn, probe_kernels=probe_kernels)
    resident = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    plan = plan_step(
        estimate,
        device=device,
        resident_bytes=resident if devices.device_type(device) == "cpu" else 0,
        budget=budget,
        margin=margin,
        accumulate=accumulate,
        verify=True,
    )
    new_batch, new_accumulate, checked = batch_size, accumulate, None
    include_reserve = devices.device_type(device) == "cuda" and estimate.reserved_bytes is not None
    if not plan.fits and plan.max_fitting_batch_size >= 1:
        new_batch, new_accumulate, checked = checked_setting(
            model, sample, facts, loss_fn, plan, include_reserve=include_reserve, probe_kernels=probe_kernels
        )
    if not plan.fits and checked is None:  # nothing fits: the arguments stay as they were, and the user is told
        new_batch, new_accumulate = batch_size, accumulate
        warning_site.warn(nothing_fits(estimate, plan, include_reserve=include_reserve, accumulate=accumulate))
    planned = copy.copy(args)
    planned.per_device_train_batch_size = new_batch
    planned.gradient_accumulation_steps = new_accumulate
    changed = (new_batch, new_accumulate) != (batch_size, accumulate)
    plan = dataclasses.replace(plan, batch_size=new_batch, accumulate_grad_batches=new_accumulate)
    return TrainingPlan(planned, estimate, plan, new_batch, new_accumulate, changed, checked)


def nothing_fits(estimate: MemoryEstimate, plan: Plan, *, include_reserve: bool, accumulate: int) -> str:
    """The warning of :func:`plan_training_arguments` when no per-device batch fits: the budget, the smallest
    predicted peak (at per-device batch 1) and what to try."""
    peak = estimate.device_bytes_at if include_reserve else estimate.upper_bytes_at
    kept = f" ({format_bytes(plan.usable_bytes)} usable, keeping {plan.margin:.0%} free)" if plan.margin else ""
    largest = plan.max_fitting_batch_size
    if largest >= 1:
        where = (
            f"per-device batch {largest} fits without accumulation ({format_bytes(peak(largest))}), but no divisor "
            f"of per_device_train_batch_size={plan.original_batch_size} fits at the gradient accumulation that keeps "
            f"the effective batch of {plan.original_batch_size * accumulate} (the accumulated gradients stay live)"
        )
    else:
        where = f"the smallest predicted peak, at per-device batch 1, is {format_bytes(peak(1))}"
    settings = {"checkpointing": f"{checkpointing_argument()}=True", "bf16": "bf16=True"}  # their TrainingArguments
    tries = [
        f"{s.text} ({settings[s.kind]})" if s.kind in settings else s.text
        for s in plan.suggestions
        if s.kind not in ("accumulate", "batch_size")
    ]
    if largest >= 1:
        tries.append(f"per_device_train_batch_size={largest} without accumulation (a smaller effective batch)")
    tries.append("a larger budget, a smaller model or shorter sequences")
    return (
        f"plan_training_arguments: nothing fits the budget of {format_bytes(plan.budget_bytes)}{kept}. The "
        f"configured per_device_train_batch_size={plan.original_batch_size}, gradient_accumulation_steps="
        f"{accumulate} predicts {format_bytes(plan.predicted_bytes)}; {where}. The arguments are returned "
        "unchanged (TrainingPlan.fits is False). To fit, try:\n" + "\n".join(f"- {text}" for text in tries)
    )


def checkpointing_argument() -> str:
    """The ``TrainingArguments`` field that turns checkpointing on: ``activation_checkpointing`` (transformers 5,
    where ``gradient_checkpointing`` is a deprecated alias that warns) or ``gradient_checkpointing``."""
    try:
        from transformers import TrainingArguments
    except ImportError:  # pragma: no cover - the adapter runs with transformers
        return "gradient_checkpointing"
    fields = getattr(TrainingArguments, "__dataclass_fields__", {})
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def checked_setting(
    model: Any,
    sample: Any,
    facts: estimation.StepFacts,
    loss_fn: Any,
    plan: Plan,
    *,
    include_reserve: bool,
    probe_kernels: Any = True,
) -> tuple[int, int, MemoryEstimate | None]:
    """The largest divisor batch whose own estimate, at its own accumulation, fits; ``(batch, accumulation, it)``.

    Accumulating keeps the gradients live through the next micro-batch's forward and backward, so the peak of a
    smaller batch with accumulation is estimated directly, not read off the lines of the configured step.
    """
    usable = plan.usable_bytes
    largest = plan.max_fitting_batch_size
    batch_size, accumulate = facts.batch_size, facts.accumulate
    divisors = sorted((d for d in range(1, min(largest, batch_size) + 1) if batch_size % d == 0), reverse=True)
    for divisor in divisors:
        steps = accumulate * (batch_size // divisor)
        at = dataclasses.replace(facts, batch_size=divisor, accumulate=steps)
        checked = estimation.estimate_step(model, sample_at(sample, divisor), at, loss_fn, probe_kernels=probe_kernels)
        peak = checked.device_bytes_at(divisor) if include_reserve else checked.upper_bytes_at(divisor)
        if peak <= usable:
            return divisor, steps, checked
    return 1, accumulate * batch_size, None
