"""Make a CPU trace allocate like CUDA kernels would, for CUDA targets traced without a GPU.

When the target is CUDA but no CUDA device is present, the step is traced with
CPU kernels. Two CPU kernels keep very different tensors for backward than
their CUDA counterparts, so they are replaced for the trace by ops whose saved
tensors match CUDA:

* **Dropout**: the CPU implementation keeps a noise tensor in the activation
  dtype (4 bytes per element in fp32); CUDA's fused dropout keeps a 1-byte
  boolean mask. ``aten.native_dropout`` (which keeps the boolean mask) is used.
* **scaled_dot_product_attention**: with dropout, CPU falls back to the math
  path and keeps the attention probabilities; CUDA's flash and
  memory-efficient kernels keep only the output and the log-sum-exp. The CPU
  flash kernel, which keeps the same, is used.

Everything else runs unchanged. The note "traced on cpu kernels for a cuda
target" in ``MemoryEstimate.notes`` says this happened.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

_FLASH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@contextlib.contextmanager
def cuda_kernel_emulation() -> Iterator[None]:
    """Patches ``F.dropout`` and ``F.scaled_dot_product_attention`` for the block."""
    original_dropout = F.dropout
    original_sdpa = F.scaled_dot_product_attention

    def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002 - torch's signature
        if not training or p == 0.0 or not input.is_floating_point():
            return original_dropout(input, p, training, inplace)
        output, _mask = torch.ops.aten.native_dropout.default(input, p, True)
        if inplace:
            return input.copy_(output)
        return output

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        usable = (
            not enable_gqa
            and query.dim() == 4
            and query.dtype in _FLASH_DTYPES
            and query.shape[-1] == value.shape[-1]
            and (attn_mask is None or attn_mask.dtype != torch.bool)
        )
        if not usable:
            return original_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        output, _logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
        )
        return output

    F.dropout = dropout
    F.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield
    finally:
        F.dropout = original_dropout
        F.scaled_dot_product_attention = original_sdpa
