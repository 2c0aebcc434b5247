"""What CUDA libraries take from the device, as PyTorch sets them up: sizes and tables.

cuBLAS/cuBLASLt workspace sizes (as ``CublasHandlePool.cpp`` chooses them), the CUDA context and loaded libraries by
GPU family and CUDA major version, and cuDNN convolution workspaces measured on one stack; every number in the tables
names its source. Framework-free (no torch import): every function takes the facts it needs (compute capability,
CUDA version, environment) as arguments, so it serves an estimate made without a GPU; the torch side
(:mod:`nnmem_callbacks.estimators.torch.cuda.libraries`) fills them in from the live device when there is one.

Design: docs/cuda-model.md, sections 2 to 4.

Example:
    >>> cublas_workspace_bytes((9, 0), env={}) // 2**20
    32
    >>> cublas_workspace_bytes((8, 0), env={}) == 4096 * 1024 * 2 + 16 * 1024 * 8
    True
    >>> cublas_workspace_bytes((8, 0), env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}) // 2**20
    32
    >>> blas_workspaces_per_thread((9, 0), env={})
    (33554432,)
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from nnmem_callbacks.core.estimate import MemoryEstimate

__all__ = [
    "blas_workspaces_per_thread",
    "check_env",
    "context_figures",
    "CONTEXT_TABLE",
    "ContextFigures",
    "conv_workspace_rule",
    "CONV_WORKSPACE_TABLE",
    "ConvWorkspaceRule",
    "CUBLAS_32MIB_MAJORS",
    "CUBLAS_LARGE_DEFAULT",
    "CUBLAS_SMALL_DEFAULT",
    "cublas_workspace_bytes",
    "CUBLASLT_DEFAULT_KIB",
    "cublaslt_unified",
    "cublaslt_workspace_bytes",
    "DEFAULT_CAPABILITY",
    "for_capability",
    "MiB",
]

MiB = 2**20

#: CublasHandlePool.cpp: ``/* :4096:2:16:8 default, 32MiB for Hopper and Blackwell */``.
#: pytorch main (2026) gives 32 MiB to compute capability majors 9, 10, 11 and 12;
#: releases up to about 2.10 gave it to sm_90 only (``properties->major == 9 &&
#: properties->minor == 0``). Both agree for Hopper, the default target.
CUBLAS_32MIB_MAJORS = (9, 10, 11, 12)
CUBLAS_LARGE_DEFAULT = 4096 * 8 * 1024
CUBLAS_SMALL_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8

#: ``parseCUDABlasLtWorkspaceSize``: ``size_t workspace_size = 1024; /* default size in KiB according to #73328 */``.
CUBLASLT_DEFAULT_KIB = 1024

#: The compute capability assumed when no device can be asked (H100, Hopper).
DEFAULT_CAPABILITY = (9, 0)

_CONFIG_PAIR = re.compile(r":([0-9]+):([0-9]+)")


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def check_env(value: str | None) -> bool | None:
    """Reads a boolean environment value the way ``c10::utils::check_env`` does.

    Example:
        >>> check_env("1"), check_env("OFF"), check_env(None), check_env("maybe")
        (True, False, None, None)
    """
    if value is None:
        return None
    text = value.strip().upper()
    if text in ("1", "ON", "YES", "TRUE", "Y"):
        return True
    if text in ("0", "OFF", "NO", "FALSE", "N"):
        return False
    return None


def cublas_workspace_bytes(
    capability: tuple[int, int] = DEFAULT_CAPABILITY, env: Mapping[str, str] | None = None
) -> int:
    """The workspace PyTorch allocates per cuBLAS handle and stream.

    ``CUBLAS_WORKSPACE_CONFIG`` is a list of ``:SIZE_KiB:COUNT`` pairs; the
    workspace is the sum of ``SIZE * 1024 * COUNT``. A value without any pair
    falls back to the default, as PyTorch does (with a warning).

    Args:
        capability: The GPU's compute capability ``(major, minor)``.
        env: The environment to read (default: ``os.environ``).

    Example:
        >>> cublas_workspace_bytes((10, 0), env={})
        33554432
        >>> cublas_workspace_bytes((9, 0), env={"CUBLAS_WORKSPACE_CONFIG": ":16:8"})
        131072
    """
    default = CUBLAS_LARGE_DEFAULT if capability[0] in CUBLAS_32MIB_MAJORS else CUBLAS_SMALL_DEFAULT
    config = _env(env).get("CUBLAS_WORKSPACE_CONFIG")
    if config is None:
        return default
    pairs = _CONFIG_PAIR.findall(config)
    if not pairs:
        return default
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def cublaslt_unified(env: Mapping[str, str] | None = None) -> bool:
    """Whether cuBLASLt shares the cuBLAS workspace of its handle and stream.

    ``TORCH_CUBLASLT_UNIFIED_WORKSPACE`` unset or true: shared (the default of
    open-source CUDA builds, per ``getCUDABlasLtWorkspaceSize`` and the
    ``torch.backends.cuda.blas_workspace_size`` docstring of torch 2.13);
    false: cuBLASLt keeps its own workspace per (handle, stream).

    Example:
        >>> cublaslt_unified({}), cublaslt_unified({"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"})
        (True, False)
    """
    return check_env(_env(env).get("TORCH_CUBLASLT_UNIFIED_WORKSPACE")) is not False


def cublaslt_workspace_bytes(
    capability: tuple[int, int] = DEFAULT_CAPABILITY, env: Mapping[str, str] | None = None
) -> int:
    """The cuBLASLt workspace size (``CUBLASLT_WORKSPACE_SIZE`` in KiB, default 1 MiB).

    When unified, it is capped at the cuBLAS workspace size.

    Example:
        >>> cublaslt_workspace_bytes((9, 0), env={"CUBLASLT_WORKSPACE_SIZE": "4096"}) // 1024
        4096
        >>> cublaslt_workspace_bytes((9, 0), env={"CUBLASLT_WORKSPACE_SIZE": "x"}) // 1024
        1024
    """
    environment = _env(env)
    kib = CUBLASLT_DEFAULT_KIB
    raw = environment.get("CUBLASLT_WORKSPACE_SIZE")
    if raw is not None:
        try:
            kib = int(raw.strip())
        except ValueError:
            kib = CUBLASLT_DEFAULT_KIB
    size = kib * 1024
    if cublaslt_unified(environment):
        size = min(size, cublas_workspace_bytes(capability, environment))
    return size


def blas_workspaces_per_thread(
    capability: tuple[int, int] = DEFAULT_CAPABILITY,
    env: Mapping[str, str] | None = None,
    *,
    uses_lt: bool = False,
    cublas_bytes: int | None = None,
    cublaslt_bytes: int | None = None,
) -> tuple[int, ...]:
    """The allocations a thread's first GEMMs leave in the allocator, in order.

    One cuBLAS workspace; with a non-unified cuBLASLt (and an op that goes
    through cuBLASLt, ``uses_lt``), a second, separate one.

    Args:
        capability: The compute capability.
        env: The environment (default ``os.environ``).
        uses_lt: Whether the thread runs a cuBLASLt GEMM (``addmm`` with a bias
            epilogue, ``_scaled_mm``).
        cublas_bytes: The cuBLAS size read from the running torch, if known.
        cublaslt_bytes: The cuBLASLt size read from the running torch, if known.

    Example:
        >>> blas_workspaces_per_thread((9, 0), {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"}, uses_lt=True)
        (33554432, 1048576)
    """
    environment = _env(env)
    cublas = cublas_workspace_bytes(capability, environment) if cublas_bytes is None else cublas_bytes
    sizes = [cublas]
    if uses_lt and not cublaslt_unified(environment):
        sizes.append(cublaslt_workspace_bytes(capability, environment) if cublaslt_bytes is None else cublaslt_bytes)
    return tuple(sizes)


# ---------------------------------------------------------------------------
# CUDA context and libraries
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ContextFigures:
    """Device memory outside the caching allocator, measured on one stack.

    Each figure is ``total - free - memory_reserved`` at the end of two
    training steps in a fresh process (``after_init``: right after
    ``torch.cuda.init()``). Which libraries a run loads decides which applies.

    Attributes:
        after_init: The CUDA context alone.
        gemm: A run with GEMMs (cuBLAS handles on the user's and autograd's threads) and no cuDNN.
        cudnn: A run with cuDNN layers (convolution, batch norm) and no GEMM.
        gemm_and_cudnn: A run with both.
        source: Where the numbers come from.
    """

    after_init: int
    gemm: int
    cudnn: int
    gemm_and_cudnn: int
    source: str

    def for_run(self, gemm: bool, cudnn: bool) -> int:
        """The figure for a run that uses GEMMs and/or cuDNN.

        Example:
            >>> CONTEXT_TABLE[(9, 13)].for_run(gemm=True, cudnn=False) // 2**20
            750
        """
        if gemm and cudnn:
            return self.gemm_and_cudnn
        if gemm:
            return self.gemm
        if cudnn:
            return self.cudnn
        return self.after_init


#: (compute capability major, CUDA major) -> figures. Only measured stacks are listed.
CONTEXT_TABLE: dict[tuple[int, int], ContextFigures] = {
    (9, 13): ContextFigures(
        # cuda_facts.json after_init: device_used
        after_init=552_402_944,
        # zoo_cuda.json measured_overhead of the first (fresh-process) combination: mlp (GEMM only),
        # unet (convolutions and batch norm, no GEMM), bn_cnn (both; equal to cuda_facts.json
        # after_conv_bwd: device_used 1,015,873,536 - reserved 211,812,352)
        gemm=787_283_968,
        cudnn=669_843_456,
        gemm_and_cudnn=804_061_184,
        source="H100 80GB HBM3, torch 2.11.0+cu130, cuDNN 9.19, driver 580 "
        "(gpu-runs/2026-11-23-h100: cuda_facts.json, zoo_cuda.json)",
    ),
}


def context_figures(
    capability: tuple[int, int] = DEFAULT_CAPABILITY, cuda_major: int | None = None
) -> tuple[ContextFigures, bool]:
    """The context figures for a GPU family and CUDA major version.

    Returns:
        The figures and whether they are for exactly that (family, CUDA major);
        when not, the nearest entry (same family, else the newest measured
        stack) is returned and the caller should say so.

    Example:
        >>> figures, exact = context_figures((9, 0), 13)
        >>> exact, figures.after_init
        (True, 552402944)
        >>> context_figures((8, 0), 12)[1]
        False
    """
    if cuda_major is not None and (capability[0], cuda_major) in CONTEXT_TABLE:
        return CONTEXT_TABLE[(capability[0], cuda_major)], True
    same_family = sorted(key for key in CONTEXT_TABLE if key[0] == capability[0])
    key = same_family[-1] if same_family else max(CONTEXT_TABLE)
    return CONTEXT_TABLE[key], False


# ---------------------------------------------------------------------------
# cuDNN convolution workspaces
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ConvWorkspaceRule:
    """A convolution workspace as bytes of the op's own tensors.

    ``workspace = input_factor * input_bytes + weight_factor * weight_bytes + constant``.

    Attributes:
        source: The measurement behind it.
    """

    input_factor: float
    weight_factor: float
    constant: int
    source: str

    def bytes_for(self, input_bytes: int, weight_bytes: int) -> int:
        """The workspace for a call with these tensor sizes."""
        return int(self.input_factor * input_bytes + self.weight_factor * weight_bytes + self.constant)


#: (compute capability major, "float32" | "reduced", direction) -> rule, where direction is
#: "forward", "backward". Absent entries are not modelled (an estimate notes it).
#:
#: float32 forward: cuda_facts.json measured the first 64->64 3x3 conv on a 32x64x56x56 fp32 input:
#: the peak rose 25,838,080 B beyond the output = input 25,690,112 + weight 147,456 + 512, what
#: converting the NCHW input and weight to another layout for TF32 tensor cores
#: (``torch.backends.cudnn.allow_tf32`` defaults to True) would take. One measurement: the rule is
#: that stack's behaviour for that layer, not a cuDNN law. Check against zoo_cuda.json (unet, fp32, SGD,
#: fresh process): with the rule the traced step1/forward peak is 37.83 MiB, without it 36.33 MiB, measured
#: 37.37 MiB: at that peak the rule adds 1.50 MiB where the device needed about 1.04 MiB.
#: bn_cnn's forward peak (measured 100.91 MiB, traced 99.89 MiB) is not at a convolution.
#: reduced (bf16/fp16) forward and backward: 0. In zoo_cuda.md, the bf16-mixed conv nets (bn_cnn,
#: unet) were 0.7% and 1.8-1.9% under the measured peak with no workspace modelled, against
#: 59-70% and 11% under in fp32.
#: float32 backward: not listed. bn_cnn (fp32, batch 64) measured about 104 MiB above the trace at
#: its backward peak, unet about 5 MiB; no rule of the layers' own sizes explains both (bn_cnn's
#: largest conv input is 8 MiB), so it is left to the GPU probe.
CONV_WORKSPACE_TABLE: dict[tuple[int, str, str], ConvWorkspaceRule] = {
    (9, "float32", "forward"): ConvWorkspaceRule(
        1.0, 1.0, 512, "H100, torch 2.11 + cuDNN 9.19 (cuda_facts.json conv_fwd_peak_extra)"
    ),
    (9, "reduced", "forward"): ConvWorkspaceRule(
        0.0, 0.0, 0, "H100 zoo bf16-mixed bn_cnn/unet within 2% (zoo_cuda.md)"
    ),
    (9, "reduced", "backward"): ConvWorkspaceRule(
        0.0, 0.0, 0, "H100 zoo bf16-mixed bn_cnn/unet within 2% (zoo_cuda.md)"
    ),
}


def conv_workspace_rule(capability: tuple[int, int], dtype_name: str, direction: str) -> ConvWorkspaceRule | None:
    """The table's rule for a convolution, or ``None`` when not modelled.

    Args:
        capability: The compute capability (only its major is looked up).
        dtype_name: ``"float32"``, ``"bfloat16"``, ``"float16"`` (others: ``None``).
        direction: ``"forward"`` or ``"backward"``.

    Raises:
        ValueError: For another direction.

    Example:
        >>> conv_workspace_rule((9, 0), "float32", "forward").bytes_for(25_690_112, 147_456)
        25838080
        >>> conv_workspace_rule((9, 0), "float32", "backward") is None
        True
    """
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
    kind = "float32" if dtype_name == "float32" else "reduced" if dtype_name in ("bfloat16", "float16") else None
    if kind is None:
        return None
    return CONV_WORKSPACE_TABLE.get((capability[0], kind, direction))


# ---------------------------------------------------------------------------
# one estimate, another GPU
# ---------------------------------------------------------------------------


def for_capability(
    estimate: "MemoryEstimate", capability: tuple[int, int], env: Mapping[str, str] | None = None
) -> "MemoryEstimate":
    """``estimate`` with its cuBLAS workspaces (and a table's context) sized for a GPU of another compute capability.

    An estimate made without a GPU assumes one (``extra["cuda_libraries"]``
    records which, and how many workspaces the step allocates); a table of
    GPUs can re-size the fixed workspaces per card with this. Where the record
    also says that ``overhead_bytes`` came from :data:`CONTEXT_TABLE`
    (``context_run``: ``{"gemm": ..., "cudnn": ...}``, and ``cuda_major``), the
    overhead becomes that table's figure for ``capability``. The tensors and the
    cuDNN workspaces stay as estimated.

    Returns:
        A new estimate (the same one when it has no CUDA library record).

    Example:
        >>> from nnmem_callbacks.core.estimate import MemoryEstimate
        >>> est = MemoryEstimate(peak_bytes=64 * 2**20 + 100, breakdown={"workspaces": 64 * 2**20, "activations": 100},
        ...                      batch_size=1, extra={"cuda_libraries": {"cublas_workspaces": 2, "cublas_bytes": 32 * 2**20,
        ...                                                              "cublaslt_workspaces": 0, "cublaslt_bytes": 0}})
        >>> t4 = for_capability(est, (7, 5), env={})
        >>> t4.breakdown["workspaces"] == 2 * CUBLAS_SMALL_DEFAULT, t4.peak_bytes == 2 * CUBLAS_SMALL_DEFAULT + 100
        (True, True)
        >>> record = {**est.extra["cuda_libraries"], "context_run": {"gemm": True, "cudnn": False}}
        >>> est = dataclasses.replace(est, extra={"cuda_libraries": record}, overhead_bytes=1)
        >>> for_capability(est, (8, 0), env={}).overhead_bytes == context_figures((8, 0))[0].gemm
        True
    """
    record = dict(estimate.extra).get("cuda_libraries")
    if not record:
        return estimate
    environment = _env(env)
    old = (
        record["cublas_workspaces"] * record["cublas_bytes"] + record["cublaslt_workspaces"] * record["cublaslt_bytes"]
    )
    lt = 0 if cublaslt_unified(environment) else cublaslt_workspace_bytes(capability, environment)
    new = (
        record["cublas_workspaces"] * cublas_workspace_bytes(capability, environment)
        + record["cublaslt_workspaces"] * lt
    )
    delta = new - old
    overhead = estimate.overhead_bytes
    run = record.get("context_run")
    if run:
        overhead = context_figures(capability, record.get("cuda_major"))[0].for_run(
            bool(run["gemm"]), bool(run["cudnn"])
        )
    if not delta and overhead == estimate.overhead_bytes:
        return estimate
    breakdown = dict(estimate.breakdown)
    if delta:
        breakdown["workspaces"] = breakdown.get("workspaces", 0) + delta
    phase_breakdowns = {
        phase: {**values, "workspaces": values.get("workspaces", 0) + delta}
        if values.get("workspaces")
        else dict(values)
        for phase, values in estimate.phase_breakdowns.items()
    }
    phases = tuple(dataclasses.replace(line, fixed_bytes=line.fixed_bytes + delta) for line in estimate.phases)
    reserved = None if estimate.reserved_bytes is None else estimate.reserved_bytes + delta
    extra = {**estimate.extra, "cuda_libraries": {**record, "capability": list(capability)}}
    return dataclasses.replace(
        estimate,
        peak_bytes=estimate.peak_bytes + delta,
        breakdown=breakdown,
        phases=phases,
        phase_breakdowns=phase_breakdowns,
        reserved_bytes=reserved,
        overhead_bytes=overhead,
        extra=extra,
    )
