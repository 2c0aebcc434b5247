"""Reading a napkin estimate: what if one setting changed, which terms dominate, and the estimate in words."""

from __future__ import annotations

from typing import Any

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.estimators.napkin.common import OPTIMIZER_STATE
from nnmem_callbacks.estimators.napkin.estimates import mlp_estimate, params_estimate, transformer_estimate
from nnmem_callbacks.estimators.napkin.finetune import lora_estimate

__all__ = ["dominant_terms", "explain", "MIN_SAVING", "what_if"]


def _rebuild(estimate: MemoryEstimate, **changes: Any) -> MemoryEstimate | None:
    spec = dict(estimate.extra.get("napkin", {}))
    kind = spec.pop("kind", None)
    if kind is None:
        return None
    spec.update(changes)
    batch = spec.pop("batch_size", estimate.batch_size)
    if kind == "transformer":
        return transformer_estimate(batch_size=batch, **spec)
    if kind == "lora":
        return lora_estimate(batch_size=batch, **spec)
    if kind == "mlp":
        widths = spec.pop("widths")
        return mlp_estimate(widths, batch, **spec)
    return params_estimate(spec.pop("params"), spec.pop("activations"), batch, **spec)


#: The least share of the peak a variant must save for :func:`what_if` to offer it.
MIN_SAVING = 0.01


def what_if(estimate: MemoryEstimate) -> list[tuple[str, MemoryEstimate]]:
    """Variations of a napkin estimate that shrink the peak by at least :data:`MIN_SAVING`, largest saving first.

    Each entry is ``(description, estimate)``. Tried: SGD with momentum
    instead of a two-state optimizer, bf16 mixed precision instead of fp32,
    bf16-true instead of mixed, selective and full recomputation, a fused
    attention kernel, and half the batch with gradient accumulation.

    Example:
        >>> est = transformer_estimate(layers=2, hidden=64, heads=4, seq_len=256, batch_size=8, vocab=1000)
        >>> sorted(label.split(":")[0] for label, _ in what_if(est))[:2]
        ['attention=flash', 'batch_size=4 with accumulate_grad_batches=2']
    """
    spec = estimate.extra.get("napkin")
    if not spec:
        return []
    options: list[tuple[str, dict[str, Any]]] = []
    if OPTIMIZER_STATE.get(spec["optimizer"], 0) >= 2:
        options.append(("optimizer=sgd_momentum: one state copy instead of two", {"optimizer": "sgd_momentum"}))
    if spec["precision"] == "32-true":
        options.append(("precision=bf16-mixed: 16-bit activations (parameters stay fp32)", {"precision": "bf16-mixed"}))
    if spec["precision"].endswith("-mixed"):
        options.append(
            ("precision=bf16-true: everything in bf16 (needs care with the optimizer)", {"precision": "bf16-true"})
        )
    if spec["kind"] == "transformer":
        if spec["attention"] == "eager":
            options.append(("attention=flash: fused attention kernel, no s*s scores kept", {"attention": "flash"}))
        if spec["recompute"] == "none":
            options.append(
                ("recompute=selective: recompute the attention scores in backward", {"recompute": "selective"})
            )
        if spec["recompute"] != "full":
            options.append(
                ("recompute=full: keep only each layer's input (activation checkpointing)", {"recompute": "full"})
            )
    if spec["kind"] == "lora":
        if spec["quantization"] != "4bit":
            options.append(("quantize=4bit: QLoRA, the frozen base in 4 bits", {"quantization": "4bit"}))
        if spec["recompute"] == "none":
            options.append(("recompute=full: gradient checkpointing, each layer's input kept", {"recompute": "full"}))
    if estimate.batch_size >= 2:
        half = estimate.batch_size // 2
        options.append(
            (f"batch_size={half} with accumulate_grad_batches=2: same effective batch", {"batch_size": half})
        )
    results = []
    for label, changes in options:
        other = _rebuild(estimate, **changes)
        # a variant that saves under 1% of the peak is no advice (it printed "-0%": SGD beside a 7B LoRA's base)
        if other is not None and other.peak_bytes < estimate.peak_bytes * (1 - MIN_SAVING):
            results.append((label, other))
    results.sort(key=lambda item: item[1].peak_bytes)
    return results


def dominant_terms(estimate: MemoryEstimate, top: int = 3) -> list[tuple[str, int]]:
    """The largest contributions to the peak, with activations split by term.

    Example:
        >>> est = mlp_estimate([1000, 100, 10], 1024, optimizer="sgd", device="cpu")
        >>> dominant_terms(est, top=1)[0][0]
        'inputs'
    """
    items = {name: value for name, value in estimate.breakdown.items() if name != "activations" and value}
    activations = estimate.breakdown["activations"]
    act_terms = dict(estimate.extra.get("activation_terms", {}))
    total_terms = sum(act_terms.values())
    if activations and total_terms:
        for name, per_sample in act_terms.items():
            share = int(round(activations * per_sample / total_terms))
            if share:
                items[name if name == "activations" else f"activations: {name}"] = share
    elif activations:
        items["activations"] = activations
    return sorted(items.items(), key=lambda item: -item[1])[:top]


def explain(
    estimate: MemoryEstimate,
    options: list[tuple[str, MemoryEstimate]] | None = None,
    heading: str = "What would shrink it:",
) -> list[str]:
    """A short "why": which terms dominate the peak, and what would shrink them.

    ``options``: the variants to list under ``heading``, smallest peak first (default: :func:`what_if` of
    ``estimate``; a per-rank estimate passes its variants sharded as it was).

    Example:
        >>> lines = explain(params_estimate(1_000_000, 10_000, 64))
        >>> lines[0].startswith("The peak is at step2/")
        True
    """
    peak = max(estimate.peak_bytes, 1)
    lines = [f"The peak is at {estimate.peak_phase} (batch {estimate.batch_size}); largest terms:"]
    for name, value in dominant_terms(estimate):
        lines.append(f"  {name}: {format_bytes(value)} ({value / peak:.0%})")
    options = what_if(estimate) if options is None else options
    if options:
        lines.append(heading)
        for label, other in options[:4]:
            saving = estimate.peak_bytes - other.peak_bytes
            lines.append(f"  {label} -> peak {format_bytes(other.peak_bytes)} (-{saving / peak:.0%})")
    return lines
