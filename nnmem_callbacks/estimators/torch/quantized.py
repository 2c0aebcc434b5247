"""bitsandbytes' 4-bit weights on fake tensors: QLoRA steps are traced, not guessed.

A ``Params4bit`` cannot be re-made around a fake tensor (it is a tensor
subclass, and a fake tensor already owns its Python object), so the trace puts
in its slot a plain fake tensor of the packed storage and hangs a fake
``QuantState`` on it, as bitsandbytes itself does: ``Linear4bit.forward`` reads
``weight.quant_state`` and passes it to ``bnb.matmul_4bit``, whose ops have
fake kernels registered by bitsandbytes. What is counted as the weight is what
a quantized layer really holds: the packed 4-bit storage, the block scales
(``absmax``; with double quantization 8-bit scales, their own float scales,
the offset and both code books).

A weight that is not quantized yet (a model built on the meta device, which
bitsandbytes quantizes when it moves to the GPU) is counted as it will be once
quantized: ``ceil(n / 2)`` packed bytes, ``ceil(n / blocksize)`` scales.

The step's temporaries come from the kernels that really run: on CPU (and on
CUDA for large inputs), ``gemm_4bit`` dequantizes the weight to the compute
dtype and calls ``linear``; :data:`~nnmem_callbacks.estimators.torch.rules.DECOMPOSITIONS`
makes the trace run bitsandbytes' own Python composition on fake tensors, so
the dequantized weight is tracked while it lives. The backward pass
(``MatMul4Bit.backward``) dequantizes again, through ops whose fake kernels
give the real sizes.

Known limitations:
    * On CUDA, bitsandbytes uses a fused kernel without the dequantized weight
      for inputs of at most 1536 rows (GPU-dependent); the trace counts the
      dequantize-and-``linear`` path, so it errs high by one dequantized
      weight there. Not yet checked on a GPU.
    * ``Linear8bitLt`` / ``Int8Params`` and bitsandbytes' 4-bit embeddings are
      not emulated yet: a model holding them falls back to the closed form,
      with a note.
    * The version-dependent parts (``QuantState``'s fields, the CPU
      ``gemm_4bit`` composition) are read from the installed bitsandbytes;
      tested against 0.50.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable

import torch

from nnmem_callbacks.core.estimate import Category
from nnmem_callbacks.estimators.torch import rules

__all__ = ["fake_params4bit", "install_rules", "is_params4bit", "quantized_weight_count"]

#: bitsandbytes' second-level block size for double-quantized scales (``quantize_blockwise(absmax, blocksize=256)``)
NESTED_BLOCKSIZE = 256
#: Entries of bitsandbytes' code books: the 4-bit types (nf4, fp4) and the 8-bit dynamic map of nested scales
CODE_4BIT_ENTRIES = 16
CODE_8BIT_ENTRIES = 256


def is_params4bit(tensor: Any) -> bool:
    """Whether ``tensor`` is a bitsandbytes ``Params4bit`` (without importing bitsandbytes)."""
    kind = type(tensor)
    return kind.__name__ == "Params4bit" and kind.__module__.startswith("bitsandbytes")


def quantized_weight_count(model: torch.nn.Module) -> int:
    """How many of ``model``'s parameters are bitsandbytes 4-bit weights."""
    return sum(1 for parameter in model.parameters() if is_params4bit(parameter))


def install_rules() -> None:
    """Registers the decomposition of ``bitsandbytes::gemm_4bit`` (idempotent).

    bitsandbytes registers no CPU kernel for ``gemm_4bit``: its ``default``
    kernel (dequantize, then ``linear``) is what runs, and what the trace runs.
    """
    if "bitsandbytes" not in sys.modules:
        return
    implementation = _default_gemm_4bit()
    if implementation is None:
        return
    for device_type in ("cpu", "cuda"):
        rules.register_decomposition(device_type, torch.ops.bitsandbytes.gemm_4bit)(implementation)


