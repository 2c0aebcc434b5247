"""The Lightning ``MemoryBudgetCallback``, written once for both Lightning namespaces.

Lightning ships as ``pytorch_lightning`` and as ``lightning.pytorch``, and a
Trainer of one rejects callbacks built on the other. This private module holds
the whole implementation as a mixin, :class:`MemoryBudgetCallbackMixin`, that
reaches Lightning only through a :class:`Namespace` (the root package and the
few utilities used). The public modules define the real classes:

* ``nnmem_callbacks.lightning`` - ``class MemoryBudgetCallback(Mixin, pytorch_lightning.Callback)``
* ``nnmem_callbacks.lightning_pytorch`` - the same on ``lightning.pytorch.Callback``

Import this module only from those two.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import warnings
from typing import Any, Callable, Iterator, Mapping

from nnmem_callbacks import devices, monitor
from nnmem_callbacks.estimate import MemoryEstimate
from nnmem_callbacks.plan import (
    POLICIES,
    MemoryBudgetExceeded,
    Plan,
    check_budget,
    check_margin,
    check_policy,
    describe_plan,
    make_plan,
    planning_margin,
    resolve_budget,
)
from nnmem_callbacks.report import format_markdown_breakdown, format_summary
from nnmem_callbacks.units import MiB, format_bytes

log = logging.getLogger(__name__)

_INSTALL_HINT = {
    "pytorch_lightning": "pip install 'nnmem_callbacks[lightning]' (or pip install pytorch-lightning)",
    "lightning.pytorch": "pip install lightning",
}


class Namespace:
    """The Lightning package a callback class is built on, and the utilities it uses.

    Args:
        root: ``"pytorch_lightning"`` or ``"lightning.pytorch"``.

    Raises:
        ImportError: When the package is missing, with an install hint and the
            name of the module to use for the other namespace.
    """

    def __init__(self, root: str) -> None:
        try:
            self.pl = importlib.import_module(root)
        except ImportError as error:
            other = "nnmem_callbacks.lightning_pytorch" if root == "pytorch_lightning" else "nnmem_callbacks.lightning"
            raise ImportError(
                f"{root} is not installed ({error}). Install it with: {_INSTALL_HINT.get(root, 'pip install ' + root)}. "
                f"If you use the other Lightning namespace, import MemoryBudgetCallback from {other} instead."
            ) from error
        self.root = root
        rank_zero = importlib.import_module(f"{root}.utilities.rank_zero")
        parsing = importlib.import_module(f"{root}.utilities.parsing")
        seed = importlib.import_module(f"{root}.utilities.seed")
        self.Callback = self.pl.Callback
        self.rank_zero_warn = rank_zero.rank_zero_warn
        self.rank_zero_info = rank_zero.rank_zero_info
        self.WarningCache = rank_zero.WarningCache
        self.lightning_hasattr = parsing.lightning_hasattr
        self.lightning_getattr = parsing.lightning_getattr
        self.lightning_setattr = parsing.lightning_setattr
        self.isolate_rng = seed.isolate_rng
        self.TensorBoardLogger = importlib.import_module(f"{root}.loggers").TensorBoardLogger


def _estimator() -> Callable[..., MemoryEstimate]:
    """The PyTorch estimator (a seam for tests)."""
    from nnmem_callbacks import estimate_training

    return estimate_training


def _per_rank_estimator() -> Callable[..., MemoryEstimate]:
    """The per-rank PyTorch estimator for DDP, FSDP and ZeRO (a seam for tests)."""
    from nnmem_callbacks.torch.distributed import estimate_per_rank

    return estimate_per_rank


#: Number of batches per epoch whose phases (forward, backward, optimizer) are measured separately.
PHASE_TRACKED_BATCHES = 8
#: A measured peak above the prediction by more than this fraction triggers a warning.
MISS_TOLERANCE = 0.10
_FP32 = {"32-true", "32", 32}


class _ManualOptimizationShim:
    """Stands in for the optimizers while a manual-optimization ``training_step`` is traced.

    ``manual_backward`` records the loss instead of running backward, and
    ``optimizers()``/``lr_schedulers()`` return objects whose ``step`` does
    nothing; the estimator then runs one backward over the recorded losses and
    steps all optimizers on fake tensors.
    """

    class _Stub:
        def __init__(self, wrapped: Any) -> None:
            self._wrapped = wrapped

        def step(self, *args: Any, **kwargs: Any) -> None:
            closure = kwargs.get("closure") or (args[0] if args and callable(args[0]) else None)
            if closure is not None:
                closure()

        def zero_grad(self, *args: Any, **kwargs: Any) -> None:
            return None

        def __getattr__(self, name: str) -> Any:
            return getattr(self._wrapped, name)

    def __init__(self, module: Any) -> None:
        self.module = module
        self.losses: list[Any] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        module = self.module
        real_optimizers = module.optimizers
        real_schedulers = module.lr_schedulers

        def optimizers(use_pl_optimizer: bool = True) -> Any:
            result = real_optimizers(use_pl_optimizer=use_pl_optimizer)
            if isinstance(result, list):
                return [self._Stub(opt) for opt in result]
            return self._Stub(result)

        def lr_schedulers() -> Any:
            result = real_schedulers()
            if result is None:
                return None
            if isinstance(result, list):
                return [self._Stub(s) for s in result]
            return self._Stub(result)

        def manual_backward(loss: Any, *args: Any, **kwargs: Any) -> None:
            self.losses.append(loss)

        patches = {
            "optimizers": optimizers,
            "lr_schedulers": lr_schedulers,
            "manual_backward": manual_backward,
            "toggle_optimizer": lambda *a, **k: None,
            "untoggle_optimizer": lambda *a, **k: None,
            "toggled_optimizer": lambda *a, **k: contextlib.nullcontext(),
            "clip_gradients": lambda *a, **k: None,
        }
        with _instance_patches(module, patches):
            yield


@contextlib.contextmanager
def _instance_patches(obj: Any, patches: Mapping[str, Any]) -> Iterator[None]:
    """Sets instance attributes for the duration, then removes them (or restores the old ones)."""
    saved: dict[str, Any] = {}
    missing = object()
    for name, value in patches.items():
        saved[name] = obj.__dict__.get(name, missing)
        object.__setattr__(obj, name, value)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is missing:
                with contextlib.suppress(AttributeError):
                    object.__delattr__(obj, name)
            else:
                object.__setattr__(obj, name, old)


def _model_resident_bytes(module: Any, device_kind: str) -> int:
    """Bytes of parameters and buffers already resident on a device of ``device_kind``."""
    total = 0
    seen: set[int] = set()
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.device.type != device_kind or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        total += tensor.numel() * tensor.element_size()
    return total


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
        self._meter: monitor.Meter | None = None
        self._phase = "between steps"
        self._phase_peaks: dict[str, int] = {}
        self._phase_rises: dict[str, int] = {}
        self._interval_start = 0
        self._tracked_batches = 0
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
        from nnmem_callbacks.lightning_strategy import read_strategy

        reading = self._safe(lambda: read_strategy(trainer), "reading the strategy")
        self._early = None
        if reading is not None and reading.strategy is not None and reading.strategy.sharded:
            self._strategy_reading = reading
            self._device_kind = "cuda" if devices.device_type(trainer.strategy.root_device) == "cuda" else "cpu"
            self._early = self._estimate_from_module(trainer, pl_module)
        self._strategy_reading = reading

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        restored, reading, early = self._restored, self._strategy_reading, self._early
        self._reset_run_state()
        self._restored = restored
        if reading is None:
            from nnmem_callbacks.lightning_strategy import read_strategy

            reading = self._safe(lambda: read_strategy(trainer), "reading the strategy")
        self._strategy_reading = reading
        if reading is not None and reading.strategy is None:
            self.failure = f"the strategy is not modelled: {reading.reason}"
            self._warn(
                f"MemoryBudgetCallback does not act under {reading.name}: {reading.reason}. "
                f"It measures only; the budget is not enforced."
            )
            self._fit_started, self._trainer = True, trainer
            self._device_kind = "cuda" if devices.device_type(trainer.strategy.root_device) == "cuda" else "cpu"
            self._original_accumulate = int(trainer.accumulate_grad_batches)
            self._restored = None
            return
        self._fit_started = True
        self._trainer = trainer
        device = trainer.strategy.root_device
        self._device_kind = "cuda" if devices.device_type(device) == "cuda" else "cpu"
        self._original_accumulate = int(trainer.accumulate_grad_batches)

        if early is not None:
            estimate, batch_size, reason = early
        else:
            estimate, batch_size, reason = self._estimate_from_module(trainer, pl_module)
        self._resident_bytes = _model_resident_bytes(pl_module, self._device_kind)
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

        plan = self._agree_across_ranks(trainer, plan, failed)
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

        if self._restored is not None and self._restored.get("applied"):
            self._apply_restored(trainer, pl_module)
        elif not plan.fits:
            self._act(trainer, pl_module, plan, estimate)
        self._restored = None
        self._info(self._summary())
        self._write_tensorboard_fit_start(trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._meter = monitor.torch_meter(trainer.strategy.root_device)
        self._phase_peaks = {}
        self._phase_rises = {}
        self._tracked_batches = 0
        self._phase = "between steps"
        self._safe(self._meter.reset, "resetting the memory peak")
        start = self._safe(self._meter.read, "reading the memory in use")
        self._interval_start = start.current_bytes if start is not None else 0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._enter_phase("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._enter_phase("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._enter_phase("after backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._enter_phase("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        tracking = self._tracked_batches < PHASE_TRACKED_BATCHES
        self._enter_phase("between steps")
        if tracking:
            self._tracked_batches += 1
        elif self._meter is not None:
            self._safe(self._meter.sample, "sampling the memory in use")

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._meter is None:
            return
        reading = self._safe(self._meter.read, "reading the memory peak")
        if reading is None:
            return
        names = monitor.metric_names(self._meter).for_lightning()
        self._record(self._phase, reading)
        measured_peak = max(self._phase_peaks.values()) if self._phase_peaks else reading.peak_bytes
        measured_peak = self._reduce_max(trainer, measured_peak)
        # process RSS holds the interpreter and libraries: compare its rise above the fit-start level
        measured = max(measured_peak - (self._baseline_rss or 0), 0) if self._meter.process_level else measured_peak
        row: dict[str, Any] = {
            "epoch": int(trainer.current_epoch),
            "kind": reading.kind,
            "measured_peak_bytes": int(measured_peak),
            "measured_bytes": int(measured),
            "phase_peaks": dict(self._phase_peaks),
            "phase_rises": dict(self._phase_rises),
            "exact": reading.exact,
        }
        metrics = {names.measured: measured / MiB}
        predicted = self._predicted_comparable()
        if predicted is not None:
            row["predicted_bytes"] = predicted
            row["predicted_peak_bytes"] = self._predicted_peak()
            metrics[names.predicted_peak] = (self._predicted_peak() or 0) / MiB
            metrics[names.predicted] = predicted / MiB
            metrics["memory/predicted_tensor_peak_mib"] = (self._predicted_peak() or 0) / MiB
            metrics[names.relative_error] = (measured - predicted) / max(predicted, 1)
            row["relative_error"] = metrics[names.relative_error]
        if self.plan is not None:
            metrics[names.budget] = self.plan.budget_bytes / MiB
        if reading.kind == "cuda":
            metrics["memory/measured_reserved_mib"] = (reading.reserved_bytes or 0) / MiB
            metrics["memory/measured_device_used_mib"] = (reading.device_used_bytes or 0) / MiB
            row["measured_reserved_bytes"] = reading.reserved_bytes
            row["measured_device_used_bytes"] = reading.device_used_bytes
            if self.estimate is not None and self._train_batch_size:
                metrics["memory/predicted_reserved_mib"] = self.estimate.reserved_bytes_at(self._train_batch_size) / MiB
                metrics["memory/predicted_device_mib"] = self.estimate.device_bytes_at(self._train_batch_size) / MiB
        self.measurements.append(row)
        for logger in trainer.loggers:
            self._safe(lambda logger=logger: logger.log_metrics(metrics, step=trainer.global_step), "logging metrics")
        # process RSS also grows with the runtime's own first-step costs (kernels, thread pools, allocator caches):
        # there a miss must exceed a tenth of the fit-start RSS as well
        reference = max(predicted or 0, (self._baseline_rss or 0) if self._meter.process_level else 0)
        slack = MISS_TOLERANCE * reference
        if predicted is not None and measured > predicted + slack and not self._miss_warned:
            self._miss_warned = True
            rises = self._phase_rises or self._phase_peaks
            phase = max(rises, key=rises.get) if rises else "unknown"
            what = "rise of the process's peak RSS above fit start" if self._meter.process_level else self._meter.source
            self._warn(
                f"MemoryBudgetCallback: the estimate missed. Measured {what} {format_bytes(measured)} in epoch "
                f"{trainer.current_epoch} exceeds the prediction {format_bytes(predicted)} by "
                f"{format_bytes(measured - predicted)} ({(measured - predicted) / max(predicted, 1):.0%}); "
                f"memory rose most in the '{phase}' phase (predicted peak phase: "
                f"'{self.estimate.peak_phase if self.estimate else '?'}'). Largest rise by phase: "
                + ", ".join(f"{k}=+{format_bytes(v)}" for k, v in self._phase_rises.items())
                + ". Memory allocated outside training_step (hooks, callbacks, data on the device) or ops the "
                "estimator does not model are the usual causes."
            )

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        kind = monitor.is_out_of_memory(exception)
        if kind is None:
            return
        measured = None
        if self._meter is not None:
            reading = self._safe(self._meter.read, "reading the memory peak")
            measured = reading.peak_bytes if reading is not None else None
        lines = [f"MemoryBudgetCallback: {kind.upper()} out of memory during the '{self._phase}' phase."]
        predicted = self._predicted_comparable()
        if predicted is not None and self.plan is not None and self.estimate is not None:
            lines.append(
                f"Predicted peak {format_bytes(predicted)} at batch size {self._train_batch_size} "
                f"(phase '{self.estimate.peak_phase}'), budget {format_bytes(self.plan.budget_bytes)}."
            )
        else:
            lines.append(f"No prediction was available ({self.failure or 'the callback did not run at fit start'}).")
        if measured is not None:
            lines.append(f"Measured peak before the failure: {format_bytes(measured)}.")
        if self._phase_peaks:
            lines.append("Measured peaks by phase: " + ", ".join(f"{k}={format_bytes(v)}" for k, v in self._phase_peaks.items()))
        if self.plan is not None:
            if self.plan.max_fitting_batch_size:
                lines.append(f"Largest batch size predicted to fit: {self.plan.max_fitting_batch_size}.")
            if self.policy in ("warn", "raise"):
                lines.append("Use policy='shrink' or policy='accumulate' to let the callback lower the batch size.")
            if self.plan.fits:
                lines.append(
                    "The prediction fit the budget, so memory outside the estimate ran out: other processes on the "
                    "device, evaluation steps, or growth the estimate did not model; lower `budget` or raise `margin`."
                )
            for suggestion in self.plan.suggestions:
                lines.append(f"- {suggestion.text}")
        else:
            lines.append("Lower the batch size, or enable gradient accumulation, activation checkpointing or bf16-mixed.")
        self.last_diagnosis = "\n".join(lines)
        if getattr(trainer, "is_global_zero", True):
            self._ns.rank_zero_warn(self.last_diagnosis)
        else:  # the failing rank may not be rank zero: say it from here
            warnings.warn(f"[rank {trainer.global_rank}] {self.last_diagnosis}", stacklevel=2)

    # ------------------------------------------------------------- estimation
    def _estimate_from_module(self, trainer: Any, pl_module: Any) -> tuple[MemoryEstimate | None, int | None, str | None]:
        """Returns ``(estimate, batch size, failure reason)``; never raises."""
        try:
            batch, loss_fn, source = self._batch_and_loss(trainer, pl_module)
        except Exception as error:
            return None, None, f"no batch to estimate with ({type(error).__name__}: {error})"
        try:
            estimate = self._run_estimator(trainer, pl_module, batch, loss_fn, trainer.precision)
        except Exception as error:
            return None, None, f"the estimator failed on {source}: {type(error).__name__}: {error}"
        return estimate, estimate.batch_size, None  # the estimator reads it from the batch (dim 0 of the first tensor)

    def _batch_and_loss(self, trainer: Any, pl_module: Any) -> tuple[Any, Callable[[Any, Any], Any], str]:
        """One real batch and the loss function to trace, with a description of their source."""
        batch, error = None, None
        try:
            with self._ns.isolate_rng():
                batch = self._first_train_batch(trainer, pl_module)
        except Exception as caught:  # fall back to example_input_array
            error = caught
        if batch is not None:
            return batch, self._training_step_loss(pl_module), "LightningModule.training_step with one train batch"
        example = getattr(pl_module, "example_input_array", None)
        if example is None:
            why = f"{type(error).__name__}: {error}" if error else "the train dataloader gave no batch"
            raise RuntimeError(f"{why}; and the module has no example_input_array")

        def forward_loss(model: Any, inputs: Any) -> Any:
            if isinstance(inputs, tuple):
                out = model(*inputs)
            elif isinstance(inputs, dict):
                out = model(**inputs)
            else:
                out = model(inputs)
            return _sum_outputs(out)

        return example, forward_loss, "forward(example_input_array) with a sum-of-outputs loss"

    def _first_train_batch(self, trainer: Any, pl_module: Any) -> Any:
        import torch.utils.data as data

        if trainer.limit_train_batches == 0:
            raise RuntimeError("limit_train_batches=0")
        loader = trainer.fit_loop._data_source.dataloader()
        if isinstance(loader, data.DataLoader):
            batch = _one_batch(loader)
        else:  # collections of loaders: let Lightning combine them like the fit loop does
            combined_cls = importlib.import_module(f"{self._ns.root}.utilities.combined_loader").CombinedLoader
            combined = loader if isinstance(loader, combined_cls) else combined_cls(loader, "max_size_cycle")
            iterator = iter(combined)
            batch = next(iterator)
            if isinstance(batch, tuple) and len(batch) == 3:
                batch = batch[0]
        batch = pl_module.on_before_batch_transfer(batch, 0)
        return pl_module.on_after_batch_transfer(batch, 0)

    def _training_step_loss(self, pl_module: Any) -> Callable[[Any, Any], Any]:
        manual = not pl_module.automatic_optimization

        def loss_fn(model: Any, batch: Any) -> Any:
            no_log = {"log": lambda *a, **k: None, "log_dict": lambda *a, **k: None}
            with _instance_patches(model, no_log):
                if not manual:
                    return model.training_step(batch, 0)
                shim = _ManualOptimizationShim(model)
                with shim.installed():
                    out = model.training_step(batch, 0)
                losses = list(shim.losses)
                if isinstance(out, Mapping):
                    out = out.get("loss")
                if out is not None and not any(out is loss for loss in losses):
                    losses.append(out)
                if not losses:
                    raise RuntimeError("manual-optimization training_step called manual_backward on no loss")
                total = losses[0]
                for loss in losses[1:]:
                    total = total + loss
                return total

        return loss_fn

    def _run_estimator(self, trainer: Any, pl_module: Any, batch: Any, loss_fn: Any, precision: Any) -> MemoryEstimate:
        optimizers = list(trainer.optimizers) or _configured_optimizers(pl_module)
        optimizer: Any = optimizers[0] if len(optimizers) == 1 else (optimizers or "sgd")
        training = {name: module.training for name, module in pl_module.named_modules()}
        pl_module.train()
        reading = self._strategy_reading
        kwargs = dict(
            optimizer=optimizer,
            loss_fn=loss_fn,
            precision=precision,
            device=str(trainer.strategy.root_device),
            accumulate_grad_batches=int(trainer.accumulate_grad_batches),
            gradient_clip_val=trainer.gradient_clip_val,
            gradient_clip_algorithm=trainer.gradient_clip_algorithm or "norm",
        )
        try:
            with self._ns.isolate_rng():
                if reading is None or reading.strategy is None or reading.strategy.kind == "single":
                    return _estimator()(pl_module, batch, **kwargs)
                from nnmem_callbacks.lightning_strategy import units_for

                return _per_rank_estimator()(
                    pl_module, batch, strategy=reading.strategy, units=units_for(pl_module, reading), **kwargs
                )
        finally:
            for name, module in pl_module.named_modules():
                if name in training:
                    module.training = training[name]

    # --------------------------------------------------------------- planning
    def _budget_bytes(self, trainer: Any, pl_module: Any, estimate: MemoryEstimate) -> tuple[int, bool]:
        """``(budget bytes, include_reserve)`` for the training device."""
        device = trainer.strategy.root_device
        capacity, free = devices.device_capacity(device)
        if self._device_kind == "cuda":
            import torch

            # memory this process already holds (the model) is part of the predicted peak
            free += int(torch.cuda.memory_reserved(device)) + int(estimate.overhead_bytes)
            include_reserve = estimate.reserved_bytes is not None
        else:
            free += _model_resident_bytes(pl_module, "cpu")
            include_reserve = False
        budget = resolve_budget(self.budget, capacity_bytes=capacity, free_bytes=min(free, capacity), margin=self.margin)
        return budget, include_reserve

    def _make_plan(self, trainer: Any, pl_module: Any, estimate: MemoryEstimate) -> Plan:
        budget, include_reserve = self._budget_bytes(trainer, pl_module, estimate)
        accumulate = int(trainer.accumulate_grad_batches)
        margin = planning_margin(self.budget, self.margin)
        plan = make_plan(
            estimate, budget, self.policy, margin, accumulate_grad_batches=accumulate, include_reserve=include_reserve
        )
        if not plan.fits and str(trainer.precision) in {str(p) for p in _FP32}:
            alternative = self._bf16_alternative(trainer, pl_module)
            if alternative is not None:
                plan = make_plan(
                    estimate,
                    budget,
                    self.policy,
                    margin,
                    accumulate_grad_batches=accumulate,
                    alternatives={"bf16-mixed": alternative},
                    include_reserve=include_reserve,
                )
        return plan

    def _bf16_alternative(self, trainer: Any, pl_module: Any) -> MemoryEstimate | None:
        try:
            batch, loss_fn, _ = self._batch_and_loss(trainer, pl_module)
            return self._run_estimator(trainer, pl_module, batch, loss_fn, "bf16-mixed")
        except Exception as error:
            log.debug("bf16-mixed re-estimate failed: %s", error)
            return None

    def _agree_across_ranks(self, trainer: Any, plan: Plan | None, failed: bool) -> Plan | None:
        """All ranks train with one batch size: the smallest any rank chose; any failure disables all."""
        if int(getattr(trainer, "world_size", 1)) <= 1:
            return plan
        import torch

        local_batch = plan.batch_size if plan is not None else 0
        unfit = 0 if (plan is None or plan.fits) else 1
        flags = torch.tensor(
            [1 if (failed or plan is None) else 0, -local_batch, unfit],
            dtype=torch.int64,
            device=trainer.strategy.root_device,
        )
        try:
            reduced = trainer.strategy.reduce(flags, reduce_op="max")
        except Exception as error:  # pragma: no cover - depends on the backend
            self._warn(f"MemoryBudgetCallback: ranks could not agree on a batch size ({error}); using this rank's plan")
            return plan
        any_failed, agreed_batch, any_unfit = (int(v) for v in reduced.tolist())
        agreed_batch = -agreed_batch
        if any_failed or plan is None:
            return None
        if agreed_batch == plan.batch_size and bool(any_unfit) == (not plan.fits):
            return plan
        accumulate = plan.accumulate_grad_batches
        if self.policy == "accumulate" and agreed_batch != plan.original_batch_size:
            accumulate = int(trainer.accumulate_grad_batches) * math.ceil(plan.original_batch_size / agreed_batch)
        import dataclasses

        return dataclasses.replace(
            plan, batch_size=agreed_batch, accumulate_grad_batches=accumulate, fits=plan.fits and not any_unfit
        )

    # ---------------------------------------------------------------- acting
    def _batch_change_blocker(self, trainer: Any, pl_module: Any, estimate: MemoryEstimate) -> str | None:
        """Why the batch size cannot be changed, with how to make it possible; ``None`` when it can."""
        if not trainer.fit_loop._data_source.is_module():
            return (
                "the train dataloaders were passed straight to `trainer.fit(...)`, so Lightning cannot rebuild them "
                f"with another batch size. Return the DataLoader from `LightningModule.train_dataloader()` or a "
                f"`LightningDataModule.train_dataloader()` that reads `self.{self.batch_size_attr}` (or "
                f"`self.hparams.{self.batch_size_attr}`)"
            )
        if not self._ns.lightning_hasattr(pl_module, self.batch_size_attr):
            return (
                f"no attribute {self.batch_size_attr!r} was found on the model, `model.hparams`, the datamodule or "
                f"`datamodule.hparams`. Store the batch size there (e.g. `self.save_hyperparameters()` with a "
                f"`{self.batch_size_attr}` argument), use it in `train_dataloader()`, or pass "
                f"`batch_size_attr=` naming the attribute you use"
            )
        value = self._ns.lightning_getattr(pl_module, self.batch_size_attr)
        if value != estimate.batch_size:
            return (
                f"`{self.batch_size_attr}` is {value!r} but the train dataloader's first batch has "
                f"{estimate.batch_size} samples; `batch_size_attr` must name the per-device batch size that "
                f"`train_dataloader()` uses"
            )
        if self.policy == "accumulate" and not pl_module.automatic_optimization:
            return (
                "the module uses manual optimization, where Lightning does not support `accumulate_grad_batches`; "
                "use policy='shrink' and accumulate inside `training_step`"
            )
        return None

    def _act(self, trainer: Any, pl_module: Any, plan: Plan, estimate: MemoryEstimate) -> None:
        message = describe_plan(plan, estimate)
        if self.policy == "raise":
            raise MemoryBudgetExceeded(
                f"MemoryBudgetCallback(policy='raise'): the predicted peak exceeds the budget.\n{message}"
            )
        if self.policy in ("shrink", "accumulate") and plan.changed:
            blocker = self._batch_change_blocker(trainer, pl_module, estimate)
            if blocker is None:
                self._apply(trainer, pl_module, plan.batch_size, plan.accumulate_grad_batches)
                self._warn(f"MemoryBudgetCallback(policy={self.policy!r}) changed the run: {plan.decision}.\n{message}")
                return
            self._warn(
                f"MemoryBudgetCallback(policy={self.policy!r}) cannot change the batch size: {blocker}. "
                f"Falling back to policy='warn'.\n{message}"
            )
            return
        self._warn(f"MemoryBudgetCallback: the predicted peak exceeds the budget.\n{message}")

    def _apply(self, trainer: Any, pl_module: Any, batch_size: int, accumulate: int) -> None:
        self._ns.lightning_setattr(pl_module, self.batch_size_attr, int(batch_size))
        if self.policy == "accumulate":
            trainer.accumulate_grad_batches = int(accumulate)
        self._train_batch_size = int(batch_size)
        self._applied = True
        self._reset_dataloaders(trainer)

    def _apply_restored(self, trainer: Any, pl_module: Any) -> None:
        restored = self._restored or {}
        batch_size = restored.get("batch_size")
        if batch_size is None:
            return
        if self._ns.lightning_hasattr(pl_module, self.batch_size_attr):
            self._ns.lightning_setattr(pl_module, self.batch_size_attr, int(batch_size))
            self._train_batch_size = int(batch_size)
            self._reset_dataloaders(trainer)
        accumulate = restored.get("accumulate_grad_batches")
        if accumulate:
            trainer.accumulate_grad_batches = int(accumulate)
        if restored.get("original_accumulate_grad_batches"):
            self._original_accumulate = int(restored["original_accumulate_grad_batches"])
        self._applied = True
        if self.plan is not None:
            import dataclasses

            self.plan = dataclasses.replace(
                self.plan,
                batch_size=int(batch_size),
                original_batch_size=int(restored.get("original_batch_size") or self.plan.original_batch_size),
                accumulate_grad_batches=int(accumulate or self.plan.accumulate_grad_batches),
            )
        self._info(
            f"MemoryBudgetCallback: resumed with the decisions from the checkpoint: batch size {batch_size}, "
            f"accumulate_grad_batches {trainer.accumulate_grad_batches}."
        )

    @staticmethod
    def _reset_dataloaders(trainer: Any) -> None:
        """Drops built train/val loaders so the fit loop rebuilds them with the new batch size."""
        loop = trainer.fit_loop
        rebuild = loop._combined_loader is not None
        loop._combined_loader = None
        val_loop = loop.epoch_loop.val_loop
        val_rebuild = val_loop._combined_loader is not None
        val_loop._combined_loader = None
        if rebuild:
            loop.setup_data()
        if val_rebuild:
            val_loop.setup_data()

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
        plan, estimate = self.plan, self.estimate
        assert plan is not None and estimate is not None
        text = (
            f"MemoryBudgetCallback: predicted peak {format_bytes(plan.predicted_bytes)} at batch size "
            f"{plan.original_batch_size} ({estimate.method}, {estimate.precision}, {estimate.device}); budget "
            f"{format_bytes(plan.budget_bytes)}; policy {self.policy!r}; decision: {plan.decision}"
        )
        if self._applied and self._train_batch_size != plan.original_batch_size:
            text += f"; training with batch size {self._train_batch_size}"
        if self._device_kind == "cpu" and self._baseline_rss is not None:
            text += (
                f"; predicted rise of the process RSS above its fit-start {format_bytes(self._baseline_rss)}: "
                f"{format_bytes(self._predicted_comparable() or 0)}"
            )
        return text

    def _write_tensorboard_fit_start(self, trainer: Any) -> None:
        if not getattr(trainer, "is_global_zero", True):
            return
        for logger in trainer.loggers:
            if not isinstance(logger, self._ns.TensorBoardLogger):
                continue
            text = "\n\n".join(
                [
                    self._summary().replace("MemoryBudgetCallback: ", ""),
                    format_markdown_breakdown(self.estimate) if self.estimate else "",
                    "```\n" + format_summary(self.estimate) + "\n```" if self.estimate else "",
                ]
            )
            if self.plan is not None and self.estimate is not None and not self.plan.fits:
                text += "\n\n```\n" + describe_plan(self.plan, self.estimate) + "\n```"
            from nnmem_callbacks.tensorboard_report import write_fit_start

            def write(logger: Any = logger, text: str = text) -> None:
                write_fit_start(
                    logger.experiment,
                    self.estimate,
                    kind=self._device_kind,
                    text=text,
                    budget_bytes=self.plan.budget_bytes if self.plan else None,
                    batch_size=self._train_batch_size,
                    step=int(trainer.global_step),
                )

            self._safe(write, "writing the fit-start summary to TensorBoard")

    # ----------------------------------------------------------- measuring
    def _enter_phase(self, phase: str) -> None:
        if self._meter is None or self._tracked_batches >= PHASE_TRACKED_BATCHES:
            self._phase = phase
            return
        reading = self._safe(self._meter.read, "reading the memory peak")
        if reading is not None:
            self._record(self._phase, reading)
            self._safe(self._meter.reset, "resetting the memory peak")
            self._interval_start = reading.current_bytes
        self._phase = phase

    def _record(self, phase: str, reading: monitor.PeakReading) -> None:
        peak = int(reading.peak_bytes)
        self._phase_peaks[phase] = max(peak, self._phase_peaks.get(phase, 0))
        rise = max(peak - int(self._interval_start), 0)
        self._phase_rises[phase] = max(rise, self._phase_rises.get(phase, 0))

    @staticmethod
    def _reduce_max(trainer: Any, value: int) -> int:
        if int(getattr(trainer, "world_size", 1)) <= 1:
            return value
        import torch

        try:
            tensor = torch.tensor([int(value)], dtype=torch.int64, device=trainer.strategy.root_device)
            return int(trainer.strategy.reduce(tensor, reduce_op="max").item())
        except Exception:  # pragma: no cover - depends on the backend
            return value

    # --------------------------------------------------------------- helpers
    def _warn(self, message: str) -> None:
        self._warnings.warn(message)

    def _info(self, message: str) -> None:
        self._ns.rank_zero_info(message)

    def _safe(self, function: Callable[[], Any], what: str) -> Any:
        """Runs ``function``; a failure never breaks training, and is said once (never silently)."""
        try:
            return function()
        except Exception as error:  # measuring and logging must never break training
            log.debug("MemoryBudgetCallback: %s failed", what, exc_info=True)
            self._warn(f"MemoryBudgetCallback: {what} failed ({type(error).__name__}: {error}); training goes on.")
            return None


def _configured_optimizers(pl_module: Any) -> list[Any]:
    """The optimizers ``configure_optimizers`` returns (before the strategy has set them up).

    They are only read (class and hyper-parameters) by the estimator, never stepped.
    """
    try:
        configured = pl_module.configure_optimizers()
    except Exception as error:  # noqa: BLE001 - the estimate then assumes SGD and says so
        log.debug("configure_optimizers failed while estimating: %s", error)
        return []
    if isinstance(configured, Mapping):
        configured = configured.get("optimizer")
    if isinstance(configured, (list, tuple)):
        if configured and isinstance(configured[0], (list, tuple)):
            configured = configured[0]
        configured = [c.get("optimizer") if isinstance(c, Mapping) else c for c in configured]
    else:
        configured = [configured]
    import torch

    return [c for c in configured if isinstance(c, torch.optim.Optimizer)]


def _sum_outputs(out: Any) -> Any:
    """A scalar from a model output (tensor, or nested collection of tensors) for a surrogate loss."""
    import torch

    if isinstance(out, torch.Tensor):
        return out.float().sum()
    if isinstance(out, Mapping):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        parts = [_sum_outputs(item) for item in out]
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total
    return None


def _one_batch(loader: Any) -> Any:
    """One batch from a DataLoader; for map-style datasets without starting worker processes."""
    import torch.utils.data as data

    dataset = loader.dataset
    batch_sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(dataset, data.IterableDataset) and batch_sampler is not None:
        indices = next(iter(batch_sampler))
        return loader.collate_fn([dataset[i] for i in indices])
    return next(iter(loader))
