"""Keras-specific planning: the batch size that fits before ``fit``, and advice written as Keras code.

A running ``fit`` cannot change its batch size, so the Keras callback only
warns or raises; :func:`fit_plan` is what to call *before* ``fit`` to choose the
batch size (and the optimizer's ``gradient_accumulation_steps`` that keep the
effective batch).

Example:
    >>> from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
    >>> est = MemoryEstimate(peak_bytes=9_000, breakdown={"parameters": 1_000, "activations": 8_000},
    ...                      batch_size=8, phases=(PhaseLine("step/backward", 1_000, 1_000),),
    ...                      peak_phase="step/backward")
    >>> [s.kind for s in keras_suggestions(est, budget_bytes=5_300, optimizer_name="Adam")]
    ['batch_size', 'accumulate', 'remat', 'mixed_precision']
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

from nnmem_callbacks.core.estimate import Category, MemoryEstimate
from nnmem_callbacks.core.plan import (
    DEFAULT_MARGIN,
    Plan,
    Suggestion,
    check_budget,
    check_margin,
    make_plan,
    parse_budget_text,
    planning_margin,
    resolve_budget,
)
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.core.verification import Verification

__all__ = [
    "budget_capacity",
    "describe",
    "fit_plan",
    "FitPlan",
    "keras_suggestions",
    "keras_verifier",
    "accumulated_copy",
    "optimizer_name",
    "type_name",
]


def keras_suggestions(
    estimate: MemoryEstimate,
    budget_bytes: int,
    *,
    margin: float = DEFAULT_MARGIN,
    optimizer_name: str = "Adam",
    mixed: bool = False,
    max_batch_size: int | None = None,
) -> list[Suggestion]:
    """Ways to fit ``budget_bytes``, each as Keras code with its predicted saving.

    ``max_batch_size`` is the largest batch known to fit (:func:`fit_plan` passes
    the one its plan verified); default: the estimate's prediction, unverified.
    """
    current = estimate.upper_bytes  # the peak an unlucky run may reach: what planning budgets with
    usable = int(budget_bytes * (1 - margin))
    max_fit = estimate.max_batch_size(usable, verify=False) if max_batch_size is None else max_batch_size
    suggestions: list[Suggestion] = []
    if 1 <= max_fit < estimate.batch_size:
        saving = current - estimate.upper_bytes_at(max_fit)
        suggestions.append(
            Suggestion("batch_size", saving, f"model.fit(..., batch_size={max_fit})  # saves {format_bytes(saving)}")
        )
        accumulate = _accumulate_suggestion(estimate, usable, max_fit, current, optimizer_name)
        if accumulate is not None:
            suggestions.append(accumulate)
    activations = estimate.breakdown[str(Category.ACTIVATIONS)]
    if activations >= 0.3 * max(current, 1):
        from nnmem_callbacks.core.plan import checkpointing_saving

        saving = checkpointing_saving(estimate)
        suggestions.append(
            Suggestion(
                "remat",
                saving,
                f"with keras.RematScope(mode='activations'): model = build_model()  # activations are "
                f"{format_bytes(activations)} ({activations / max(current, 1):.0%} of the peak); saves about {format_bytes(saving)}",
            )
        )
    if not mixed:
        halvable = (
            activations + estimate.breakdown[str(Category.TEMPORARIES)] + estimate.breakdown[str(Category.INPUTS)] // 2
        )
        saving = halvable // 2
        if saving > 0:
            suggestions.append(
                Suggestion(
                    "mixed_precision",
                    saving,
                    f"keras.mixed_precision.set_global_policy('mixed_bfloat16')  # before building the model; "
                    f"activations in 16 bits save about {format_bytes(saving)} (variables and optimizer state stay float32)",
                )
            )
    return suggestions


def _accumulate_suggestion(
    estimate: MemoryEstimate, usable: int, max_fit: int, current: int, optimizer_name: str
) -> Suggestion | None:
    """Gradient accumulation as Keras code, or ``None`` when no accumulated run fits ``usable``.

    Keras keeps one accumulator per trainable variable (the parameters' bytes) for the whole run, so the
    micro-batch must fit beside them; the split keeps the effective batch exactly where a divisor of it fits
    (:func:`~nnmem_callbacks.core.plan.accumulation_split`, as the other callbacks and :func:`fit_plan` choose).

    Example:
        >>> from nnmem_callbacks.core.estimate import PhaseLine
        >>> est = MemoryEstimate(peak_bytes=7_400, breakdown={"parameters": 1_000}, batch_size=64,
        ...                      phases=(PhaseLine("step", 1_000, 100),), peak_phase="step")
        >>> print(_accumulate_suggestion(est, 3_700, 23, 7_400, "Adam").text)  # doctest: +NORMALIZE_WHITESPACE
        model.compile(optimizer=keras.optimizers.Adam(..., gradient_accumulation_steps=4), ...);
        model.fit(..., batch_size=16)  # keeps the effective batch of 64; saves 3.71 KiB (after 1000 B of accumulators)
    """
    from nnmem_callbacks.core.batch_search import largest_fitting
    from nnmem_callbacks.core.plan import accumulation_split, effective_batch_words

    accumulators = estimate.breakdown[str(Category.PARAMETERS)]  # one accumulator per trainable variable
    largest = largest_fitting(lambda n: estimate.upper_bytes_at(n) + accumulators, usable, 0, max_fit + 1)
    if largest < 1:
        return None
    smaller, steps = accumulation_split(estimate.batch_size, largest)
    if steps < 2:  # Keras refuses gradient_accumulation_steps=1
        return None
    saving = current - estimate.upper_bytes_at(smaller) - accumulators
    keeps = effective_batch_words(smaller, steps, estimate.batch_size)
    return Suggestion(
        "accumulate",
        saving,
        f"model.compile(optimizer=keras.optimizers.{optimizer_name}(..., gradient_accumulation_steps={steps}), ...); "
        f"model.fit(..., batch_size={smaller})  # {keeps}; saves {format_bytes(saving)} "
        f"(after {format_bytes(accumulators)} of accumulators)",
    )


def describe(plan: Plan, estimate: MemoryEstimate, suggestions: list[Suggestion]) -> str:
    """The warning/error text: decision, breakdown, largest fitting batch and suggestions.

    Where the plan budgets with an upper bound above the estimate (the
    runtime's run-to-run variation), the first line gives both, labelled, so
    that it agrees with the breakdown's ``peak`` row (the estimate).

    Example:
        >>> from nnmem_callbacks.core.estimate import PhaseLine
        >>> from nnmem_callbacks.core.plan import make_plan
        >>> est = MemoryEstimate(peak_bytes=2048, breakdown={"parameters": 2048}, batch_size=8,
        ...                      variability=PhaseLine("scheduling", 1024, 0))
        >>> print(describe(make_plan(est, 1000, margin=0.0), est, []).splitlines()[0])
        Predicted peak: estimate 2.00 KiB, upper bound 3.00 KiB (+1.00 KiB for scheduling; the budget is checked \
against the upper bound) at batch size 8 vs budget 1000 B: does not fit even at batch size 1.
    """
    from nnmem_callbacks.core.plan import describe_plan

    return describe_plan(plan, estimate, suggestions)  # (it labels an upper bound above the estimate)


@dataclasses.dataclass(frozen=True)
class FitPlan:
    """What :func:`fit_plan` recommends.

    Attributes:
        batch_size: The per-step batch size to pass to ``fit``.
        gradient_accumulation_steps: To set on the optimizer (1: none) so that
            ``batch_size * gradient_accumulation_steps`` keeps the requested batch.
            Where no accumulated run fits (Keras keeps an accumulator per
            trainable variable), 1 with the largest plain batch that fits:
            :attr:`code` says that the effective batch changes.
        fits: Whether the requested batch size fits as it is.
        max_batch_size: The largest batch size predicted to fit (0: none).
        budget_bytes: The budget compared against.
        estimate: The estimate at the requested batch size.
        suggestions: Other ways to fit, as Keras code.
        verification: How ``batch_size`` was checked by a direct estimate at
            that batch (``None`` when the requested batch fits as it is).
    """

    batch_size: int
    gradient_accumulation_steps: int
    fits: bool
    max_batch_size: int
    budget_bytes: int
    estimate: MemoryEstimate
    suggestions: tuple[Suggestion, ...] = ()
    verification: Verification | None = None

    def __repr__(self) -> str:
        """One line (the dataclass's own repr printed the whole estimate, its phases and notes).

        Example:
            >>> estimate = MemoryEstimate(peak_bytes=3 << 20, breakdown={"parameters": 3 << 20}, batch_size=256)
            >>> FitPlan(64, 4, fits=False, max_batch_size=64, budget_bytes=4 << 20, estimate=estimate)
            FitPlan(batch_size=64, gradient_accumulation_steps=4, effective_batch=256, predicted_peak=3.00 MiB, \
budget=4.00 MiB, fits=False, max_batch_size=64)
        """
        checked = [
            c for c in (self.verification.checks if self.verification else ()) if c.batch_size == self.batch_size
        ]
        peak = checked[-1].traced_bytes if checked and checked[-1].traced_bytes else None
        peak = peak if peak is not None else self.estimate.upper_bytes_at(self.batch_size)
        return (
            f"FitPlan(batch_size={self.batch_size}, gradient_accumulation_steps={self.gradient_accumulation_steps}, "
            f"effective_batch={self.batch_size * self.gradient_accumulation_steps}, predicted_peak={format_bytes(peak)}, "
            f"budget={format_bytes(self.budget_bytes)}, fits={self.fits}, max_batch_size={self.max_batch_size})"
        )

    @property
    def code(self) -> str:
        """The lines to use the plan (a comment when no batch size fits the budget).

        Example:
            >>> from nnmem_callbacks.core.estimate import MemoryEstimate
            >>> estimate = MemoryEstimate(peak_bytes=3 << 20, breakdown={"parameters": 3 << 20}, batch_size=256)
            >>> FitPlan(256, 1, fits=False, max_batch_size=0, budget_bytes=2 << 20, estimate=estimate).code
            '# no batch size fits 2.00 MiB: batch size 1 is predicted to take up to 3.00 MiB; see plan.suggestions'
            >>> print(FitPlan(64, 4, fits=False, max_batch_size=64, budget_bytes=4 << 20, estimate=estimate).code)
            optimizer = keras.optimizers.Adam(..., gradient_accumulation_steps=4)
            model.fit(..., batch_size=64)
        """
        if self.max_batch_size < 1 and not self.fits:
            checks = [c for c in (self.verification.checks if self.verification else ()) if c.traced_bytes]
            if checks:  # the lines said a batch fits; direct estimates of the run the plan would train did not
                taken = ", ".join(f"{format_bytes(c.traced_bytes)} at batch size {c.batch_size}" for c in checks)
                return (
                    f"# no batch size fits {format_bytes(self.budget_bytes)} (less the margin, "
                    f"{format_bytes(self.verification.budget_bytes)}): direct estimates took {taken}; see "
                    f"plan.suggestions"
                )
            return (
                f"# no batch size fits {format_bytes(self.budget_bytes)}: batch size 1 is predicted to take up to "
                f"{format_bytes(self.estimate.upper_bytes_at(1))}; see plan.suggestions"
            )
        unverified = ""
        if self.verification is not None and self.verification.checks and not self.verification.verified:
            unverified = (
                f"\n# not verified at batch size {self.batch_size}: the direct estimates run were over the budget or "
                f"failed; see plan.verification"
            )
        if self.gradient_accumulation_steps > 1:
            return (
                f"optimizer = keras.optimizers.{type_name(self)}(..., gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps})\nmodel.fit(..., batch_size={self.batch_size})" + unverified
            )
        if not self.fits and self.batch_size < self.estimate.batch_size:
            return (
                f"model.fit(..., batch_size={self.batch_size})  # the effective batch becomes {self.batch_size} (was "
                f"{self.estimate.batch_size}): no accumulated run fits beside Keras' gradient accumulators" + unverified
            )
        return f"model.fit(..., batch_size={self.batch_size})" + unverified


def type_name(plan: FitPlan) -> str:
    return str(plan.estimate.extra.get("optimizer", "Adam"))


def optimizer_name(model: Any) -> str:
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", None) or optimizer
    return type(inner).__name__ if inner is not None else "Adam"


def fit_plan(
    model: Any,
    budget: int | float | str | None = None,
    batch_size: int | None = None,
    x: Any = None,
    y: Any = None,
    *,
    margin: float = DEFAULT_MARGIN,
    device: Any = "cpu",
) -> FitPlan:
    """The batch size (and gradient accumulation) that fits ``budget``; call it before ``fit``.

    Args:
        model: The compiled model.
        budget: ``None`` (free memory minus ``margin``), bytes, a fraction of
            the capacity or a string such as ``"2GiB"``.
        batch_size: The batch size you want (the effective batch to keep).
        x, y: Example arrays (see :func:`~nnmem_callbacks.keras.estimate_training`).
        margin: Headroom kept below the budget.
        device: Whose memory a ``None`` or fractional budget is taken from
            (unused for a size: bytes or ``"2GiB"``): ``"cpu"`` (host RAM),
            ``"cuda"``, ``"cuda:N"``, ``"gpu"`` or ``"gpu:N"`` (a GPU that the
            Keras backend sees here) or a GPU model of
            :func:`nnmem_callbacks.hardware.gpus.gpu_names` (``"a100-80gb"``,
            ``"cuda:a100-80gb"``, ``"H100"``: its total memory). The estimate
            itself is of the backend's own device.

    Returns:
        A :class:`FitPlan`; ``plan.code`` shows how to use it.

    Raises:
        ValueError: For an unknown ``device``, or a local GPU that the
            backend does not see (the message names the valid values).
    """
    from nnmem_callbacks.estimators.keras.estimator import estimate_training

    check_margin(margin)
    capacity, free = budget_capacity(device, budget)  # before the estimate: a bad device fails fast
    estimate = estimate_training(model, batch_size, x, y)
    budget_bytes = resolve_budget(budget, capacity_bytes=capacity, free_bytes=free, margin=margin)
    verifier = keras_verifier(model, x, y)
    plan = make_plan(
        estimate, budget_bytes, policy="accumulate", margin=planning_margin(budget, margin), verifier=verifier
    )
    if not plan.fits and plan.max_fitting_batch_size < 1 and plan.verification is not None:
        # no accumulated run fits beside Keras' accumulators (one per trainable variable): the largest plain batch
        # that fits, whose effective batch is smaller (FitPlan.code says so)
        plain = make_plan(
            estimate, budget_bytes, policy="shrink", margin=planning_margin(budget, margin), verifier=verifier
        )
        if plain.max_fitting_batch_size >= 1:
            plan = plain
    estimate = dataclasses.replace(estimate, extra={**dict(estimate.extra), "optimizer": optimizer_name(model)})
    suggestions = keras_suggestions(
        estimate,
        budget_bytes,
        margin=margin,
        optimizer_name=optimizer_name(model),
        mixed="mixed" in estimate.precision,
        max_batch_size=plan.max_fitting_batch_size,
    )
    if plan.verification is not None:  # accumulation was decided by direct estimates (plan.code): not by the lines
        suggestions = [s for s in suggestions if s.kind != "accumulate"]
    return FitPlan(
        batch_size=plan.batch_size,
        gradient_accumulation_steps=plan.accumulate_grad_batches,
        fits=plan.fits,
        max_batch_size=plan.max_fitting_batch_size,
        budget_bytes=plan.budget_bytes,
        estimate=estimate,
        suggestions=tuple(suggestions),
        verification=plan.verification,
    )


_LOCAL_GPU = re.compile(r"(cuda|gpu)(?::(\d+))?")


def budget_capacity(device: Any, budget: int | float | str | None) -> tuple[int, int]:
    """``(capacity, free)`` bytes behind a ``None`` or fractional ``budget`` on ``device`` (see :func:`fit_plan`).

    A budget that is a size needs no capacity: ``(0, 0)`` is returned after
    ``device`` is checked, and no GPU is queried.

    Raises:
        ValueError: For an unknown ``device`` or a local GPU that the Keras
            backend does not see, naming the valid values.

    Example:
        >>> budget_capacity("a100-80gb", 0.5)[0] // 2**20  # the total CUDA reports (nvidia-smi: 81,920 MiB)
        81035
        >>> budget_capacity("cuda", "1GiB")
        (0, 0)
    """
    from nnmem_callbacks.hardware import devices
    from nnmem_callbacks.hardware import gpus as gpu_table

    check_budget(budget)
    parsed = parse_budget_text(budget) if isinstance(budget, str) else budget
    absolute = isinstance(parsed, int) and not isinstance(parsed, bool)
    if device is None or isinstance(device, str):
        text = (device or "cpu").strip().lower()
    else:  # a torch.device or the like
        index = getattr(device, "index", None)
        text = str(getattr(device, "type", device)).lower() + (f":{index}" if isinstance(index, int) else "")
    local = _LOCAL_GPU.fullmatch(text)
    if text == "cpu":
        return (0, 0) if absolute else devices.cpu_capacity()
    if local is None:
        named = text.split(":", 1)[1] if text.startswith(("cuda:", "gpu:")) else text  # "cuda:a100-80gb" as in torch
        try:
            gpu = gpu_table.find_gpu(named)
        except ValueError as error:
            raise ValueError(
                f"fit_plan: device={device!r} is not a device: {error}. Valid devices: 'cpu', 'cuda', 'cuda:N', "
                f"'gpu', 'gpu:N' (a GPU here) or a GPU model ('a100-80gb' or 'cuda:a100-80gb')"
            ) from None
        # the total CUDA reports for the card (what a run can have), not nvidia-smi's larger one
        return (0, 0) if absolute else (gpu.capacity_bytes, gpu.capacity_bytes)
    if absolute:
        return 0, 0
    return _local_gpu_capacity(str(device), int(local.group(2) or 0))


def _local_gpu_capacity(device: str, index: int) -> tuple[int, int]:
    """``(total, free)`` of GPU ``index`` as the active Keras backend sees it (never another framework's)."""
    from nnmem_callbacks.estimators.keras.common import backend_name
    from nnmem_callbacks.hardware import gpus as gpu_table

    backend = backend_name()
    found: tuple[int, int] | None = None
    count = 0
    if backend == "torch":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index < count:
            from nnmem_callbacks.hardware.devices import cuda_capacity

            found = cuda_capacity(f"cuda:{index}")
    elif backend == "jax":
        import jax

        gpus = [d for d in jax.devices() if d.platform == "gpu"] if jax.default_backend() == "gpu" else []
        count = len(gpus)
        if index < count:
            stats = gpus[index].memory_stats() or {}
            limit = int(stats.get("bytes_limit", 0))
            found = (limit, limit - int(stats.get("bytes_in_use", 0))) if limit else None
    elif backend == "tensorflow":
        import tensorflow as tf

        physical = tf.config.list_physical_devices("GPU")
        count = len(physical)
        if index < count:
            details = tf.config.experimental.get_device_details(physical[index])
            total = int(details.get("memory_limit", 0) or 0)
            if not total and details.get("device_name"):
                try:  # TensorFlow does not say the card's memory: the table does, by its name
                    total = gpu_table.find_gpu(str(details["device_name"])).capacity_bytes
                except ValueError:
                    total = 0
            if total:
                used = int(tf.config.experimental.get_memory_info(f"GPU:{index}")["current"])
                found = (total, total - used)
    if found is None:
        have = "no GPU" if count == 0 else f"{count} GPU(s) (indices 0-{count - 1})"
        if index < count:
            have = f"GPU {index} but not its memory"
        raise ValueError(
            f"fit_plan: device={device!r}, but the Keras {backend} backend sees {have} here. To plan for a GPU "
            f"that is not here, name its model (device='a100-80gb'; one of {', '.join(gpu_table.gpu_names())}), "
            f"or give the budget as a size (budget='10GiB')"
        )
    return found


def keras_verifier(model: Any, x: Any = None, y: Any = None) -> Callable[[int], MemoryEstimate]:
    """``batch_size -> MemoryEstimate``: a direct estimate of ``model``'s step at that batch.

    :func:`~nnmem_callbacks.core.plan.make_plan` calls it to check the batch it
    chooses (one estimate per check, without the traces at other batch sizes).
    Its ``accumulating(steps)`` gives the verifier of the step the plan's code
    trains: a copy of the model compiled with its optimizer's
    ``gradient_accumulation_steps=steps`` (Keras then keeps an accumulator per
    trainable variable for the whole run), or ``None`` where the model cannot be
    copied (a subclassed model without ``get_config``).
    """
    from nnmem_callbacks.estimators.keras.estimator import estimate_training

    def verify(batch_size: int) -> MemoryEstimate:
        return estimate_training(model, batch_size, x, y, check_scaling=False)

    copies: dict[int, Any] = {}

    def accumulating(steps: int) -> Callable[[int], MemoryEstimate] | None:
        if steps < 2:
            return verify
        if steps not in copies:
            copies[steps] = accumulated_copy(model, steps)
        copy = copies[steps]
        if copy is None:
            return None
        return lambda batch_size: estimate_training(copy, batch_size, x, y, check_scaling=False)

    verify.accumulating = accumulating  # type: ignore[attr-defined]
    return verify


def accumulated_copy(model: Any, steps: int) -> Any:
    """A copy of ``model`` (its configuration, fresh weights) compiled as before but with the optimizer's
    ``gradient_accumulation_steps=steps``, unbuilt, as :attr:`FitPlan.code` has the user compile it;
    ``None`` when the model cannot be copied. The model itself is not changed.
    """
    import keras

    try:
        copy = keras.models.clone_model(model)
        config = keras.saving.deserialize_keras_object(model.get_compile_config())
        outer = model.optimizer
        inner = getattr(outer, "inner_optimizer", None) or outer  # a LossScaleOptimizer is made again by compile
        serialized = keras.optimizers.serialize(inner)
        serialized["config"]["gradient_accumulation_steps"] = int(steps)
        config["optimizer"] = keras.optimizers.deserialize(serialized)
        copy.compile(**config)
    except Exception:  # noqa: BLE001 - a model that does not copy: the plan checks without the accumulators
        return None
    return copy
