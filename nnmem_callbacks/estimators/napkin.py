"""Closed-form ("napkin") training-memory estimates from bare numbers.

For the person who has no model code yet, only numbers: a parameter count,
layer widths, or a transformer's layers, hidden size, heads, vocabulary and
sequence length. Each function here is pure: numbers in, a
:class:`~nnmem_callbacks.core.estimate.MemoryEstimate` out (``method`` is
``"napkin:transformer"``, ``"napkin:mlp"`` or ``"napkin:params"``), so the
same tables, JSON and "which GPU fits" code serve traced and napkin estimates.

What is counted, and how (one training step of a fresh run, second step):

* **Parameters** in the parameter dtype: fp32 under ``32-true`` *and* under
  ``16-mixed``/``bf16-mixed`` (PyTorch AMP keeps fp32 parameters, which are
  the "master weights"), half under ``16-true``/``bf16-true``.
* **Autocast weight copies** (mixed precision only): autocast casts each
  weight used by a matmul to 16 bits and keeps the copy until backward has
  used it: 2 bytes per matmul parameter, on top of the fp32 parameters.
* **Gradients** in the parameter dtype.
* **Optimizer state** in the parameter dtype: SGD 0, SGD with momentum 1x,
  Adagrad and RMSprop 1x, Adam/AdamW/Adamax/NAdam/RAdam/Adadelta 2x the
  parameters; plus the optimizer's own temporaries (the ``foreach`` Adam on
  CUDA allocates one ``sqrt(exp_avg_sq)`` copy of all parameters).
* **Activations** saved for backward. For transformers the per-layer formula
  of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models"): ``s*b*h*(34 + 5*a*s/h)`` bytes per layer in 16 bits
  without recomputation, ``34*s*b*h`` with selective recomputation and
  ``2*s*b*h`` with full recomputation. It is evaluated term by term so that
  fp32 training doubles the tensors but not the 1-byte dropout masks, and so
  that under autocast the LayerNorm inputs and the softmax output are fp32;
  the 1-byte dropout masks are CUDA's (CPU dropout keeps a noise tensor in
  the activation dtype instead).
  With a fused attention kernel (``attention="flash"``) the ``a*s*s`` terms
  are replaced by the kernel's log-sum-exp. Plus the logits and the loss:
  the logits (``b*s*vocab`` in the compute dtype) and their fp32 up-cast live
  during forward, the loss keeps an fp32 log-softmax for backward, and two
  fp32 ``b*s*vocab`` gradients join it at the start of backward.
* **The peak** is the largest of four phase lines: end of forward, start of
  backward (all activations plus the loss gradients), end of backward (all
  gradients) and the optimizer step. Activations are freed while gradients
  appear, so the peak is *not* activations plus gradients.

Known limitations: model-specific extras (key/value caches returned by
``use_cache=True``, attention masks, architecture quirks) are not counted;
the CUDA caching allocator's reserve is not modelled (``reserved_bytes`` is
``None``); on CUDA ``overhead_bytes`` is the default context plus cuBLAS
workspace (:data:`CUDA_OVERHEAD_BYTES`); kernel workspaces are ignored. ``benchmarks/napkin_vs_trace.py`` measures the error against the
traced PyTorch estimator.

Nothing here imports torch.

Example:
    >>> est = transformer_estimate(layers=12, hidden=768, heads=12, vocab=30522, seq_len=128,
    ...                            batch_size=32, optimizer="adamw", arch="bert")
    >>> est.method, est.extra["params"]
    ('napkin:transformer', 109514298)
    >>> est.peak_bytes == sum(est.breakdown.values())
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from nnmem_callbacks.core import vocabulary
from nnmem_callbacks.core.estimate import Category, MemoryEstimate, PhaseLine
from nnmem_callbacks.core.units import format_bytes

__all__ = [
    "ACTIVATIONS",
    "ARCHITECTURES",
    "ATTENTION",
    "check_optimizer",
    "check_precision",
    "CUDA_OVERHEAD_BYTES",
    "dominant_terms",
    "explain",
    "korthikanti_layer_bytes",
    "mlp_estimate",
    "OPTIMIZER_STATE",
    "params_estimate",
    "PRECISION_ALIASES",
    "PRECISIONS",
    "RECOMPUTE",
    "transformer_estimate",
    "transformer_params",
    "what_if",
]

#: Precisions in Lightning's spelling (:data:`nnmem_callbacks.core.vocabulary.PRECISIONS`).
PRECISIONS = vocabulary.PRECISIONS

_PARAM_BYTES = {"32-true": 4, "16-mixed": 4, "bf16-mixed": 4, "16-true": 2, "bf16-true": 2, "64-true": 8}
_COMPUTE_BYTES = {"32-true": 4, "16-mixed": 2, "bf16-mixed": 2, "16-true": 2, "bf16-true": 2, "64-true": 8}

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
_OPTIMIZER_TEMP = {
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

#: What a CUDA device shows beyond the tensors when no GPU is at hand to measure it:
#: the CUDA context (512 MiB) and the cuBLAS workspace on Hopper (32 MiB), the same
#: defaults the PyTorch estimator assumes.
CUDA_OVERHEAD_BYTES = 512 * 2**20 + 32 * 2**20


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


def _check_positive(name: str, value: Any, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value}")
    return value


def _check_choice(name: str, value: str, valid: Sequence[str]) -> str:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")
    return value


def _check_device(device: str) -> str:
    kind = str(device).split(":", 1)[0]
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return str(device)


# -- the published formula -----------------------------------------------------
def korthikanti_layer_bytes(seq_len: int, batch_size: int, hidden: int, heads: int, recompute: str = "none") -> int:
    """Activation bytes of one transformer layer in 16 bits, as published.

    Korthikanti et al. 2022, eq. (1) and section 4: ``s*b*h*(34 + 5*a*s/h)``
    without recomputation, ``34*s*b*h`` with selective recomputation,
    ``2*s*b*h`` with full recomputation (the layer input only).

    Example:
        >>> korthikanti_layer_bytes(128, 32, 768, 12)
        138412032
        >>> korthikanti_layer_bytes(128, 32, 768, 12, "full")
        6291456
    """
    _check_choice("recompute", recompute, RECOMPUTE)
    sbh = seq_len * batch_size * hidden
    if recompute == "full":
        return 2 * sbh
    if recompute == "selective":
        return 34 * sbh
    return 34 * sbh + 5 * heads * seq_len * seq_len * batch_size


# -- assembling phases ---------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Parts:
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


def _assemble(
    parts: _Parts,
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


def _common(optimizer: str, precision: str, device: str, params: int, largest_param: int, matmul_params: int):
    optimizer = check_optimizer(optimizer)
    precision = check_precision(precision)
    device = _check_device(device)
    pb = _PARAM_BYTES[precision]
    mixed = precision.endswith("-mixed")
    foreach_mult, single_mult = _OPTIMIZER_TEMP[optimizer]
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


def _static_parts(common: dict) -> dict[str, int]:
    """The parameter-side fields of :class:`_Parts` from :func:`_common`'s result."""
    return {key: common[key] for key in ("params", "grads", "state", "copies", "opt_temp")}


