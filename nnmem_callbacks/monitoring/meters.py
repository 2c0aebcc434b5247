"""Measuring during training, for every adapter: meters and the metric names their figures are logged under.

Both callbacks (Lightning and Keras) measure the real run every epoch and put the
measurement beside the prediction. This module holds what they share:

* **Meters**, one per runtime, each saying what it reads, whether it can be reset
  and whether its peak is exact or a floor:

  ==============  ==========================================  ========  =====================
  meter           reads                                        resets    prediction it matches
  ==============  ==========================================  ========  =====================
  ``cuda``        ``max_memory_allocated`` (+ reserved, device)  yes     the tensor peak
  ``tensorflow``  ``get_memory_info(dev)['peak']``              yes      TF allocator figure
  ``jax``         ``peak_bytes_in_use``; ``bytes_in_use``        no       the allocator's peak
  ``rss``         process peak RSS (``VmHWM``), above fit start  yes*     peak minus resident
  ==============  ==========================================  ========  =====================

  (*) with ``/proc/self/clear_refs`` writable; otherwise the peak is sampled.
* **Metric names**: allocator-level meters log ``memory_predicted_peak_mib``,
  ``memory_measured_peak_mib`` and ``memory_relative_error``. Process RSS is not
  comparable with a tensor peak, so an RSS meter logs what it really compares, the
  rise of the process RSS above its level at fit start:
  ``memory_measured_rss_rise_mib`` and ``memory_predicted_rss_rise_mib``, beside
  ``memory_predicted_peak_mib`` (the estimate's tensor peak), and no relative
  error: the rise also holds allocator caches and freed memory kept resident. The Lightning callback also logs the figures behind
  the comparison: ``memory/predicted_tensor_peak_mib`` and, on CUDA, the
  allocator reserve and the device total, measured and predicted
  (:class:`MetricNames` holds every name).
* **Choosing a meter** for Keras: the backend's allocator when it keeps
  statistics, else process RSS with a warning that says how to get the precise
  figure (:func:`keras_meter`).

Beside this module, :mod:`nnmem_callbacks.monitoring.phase_tracking` books peaks per phase
of the step, :mod:`nnmem_callbacks.monitoring.epoch_comparison` puts each epoch's
measurement beside its prediction (row, metrics, miss warning) and
:mod:`nnmem_callbacks.monitoring.oom` diagnoses an out-of-memory error.

Example:
    >>> meter = RssMeter()
    >>> meter.start()
    >>> block = bytearray(8 * 1024 * 1024)  # touch 8 MiB
    >>> reading = meter.read()
    >>> reading.peak_bytes >= reading.current_bytes > 0
    True
    >>> metric_names(meter).measured
    'memory_measured_rss_rise_mib'
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from nnmem_callbacks.hardware import devices

__all__ = [
    "CudaMeter",
    "JaxMeter",
    "keras_meter",
    "Meter",
    "metric_names",
    "MetricNames",
    "PeakReading",
    "predicted_rss_rise",
    "RssMeter",
    "TensorFlowMeter",
    "TF_PRECISE_HINT",
    "torch_meter",
]


@dataclasses.dataclass(frozen=True)
class PeakReading:
    """Memory figures measured over one interval, all in bytes.

    Attributes:
        kind: The meter's kind: ``"cuda"``, ``"tensorflow"``, ``"jax"`` or ``"rss"``.
        peak_bytes: The peak over the interval: CUDA ``max_memory_allocated``;
            TensorFlow's allocator peak; JAX's ``peak_bytes_in_use`` (or a
            floor, see ``exact``); the process's peak RSS.
        reserved_bytes: CUDA: ``max_memory_reserved``; ``None`` elsewhere.
        device_used_bytes: CUDA: used memory of the whole device now
            (``total - free``, includes the context); ``None`` elsewhere.
        current_bytes: What is in use now (allocated bytes, or RSS).
        exact: ``False`` when the peak is only a floor: sampled between steps
            (CPU without a writable ``clear_refs``; JAX when the process-wide
            peak cannot be attributed to this interval).
    """

    kind: str
    peak_bytes: int
    reserved_bytes: int | None = None
    device_used_bytes: int | None = None
    current_bytes: int = 0
    exact: bool = True


class Meter:
    """Measures the peak memory of training over intervals (an epoch, a phase of a step).

    Call :meth:`start` once at fit start (it records the baseline), :meth:`reset`
    at the start of each interval, :meth:`sample` between steps if you can, and
    :meth:`read` at the end of the interval.

    Attributes:
        kind: ``"cuda"``, ``"tensorflow"``, ``"jax"`` or ``"rss"``.
        source: What the meter reads, in words (for messages and reports).
        resettable: Whether the runtime's peak can be reset between intervals.
        process_level: ``True`` for process RSS: the reading holds the
            interpreter and libraries, so it is compared as a rise above
            :attr:`baseline` (see :func:`metric_names`).
        baseline: The bytes in use when :meth:`start` was called.
    """

    kind = "abstract"
    source = ""
    resettable = True
    process_level = False

    def __init__(self) -> None:
        self.baseline = 0

    def start(self) -> None:
        """Begins a run: resets the peak and records the baseline."""
        self.reset()
        self.baseline = self.read().current_bytes

    def reset(self) -> None:
        """Starts a new interval."""

    def sample(self) -> None:
        """Records the use between steps (matters only for meters that cannot reset)."""

    def read(self) -> PeakReading:
        """The peak since the last :meth:`reset`."""
        raise NotImplementedError

    def close(self) -> None:
        """Ends a run: stops anything the meter runs in the background (a sampler thread)."""

    def capacity(self) -> tuple[int, int]:
        """``(total, free)`` bytes of the memory this meter watches."""
        return devices.cpu_capacity()


class RssMeter(Meter):
    """The process's peak resident set size (Linux ``VmHWM``, reset through ``clear_refs``).

    Where ``clear_refs`` is not writable the peak is the largest RSS sampled at
    :meth:`sample` calls and interval ends, and readings say ``exact=False``.
    """

    kind = "rss"
    source = "process peak RSS"
    process_level = True

    def __init__(self) -> None:
        super().__init__()
        self.exact = True
        self._sampled = 0

    def reset(self) -> None:
        self.exact = devices.reset_rss_peak()
        self._sampled = devices.current_rss()

    def sample(self) -> None:
        if not self.exact:
            self._sampled = max(self._sampled, devices.current_rss())

    def read(self) -> PeakReading:
        rss = devices.current_rss()
        if self.exact:
            hwm = devices.read_status_bytes("VmHWM")
            if hwm is not None:
                return PeakReading(kind=self.kind, peak_bytes=max(hwm, rss), current_bytes=rss)
        self._sampled = max(self._sampled, rss)
        return PeakReading(kind=self.kind, peak_bytes=self._sampled, current_bytes=rss, exact=False)


class CudaMeter(Meter):
    """torch's CUDA caching allocator: ``max_memory_allocated``, ``max_memory_reserved`` and device use."""

    kind = "cuda"
    source = "CUDA max_memory_allocated"

    def __init__(self, device: Any = "cuda") -> None:
        super().__init__()
        self.device = device

    def reset(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> PeakReading:
        import torch

        total, free = devices.cuda_capacity(self.device)
        return PeakReading(
            kind=self.kind,
            peak_bytes=int(torch.cuda.max_memory_allocated(self.device)),
            reserved_bytes=int(torch.cuda.max_memory_reserved(self.device)),
            device_used_bytes=int(total - free),
            current_bytes=int(torch.cuda.memory_allocated(self.device)),
        )

    def capacity(self) -> tuple[int, int]:
        return devices.cuda_capacity(self.device)


class TensorFlowMeter(Meter):
    """TensorFlow's allocator statistics for one device (``"CPU:0"``, ``"GPU:0"``).

    On CPU they exist only when the CPU allocator is a BFC allocator: oneDNN on
    (TensorFlow's default only on AVX-512-class CPUs) or
    ``TF_CPU_ALLOCATOR_USE_BFC=true`` set before TensorFlow starts. Use
    :meth:`unavailable` to ask first.
    """

    kind = "tensorflow"
    source = "TensorFlow allocator peak"

    def __init__(self, device: str = "CPU:0") -> None:
        super().__init__()
        self.device = device

    @staticmethod
    def unavailable(device: str) -> str | None:
        """Why the allocator keeps no statistics for ``device`` (``None`` when it does)."""
        import tensorflow as tf

        try:
            tf.config.experimental.get_memory_info(device)
        except Exception as error:  # noqa: BLE001 - TF raises ValueError/NotFoundError by version
            return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else error}"
        return None

    def reset(self) -> None:
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats(self.device)

    def read(self) -> PeakReading:
        import tensorflow as tf

        info = tf.config.experimental.get_memory_info(self.device)
        return PeakReading(kind=self.kind, peak_bytes=int(info["peak"]), current_bytes=int(info["current"]))

    def capacity(self) -> tuple[int, int]:
        if self.device.upper().startswith("GPU"):
            import tensorflow as tf

            details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
            total = int(details.get("memory_limit", 0) or 0)
            if total:
                return total, total - int(tf.config.experimental.get_memory_info(self.device)["current"])
        return devices.cpu_capacity()


