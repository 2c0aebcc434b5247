"""The napkin formulas: a transformer (GPT-2 / BERT shapes), an MLP from its widths, and a bare parameter count.

Each is pure: numbers in, a :class:`~nnmem_callbacks.core.estimate.MemoryEstimate` out (``method``
``"napkin:transformer"``, ``"napkin:mlp"`` or ``"napkin:params"``). What is counted and how: ``docs/napkin.md``.
"""

from __future__ import annotations

from typing import Callable, Sequence

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.estimators.napkin.common import (
    ACTIVATIONS,
    ARCHITECTURES,
    ATTENTION,
    COMPUTE_BYTES,
    PARAM_BYTES,
    RECOMPUTE,
    StepParts,
    assemble,
    base_notes,
    check_choice,
    check_positive,
    common_parts,
    input_bytes,
    static_parts,
)

__all__ = [
    "korthikanti_layer_bytes",
    "mlp_estimate",
    "params_estimate",
    "position_count",
    "transformer_estimate",
    "transformer_params",
]


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
    check_choice("recompute", recompute, RECOMPUTE)
    sbh = seq_len * batch_size * hidden
    if recompute == "full":
        return 2 * sbh
    if recompute == "selective":
        return 34 * sbh
    return 34 * sbh + 5 * heads * seq_len * seq_len * batch_size


