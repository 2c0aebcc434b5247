"""The napkin formula for fine-tuning a Llama-style decoder with LoRA or QLoRA, from its sizes alone.

Llama-style: RMSNorm, rotary attention with grouped-query heads, a gated MLP (SiLU), an untied LM head. The base
weights are frozen, in 16 bits or quantized by bitsandbytes (4-bit: packed nibbles and one scale per 64 weights,
8-bit with double quantization, or 32-bit without; 8-bit: one byte per weight and one fp32 scale per row); the
adapters are peft LoRA matrices, kept in fp32 as peft does by default (``autocast_adapter_dtype``), with their
gradients and optimizer state. What is saved for backward, per layer and per token, follows what the traced step
keeps (``docs/napkin.md``): frozen projections save nothing, each LoRA adapter saves its fp32 copy of its input, the
norms, the attention inputs and output, the gated MLP's three ``ffn``-wide tensors. With checkpointing
(``recompute="full"``) only the layer inputs stay, and one layer is recomputed in backward; but bitsandbytes' 8-bit
matmul keeps its input on the autograd context, out of checkpointing's reach, so an 8-bit base keeps those too.

Known limitations:
    * One architecture (Llama / Mistral / Qwen2 shapes); no biases, no MoE layers.
    * Attention is the memory-efficient kernel (no scores kept) or the math path (``attention="eager"``: scores,
      softmax and its output kept per head); sliding windows are not modelled.
    * The allocator reserve is not modelled, as in every napkin formula.
"""

from __future__ import annotations

import math
from typing import Sequence

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.estimators.napkin.common import (
    ATTENTION,
    COMPUTE_BYTES,
    OPTIMIZER_STATE,
    OPTIMIZER_TEMP,
    PARAM_BYTES,
    StepParts,
    assemble,
    base_notes,
    check_choice,
    check_device,
    check_optimizer,
    check_positive,
    check_precision,
)

__all__ = ["LORA_TARGETS", "QUANTIZATIONS", "lora_estimate", "quantized_linear_bytes"]

#: Linear layers of a Llama-style block that LoRA can target.
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
#: Quantizations of the frozen base's linear layers.
QUANTIZATIONS = ("none", "4bit", "8bit")
#: bitsandbytes' 4-bit block size and the block size of the nested (double-quantized) scales.
BLOCKSIZE_4BIT, NESTED_BLOCKSIZE = 64, 256
ADAPTER_BYTES = 4  # peft keeps the adapters in fp32 (autocast_adapter_dtype=True)


def quantized_linear_bytes(in_features: int, out_features: int, quantization: str, double_quant: bool = True) -> int:
    """Bytes of one frozen linear weight as bitsandbytes stores it (``none``: not counted here, ``0``).

    Example:
        >>> quantized_linear_bytes(4096, 4096, "4bit")  # 8 MiB packed + 1 byte per 64 weights + nested scales
        8654916
        >>> quantized_linear_bytes(4096, 4096, "8bit")
        16793600
    """
    check_choice("quantization", quantization, QUANTIZATIONS)
    n = in_features * out_features
    if quantization == "8bit":
        return n + 4 * out_features
    if quantization == "4bit":
        blocks = math.ceil(n / BLOCKSIZE_4BIT)
        code_book = 16 * 4
        if double_quant:
            return (n + 1) // 2 + blocks + 4 * math.ceil(blocks / NESTED_BLOCKSIZE) + 4 + code_book
        return (n + 1) // 2 + 4 * blocks + code_book
    return 0


