"""The environment of a Keras benchmark's worker process: TensorFlow's oneDNN mode, the host's record, a GPU worker's.

Example:
    >>> mode_environment("0")
    {'TF_ENABLE_ONEDNN_OPTS': '0', 'TF_CPU_ALLOCATOR_USE_BFC': 'true'}
    >>> mode_environment(None)
    {}
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["mode_environment", "host_fingerprint", "gpu_environment"]


def mode_environment(onednn: str | None) -> dict[str, str]:
    """The environment of a TensorFlow mode: oneDNN on or off, with allocator statistics either way."""
    if onednn is None:
        return {}
    env = {"TF_ENABLE_ONEDNN_OPTS": onednn}
    if onednn == "0":
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # without it TF's CPU allocator keeps no statistics
    return env


def host_fingerprint() -> dict[str, Any]:
    """What decides TensorFlow's CPU kernels and allocator here (recorded with every result)."""
    from nnmem_callbacks.probes.fingerprint import CPU_ENV_VARS, cpu_isa_extensions, cpu_model_name

    capped = {name: os.environ[name] for name in CPU_ENV_VARS if os.environ.get(name)}
    return {
        "cpu": cpu_model_name(),
        "isa": ",".join(cpu_isa_extensions()) or "unknown",
        "cpu_threads": os.cpu_count(),
        **capped,  # ONEDNN_MAX_CPU_ISA=AVX2 on an AVX-512 host runs oneDNN's AVX2 kernels
    }


def gpu_environment(backend: str, autotune_cache: str | None, part: str = "both") -> dict[str, str]:
    """The environment of a GPU worker: JAX allocates on demand, XLA's autotuning results shared by a case's processes.

    Processes of several cases share the GPU, so JAX must not preallocate most of it
    (``peak_bytes_in_use`` counts what is in use either way). XLA's autotuning results
    go to a per-case directory: the estimating process autotunes and writes them (XLA's
    per-fusion cache and a dump of all results), the measuring processes load its
    choices, so their compilation allocates no autotuning buffers and they run the
    kernels (and workspaces) the estimate was compiled with.
    """
    # JAX's default preallocates 75% of the GPU; a run that keeps it (with a smaller MEM_FRACTION per process) says so
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false")}
    if backend == "jax" and autotune_cache:
        flags = [os.environ.get("XLA_FLAGS", ""), f"--xla_gpu_per_fusion_autotune_cache_dir={autotune_cache}"]
        results = os.path.join(autotune_cache, "autotune_results.textproto")
        if part == "estimate":
            flags.append(f"--xla_gpu_dump_autotune_results_to={results}")
        elif os.path.exists(results):
            flags.append(f"--xla_gpu_load_autotune_results_from={results}")
        env["XLA_FLAGS"] = " ".join(f for f in flags if f)
    return env