class JaxMeter(Meter):
    """A JAX device's ``memory_stats()`` (GPU, TPU), read honestly.

    ``peak_bytes_in_use`` is process-wide and cannot be reset: it keeps the peak
    of XLA's compile-time autotuning and of earlier models in the process. An
    interval's reading is therefore that peak only when it rose during the
    interval and no compilation can have set it (every interval after the first
    of a run). Otherwise it is the largest ``bytes_in_use`` sampled, a floor
    (``exact=False``). A background thread samples every
    ``sample_interval_s`` from :meth:`start` to :meth:`close`: XLA holds a
    step's temporary buffer for the whole step, so a sample taken while a step
    runs sees the step's peak, where samples between steps see only the state.

    The sampler stops by itself when nothing has called :meth:`sample`,
    :meth:`reset` or :meth:`read` for ``idle_stop_s`` (and four times the
    longest gap seen between such calls): a fit that raises never reaches the
    callback's ``on_train_end``, and its sampler must not poll the device for the
    rest of the process. The next :meth:`sample` starts it again.

    Args:
        device: A ``jax.Device`` with ``memory_stats()``.
        sample_interval_s: Seconds between background samples; ``None`` samples
            only at :meth:`sample` calls and interval ends.
        idle_stop_s: Seconds without a call from the training loop after which
            the sampler stops (at least; longer where steps are slower).
    """

    kind = "jax"
    source = "JAX peak_bytes_in_use"
    resettable = False

    def __init__(self, device: Any, sample_interval_s: float | None = 0.001, idle_stop_s: float = 300.0) -> None:
        super().__init__()
        self.device = device
        self.sample_interval_s = sample_interval_s
        self.idle_stop_s = idle_stop_s
        self.samples = 0
        self._start_peak = 0
        self._sampled = 0
        self._intervals = 0
        self._stop: Any = None
        self._running = False  # between start() and close(): the sampler should run
        self._last_call = 0.0
        self._longest_gap = 0.0

    def _stats(self) -> dict[str, int]:
        return dict(self.device.memory_stats() or {})

    def _heard_from_loop(self) -> None:
        """Notes a call from the training loop (the sampler's sign that training goes on)."""
        now = time.monotonic()
        if self._last_call:
            self._longest_gap = max(self._longest_gap, now - self._last_call)
        self._last_call = now

    def reset(self) -> None:
        self._heard_from_loop()
        stats = self._stats()
        self._start_peak = int(stats.get("peak_bytes_in_use", 0))
        self._sampled = int(stats.get("bytes_in_use", 0))
        self._intervals += 1

    def sample(self) -> None:
        self._heard_from_loop()
        if self._running and self._stop is None:
            self._start_sampler()  # it stopped while the loop was quiet (a long validation, a pause)
        self._sampled = max(self._sampled, int(self._stats().get("bytes_in_use", 0)))

    def start(self) -> None:
        self._last_call, self._longest_gap = 0.0, 0.0
        super().start()
        self._intervals = 0  # the baseline reading is no interval: the first epoch's, with its compilation, is
        self._running = True
        self._start_sampler()

    def _start_sampler(self) -> None:
        if self.sample_interval_s is None or self._stop is not None:
            return
        import threading

        self._stop = threading.Event()
        threading.Thread(
            target=self._sample_until_stopped, args=(self._stop,), daemon=True, name="nnmem-jax-sampler"
        ).start()

    def _sample_until_stopped(self, stop: Any) -> None:
        while not stop.wait(self.sample_interval_s):
            if time.monotonic() - self._last_call > max(self.idle_stop_s, 4 * self._longest_gap):
                break  # the loop has gone quiet (a fit that raised): stop polling the device
            try:
                used = int(self._stats().get("bytes_in_use", 0))
            except Exception:  # noqa: BLE001 - a device gone away ends the sampling, never the training
                break
            if used > self._sampled:
                self._sampled = used
            self.samples += 1
        if self._stop is stop:
            self._stop = None

    @property
    def sampling(self) -> bool:
        """Whether the background sampler is running now."""
        return self._stop is not None

    def close(self) -> None:
        self._running = False
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def read(self) -> PeakReading:
        self._heard_from_loop()
        stats = self._stats()
        current = int(stats.get("bytes_in_use", 0))
        peak = int(stats.get("peak_bytes_in_use", 0))
        self._sampled = max(self._sampled, current)
        # the first interval of a run holds the step's compilation (autotuning can set the process peak)
        if peak > self._start_peak and self._intervals > 1:
            return PeakReading(kind=self.kind, peak_bytes=peak, current_bytes=current)
        return PeakReading(kind=self.kind, peak_bytes=self._sampled, current_bytes=current, exact=False)

    def capacity(self) -> tuple[int, int]:
        stats = self._stats()
        total = int(stats.get("bytes_limit", 0))
        if total:
            return total, total - int(stats.get("bytes_in_use", 0))
        return devices.cpu_capacity()


