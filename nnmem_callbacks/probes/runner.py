"""Runs a real kernel under the PyTorch profiler and measures its allocations.

:func:`kernel_peak` is the measurement: the peak of the running sum of the
allocation (and free) events the profiler records while the call runs, which
includes the call's outputs (:class:`AllocationRecorder` records the same
between two points of a program; :func:`live_tensor_bytes` is the level it
rises above). :func:`real_tensor` builds a real tensor (zeros)
with a fake tensor's dtype, stride order and a chosen shape; :func:`run_probe`
runs one op on such tensors with the CPU RNG state saved and restored and
autocast off.

Example:
    >>> import torch
    >>> out, peak = kernel_peak(lambda: torch.zeros(256, dtype=torch.float32))
    >>> out.shape, peak
    (torch.Size([256]), 1024)
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

__all__ = [
    "AllocationRecorder",
    "dense_strides",
    "is_unsupported",
    "isolated",
    "kernel_peak",
    "live_tensor_bytes",
    "native_stderr_silenced",
    "ProfilerBusy",
    "real_tensor",
    "release_freed_memory",
    "UNSUPPORTED_MESSAGES",
    "UnsupportedKernelError",
]


class UnsupportedKernelError(RuntimeError):
    """The real device cannot run one of the step's kernels.

    Raised when a probe of the real kernel fails (for example oneDNN cannot
    create a bf16 LSTM primitive on a CPU without bf16 support): the real
    training step would fail the same way, so no estimate is given.
    """

    def __init__(self, op: str, dtype: Any, device: str, reason: str) -> None:
        self.op, self.dtype, self.device, self.reason = op, dtype, device, reason
        super().__init__(
            f"{op} in {str(dtype).replace('torch.', '')} cannot run on this {device} ({reason}); "
            f"the real training step would fail the same way. Run that layer in fp32 (e.g. autocast "
            f"disabled around it) or use precision='32-true'"
        )


#: substrings of the RuntimeError messages that mean "this kernel does not exist here"
UNSUPPORTED_MESSAGES = (
    "could not create a primitive",
    "primitive descriptor",
    "not implemented for",
    "is not supported",
    "unsupported",
)


def is_unsupported(error: BaseException) -> bool:
    """Whether a kernel's error says the kernel cannot run on this device.

    Example:
        >>> is_unsupported(RuntimeError("could not create a primitive descriptor for the LSTM forward"))
        True
        >>> is_unsupported(RuntimeError("size mismatch"))
        False
    """
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(message in text for message in UNSUPPORTED_MESSAGES)


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Silences the profiler's native start/stop lines (Kineto writes them to fd 2)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (embedded interpreters)
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


class ProfilerBusy(RuntimeError):
    """Another profiler (the user's) is running: nothing can be measured."""


class AllocationRecorder:
    """Records the CPU allocator's allocation and free events between :meth:`start` and :meth:`stop`.

    The figure is the peak of the running sum of the events in time order
    (frees are negative): how far the live tensor bytes rose above their level
    at :meth:`start`. The measurement the benchmarks' CPU truth and
    :func:`kernel_peak` use; the Lightning callback samples training steps with
    it. :meth:`mark` splits the recording into windows, each with its own peak
    rise above its own start (:attr:`window_peaks`).

    PyTorch's CPU allocator reports the free of a block only when the block was
    allocated while memory profiling was on: a block allocated before
    :meth:`start` and freed after it is not subtracted. Measure a window that
    begins after such blocks were allocated (a :meth:`mark` one step in).

    Example:
        >>> recorder = AllocationRecorder()
        >>> recorder.start()
        >>> block = torch.zeros(1024)  # 4 KiB; freed again, the peak stays
        >>> del block
        >>> recorder.mark()
        >>> block = torch.zeros(512)
        >>> recorder.stop(), recorder.window_peaks
        (4096, [4096, 2048])
    """

    #: The name of the profiler annotation :meth:`mark` records.
    MARK = "nnmem::window"

    def __init__(self) -> None:
        self._session: Any = None
        self.window_peaks: list[int] = []

    @property
    def running(self) -> bool:
        """Whether the recorder is recording now."""
        return self._session is not None

    def start(self) -> None:
        """Starts recording.

        Raises:
            ProfilerBusy: Another profiler (the user's) is running.
        """
        from torch.profiler import ProfilerActivity, profile

        if torch.autograd.profiler._is_profiler_enabled:  # a second session's stop would end the user's
            raise ProfilerBusy("a profiler is already running")
        session = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with native_stderr_silenced():
            try:
                session.__enter__()
            except RuntimeError as error:  # a profiler is already running (the user's)
                raise ProfilerBusy(str(error)) from error
        self._session, self.window_peaks = session, []

    def mark(self) -> None:
        """Begins a new window here."""
        from torch.profiler import record_function

        with record_function(self.MARK):
            pass

    def stop(self) -> int:
        """Stops recording; returns the peak rise of the live tensor bytes since :meth:`start`.

        :attr:`window_peaks` then holds each window's peak rise above the live
        bytes at the window's start.
        """
        from torch._C._profiler import _EventType

        session, self._session = self._session, None
        if session is None:
            raise RuntimeError("AllocationRecorder.stop() without start()")
        with native_stderr_silenced():
            session.__exit__(None, None, None)
        events, marks = [], []
        stack = list(session.profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            if node.tag == _EventType.Allocation:
                events.append((node.start_time_ns, node.extra_fields.alloc_size))
            elif node.name == self.MARK:
                marks.append(node.start_time_ns)
            stack.extend(node.children)
        marks.sort()
        windows = [0] * (len(marks) + 1)
        running = peak = base = window = 0
        for time_ns, size in sorted(events):
            while window < len(marks) and marks[window] <= time_ns:
                window, base = window + 1, running
            running += size
            peak = max(peak, running)
            windows[window] = max(windows[window], running - base)
        self.window_peaks = windows
        return peak


def kernel_peak(call: Callable[[], Any], *, strict: bool = False) -> tuple[Any, int]:
    """Runs ``call`` under the profiler; returns its result and the peak of its allocations.

    The peak is that of the running sum of the allocation events (frees are
    negative) in time order, so it includes the outputs the call returns
    (:class:`AllocationRecorder`). When a profiler is already running, the
    call runs unmeasured and the peak is 0 (or :class:`ProfilerBusy` is raised
    with ``strict``). Errors of the call itself propagate.
    """
    recorder = AllocationRecorder()
    try:
        recorder.start()
    except ProfilerBusy:
        if strict:
            raise
        return call(), 0
    try:
        result = call()
    finally:
        peak = recorder.stop()
    return result, peak


def live_tensor_bytes(tensors: Iterable[Any], device_type: str = "cpu") -> int:
    """Bytes of the unique storages behind ``tensors`` on ``device_type`` (tied weights and views count once).

    Example:
        >>> weight = torch.zeros(256)
        >>> live_tensor_bytes([weight, weight[:10], torch.zeros(2, device="meta")])
        1024
    """
    seen: dict[int, int] = {}
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != device_type:
            continue
        storage = tensor.untyped_storage()
        if storage.data_ptr() == 0:  # empty storage
            continue
        seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(seen.values())


def dense_strides(shape: Sequence[int], like_stride: Sequence[int]) -> tuple[int, ...]:
    """Dense strides for ``shape`` in the memory order of ``like_stride``.

    Dims with stride 0 (broadcast) keep stride 0.

    Example:
        >>> dense_strides((2, 3, 4, 5), (60, 1, 15, 3))  # channels_last
        (60, 1, 15, 3)
        >>> dense_strides((8, 3, 4, 5), (60, 1, 15, 3))
        (60, 1, 15, 3)
        >>> dense_strides((4, 6), (1, 4))  # transposed
        (1, 4)
        >>> dense_strides((4, 6), (0, 1))
        (0, 1)
    """
    order = sorted(range(len(shape)), key=lambda d: (like_stride[d], -d))  # innermost first
    strides = [0] * len(shape)
    step = 1
    for dim in order:
        if like_stride[dim] == 0 and len(shape) > 1:
            continue
        strides[dim] = step
        step *= max(int(shape[dim]), 1)
    return tuple(strides)


def real_tensor(like: torch.Tensor, shape: Sequence[int] | None = None, device: str = "cpu") -> torch.Tensor:
    """Zeros with ``like``'s dtype and stride order (and ``shape``, default its own)."""
    shape = tuple(int(s) for s in (like.shape if shape is None else shape))
    strides = dense_strides(shape, tuple(int(s) for s in like.stride()))
    tensor = torch.empty_strided(shape, strides, dtype=like.dtype, device=device)
    return tensor.zero_()


def release_freed_memory() -> bool:
    """Hands the C heap's free pages back to the system (glibc's ``malloc_trim``); ``False`` where there is none.

    A probe's real tensors are freed when it ends, but glibc keeps freed heap pages (and, once a large block
    has been freed, serves blocks up to 32 MiB from the heap rather than from fresh mappings), so a run of
    probes at growing sizes would raise the process's resident memory by the sum of their sizes rather than
    the largest one.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; ``None`` off Linux and on C libraries without it (musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Real (not fake) tensors, autocast off, and the CPU RNG state restored after."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    rng = torch.random.get_rng_state()
    try:
        with unset_fake_temporarily(), torch.autocast("cpu", enabled=False), torch.no_grad():
            yield
    finally:
        torch.random.set_rng_state(rng)
