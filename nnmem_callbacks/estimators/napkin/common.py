"""What every napkin formula shares: the precision and optimizer tables, argument checks, and the assembly
of a step's parts into phase lines and a :class:`~nnmem_callbacks.core.estimate.MemoryEstimate`.

How the parts are counted: ``docs/napkin.md``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from nnmem_callbacks.core import vocabulary
from nnmem_callbacks.core.estimate import Category, MemoryEstimate, PhaseLine
from nnmem_callbacks.hardware import cuda_tables

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
    "CUDA_OVERHEAD_BYTES",
    "CUDA_WORKSPACE_BYTES",
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

#: What a CUDA device shows beyond the allocator when no GPU is at hand to measure it: the CUDA context and the
#: libraries a run with GEMMs loads, the figure the PyTorch estimator takes for such a run
#: (:data:`nnmem_callbacks.hardware.cuda_tables.CONTEXT_TABLE`; the napkin's models are GEMMs only).
CUDA_OVERHEAD_BYTES = cuda_tables.context_figures()[0].gemm
#: The cuBLAS workspaces a training step allocates on CUDA: one for the forward's thread, one for autograd's
#: (:func:`nnmem_callbacks.hardware.cuda_tables.cublas_workspace_bytes`), counted as ``workspaces`` as the PyTorch
#: estimator counts them.
CUDA_WORKSPACE_BYTES = 2 * cuda_tables.cublas_workspace_bytes()


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
    kind = str(device).split(":", 1)[0]
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return str(device)


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
    if device.startswith("cuda"):  # the cuBLAS workspaces live from the first GEMM to the end of the process
        rows = [(name, {**fixed, "workspaces": CUDA_WORKSPACE_BYTES}, per_sample) for name, fixed, per_sample in rows]
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
        overhead_bytes=CUDA_OVERHEAD_BYTES if device.startswith("cuda") else 0,
        device=device,
        precision=precision,
        method=method,
        notes=tuple(notes),
        phase_breakdowns=breakdowns,
        extra=dict(extra),
    )


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
