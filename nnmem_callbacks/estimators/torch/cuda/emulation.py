"""CUDA semantics on a CPU host: the one layer a CUDA target traced without a GPU goes through.

When the target is CUDA but no CUDA device is present, the step is traced with CPU kernels;
:func:`cuda_kernel_emulation` makes that trace keep the tensors CUDA would keep, for one
:class:`~nnmem_callbacks.hardware.gpus.CudaArch`: CUDA's autocast op lists, the attention backend CUDA would pick,
CUDA's 1-byte dropout masks, and the plug-ins of :data:`EMULATIONS` (cuDNN RNN, library workspaces). The
:class:`EmulationReport` says which tables were used and every way the result may differ from an estimate made on
the device (:meth:`EmulationReport.notes`).

Design: docs/cuda-model.md, "CUDA without a GPU".

Known limitations:
    * The Python kernels are registered process-wide while the context is
      active: another thread using CPU autocast or CPU attention meanwhile
      gets the CUDA behaviour too.
    * CUDA semantics are those of the torch installed here; the GPU's torch
      may differ (its version is not known offline).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, ContextManager, Iterator

import torch
import torch.nn.functional as F

from nnmem_callbacks.estimators.torch.cuda.autocast import cuda_autocast_on_cpu
from nnmem_callbacks.estimators.torch.cuda.sdpa_backends import SdpaCall, SdpaSwitches, select_backend
from nnmem_callbacks.hardware.gpus import DEFAULT_ARCH_CAPABILITY, CudaArch, cuda_arch

__all__ = [
    "EMULATIONS",
    "PARTS",
    "EmulationReport",
    "cuda_kernel_emulation",
    "emulation_parts",
    "register_emulation",
    "sdpa_call_of",
]


@dataclasses.dataclass
class EmulationReport:
    """What the emulation did during one estimate (shared by its traces).

    Attributes:
        arch: The architecture emulated.
        arch_named: Whether the user named it (a GPU or capability) or it was assumed.
        sdpa: Each distinct attention call -> the backend chosen for it.
        autocast_ops: Number of ops given CUDA autocast kernels (0: autocast not used).
        tables: Name -> what it covered, for every table an emulation used.
        extra_notes: Notes added by plug-ins (one line each, no duplicates).
    """

    arch: CudaArch
    arch_named: bool = False
    sdpa: dict[SdpaCall, str] = dataclasses.field(default_factory=dict)
    autocast_ops: int = 0
    autocast_used: bool = False
    tables: dict[str, str] = dataclasses.field(default_factory=dict)
    extra_notes: list[str] = dataclasses.field(default_factory=list)

    def add_note(self, note: str) -> None:
        if note not in self.extra_notes:
            self.extra_notes.append(note)

    def backend_counts(self) -> dict[str, int]:
        """Backend -> number of distinct attention calls (calls differing only in batch size count once)."""
        distinct = {
            (
                dataclasses.replace(
                    call, q_shape=call.q_shape[1:], k_shape=call.k_shape[1:], v_shape=call.v_shape[1:], mask_shape=None
                ),
                backend,
            )
            for call, backend in self.sdpa.items()
        }
        counts: dict[str, int] = {}
        for _, backend in distinct:
            counts[backend] = counts.get(backend, 0) + 1
        return counts

    def arch_sensitive_calls(self, other: CudaArch) -> list[SdpaCall]:
        """The recorded attention calls that would keep other tensors on ``other``.

        Flash, cuDNN and memory-efficient attention all keep the output and a
        per-row fp32 logsumexp (efficient pads it to 32 rows), so a switch
        between them changes nothing that matters; a switch to or from the math
        path (``Lq x Lk`` probabilities kept) does.
        """
        switches = SdpaSwitches.from_torch()
        return [
            call
            for call, backend in self.sdpa.items()
            if _MEMORY_CLASS[select_backend(call, other, switches)[0]] != _MEMORY_CLASS[backend]
        ]

    def uncovered_capabilities(self, capabilities) -> list[str]:
        """Of ``capabilities``, those ("8.6") where some recorded choice would differ from this estimate's."""
        result = []
        for capability in capabilities:
            other = cuda_arch(capability)
            if other.capability != self.arch.capability and self.arch_sensitive_calls(other):
                result.append(f"{capability[0]}.{capability[1]}")
        return result

    def summary(self) -> dict[str, Any]:
        """Plain values for ``MemoryEstimate.extra["cuda_emulation"]``.

        ``uncovered_capabilities`` lists the compute capabilities of the GPU
        table on which this estimate's kernel choices would differ (the "which
        GPU fits" table marks those cards).
        """
        from nnmem_callbacks.hardware.gpus import GPUS

        return {
            "arch": self.arch.label,
            "capability": f"{self.arch.major}.{self.arch.minor}",
            "arch_named": self.arch_named,
            "autocast_ops": self.autocast_ops if self.autocast_used else 0,
            "attention_backends": self.backend_counts(),
            "tables": dict(self.tables),
            "uncovered_capabilities": self.uncovered_capabilities(sorted({gpu.capability for gpu in GPUS})),
        }

    def notes(self, torch_version: str) -> list[str]:
        """The tables used, then every way the estimate may differ from one made on the device."""
        used = [f"CUDA kernels emulated on cpu for {self.arch.label}"]
        if self.autocast_used:
            used.append(f"autocast: CUDA op lists and casts read from torch {torch_version} ({self.autocast_ops} ops)")
        if self.sdpa:
            counts = ", ".join(f"{backend} x{n}" for backend, n in sorted(self.backend_counts().items()))
            used.append(f"attention backends as CUDA selects them: {counts}")
        used.extend(f"{name}: {what}" for name, what in self.tables.items())
        notes = ["; ".join(used)]
        differs: list[str] = []
        if self.sdpa and not self.arch_named:
            others = {cuda_arch(cap) for cap in ((8, 0), (8, 6), (7, 5)) if cap != self.arch.capability}
            changed = sorted({arch.label for arch in others if self.arch_sensitive_calls(arch)})
            if changed:
                differs.append(
                    f"no GPU named, {self.arch.label} assumed: attention would keep other tensors on "
                    f"{', '.join(changed)} (name the GPU, e.g. device='cuda:a100-80gb')"
                )
        differs.append("the CUDA context (device memory beyond the allocator) is assumed, not read from the driver")
        notes.append("may differ from an estimate made on the GPU: " + "; ".join(differs))
        notes.extend(self.extra_notes)
        return notes


