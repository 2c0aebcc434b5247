"""``MemoryBudgetCallback`` for the Hugging Face ``Trainer``: predict at train begin, measure beside it every epoch.

The hooks read the Trainer once, hand the facts to
:mod:`~nnmem_callbacks.adapters.transformers.estimation` and
:mod:`~nnmem_callbacks.adapters.transformers.planning`, and act on what they
return; measuring and logging go through the shared
:mod:`~nnmem_callbacks.monitoring` modules, named as the Lightning callback
names them (``memory/predicted_peak_mib``, ``memory/measured_peak_mib``,
``memory/relative_error``, ...).

How the figures reach every reporter: ``TensorBoardCallback``, W&B and the
other reporters are registered before user callbacks, and each writes the
``logs`` dict in its own ``on_log``, so a value added to ``logs`` in this
callback's ``on_log`` comes too late for them. The callback therefore wraps the
Trainer's ``log`` method (on the instance, undone at train end): the memory
figures are in ``logs`` before any reporter sees them, and in
``state.log_history``. At each epoch's end it asks for a log
(``control.should_log``), or logs the figures itself when the Trainer already
logged at that step. A log before the epoch's first measurement carries the
prediction only (no NaN measured figure for the reporters to plot).

Warnings are shown at the user's ``trainer.train()`` line, not inside the
Trainer's callback handler (:mod:`~nnmem_callbacks.adapters.transformers.warning_site`).

The Trainer is not among the hook's keyword arguments; the callback finds it
on the call stack at ``on_train_begin`` (the Trainer whose callback handler
holds this callback), or is told with :meth:`MemoryBudgetCallback.bind`.

Example:
    >>> from nnmem_callbacks.transformers import MemoryBudgetCallback
    >>> callback = MemoryBudgetCallback(budget="2GiB", policy="raise")
    >>> callback.policy, callback.budget
    ('raise', '2GiB')

Known limitations:
    * The callback never changes the Trainer's batch (the dataloader is built
      before ``on_train_begin``); use
      :func:`~nnmem_callbacks.adapters.transformers.planning.plan_training_arguments`
      before building the Trainer.
    * On CPU the first two optimizer steps of each epoch run under the
      profiler (their tensor peak is the measured figure); an epoch with a
      single optimizer step after the first is not sampled.
    * Per rank: DDP, FSDP (1 and 2) and DeepSpeed ZeRO are read from accelerate's
      plugins (:mod:`~nnmem_callbacks.adapters.transformers.ranks`); every rank
      estimates the same step from the same first samples, so they agree. Under
      FSDP and DeepSpeed the estimate is made at ``on_init_end``, while the model
      is whole (a callback added after the Trainer was built estimates one
      device holding a full replica, and says so). On CPU under DDP the
      measured figure does not see the reducer's buckets, allocated before the
      sampled steps.
    * Without the Trainer (not found on the stack and not bound) the
      callback warns once and does nothing else. Finding it reads the
      callers' frames (``sys._getframe``), which CPython and PyPy offer.
    * The CUDA path (allocator peak read at each log) has not run on a GPU
      yet; the CPU path is what the tests check.
    * The measured figure on CPU counts the step's prefetched micro-batches
      at the size of the first batch (the Trainer collates them before the
      step's hook).
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

from nnmem_callbacks.adapters.common import Guard, predicted_peak
from nnmem_callbacks.adapters.transformers import estimation, planning, warning_site
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.plan import MemoryBudgetExceeded, Plan, check_budget, check_margin, describe_plan
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.hardware import devices
from nnmem_callbacks.monitoring import epoch_comparison as epoch_report
from nnmem_callbacks.monitoring import meters as monitor
from nnmem_callbacks.monitoring.step_sampling import SampledStep, TensorPeakMeter, batch_tensors, step_tensors
from nnmem_callbacks.probes.runner import live_tensor_bytes
from nnmem_callbacks.probes.session import ProbeSettings, check_probe_kernels

try:
    from transformers import TrainerCallback
except ImportError as error:  # pragma: no cover - the optional extra
    raise ImportError(
        "nnmem_callbacks.transformers needs transformers: pip install 'nnmem_callbacks[transformers]'"
    ) from error

__all__ = ["find_trainer", "log", "MemoryBudgetCallback", "POLICIES"]

log = logging.getLogger(__name__)

#: The policies the callback takes (it does not change the Trainer's batch; plan the arguments instead).
POLICIES = ("warn", "raise")


def find_trainer(callback: Any, depth: int = 12) -> Any:
    """The Trainer whose callback handler holds ``callback``, found on the call stack (``None`` when not found)."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        handler = getattr(candidate, "callback_handler", None)
        if handler is not None and any(c is callback for c in getattr(handler, "callbacks", ())):
            return candidate
        frame = frame.f_back
    return None


