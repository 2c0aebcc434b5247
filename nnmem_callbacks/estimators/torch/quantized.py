"""Quantized weights on fake tensors (bitsandbytes 4- and 8-bit, torchao): QLoRA steps are traced, not guessed.

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
give the real sizes. bitsandbytes' CPU optimizer update kernels are Python too
(the 8-bit one dequantizes both moments to fp32 beside an fp32 gradient); they
are CPU decompositions, installed when a bitsandbytes optimizer is traced.

Other quantizers: torchao's quantized weights (wrapper tensor subclasses) are
rebuilt around fake inner tensors and traced through their own ops (int8
weight-only: exact on CPU). Layers of HQQ, GPTQ, AWQ, quanto and fine-grained
FP8 are traced as their Python is written and named in a note, unchecked.

Known limitations:
    * On CUDA, bitsandbytes uses a fused kernel without the dequantized weight
      for inputs of at most 1536 rows (GPU-dependent); the trace counts the
      dequantize-and-``linear`` path, so it errs high by one dequantized
      weight there. Not yet checked on a GPU.
    * ``Linear8bitLt`` is traced on CPU's path (``MatMul8bitFp``: dequantize,
      then ``linear``); CUDA's int8 matmul path is not modelled. bitsandbytes'
      4-bit embeddings are not emulated.
    * The version-dependent parts (``QuantState``'s fields, the CPU
      ``gemm_4bit`` composition and optimizer update kernels) are read from
      the installed bitsandbytes; tested against 0.50. Another layout falls
      back to the fake kernels (the optimizer step's fp32 copies then unseen).
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable

import torch

from nnmem_callbacks.core.estimate import Category
from nnmem_callbacks.estimators.torch import rules

__all__ = [
    "UNCHECKED_QUANTIZED_LAYERS",
    "unchecked_notes",
    "unchecked_quantizers",
    "fake_wrapper_subclass",
    "inner_tensors",
    "is_wrapper_subclass",
    "fake_int8_params",
    "fake_params4bit",
    "install_rules",
    "is_int8_params",
    "is_params4bit",
    "quantized_weight_count",
    "traced_8bit_states",
]

#: bitsandbytes' second-level block size for double-quantized scales (``quantize_blockwise(absmax, blocksize=256)``)
NESTED_BLOCKSIZE = 256
#: Entries of bitsandbytes' code books: the 4-bit types (nf4, fp4) and the 8-bit dynamic map of nested scales
CODE_4BIT_ENTRIES = 16
CODE_8BIT_ENTRIES = 256


#: Quantized layers of other libraries, by class name: traced as their Python is written, never compared with a
#: real step here (their kernels need CUDA or packages the project does not test with).
UNCHECKED_QUANTIZED_LAYERS = {
    "HQQLinear": "HQQ",
    "QuantLinear": "GPTQ (auto-gptq / gptqmodel)",
    "TorchQuantLinear": "GPTQ (gptqmodel)",
    "ExllamaV2QuantLinear": "GPTQ (exllama v2)",
    "MarlinQuantLinear": "GPTQ (Marlin)",
    "WQLinear_GEMM": "AWQ",
    "WQLinear_GEMV": "AWQ",
    "WQLinear": "AWQ",
    "QLinear": "quanto",
    "FP8Linear": "fine-grained FP8",
}


def unchecked_quantizers(model: torch.nn.Module) -> dict[str, int]:
    """``library -> layer count`` of quantized layers whose estimate has not been checked against real steps."""
    found: dict[str, int] = {}
    for module in model.modules():
        library = UNCHECKED_QUANTIZED_LAYERS.get(type(module).__name__)
        if library is not None:
            found[library] = found.get(library, 0) + 1
    return found


def unchecked_notes(model: torch.nn.Module) -> tuple[str, ...]:
    """The estimate's note on quantized layers of other libraries (none when the model has none)."""
    unchecked = unchecked_quantizers(model)
    if not unchecked:
        return ()
    listed = ", ".join(f"{library} ({count} layers)" for library, count in unchecked.items())
    return (f"quantized layers of {listed}: traced as their Python is written, not yet compared with real steps",)


def is_params4bit(tensor: Any) -> bool:
    """Whether ``tensor`` is a bitsandbytes ``Params4bit`` (without importing bitsandbytes)."""
    kind = type(tensor)
    return kind.__name__ == "Params4bit" and kind.__module__.startswith("bitsandbytes")


def is_int8_params(tensor: Any) -> bool:
    """Whether ``tensor`` is a bitsandbytes ``Int8Params`` (the weight of ``Linear8bitLt``)."""
    kind = type(tensor)
    return kind.__name__ == "Int8Params" and kind.__module__.startswith("bitsandbytes")


def quantized_weight_count(model: torch.nn.Module) -> int:
    """How many of ``model``'s parameters are bitsandbytes 4-bit or 8-bit weights."""
    return sum(1 for parameter in model.parameters() if is_params4bit(parameter) or is_int8_params(parameter))


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
    for op, cpu_implementation in _cpu_optimizer_updates():
        rules.register_decomposition("cpu", op)(cpu_implementation)