def _input_bytes(precision: str) -> int:
    """Bytes of one float input element: fp32 unless the whole model is half or double."""
    return {"16-true": 2, "bf16-true": 2, "64-true": 8}.get(precision, 4)


def _base_notes(kind: str, precision: str, optimizer: str) -> list[str]:
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


# -- transformer ---------------------------------------------------------------
def transformer_params(
    *, layers: int, hidden: int, vocab: int, ffn: int | None = None, arch: str = "gpt", max_positions: int | None = None
) -> int:
    """Parameter count of a GPT-2 (tied LM head) or BERT masked-LM model.

    Per layer ``4h^2 + 2hf + 9h + f`` (attention, MLP, two LayerNorms).

    Example:
        >>> transformer_params(layers=12, hidden=768, vocab=50257)  # GPT-2 small
        124439808
        >>> transformer_params(layers=12, hidden=768, vocab=30522, arch="bert")
        109514298
    """
    _check_choice("arch", arch, ARCHITECTURES)
    h, f = hidden, ffn or 4 * hidden
    positions = max_positions or (1024 if arch == "gpt" else 512)
    layer = 4 * h * h + 2 * h * f + 9 * h + f
    total = vocab * h + positions * h + layers * layer
    if arch == "gpt":
        return total + 2 * h  # final LayerNorm; the LM head shares the embedding
    # token types, embedding LayerNorm, MLM head (dense + LayerNorm + decoder bias)
    return total + 2 * h + 2 * h + (h * h + h) + 2 * h + vocab


