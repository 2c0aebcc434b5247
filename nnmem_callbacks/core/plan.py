"""From an estimate and a budget to a decision: budgets, policies and plans.

This is the framework-free half of every ``MemoryBudgetCallback``: the adapters
gather an estimate and a device capacity, call :func:`resolve_budget` and
:func:`make_plan`, and then only apply and report the resulting :class:`Plan`.

Example:
    >>> from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
    >>> est = MemoryEstimate(peak_bytes=9_000, breakdown={"parameters": 1_000, "activations": 8_000},
    ...                      batch_size=8, phases=(PhaseLine("step1/backward", 1_000, 1_000),),
    ...                      peak_phase="step1/backward")
    >>> plan = make_plan(est, budget_bytes=5_300, policy="accumulate", margin=0.05)
    >>> plan.batch_size, plan.accumulate_grad_batches, plan.fits
    (4, 2, False)
    >>> make_plan(est, budget_bytes=4_300, policy="accumulate").batch_size  # at most 3 fit: 4 steps of 2 keep the 8
    2
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

from nnmem_callbacks.core.estimate import Category, MemoryEstimate
from nnmem_callbacks.core.units import BARE_NUMBER, UNIT_NAMES, format_bytes, parse_bytes
from nnmem_callbacks.core.verification import Verification, verify_batch_size

__all__ = [
    "accumulated_gradient_bytes",
    "accumulation_split",
    "check_budget",
    "check_margin",
    "check_policy",
    "checkpointing_saving",
    "DEFAULT_MARGIN",
    "describe_plan",
    "effective_batch_words",
    "make_plan",
    "MemoryBudgetExceeded",
    "parse_budget_text",
    "Plan",
    "planning_margin",
    "POLICIES",
    "resolve_budget",
    "suggest",
    "Suggestion",
]

#: Policies every MemoryBudgetCallback accepts.
POLICIES = ("warn", "raise", "shrink", "accumulate")

#: Headroom kept below the free memory when no budget is given.
DEFAULT_MARGIN = 0.05


class MemoryBudgetExceeded(RuntimeError):
    """Raised by ``policy="raise"`` when the predicted peak exceeds the budget."""


def check_policy(policy: str) -> str:
    """Validates a policy name.

    Raises:
        ValueError: Naming the valid policies.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid policies are {', '.join(map(repr, POLICIES))}")
    return policy


def check_margin(margin: float) -> float:
    """Validates a margin (a fraction of the budget kept free)."""
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ValueError(f"margin must be a fraction in [0, 1), got {margin!r}")
    return float(margin)


def planning_margin(budget: int | float | str | None, margin: float) -> float:
    """The margin :func:`make_plan` should keep below a budget resolved from ``budget``.

    With no budget, :func:`resolve_budget` already keeps ``margin`` of the free
    memory out, so the plan must not take it a second time.

    Example:
        >>> planning_margin(None, 0.1), planning_margin("10GiB", 0.1)
        (0.0, 0.1)
    """
    return 0.0 if budget is None else check_margin(margin)


def check_budget(budget: int | float | str | None) -> int | float | str | None:
    """Validates a budget spelling without resolving it.

    Valid budgets: ``None`` (free device memory minus the margin), a positive
    ``int`` of bytes, a ``float`` in (0, 1] (a fraction of device capacity), or
    a string read by :func:`parse_budget_text` (``"10GiB"``, or ``"0.9"``).
    """
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise ValueError(_budget_error(budget))
    if isinstance(budget, int):
        if budget <= 0:
            raise ValueError(_budget_error(budget))
        return budget
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise ValueError(_budget_error(budget))
        return budget
    if isinstance(budget, str):
        parse_budget_text(budget)
        return budget
    raise ValueError(_budget_error(budget))