def lora_estimate(
    *,
    layers: int,
    hidden: int,
    heads: int,
    seq_len: int,
    batch_size: int,
    vocab: int,
    ffn: int,
    kv_heads: int | None = None,
    lora_rank: int = 16,
    lora_targets: Sequence[str] = ("q", "k", "v", "o"),
    quantization: str = "4bit",
    double_quant: bool = True,
    recompute: str = "full",
    attention: str = "flash",
    optimizer: str = "adamw",
    precision: str = "bf16-true",
    device: str = "cuda",
) -> MemoryEstimate:
    """Napkin estimate for LoRA / QLoRA fine-tuning of a Llama-style decoder.

    Args:
        layers, hidden, heads, seq_len, batch_size, vocab, ffn: The model's sizes and the step's.
        kv_heads: Key/value heads (grouped-query attention; default ``heads``).
        lora_rank: The adapters' rank ``r``.
        lora_targets: Which linear layers get adapters (:data:`LORA_TARGETS`).
        quantization: The frozen linear layers: ``"none"`` (16 bits, or 32 under ``32-true``), ``"4bit"``, ``"8bit"``.
        double_quant: 4-bit scales quantized again to 8 bits (bitsandbytes' ``compress_statistics``).
        recompute: ``"full"`` (gradient checkpointing of every layer) or ``"none"``.
        attention: ``"flash"`` (memory-efficient kernel) or ``"eager"`` (scores kept).
        optimizer, precision, device: As for the other napkin formulas; the base model is in the compute dtype.

    Returns:
        A :class:`MemoryEstimate` with ``method="napkin:lora"``.

    Example:
        >>> est = lora_estimate(layers=32, hidden=4096, heads=32, seq_len=2048, batch_size=1, vocab=32000,
        ...                     ffn=11008)
        >>> round(est.extra["base_bytes"] / 2**30, 2), est.extra["adapter_parameters"]
        (3.6, 16777216)
    """
    layers, hidden, heads = (
        check_positive(n, v) for n, v in (("layers", layers), ("hidden", hidden), ("heads", heads))
    )
    seq_len, batch_size = check_positive("seq_len", seq_len), check_positive("batch_size", batch_size)
    vocab, ffn = check_positive("vocab", vocab), check_positive("ffn", ffn)
    kv_heads = check_positive("kv_heads", kv_heads) if kv_heads is not None else heads
    lora_rank = check_positive("lora_rank", lora_rank)
    targets = tuple(dict.fromkeys(lora_targets))
    for target in targets:
        check_choice("lora target", target, LORA_TARGETS)
    check_choice("quantization", quantization, QUANTIZATIONS)
    check_choice("recompute", recompute, ("none", "full"))
    check_choice("attention", attention, ATTENTION)
    optimizer, precision, device = check_optimizer(optimizer), check_precision(precision), check_device(device)
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}), and heads by kv_heads ({kv_heads})")

    h, f, s, a = hidden, ffn, seq_len, heads
    hk = hidden // heads * kv_heads
    shapes = {"q": (h, h), "k": (h, hk), "v": (h, hk), "o": (h, h), "gate": (h, f), "up": (h, f), "down": (f, h)}
    e = COMPUTE_BYTES[precision]
    pb = PARAM_BYTES[precision] if quantization == "none" else e  # a quantized model's other weights: compute dtype
    if quantization == "none":
        linear_bytes = sum(i * o for i, o in shapes.values()) * pb
    else:
        linear_bytes = sum(quantized_linear_bytes(i, o, quantization, double_quant) for i, o in shapes.values())
    base = layers * (linear_bytes + 2 * h * pb) + 2 * vocab * h * pb + h * pb
    adapters = layers * sum(lora_rank * (shapes[t][0] + shapes[t][1]) for t in targets)
    adapter_bytes = adapters * ADAPTER_BYTES
    foreach_mult, single_mult = OPTIMIZER_TEMP[optimizer]
    largest_adapter = max((lora_rank * max(shapes[t]) for t in targets), default=0)
    opt_temp = (foreach_mult * adapters if device.startswith("cuda") else single_mult * largest_adapter) * ADAPTER_BYTES

    # Saved for backward, per token, in one layer without checkpointing.
    norm = 4 + e if e != 4 else 8  # RMSNorm keeps its fp32 input and its normalised output
    cast = ADAPTER_BYTES if e != ADAPTER_BYTES else 0  # each adapter's fp32 copy of its input
    inputs_of = {"q": h, "k": h, "v": h, "o": h, "gate": h, "up": h, "down": f}
    layer_terms = {
        "norms": 2 * h * norm,
        "adapter inputs (fp32 copies) and ranks": sum(inputs_of[t] * cast + lora_rank * ADAPTER_BYTES for t in targets),
        "attention q, k, v, output": (2 * h + 2 * hk) * e + h * e,
        "attention scores": a * s * (2 * e + 4) if attention == "eager" else a * 4,
        "gated MLP": 3 * f * e,
    }
    full_layer = s * sum(layer_terms.values())
    head = s * h * norm + s * h * e  # final norm, LM-head input
    loss = s * vocab * 4  # the fp32 log-softmax the loss keeps
    # bitsandbytes' 8-bit matmul keeps its input on the autograd context (ctx.A / ctx.tensors), where checkpointing's
    # saved-tensor hooks do not reach: each distinct input of the layer's 8-bit linears stays until backward
    held_8bit = s * (3 * h + f) * e if quantization == "8bit" else 0
    if recompute == "full":
        acts = layers * (s * h * e + held_8bit) + head + loss
        recompute_peak = full_layer + 2 * s * f * e  # one layer recomputed, with its gradients in flight
    else:  # the 8-bit down projection's input (the gated product) is the one not already saved
        acts = layers * (full_layer + (s * f * e if quantization == "8bit" else 0)) + head + loss
        recompute_peak = 0
    parts = StepParts(
        params=base + adapter_bytes,
        grads=adapter_bytes,
        state=OPTIMIZER_STATE[optimizer] * adapter_bytes,
        copies=0,
        opt_temp=opt_temp,
        inputs=2 * s * 8,
        acts=acts,
        fwd_temp=s * vocab * (e + (4 if e != 4 else 0)),  # logits and their fp32 up-cast in the loss
        bwd_temp=max(2 * s * vocab * 4, recompute_peak),
        bwd_end_acts=0,
    )
    notes = [note for note in base_notes("lora", precision, optimizer) if not note.startswith(f"{optimizer}:")]
    notes.append(
        f"frozen base ({quantization}, {base / 2**30:.2f} GiB), {adapters:,} adapter parameters (rank {lora_rank} on "
        f"{', '.join(targets)}) in fp32 with their gradients and {optimizer} state; recompute={recompute}"
    )
    extra = {
        "params": adapters,
        "base_bytes": base,
        "adapter_parameters": adapters,
        "layer_terms": {name: s * value for name, value in layer_terms.items()},
        "napkin": {
            "kind": "lora",
            "layers": layers,
            "hidden": h,
            "heads": a,
            "kv_heads": kv_heads,
            "seq_len": s,
            "vocab": vocab,
            "ffn": f,
            "lora_rank": lora_rank,
            "lora_targets": list(targets),
            "quantization": quantization,
            "double_quant": double_quant,
            "recompute": recompute,
            "attention": attention,
            "optimizer": optimizer,
            "precision": precision,
            "device": device,
        },
    }
    return assemble(
        parts, batch_size, method="napkin:lora", precision=precision, device=device, notes=notes, extra=extra
    )