@dataclasses.dataclass(frozen=True)
class MetricNames:
    """The metric names a meter's figures are logged under (Keras spelling; Lightning uses ``memory/...``).

    Attributes:
        predicted_peak: The estimate's peak at the training batch size.
        measured: What the meter measured (allocator peak, or RSS rise).
        predicted: The prediction of that same quantity.
        relative_error: ``(predicted - measured) / measured``: positive when the prediction is above the
            measurement (the benchmarks' sign).
        budget: The budget the plan used.
        predicted_tensor_peak: The estimate's tensor peak under its own name
            (beside an RSS rise it is not the compared prediction).
        measured_reserved, predicted_reserved: CUDA: the caching allocator's
            reserve (``max_memory_reserved``), measured and predicted.
        measured_device, predicted_device: CUDA: the device's used memory
            (``total - free``, with the context), measured and predicted.
    """

    predicted_peak: str
    measured: str
    predicted: str
    relative_error: str
    budget: str = "memory_budget_mib"
    predicted_tensor_peak: str = "memory_predicted_tensor_peak_mib"
    measured_reserved: str = "memory_measured_reserved_mib"
    predicted_reserved: str = "memory_predicted_reserved_mib"
    measured_device: str = "memory_measured_device_used_mib"
    predicted_device: str = "memory_predicted_device_mib"

    def for_lightning(self) -> "MetricNames":
        """The same names as Lightning logs them (``memory/...``)."""
        return MetricNames(*(name.replace("memory_", "memory/", 1) for name in dataclasses.astuple(self)))


