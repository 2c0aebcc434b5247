"""CPU: the tensor peak of one sampled optimizer step per epoch, the figure the estimate predicts.

On CPU no allocator keeps statistics, and process RSS does not measure what the
estimate predicts: it holds the interpreter, the libraries and their caches,
and memory freed by the allocator often stays resident, so its rise above the
fit-start level swings from run to run (the same CNN +5% on its first run,
+88% to +119% on later ones; a second ``fit`` in one process rose 2.7 MiB
against 347.9 MiB predicted). The Lightning callback therefore samples the
first two optimizer steps of each epoch (see :class:`SampledStep` for why two)
with an :class:`~nnmem_callbacks.probes.runner.AllocationRecorder` (the PyTorch
profiler's allocation events, as the CPU benchmarks measure their truth): the
live tensor bytes at the step's start (parameters, buffers, gradients,
optimizer state, the batch) plus the peak rise of the running sum of the
allocations. The RSS rise stays beside it, logged under its own names.

**Cost**: two steps per epoch run under the profiler. :attr:`SampledStep.seconds`
is their wall time per step, which the callback records beside the mean time
of an unsampled step (``sampled_step_seconds`` and ``step_seconds`` in each row
of ``callback.measurements``).

Known limitations:
    * An epoch after the first with a single optimizer step is not sampled.
    * When another profiler runs (the user's, Lightning's ``profiler="pytorch"``)
      nothing is sampled: :attr:`SampledStep.unavailable` says why, and the
      callback compares the RSS rise only.
    * Memory that bypasses PyTorch's CPU allocator (oneDNN's own caches and
      scratchpads, thread stacks, the Python heap) is not seen; the benchmarks'
      truth does not see it either.
    * Tensors live at the step's start that are neither the module's, the
      optimizers' nor the batch's, and that the step frees, read low by their
      size (Lightning's logged values from the previous step: bytes).

Example:
    >>> import torch
    >>> step = SampledStep()
    >>> step.arm(first_epoch=False)
    >>> weight = torch.zeros(1024)
    >>> for activation_bytes in (8192, 16384):  # two steps; the second is measured
    ...     step.begin(lambda: 4096)  # what is live at the step's start
    ...     activation = torch.zeros(activation_bytes // 4)
    ...     del activation
    ...     step.batch_done()
    >>> step.peak_bytes
    20480
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping

from nnmem_callbacks.monitoring.meters import Meter, PeakReading

__all__ = ["batch_tensors", "SampledStep", "step_tensors", "TensorPeakMeter"]


class TensorPeakMeter(Meter):
    """The meter of a sampled step's tensor peak: compared with the estimate's peak itself (not a process figure).

    It reads what :class:`SampledStep` measured; it is what
    :func:`~nnmem_callbacks.monitoring.epoch_comparison.compare_epoch` needs to
    name and log the figure.
    """

    kind = "tensors"
    source = "tensor peak of a sampled optimizer step (PyTorch profiler allocation events)"
    resettable = False

    def __init__(self, peak_bytes: int = 0) -> None:
        super().__init__()
        self.peak_bytes = int(peak_bytes)

    def read(self) -> PeakReading:
        return PeakReading(kind=self.kind, peak_bytes=self.peak_bytes, current_bytes=0)


class SampledStep:
    """Samples the first two optimizer steps of an epoch under an allocation recorder.

    Call :meth:`arm` at the start of an epoch, :meth:`begin` at the start of each
    micro-batch and :meth:`batch_done` at its end; after two optimizer steps
    (``2 * accumulate_grad_batches`` micro-batches) the recording stops and
    :attr:`peak_bytes` holds the figure. :meth:`stop` ends a recording the epoch
    cut short.

    Why two steps: PyTorch's CPU allocator does not report the free of a block
    allocated before the profiler started (the previous step's gradients,
    freed by ``zero_grad``), so a step is measured exactly only when the
    recording began a step earlier. The second step is that step; the first
    counts only in the first epoch of a fit, where it is the very first step
    (nothing from an earlier step is live) and where the optimizer creates its
    state. The figure is the live tensor bytes at the step's start plus the
    step's peak rise above them.

    Attributes:
        peak_bytes: The sampled tensor peak (``None`` before one, or when the
            epoch ended before a second optimizer step after the first epoch).
        seconds: The wall time of the sampled steps, under the profiler, per step.
        unavailable: Why nothing can be sampled (another profiler runs), or ``None``.
        said: Whether the adapter has told the user :attr:`unavailable` (it says it once).
    """

    def __init__(self, recorder_factory: Callable[[], Any] | None = None) -> None:
        self._factory = recorder_factory
        self._recorder: Any = None
        self._armed = False
        self._first_steps = False
        self._micro_batches = 0
        self._accumulate = 1
        self._live: list[int] = []
        self._started = 0.0
        self.peak_bytes: int | None = None
        self.seconds: float | None = None
        self.unavailable: str | None = None
        self.said = False

    @property
    def recording(self) -> bool:
        """Whether steps are being recorded now."""
        return self._recorder is not None

    def arm(self, *, first_epoch: bool = False) -> None:
        """Samples the next steps that begin; ``first_epoch``: they are the fit's first steps."""
        self._armed = self.unavailable is None
        self._first_steps = bool(first_epoch)
        self.peak_bytes = self.seconds = None

    def begin(self, live_bytes: Callable[[], int], accumulate_grad_batches: int = 1) -> None:
        """A micro-batch begins; ``live_bytes()`` says what is live now (called only at a sampled step's start)."""
        if self.recording:
            if self._micro_batches == self._accumulate:  # the second optimizer step begins
                self._recorder.mark()
                self._live.append(int(live_bytes()))
            return
        if not self._armed:
            return
        from nnmem_callbacks.probes.runner import AllocationRecorder, ProfilerBusy

        self._armed = False
        recorder = self._factory() if self._factory is not None else AllocationRecorder()
        self._live = [int(live_bytes())]
        try:
            recorder.start()
        except ProfilerBusy as error:
            self.unavailable = f"another profiler is running ({str(error).strip() or 'ProfilerBusy'})"
            return
        self._recorder, self._micro_batches, self._started = recorder, 0, time.perf_counter()
        self._accumulate = max(int(accumulate_grad_batches), 1)

    def batch_done(self) -> None:
        """A micro-batch ended; the recording stops after two optimizer steps."""
        if not self.recording:
            return
        self._micro_batches += 1
        if self._micro_batches >= 2 * self._accumulate:
            self.stop()

    def stop(self) -> int | None:
        """Stops a recording (if any) and returns the sampled tensor peak (``None`` when there is none)."""
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            return self.peak_bytes
        recorder.stop()
        steps = max(self._micro_batches / self._accumulate, 1)
        self.seconds = (time.perf_counter() - self._started) / steps
        windows = list(recorder.window_peaks)
        peaks = [live + rise for live, rise in zip(self._live, windows)]
        if len(peaks) > 1:
            self.peak_bytes = max(peaks) if self._first_steps else peaks[1]
        elif self._first_steps and peaks:
            self.peak_bytes = peaks[0]
        return self.peak_bytes


def batch_tensors(batch: Any) -> list[Any]:
    """The tensors of a (nested) batch; a mapping that is not a ``dict`` (``BatchEncoding``) is read as one."""
    from torch.utils._pytree import tree_flatten

    if isinstance(batch, Mapping) and not isinstance(batch, dict):
        batch = dict(batch)
    return [t for t in tree_flatten(batch)[0] if hasattr(t, "untyped_storage")]


def step_tensors(module: Any, optimizers: Iterable[Any] = (), batch: Any = None) -> list[Any]:
    """What an optimizer step starts with: the module's parameters, buffers and gradients, the optimizers' state and
    the batch (what :meth:`SampledStep.begin`'s ``live_bytes`` counts, through
    :func:`~nnmem_callbacks.probes.runner.live_tensor_bytes`)."""
    from torch.utils._pytree import tree_flatten

    tensors: list[Any] = list(module.parameters()) + list(module.buffers())
    tensors += [p.grad for p in module.parameters() if p.grad is not None]
    for optimizer in optimizers:
        for state in getattr(optimizer, "state", {}).values():
            tensors += tree_flatten(state)[0] if isinstance(state, dict) else []
    if batch is not None:
        tensors += batch_tensors(batch)
    return tensors
