"""The Lightning ``MemoryBudgetCallback``, written once for both Lightning namespaces: the hooks and their state.

Lightning ships as ``pytorch_lightning`` and as ``lightning.pytorch``, and a
Trainer of one rejects callbacks built on the other. This module holds the
implementation as a mixin, :class:`MemoryBudgetCallbackMixin`, that reaches
Lightning only through a :class:`~nnmem_callbacks.adapters.lightning.namespace.Namespace`
(the root package and the few utilities used). The public modules define the
real classes:

* ``nnmem_callbacks.lightning`` - ``class MemoryBudgetCallback(Mixin, pytorch_lightning.Callback)``
* ``nnmem_callbacks.lightning_pytorch`` - the same on ``lightning.pytorch.Callback``

The hooks are annotated with ``pytorch_lightning`` classes; the same classes
serve ``lightning.pytorch``. Only the hooks and
:mod:`~nnmem_callbacks.adapters.lightning.trainer_io` touch the Trainer: the
hooks read its facts once, hand data to modules that return decisions, and
apply them.

* :mod:`~nnmem_callbacks.adapters.lightning.estimation`: the module, one batch
  and the facts -> an estimate, or why there is none;
* :mod:`~nnmem_callbacks.adapters.lightning.planning`: the budget on the
  training device and the plan (the callback asks whether ``bf16-mixed`` is
  worth offering, estimates at that precision and plans again);
* :mod:`~nnmem_callbacks.adapters.lightning.ranks`: what this rank sends, and
  the plan agreed from what came back (the hook reduces over the ranks);
* :mod:`~nnmem_callbacks.adapters.lightning.actions`: the decision (keep, warn,
  raise, or change the batch size and accumulation) that the hook applies;
* :mod:`~nnmem_callbacks.adapters.lightning.summary`: the fit-start summary,
  which the hook logs and writes, with the breakdown, to each
  ``TensorBoardLogger`` (:func:`~nnmem_callbacks.monitoring.tensorboard.write_fit_start`);
* shared with the Keras callback: :mod:`~nnmem_callbacks.adapters.common` (the
  guarded call, warn-once, the prediction to compare) and the
  :mod:`~nnmem_callbacks.monitoring` modules (meters, per-phase peaks, each
  epoch's comparison, out-of-memory diagnosis, TensorBoard).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from typing import TYPE_CHECKING, Any

from nnmem_callbacks.adapters.common import Guard, compared_prediction, predicted_peak
from nnmem_callbacks.adapters.lightning import actions, estimation, planning, ranks, trainer_io
from nnmem_callbacks.adapters.lightning import summary as report
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.plan import (
    POLICIES,
    MemoryBudgetExceeded,
    Plan,
    check_budget,
    check_margin,
    check_policy,
    describe_plan,
)
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.hardware import devices
from nnmem_callbacks.monitoring import epoch_comparison as epoch_report
from nnmem_callbacks.monitoring import meters as monitor
from nnmem_callbacks.monitoring import oom
from nnmem_callbacks.monitoring.phase_tracking import PhaseTracker
from nnmem_callbacks.monitoring.step_sampling import SampledStep, step_tensors
from nnmem_callbacks.monitoring.tensorboard import write_fit_start
from nnmem_callbacks.probes.runner import live_tensor_bytes
from nnmem_callbacks.probes.session import ProbeSettings, check_probe_kernels

if TYPE_CHECKING:  # the same classes serve lightning.pytorch
    import pytorch_lightning as pl

    from nnmem_callbacks.adapters.lightning.namespace import Namespace
    from nnmem_callbacks.adapters.lightning.strategy import StrategyReading
    from nnmem_callbacks.adapters.lightning.trainer_io import TrainBatch, TrainerFacts

__all__ = ["log", "MemoryBudgetCallbackMixin"]

log = logging.getLogger(__name__)

#: The closing sentence of the miss warning: what usually allocates beyond the estimate in Lightning.
_MISS_CAUSES = (
    "Memory allocated outside training_step (hooks, callbacks, data on the device) or ops the estimator does not "
    "model are the usual causes."
)


class MemoryBudgetCallbackMixin:
    """Predicts the peak memory of training at fit start, acts on it, and checks it every epoch.

    Add it to the Trainer; before the first step it estimates the peak memory
    of the module's own ``training_step`` (with the configured optimizers,
    precision, gradient accumulation and clipping, on fake tensors: nothing of
    the real run changes), compares it with the budget and applies the policy.
    Every epoch it measures the real peak and logs predicted and measured
    values to every logger under ``memory/...``.

    Use ``from nnmem_callbacks.lightning import MemoryBudgetCallback`` with
    ``pytorch_lightning`` and ``from nnmem_callbacks.lightning_pytorch import
    MemoryBudgetCallback`` with ``lightning.pytorch`` (``import lightning``).

    Args:
        budget: ``None``: the device's free memory minus ``margin``; an ``int``
            of bytes; a ``float`` in (0, 1]: a fraction of the device capacity;
            a string such as ``"10GiB"``.
        policy: What to do when the predicted peak exceeds the budget:

            - ``"warn"``: one warning with the breakdown, the largest batch that
              fits and suggestions with their predicted savings.
            - ``"raise"``: :class:`~nnmem_callbacks.MemoryBudgetExceeded` before
              the first step, with the same content.
            - ``"shrink"``: set the largest fitting batch size wherever Lightning
              keeps it (model, ``hparams``, datamodule, datamodule ``hparams``)
              and rebuild the dataloaders.
            - ``"accumulate"``: shrink, then raise
              ``trainer.accumulate_grad_batches`` so that the effective batch is
              at least the original one.

            When the batch size cannot be changed (dataloaders passed straight
            to ``fit``, no ``batch_size_attr``), ``shrink`` and ``accumulate``
            say why and fall back to ``warn``, suggesting the batch to set.
            After a change, the prediction logged every epoch is a direct
            estimate at the batch and accumulation trained with.
        margin: Headroom kept below the budget when choosing a batch size
            (and, with ``budget=None``, below the free memory).
        batch_size_attr: Name of the attribute holding the per-device batch
            size that ``train_dataloader`` uses.
        seq_len_attr: Name of the attribute holding the sequence length the
            loaders pad or cut to (``max_length``...). The estimate then gets a
            sequence axis (the batch's ``(batch, length)`` token ids), the
            warning gives the longest length that fits at the batch, and
            ``shrink`` shortens the sequence (keeping the batch) instead of
            shrinking the batch.
        probe_kernels: Passed to the estimator: ``True`` measures the CPU
            kernels' workspaces (cached per machine; the first fit start on a
            new machine pays for the probes), ``False`` uses the rules'
            formulas only (faster, less exact), a
            :class:`~nnmem_callbacks.probes.session.ProbeSettings` sets the
            run budget, time limit and memory cap.

    Raises:
        ValueError: For an unknown policy, a negative margin, an invalid
            budget or ``probe_kernels`` (the message lists the valid values).

    Attributes:
        estimate: The :class:`~nnmem_callbacks.MemoryEstimate` made at fit start
            (``None`` when estimation failed).
        plan: The :class:`~nnmem_callbacks.Plan` decided at fit start.
        measurements: One dict per finished epoch with the measured and
            predicted figures (bytes).
        summary: The fit-start summary line the callback logged (the
            prediction, the budget, the policy, the decision, the batch size
            and accumulation trained with, or the sequence length ``shrink``
            set); ``None`` without an estimate.

    Example:
        >>> from nnmem_callbacks.lightning import MemoryBudgetCallback
        >>> callback = MemoryBudgetCallback(budget="2GiB", policy="shrink")
        >>> callback.policy, callback.budget
        ('shrink', '2GiB')
        >>> MemoryBudgetCallback(policy="explode")
        Traceback (most recent call last):
        ...
        ValueError: unknown policy 'explode'; valid policies are 'warn', 'raise', 'shrink', 'accumulate'
    """

    #: The policies accepted by ``policy``.
    POLICIES = POLICIES
    _ns: Namespace  # set by the concrete class

    def __init__(
        self,
        budget: int | float | str | None = None,
        policy: str = "warn",
        margin: float = 0.05,
        batch_size_attr: str = "batch_size",
        seq_len_attr: str | None = None,
        probe_kernels: bool | ProbeSettings = True,
    ) -> None:
        if not isinstance(policy, str) or policy not in self.POLICIES:
            check_policy(policy)  # raises with the list of valid policies
        self.budget = check_budget(budget)
        self.policy = policy
        self.margin = check_margin(margin)
        if not isinstance(batch_size_attr, str) or not batch_size_attr:
            raise ValueError(f"batch_size_attr must be a non-empty attribute name, got {batch_size_attr!r}")
        self.batch_size_attr = batch_size_attr
        if seq_len_attr is not None and (not isinstance(seq_len_attr, str) or not seq_len_attr):
            raise ValueError(f"seq_len_attr must be None or a non-empty attribute name, got {seq_len_attr!r}")
        self.seq_len_attr = seq_len_attr
        self.probe_kernels = check_probe_kernels(probe_kernels)
        self._restored: dict[str, Any] | None = None
        self._strategy_reading: StrategyReading | None = None
        # the estimate made in setup under a sharding strategy (before it wraps the model), its reason and batch
        self._early: tuple[MemoryEstimate | None, str | None, TrainBatch] | None = None
        self._reset_run_state()

    # ------------------------------------------------------------------ state
    def _reset_run_state(self) -> None:
        self.estimate: MemoryEstimate | None = None
        self.plan: Plan | None = None
        self.measurements: list[dict[str, Any]] = []
        self.failure: str | None = None
        self.summary: str | None = None
        self.last_diagnosis: str | None = None
        self._guard = Guard(self._ns.user_warn, log)  # warnings name the user's line
        self._applied = False
        self._original_accumulate = 1
        self._train_batch_size: int | None = None
        self._baseline_rss: int | None = None
        self._resident_bytes = 0
        self._phases = PhaseTracker(guard=self._guard.safe)
        self._sampled = SampledStep()
        self._batch_started: float | None = None
        self._step_seconds: list[float] = []
        self._miss_warned = False
        self._fit_started = False
        self._device_kind = "cpu"
        self._seq_len: tuple[int, int] | None = None  # (configured, trained with) when shrink shortened the sequence
        self._seq_change: tuple[str, int, int, int] | None = None  # for the summary: attr, before, after, peak
        self._changed_run: MemoryEstimate | None = None  # the direct estimate of the run after a change
        self._traced_accumulate = 1  # the accumulation the estimate was traced with

    def state_dict(self) -> dict[str, Any]:
        """The decisions taken at fit start, as plain values (saved in checkpoints)."""
        plan = self.plan
        return {
            "policy": self.policy,
            "applied": bool(self._applied),
            "original_batch_size": plan.original_batch_size if plan else None,
            "batch_size": self._train_batch_size,
            "original_accumulate_grad_batches": int(self._original_accumulate),
            "accumulate_grad_batches": plan.accumulate_grad_batches if (plan and self._applied) else None,
            "predicted_peak_bytes": predicted_peak(self._run_estimate, self._train_batch_size),
            "budget_bytes": plan.budget_bytes if plan else None,
            "decision": plan.decision if plan else (self.failure or ""),
            "seq_len": list(self._seq_len) if self._seq_len else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the decisions, so that a resumed run trains with the same batch and accumulation."""
        self._restored = dict(state_dict)
        if self._fit_started and self._restored.get("applied"):
            # strategies that restore checkpoints after setup call this after on_fit_start
            trainer = getattr(self, "_trainer", None)
            if trainer is not None:
                # (the sequence length is set again; the estimate stays at the fit-start length)
                self._restore_sequence(trainer, trainer.lightning_module)
                self._apply_restored(trainer, trainer.lightning_module)
                self._estimate_changed_run(trainer)

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Reads the strategy; a sharding strategy is estimated here, before it wraps the model."""
        if stage != "fit":
            return
        reading = self._read_strategy(trainer)
        self._early = None
        if reading is not None and reading.strategy is not None and reading.strategy.sharded:
            self._early = self._estimate(trainer, pl_module, self._read_facts(trainer, pl_module, reading))
        self._strategy_reading = reading

    @estimation.sharing_traced_ops()  # the estimate, its bf16 offer and a planned batch's check share their op memo
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Estimates, plans, agrees with the other ranks, acts on the plan and reports it."""
        restored, reading, early = self._restored, self._strategy_reading, self._early
        self._early = None
        self._reset_run_state()
        self._restored = restored
        self._strategy_reading = reading = reading if reading is not None else self._read_strategy(trainer)
        self._fit_started, self._trainer = True, trainer
        facts = self._read_facts(trainer, pl_module, reading)
        self._device_kind = facts.device_kind
        self._original_accumulate = self._traced_accumulate = facts.accumulate_grad_batches
        if reading is not None and reading.strategy is None:
            self._stand_aside(
                f"the strategy is not modelled: {reading.reason}",
                f"MemoryBudgetCallback does not act under {reading.name}: {reading.reason}. "
                "It measures only; the budget is not enforced.",
            )
            return

        if self._restore_sequence(trainer, pl_module):  # estimated at the checkpoint's length, not the configured one
            early = None
        estimate, reason, batch = early if early is not None else self._estimate(trainer, pl_module, facts)
        self._resident_bytes = estimation.model_resident_bytes(pl_module, facts.device_kind)
        if facts.device_kind == "cpu":
            self._baseline_rss = self._guard.safe(devices.current_rss, "reading the process RSS at fit start")
        plan: Plan | None = None
        if estimate is not None:
            try:
                plan = self._plan(pl_module, estimate, batch, facts)
            except Exception as error:  # noqa: BLE001 - never harm the run
                reason, estimate = f"planning failed: {type(error).__name__}: {error}", None
        plan = self._agree_with_other_ranks(trainer, plan, facts)
        if plan is None or estimate is None:
            failure = reason or "another rank could not estimate the training memory"
            self._stand_aside(
                failure,
                "MemoryBudgetCallback could not estimate the training memory, so training goes on unchanged: "
                f"{failure}",
            )
            self._info("MemoryBudgetCallback: no prediction (estimation failed); measuring only.")
            return
        self.estimate, self.plan = estimate, plan
        self._train_batch_size = estimate.batch_size
        self._guard.notes(estimate)
        if reading is not None and reading.strategy is not None and reading.reason:
            self._guard.warn(f"MemoryBudgetCallback: per rank of {reading.strategy.describe()}: {reading.reason}.")

        if self._restored is not None and self._restored.get("applied"):
            self._apply_restored(trainer, pl_module)
        elif self.seq_len_attr is not None and not plan.fits and self._shorten(trainer, pl_module, facts):
            pass  # the sequence was shortened and the run estimated and planned again at that length
        else:
            decision = actions.decide(
                plan, estimate, facts.batch_size, policy=self.policy, batch_size_attr=self.batch_size_attr
            )
            if decision.message and self.seq_len_attr is not None:
                line = planning.longest_sequence_line(estimate, plan, self._device_kind, str(self.seq_len_attr))
                decision = dataclasses.replace(decision, message=decision.message + line)
            self._apply(trainer, pl_module, decision)
        self._restored = None
        self._estimate_changed_run(trainer)
        self.summary = summary = self._summary()
        self._info(summary)
        if facts.is_global_zero:
            self._write_tensorboard(trainer, summary)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._phases.start_epoch(monitor.torch_meter(trainer.strategy.root_device))
        self._step_seconds = []
        if self._device_kind == "cpu" and self.estimate is not None:
            self._sampled.arm(first_epoch=not self.measurements)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._phases.enter("forward")
        if self._device_kind == "cpu" and self.estimate is not None:
            self._guard.safe(
                lambda: self._sampled.begin(
                    lambda: live_tensor_bytes(step_tensors(pl_module, trainer.optimizers or (), batch)),
                    trainer.accumulate_grad_batches,
                ),
                "starting to sample the step's tensor peak",
            )
            if self._sampled.unavailable is not None and not self._sampled.said:
                self._sampled.said = True
                self._guard.warn(
                    f"MemoryBudgetCallback cannot sample the step's tensor peak: {self._sampled.unavailable}. "
                    "It compares the rise of the process RSS only, which holds allocator caches and freed memory "
                    "kept resident: a rough figure."
                )
        self._batch_started = time.perf_counter()

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        self._phases.enter("backward")

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._phases.enter("after backward")

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        self._phases.enter("optimizer")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._phases.end_batch()
        sampling = self._sampled.recording
        if self._batch_started is not None and not sampling:
            self._step_seconds.append(time.perf_counter() - self._batch_started)
        if sampling:
            self._guard.safe(self._sampled.batch_done, "sampling the step's tensor peak")

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        phases, meter = self._phases, self._phases.meter
        sampled = self._guard.safe(self._sampled.stop, "sampling the step's tensor peak")
        if meter is None:
            return
        reading = phases.finish_epoch()
        if reading is None:
            return
        size = self._train_batch_size
        cuda_predictions = reading.kind == "cuda" and self.estimate is not None and bool(size)
        comparison = epoch_report.compare_epoch(
            meter,
            reading,
            epoch=int(trainer.current_epoch),
            names=monitor.metric_names(meter).for_lightning(),
            baseline_bytes=self._baseline_rss or 0,
            measured_peak_bytes=self._largest_over_ranks(trainer, phases.peak_bytes(reading)),
            predicted_bytes=self._predicted_comparable(),
            predicted_peak_bytes=predicted_peak(self._run_estimate, size),
            budget_bytes=self.plan.budget_bytes if self.plan is not None else None,
            phase_peaks=phases.peaks,
            phase_rises=phases.rises,
            predicted_reserved_bytes=self._run_estimate.reserved_bytes_at(size) if cuda_predictions else None,
            predicted_device_bytes=self._run_estimate.device_bytes_at(size) if cuda_predictions else None,
            details=True,
        )
        if self._device_kind == "cpu" and self.estimate is not None:
            largest = self._largest_over_ranks(trainer, sampled or 0)  # every rank joins the reduction
            if largest:  # the sampled step's tensor peak (largest over the ranks), the RSS rise beside it
                comparison = epoch_report.beside_sampled_step(
                    comparison,
                    largest,
                    predicted_bytes=predicted_peak(self._run_estimate, self._train_batch_size),
                    budget_bytes=self.plan.budget_bytes if self.plan is not None else None,
                    sampled_seconds=self._sampled.seconds,
                )
                accumulate = max(int(getattr(trainer, "accumulate_grad_batches", 1) or 1), 1)
                unsampled = self._step_seconds
                comparison.row["step_seconds"] = accumulate * sum(unsampled) / len(unsampled) if unsampled else None
        self.measurements.append(comparison.row)
        metrics, step = comparison.metrics, trainer.global_step
        for logger in trainer.loggers:
            self._guard.safe(lambda logger=logger: logger.log_metrics(metrics, step=step), "logging metrics")
        # the rise of process RSS says too little to blame the estimate for (freed memory stays resident)
        if not self._miss_warned and not comparison.process_level:
            predicted_phase = self._run_estimate.peak_phase if self.estimate is not None else None
            warning = epoch_report.miss_warning(comparison, predicted_phase=predicted_phase, causes=_MISS_CAUSES)
            if warning is not None:
                self._miss_warned = True
                self._guard.warn(warning)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._guard.safe(self._sampled.stop, "stopping the sampled step's recording")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._guard.safe(self._sampled.stop, "stopping the sampled step's recording")  # never leave a profiler on
        kind = oom.is_out_of_memory(exception)
        if kind is None:
            return
        reading = self._phases.read()
        policy_advice = "Use policy='shrink' or policy='accumulate' to let the callback lower the batch size."
        self.last_diagnosis = oom.diagnose_out_of_memory(
            kind,
            phase=self._phases.phase,
            plan=self.plan,
            estimate=self.estimate,
            predicted_bytes=self._predicted_comparable(),
            batch_size=self._train_batch_size,
            failure=self.failure,
            measured_peak_bytes=reading.peak_bytes if reading is not None else None,
            phase_peaks=self._phases.peaks,
            advice=(policy_advice,) if self.policy in ("warn", "raise") else (),
            no_plan_advice=(
                "Lower the batch size, or enable gradient accumulation, activation checkpointing or bf16-mixed."
            ),
        )
        if getattr(trainer, "is_global_zero", True):
            self._ns.user_warn(self.last_diagnosis)
        else:  # the failing rank may not be rank zero: say it from here
            warnings.warn(f"[rank {trainer.global_rank}] {self.last_diagnosis}", stacklevel=2)

    # ------------------------------------------------------ reading the trainer
    def _read_strategy(self, trainer: pl.Trainer) -> StrategyReading | None:
        return self._guard.safe(lambda: trainer_io.read_strategy(trainer), "reading the strategy")

    def _read_facts(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, reading: StrategyReading | None
    ) -> TrainerFacts:
        return trainer_io.read_facts(
            trainer, pl_module, self._ns, strategy=reading, batch_size_attr=self.batch_size_attr
        )

    # ---------------------------------------------------- estimating, planning
    def _estimate(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, facts: TrainerFacts
    ) -> tuple[MemoryEstimate | None, str | None, TrainBatch]:
        """``(estimate, failure reason, the batch it was made on)``; never raises."""
        batch = trainer_io.first_train_batch(trainer, pl_module, self._ns)
        with self._ns.isolate_rng():
            estimate, reason = estimation.estimate_module(
                pl_module,
                batch,
                facts,
                sequence_dim="auto" if self.seq_len_attr is not None else None,
                probe_kernels=self.probe_kernels,
            )
        return estimate, reason, batch

    def _plan(
        self, pl_module: pl.LightningModule, estimate: MemoryEstimate, batch: TrainBatch, facts: TrainerFacts
    ) -> Plan:
        """The plan on the training device; when full precision does not fit, with ``bf16-mixed`` as an offer."""
        plan = planning.plan_on_device(
            estimate,
            device=facts.device,
            device_kind=facts.device_kind,
            resident_bytes=self._resident_bytes,
            budget=self.budget,
            margin=self.margin,
            policy=self.policy,
            accumulate_grad_batches=facts.accumulate_grad_batches,
        )
        if planning.offers_bf16(plan, facts.precision):
            with self._ns.isolate_rng():
                # the offer is read at this batch only (plan.suggest): its batch lines are not traced
                bf16, why_not = estimation.estimate_module(
                    pl_module, batch, facts, precision="bf16-mixed", batch_lines=False, probe_kernels=self.probe_kernels
                )
            if bf16 is None:
                log.debug("bf16-mixed re-estimate failed: %s", why_not)
            else:
                plan = planning.with_bf16_offer(
                    plan,
                    estimate,
                    bf16,
                    device_kind=facts.device_kind,
                    accumulate_grad_batches=facts.accumulate_grad_batches,
                )
        return planning.with_optimizer_suggestion(plan, estimate)

    def _agree_with_other_ranks(self, trainer: pl.Trainer, plan: Plan | None, facts: TrainerFacts) -> Plan | None:
        """The plan all ranks use (see :mod:`~nnmem_callbacks.adapters.lightning.ranks`); ``None`` when any failed."""
        try:
            received = trainer_io.reduce_max(trainer, ranks.what_this_rank_sends(plan))
        except Exception as error:  # noqa: BLE001 - depends on the backend
            self._guard.warn(
                f"MemoryBudgetCallback: ranks could not agree on a batch size ({error}); using this rank's plan"
            )
            return plan
        return ranks.agreed_plan(
            plan, received, policy=self.policy, accumulate_grad_batches=facts.accumulate_grad_batches
        )

    # ---------------------------------------------------------------- acting
    def _apply(self, trainer: pl.Trainer, pl_module: pl.LightningModule, decision: actions.Decision) -> None:
        if decision.action == "raise":
            raise MemoryBudgetExceeded(decision.message)
        if decision.action == "change":
            assert decision.batch_size is not None
            if decision.accumulate_grad_batches is not None:
                trainer_io.set_accumulation(trainer, decision.accumulate_grad_batches)
            self._train_batch_size = int(decision.batch_size)
            self._applied = True
            trainer_io.set_batch_size(trainer, pl_module, self._ns, self.batch_size_attr, decision.batch_size)
        elif self.plan is not None and self.plan.changed:  # shrink/accumulate fell back to a warning
            self.plan = actions.unchanged_plan(self.plan, self._original_accumulate)
        if decision.message:
            self._guard.warn(decision.message)

    def _shorten(self, trainer: pl.Trainer, pl_module: pl.LightningModule, facts: TrainerFacts) -> bool:
        """``shrink`` with ``seq_len_attr``: sets the longest sequence that fits, then estimates and plans again.

        Returns whether it did; ``False`` leaves the batch plan to act (with the reason warned when it is not
        the policy's choice).
        """
        if self.policy != "shrink":
            return False
        assert self.plan is not None and self.estimate is not None
        longest = planning.longest_sequence(self.estimate, self.plan, facts.device_kind)
        current = trainer_io.read_setting(pl_module, self._ns, self.seq_len_attr)
        blocker = planning.shorten_blocker(
            longest,
            current,
            self.estimate,
            attr=str(self.seq_len_attr),
            loaders_rebuilt=facts.batch_size.loaders_from_module,
        )
        if blocker is not None:
            self._guard.warn(f"MemoryBudgetCallback: cannot shorten the sequence: {blocker}; shrinking the batch.")
            return False
        # the plan as it stood (its batch change is not made: the sequence is shortened instead)
        before = describe_plan(actions.unchanged_plan(self.plan, self._original_accumulate), self.estimate)
        self._seq_change = (str(self.seq_len_attr), int(current), int(longest), self.plan.predicted_bytes)
        trainer_io.set_loader_setting(trainer, pl_module, self._ns, self.seq_len_attr, longest)
        self._seq_len = (int(current), int(longest))
        estimate, reason, batch = self._estimate(trainer, pl_module, facts)
        if estimate is None:
            self._guard.warn(
                f"MemoryBudgetCallback(policy='shrink') set `{self.seq_len_attr}` {current} -> {longest}, but could not "
                f"estimate the run again ({reason}); training goes on at that length."
            )
            self._applied, self._seq_change = True, None
            self.plan = actions.unchanged_plan(self.plan, self._original_accumulate)
            return True
        self.estimate, self.plan = estimate, self._plan(pl_module, estimate, batch, facts)
        if self.plan.changed:  # the batch is kept: the plan describes the run that trains
            self.plan = actions.unchanged_plan(self.plan, self._original_accumulate)
        self._train_batch_size = estimate.batch_size
        self._applied = True
        self._guard.warn(
            f"MemoryBudgetCallback(policy='shrink') changed the run: `{self.seq_len_attr}` {current} -> {longest} "
            f"(batch size {estimate.batch_size} kept). Predicted peak now "
            f"{format_bytes(predicted_peak(estimate, estimate.batch_size))}.\nAt `{self.seq_len_attr}` {current}: {before}"
        )
        return True

    def _restore_sequence(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        """Sets the sequence length a checkpoint trained with (``shrink`` shortened it); returns whether it did."""
        restored = self._restored or {}
        if self.seq_len_attr is None or not restored.get("applied") or not restored.get("seq_len"):
            return False
        trainer_io.set_loader_setting(trainer, pl_module, self._ns, self.seq_len_attr, restored["seq_len"][1])
        self._seq_len = (int(restored["seq_len"][0]), int(restored["seq_len"][1]))
        return True

    def _apply_restored(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        restored = self._restored or {}
        if restored.get("batch_size") is None:
            return
        if trainer_io.batch_size_attr_found(pl_module, self._ns, self.batch_size_attr):
            trainer_io.set_batch_size(trainer, pl_module, self._ns, self.batch_size_attr, restored["batch_size"])
            self._train_batch_size = int(restored["batch_size"])
        if restored.get("accumulate_grad_batches"):
            trainer_io.set_accumulation(trainer, restored["accumulate_grad_batches"])
        if restored.get("original_accumulate_grad_batches"):
            self._original_accumulate = int(restored["original_accumulate_grad_batches"])
        self._applied = True
        if self.plan is not None:
            self.plan = actions.restored_plan(self.plan, restored)
        self._info(
            f"MemoryBudgetCallback: resumed with the decisions from the checkpoint: batch size "
            f"{restored['batch_size']}, accumulate_grad_batches {trainer.accumulate_grad_batches}."
        )

    @property
    def _run_estimate(self) -> Any:
        """The estimate of the run as it trains: the direct estimate after a change, else the fit-start one."""
        return self._changed_run if self._changed_run is not None else self.estimate

    def _estimate_changed_run(self, trainer: pl.Trainer) -> None:
        """After the batch or accumulation changed: the direct estimate there, the figure predicted from now on."""
        estimate, size = self.estimate, self._train_batch_size
        if estimate is None or not size:
            return
        accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        with self._ns.isolate_rng():
            self._changed_run = self._guard.safe(
                lambda: estimation.estimate_changed_run(estimate, size, accumulate, self._traced_accumulate),
                "estimating the changed run directly (the prediction falls back to the fit-start lines)",
            )

    def _stand_aside(self, failure: str, warning: str) -> None:
        """Training goes on unchanged, measured only: ``failure`` says why (and ``warning`` says it once)."""
        self.failure = failure
        self._guard.warn(warning)
        self._restored = None

    # ------------------------------------------------------------- reporting
    def _predicted_comparable(self) -> int | None:
        """The prediction of what the epoch measurement compares (CUDA: allocated; CPU: the rise of process RSS)."""
        return compared_prediction(
            self._run_estimate,
            self._train_batch_size,
            process_level=self._device_kind == "cpu",
            resident_bytes=self._resident_bytes,
        )

    def _summary(self) -> str:
        assert self.plan is not None and self.estimate is not None
        rise = self._predicted_comparable() or 0
        return report.fit_start_summary(
            self.plan,
            self.estimate,
            policy=self.policy,
            applied=self._applied,
            batch_size=self._train_batch_size,
            baseline_rss=self._baseline_rss if self._device_kind == "cpu" else None,
            predicted_rss_rise=rise,
            accumulate_grad_batches=int(getattr(self._trainer, "accumulate_grad_batches", 1) or 1),
            changed_peak=predicted_peak(self._changed_run, self._train_batch_size),
            seq_change=self._seq_change,
        )

    def _write_tensorboard(self, trainer: pl.Trainer, summary: str) -> None:
        """Writes the fit-start summary, layout and figure to each ``TensorBoardLogger``; a failure is said once."""
        estimate, plan, step = self.estimate, self.plan, int(trainer.global_step)
        assert estimate is not None and plan is not None
        for logger in trainer_io.tensorboard_loggers(trainer, self._ns):

            def write(logger: Any = logger) -> None:
                write_fit_start(
                    logger.experiment,
                    estimate,
                    plan,
                    kind=self._device_kind,
                    summary=summary,
                    batch_size=self._train_batch_size,
                    step=step,
                )

            self._guard.safe(write, "writing the fit-start summary to TensorBoard")

    def _largest_over_ranks(self, trainer: pl.Trainer, value: int) -> int:
        """The largest ``value`` over the ranks (``value`` itself on one device or when the reduction fails)."""
        try:
            return trainer_io.reduce_max(trainer, [value])[0]
        except Exception:  # noqa: BLE001 - depends on the backend
            return value

    def _info(self, message: str) -> None:
        self._ns.rank_zero_info(message)
