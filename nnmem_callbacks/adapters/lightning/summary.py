"""What the Lightning ``MemoryBudgetCallback`` says at fit start: the one-line summary.

Part of the Lightning callback (see :mod:`nnmem_callbacks.adapters.lightning.callback`).
The callback logs the line through ``rank_zero_info``, and writes it, with the
breakdown, the custom-scalars layout and the breakdown figure
(:func:`nnmem_callbacks.monitoring.tensorboard.write_fit_start`), to every
``TensorBoardLogger`` of the trainer, from rank zero only.
"""

from __future__ import annotations

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.plan import Plan
from nnmem_callbacks.core.strategy import Strategy
from nnmem_callbacks.core.units import format_bytes

__all__ = ["fit_start_summary"]


def fit_start_summary(
    plan: Plan,
    estimate: MemoryEstimate,
    *,
    policy: str,
    applied: bool,
    batch_size: int | None,
    baseline_rss: int | None = None,
    predicted_rss_rise: int = 0,
    accumulate_grad_batches: int = 1,
    changed_peak: int | None = None,
    seq_change: tuple[str, int, int, int] | None = None,
) -> str:
    """The one-line summary: the prediction, the budget, the policy and its decision.

    Args:
        plan: The plan decided at fit start.
        estimate: The estimate it was decided on.
        policy: The callback's policy.
        applied: Whether the callback changed the run (or restored a change).
        batch_size: The batch size trained with.
        baseline_rss: CPU: the process RSS at fit start (``None`` on CUDA).
        predicted_rss_rise: CPU: the predicted rise of the RSS above it.
        accumulate_grad_batches: The accumulation trained with.
        changed_peak: The peak predicted for the run as changed (a direct estimate at the batch and accumulation
            trained with), when the callback changed it.
        seq_change: ``(attribute, configured length, trained length, predicted peak at the configured length)``
            when ``shrink`` shortened the sequence (``plan`` is then the plan at the trained length).

    Example:
        >>> import dataclasses
        >>> from nnmem_callbacks.core.plan import make_plan
        >>> est = MemoryEstimate(peak_bytes=3 * 2**20, breakdown={"activations": 3 * 2**20}, batch_size=8)
        >>> fit_start_summary(make_plan(est, 2**30), est, policy="warn", applied=False, batch_size=8)
        "MemoryBudgetCallback: predicted peak 3.00 MiB at batch size 8 (trace, 32-true, cpu); budget 1.00 GiB; policy 'warn'; decision: fits: training unchanged"
        >>> ddp = dataclasses.replace(est, extra={"strategy": {"kind": "ddp", "world_size": 2}})
        >>> fit_start_summary(make_plan(ddp, 2**30), ddp, policy="warn", applied=False, batch_size=8).split(";")[0]
        'MemoryBudgetCallback: predicted peak 3.00 MiB at batch size 8 (trace, 32-true, cpu, per rank of ddp x2)'
        >>> fit_start_summary(make_plan(est, 2**20), est, policy="shrink", applied=True, batch_size=2).split("; ")[-1]
        'training with batch size 2'
        >>> fit_start_summary(make_plan(est, 2**10, "shrink"), est, policy="shrink", applied=False, batch_size=8
        ...                   ).split("decision: ")[-1]
        "does not fit even at batch size 1; training unchanged at batch size 8 (policy 'shrink': not even batch size 1 fits; see the warning)"
        >>> fit_start_summary(make_plan(est, 2**30), est, policy="shrink", applied=True, batch_size=8,
        ...                   seq_change=("max_length", 128, 38, 26 * 2**20)).split("decision: ")[-1]
        '`max_length` 128 -> 38 (predicted peak 26.00 MiB at 128), batch size 8 kept: fits at 38'
    """
    decision = plan.decision
    if seq_change is not None:
        attr, configured, trained, before = seq_change
        decision = f"`{attr}` {configured} -> {trained} (predicted peak {format_bytes(before)} at {configured}), "
        decision += f"batch size {plan.original_batch_size} kept: " + ("fits" if plan.fits else plan.decision)
        decision += f" at {trained}"
    strategy = estimate.extra.get("strategy") or {}
    per_rank = f", per rank of {Strategy(**strategy).describe()}" if strategy.get("kind", "single") != "single" else ""
    text = (
        f"MemoryBudgetCallback: predicted peak {format_bytes(plan.predicted_bytes)} at batch size "
        f"{plan.original_batch_size} ({estimate.method}, {estimate.precision}, {estimate.device}{per_rank}); budget "
        f"{format_bytes(plan.budget_bytes)}; policy {policy!r}; decision: {decision}"
    )
    if applied and batch_size != plan.original_batch_size:
        text += f"; training with batch size {batch_size}"
        if accumulate_grad_batches > 1:
            text += f" and accumulate_grad_batches {accumulate_grad_batches}"
        if changed_peak is not None:
            text += f" (predicted peak there {format_bytes(changed_peak)}, by a direct estimate)"
    elif not plan.fits:
        text += f"; training unchanged at batch size {batch_size}"
        if policy in ("shrink", "accumulate"):
            why = (
                "not even batch size 1 fits"
                if plan.max_fitting_batch_size == 0
                else "it could not change the batch size"
            )
            text += f" (policy {policy!r}: {why}; see the warning)"
    if baseline_rss is not None:
        text += (
            f"; predicted rise of the process RSS above its fit-start {format_bytes(baseline_rss)}: "
            f"{format_bytes(predicted_rss_rise)}"
        )
    return text
