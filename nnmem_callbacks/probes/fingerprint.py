"""The fingerprint of what decides which kernel (and so which workspace) runs.

A probe's result is only valid on a machine where the same kernels run: the
same torch and oneDNN builds, the same instruction set, the same reduced
precision support, the same thread count. :func:`fingerprint` collects those
for a device type; :func:`fingerprint_hash` names the cache file.

Fingerprints are built per device type (:data:`FINGERPRINTS`): ``cpu`` and
``cuda`` (GPU name, capability, CUDA and cuDNN versions, ``cudnn.benchmark``).

Example:
    >>> fp = fingerprint("cpu")
    >>> fp["device_type"], "cpu_capability" in fp, len(fingerprint_hash(fp))
    ('cpu', True, 16)
    >>> fingerprint_hash(fp) == fingerprint_hash(dict(fp))
    True
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
from typing import Any, Callable

__all__ = [
    "CPU_ENV_VARS",
    "cpu_fingerprint",
    "cpu_isa_extensions",
    "cpu_model_name",
    "cuda_fingerprint",
    "describe",
    "fingerprint",
    "fingerprint_hash",
    "FINGERPRINTS",
    "ISA_EXTENSIONS",
    "onednn_version",
]


#: environment variables that select the CPU kernel path
CPU_ENV_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "ONEDNN_DEFAULT_FPMATH_MODE")


@functools.lru_cache(maxsize=None)
def onednn_version() -> str | None:
    """oneDNN's version and git hash as torch's build config reports them.

    torch exposes no attribute for it; ``torch._C._show_config()`` has a line
    ``Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71...)``.

    Example:
        >>> version = onednn_version()
        >>> version is None or version[0].isdigit()
        True
    """
    import torch  # imported on use: the cache and the TensorFlow probes need no torch

    try:
        config = torch._C._show_config()
    except Exception:  # noqa: BLE001 - a build without it
        return None
    match = re.search(r"(?:MKL-DNN|oneDNN)\s+v([0-9][0-9.]*)(?:\s*\(Git Hash\s+([0-9a-f]+)\))?", config)
    if match is None:
        return None
    return match.group(1) + (f"+{match.group(2)[:12]}" if match.group(2) else "")


@functools.lru_cache(maxsize=None)
def cpu_model_name() -> str:
    """The CPU model name (``/proc/cpuinfo``, else :func:`platform.processor`)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: Instruction-set extensions that decide CPU kernel paths (oneDNN's ISA, bf16 and AMX kernels).
ISA_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=None)
def cpu_isa_extensions() -> tuple[str, ...]:
    """Which of :data:`ISA_EXTENSIONS` the CPU reports (``/proc/cpuinfo`` flags; empty where unreadable).

    Example:
        >>> set(cpu_isa_extensions()) <= set(ISA_EXTENSIONS)
        True
    """
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            line = next((line for line in handle if line.startswith("flags")), "")
            flags = set(line.split(":", 1)[1].split()) if ":" in line else set()
    except OSError:  # pragma: no cover - not Linux
        pass
    return tuple(name for name in ISA_EXTENSIONS if name in flags)


def _mkldnn_supports(name: str) -> bool | None:
    import torch  # imported on use: the cache and the TensorFlow probes need no torch

    check = getattr(torch.ops.mkldnn, name, None)
    if check is None:
        return None
    try:
        return bool(check())
    except Exception:  # noqa: BLE001
        return None


def cpu_fingerprint() -> dict[str, Any]:
    """What decides the CPU kernel paths in this process."""
    import torch  # imported on use: the cache and the TensorFlow probes need no torch

    return {
        "device_type": "cpu",
        "torch": torch.__version__,
        "onednn": onednn_version(),
        "mkldnn_enabled": bool(torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_bf16": _mkldnn_supports("_is_mkldnn_bf16_supported"),
        "mkldnn_fp16": _mkldnn_supports("_is_mkldnn_fp16_supported"),
        "env": {name: os.environ.get(name) for name in CPU_ENV_VARS},
        "threads": torch.get_num_threads(),
        "cpu": cpu_model_name(),
        "machine": platform.machine(),
    }


def cuda_fingerprint(index: int | None = None) -> dict[str, Any]:
    """What decides the CUDA kernel paths (device ``index``, default current)."""
    import torch  # imported on use: the cache and the TensorFlow probes need no torch

    available = torch.cuda.is_available()
    fp: dict[str, Any] = {
        "device_type": "cuda",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if available else None,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }
    if available:
        index = torch.cuda.current_device() if index is None else index
        fp["gpu"] = torch.cuda.get_device_name(index)
        fp["capability"] = list(torch.cuda.get_device_capability(index))
    return fp


#: device type -> fingerprint builder
FINGERPRINTS: dict[str, Callable[[], dict[str, Any]]] = {"cpu": cpu_fingerprint, "cuda": cuda_fingerprint}


def fingerprint(device_type: str = "cpu") -> dict[str, Any]:
    """The fingerprint of a device type's kernels (``{"device_type": t}`` for others)."""
    import torch  # imported on use: the cache and the TensorFlow probes need no torch

    builder = FINGERPRINTS.get(device_type)
    return builder() if builder is not None else {"device_type": device_type, "torch": torch.__version__}


def fingerprint_hash(fp: dict[str, Any]) -> str:
    """A short stable hash of a fingerprint (16 hex digits)."""
    text = json.dumps(fp, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def describe(fp: dict[str, Any]) -> str:
    """One line naming a fingerprint's fields.

    Example:
        >>> describe({"device_type": "cpu", "torch": "2.4", "env": {"A": None}})
        'device_type=cpu, torch=2.4, env={}'
    """
    parts = []
    for name, value in fp.items():
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if v is not None}
        parts.append(f"{name}={value}")
    return ", ".join(parts)