# -- transformer ---------------------------------------------------------------
def position_count(arch: str, max_positions: int | None = None) -> int:
    """The learned positions of the model: ``max_positions``, else GPT-2's 1024 or BERT's 512.

    Example:
        >>> position_count("gpt"), position_count("bert"), position_count("bert", 4096)
        (1024, 512, 4096)
    """
    return max_positions or (1024 if arch == "gpt" else 512)


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
    check_choice("arch", arch, ARCHITECTURES)
    h, f = hidden, ffn or 4 * hidden
    positions = position_count(arch, max_positions)
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
        device: ``"cuda"`` (foreach optimizers; cuBLAS workspaces and context of the default GPU, Hopper), a GPU
            by name (``"cuda:a100-80gb"``: its architecture's; see
            :func:`nnmem_callbacks.estimators.napkin.common.check_device`) or ``"cpu"``.

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
    layers = check_positive("layers", layers)
    hidden = check_positive("hidden", hidden)
    heads = check_positive("heads", heads)
    seq_len = check_positive("seq_len", seq_len)
    batch_size = check_positive("batch_size", batch_size)
    vocab = check_positive("vocab", vocab, allow_zero=True)
    check_choice("arch", arch, ARCHITECTURES)
    check_choice("recompute", recompute, RECOMPUTE)
    check_choice("attention", attention, ATTENTION)
    check_choice("activation", activation, ACTIVATIONS)
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    h, a, s, f = hidden, heads, seq_len, ffn or 4 * hidden
    computed_params = transformer_params(
        layers=layers, hidden=h, vocab=vocab, ffn=f, arch=arch, max_positions=max_positions
    )
    n_params = check_positive("params", params) if params is not None else computed_params
    layer_linear = 4 * h * h + 4 * h + 2 * h * f + f + h
    head_linear = vocab * h + (h * h + h + vocab if arch == "bert" else 0)
    matmul_params = min(n_params, layers * layer_linear + head_linear)
    common = common_parts(optimizer, precision, device, n_params, max(vocab * h, h * f), matmul_params)
    precision = common["precision"]

    e = COMPUTE_BYTES[precision]
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
    parts = StepParts(
        **static_parts(common),
        inputs=2 * s * 8,  # int64 token ids and labels
        acts=sum(act_terms.values()),
        fwd_temp=logits + (s * vocab * 4 if e != 4 else 0),  # logits and their fp32 up-cast, inside the loss
        bwd_temp=max(2 * s * vocab * 4, bwd_recompute),
        bwd_end_acts=embed,
    )
    notes = base_notes("transformer", precision, common["optimizer"])
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
    return assemble(
        parts,
        batch_size,
        method="napkin:transformer",
        precision=precision,
        device=common["device"],
        notes=notes,
        extra=extra,
    )


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
        device: ``"cuda"``, a GPU by name (``"cuda:a100-80gb"``) or ``"cpu"``, as for :func:`transformer_estimate`.
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
    widths = [check_positive("layer width", w) for w in widths]
    if len(widths) < 2:
        raise ValueError(f"an MLP needs at least an input and an output width, got {list(widths)}")
    batch_size = check_positive("batch_size", batch_size)
    layer_params = [widths[i] * widths[i + 1] + widths[i + 1] for i in range(len(widths) - 1)]
    n_params = sum(layer_params)
    common = common_parts(
        optimizer, precision, device, n_params, max(widths[i] * widths[i + 1] for i in range(len(widths) - 1)), n_params
    )
    precision = common["precision"]
    e = COMPUTE_BYTES[precision]
    mixed = precision.endswith("-mixed")
    pb = PARAM_BYTES[precision]
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
        phases.append(
            (f"step2/backward (layer {i + 1} of {len(layer_params)})", grads_so_far, common["copies"], alive, 0, temp)
        )
    parts = StepParts(
        **static_parts(common),
        inputs=widths[0] * input_bytes(precision),
        acts=acts,
        fwd_temp=widths[-1] * 4 if cross_entropy and e != 4 else 0,
        bwd_temp=2 * widths[-1] * 4 if cross_entropy else widths[-1] * e,
        bwd_end_acts=0,
        extra_phases=tuple(phases),
    )
    notes = base_notes("mlp", precision, common["optimizer"])
    extra = {
        "params": n_params,
        "activation_elements_per_sample": sum(widths[1:]),
        "activation_terms": {
            "hidden outputs": sum(saved[1:]),
            "input cast (autocast)": saved[0],
            "outputs": out,
            "loss (fp32 log-softmax)": loss,
        },
        "napkin": {
            "kind": "mlp",
            "widths": list(widths),
            "optimizer": common["optimizer"],
            "precision": precision,
            "device": common["device"],
            "cross_entropy": cross_entropy,
        },
    }
    return assemble(
        parts, batch_size, method="napkin:mlp", precision=precision, device=common["device"], notes=notes, extra=extra
    )


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
        device: ``"cuda"``, a GPU by name (``"cuda:a100-80gb"``) or ``"cpu"``, as for :func:`transformer_estimate`.
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
    params = check_positive("params", params)
    activations = check_positive("activations", activations, allow_zero=True)
    batch_size = check_positive("batch_size", batch_size)
    input_size = check_positive("input_size", input_size, allow_zero=True)
    largest = largest_param if largest_param is not None else max(1, params // 10)
    common = common_parts(optimizer, precision, device, params, largest, params)
    precision = common["precision"]
    e = COMPUTE_BYTES[precision]
    parts = StepParts(
        **static_parts(common),
        inputs=input_size * input_bytes(precision),
        acts=activations * e,
    )
    notes = base_notes("params", precision, common["optimizer"])
    notes.append(
        "without layer structure, activations are assumed to be freed as gradients appear; "
        "the seeds' rule (activations + gradients at once) is an upper bound"
    )
    if not input_size:
        notes.append("the input batch is not counted (give --input-size)")
    extra = {
        "params": params,
        "activation_terms": {"activations": activations * e},
        "napkin": {
            "kind": "params",
            "params": params,
            "activations": activations,
            "input_size": input_size,
            "optimizer": common["optimizer"],
            "precision": precision,
            "device": common["device"],
            "largest_param": largest_param,
        },
    }
    return assemble(
        parts,
        batch_size,
        method="napkin:params",
        precision=precision,
        device=common["device"],
        notes=notes,
        extra=extra,
    )


# -- explanation ---------------------------------------------------------------
_FUNCTIONS: dict[str, Callable[..., MemoryEstimate]] = {}