def parse_budget_text(text: str) -> int | float:
    """Reads a budget written as text (the CLI's ``--budget``, or a string passed to the API).

    One rule for both: a size with a unit (``"10GiB"``, ``"512MiB"``, ``"16GB"``,
    ``"4096B"``) is bytes; a bare number is a fraction of the device and must be
    in (0, 1], as a ``float`` budget is. A bare number above 1 (``"1.5"``,
    ``"16"``) is an error naming the unit to add, never a count of bytes.

    Returns:
        Bytes as an ``int``, or a fraction as a ``float``.

    Raises:
        ValueError: Naming the two valid spellings.

    Example:
        >>> parse_budget_text("10GiB"), parse_budget_text("0.9"), parse_budget_text("1")
        (10737418240, 0.9, 1.0)
        >>> parse_budget_text("1.5")
        Traceback (most recent call last):
        ...
        ValueError: budget '1.5' has no unit, so it is read as a fraction of the device, which must be in (0, 1]; for a size add a unit, e.g. '1.5GiB' or '1.5GB'
    """
    if BARE_NUMBER.fullmatch(str(text)):
        fraction = float(text)
        if not 0 < fraction <= 1:
            raise ValueError(_bare_number_error(str(text).strip(), fraction))
        return fraction
    try:
        value = parse_bytes(text)
    except ValueError:  # parse_bytes' own example of a size is a bare byte count, which a budget reads as a fraction
        raise ValueError(
            f"cannot read {text!r} as a budget; write a size with a unit, e.g. '10GiB', '512MiB', '16GB' or "
            f"'1048576B' (units: {', '.join(UNIT_NAMES)}), or a fraction of the device in (0, 1] such as '0.9'"
        ) from None
    if value <= 0:
        raise ValueError(
            f"budget {text!r} is not more than 0 bytes; write a positive size such as '10GiB' or a fraction of the "
            f"device in (0, 1] such as '0.9'"
        )
    return value


def _bare_number_error(number: str, value: float) -> str:
    """Why a bare number is no budget, with the spelling the writer most likely meant.

    Example:
        >>> _bare_number_error("2200000", 2200000.0).split("; ")[1]
        "for a size add a unit: '2200000B' is 2200000 bytes (2.10 MiB)"
        >>> _bare_number_error("0", 0.0).split("; ")[1]
        'a budget must be more than 0'
    """
    head = f"budget {number!r} has no unit, so it is read as a fraction of the device, which must be in (0, 1]"
    if value <= 0:
        return f"{head}; a budget must be more than 0"
    if value >= 1024 and value == int(value):  # a count of bytes written without its unit
        return f"{head}; for a size add a unit: '{number}B' is {int(value)} bytes ({format_bytes(int(value))})"
    return f"{head}; for a size add a unit, e.g. '{number}GiB' or '{number}GB'"


def _budget_error(budget: object) -> str:
    return (
        f"invalid budget {budget!r}; use None (free device memory minus the margin), a positive int "
        f"of bytes, a float in (0, 1] (fraction of device capacity) or a string such as '10GiB' or '0.9'"
    )