class MemoryBudgetCallback(TrainerCallback):
    """Predicts the peak memory of the Trainer's step before it runs, and logs measured beside predicted.

    At ``on_train_begin`` it estimates the step the Trainer will run, from the
    Trainer itself: its model (PEFT, quantized, gradient checkpointing as set),
    its arguments (per-device batch, accumulation, ``bf16``/``fp16``, ``optim``,
    ``max_grad_norm``), the first batch of its own dataset and collator, and the
    loss of its own ``compute_loss``; on fake tensors, so nothing of the run
    changes. Over the budget it warns, or raises before the first step, with
    the largest per-device batch that fits, the accumulation that keeps the
    effective batch and the savings of checkpointing, bf16 and 8-bit optimizers.

    On each log step and each epoch, the measured peak (CUDA: the allocator's
    peak; CPU: the tensor peak of a sampled optimizer step, with the rise of
    process RSS beside it) and the prediction go into the Trainer's logs.

    Args:
        budget: ``None``: the device's free memory minus ``margin``; an ``int``
            of bytes; a ``float`` in (0, 1]: a fraction of the device; a
            string such as ``"10GiB"``.
        policy: ``"warn"`` (one warning) or ``"raise"``
            (:class:`~nnmem_callbacks.MemoryBudgetExceeded` before the first step).
        margin: Headroom kept below the budget.
        probe_kernels: Passed to the estimator: ``True`` measures the CPU kernels' workspaces (cached per
            machine), ``False`` uses the rules' formulas only (faster, less exact), a
            :class:`~nnmem_callbacks.probes.session.ProbeSettings` sets the run budget, time limit and memory cap.

    Raises:
        ValueError: For an unknown policy, a negative margin, an invalid budget or ``probe_kernels``.

    Attributes:
        estimate: The estimate made at train begin (``None`` when it failed).
        plan: The plan under the budget.
        measurements: One dict per finished epoch with measured and predicted figures (bytes).
        failure: Why there is no estimate, or ``None``.
        summary: The train-begin summary line.
    """

    POLICIES = POLICIES

    def __init__(
        self,
        budget: int | float | str | None = None,
        policy: str = "warn",
        margin: float = 0.05,
        probe_kernels: bool | ProbeSettings = True,
    ) -> None:
        if not isinstance(policy, str) or policy not in POLICIES:
            raise ValueError(
                f"unknown policy {policy!r}; valid policies are {', '.join(repr(p) for p in POLICIES)} "
                "(to change the batch, use plan_training_arguments before building the Trainer)"
            )
        self.budget = check_budget(budget)
        self.policy = policy
        self.margin = check_margin(margin)
        self.probe_kernels = check_probe_kernels(probe_kernels)
        self._bound: Any = None
        self._world_zero = True
        self._reset()

    def bind(self, trainer: Any) -> MemoryBudgetCallback:
        """Tells the callback its Trainer (needed only where the stack does not show it); returns ``self``."""
        self._bound = trainer
        return self

    # ------------------------------------------------------------------ state
    def _say(self, message: str) -> None:
        """Warns, from the main process only (every rank estimates the same step), at the user's ``trainer.train()``
        line (:func:`~nnmem_callbacks.adapters.transformers.warning_site.warn`)."""
        if self._world_zero:
            warning_site.warn(message)

    def _reset(self) -> None:
        self._early: str | None = None  # the decision of an estimate made at init (sharded runs)
        self.estimate: MemoryEstimate | None = None
        self.plan: Plan | None = None
        self.measurements: list[dict[str, Any]] = []
        self.failure: str | None = None
        self.summary: str | None = None
        self._guard = Guard(self._say, log)
        self._trainer: Any = None
        self._original_log: Any = None
        self._own_log: Any = None
        self._batch_size: int | None = None
        self._accumulate = 1
        self._batch_bytes = 0
        self._device_kind = "cpu"
        self._meter: monitor.Meter | None = None
        self._baseline_rss = 0
        self._resident_bytes = 0
        self._sampled = SampledStep()
        self._epoch_metrics: dict[str, float] = {}
        self._pending: dict[str, float] | None = None
        self._last_log_step: int | None = None
        self._epoch = 0

    # ------------------------------------------------------------------ hooks
    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Under FSDP or DeepSpeed, estimates now, while the model is whole: by ``on_train_begin`` accelerate
        has sharded it in place. Acting on the plan waits for ``on_train_begin``."""
        trainer = self._bound if self._bound is not None else find_trainer(self)
        if trainer is None or not (
            getattr(trainer, "is_fsdp_enabled", False) or getattr(trainer, "is_deepspeed_enabled", False)
        ):
            return
        bound = self._bound
        self._reset()
        self._bound = bound
        self._world_zero = bool(getattr(state, "is_world_process_zero", True))
        self._trainer = trainer
        model = model if model is not None else trainer.model
        self._early = self._guard.safe(
            lambda: self._estimate_and_plan(trainer, args, model, None), "estimating the step"
        )

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Estimates the step, plans under the budget and acts (warn or raise) before the first step."""
        early, self._early = self._early, None
        if early is not None and self._trainer is not None:  # estimated at init, before the model was sharded
            trainer, decision = self._trainer, early
            if self._device_kind == "cpu":
                self._baseline_rss = self._guard.safe(devices.current_rss, "reading the process RSS") or 0
            self._guard.safe(lambda: self._wrap_log(trainer), "wrapping Trainer.log")
        else:
            bound = self._bound
            self._reset()
            self._bound = bound
            self._world_zero = bool(getattr(state, "is_world_process_zero", True))
            trainer = bound if bound is not None else find_trainer(self)
            if trainer is None:
                self._guard.warn(
                    "MemoryBudgetCallback could not find its Trainer; call `callback.bind(trainer)` before "
                    "`trainer.train()`. It neither predicts nor measures in this run."
                )
                return
            self._trainer = trainer
            model = model if model is not None else trainer.model
            self._guard.safe(lambda: self._wrap_log(trainer), "wrapping Trainer.log")
            decision = self._guard.safe(
                lambda: self._estimate_and_plan(trainer, args, model, kwargs.get("optimizer")), "estimating the step"
            )
        if decision is not None and self.policy == "raise" and self.plan is not None and not self.plan.fits:
            self._unwrap_log()
            raise MemoryBudgetExceeded(decision)
        if decision:
            self._guard.warn(decision)
        if self.summary:
            log.info(self.summary)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._trainer is None:
            return
        self._epoch_metrics = {}
        if self._meter is not None:
            self._guard.safe(self._meter.reset, "resetting the memory peak")
        if self._device_kind == "cpu" and self.estimate is not None:
            self._sampled.arm(first_epoch=not self.measurements)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self._device_kind != "cpu" or self.estimate is None or self._trainer is None:
            return
        optimizer = kwargs.get("optimizer")
        model = model if model is not None else self._trainer.model
        prefetched = self._batch_bytes * self._accumulate  # the Trainer collates the step's micro-batches first

        def live() -> int:
            return live_tensor_bytes(step_tensors(model, [estimation.unwrap_optimizer(optimizer)])) + prefetched

        self._guard.safe(lambda: self._sampled.begin(live), "starting to sample the step's tensor peak")
        if self._sampled.unavailable is not None and not self._sampled.said:
            self._sampled.said = True
            self._guard.warn(
                f"MemoryBudgetCallback cannot sample the step's tensor peak: {self._sampled.unavailable}. "
                "It compares the rise of the process RSS only, a rough figure."
            )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._sampled.recording:
            return
        self._guard.safe(self._sampled.batch_done, "sampling the step's tensor peak")
        if not self._sampled.recording:
            self._guard.safe(lambda: self._measure(state), "comparing the sampled step")

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._trainer is None or self._meter is None:
            return None
        self._guard.safe(self._sampled.stop, "sampling the step's tensor peak")
        comparison = self._guard.safe(lambda: self._measure(state), "measuring the epoch")
        if comparison is None:
            return None
        self.measurements.append(comparison.row)
        self._epoch += 1
        self._pending = dict(comparison.metrics)
        if self._last_log_step == state.global_step:  # the Trainer logs at most once per step: log it here
            self._guard.safe(lambda: self._trainer.log({}), "logging the memory figures")
        else:
            control.should_log = True
        self._warn_on_miss(comparison)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._guard.safe(self._sampled.stop, "stopping the sampled step's recording")
        self._unwrap_log()

    # ------------------------------------------------------- estimate and plan
    @estimation.sharing_traced_ops()  # the estimate and its bf16 offer share their op memo
    def _estimate_and_plan(self, trainer: Any, args: Any, model: Any, optimizer: Any) -> str:
        """Estimates and plans; returns the warning or error message ("" when the run fits)."""
        device = args.device
        self._device_kind = devices.device_type(device)
        self._meter = monitor.torch_meter(device)
        batch_size = int(getattr(trainer, "_train_batch_size", None) or args.per_device_train_batch_size)
        facts = estimation.read_facts(
            args, model, optimizer=optimizer, device=device, batch_size=batch_size, trainer=trainer
        )
        self._batch_size, self._accumulate = facts.batch_size, facts.accumulate
        for note in facts.notes:
            self._guard.warn(f"MemoryBudgetCallback: {note}.")
        if self._device_kind == "cpu":
            self._baseline_rss = self._guard.safe(devices.current_rss, "reading the process RSS") or 0
            self._resident_bytes = live_tensor_bytes(list(model.parameters()) + list(model.buffers()))
        try:
            batch = estimation.first_batch(trainer, facts.batch_size)
            self._batch_bytes = live_tensor_bytes(batch_tensors(batch), self._device_kind)
            loss_fn = estimation.trainer_loss(trainer)
            estimate = estimation.estimate_step(model, batch, facts, loss_fn, probe_kernels=self.probe_kernels)
        except Exception as error:  # noqa: BLE001 - never harm the run
            self.failure = f"{type(error).__name__}: {error}"
            log.debug("MemoryBudgetCallback: estimation failed", exc_info=True)
            self._guard.warn(
                f"MemoryBudgetCallback could not estimate the training step ({self.failure}); training goes on "
                "unchanged, measured only."
            )
            return ""
        self.estimate = estimate
        self._guard.notes(estimate)

        def plan_with(bf16: MemoryEstimate | None = None) -> Plan:
            return planning.plan_step(
                estimate,
                device=device,
                resident_bytes=self._resident_bytes,
                budget=self.budget,
                margin=self.margin,
                policy=self.policy,
                accumulate=facts.accumulate,
                bf16=bf16,
            )

        plan = plan_with()
        if not plan.fits and facts.precision == "32-true":  # offer bf16-mixed with its saving
            bf16 = self._guard.safe(
                lambda: estimation.estimate_step(
                    model,
                    batch,
                    facts,
                    loss_fn,
                    precision="bf16-mixed",
                    batch_lines=False,
                    probe_kernels=self.probe_kernels,
                ),
                "estimating at bf16",
            )
            if bf16 is not None:
                plan = plan_with(bf16)
        self.plan = plan
        predicted = estimate.peak_bytes_at(facts.batch_size)
        self.summary = (
            f"MemoryBudgetCallback: predicted peak {format_bytes(predicted)} at per-device batch {facts.batch_size} "
            f"(accumulation {facts.accumulate}, {facts.precision}) vs budget {format_bytes(plan.budget_bytes)}: "
            f"{'fits' if plan.fits else 'does not fit'}; policy {self.policy!r}."
        )
        if plan.fits:
            return ""
        advice = self._guard.safe(
            lambda: self._advice(plan, facts, model, batch, loss_fn),
            "checking the batch that fits",
        )
        head = (
            "MemoryBudgetCallback(policy='raise'): the predicted peak exceeds the budget; stopped before the first "
            "step."
            if self.policy == "raise"
            else "MemoryBudgetCallback: the predicted peak exceeds the budget."
        )
        return f"{head}\n{describe_plan(plan, estimate)}\n{advice or ''}".rstrip()

    def _advice(self, plan: Plan, facts: estimation.StepFacts, model: Any, batch: Any, loss_fn: Any) -> str:
        """The arguments that fit and keep the effective batch, checked by an estimate at their own accumulation."""
        if plan.max_fitting_batch_size < 1:
            return "No per-device batch fits; see the suggestions above."
        include_reserve = self._device_kind == "cuda" and self.estimate is not None and self.estimate.reserved_bytes
        size, accumulate, checked = planning.checked_setting(
            model, batch, facts, loss_fn, plan, include_reserve=bool(include_reserve), probe_kernels=self.probe_kernels
        )
        if checked is None:
            return "No per-device batch fits at the accumulation that keeps the effective batch."
        return (
            f"TrainingArguments that fit and keep the effective batch of {facts.batch_size * facts.accumulate}: "
            f"per_device_train_batch_size={size}, gradient_accumulation_steps={accumulate} (predicted peak "
            f"{format_bytes(checked.peak_bytes_at(size))}; nnmem_callbacks.transformers.plan_training_arguments "
            "makes this copy of the arguments)."
        )

    # ------------------------------------------------------------- measuring
    def _predicted(self) -> int | None:
        return predicted_peak(self.estimate, self._batch_size) if self._batch_size else None

    def _measure(self, state: Any) -> epoch_report.EpochComparison | None:
        """The comparison now: the allocator's peak (CUDA), or the sampled step's tensor peak with RSS beside (CPU)."""
        meter = self._meter
        if meter is None:
            return None
        reading = meter.read()
        predicted = self._predicted()
        budget = self.plan.budget_bytes if self.plan is not None else None
        epoch = self._epoch
        if self._device_kind != "cpu":
            comparison = epoch_report.compare_epoch(
                meter,
                reading,
                epoch=epoch,
                names=monitor.metric_names(meter).for_lightning(),
                predicted_bytes=predicted,
                predicted_peak_bytes=predicted,
                budget_bytes=budget,
                details=True,
            )
        else:
            rise = None if predicted is None else monitor.predicted_rss_rise(predicted, self._resident_bytes)
            comparison = epoch_report.compare_epoch(
                meter,
                reading,
                epoch=epoch,
                names=monitor.metric_names(meter).for_lightning(),
                baseline_bytes=self._baseline_rss,
                predicted_bytes=rise,
                predicted_peak_bytes=predicted,
                budget_bytes=budget,
                details=True,
            )
            sampled = self._sampled.peak_bytes
            if sampled and predicted is not None:
                comparison = epoch_report.beside_sampled_step(
                    comparison,
                    sampled,
                    predicted_bytes=predicted,
                    budget_bytes=budget,
                    sampled_seconds=self._sampled.seconds,
                )
        comparison.row["global_step"] = int(getattr(state, "global_step", 0))
        self._epoch_metrics = dict(comparison.metrics)
        return comparison

    def _warn_on_miss(self, comparison: epoch_report.EpochComparison) -> None:
        if comparison.process_level:
            return
        warning = epoch_report.miss_warning(
            comparison, predicted_phase=self.estimate.peak_phase if self.estimate is not None else None
        )
        if warning is not None:
            self._guard.warn(warning)

    # --------------------------------------------------------------- logging
    def _log_figures(self) -> dict[str, float]:
        """The figures a log gets: the epoch's pending comparison, or the latest one (CUDA: read now).

        Before the first measurement only the prediction: the measured figure and the error are left out until
        there is a measurement (never a NaN that every reporter would plot)."""
        if self._pending is not None:
            figures, self._pending = self._pending, None
            return figures
        if self._device_kind != "cpu" and self._meter is not None and self._trainer is not None:
            comparison = self._guard.safe(lambda: self._measure(self._trainer.state), "measuring the peak")
            if comparison is not None:
                return dict(comparison.metrics)
        if self._epoch_metrics:
            return dict(self._epoch_metrics)
        predicted = self._predicted()
        if predicted is None:
            return {}
        names = monitor.metric_names(TensorPeakMeter()).for_lightning()
        return {names.predicted_peak: predicted / 2**20}

    def _wrap_log(self, trainer: Any) -> None:
        """Puts the memory figures into each training log before the reporters see it (instance attribute)."""
        own = vars(trainer).get("log")
        while own is not None and getattr(own, "nnmem_callback", None) is self:  # left by a run that crashed
            own = own.nnmem_previous
        if own is None:
            vars(trainer).pop("log", None)
        else:
            trainer.log = own
        original = trainer.log
        callback = self

        def log_with_memory(logs: dict[str, float], *args: Any, **kwargs: Any) -> Any:
            if not any(str(key).startswith(("eval_", "test_")) for key in logs):
                figures = callback._guard.safe(callback._log_figures, "adding the memory figures to the logs")
                for key, value in (figures or {}).items():
                    if not (isinstance(value, float) and math.isnan(value)):  # a figure not measured: left out
                        logs.setdefault(key, value)
                callback._last_log_step = int(getattr(trainer.state, "global_step", 0))
            return original(logs, *args, **kwargs)

        log_with_memory.nnmem_callback = self  # type: ignore[attr-defined]
        log_with_memory.nnmem_previous = own  # type: ignore[attr-defined]
        self._own_log = own  # a log set on the instance before: restored at train end
        trainer.log = log_with_memory
        self._original_log = original

    def _unwrap_log(self) -> None:
        trainer, original = self._trainer, self._original_log
        if trainer is None or original is None:
            return
        if self._own_log is not None:
            trainer.log = self._own_log
        elif "log" in vars(trainer):
            del trainer.log  # the class's own method again
        self._original_log = self._own_log = None
