"""The Keras ``MemoryBudgetCallback``: predict at ``on_train_begin``, measure every epoch.

Flat and backend-neutral (TensorFlow, JAX, torch). Keras gives callbacks no
batch size and a running ``fit`` cannot change it, so the callback reads the
batch size from the running ``fit``'s data adapter (or takes it as an
argument), only warns or raises, and points to
:func:`~nnmem_callbacks.keras.fit_plan` for choosing a batch before ``fit``.

Much is shared with the Lightning callback: the guarded call, warn-once and the
prediction to compare (:mod:`nnmem_callbacks.adapters.common`); the meter, from
:func:`nnmem_callbacks.monitoring.meters.keras_meter`; each epoch's figures, from
:func:`nnmem_callbacks.monitoring.epoch_comparison.compare_epoch`; the TensorBoard
event file, from :class:`nnmem_callbacks.monitoring.tensorboard.EventWriter`. Keras has no hook for an
exception raised inside ``fit`` (``on_train_end`` is not called then), so there
is no out-of-memory diagnosis here; Keras has no phase hooks either, so the
peak is measured per epoch, not per phase of the step.
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

import keras

from nnmem_callbacks.adapters.common import Guard, compared_prediction, predicted_peak
from nnmem_callbacks.core import warning_site
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.plan import (
    DEFAULT_MARGIN,
    MemoryBudgetExceeded,
    Plan,
    check_budget,
    check_margin,
    make_plan,
    planning_margin,
    resolve_budget,
)
from nnmem_callbacks.estimators.keras.common import INTERNAL_PACKAGES, has_symbolic_inputs, tree_leaves
from nnmem_callbacks.estimators.keras.tensorflow.fit_pipeline import INPUT_PIPELINE_BATCHES
from nnmem_callbacks.hardware import devices
from nnmem_callbacks.monitoring import epoch_comparison as epoch_report
from nnmem_callbacks.monitoring import meters as monitor
from nnmem_callbacks.monitoring.tensorboard import EventWriter

__all__ = ["INPUT_PIPELINE_BATCHES", "INTERNAL_PACKAGES", "JAX_LOOKAHEAD_BATCHES", "log", "MemoryBudgetCallback"]

log = logging.getLogger(__name__)

#: Batches that Keras' JAX ``fit`` holds on an accelerator beyond the one being trained on:
#: ``JAXEpochIterator._one_batch_ahead_iterator`` starts the next batch's transfer before the
#: step runs (not on CPU, and not under a ``keras.distribution``).
JAX_LOOKAHEAD_BATCHES = 1


def _tf_counted(num_bytes: int) -> int:
    from nnmem_callbacks.allocators.tensorflow_cpu import tf_allocator_bytes

    return tf_allocator_bytes(num_bytes)


#: Why no relative error is logged from process RSS (RSS_NOTE: and that only its rise is measured).
RSS_WHY = (
    "RSS also holds compiled code, the runtime's caches and memory the allocator keeps after freeing it, so no "
    "relative error is logged from it."
)
RSS_NOTE = (
    "Only the rise of the process RSS above its fit-start level is measured (memory_measured_rss_rise_mib, beside "
    f"memory_predicted_rss_rise_mib); {RSS_WHY}"
)

_RSS_WARNED: set[str] = set()


def _warn_rss_once(backend: str) -> None:
    """Once per process and backend: this fit's device keeps no allocator statistics, so only RSS is measured."""
    if backend in _RSS_WARNED:
        return
    _RSS_WARNED.add(backend)
    _warn(
        f"MemoryBudgetCallback: the Keras {backend} backend keeps no allocator statistics on this device (CPU), "
        f"so the callback cannot measure the tensors' peak that it predicts. {RSS_NOTE}"
    )


def _warn(message: str) -> None:
    """``warnings.warn`` shown at the user's ``model.fit(...)`` line, not inside Keras' callback list."""
    warning_site.warn(message, INTERNAL_PACKAGES)