def resolve_budget(
    budget: int | float | str | None,
    *,
    capacity_bytes: int,
    free_bytes: int | None = None,
    margin: float = DEFAULT_MARGIN,
) -> int:
    """Turns a budget spelling into bytes.

    Args:
        budget: See :func:`check_budget`.
        capacity_bytes: Total memory of the training device.
        free_bytes: Memory free now (defaults to ``capacity_bytes``).
        margin: Fraction kept free when ``budget`` is ``None``.

    Returns:
        The budget in bytes.

    Example:
        >>> resolve_budget(0.5, capacity_bytes=1000)
        500
        >>> resolve_budget(None, capacity_bytes=1000, free_bytes=800, margin=0.05)
        760
    """
    check_budget(budget)
    if budget is None:
        free = capacity_bytes if free_bytes is None else free_bytes
        return int(free * (1 - margin))
    if isinstance(budget, str):
        budget = parse_budget_text(budget)
    if isinstance(budget, float):
        return int(capacity_bytes * budget)
    return int(budget)


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """One way to reduce memory, with its predicted saving in bytes."""

    kind: str  # "accumulate", "checkpointing", "bf16-mixed", "batch_size"
    saving_bytes: int
    text: str


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a MemoryBudgetCallback decided.

    Attributes:
        policy: The policy applied.
        budget_bytes: The budget compared against.
        predicted_bytes: Predicted peak at the original batch size.
        original_batch_size: The batch size the run was configured with.
        batch_size: The batch size to train with (changed only by the
            ``shrink``/``accumulate`` policies).
        accumulate_grad_batches: Gradient accumulation to train with.
        max_fitting_batch_size: Largest batch predicted to fit (0: none fits), below :attr:`usable_bytes`.
        fits: Whether the original batch fits: exactly when it is at most :attr:`max_fitting_batch_size`.
        suggestions: Ways to fit, each with its predicted saving.
        verification: How the chosen batch was checked by a direct estimate
            at that batch (:class:`~nnmem_callbacks.core.verification.Verification`),
            or ``None`` when it was not (nothing changed, or no verifier).
        margin: The fraction of the budget kept free; both :attr:`fits` and
            :attr:`max_fitting_batch_size` compare with :attr:`usable_bytes`.
    """

    policy: str
    budget_bytes: int
    predicted_bytes: int
    original_batch_size: int
    batch_size: int
    accumulate_grad_batches: int
    max_fitting_batch_size: int
    fits: bool
    suggestions: tuple[Suggestion, ...] = ()
    verification: Verification | None = None
    margin: float = 0.0

    @property
    def usable_bytes(self) -> int:
        """The budget less the margin: what a batch must fit into."""
        return int(self.budget_bytes * (1 - self.margin))

    @property
    def changed(self) -> bool:
        """Whether the plan changes the batch size or the accumulation."""
        return self.batch_size != self.original_batch_size

    @property
    def decision(self) -> str:
        """A one-line description of the decision."""
        if self.fits:
            return "fits: training unchanged"
        if self.max_fitting_batch_size == 0:
            return "does not fit even at batch size 1"
        if self.changed:
            text = f"batch size {self.original_batch_size} -> {self.batch_size}"
            if self.accumulate_grad_batches > 1:
                text += f", accumulate_grad_batches -> {self.accumulate_grad_batches}"
            return text
        return f"does not fit; largest fitting batch size is {self.max_fitting_batch_size}"


def make_plan(
    estimate: MemoryEstimate,
    budget_bytes: int,
    policy: str = "warn",
    margin: float = DEFAULT_MARGIN,
    *,
    accumulate_grad_batches: int = 1,
    alternatives: Mapping[str, MemoryEstimate] | None = None,
    include_reserve: bool = False,
    verify: bool | None = None,
    verifier: Callable[[int], MemoryEstimate] | None = None,
) -> Plan:
    """Compares an estimate with a budget and decides what to do.

    The batch size is chosen so that its predicted peak stays below
    ``budget_bytes * (1 - margin)``. A batch the plan changes to is then
    checked by a direct estimate at that batch (the estimate's
    :attr:`~nnmem_callbacks.core.estimate.MemoryEstimate.verifier`, or
    ``verifier``), stepping down until one fits
    (:func:`nnmem_callbacks.core.verification.verify_batch_size`); the plan records
    the checks in :attr:`Plan.verification`.

    Args:
        estimate: The estimate at the configured batch size.
        budget_bytes: The budget.
        policy: One of :data:`POLICIES`.
        margin: Headroom kept below the budget when choosing a batch size.
        accumulate_grad_batches: The accumulation the run is configured with.
        alternatives: Estimates of the same step under other settings, by
            suggestion kind (e.g. ``{"bf16-mixed": est_bf16}``); each becomes a
            suggestion with its measured saving.
        include_reserve: Compare device bytes (allocator reserve and context)
            instead of the tensor peak.
        verify: ``None`` (default): verify the batch the plan changes to;
            ``True``: also verify :attr:`Plan.max_fitting_batch_size` where
            the plan only reports it (``warn``, ``raise``, or a run that
            fits); ``False``: never.
        verifier: ``batch_size -> MemoryEstimate`` (default: the estimate's own).

    Returns:
        The :class:`Plan`.

    Example:
        >>> from nnmem_callbacks.core.estimate import PhaseLine
        >>> def at(n, per_sample):
        ...     return MemoryEstimate(peak_bytes=1_000 + per_sample * n, breakdown={"parameters": 1_000},
        ...                           batch_size=n, phases=(PhaseLine("step", 1_000, per_sample),))
        >>> lines_say_100 = at(64, 100)
        >>> plan = make_plan(lines_say_100, 5_000, "shrink", margin=0.0, verifier=lambda n: at(n, 125))
        >>> plan.batch_size, plan.verification.predicted_batch_size, plan.verification.verified
        (32, 40, True)
    """
    check_policy(policy)
    check_margin(margin)
    # where the runtime varies from run to run, an unlucky run must fit too (MemoryEstimate.upper_bytes_at)
    measure = estimate.device_bytes_at if include_reserve else estimate.upper_bytes_at
    predicted = measure(estimate.batch_size)
    # one rule: a batch fits exactly when it is at most the largest batch that fits, both below the budget less
    # the margin
    usable = int(budget_bytes * (1 - margin))
    max_fit = estimate.max_batch_size(usable, include_reserve=include_reserve, verify=False)
    original = estimate.batch_size

    def choose(largest: int) -> int:
        """The batch the policy trains with when ``largest`` is the largest that fits."""
        if policy == "accumulate":  # as the suggestion: the effective batch exactly where a divisor fits
            return accumulation_split(original, largest)[0]
        return min(largest, original)

    changes = original > max_fit >= 1 and policy in ("shrink", "accumulate")
    batch_size, accumulate = original, accumulate_grad_batches
    verification = None
    verifier = verifier or estimate.verifier
    accumulating = getattr(verifier, "accumulating", None)
    if policy == "accumulate" and changes and accumulating is not None:
        # check each batch at the accumulation it would train with: accumulated gradients stay live through
        # the next micro-batch, which the estimate at the configured accumulation does not hold
        plain = verifier

        def verifier(batch: int) -> Any:
            direct = accumulating(accumulate_grad_batches * math.ceil(original / batch))
            return direct(batch) if direct is not None else plain(batch)

    lines: Any = estimate
    if policy == "accumulate" and changes and accumulating is not None:
        lines = _AccumulatingLines(estimate)  # the lines of the step the direct checks estimate
    if verifier is not None and max_fit >= 1 and (changes if verify is None else verify):
        verification = verify_batch_size(
            lines,
            usable,
            verifier=verifier,
            candidate=max_fit,
            include_reserve=include_reserve,
            choose=choose if changes else None,
        )
        if verification.stepped_down:
            max_fit = verification.batch_size
    if changes and max_fit >= 1:
        batch_size = verification.batch_size if verification is not None else choose(max_fit)
        if policy == "accumulate":
            accumulate = accumulate_grad_batches * math.ceil(original / batch_size)
    fits = original <= max_fit
    suggestions = suggest(estimate, budget_bytes, max_fit, alternatives or {}, include_reserve=include_reserve)
    return Plan(
        policy=policy,
        budget_bytes=int(budget_bytes),
        predicted_bytes=int(predicted),
        original_batch_size=original,
        batch_size=batch_size,
        accumulate_grad_batches=accumulate,
        max_fitting_batch_size=max_fit,
        fits=fits,
        suggestions=tuple(suggestions),
        verification=verification,
        margin=float(margin),
    )


class _AccumulatingLines:
    """An estimate's lines with the gradients accumulated through the next micro-batch added
    (:func:`accumulated_gradient_bytes`): what the lines predict for a step with more accumulation.

    Example:
        >>> from nnmem_callbacks.core.estimate import PhaseLine
        >>> lines = (PhaseLine("step2/forward", 100, 10), PhaseLine("step2/optimizer", 130, 0))
        >>> est = MemoryEstimate(peak_bytes=140, breakdown={}, batch_size=1, phases=lines,
        ...                      peak_phase="step2/optimizer", phase_breakdowns={"step2/optimizer": {"gradients": 30}})
        >>> est.upper_bytes_at(4), _AccumulatingLines(est).upper_bytes_at(4)  # forward 140 + gradients 30
        (140, 170)
    """

    def __init__(self, estimate: MemoryEstimate) -> None:
        self._estimate, self.method = estimate, estimate.method

    def upper_bytes_at(self, batch_size: int) -> int:
        return self._estimate.upper_bytes_at(batch_size) + accumulated_gradient_bytes(self._estimate, batch_size)

    def device_bytes_at(self, batch_size: int) -> int:
        return self._estimate.device_bytes_at(batch_size) + accumulated_gradient_bytes(self._estimate, batch_size)


def checkpointing_saving(estimate: MemoryEstimate, num_blocks: int | None = None) -> int:
    """Predicted saving of activation checkpointing per block.

    With ``L`` equally sized blocks checkpointed, only the block inputs stay
    alive during forward, and one block's activations are recomputed at a time
    in backward: the saved activations fall from ``A`` to about ``2 * A / L``
    (block boundaries plus one recomputed block). Without a block count,
    ``L = 8`` is assumed, which is conservative for most deep networks.
    """
    activations = estimate.breakdown[str(Category.ACTIVATIONS)]
    blocks = max(num_blocks or 8, 2)
    return max(0, int(activations - 2 * activations / blocks))


def accumulated_gradient_bytes(estimate: MemoryEstimate, batch_size: int) -> int:
    """What accumulating gradients adds to the peak at ``batch_size``: from the second micro-batch on, forward and
    backward run beside the gradients of the first.

    An estimate traced with accumulation (its phases include the second micro-batch, ``.../forward.2``) has them
    already: 0. Otherwise the largest forward or backward line plus all gradients, less the peak of the lines
    (an upper bound: in backward some of the gradients are already counted).

    Example:
        >>> from nnmem_callbacks.core.estimate import PhaseLine
        >>> lines = (PhaseLine("step2/forward", 100, 10), PhaseLine("step2/optimizer", 130, 0))
        >>> est = MemoryEstimate(peak_bytes=140, breakdown={}, batch_size=4, phases=lines, peak_phase="step2/forward",
        ...                      phase_breakdowns={"step2/optimizer": {"gradients": 30}})
        >>> accumulated_gradient_bytes(est, 4)  # forward 140 + gradients 30, against a peak of 140
        30
    """
    if any(".2" in line.phase for line in estimate.phases):
        return 0
    gradients = max((dict(b).get(str(Category.GRADIENTS), 0) for b in estimate.phase_breakdowns.values()), default=0)
    running = [line.at(batch_size) for line in estimate.phases if "forward" in line.phase or "backward" in line.phase]
    if not gradients or not running:
        return 0
    return max(0, max(running) + gradients - max(line.at(batch_size) for line in estimate.phases))


def accumulation_split(batch_size: int, largest: int) -> tuple[int, int]:
    """``(batch, accumulation)`` for a run of ``batch_size`` whose largest fitting batch is ``largest``.

    The split that keeps the effective batch exactly (the largest divisor of ``batch_size`` that fits) when it
    needs at most twice the fewest steps; otherwise the fewest steps, whose effective batch is a little larger.

    Example:
        >>> accumulation_split(64, 30), accumulation_split(8, 3), accumulation_split(61, 30)
        ((16, 4), (2, 4), (21, 3))
    """
    fewest = math.ceil(batch_size / largest)
    divisor = max(d for d in range(1, min(largest, batch_size) + 1) if batch_size % d == 0)
    if batch_size // divisor <= 2 * fewest:
        return divisor, batch_size // divisor
    return max(1, math.ceil(batch_size / fewest)), fewest


def effective_batch_words(batch_size: int, accumulate: int, original: int) -> str:
    """What an accumulation split (:func:`accumulation_split`) does to the effective batch, in words.

    Example:
        >>> effective_batch_words(16, 4, 64), effective_batch_words(21, 3, 61)
        ('keeps the effective batch of 64', 'makes the effective batch 63 (was 61)')
    """
    effective = batch_size * accumulate
    if effective == original:
        return f"keeps the effective batch of {effective}"
    return f"makes the effective batch {effective} (was {original})"


def suggest(
    estimate: MemoryEstimate,
    budget_bytes: int,
    max_fitting_batch_size: int,
    alternatives: Mapping[str, MemoryEstimate],
    *,
    include_reserve: bool = False,
) -> list[Suggestion]:
    """Concrete ways to reduce the peak, each with its predicted saving."""
    measure = estimate.device_bytes_at if include_reserve else estimate.upper_bytes_at
    current = measure(estimate.batch_size)
    suggestions: list[Suggestion] = []
    if 1 <= max_fitting_batch_size < estimate.batch_size:
        smaller, factor = accumulation_split(estimate.batch_size, max_fitting_batch_size)
        saving = current - measure(smaller) - accumulated_gradient_bytes(estimate, smaller)
        if saving > 0:
            keeps = effective_batch_words(smaller, factor, estimate.batch_size)
            suggestions.append(
                Suggestion(
                    "accumulate",
                    saving,
                    f"batch size {smaller} with gradient accumulation x{factor} {keeps} and saves "
                    f"{format_bytes(saving)}",
                )
            )
    activations = estimate.breakdown[str(Category.ACTIVATIONS)]
    # not to a step that already checkpoints (an estimator says so in ``extra["activation_checkpointing"]``)
    if activations >= 0.3 * estimate.peak_bytes and not estimate.extra.get("activation_checkpointing"):
        saving = checkpointing_saving(estimate)
        suggestions.append(
            Suggestion(
                "checkpointing",
                saving,
                f"activations are {format_bytes(activations)} ({activations / max(estimate.peak_bytes, 1):.0%} "
                f"of the peak); activation checkpointing of the repeated blocks saves about "
                f"{format_bytes(saving)}",
            )
        )
    for kind, other in alternatives.items():
        saving = current - (other.device_bytes if include_reserve else other.peak_bytes)
        if saving > 0:
            suggestions.append(
                Suggestion(
                    kind,
                    saving,
                    f"precision {kind!r} predicts a peak of {format_bytes(other.peak_bytes)}, saving {format_bytes(saving)}",
                )
            )
    return suggestions


def _predicted_figure(plan: Plan, estimate: MemoryEstimate) -> str:
    """The figure the budget was checked against, labelled so that it agrees with the breakdown's ``peak`` row.

    A plan compares the budget with the tensor peak, with an upper bound above it (run-to-run variation), or with
    what the device shows (allocator reserve and runtime overhead on top); only the first is the breakdown's peak.

    Example:
        >>> from nnmem_callbacks.core.estimate import PhaseLine
        >>> est = MemoryEstimate(peak_bytes=2048, breakdown={"parameters": 2048}, batch_size=8,
        ...                      variability=PhaseLine("scheduling", 1024, 0))
        >>> _predicted_figure(make_plan(est, 1000, margin=0.0), est)
        'Predicted peak: estimate 2.00 KiB, upper bound 3.00 KiB (+1.00 KiB for scheduling; the budget is checked \
against the upper bound)'
        >>> est = MemoryEstimate(peak_bytes=2048, breakdown={"parameters": 2048}, batch_size=8, reserved_bytes=4096,
        ...                      overhead_bytes=1024)
        >>> _predicted_figure(make_plan(est, 1000, margin=0.0, include_reserve=True), est)
        'Predicted device use 5.00 KiB (tensor peak 2.00 KiB, allocator reserve 4.00 KiB, runtime overhead 1.00 KiB; \
the budget is checked against device use)'
    """
    predicted, batch = plan.predicted_bytes, plan.original_batch_size
    if batch != estimate.batch_size or predicted == estimate.peak_bytes:
        return f"Predicted peak {format_bytes(predicted)}"
    peak = format_bytes(estimate.peak_bytes)
    if estimate.reserved_bytes is not None and predicted == estimate.device_bytes_at(batch):
        return (
            f"Predicted device use {format_bytes(predicted)} (tensor peak {peak}, allocator reserve "
            f"{format_bytes(estimate.reserved_bytes_at(batch))}, runtime overhead {format_bytes(estimate.overhead_bytes)}; "
            "the budget is checked against device use)"
        )
    extra = predicted - estimate.peak_bytes
    if predicted == estimate.upper_bytes_at(batch) and extra > 0:
        cause = getattr(estimate.variability, "phase", None) or "run-to-run variation"
        return (
            f"Predicted peak: estimate {peak}, upper bound {format_bytes(predicted)} (+{format_bytes(extra)} for {cause}; "
            "the budget is checked against the upper bound)"
        )
    return f"Predicted peak {format_bytes(predicted)} (the estimate's tensor peak: {peak})"


def describe_plan(plan: Plan, estimate: MemoryEstimate, suggestions: Sequence[Suggestion] | None = None) -> str:
    """A multi-line human description of a plan (for warnings and errors)."""
    from nnmem_callbacks.core.formatting import format_breakdown

    kept = f" ({format_bytes(plan.usable_bytes)} usable, keeping {plan.margin:.0%} free)" if plan.margin else ""
    lines = [
        f"{_predicted_figure(plan, estimate)} at batch size {plan.original_batch_size} "
        f"vs budget {format_bytes(plan.budget_bytes)}{kept}: {plan.decision}.",
        format_breakdown(estimate),
    ]
    if plan.max_fitting_batch_size:
        lines.append(f"Largest batch size that fits: {plan.max_fitting_batch_size}.")
    if plan.verification is not None:
        at = f" at accumulate_grad_batches {plan.accumulate_grad_batches}" if plan.accumulate_grad_batches > 1 else ""
        lines.append(f"Checked{at}: {plan.verification.text}.")
    for suggestion in suggestions if suggestions is not None else plan.suggestions:
        lines.append(f"- {suggestion.text}")
    return "\n".join(lines)
