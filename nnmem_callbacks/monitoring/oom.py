"""Out-of-memory diagnosis, for every adapter: is this error an OOM, and what to say about it.

:func:`is_out_of_memory` classifies an exception (CUDA, host, or none);
:func:`diagnose_out_of_memory` says where it struck (the phase of the step),
what was predicted and measured, and what to do. Framework-free: the figures
come from the adapter (the plan, the estimate, the meter's readings).

Example:
    >>> is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    'cuda'
    >>> diagnose_out_of_memory("cpu", phase="forward").splitlines()[0]
    "MemoryBudgetCallback: CPU out of memory during the 'forward' phase."

Known limitations:
    * The classification reads the exception's type name and text: an
      allocator that words its error otherwise is not recognised.
"""

from __future__ import annotations

from typing import Any

from nnmem_callbacks.core.units import format_bytes

__all__ = ["diagnose_out_of_memory", "is_out_of_memory", "NO_PLAN_ADVICE"]


def is_out_of_memory(exception: BaseException) -> str | None:
    """Classifies an exception as an out-of-memory error.

    Returns:
        ``"cuda"`` for a CUDA OOM, ``"cpu"`` for a host OOM, ``None`` otherwise.

    Example:
        >>> is_out_of_memory(MemoryError()), is_out_of_memory(ValueError("x"))
        ('cpu', None)
        >>> is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        'cuda'
    """
    name = type(exception).__name__
    text = str(exception)
    if name == "OutOfMemoryError" or "CUDA out of memory" in text or "CUDA error: out of memory" in text:
        return "cuda"
    if isinstance(exception, MemoryError):
        return "cpu"
    lowered = text.lower()
    if isinstance(exception, RuntimeError) and (
        "can't allocate memory" in lowered or "not enough memory" in lowered or "defaultcpuallocator" in lowered
    ):
        return "cpu"
    if "out of memory" in lowered or "resource_exhausted" in lowered or "oom when allocating" in lowered:
        return "cuda" if "cuda" in lowered or "hip" in lowered or "gpu" in lowered else "cpu"
    return None


#: What :func:`diagnose_out_of_memory` advises when there is no plan.
NO_PLAN_ADVICE = "Lower the batch size, or enable gradient accumulation, activation checkpointing or mixed precision."


def diagnose_out_of_memory(
    kind: str,
    *,
    phase: str,
    plan: Any = None,
    estimate: Any = None,
    predicted_bytes: int | None = None,
    batch_size: int | None = None,
    failure: str | None = None,
    measured_peak_bytes: int | None = None,
    phase_peaks: dict[str, int] | None = None,
    advice: tuple[str, ...] = (),
    no_plan_advice: str = NO_PLAN_ADVICE,
) -> str:
    """The diagnosis of an out-of-memory error: where it struck, what was predicted and measured, what to do.

    Args:
        kind: ``"cuda"`` or ``"cpu"``, as :func:`is_out_of_memory` says.
        phase: The phase of the step the error struck in.
        plan: The :class:`~nnmem_callbacks.core.plan.Plan` decided at fit start
            (its budget, largest fitting batch and suggestions), if any.
        estimate: The :class:`~nnmem_callbacks.core.estimate.MemoryEstimate` (its
            predicted peak phase), if any.
        predicted_bytes: The prediction comparable to the measured figure.
        batch_size: The batch size trained with.
        failure: Why there is no prediction, when there is none.
        measured_peak_bytes: The meter's peak before the failure.
        phase_peaks: The measured peaks per phase.
        advice: Lines said after the largest fitting batch (the adapter's own
            remedies, such as a policy that acts).
        no_plan_advice: What to advise without a plan.

    Returns:
        The diagnosis, one statement per line.

    Example:
        >>> print(diagnose_out_of_memory("cpu", phase="backward", failure="no batch", measured_peak_bytes=3 * 2**30))
        MemoryBudgetCallback: CPU out of memory during the 'backward' phase.
        No prediction was available (no batch).
        Measured peak before the failure: 3.00 GiB.
        Lower the batch size, or enable gradient accumulation, activation checkpointing or mixed precision.
    """
    lines = [f"MemoryBudgetCallback: {kind.upper()} out of memory during the '{phase}' phase."]
    if predicted_bytes is not None and plan is not None and estimate is not None:
        lines.append(
            f"Predicted peak {format_bytes(predicted_bytes)} at batch size {batch_size} "
            f"(phase '{estimate.peak_phase}'), budget {format_bytes(plan.budget_bytes)}."
        )
    else:
        lines.append(f"No prediction was available ({failure or 'the callback did not run at fit start'}).")
    if measured_peak_bytes is not None:
        lines.append(f"Measured peak before the failure: {format_bytes(measured_peak_bytes)}.")
    if phase_peaks:
        lines.append("Measured peaks by phase: " + ", ".join(f"{k}={format_bytes(v)}" for k, v in phase_peaks.items()))
    if plan is not None:
        if plan.max_fitting_batch_size:
            lines.append(f"Largest batch size predicted to fit: {plan.max_fitting_batch_size}.")
        lines.extend(advice)
        if plan.fits:
            lines.append(
                "The prediction fit the budget, so memory outside the estimate ran out: other processes on the "
                "device, evaluation steps, or growth the estimate did not model; lower `budget` or raise `margin`."
            )
        for suggestion in plan.suggestions:
            lines.append(f"- {suggestion.text}")
    else:
        lines.append(no_plan_advice)
    return "\n".join(lines)
