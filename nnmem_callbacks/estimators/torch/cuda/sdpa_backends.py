"""CUDA's choice of scaled_dot_product_attention backend, reproduced on a CPU host.

On a GPU, ``F.scaled_dot_product_attention`` picks one of four kernels (flash, efficient, cuDNN, math) at run time,
and each keeps different tensors for backward. :func:`select_backend` applies the same gates as ``sdp_utils.cpp``
from plain shapes and a :class:`~nnmem_callbacks.hardware.gpus.CudaArch`, so it runs and is tested without a GPU;
:func:`sdpa_on_cpu_like_cuda` then calls the chosen backend's own aten op on the trace's (fake, CPU) tensors.

Design (what each backend keeps, the gates): docs/cuda-model.md, "Attention".

Known limitations:
    * Nested (jagged) tensors and FP8 (flash-attention 3) are not modelled.
    * The data-pointer alignment gate of the efficient kernel is read from
      storage offsets, as torch does for fake tensors.
    * Whether cuDNN attention is preferred on sm90/sm10x depends on the cuDNN
      and CUDA versions of the target install (:attr:`CudaArch.prefers_cudnn_attention`);
      flash and cuDNN keep the same bytes without a mask.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from nnmem_callbacks.hardware.gpus import CudaArch

__all__ = [
    "BACKEND_NAMES",
    "cudnn_rejects",
    "DEFAULT_PRIORITY",
    "describe_choices",
    "efficient_rejects",
    "flash_rejects",
    "priority_order",
    "SdpaCall",
    "SdpaSwitches",
    "select_backend",
]

#: Backend names, in torch's ``_SDPBackend`` numbering (``torch._C._SDPBackend``).
BACKEND_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}

#: torch's default priority order (``torch._C._get_sdp_priority_order()`` on 2.13).
DEFAULT_PRIORITY = ("flash", "efficient", "math", "cudnn")

_HALF = ("float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class SdpaCall:
    """What the backend choice depends on, without tensors (dtypes as names).

    Attributes:
        q_shape, k_shape, v_shape: ``(B, H, L, E)`` shapes.
        dtype: Query dtype name, e.g. ``"bfloat16"``.
        mask_dtype: ``None`` without a mask, else its dtype name (``"bool"``).
        mask_shape: The mask's shape.
        mask_requires_grad: Whether the mask is trained (T5's position bias).
        dropout_p: Dropout probability.
        is_causal: The causal flag.
        requires_grad: Grad mode is on and q, k or v requires grad.
        enable_gqa: The grouped-query flag.
        last_dim_strides: ``stride(-1)`` of q, k, v.
        storage_offsets: Storage offsets of q, k, v (alignment gate).
    """

    q_shape: tuple[int, ...]
    k_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    dtype: str
    mask_dtype: str | None = None
    mask_shape: tuple[int, ...] | None = None
    mask_requires_grad: bool = False
    dropout_p: float = 0.0
    is_causal: bool = False
    requires_grad: bool = True
    enable_gqa: bool = False
    last_dim_strides: tuple[int, int, int] = (1, 1, 1)
    storage_offsets: tuple[int, int, int] = (0, 0, 0)


@dataclasses.dataclass(frozen=True)
class SdpaSwitches:
    """The user's ``torch.backends.cuda.enable_*_sdp`` switches and the priority order."""

    flash: bool = True
    efficient: bool = True
    math: bool = True
    cudnn: bool = True
    priority: tuple[str, ...] = DEFAULT_PRIORITY
    deterministic: bool = False

    @classmethod
    def from_torch(cls) -> "SdpaSwitches":
        """Reads the switches of the running torch (they exist in CPU builds too)."""
        import torch

        order = tuple(BACKEND_NAMES[int(b)] for b in torch._C._get_sdp_priority_order() if int(b) in (0, 1, 2, 3))
        return cls(
            torch.backends.cuda.flash_sdp_enabled(),
            torch.backends.cuda.mem_efficient_sdp_enabled(),
            torch.backends.cuda.math_sdp_enabled(),
            torch.backends.cuda.cudnn_sdp_enabled(),
            order,
            torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled(),
        )


def _in_range(arch: CudaArch, low: tuple[int, int], high: tuple[int, int]) -> bool:
    return low <= arch.capability <= high


def _common_checks(call: SdpaCall, supports_gqa: bool, ignore_singleton_stride: bool) -> str | None:
    """check_tensor_shapes, batch/heads, nonzero lengths, last-dim stride (sdp_utils_cpp.h)."""
    if not (len(call.q_shape) == len(call.k_shape) == len(call.v_shape) == 4):
        return "q, k, v must be 4-D"
    if not call.q_shape[0] == call.k_shape[0] == call.v_shape[0]:
        return "batch sizes differ"
    q_heads, k_heads, v_heads = call.q_shape[1], call.k_shape[1], call.v_shape[1]
    if not q_heads == k_heads == v_heads:
        gqa_ok = supports_gqa and call.enable_gqa and k_heads == v_heads and q_heads % k_heads == 0
        if not gqa_ok:
            return "head counts differ"
    if min(call.q_shape[2], call.k_shape[2]) <= 0:
        return "zero sequence length"
    shapes = (call.q_shape, call.k_shape, call.v_shape)
    for stride, shape in zip(call.last_dim_strides, shapes):
        if stride != 1 and not (ignore_singleton_stride and shape[-1] == 1):
            return "last dimension not contiguous"
    return None


def flash_rejects(call: SdpaCall, arch: CudaArch, switches: SdpaSwitches) -> str | None:
    """Why flash attention cannot run (``None``: it can); ``can_use_flash_attention``."""
    if not switches.flash:
        return "disabled by torch.backends.cuda.enable_flash_sdp(False)"
    if call.mask_dtype is not None:
        return "flash attention takes no attn_mask"
    e_q, e_k, e_v = call.q_shape[-1], call.k_shape[-1], call.v_shape[-1]
    if not (e_q == e_k == e_v and e_q <= 256):
        return "head dims must be equal and <= 256"
    if not _in_range(arch, (8, 0), (12, 1)):
        return f"needs sm80..sm121, target is sm{arch.major}{arch.minor}"
    if call.requires_grad and (_in_range(arch, (8, 6), (8, 9)) or _in_range(arch, (12, 0), (12, 1))):
        if not (e_q <= 192 or (call.dropout_p == 0.0 and e_q > 224)):
            return "training with head dim in (192, 224] (or (224, 256] with dropout) on sm86-89/sm120"
    if call.is_causal and call.q_shape[2] != call.k_shape[2]:
        return "is_causal with seqlen_q != seqlen_k"
    if call.dtype not in (_HALF if arch.major >= 8 else ("float16",)):
        return f"dtype {call.dtype} (flash needs float16/bfloat16)"
    return _common_checks(call, supports_gqa=True, ignore_singleton_stride=True)


def _gemm_alignment(call: SdpaCall, arch: CudaArch) -> int:
    """minimum_gemm_alignment in sdp_utils.cpp."""
    is_half = call.dtype in _HALF
    use_tensor_cores = arch.major >= 8 or (arch.major >= 7 and is_half)
    alignment = 4 if arch.major >= 8 else 1
    if use_tensor_cores:
        alignment = max(alignment, 128 // (16 if is_half else 32))
    return alignment


def efficient_rejects(call: SdpaCall, arch: CudaArch, switches: SdpaSwitches) -> str | None:
    """Why memory-efficient attention cannot run; ``can_use_mem_efficient_attention``."""
    if not switches.efficient:
        return "disabled by torch.backends.cuda.enable_mem_efficient_sdp(False)"
    if not _in_range(arch, (5, 0), (12, 1)):
        return f"needs sm50..sm121, target is sm{arch.major}{arch.minor}"
    alignment = _gemm_alignment(call, arch)
    e_q, e_k, e_v = call.q_shape[-1], call.k_shape[-1], call.v_shape[-1]
    if not (e_q == e_k and e_q % alignment == 0 and e_v % alignment == 0 and e_q > 0 and e_v > 0):
        return f"head dims must be equal for q and k and divisible by {alignment}"
    if arch.major >= 8 and any(offset % alignment for offset in call.storage_offsets):
        return f"storage offsets of q, k, v not aligned to {alignment} elements"
    # dense_constraints: check_batch_size_and_num_heads_dense<false /*supports_grouped_query_attention*/>
    reason = _common_checks(call, supports_gqa=False, ignore_singleton_stride=False)
    if reason:
        return reason + (" (efficient attention takes no grouped-query heads)" if call.enable_gqa else "")
    dtypes = ("float16", "float32", "bfloat16") if arch.major >= 8 else ("float16", "float32")
    if call.dtype not in dtypes:
        return f"dtype {call.dtype} on sm{arch.major}{arch.minor}"
    return None


def cudnn_rejects(call: SdpaCall, arch: CudaArch, switches: SdpaSwitches) -> str | None:
    """Why cuDNN attention cannot run; ``can_use_cudnn_attention`` (cuDNN >= 9 assumed)."""
    if not switches.cudnn:
        return "disabled by torch.backends.cuda.enable_cudnn_sdp(False)"
    if switches.deterministic:
        return "deterministic algorithms requested"
    if call.dtype not in (_HALF if arch.major >= 8 else ("float16",)):
        return f"dtype {call.dtype} (cuDNN attention needs float16/bfloat16)"
    if call.mask_shape is not None and len(call.mask_shape) not in (2, 4):
        return "attn_mask must be 2-D or 4-D"
    if not _in_range(arch, (8, 0), (12, 1)):
        return f"needs sm80..sm121, target is sm{arch.major}{arch.minor}"
    if call.dropout_p * 16.0 != math.floor(call.dropout_p * 16.0):
        return "dropout not a multiple of 1/16"
    reason = _common_checks(call, supports_gqa=True, ignore_singleton_stride=True)
    if reason:
        return reason
    b, h, s_q, d_qk = call.q_shape
    s_k, d_v = call.k_shape[2], call.v_shape[3]
    if b > 65535 or h > 65535:
        return "batch or heads above 65535"
    limit = 256 if arch.major in (9, 10) and arch.cudnn_version and arch.cudnn_version > 92200 else 128
    if d_qk > limit or d_v > limit:
        return f"head dim above {limit}"
    if d_qk % 8 or d_v % 8:
        return "head dim not a multiple of 8"
    if s_k == 1:
        return "key length 1"
    if call.dropout_p != 0.0 and s_q == 1:
        return "query length 1 with dropout"
    return None


_REJECTS = {"flash": flash_rejects, "efficient": efficient_rejects, "cudnn": cudnn_rejects}


def priority_order(arch: CudaArch, switches: SdpaSwitches) -> tuple[str, ...]:
    """The order backends are tried in: torch's, with cuDNN first where sdp_utils.cpp prefers it.

    ``check_prefer_cudnn_attention``: on sm90/sm10x with a cuDNN newer than 9.15
    (CUDA 13 builds; CUDA 12 builds need minor 0 or 3) cuDNN goes first,
    unless ``TORCH_CUDNN_SDPA_DEPRIORITIZED`` is set or the user set an order.
    """
    if switches.priority == DEFAULT_PRIORITY and arch.prefers_cudnn_attention:
        return ("cudnn", "flash", "efficient", "math")
    return switches.priority


def select_backend(call: SdpaCall, arch: CudaArch, switches: SdpaSwitches | None = None) -> tuple[str, dict[str, str]]:
    """The backend CUDA would run for ``call`` on ``arch``, and why the ones before it were not.

    Returns:
        ``(backend, reasons)``: ``backend`` in ``"flash"``, ``"efficient"``,
        ``"cudnn"``, ``"math"``, or ``"error"`` when every backend is off;
        ``reasons`` maps each backend tried before it to why it was rejected.

    Example:
        >>> from nnmem_callbacks.hardware.gpus import find_arch
        >>> t5 = SdpaCall((8, 8, 128, 64), (8, 8, 128, 64), (8, 8, 128, 64), "float32",
        ...               mask_dtype="float32", mask_shape=(1, 8, 128, 128), mask_requires_grad=True)
        >>> select_backend(t5, find_arch("sm90"))[0]
        'efficient'
        >>> gpt = SdpaCall((8, 12, 1024, 64), (8, 12, 1024, 64), (8, 12, 1024, 64), "bfloat16", is_causal=True)
        >>> select_backend(gpt, find_arch("sm80"))[0], select_backend(gpt, find_arch("sm75"))[0]
        ('flash', 'math')
    """
    switches = switches or SdpaSwitches()
    reasons: dict[str, str] = {}
    for backend in priority_order(arch, switches):
        if backend == "math":
            if switches.math:
                return "math", reasons
            reasons["math"] = "disabled by torch.backends.cuda.enable_math_sdp(False)"
            continue
        reason = _REJECTS[backend](call, arch, switches)
        if reason is None:
            return backend, reasons
        reasons[backend] = reason
    return "error", reasons


def describe_choices(calls: Sequence[SdpaCall], arch: CudaArch, switches: SdpaSwitches | None = None) -> dict[str, int]:
    """Backend -> number of ``calls`` that choose it on ``arch``."""
    counts: dict[str, int] = {}
    for call in calls:
        backend = select_backend(call, arch, switches)[0]
        counts[backend] = counts.get(backend, 0) + 1
    return counts
