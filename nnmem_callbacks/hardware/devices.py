"""Device capacity and measured memory peaks, per runtime.

Adapters ask this module how much memory the training device has (and how
much is free now), and read the operating system's figures for the process.

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

The meters that read these figures during training live in
:mod:`nnmem_callbacks.monitoring.meters`. Nothing here imports torch at module import time.

Example:
    >>> total, free = cpu_capacity()
    >>> total >= free > 0 and current_rss() > 0
    True
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "clear_refs_writable",
    "cpu_capacity",
    "cuda_capacity",
    "current_rss",
    "device_capacity",
    "device_type",
    "read_status_bytes",
    "reset_rss_peak",
]

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


def clear_refs_writable() -> bool:
    """Whether per-interval CPU peaks are exact here (``/proc/self/clear_refs`` writable)."""
    return os.access(_CLEAR_REFS_PATH, os.W_OK)
