"""What every napkin formula shares: the precision and optimizer tables, argument checks, and the assembly
of a step's parts into phase lines and a :class:`~nnmem_callbacks.core.estimate.MemoryEstimate`.

How the parts are counted: ``docs/napkin.md``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from nnmem_callbacks.core import vocabulary
from nnmem_callbacks.core.estimate import Category, MemoryEstimate, PhaseLine
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.hardware import cuda_tables
from nnmem_callbacks.hardware import gpus as gpu_table

__all__ = [
    "ACTIVATIONS",
    "ARCHITECTURES",
    "assemble",
    "ATTENTION",
    "base_notes",
    "check_choice",
    "check_device",
    "check_optimizer",
    "check_positive",
    "check_precision",
    "common_parts",
    "COMPUTE_BYTES",
    "cuda_capability",
    "CUDA_OVERHEAD_BYTES",
    "cuda_overhead_bytes",
    "CUDA_WORKSPACE_BYTES",
    "cuda_workspace_bytes",
    "input_bytes",
    "OPTIMIZER_STATE",
    "OPTIMIZER_TEMP",
    "PARAM_BYTES",
    "PRECISION_ALIASES",
    "PRECISIONS",
    "RECOMPUTE",
    "static_parts",
    "StepParts",
]


#: Precisions in Lightning's spelling (:data:`nnmem_callbacks.core.vocabulary.PRECISIONS`).
PRECISIONS = vocabulary.PRECISIONS

PARAM_BYTES = {"32-true": 4, "16-mixed": 4, "bf16-mixed": 4, "16-true": 2, "bf16-true": 2, "64-true": 8}
COMPUTE_BYTES = {"32-true": 4, "16-mixed": 2, "bf16-mixed": 2, "16-true": 2, "bf16-true": 2, "64-true": 8}

#: Optimizer state per parameter, in multiples of the parameter's size.
OPTIMIZER_STATE = {
    "sgd": 0,
    "sgd_momentum": 1,
    "momentum": 1,
    "adagrad": 1,
    "rmsprop": 1,
    "adam": 2,
    "adamw": 2,
    "adamax": 2,
    "adadelta": 2,
    "nadam": 2,
    "radam": 2,
    "rprop": 2,  # prev and step_size
}

# Temporaries of optimizer.step(): (foreach on CUDA: multiples of all parameters,
# single-tensor on CPU: multiples of the largest parameter).
OPTIMIZER_TEMP = {
    "sgd": (0, 0),
    "sgd_momentum": (0, 1),
    "momentum": (0, 1),
    "adagrad": (1, 2),
    "rmsprop": (1, 2),
    "adam": (1, 2),
    "adamw": (1, 2),
    "adamax": (2, 2),
    "adadelta": (2, 2),
    "nadam": (2, 2),
    "radam": (2, 2),
    "rprop": (2, 3),
}

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("eager", "flash")
ARCHITECTURES = ("gpt", "bert")
ACTIVATIONS = ("gelu", "gelu_new")

#: Accepted spellings besides :data:`PRECISIONS` (:data:`nnmem_callbacks.core.vocabulary.PRECISION_ALIASES`).
PRECISION_ALIASES = vocabulary.PRECISION_ALIASES


def cuda_overhead_bytes(capability: tuple[int, int] | None = None) -> int:
    """What a CUDA device shows beyond the allocator when no GPU is at hand to measure it: the CUDA context and the
    libraries a run with GEMMs loads, the figure the PyTorch estimator takes for such a run on a GPU of
    ``capability`` (default: :data:`~nnmem_callbacks.hardware.cuda_tables.DEFAULT_CAPABILITY`, Hopper), from
    :data:`nnmem_callbacks.hardware.cuda_tables.CONTEXT_TABLE` (the napkin's models are GEMMs only).

    Example:
        >>> cuda_overhead_bytes() == CUDA_OVERHEAD_BYTES == cuda_tables.CONTEXT_TABLE[(9, 13)].gemm
        True
    """
    return cuda_tables.context_figures(capability or cuda_tables.DEFAULT_CAPABILITY)[0].gemm


def cuda_workspace_bytes(capability: tuple[int, int] | None = None) -> int:
    """The cuBLAS workspaces a training step allocates on a GPU of ``capability`` (default Hopper): one for the
    forward's thread, one for autograd's (:func:`nnmem_callbacks.hardware.cuda_tables.cublas_workspace_bytes`,
    which reads ``CUBLAS_WORKSPACE_CONFIG``), counted as ``workspaces`` as the PyTorch estimator counts them.

    Example:
        >>> cuda_workspace_bytes((9, 0)) // 2**20, cuda_workspace_bytes((8, 0)) == 2 * (4096 * 1024 * 2 + 16 * 1024 * 8)
        (64, True)
    """
    return 2 * cuda_tables.cublas_workspace_bytes(capability or cuda_tables.DEFAULT_CAPABILITY)


#: :func:`cuda_overhead_bytes` of the default GPU (Hopper): what a CUDA target that names no GPU gets.
CUDA_OVERHEAD_BYTES = cuda_overhead_bytes()
#: :func:`cuda_workspace_bytes` of the default GPU (Hopper): what a CUDA target that names no GPU gets.
CUDA_WORKSPACE_BYTES = cuda_workspace_bytes()


# -- validation ----------------------------------------------------------------
def check_precision(precision: str) -> str:
    """Validates a precision name: :func:`nnmem_callbacks.core.vocabulary.canonical_precision`.

    Raises:
        ValueError: Naming the valid precisions (and, for ``"fp16"`` or
            ``"bfloat16"``, the two things the name could mean).

    Example:
        >>> check_precision("bf16-mixed"), check_precision("bf16"), check_precision("fp32")
        ('bf16-mixed', 'bf16-mixed', '32-true')
        >>> check_precision("fp16")
        Traceback (most recent call last):
        ...
        ValueError: precision 'fp16' is ambiguous; write 16-mixed (AMP: fp32 parameters, fp16 compute) or 16-true (everything fp16)
    """
    return vocabulary.canonical_precision(precision)


def check_optimizer(optimizer: str) -> str:
    """Validates an optimizer name: :func:`nnmem_callbacks.core.vocabulary.canonical_optimizer`.

    Example:
        >>> check_optimizer("AdamW"), check_optimizer("momentum")
        ('adamw', 'sgd_momentum')
    """
    return vocabulary.canonical_optimizer(optimizer)


def check_positive(name: str, value: Any, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value}")
    return value


def check_choice(name: str, value: str, valid: Sequence[str]) -> str:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")
    return value


def check_device(device: str) -> str:
    """Validates a device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, or a CUDA GPU or architecture by name
    (``"cuda:a100-80gb"``, ``"cuda:sm80"``, or a GPU of :data:`nnmem_callbacks.hardware.gpus.GPUS` alone,
    ``"a100-80gb"``, returned as ``"cuda:a100-80gb"``), as the PyTorch estimator reads its device.

    A named GPU sizes the CUDA libraries (cuBLAS workspaces, context) for its architecture
    (:func:`cuda_capability`); ``"cuda"`` and ``"cuda:N"`` assume Hopper.

    Raises:
        ValueError: Naming the valid devices (and, for ``"cuda:<name>"``, the valid names).

    Example:
        >>> check_device("cuda"), check_device("a100-80gb"), check_device("cuda:sm75")
        ('cuda', 'cuda:a100-80gb', 'cuda:sm75')
        >>> check_device("tpu")
        Traceback (most recent call last):
        ...
        ValueError: device must be 'cpu', 'cuda', 'cuda:N' or a CUDA GPU by name ('a100-80gb', 'cuda:a100-80gb', 'cuda:sm80'), got 'tpu'
    """
    text = str(device).strip()
    kind, _, rest = text.partition(":")
    if kind.lower() == "cpu":
        return text.lower()
    if kind.lower() == "cuda":
        if not rest.strip() or rest.strip().isdigit():
            return text.lower()
        try:
            gpu_table.find_arch(rest.strip())
        except ValueError as error:
            raise ValueError(f"device {device!r}: {error}") from None
        return f"cuda:{rest.strip()}"
    if gpu_table.is_gpu_name(text):
        return f"cuda:{text}"
    raise ValueError(
        "device must be 'cpu', 'cuda', 'cuda:N' or a CUDA GPU by name ('a100-80gb', 'cuda:a100-80gb', 'cuda:sm80'), "
        f"got {device!r}"
    )


def cuda_capability(device: str) -> tuple[int, int] | None:
    """The compute capability a checked device names (``"cuda:a100-80gb"``: ``(8, 0)``), else ``None``.

    Example:
        >>> cuda_capability("cuda:t4"), cuda_capability("cuda"), cuda_capability("cuda:1"), cuda_capability("cpu")
        ((7, 5), None, None, None)
    """
    kind, _, rest = device.partition(":")
    if kind != "cuda" or not rest or rest.isdigit():
        return None
    return gpu_table.find_arch(rest).capability


# -- assembling phases ---------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StepParts:
    """Fixed bytes and bytes per sample of one training step, before phasing."""

    params: int
    grads: int
    state: int
    copies: int  # autocast weight copies (fixed, alive from forward into backward)
    opt_temp: int
    inputs: int  # per sample
    acts: int  # per sample, saved for backward at the end of forward
    fwd_temp: int = 0  # per sample, momentary at the end of forward
    bwd_temp: int = 0  # per sample, at the start of backward
    bwd_end_acts: int = 0  # per sample, still alive when the last gradient appears
    extra_phases: tuple[tuple[str, int, int, int, int, int], ...] = ()  # (name, grads, copies, acts, temp, temp_ps)


def assemble(
    parts: StepParts,
    batch_size: int,
    *,
    method: str,
    precision: str,
    device: str,
    notes: Sequence[str],
    extra: Mapping[str, Any],
) -> MemoryEstimate:
    p, g, s, c, t = parts.params, parts.grads, parts.state, parts.copies, parts.opt_temp
    rows: list[tuple[str, dict[str, int], dict[str, int]]] = [
        # (phase, fixed bytes per category, per-sample bytes per category)
        (
            "step2/forward",
            {"parameters": p, "optimizer_state": s, "temporaries": c},
            {"inputs": parts.inputs, "activations": parts.acts, "temporaries": parts.fwd_temp},
        ),
        (
            "step2/backward",
            {"parameters": p, "optimizer_state": s, "temporaries": c},
            {"inputs": parts.inputs, "activations": parts.acts, "temporaries": parts.bwd_temp},
        ),
    ]
    for name, grads, copies, acts, temp_fixed, temp_ps in parts.extra_phases:
        rows.append(
            (
                name,
                {"parameters": p, "optimizer_state": s, "gradients": grads, "temporaries": copies + temp_fixed},
                {"inputs": parts.inputs, "activations": acts, "temporaries": temp_ps},
            )
        )
    rows += [
        (
            "step2/backward_end",
            {"parameters": p, "optimizer_state": s, "gradients": g},
            {"inputs": parts.inputs, "activations": parts.bwd_end_acts},
        ),
        (
            "step2/optimizer",
            {"parameters": p, "optimizer_state": s, "gradients": g, "temporaries": t},
            {"inputs": parts.inputs},
        ),
    ]
    on_cuda = device.startswith("cuda")
    capability = cuda_capability(device) if on_cuda else None
    workspaces = cuda_workspace_bytes(capability) if on_cuda else 0
    overhead = cuda_overhead_bytes(capability) if on_cuda else 0
    if on_cuda:  # the cuBLAS workspaces live from the first GEMM to the end of the process
        rows = [(name, {**fixed, "workspaces": workspaces}, per_sample) for name, fixed, per_sample in rows]
        notes, extra = _cuda_record(capability, workspaces, overhead, notes, extra)
    phases = []
    breakdowns: dict[str, dict[str, int]] = {}
    for name, fixed, per_sample in rows:
        phases.append(PhaseLine(name, sum(fixed.values()), sum(per_sample.values())))
        cats = {str(cat): 0 for cat in Category}
        for key, value in fixed.items():
            cats[key] += value
        for key, value in per_sample.items():
            cats[key] += value * batch_size
        breakdowns[name] = cats
    peak_line = max(phases, key=lambda line: line.at(batch_size))
    return MemoryEstimate(
        peak_bytes=peak_line.at(batch_size),
        breakdown=breakdowns[peak_line.phase],
        batch_size=batch_size,
        phases=tuple(phases),
        peak_phase=peak_line.phase,
        reserved_bytes=None,
        overhead_bytes=overhead,
        device=device,
        precision=precision,
        method=method,
        notes=tuple(notes),
        phase_breakdowns=breakdowns,
        extra=dict(extra),
    )


def _cuda_record(
    capability: tuple[int, int] | None, workspaces: int, overhead: int, notes: Sequence[str], extra: Mapping[str, Any]
) -> tuple[list[str], dict[str, Any]]:
    """The notes and ``extra["cuda_libraries"]`` of a CUDA napkin estimate.

    The record is the PyTorch estimator's (:func:`nnmem_callbacks.hardware.cuda_tables.for_capability` re-sizes
    the workspaces and the context from it for another card); ``context_run`` says the context is the table's.
    """
    named = capability is not None
    capability = capability or cuda_tables.DEFAULT_CAPABILITY
    figures, _ = cuda_tables.context_figures(capability)
    record = {
        "capability": list(capability),
        "source": "napkin: cuBLAS workspace and context tables",
        "cublas_bytes": workspaces // 2,
        "cublas_workspaces": 2,
        "cublaslt_bytes": 0,
        "cublaslt_workspaces": 0,
        "context_run": {"gemm": True, "cudnn": False},
        "cuda_major": None,
    }
    notes = list(notes)
    if named:
        arch = gpu_table.cuda_arch(capability)
        family = any(key[0] == capability[0] for key in cuda_tables.CONTEXT_TABLE)
        notes.append(
            f"CUDA libraries for {arch.label}: two cuBLAS workspaces of {format_bytes(workspaces // 2)}; context and "
            f"libraries {format_bytes(overhead)}, measured on {figures.source}"
            + ("" if family else f" (no {arch.name} stack measured: the nearest)")
        )
    return notes, {**extra, "cuda_libraries": record}


def common_parts(optimizer: str, precision: str, device: str, params: int, largest_param: int, matmul_params: int):
    optimizer = check_optimizer(optimizer)
    precision = check_precision(precision)
    device = check_device(device)
    pb = PARAM_BYTES[precision]
    mixed = precision.endswith("-mixed")
    foreach_mult, single_mult = OPTIMIZER_TEMP[optimizer]
    if device.startswith("cuda"):
        opt_temp = foreach_mult * params * pb
    else:
        opt_temp = single_mult * largest_param * pb
    return dict(
        optimizer=optimizer,
        precision=precision,
        device=device,
        params=params * pb,
        grads=params * pb,
        state=OPTIMIZER_STATE[optimizer] * params * pb,
        copies=2 * matmul_params if mixed else 0,
        opt_temp=opt_temp,
    )


def static_parts(common: dict) -> dict[str, int]:
    """The parameter-side fields of :class:`StepParts` from :func:`common_parts`'s result."""
    return {key: common[key] for key in ("params", "grads", "state", "copies", "opt_temp")}


def input_bytes(precision: str) -> int:
    """Bytes of one float input element: fp32 unless the whole model is half or double."""
    return {"16-true": 2, "bf16-true": 2, "64-true": 8}.get(precision, 4)


def base_notes(kind: str, precision: str, optimizer: str) -> list[str]:
    notes = [
        f"napkin:{kind}: closed-form formula, not a trace; the allocator reserve is not modelled",
    ]
    if precision.endswith("-mixed"):
        notes.append(
            "mixed precision: parameters, gradients and optimizer state stay fp32 (the master weights); "
            "autocast adds 16-bit copies of matmul weights (temporaries)"
        )
    if OPTIMIZER_STATE[optimizer]:
        notes.append(f"{optimizer}: {OPTIMIZER_STATE[optimizer]}x the parameters of optimizer state")
    return notes