def _cpu_optimizer_updates() -> list[tuple[Any, Callable[..., Any]]]:
    """bitsandbytes' CPU optimizer kernels, Python built from aten ops: the 8-bit one dequantizes both moments to
    fp32, updates them beside an fp32 copy of the gradient, then quantizes them back, so its step holds about
    three fp32 copies of the largest parameter (the fake kernel returns nothing and showed none of them)."""
    try:
        from bitsandbytes.backends.cpu import ops as cpu_ops
    except ImportError:  # another bitsandbytes layout: the fake kernels (no temporaries) are used
        return []
    found = []
    for name in ("optimizer_update_8bit_blockwise", "optimizer_update_32bit"):
        implementation = getattr(cpu_ops, f"_{name}_cpu", None)
        op = getattr(torch.ops.bitsandbytes, name, None)
        if implementation is not None and op is not None:
            found.append((op, implementation))
    return found


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
    # made in the order bitsandbytes makes them: the nested state (8-bit block scales' own fp32 scales, the shared
    # code book), then the block scales, then the offset
    state2 = (
        QuantState(
            absmax=fake((math.ceil(blocks / NESTED_BLOCKSIZE),), torch.float32),
            code=_shared_code(shared, fake),
            blocksize=NESTED_BLOCKSIZE,
            dtype=torch.float32,
        )
        if nested
        else None
    )
    absmax = fake((blocks,), torch.uint8 if nested else torch.float32)
    nested_parts = {"offset": fake((), torch.float32), "state2": state2} if nested else {}
    fake_state = QuantState(
        absmax=absmax,
        shape=torch.Size(shape),
        code=code,
        blocksize=blocksize,
        quant_type=quant_type,
        dtype=dtype,
        **nested_parts,
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


def fake_int8_params(
    weight: torch.Tensor,
    device: torch.device,
    register: Callable[[torch.Tensor, Category], None],
    scales: dict[int, torch.Tensor],
    state_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """A fake tensor standing for an ``Int8Params`` of 8-bit weights (``has_fp16_weights=False``).

    Its bytes are the int8 weight and one float32 scale per output row (``SCB``),
    quantized or not yet (a weight still in 16 or 32 bits is counted as it will be
    once quantized). The scales go to ``scales[id(fake)]`` for
    :func:`traced_8bit_states`; ``CB`` and ``SCB`` on the fake are ``None``, as
    on a weight whose layer has already run (its state holds them).

    Args:
        weight: The layer's ``Int8Params``.
        device: Where the fakes live.
        register: The tracker's ``register(tensor, category)``.
        scales: One dict per trace.
        state_scales: The layer state's ``SCB`` when the layer has run (the weight's is then ``None``).
    """
    if getattr(weight, "has_fp16_weights", False):  # trained in 16 bits: an ordinary weight
        fake = torch.empty_strided(tuple(weight.shape), weight.stride(), dtype=weight.dtype, device=device)
        fake.requires_grad_(weight.requires_grad)
        register(fake, Category.PARAMETERS)
        return fake
    rows = weight.shape[0]
    fake = torch.empty(tuple(weight.shape), dtype=torch.int8, device=device)
    register(fake, Category.PARAMETERS)
    known = state_scales if state_scales is not None else getattr(weight, "SCB", None)
    scale = torch.empty((known.numel() if known is not None else rows,), dtype=torch.float32, device=device)
    register(scale, Category.PARAMETERS)
    fake.CB, fake.SCB, fake.has_fp16_weights = None, None, False
    scales[id(fake)] = scale
    return fake


def traced_8bit_states(model: torch.nn.Module, scales: dict[int, torch.Tensor]) -> None:
    """Gives every 8-bit layer a copy of its ``MatmulLtState`` that holds the fakes.

    ``Linear8bitLt.forward`` reads and writes ``self.state`` (``CB``, ``SCB``,
    ``is_training``); the copy keeps the user's state untouched, and the
    module attribute is put back by :func:`~nnmem_callbacks.estimators.torch.guards.preserved_module_state`.
    Call it inside that guard, after the weights are swapped.
    """
    import copy

    for module in model.modules():
        weight = getattr(module, "weight", None)
        scale = scales.get(id(weight)) if weight is not None else None
        if scale is None or not hasattr(module, "state"):
            continue
        state = copy.copy(module.state)
        state.CB, state.SCB = weight, scale
        module.state = state


def is_wrapper_subclass(tensor: Any) -> bool:
    """Whether ``tensor`` is a traceable wrapper subclass (torchao's quantized weights): its bytes are its inner tensors."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return type(tensor) not in (torch.Tensor, torch.nn.Parameter) and is_traceable_wrapper_subclass(tensor)


def inner_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors that hold a wrapper subclass's bytes (recursively); ``[tensor]`` for a plain one."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(tensor):
        return [tensor]
    names, _ = tensor.__tensor_flatten__()
    out: list[torch.Tensor] = []
    for name in names:
        out += inner_tensors(getattr(tensor, name))
    return out


def fake_wrapper_subclass(
    tensor: torch.Tensor, fake_mode: Any, register: Callable[[torch.Tensor, Category], None]
) -> torch.Tensor:
    """The subclass rebuilt around fake inner tensors (``FakeTensorMode.from_tensor``); the inner ones are counted."""
    fake = fake_mode.from_tensor(tensor)
    for inner in inner_tensors(fake):
        register(inner, Category.PARAMETERS)
    return fake