class MemoryBudgetCallback(keras.callbacks.Callback):
    """Predicts the peak memory of ``fit`` before the first step and checks it every epoch.

    Args:
        batch_size: The batch size passed to ``fit``. Keras does not tell
            callbacks the batch size; when omitted it is read from ``fit``'s
            data (see below), else from ``data`` (a ``tf.data.Dataset``, a
            ``keras.utils.PyDataset`` with a ``batch_size``, or arrays whose
            length divided by ``self.params["steps"]`` gives it), otherwise the
            callback warns that it needs it and only measures.
        budget: ``None``: free memory minus ``margin``; an ``int`` of bytes; a
            ``float`` in (0, 1]: a fraction of the device capacity; a string
            such as ``"2GiB"``.
        policy: ``"warn"``: one warning with the breakdown, the largest batch
            that fits and Keras code for each remedy with its predicted saving.
            ``"raise"``: :class:`~nnmem_callbacks.MemoryBudgetExceeded` from
            ``on_train_begin``, before any optimizer step, with the same text.
        log_dir: Also write the values to TensorBoard event files here (no
            TensorFlow needed).
        margin: Headroom kept below the budget when proposing a batch size.
        data: Optional training data to infer the batch size from.
        x, y: Optional example arrays for the estimator (subclassed models).

    Every epoch ``logs`` gains the figures, so ``History`` and a
    ``keras.callbacks.TensorBoard`` placed after this callback record them.
    Their names say what was measured (:attr:`metric_names`):

    * the backend's allocator (TensorFlow with allocator statistics, JAX on
      GPU, torch on CUDA): ``memory_predicted_peak_mib``,
      ``memory_measured_peak_mib``, ``memory_relative_error``;
    * otherwise (CPU without allocator statistics: JAX, torch, and
      TensorFlow unless its CPU allocator keeps them) process RSS, as its
      rise above the fit-start level: ``memory_measured_rss_rise_mib`` and
      ``memory_predicted_rss_rise_mib``, beside ``memory_predicted_peak_mib``
      (the tensor peak). RSS also holds compiled code, caches and freed
      memory the allocator keeps, so no relative error is logged from it.
      One warning says so (on TensorFlow it also says how to get the
      allocator's figure).

    ``memory_budget_mib`` is logged too. With an estimate, every key is
    present every epoch: a figure that could not be measured is NaN, and a
    warning says why. Without one (no batch size known, or the estimator
    failed: a warning says which) only the measured figure is logged.

    The batch size is read from the ``fit`` that runs the callback where its
    data tell it (arrays, data loaders, a ``tf.data`` pipeline's ``batch``,
    a ``PyDataset``'s ``batch_size`` attribute, a generator's first batch,
    which Keras has already drawn; nothing more is drawn); a ``batch_size``
    given here that differs is warned about, and ``fit``'s is used.

    Raises:
        ValueError: For a policy other than ``"warn"``/``"raise"`` (the message
            explains why ``shrink``/``accumulate`` are not possible here), an
            invalid budget, margin or batch size.

    Example:
        >>> MemoryBudgetCallback(batch_size=256, budget="2GiB").policy
        'warn'
        >>> MemoryBudgetCallback(policy="shrink")
        Traceback (most recent call last):
        ...
        ValueError: policy 'shrink' is not available in Keras: a running fit cannot change its batch size. Valid policies are 'warn', 'raise'; to train with a batch that fits, call nnmem_callbacks.keras.fit_plan(model, budget, batch_size) before fit and use its batch_size and gradient_accumulation_steps.
    """

    #: The policies accepted by ``policy``.
    POLICIES = ("warn", "raise")

    def __init__(
        self,
        batch_size: int | None = None,
        budget: int | float | str | None = None,
        policy: str = "warn",
        log_dir: str | None = None,
        *,
        margin: float = DEFAULT_MARGIN,
        data: Any = None,
        x: Any = None,
        y: Any = None,
    ) -> None:
        super().__init__()
        if policy not in self.POLICIES:
            if policy in ("shrink", "accumulate"):
                raise ValueError(
                    f"policy {policy!r} is not available in Keras: a running fit cannot change its batch size. Valid "
                    f"policies are {', '.join(map(repr, self.POLICIES))}; to train with a batch that fits, call "
                    f"nnmem_callbacks.keras.fit_plan(model, budget, batch_size) before fit and use its batch_size and "
                    f"gradient_accumulation_steps."
                )
            raise ValueError(f"unknown policy {policy!r}; valid policies are {', '.join(map(repr, self.POLICIES))}")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self.batch_size = batch_size
        self.budget = check_budget(budget)
        self.policy = policy
        self.log_dir = log_dir
        self.margin = check_margin(margin)
        self.data = data
        self.x, self.y = x, y
        self._reset()

    # ------------------------------------------------------------------ state
    def _reset(self) -> None:
        self.estimate: MemoryEstimate | None = None
        self.plan: Plan | None = None
        self.failure: str | None = None
        self.message: str | None = None
        self.measurements: list[dict[str, Any]] = []
        self._train_batch_size: int | None = None
        self._adapter: Any = None
        self._pending_warnings: list[str] = []
        self._meter: monitor.Meter | None = None
        self._names: monitor.MetricNames | None = None
        self._writer: Any = None
        self._guard = Guard(_warn, log)

    @property
    def metric_names(self) -> monitor.MetricNames | None:
        """The names this fit logs under (they depend on the meter: allocator or process RSS); set at fit start."""
        return self._names

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._close_writer()
        if self._meter is not None:
            self._guard.safe(self._meter.close, "stopping the previous fit's meter")
        self._reset()
        guard = self._guard
        chosen = guard.safe(lambda: monitor.keras_meter(keras.backend.backend()), "choosing a meter")
        self._meter, meter_warning = chosen if chosen is not None else (monitor.RssMeter(), None)
        self._names = monitor.metric_names(self._meter)
        if meter_warning:
            guard.warn(meter_warning + " " + RSS_WHY)
        elif self._meter.process_level:
            _warn_rss_once(keras.backend.backend())
        self._adapter = _fit_adapter(self.model)
        batch_size, reason = self._infer_batch_size()
        for message in self._pending_warnings:
            guard.warn(message)
        self._train_batch_size = batch_size
        if batch_size is None:
            self.failure = reason
        else:
            try:
                from nnmem_callbacks.estimators.keras.estimator import estimate_training

                x, y = self.x, self.y
                if x is None and not has_symbolic_inputs(self.model):  # subclassed: fit's data give the shapes
                    x, y = fit_example(self._adapter)
                if x is None and not has_symbolic_inputs(self.model):
                    self.failure = (
                        f"{type(self.model).__name__} has no symbolic inputs (a subclassed model) and this fit's data "
                        f"do not give their shapes without drawing a batch: pass one example batch, "
                        f"MemoryBudgetCallback(x=..., y=...)"
                    )
                else:
                    # this fit runs after the estimate, which builds the optimizer: its first step finds the slots
                    self.estimate = estimate_training(self.model, batch_size, x, y, optimizer_built=True)
            except Exception as error:  # noqa: BLE001 - never break training
                self.failure = f"{type(error).__name__}: {error}"
        self._adapter = None  # it holds fit's data: not kept beyond this hook
        if self.estimate is None:
            guard.warn(
                f"MemoryBudgetCallback could not estimate the training memory, so training goes on unchanged and the "
                f"callback only measures: {self.failure}"
            )
        else:
            guard.notes(self.estimate)
            self._plan()
        guard.safe(self._meter.start, "reading the memory at fit start")
        self._open_writer()
        if self.estimate is not None and self.plan is not None and self.message and not self.plan.fits:
            if self.policy == "raise":
                raise MemoryBudgetExceeded(self.message)
            guard.warn(self.message)

    def _plan(self) -> None:
        from nnmem_callbacks.adapters.keras.planning import describe, keras_suggestions, optimizer_name

        estimate = self.estimate
        assert estimate is not None
        capacity, free = self._guard.safe(self._meter.capacity, "reading the device capacity") or devices.cpu_capacity()
        budget_bytes = resolve_budget(self.budget, capacity_bytes=capacity, free_bytes=free, margin=self.margin)
        self.plan = make_plan(estimate, budget_bytes, policy="warn", margin=planning_margin(self.budget, self.margin))
        suggestions = keras_suggestions(
            estimate,
            budget_bytes,
            margin=self.margin,
            optimizer_name=optimizer_name(self.model),
            mixed="mixed" in estimate.precision,
        )
        self.plan = Plan(**{**self.plan.__dict__, "policy": self.policy, "suggestions": tuple(suggestions)})
        text = describe(self.plan, estimate, suggestions)
        if not self.plan.fits:
            text += (
                "\nA running fit cannot change its batch size: stop and restart with one of the above, or call "
                "nnmem_callbacks.keras.fit_plan(model, budget, batch_size) before fit."
            )
        self.message = "MemoryBudgetCallback: " + text

    def _infer_batch_size(self) -> tuple[int | None, str | None]:
        fitted = _fit_batch_size(self._adapter)
        if self.batch_size is not None:
            if fitted is not None and fitted != self.batch_size:
                self._pending_warnings.append(
                    f"MemoryBudgetCallback(batch_size={self.batch_size}), but this fit trains with batch_size={fitted}: "
                    f"the callback estimates at fit's batch size, {fitted}. Pass batch_size={fitted} to the callback "
                    f"(or leave it out: the callback reads it from fit)."
                )
                return fitted, None
            return self.batch_size, None
        if fitted is not None:
            return fitted, None
        data = self.data
        steps = (self.params or {}).get("steps")
        if data is not None:
            spec = getattr(data, "element_spec", None)
            if spec is not None:
                first = spec[0] if isinstance(spec, (tuple, list)) else spec
                while isinstance(first, (tuple, list, dict)):
                    first = list(first.values())[0] if isinstance(first, dict) else first[0]
                dim = first.shape[0] if first.shape.rank else None
                if dim is not None:
                    return int(dim), None
            size = data_batch_size(data)
            if size is not None:
                return size, None
            length = _num_samples(data)
            if length and steps:
                return int(math.ceil(length / steps)), None
        return None, (
            "the batch size is unknown: Keras does not pass it to callbacks, and this fit's data do not tell it; "
            "use MemoryBudgetCallback(batch_size=...) with the batch size of each step (the value given to fit, or "
            "the size of the batches your dataset or generator yields)"
        )

    # --------------------------------------------------------------- epochs
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._meter is not None:
            self._guard.safe(self._meter.reset, "resetting the memory peak")

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._meter is not None:
            self._guard.safe(self._meter.sample, "sampling the memory in use")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Adds the measured and predicted figures to ``logs`` (every key every epoch; NaN when unmeasurable)."""
        if self._meter is None or self._names is None:
            return
        reading = self._guard.safe(self._meter.read, "reading the memory peak")
        if reading is not None and not reading.exact and self._meter.kind == "jax":
            self._guard.warn(
                "MemoryBudgetCallback: JAX's peak_bytes_in_use cannot be reset, and an earlier peak holds it above "
                "this fit's steps (XLA's autotuning when the step was compiled, or an earlier model in this process). "
                f"{self._names.measured} is therefore the largest bytes_in_use sampled during the epoch, a floor of the "
                "training peak (exact while a sample falls inside a step, since XLA holds a step's buffers for the "
                "whole step). For the exact peak, measure in a fresh process whose compilation loads the autotuning "
                "results (XLA_FLAGS=--xla_gpu_per_fusion_autotune_cache_dir=DIR, filled by an earlier run)."
            )
        comparison = epoch_report.compare_epoch(
            self._meter,
            reading,
            epoch=int(epoch),
            names=self._names,
            baseline_bytes=self._meter.baseline,
            predicted_bytes=self._predicted_comparable(),
            predicted_peak_bytes=predicted_peak(self.estimate, self._train_batch_size),
            budget_bytes=self.plan.budget_bytes if self.plan is not None else None,
        )
        metrics, row = dict(comparison.metrics), dict(comparison.row)  # (process RSS: no relative error)
        self.measurements.append(row)
        if logs is not None:
            logs.update(metrics)
        self._write_scalars(metrics, epoch)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._close_writer()
        if self._meter is not None:
            self._guard.safe(self._meter.close, "stopping the meter")

    # ---------------------------------------------------------- predictions
    def _predicted_comparable(self) -> int | None:
        """The prediction of what the meter measures: the allocator's peak, or the rise of process RSS."""
        if self.estimate is None or self._meter is None:
            return None
        size = self._train_batch_size or self.estimate.batch_size
        # what exists before the first step (all but the gradients) is already in the fit-start figure
        resident = self.estimate.static_bytes - self.estimate.breakdown["gradients"]
        if self._meter.kind == "tensorflow":
            extra = self.estimate.extra
            peak = predicted_peak(self.estimate, size)
            if "tf_allocator_peak_bytes" in extra and self.estimate.batch_size == size:
                peak = int(extra["tf_allocator_peak_bytes"])
                resident = int(extra.get("tf_allocator_static_bytes", 0))
            # fit's tf.data pipeline prefetches: about INPUT_PIPELINE_BATCHES more batches are alive (the graph
            # replay's estimate counts them already, in its lines and its allocator figure)
            batch_inputs = self._batch_input_bytes(size)
            pipeline = (
                0
                if "fit_pipeline_bytes" in extra
                else (
                    sum(_tf_counted(batch_inputs // max(self._num_inputs(), 1)) for _ in range(self._num_inputs()))
                    * INPUT_PIPELINE_BATCHES
                )
            )
            return max(self._meter.baseline - resident, 0) + peak + pipeline
        if (
            self._meter.kind == "jax"
            and "xla_allocator_peak_bytes" in self.estimate.extra
            and self.estimate.batch_size == size
        ):
            # peak_bytes_in_use counts the allocator's chunks (whole regions when JAX allocates on demand)
            return int(self.estimate.extra["xla_allocator_peak_bytes"]) + self._jax_lookahead_bytes(size)
        return compared_prediction(
            self.estimate, size, process_level=self._meter.process_level, resident_bytes=resident
        )

    def _jax_lookahead_bytes(self, size: int) -> int:
        """The batch Keras' JAX ``fit`` moves to the accelerator while the step before it runs.

        The estimate counts the batch a step reads; ``fit`` on a GPU or TPU also holds the next one
        (:data:`JAX_LOOKAHEAD_BATCHES`). A ``keras.distribution`` feeds batches without the look-ahead.
        """
        assert self.estimate is not None
        try:
            from keras import distribution

            if distribution.distribution() is not None:
                return 0
        except (ImportError, AttributeError):  # pragma: no cover - Keras without the distribution API
            pass
        return self._batch_input_bytes(size) * JAX_LOOKAHEAD_BATCHES

    def _batch_input_bytes(self, size: int) -> int:
        """One batch of ``size`` samples of the inputs and labels, scaled from the estimate's batch."""
        assert self.estimate is not None
        return self.estimate.breakdown["inputs"] * size // max(self.estimate.batch_size, 1)

    def _num_inputs(self) -> int:
        return int((self.estimate.extra if self.estimate else {}).get("inputs", 1) or 1)

    # ----------------------------------------------------------- TensorBoard
    def _open_writer(self) -> None:
        if not self.log_dir:
            return
        self._writer = self._guard.safe(lambda: EventWriter(self.log_dir), "opening the TensorBoard event file")
        if self._writer is None:
            return
        from nnmem_callbacks.core.formatting import format_summary

        parts = []
        if self.estimate is not None:
            parts.append("```\n" + format_summary(self.estimate) + "\n```")
        if self.message:
            parts.append("```\n" + self.message + "\n```")
        if self.failure:
            parts.append(f"no prediction: {self.failure}")
        self._guard.safe(
            lambda: self._writer.text("memory/estimate", "\n\n".join(parts) or "no estimate", 0), "writing TensorBoard"
        )

    def _write_scalars(self, values: dict[str, float], epoch: int) -> None:
        if self._writer is None:
            return
        for name, value in values.items():
            tag = "memory/" + name[len("memory_") :]
            self._guard.safe(lambda tag=tag, value=value: self._writer.scalar(tag, value, epoch), "writing TensorBoard")
        self._guard.safe(self._writer.flush, "writing TensorBoard")

    def _close_writer(self) -> None:
        writer, self._writer = getattr(self, "_writer", None), None
        if writer is not None:
            self._guard.safe(writer.close, "closing the TensorBoard event file")


def _fit_adapter(model: Any, depth: int = 16) -> Any:
    """The data adapter of the ``fit`` of ``model`` that is calling back (``None`` outside one).

    Keras gives callbacks neither the batch size nor the data; every backend's ``fit`` holds its
    ``epoch_iterator``, whose data adapter knows them. It is read, never changed; outside a ``fit`` of
    ``model`` (a hook called by hand) the answer is ``None``.
    """
    frame = sys._getframe(2)
    try:
        for _ in range(depth):
            if frame is None:
                return None
            if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
                return getattr(frame.f_locals.get("epoch_iterator"), "data_adapter", None)
            frame = frame.f_back
        return None
    finally:
        del frame


def _fit_batch_size(adapter: Any) -> int | None:
    """The batch size of ``fit``'s data adapter (``None`` when unknown): arrays, data loaders, and where Keras
    cannot tell it, :func:`data_batch_size`."""
    if adapter is None:
        return None
    try:
        size = getattr(adapter, "batch_size", None)
        samples = getattr(adapter, "_num_samples", None)  # arrays: fewer samples than a batch
        if size is None:  # tf.data without a static batch, a generator, a PyDataset
            size = data_batch_size(adapter)
    except Exception:  # noqa: BLE001 - an adapter that cannot tell
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return None
    return min(size, samples) if isinstance(samples, int) and samples > 0 else size


def fit_example(adapter: Any) -> tuple[Any, Any]:
    """``(x, y)`` with the shapes and dtypes of ``fit``'s data, for a model without symbolic inputs (subclassed).

    The arrays Keras' array adapter holds, a ``tf.data`` pipeline's ``element_spec``, or the first batch Keras
    already drew from a generator; ``(None, None)`` where the adapter does not hold them (nothing is drawn).
    """
    if adapter is None:
        return None, None
    try:
        batch = getattr(adapter, "_inputs", None)
        if batch is None:
            dataset = getattr(adapter, "_dataset", None)
            batch = getattr(dataset, "element_spec", None)
        if batch is None:
            first = getattr(adapter, "_first_batches", None)
            batch = first[0] if isinstance(first, list) and first else None
    except Exception:  # noqa: BLE001 - an adapter that cannot tell
        return None, None
    x, y = (batch[0], batch[1] if len(batch) > 1 else None) if isinstance(batch, (tuple, list)) else (batch, None)
    for leaf in tree_leaves(x) + tree_leaves(y):
        shape = getattr(leaf, "shape", None)
        if shape is None or any(d is None for d in tuple(shape)[1:]):  # a length that varies: no one shape
            return None, None
    return x, y


#: ``tf.data`` transformations that keep the batches of the dataset they read (its batch size passes through them).
_KEEP_BATCHES = frozenset(
    "assertcardinality cache filter finitetake ignoreerrors map maxintraopparallelism model options parallelmap "
    "prefetch privatethreadpool repeat restructured shard shuffle skip take".split()
)


def tf_dataset_batch_size(dataset: Any) -> int | None:
    """The batch size a ``tf.data`` pipeline was batched with, read from its last ``batch``/``padded_batch``.

    A batch without ``drop_remainder`` has no static batch dimension, so Keras' adapter cannot tell it; the
    pipeline's own ``batch`` transformation can. Nothing is iterated (a peek would shift a shuffle's order).
    ``None`` past a transformation that may change the batching (``unbatch``, ``rebatch``, ``flat_map``...).

    Example:
        >>> import tensorflow as tf
        >>> tf_dataset_batch_size(tf.data.Dataset.range(100).shuffle(10).batch(40).map(lambda v: v).prefetch(2))
        40
        >>> tf_dataset_batch_size(tf.data.Dataset.range(100).batch(7).unbatch()) is None
        True
    """
    for _ in range(64):
        if dataset is None:
            return None
        batch = getattr(dataset, "_batch_size", None)
        if batch is not None:
            import tensorflow as tf

            value = tf.get_static_value(batch)
            return int(value) if value is not None and int(value) > 0 else None
        name = type(dataset).__name__.lower().strip("_")
        if name.removesuffix("dataset") not in _KEEP_BATCHES:
            return None
        dataset = getattr(dataset, "_input_dataset", None)
    return None


def data_batch_size(data: Any) -> int | None:
    """The batch size of ``fit``'s data where Keras' data adapter does not tell it (``None`` when unknown).

    A ``tf.data`` pipeline's ``batch`` (:func:`tf_dataset_batch_size`), a ``keras.utils.PyDataset``'s
    ``batch_size`` attribute, or the first batch that Keras already took from a generator to read its
    structure. Nothing is drawn from the data. ``data`` is the adapter or the user's data itself.
    """
    dataset = getattr(data, "_dataset", data)  # Keras' TFDatasetAdapter keeps the dataset here
    if type(dataset).__module__.startswith("tensorflow") and hasattr(dataset, "element_spec"):
        return tf_dataset_batch_size(dataset)
    py_dataset = getattr(data, "py_dataset", data)
    size = getattr(py_dataset, "batch_size", None)
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    first = getattr(data, "_first_batches", None)  # GeneratorDataAdapter peeks at the first batches itself
    if isinstance(first, list) and first:
        return _num_samples(first[0])
    return None


def _num_samples(data: Any) -> int | None:
    first = data
    while isinstance(first, (tuple, list)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    if shape is not None and len(shape) > 0 and shape[0] is not None:
        return int(shape[0])
    return None
