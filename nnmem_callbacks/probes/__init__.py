"""Kernel probes: measure the real kernels' workspaces on this machine, once.

Per-op workspace formulas fitted on one machine's kernels are wrong on
another (another instruction set, another oneDNN, bf16 support or not). The
probes run each distinct op of the traced step for real at a few small batch
multiples under the profiler, fit the bytes against the batch, and keep the
points in an on-disk cache keyed by the kernel fingerprint.

Modules:
    * :mod:`~nnmem_callbacks.probes.fingerprint`: what decides the kernel path.
    * :mod:`~nnmem_callbacks.probes.cache`: the on-disk cache.
    * :mod:`~nnmem_callbacks.probes.runner`: real tensors, the profiler measurement.
    * :mod:`~nnmem_callbacks.probes.fit`: piecewise-linear curves through probed points.
    * :mod:`~nnmem_callbacks.probes.batch_dims`: which dims grow with the batch, per op.
    * :mod:`~nnmem_callbacks.probes.session`: one estimate's probes, settings and notes.
"""

from typing import Any

from nnmem_callbacks.probes.cache import ProbeCache, cache_dir
from nnmem_callbacks.probes.fingerprint import fingerprint, fingerprint_hash
from nnmem_callbacks.probes.fit import Curve

#: Names imported on first use: they need torch, which the TensorFlow probes and the cache do not.
_TORCH_NAMES = {
    "UnsupportedKernelError": "runner",
    "kernel_peak": "runner",
    "ProbeSession": "session",
    "ProbeSettings": "session",
    "current_session": "session",
    "kernel_probes": "session",
    "probe_batch": "session",
}


def __getattr__(name: str) -> Any:
    module = _TORCH_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'nnmem_callbacks.probes' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"nnmem_callbacks.probes.{module}"), name)


__all__ = [
    "Curve",
    "ProbeCache",
    "ProbeSession",
    "ProbeSettings",
    "UnsupportedKernelError",
    "cache_dir",
    "current_session",
    "fingerprint",
    "fingerprint_hash",
    "kernel_peak",
    "kernel_probes",
    "probe_batch",
]