_MEMORY_CLASS = {"flash": "fused", "cudnn": "fused", "efficient": "fused", "math": "math", "error": "error"}

#: Plug-ins: name -> factory ``(arch, report) -> context manager``, entered inside the emulation.
EMULATIONS: dict[str, Callable[[CudaArch, EmulationReport], ContextManager[Any]]] = {}


def register_emulation(name: str, factory: Callable[[CudaArch, EmulationReport], ContextManager[Any]]) -> None:
    """Adds a CUDA emulation plug-in (e.g. cuDNN RNN, library workspaces).

    Example:
        >>> import contextlib
        >>> register_emulation("example", lambda arch, report: contextlib.nullcontext())
        >>> "example" in EMULATIONS
        True
        >>> del EMULATIONS["example"]
    """
    EMULATIONS[name] = factory


def sdpa_call_of(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False) -> SdpaCall:
    """The :class:`SdpaCall` of real (or fake) tensors."""
    return SdpaCall(
        tuple(query.shape),
        tuple(key.shape),
        tuple(value.shape),
        str(query.dtype).replace("torch.", ""),
        None if attn_mask is None else str(attn_mask.dtype).replace("torch.", ""),
        None if attn_mask is None else tuple(attn_mask.shape),
        bool(attn_mask is not None and attn_mask.requires_grad),
        float(dropout_p),
        bool(is_causal),
        torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad),
        bool(enable_gqa),
        (query.stride(-1), key.stride(-1), value.stride(-1)) if query.dim() else (1, 1, 1),
        (query.storage_offset(), key.storage_offset(), value.storage_offset()),
    )


def _bool_to_additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """convert_boolean_attn_mask (attention.cpp): ``where(mask, 0, -inf)`` in the query dtype."""
    return torch.where(mask, 0.0, torch.scalar_tensor(-math.inf, dtype=dtype, device=mask.device))


def _aligned(tensor: torch.Tensor, alignment: int) -> bool:
    return all(tensor.stride(i) % alignment == 0 for i in range(tensor.dim() - 1)) and tensor.stride(-1) == 1


def _efficient_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """preprocess_mask (attention.cpp): pad the bias to 8 columns if misaligned, expand to (B, H, Lq, Lk)."""
    if not _aligned(mask, 8):
        last = mask.shape[-1]
        mask = F.pad(mask, (0, 8 - last % 8))[..., :last]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def _run_backend(backend: str, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """The CUDA composite of attention.cpp for one backend, on the trace's tensors."""
    aten = torch.ops.aten
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = _bool_to_additive(attn_mask, query.dtype)
    compute_lse = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    if backend == "flash":
        head_dim = query.shape[-1]
        scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
        if head_dim % 8:
            pad = 8 - head_dim % 8
            query, key, value = (F.pad(t, (0, pad)) for t in (query, key, value))
        output = aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)[
            0
        ]
        return output[..., :head_dim] if head_dim % 8 else output
    if backend == "efficient":
        if attn_mask is not None:
            attn_mask = _efficient_mask(attn_mask, query, key)
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, compute_lse, dropout_p, is_causal, scale=scale
        )[0]
    if backend == "cudnn":
        return aten._scaled_dot_product_cudnn_attention(
            query, key, value, attn_mask, compute_lse, dropout_p, is_causal, False, scale=scale
        )[0]
    return aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