_ALLOCATOR_NAMES = MetricNames(
    predicted_peak="memory_predicted_peak_mib",
    measured="memory_measured_peak_mib",
    predicted="memory_predicted_peak_mib",
    relative_error="memory_relative_error",
)
_RSS_NAMES = MetricNames(
    predicted_peak="memory_predicted_peak_mib",
    measured="memory_measured_rss_rise_mib",
    predicted="memory_predicted_rss_rise_mib",
    relative_error="memory_rss_rise_relative_error",
)


def metric_names(meter: Meter) -> MetricNames:
    """The names under which ``meter``'s figures are logged.

    Example:
        >>> metric_names(RssMeter()).relative_error
        'memory_rss_rise_relative_error'
        >>> metric_names(CudaMeter()).for_lightning().measured
        'memory/measured_peak_mib'
    """
    return _RSS_NAMES if meter.process_level else _ALLOCATOR_NAMES


def predicted_rss_rise(peak_bytes: int, resident_bytes: int) -> int:
    """The predicted rise of process RSS above its fit-start level.

    At fit start the process already holds what exists before the first step
    (parameters, buffers, optimizer state built eagerly): ``resident_bytes``.
    The training peak adds the rest.

    Example:
        >>> predicted_rss_rise(100, 30), predicted_rss_rise(10, 30)
        (70, 0)
    """
    return max(int(peak_bytes) - int(resident_bytes), 0)