def transformer_estimate(
    *,
    layers: int,
    hidden: int,
    heads: int,
    seq_len: int,
    batch_size: int,
    vocab: int = 0,
    ffn: int | None = None,
    params: int | None = None,
    arch: str = "gpt",
    max_positions: int | None = None,
    optimizer: str = "adam",
    precision: str = "32-true",
    recompute: str = "none",
    attention: str = "eager",
    activation: str = "gelu",
    dropout: bool = True,
    device: str = "cuda",
) -> MemoryEstimate:
    """Napkin estimate for training a GPT-style or BERT-style transformer LM.

    Args:
        layers: Transformer layers ``L``.
        hidden: Hidden size ``h``.
        heads: Attention heads ``a``.
        seq_len: Sequence length ``s``.
        batch_size: Batch size ``b``.
        vocab: Vocabulary ``V`` (0: no LM head and no loss over the vocabulary).
        ffn: MLP width (default ``4*h``).
        params: Parameter count; computed by :func:`transformer_params` if omitted.
        arch: ``"gpt"`` (pre-LN decoder, tied head) or ``"bert"`` (masked LM).
        max_positions: Position embeddings (default 1024 for gpt, 512 for bert).
        optimizer: See :data:`OPTIMIZER_STATE`.
        precision: One of :data:`PRECISIONS`.
        recompute: ``"none"``, ``"selective"`` (attention scores recomputed) or
            ``"full"`` (only layer inputs kept).
        attention: ``"eager"`` (scores materialised) or ``"flash"`` (fused
            kernel: only a log-sum-exp per row).
        activation: ``"gelu"`` (one fused kernel: keeps its input) or
            ``"gelu_new"`` (the tanh approximation written as eight elementwise
            ops, HF GPT-2's default: keeps three more ``4h``-wide tensors).
        dropout: Whether dropout is active (1-byte masks are kept).
        device: ``"cuda"`` (foreach optimizers) or ``"cpu"``.

    Returns:
        A :class:`MemoryEstimate` with ``method="napkin:transformer"``;
        ``extra["activation_terms"]`` holds the activation bytes per sample by
        term.

    Example:
        >>> est = transformer_estimate(layers=2, hidden=64, heads=4, seq_len=32, batch_size=4,
        ...                            precision="16-true", optimizer="sgd")
        >>> est.extra["activation_terms"]["layers"] * 4 == 2 * korthikanti_layer_bytes(32, 4, 64, 4)
        True
    """
    layers = _check_positive("layers", layers)
    hidden = _check_positive("hidden", hidden)
    heads = _check_positive("heads", heads)
    seq_len = _check_positive("seq_len", seq_len)
    batch_size = _check_positive("batch_size", batch_size)
    vocab = _check_positive("vocab", vocab, allow_zero=True)
    _check_choice("arch", arch, ARCHITECTURES)
    _check_choice("recompute", recompute, RECOMPUTE)
    _check_choice("attention", attention, ATTENTION)
    _check_choice("activation", activation, ACTIVATIONS)
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    h, a, s, f = hidden, heads, seq_len, ffn or 4 * hidden
    computed_params = transformer_params(layers=layers, hidden=h, vocab=vocab, ffn=f, arch=arch, max_positions=max_positions)
    n_params = _check_positive("params", params) if params is not None else computed_params
    layer_linear = 4 * h * h + 4 * h + 2 * h * f + f + h
    head_linear = vocab * h + (h * h + h + vocab if arch == "bert" else 0)
    matmul_params = min(n_params, layers * layer_linear + head_linear)
    common = _common(optimizer, precision, device, n_params, max(vocab * h, h * f), matmul_params)
    precision = common["precision"]

    e = _COMPUTE_BYTES[precision]
    r = 4 if precision.endswith("-mixed") else e  # residual stream and LayerNorm inputs
    sm = 4 if precision.endswith("-mixed") else e  # softmax output
    # Dropout masks: CUDA's fused kernel keeps a 1-byte mask; on CPU, dropout multiplies by a
    # noise tensor of the input's dtype and keeps that.
    on_cuda = common["device"].startswith("cuda")
    m = (1 if on_cuda else e) if dropout else 0
    ms = (1 if on_cuda else sm) if dropout else 0
    sh = s * h
    # Per layer, per sample: the Korthikanti terms, dtype by dtype.
    terms = {
        "layernorm inputs": 2 * sh * r,
        "attention linear inputs": 2 * sh * e,
        "Q, K, V": 3 * sh * e,
        "attention scores": a * s * s * (sm + e + ms) if attention == "eager" else 4 * a * s,
        "MLP": sh * e + 2 * s * f * e + (3 * s * f * e if activation == "gelu_new" else 0),
        "dropout masks": 2 * sh * m,
    }
    full_layer = sum(terms.values())
    if recompute == "selective" and attention == "eager":
        terms["attention scores"] = 0
    if recompute == "full":
        terms = {"layer inputs (recompute=full)": sh * r}
    per_layer = sum(terms.values())
    embed = sh * m + (sh * r + sh * m if arch == "bert" else 0)
    if arch == "gpt":
        head = sh * r + sh * e  # final LayerNorm input, LM-head input
    else:
        head = sh * e + sh * e + sh * r + sh * e  # dense in, GELU in, LayerNorm in, decoder in
    # The logits die with the model output after forward; the loss keeps its fp32 log-softmax.
    logits = s * vocab * e
    loss = s * vocab * 4
    act_terms = {
        "layers": layers * per_layer,
        "embeddings + head": embed + head if vocab else embed,
        "loss (fp32 log-softmax)": loss,
    }
    if recompute == "full":
        bwd_recompute = full_layer
    else:
        bwd_recompute = 0
    parts = _Parts(
        **_static_parts(common),
        inputs=2 * s * 8,  # int64 token ids and labels
        acts=sum(act_terms.values()),
        fwd_temp=logits + (s * vocab * 4 if e != 4 else 0),  # logits and their fp32 up-cast, inside the loss
        bwd_temp=max(2 * s * vocab * 4, bwd_recompute),
        bwd_end_acts=embed,
    )
    notes = _base_notes("transformer", precision, common["optimizer"])
    notes.append(
        "activations: Korthikanti et al. 2022, per layer s*b*h*(34 + 5*a*s/h) bytes in 16 bits "
        f"(recompute={recompute}, attention={attention}), evaluated per dtype"
    )
    if params is not None and params != computed_params:
        notes.append(f"parameters given ({params:,}); the layer sizes imply {computed_params:,}")
    extra = {
        "params": n_params,
        "activation_terms": act_terms,
        "layer_terms": terms,
        "napkin": {
            "kind": "transformer",
            "layers": layers,
            "hidden": h,
            "heads": a,
            "seq_len": s,
            "vocab": vocab,
            "ffn": f,
            "params": params,
            "arch": arch,
            "max_positions": max_positions,
            "optimizer": common["optimizer"],
            "precision": precision,
            "recompute": recompute,
            "attention": attention,
            "activation": activation,
            "dropout": dropout,
            "device": common["device"],
        },
    }
    return _assemble(parts, batch_size, method="napkin:transformer", precision=precision,
                     device=common["device"], notes=notes, extra=extra)