@contextlib.contextmanager
def _cuda_sdpa(arch: CudaArch, report: EmulationReport) -> Iterator[None]:
    """``aten::scaled_dot_product_attention`` on CPU tensors picks and runs CUDA's backend."""

    def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        call = sdpa_call_of(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        # read at each call: the model may switch backends (torch.nn.attention.sdpa_kernel) in its forward
        backend, _ = select_backend(call, arch, SdpaSwitches.from_torch())
        if backend == "error":
            raise RuntimeError(
                "No available kernel. Aborting execution. (every scaled_dot_product_attention backend is disabled)"
            )
        report.sdpa.setdefault(call, backend)
        return _run_backend(backend, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    library = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - removed on exit
    try:
        library.impl("scaled_dot_product_attention", kernel, "AutogradCPU")
        yield
    finally:
        library._destroy()


@contextlib.contextmanager
def _cuda_dropout() -> Iterator[None]:
    """``aten::dropout`` (and ``F.dropout(inplace=True)``) keep CUDA's 1-byte mask."""
    original_dropout = F.dropout

    def aten_dropout(input, p, train):  # noqa: A002 - aten's signature
        # Dropout.cpp: the fused kernel when 0 < p < 1 and the input is not empty
        if train and 0.0 < p < 1.0 and input.numel() > 0:
            return torch.ops.aten.native_dropout.default(input, p, True)[0]
        if not train or p == 0.0 or input.numel() == 0:
            return input
        return input * torch.zeros((), dtype=input.dtype, device=input.device)

    def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002 - torch's signature
        if not inplace or not training or p == 0.0 or not input.is_floating_point():
            return original_dropout(input, p, training, inplace)
        return input.copy_(torch.ops.aten.native_dropout.default(input, p, True)[0])

    library = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - removed on exit
    library.impl("dropout", aten_dropout, "AutogradCPU")
    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = original_dropout
        library._destroy()


#: The built-in parts, all on by default; :func:`emulation_parts` turns some off (diagnosis only).
PARTS = ("dropout", "autocast", "sdpa")
_enabled_parts: tuple[str, ...] = PARTS


@contextlib.contextmanager
def emulation_parts(*parts: str) -> Iterator[None]:
    """Within the block, only ``parts`` of :data:`PARTS` are emulated (to show what each changes).

    Raises:
        ValueError: For a part not in :data:`PARTS`.
    """
    global _enabled_parts
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown emulation part(s) {sorted(unknown)}; valid: {', '.join(PARTS)}")
    previous, _enabled_parts = _enabled_parts, tuple(parts)
    try:
        yield
    finally:
        _enabled_parts = previous


@contextlib.contextmanager
def cuda_kernel_emulation(
    arch: CudaArch | None = None, report: EmulationReport | None = None
) -> Iterator[EmulationReport]:
    """CUDA autocast, attention and dropout semantics for a CPU trace (see the module docstring).

    Args:
        arch: The architecture to emulate; default sm90 (an H100), noted as assumed.
        report: A report to fill (shared by the traces of one estimate), else a new one.

    Yields:
        The :class:`EmulationReport`.

    The CUDA-only attention kernels exist for fake tensors only (their meta
    kernels), as in the estimator's trace.

    Example:
        >>> import torch
        >>> from torch._subclasses.fake_tensor import FakeTensorMode
        >>> with FakeTensorMode(), cuda_kernel_emulation() as report:
        ...     q = torch.empty(1, 2, 16, 8, requires_grad=True)
        ...     out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        >>> list(report.sdpa.values())   # fp32 on sm90: the memory-efficient kernel
        ['efficient']
    """
    if report is None:
        report = EmulationReport(arch or cuda_arch(DEFAULT_ARCH_CAPABILITY), arch_named=arch is not None)
    arch = report.arch
    parts = _enabled_parts
    with contextlib.ExitStack() as stack:
        if "dropout" in parts:
            stack.enter_context(_cuda_dropout())
        autocast = stack.enter_context(cuda_autocast_on_cpu()) if "autocast" in parts else None
        if autocast is not None:
            report.autocast_ops = len(autocast.overridden)
        if "sdpa" in parts:
            stack.enter_context(_cuda_sdpa(arch, report))
        for factory in list(EMULATIONS.values()):
            stack.enter_context(factory(arch, report))
        try:
            yield report
        finally:
            report.autocast_used = report.autocast_used or bool(autocast and autocast.used)
