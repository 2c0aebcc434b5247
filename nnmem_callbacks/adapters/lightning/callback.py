"""The Lightning ``MemoryBudgetCallback``, written once for both Lightning namespaces: the hook wiring.

Lightning ships as ``pytorch_lightning`` and as ``lightning.pytorch``, and a
Trainer of one rejects callbacks built on the other. This private module holds
the implementation as a mixin, :class:`MemoryBudgetCallbackMixin`, that
reaches Lightning only through a
:class:`~nnmem_callbacks.adapters.lightning.namespace.Namespace` (the root package and
the few utilities used). The public modules define the real classes:

* ``nnmem_callbacks.lightning`` - ``class MemoryBudgetCallback(Mixin, pytorch_lightning.Callback)``
* ``nnmem_callbacks.lightning_pytorch`` - the same on ``lightning.pytorch.Callback``

Import this module only from those two. The mixin wires Lightning's hooks to
the modules that do the work:

* :mod:`~nnmem_callbacks.adapters.lightning.estimation`: one real batch, the
  ``training_step`` loss, the estimator call;
* :mod:`~nnmem_callbacks.adapters.lightning.planning`: the budget on the training
  device and the plan (with the ``bf16-mixed`` offer);
* :mod:`~nnmem_callbacks.adapters.lightning.ranks`: one plan for all ranks, the
  largest measured peak over the ranks;
* :mod:`~nnmem_callbacks.adapters.lightning.actions`: warn, raise, or change the batch
  size and accumulation and rebuild the loaders;
* :mod:`~nnmem_callbacks.adapters.lightning.summary`: the fit-start summary and its
  TensorBoard artefacts;
* shared with the Keras callback: :mod:`~nnmem_callbacks.monitoring.phase_tracking`
  (peaks per phase of the step), :mod:`~nnmem_callbacks.monitoring.epoch_comparison` (each
  epoch's measurement beside its prediction, the miss warning) and
  :mod:`~nnmem_callbacks.monitoring.meters` (meters, metric names, out-of-memory
  diagnosis).

What stays here: the state across hooks (and in checkpoints) and the hooks
themselves.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable

from nnmem_callbacks.adapters.lightning import actions
from nnmem_callbacks.adapters.lightning import estimation
from nnmem_callbacks.adapters.lightning.namespace import Namespace  # noqa: F401 - the public modules import it from here
from nnmem_callbacks.adapters.lightning import planning
from nnmem_callbacks.adapters.lightning import ranks
from nnmem_callbacks.adapters.lightning import summary as report
from nnmem_callbacks.hardware import devices
from nnmem_callbacks.monitoring import epoch_comparison as epoch_report, meters as monitor, oom
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.monitoring.phase_tracking import PhaseTracker
from nnmem_callbacks.core.plan import POLICIES, Plan, check_budget, check_margin, check_policy

__all__ = ["log", "MemoryBudgetCallbackMixin"]

log = logging.getLogger(__name__)

def _estimator() -> Callable[..., MemoryEstimate]:
    """The PyTorch estimator (a seam for tests)."""
    from nnmem_callbacks.estimators.torch.estimator import estimate_training

    return estimate_training


def _per_rank_estimator() -> Callable[..., MemoryEstimate]:
    """The per-rank PyTorch estimator for DDP, FSDP and ZeRO (a seam for tests)."""
    from nnmem_callbacks.estimators.torch.distributed import estimate_per_rank

    return estimate_per_rank


#: Takes one batch from a DataLoader (a seam for tests).
_one_batch = estimation.one_batch
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
            say why and fall back to ``warn``.
        margin: Headroom kept below the budget when choosing a batch size
            (and, with ``budget=None``, below the free memory).
        batch_size_attr: Name of the attribute holding the per-device batch
            size that ``train_dataloader`` uses.

    Raises:
        ValueError: For an unknown policy, a negative margin or an invalid
            budget (the message lists the valid values).

    Attributes:
        estimate: The :class:`~nnmem_callbacks.MemoryEstimate` made at fit start
            (``None`` when estimation failed).
        plan: The :class:`~nnmem_callbacks.Plan` decided at fit start.
        measurements: One dict per finished epoch with the measured and
            predicted figures (bytes).

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
    ) -> None:
        if not isinstance(policy, str) or policy not in self.POLICIES:
            check_policy(policy)  # raises with the list of valid policies
        self.budget = check_budget(budget)
        self.policy = policy
        self.margin = check_margin(margin)
        if not isinstance(batch_size_attr, str) or not batch_size_attr:
            raise ValueError(f"batch_size_attr must be a non-empty attribute name, got {batch_size_attr!r}")
        self.batch_size_attr = batch_size_attr
        self._restored: dict[str, Any] | None = None
        self._reset_run_state()

    # ------------------------------------------------------------------ state
    def _reset_run_state(self) -> None:
        self.estimate: MemoryEstimate | None = None
        self.plan: Plan | None = None
        self.measurements: list[dict[str, Any]] = []
        self.failure: str | None = None
        self.last_diagnosis: str | None = None
        self._warnings = self._ns.WarningCache()
        self._applied = False
        self._original_accumulate = 1
        self._train_batch_size: int | None = None
        self._baseline_rss: int | None = None
        self._resident_bytes = 0
        self._phases = PhaseTracker(guard=self._safe)
        self._miss_warned = False
        self._fit_started = False
        self._device_kind = "cpu"
        self._strategy_reading: Any = None
        self._early: tuple[MemoryEstimate | None, int | None, str | None] | None = None

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
            "predicted_peak_bytes": self._predicted_peak(),
            "budget_bytes": plan.budget_bytes if plan else None,
            "decision": plan.decision if plan else (self.failure or ""),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the decisions, so that a resumed run trains with the same batch and accumulation."""
        self._restored = dict(state_dict)
        if self._fit_started and self._restored.get("applied"):
            # strategies that restore checkpoints after setup call this after on_fit_start
            trainer = getattr(self, "_trainer", None)
            if trainer is not None:
                self._apply_restored(trainer, trainer.lightning_module)

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Reads the strategy; a sharding strategy is estimated here, before it wraps the model."""
        if stage != "fit":
            return
        reading = self._read_strategy(trainer)
        self._early = None
        if reading is not None and reading.strategy is not None and reading.strategy.sharded:
            self._strategy_reading = reading
            self._device_kind = _device_kind(trainer)
            self._early = self._estimate_from_module(trainer, pl_module)
        self._strategy_reading = reading

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        restored, reading, early = self._restored, self._strategy_reading, self._early
        self._reset_run_state()
        self._restored = restored
        self._strategy_reading = reading = reading if reading is not None else self._read_strategy(trainer)
        self._fit_started, self._trainer = True, trainer
        self._device_kind = _device_kind(trainer)
        self._original_accumulate = int(trainer.accumulate_grad_batches)
        if reading is not None and reading.strategy is None:
            self.failure = f"the strategy is not modelled: {reading.reason}"
            self._warn(
                f"MemoryBudgetCallback does not act under {reading.name}: {reading.reason}. "
                f"It measures only; the budget is not enforced."
            )
            self._restored = None
            return

        if early is not None:
            estimate, batch_size, reason = early
        else:
            estimate, batch_size, reason = self._estimate_from_module(trainer, pl_module)
        self._resident_bytes = estimation.model_resident_bytes(pl_module, self._device_kind)
        if self._device_kind == "cpu":
            self._baseline_rss = self._safe(devices.current_rss, "reading the process RSS at fit start")
        failed = estimate is None

        plan: Plan | None = None
        if estimate is not None:
            try:
                plan = self._make_plan(trainer, pl_module, estimate)
            except Exception as error:  # never harm the run
                reason = f"planning failed: {type(error).__name__}: {error}"
                failed, estimate = True, None

        plan = ranks.agree_on_plan(trainer, plan, failed, policy=self.policy, warn=self._warn)
        if plan is None or estimate is None:
            self.failure = reason or "another rank could not estimate the training memory"
            self._warn(
                f"MemoryBudgetCallback could not estimate the training memory, so training goes on unchanged: "
                f"{self.failure}"
            )
            self._info("MemoryBudgetCallback: no prediction (estimation failed); measuring only.")
            self._restored = None
            return
        self.estimate, self.plan = estimate, plan
        self._train_batch_size = batch_size
        for note in estimate.warnings:  # a measurement that went missing or was cut short is never silent
            self._warn(f"MemoryBudgetCallback: {note}")

        if self._restored is not None and self._restored.get("applied"):
            self._apply_restored(trainer, pl_module)
        elif not plan.fits:
            actions.act(
                self._ns, trainer, pl_module, plan, estimate, policy=self.policy, batch_size_attr=self.batch_size_attr,
                apply=lambda size, accumulate: self._apply(trainer, pl_module, size, accumulate), warn=self._warn,
            )
        self._restored = None
        self._info(self._summary())
        self._write_tensorboard_fit_start(trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._phases.start_epoch(monitor.torch_meter(trainer.strategy.root_device))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._phases.enter("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._phases.enter("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._phases.enter("after backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._phases.enter("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._phases.end_batch()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        phases, meter = self._phases, self._phases.meter
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
            measured_peak_bytes=ranks.reduce_max(trainer, phases.peak_bytes(reading)),
            predicted_bytes=self._predicted_comparable(),
            predicted_peak_bytes=self._predicted_peak(),
            budget_bytes=self.plan.budget_bytes if self.plan is not None else None,
            phase_peaks=phases.peaks,
            phase_rises=phases.rises,
            predicted_reserved_bytes=self.estimate.reserved_bytes_at(size) if cuda_predictions else None,
            predicted_device_bytes=self.estimate.device_bytes_at(size) if cuda_predictions else None,
            details=True,
        )
        self.measurements.append(comparison.row)
        metrics, step = comparison.metrics, trainer.global_step
        for logger in trainer.loggers:
            self._safe(lambda logger=logger: logger.log_metrics(metrics, step=step), "logging metrics")
        if not self._miss_warned:
            predicted_phase = self.estimate.peak_phase if self.estimate is not None else None
            warning = epoch_report.miss_warning(comparison, predicted_phase=predicted_phase, causes=_MISS_CAUSES)
            if warning is not None:
                self._miss_warned = True
                self._warn(warning)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
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
            self._ns.rank_zero_warn(self.last_diagnosis)
        else:  # the failing rank may not be rank zero: say it from here
            warnings.warn(f"[rank {trainer.global_rank}] {self.last_diagnosis}", stacklevel=2)

    # ---------------------------------------------------- estimating, planning
    def _estimation(self) -> estimation.ModuleEstimation:
        # the seams are read at call time, so tests can replace them on this module
        return estimation.ModuleEstimation(
            self._ns, _estimator, _per_rank_estimator, one_batch=_one_batch, strategy_reading=self._strategy_reading
        )

    def _estimate_from_module(self, trainer: Any, pl_module: Any) -> tuple[MemoryEstimate | None, int | None, str | None]:
        """Returns ``(estimate, batch size, failure reason)``; never raises."""
        return self._estimation().from_module(trainer, pl_module)

    def _budget_bytes(self, trainer: Any, pl_module: Any, estimate: MemoryEstimate) -> tuple[int, bool]:
        """``(budget bytes, include_reserve)`` for the training device."""
        return planning.budget_bytes(
            trainer, pl_module, estimate, budget=self.budget, margin=self.margin, device_kind=self._device_kind
        )

    def _make_plan(self, trainer: Any, pl_module: Any, estimate: MemoryEstimate) -> Plan:
        return planning.make_lightning_plan(
            trainer,
            estimate,
            budget=self.budget,
            budget_and_reserve=self._budget_bytes(trainer, pl_module, estimate),
            policy=self.policy,
            margin=self.margin,
            bf16_alternative=lambda: self._estimation().at_precision(trainer, pl_module, "bf16-mixed"),
        )

    # ---------------------------------------------------------------- acting
    def _apply(self, trainer: Any, pl_module: Any, batch_size: int, accumulate: int) -> None:
        if self.policy == "accumulate":
            trainer.accumulate_grad_batches = int(accumulate)
        self._train_batch_size = int(batch_size)
        self._applied = True
        actions.set_batch_size(self._ns, trainer, pl_module, self.batch_size_attr, batch_size)

    def _apply_restored(self, trainer: Any, pl_module: Any) -> None:
        restored = self._restored or {}
        if restored.get("batch_size") is None:
            return
        if actions.restore(self._ns, trainer, pl_module, restored, self.batch_size_attr):
            self._train_batch_size = int(restored["batch_size"])
        if restored.get("original_accumulate_grad_batches"):
            self._original_accumulate = int(restored["original_accumulate_grad_batches"])
        self._applied = True
        if self.plan is not None:
            self.plan = actions.restored_plan(self.plan, restored)
        self._info(
            f"MemoryBudgetCallback: resumed with the decisions from the checkpoint: batch size "
            f"{restored['batch_size']}, accumulate_grad_batches {trainer.accumulate_grad_batches}."
        )

    # ------------------------------------------------------------- reporting
    def _predicted_peak(self) -> int | None:
        if self.estimate is None:
            return None
        size = self._train_batch_size or self.estimate.batch_size
        return int(self.estimate.peak_bytes_at(size)) if size else int(self.estimate.peak_bytes)

    def _predicted_comparable(self) -> int | None:
        """The prediction of what the epoch measurement compares (CUDA: allocated; CPU: the rise of process RSS)."""
        peak = self._predicted_peak()
        if peak is None:
            return None
        if self._device_kind == "cpu":
            return monitor.predicted_rss_rise(peak, self._resident_bytes)
        return peak

    def _summary(self) -> str:
        assert self.plan is not None and self.estimate is not None
        return report.fit_start_summary(
            self.plan,
            self.estimate,
            policy=self.policy,
            applied=self._applied,
            batch_size=self._train_batch_size,
            baseline_rss=self._baseline_rss if self._device_kind == "cpu" else None,
            predicted_rss_rise=self._predicted_comparable() or 0,
        )

    def _write_tensorboard_fit_start(self, trainer: Any) -> None:
        report.write_tensorboard_fit_start(
            self._ns,
            trainer,
            summary=self._summary,
            estimate=self.estimate,
            plan=self.plan,
            device_kind=self._device_kind,
            batch_size=self._train_batch_size,
            safe=self._safe,
        )

    # --------------------------------------------------------------- helpers
    def _warn(self, message: str) -> None:
        self._warnings.warn(message)

    def _info(self, message: str) -> None:
        self._ns.rank_zero_info(message)

    def _read_strategy(self, trainer: Any) -> Any:
        from nnmem_callbacks.adapters.lightning.strategy import read_strategy

        return self._safe(lambda: read_strategy(trainer), "reading the strategy")

    def _safe(self, function: Callable[[], Any], what: str) -> Any:
        """Runs ``function``; a failure never breaks training, and is said once (never silently)."""
        try:
            return function()
        except Exception as error:  # measuring and logging must never break training
            log.debug("MemoryBudgetCallback: %s failed", what, exc_info=True)
            self._warn(f"MemoryBudgetCallback: {what} failed ({type(error).__name__}: {error}); training goes on.")
            return None


def _device_kind(trainer: Any) -> str:
    """``"cuda"`` or ``"cpu"``: the kind of the training device (what is measured and budgeted)."""
    return "cuda" if devices.device_type(trainer.strategy.root_device) == "cuda" else "cpu"