# -- MLP -----------------------------------------------------------------------
def mlp_estimate(
    widths: Sequence[int],
    batch_size: int,
    *,
    optimizer: str = "adam",
    precision: str = "32-true",
    device: str = "cuda",
    cross_entropy: bool = True,
) -> MemoryEstimate:
    """Napkin estimate for an MLP of Linear layers with ReLU between them.

    Args:
        widths: Layer widths from input to output, e.g. ``[1000, 100, 100, 10]``.
        batch_size: Batch size.
        optimizer: See :data:`OPTIMIZER_STATE`.
        precision: One of :data:`PRECISIONS`.
        device: ``"cuda"`` or ``"cpu"``.
        cross_entropy: Count a cross-entropy loss over the outputs.

    Returns:
        A :class:`MemoryEstimate` with ``method="napkin:mlp"``. Backward is
        walked layer by layer (one phase line per Linear), since gradients of
        the last layers appear while the first layers' activations are alive.

    Example:
        >>> est = mlp_estimate([1000, 100, 100, 100, 100, 10], 256, optimizer="sgd")
        >>> est.extra["params"], est.extra["activation_elements_per_sample"]
        (131410, 410)
    """
    widths = [_check_positive("layer width", w) for w in widths]
    if len(widths) < 2:
        raise ValueError(f"an MLP needs at least an input and an output width, got {list(widths)}")
    batch_size = _check_positive("batch_size", batch_size)
    layer_params = [widths[i] * widths[i + 1] + widths[i + 1] for i in range(len(widths) - 1)]
    n_params = sum(layer_params)
    common = _common(optimizer, precision, device, n_params,
                     max(widths[i] * widths[i + 1] for i in range(len(widths) - 1)), n_params)
    precision = common["precision"]
    e = _COMPUTE_BYTES[precision]
    mixed = precision.endswith("-mixed")
    pb = _PARAM_BYTES[precision]
    # saved[i]: bytes per sample that Linear i saves (its input): the (cast) input or a ReLU output
    saved = [widths[0] * e if mixed else 0] + [w * e for w in widths[1:-1]]
    out = widths[-1] * e
    loss = widths[-1] * 4 if cross_entropy else 0
    acts = sum(saved) + out + loss
    phases = []
    grads_so_far = 0
    for i in reversed(range(len(layer_params))):
        grads_so_far += layer_params[i] * pb
        alive = sum(saved[: i + 1]) + out + (loss if i == len(layer_params) - 1 else 0)
        # the gradient of the output, and of the input (not computed for the first layer)
        temp = widths[i + 1] * e + (widths[i] * e if i else 0)
        phases.append((f"step2/backward (layer {i + 1} of {len(layer_params)})", grads_so_far, common["copies"], alive, 0, temp))
    parts = _Parts(
        **_static_parts(common),
        inputs=widths[0] * _input_bytes(precision),
        acts=acts,
        fwd_temp=widths[-1] * 4 if cross_entropy and e != 4 else 0,
        bwd_temp=2 * widths[-1] * 4 if cross_entropy else widths[-1] * e,
        bwd_end_acts=0,
        extra_phases=tuple(phases),
    )
    notes = _base_notes("mlp", precision, common["optimizer"])
    extra = {
        "params": n_params,
        "activation_elements_per_sample": sum(widths[1:]),
        "activation_terms": {
            "hidden outputs": sum(saved[1:]),
            "input cast (autocast)": saved[0],
            "outputs": out,
            "loss (fp32 log-softmax)": loss,
        },
        "napkin": {"kind": "mlp", "widths": list(widths), "optimizer": common["optimizer"],
                   "precision": precision, "device": common["device"], "cross_entropy": cross_entropy},
    }
    return _assemble(parts, batch_size, method="napkin:mlp", precision=precision,
                     device=common["device"], notes=notes, extra=extra)