#: How to get the TensorFlow allocator's own figures on CPU.
TF_PRECISE_HINT = (
    "set TF_CPU_ALLOCATOR_USE_BFC=true (or TF_ENABLE_ONEDNN_OPTS=1) in the environment before TensorFlow is imported"
)


def keras_meter(backend: str) -> tuple[Meter, str | None]:
    """The best meter for the active Keras backend, and a warning when it is only the fallback.

    * TensorFlow: the allocator's statistics for ``GPU:0`` or ``CPU:0``; on a
      CPU whose allocator keeps none, process RSS (and the warning says why and
      how to get the allocator's figure).
    * JAX: :class:`JaxMeter` where the device has ``memory_stats()``; process
      RSS on CPU (JAX keeps no CPU statistics; no warning, there is nothing
      better).
    * torch: :class:`CudaMeter` on a CUDA device, process RSS on CPU.

    Returns:
        ``(meter, warning or None)``.
    """
    if backend == "tensorflow":
        import tensorflow as tf

        device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
        reason = TensorFlowMeter.unavailable(device)
        if reason is None:
            return TensorFlowMeter(device), None
        return RssMeter(), (
            f"MemoryBudgetCallback cannot read TensorFlow's allocator peak on {device} ({reason}): on this host "
            f"TensorFlow's CPU allocator keeps no statistics. It measures the process RSS above its level at fit "
            f"start instead, logged as {_RSS_NAMES.measured} beside {_RSS_NAMES.predicted}. For the allocator's own "
            f"peak, {TF_PRECISE_HINT}."
        )
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if stats and "peak_bytes_in_use" in stats:
            return JaxMeter(device), None
        return RssMeter(), None
    if backend == "torch":
        try:
            from keras.src.backend.torch.core import get_device

            device = str(get_device())
        except Exception:  # noqa: BLE001 - private Keras API
            device = "cpu"
        if device.startswith("cuda"):
            return CudaMeter(device), None
    return RssMeter(), None


def torch_meter(device: Any) -> Meter:
    """The meter for a torch training device: :class:`CudaMeter` or :class:`RssMeter`.

    Example:
        >>> torch_meter("cpu").kind
        'rss'
    """
    return CudaMeter(device) if devices.device_type(device) == "cuda" else RssMeter()