def _default_gemm_4bit() -> Callable[..., Any] | None:
    try:
        from bitsandbytes.backends.default.ops import _gemm_4bit_default_impl
    except ImportError:  # another bitsandbytes layout: the fake kernel (output only) is used
        return None
    return _gemm_4bit_default_impl


def _shared_code(shared: dict[Any, torch.Tensor] | None, fake: Callable[..., torch.Tensor]) -> torch.Tensor:
    if shared is None:
        return fake((CODE_8BIT_ENTRIES,), torch.float32)
    code = shared.get("nested_code")
    if code is None:
        code = shared["nested_code"] = fake((CODE_8BIT_ENTRIES,), torch.float32)
    return code


def fake_params4bit(
    weight: torch.Tensor,
    device: torch.device,
    register: Callable[[torch.Tensor, Category], None],
    shared: dict[Any, torch.Tensor] | None = None,
) -> torch.Tensor:
    """A fake tensor standing for a ``Params4bit``, with a fake ``quant_state`` attached.

    Args:
        weight: The layer's ``Params4bit`` (quantized, or not yet: then its
            shape is the float weight's).
        device: Where the fakes live (the trace device).
        register: ``register(tensor, category)`` of the trace's tracker.
        shared: One dict per trace: the nested scales' code book is one tensor
            that every double-quantized layer shares, in bitsandbytes as here.

    Returns:
        A plain fake tensor of the packed storage, with ``quant_state``,
        ``blocksize``, ``quant_type``, ``compress_statistics`` and
        ``quant_storage`` set as bitsandbytes sets them.
    """
    from bitsandbytes.functional import QuantState

    install_rules()
    state = getattr(weight, "quant_state", None)
    storage_dtype = getattr(weight, "quant_storage", torch.uint8)
    if state is not None and getattr(weight, "bnb_quantized", True):
        shape, dtype = tuple(state.shape), state.dtype
        blocksize, quant_type, nested = state.blocksize, state.quant_type, bool(state.nested)
        packed_shape, packed_stride, packed_dtype = tuple(weight.shape), weight.stride(), weight.dtype
    else:  # not quantized yet (meta): as it will be
        shape, dtype = tuple(weight.shape), weight.dtype
        blocksize = getattr(weight, "blocksize", None) or 64
        quant_type = getattr(weight, "quant_type", None) or "fp4"
        nested = bool(getattr(weight, "compress_statistics", True))
        packed_bytes = (math.prod(shape) + 1) // 2
        packed_dtype = storage_dtype
        packed_shape = (packed_bytes // storage_dtype.itemsize, 1)
        packed_stride = (1, 1)

    def fake(size: tuple[int, ...], kind: torch.dtype) -> torch.Tensor:
        tensor = torch.empty(size, dtype=kind, device=device)
        register(tensor, Category.PARAMETERS)
        return tensor

    blocks = math.ceil(math.prod(shape) / blocksize)
    code = fake((CODE_4BIT_ENTRIES,), torch.float32)
    if nested:
        inner = QuantState(
            absmax=fake((math.ceil(blocks / NESTED_BLOCKSIZE),), torch.float32),
            code=_shared_code(shared, fake),
            blocksize=NESTED_BLOCKSIZE,
            dtype=torch.float32,
        )
        fake_state = QuantState(
            absmax=fake((blocks,), torch.uint8),
            shape=torch.Size(shape),
            code=code,
            blocksize=blocksize,
            quant_type=quant_type,
            dtype=dtype,
            offset=fake((), torch.float32),
            state2=inner,
        )
    else:
        fake_state = QuantState(
            absmax=fake((blocks,), torch.float32),
            shape=torch.Size(shape),
            code=code,
            blocksize=blocksize,
            quant_type=quant_type,
            dtype=dtype,
        )
    packed = torch.empty_strided(packed_shape, packed_stride, dtype=packed_dtype, device=device)
    register(packed, Category.PARAMETERS)
    packed.quant_state = fake_state
    packed.blocksize = blocksize
    packed.quant_type = quant_type
    packed.compress_statistics = nested
    packed.quant_storage = storage_dtype
    packed.bnb_quantized = True
    return packed