# -- bare counts ---------------------------------------------------------------
def params_estimate(
    params: int,
    activations: int,
    batch_size: int,
    *,
    input_size: int = 0,
    optimizer: str = "adam",
    precision: str = "32-true",
    device: str = "cuda",
    largest_param: int | None = None,
) -> MemoryEstimate:
    """Napkin estimate from a parameter count and activation elements per sample.

    Args:
        params: Number of parameters.
        activations: Activation elements saved for backward per sample (the
            number a layer-by-layer summary sums up).
        batch_size: Batch size.
        input_size: Input elements per sample (e.g. ``3*224*224``); 0 to ignore.
        optimizer: See :data:`OPTIMIZER_STATE`.
        precision: One of :data:`PRECISIONS`; activations take the compute dtype.
        device: ``"cuda"`` or ``"cpu"``.
        largest_param: Elements of the largest parameter (for CPU optimizer
            temporaries); defaults to a tenth of ``params``.

    Returns:
        A :class:`MemoryEstimate` with ``method="napkin:params"``. Without a
        layer structure, activations are assumed to be freed while gradients
        appear (spread evenly over depth), so the peak is the larger of
        "end of forward" and "end of backward"/"optimizer step".

    Example:
        >>> est = params_estimate(19_000_000, 532_752, 128, optimizer="sgd")
        >>> est.peak_phase, est.breakdown["activations"] == 532_752 * 128 * 4
        ('step2/forward', True)
    """
    params = _check_positive("params", params)
    activations = _check_positive("activations", activations, allow_zero=True)
    batch_size = _check_positive("batch_size", batch_size)
    input_size = _check_positive("input_size", input_size, allow_zero=True)
    largest = largest_param if largest_param is not None else max(1, params // 10)
    common = _common(optimizer, precision, device, params, largest, params)
    precision = common["precision"]
    e = _COMPUTE_BYTES[precision]
    parts = _Parts(
        **_static_parts(common),
        inputs=input_size * _input_bytes(precision),
        acts=activations * e,
    )
    notes = _base_notes("params", precision, common["optimizer"])
    notes.append(
        "without layer structure, activations are assumed to be freed as gradients appear; "
        "the seeds' rule (activations + gradients at once) is an upper bound"
    )
    if not input_size:
        notes.append("the input batch is not counted (give --input-size)")
    extra = {
        "params": params,
        "activation_terms": {"activations": activations * e},
        "napkin": {"kind": "params", "params": params, "activations": activations, "input_size": input_size,
                   "optimizer": common["optimizer"], "precision": precision, "device": common["device"],
                   "largest_param": largest_param},
    }
    return _assemble(parts, batch_size, method="napkin:params", precision=precision,
                     device=common["device"], notes=notes, extra=extra)


# -- explanation ---------------------------------------------------------------
_FUNCTIONS: dict[str, Callable[..., MemoryEstimate]] = {}


def _rebuild(estimate: MemoryEstimate, **changes: Any) -> MemoryEstimate | None:
    spec = dict(estimate.extra.get("napkin", {}))
    kind = spec.pop("kind", None)
    if kind is None:
        return None
    spec.update(changes)
    batch = spec.pop("batch_size", estimate.batch_size)
    if kind == "transformer":
        return transformer_estimate(batch_size=batch, **spec)
    if kind == "mlp":
        widths = spec.pop("widths")
        return mlp_estimate(widths, batch, **spec)
    return params_estimate(spec.pop("params"), spec.pop("activations"), batch, **spec)


def what_if(estimate: MemoryEstimate) -> list[tuple[str, MemoryEstimate]]:
    """Variations of a napkin estimate that shrink the peak, largest saving first.

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
        options.append(("precision=bf16-true: everything in bf16 (needs care with the optimizer)", {"precision": "bf16-true"}))
    if spec["kind"] == "transformer":
        if spec["attention"] == "eager":
            options.append(("attention=flash: fused attention kernel, no s*s scores kept", {"attention": "flash"}))
        if spec["recompute"] == "none":
            options.append(("recompute=selective: recompute the attention scores in backward", {"recompute": "selective"}))
        if spec["recompute"] != "full":
            options.append(("recompute=full: keep only each layer's input (activation checkpointing)", {"recompute": "full"}))
    if estimate.batch_size >= 2:
        half = estimate.batch_size // 2
        options.append((f"batch_size={half} with accumulate_grad_batches=2: same effective batch", {"batch_size": half}))
    results = []
    for label, changes in options:
        other = _rebuild(estimate, **changes)
        if other is not None and other.peak_bytes < estimate.peak_bytes:
            results.append((label, other))
    results.sort(key=lambda item: item[1].peak_bytes)
    return results


def dominant_terms(estimate: MemoryEstimate, top: int = 3) -> list[tuple[str, int]]:
    """The largest contributions to the peak, with activations split by term.

    Example:
        >>> est = mlp_estimate([1000, 100, 10], 1024, optimizer="sgd")
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


def explain(estimate: MemoryEstimate) -> list[str]:
    """A short "why": which terms dominate the peak, and what would shrink them.

    Example:
        >>> lines = explain(params_estimate(1_000_000, 10_000, 64))
        >>> lines[0].startswith("The peak is at step2/")
        True
    """
    peak = max(estimate.peak_bytes, 1)
    lines = [f"The peak is at {estimate.peak_phase} (batch {estimate.batch_size}); largest terms:"]
    for name, value in dominant_terms(estimate):
        lines.append(f"  {name}: {format_bytes(value)} ({value / peak:.0%})")
    options = what_if(estimate)
    if options:
        lines.append("What would shrink it:")
        for label, other in options[:4]:
            saving = estimate.peak_bytes - other.peak_bytes
            lines.append(f"  {label} -> peak {format_bytes(other.peak_bytes)} (-{saving / peak:.0%})")
    return lines
