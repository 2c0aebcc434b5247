"""What the Lightning ``MemoryBudgetCallback`` says at fit start: the one-line summary and its TensorBoard artefacts.

Part of the Lightning callback (see :mod:`nnmem_callbacks.adapters.lightning.callback`).
The summary goes to the log through ``rank_zero_info``; every
``TensorBoardLogger`` of the trainer also gets the summary with the breakdown
as text, the custom-scalars layout for the epoch series and the breakdown
figure (:func:`nnmem_callbacks.monitoring.tensorboard.write_fit_start`), written by
rank zero only. A failing writer never breaks training (``safe`` says it once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.plan import Plan, describe_plan
from nnmem_callbacks.core.formatting import format_markdown_breakdown, format_summary
from nnmem_callbacks.core.units import format_bytes

if TYPE_CHECKING:
    from nnmem_callbacks.adapters.lightning.namespace import Namespace

__all__ = ["fit_start_summary", "write_tensorboard_fit_start"]


def fit_start_summary(
    plan: Plan,
    estimate: MemoryEstimate,
    *,
    policy: str,
    applied: bool,
    batch_size: int | None,
    baseline_rss: int | None = None,
    predicted_rss_rise: int = 0,
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

    Example:
        >>> from nnmem_callbacks.core.plan import make_plan
        >>> est = MemoryEstimate(peak_bytes=3 * 2**20, breakdown={"activations": 3 * 2**20}, batch_size=8)
        >>> fit_start_summary(make_plan(est, 2**30), est, policy="warn", applied=False, batch_size=8)
        "MemoryBudgetCallback: predicted peak 3.00 MiB at batch size 8 (trace, 32-true, cpu); budget 1.00 GiB; policy 'warn'; decision: fits: training unchanged"
        >>> fit_start_summary(make_plan(est, 2**20), est, policy="shrink", applied=True, batch_size=2).split("; ")[-1]
        'training with batch size 2'
    """
    text = (
        f"MemoryBudgetCallback: predicted peak {format_bytes(plan.predicted_bytes)} at batch size "
        f"{plan.original_batch_size} ({estimate.method}, {estimate.precision}, {estimate.device}); budget "
        f"{format_bytes(plan.budget_bytes)}; policy {policy!r}; decision: {plan.decision}"
    )
    if applied and batch_size != plan.original_batch_size:
        text += f"; training with batch size {batch_size}"
    if baseline_rss is not None:
        text += (
            f"; predicted rise of the process RSS above its fit-start {format_bytes(baseline_rss)}: "
            f"{format_bytes(predicted_rss_rise)}"
        )
    return text


def write_tensorboard_fit_start(
    ns: Namespace,
    trainer: Any,
    *,
    summary: Callable[[], str],
    estimate: MemoryEstimate | None,
    plan: Plan | None,
    device_kind: str,
    batch_size: int | None,
    safe: Callable[[Callable[[], Any], str], Any],
) -> None:
    """Writes the fit-start text, layout and figure to each ``TensorBoardLogger`` (rank zero only)."""
    if not getattr(trainer, "is_global_zero", True):
        return
    for logger in trainer.loggers:
        if not isinstance(logger, ns.TensorBoardLogger):
            continue
        text = "\n\n".join(
            [
                summary().replace("MemoryBudgetCallback: ", ""),
                format_markdown_breakdown(estimate) if estimate else "",
                "```\n" + format_summary(estimate) + "\n```" if estimate else "",
            ]
        )
        if plan is not None and estimate is not None and not plan.fits:
            text += "\n\n```\n" + describe_plan(plan, estimate) + "\n```"
        from nnmem_callbacks.monitoring.tensorboard import write_fit_start

        def write(logger: Any = logger, text: str = text) -> None:
            write_fit_start(
                logger.experiment,
                estimate,
                kind=device_kind,
                text=text,
                budget_bytes=plan.budget_bytes if plan else None,
                batch_size=batch_size,
                step=int(trainer.global_step),
            )

        safe(write, "writing the fit-start summary to TensorBoard")
