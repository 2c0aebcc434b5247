"""Device capacity and measured memory peaks, per runtime.

Adapters ask this module two questions: how much memory does the training
device have (and how much is free now), and what was the peak use over an
interval (an epoch, or one phase of a step)?

* **CUDA** (through torch, imported lazily): capacity and free memory from
  ``torch.cuda.mem_get_info``; peaks from ``max_memory_allocated`` and
  ``max_memory_reserved`` after ``reset_peak_memory_stats``; device-level use
  (allocator plus CUDA context and other processes) from ``mem_get_info``.
* **CPU** (through psutil and Linux ``/proc``): capacity and available memory
  from ``psutil.virtual_memory()``; the process's peak resident set size from
  ``VmHWM`` in ``/proc/self/status``, which writing ``5`` to
  ``/proc/self/clear_refs`` resets. Where ``clear_refs`` is not writable (not
  Linux, some containers) the peak is the largest RSS sampled at the interval
  boundaries, and :attr:`PeakMeter.exact` is ``False``.

Nothing here imports torch at module import time.

Example:
    >>> meter = PeakMeter("cpu")
    >>> meter.reset()
    >>> block = bytearray(8 * 1024 * 1024)  # touch 8 MiB
    >>> peak = meter.read()
    >>> peak.peak_bytes >= peak.current_bytes > 0
    True
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

_STATUS_PATH = "/proc/self/status"
_CLEAR_REFS_PATH = "/proc/self/clear_refs"


def device_type(device: Any) -> str:
    """``"cuda"``, ``"cpu"``, ``"mps"``... for a ``torch.device``, a string or ``None`` (cpu).

    Example:
        >>> device_type("cuda:1"), device_type(None)
        ('cuda', 'cpu')
    """
    if device is None:
        return "cpu"
    kind = getattr(device, "type", None)
    if kind is not None:
        return str(kind)
    return str(device).split(":", 1)[0]


def _cuda_index(device: Any) -> int | None:
    index = getattr(device, "index", None)
    if index is None and isinstance(device, str) and ":" in device:
        index = int(device.split(":", 1)[1])
    return index


# -- CPU / process memory ----------------------------------------------------
def read_status_bytes(field: str, path: str = _STATUS_PATH) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmHWM``, ``VmRSS``) in bytes, or ``None``.

    Example:
        >>> value = read_status_bytes("VmRSS")
        >>> value is None or value > 0
        True
    """
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    parts = line.split()
                    return int(parts[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_rss_peak(path: str = _CLEAR_REFS_PATH) -> bool:
    """Resets the process's peak RSS (``VmHWM``) by writing ``5`` to ``clear_refs``.

    Returns:
        ``True`` when the reset worked, ``False`` where the file is missing or
        not writable (then ``VmHWM`` keeps the peak since process start).
    """
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def current_rss() -> int:
    """The process's resident set size now, in bytes (psutil; ``/proc`` fallback)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # pragma: no cover - psutil is a dependency
        return read_status_bytes("VmRSS") or 0


def cpu_capacity() -> tuple[int, int]:
    """``(total, available)`` host memory in bytes."""
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.total), int(memory.available)


# -- CUDA --------------------------------------------------------------------
def cuda_capacity(device: Any = None) -> tuple[int, int]:
    """``(total, free)`` bytes of a CUDA device, from ``torch.cuda.mem_get_info``."""
    import torch

    free, total = torch.cuda.mem_get_info(_cuda_index(device) if device is not None else None)
    return int(total), int(free)


def device_capacity(device: Any) -> tuple[int, int]:
    """``(capacity, free)`` bytes of the training device.

    CUDA devices report the card; every other device reports host memory
    (CPU training uses host RAM; for MPS, unified memory is host memory).

    Example:
        >>> total, free = device_capacity("cpu")
        >>> total >= free > 0
        True
    """
    if device_type(device) == "cuda":
        return cuda_capacity(device)
    return cpu_capacity()


@dataclasses.dataclass(frozen=True)
class PeakReading:
    """Memory figures measured over one interval, all in bytes.

    Attributes:
        kind: ``"cuda"`` or ``"cpu"``.
        peak_bytes: CUDA: ``max_memory_allocated`` (live tensors); CPU: the
            process's peak RSS.
        reserved_bytes: CUDA: ``max_memory_reserved``; ``None`` on CPU.
        device_used_bytes: CUDA: used memory of the whole device now
            (``total - free``, includes the context); ``None`` on CPU.
        current_bytes: CUDA: ``memory_allocated`` now; CPU: RSS now.
        exact: ``False`` when the peak could only be sampled (CPU without a
            writable ``clear_refs``).
    """

    kind: str
    peak_bytes: int
    reserved_bytes: int | None = None
    device_used_bytes: int | None = None
    current_bytes: int = 0
    exact: bool = True


class PeakMeter:
    """Measures the peak memory of the training device over intervals.

    Call :meth:`reset` at the start of an interval and :meth:`read` at its end.
    :meth:`sample` may be called in between; it only matters on CPU without
    ``clear_refs``, where the peak is the largest sampled RSS.

    Args:
        device: The training device (``torch.device`` or string).
    """

    def __init__(self, device: Any = "cpu") -> None:
        self.device = device
        self.kind = "cuda" if device_type(device) == "cuda" else "cpu"
        self.exact = True
        self._sampled = 0

    def reset(self) -> None:
        """Starts a new interval."""
        if self.kind == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
            return
        self.exact = reset_rss_peak()
        self._sampled = current_rss()

    def sample(self) -> None:
        """Records the current use (CPU fallback without ``clear_refs``)."""
        if self.kind == "cpu" and not self.exact:
            self._sampled = max(self._sampled, current_rss())

    def read(self) -> PeakReading:
        """The peak since the last :meth:`reset`."""
        if self.kind == "cuda":
            import torch

            total, free = cuda_capacity(self.device)
            return PeakReading(
                kind="cuda",
                peak_bytes=int(torch.cuda.max_memory_allocated(self.device)),
                reserved_bytes=int(torch.cuda.max_memory_reserved(self.device)),
                device_used_bytes=int(total - free),
                current_bytes=int(torch.cuda.memory_allocated(self.device)),
            )
        rss = current_rss()
        if self.exact:
            hwm = read_status_bytes("VmHWM")
            if hwm is not None:
                return PeakReading(kind="cpu", peak_bytes=max(hwm, rss), current_bytes=rss)
        self._sampled = max(self._sampled, rss)
        return PeakReading(kind="cpu", peak_bytes=self._sampled, current_bytes=rss, exact=False)


def is_out_of_memory(exception: BaseException) -> str | None:
    """Classifies an exception as an out-of-memory error.

    Returns:
        ``"cuda"`` for a CUDA OOM, ``"cpu"`` for a host OOM, ``None`` otherwise.

    Example:
        >>> is_out_of_memory(MemoryError()), is_out_of_memory(ValueError("x"))
        ('cpu', None)
        >>> is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        'cuda'
    """
    name = type(exception).__name__
    text = str(exception)
    if name == "OutOfMemoryError" or "CUDA out of memory" in text or "CUDA error: out of memory" in text:
        return "cuda"
    if isinstance(exception, MemoryError):
        return "cpu"
    lowered = text.lower()
    if isinstance(exception, RuntimeError) and (
        "can't allocate memory" in lowered
        or "not enough memory" in lowered
        or "defaultcpuallocator" in lowered
    ):
        return "cpu"
    if "out of memory" in lowered:
        return "cuda" if "cuda" in lowered or "hip" in lowered else "cpu"
    return None


def clear_refs_writable() -> bool:
    """Whether per-interval CPU peaks are exact here (``/proc/self/clear_refs`` writable)."""
    return os.access(_CLEAR_REFS_PATH, os.W_OK)
