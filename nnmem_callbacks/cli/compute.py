"""Computing: the estimators (traced, Keras, napkin) and the fit against the budget and each GPU."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
from typing import Any, Iterator

from nnmem_callbacks.cli.errors import CliError, checked_value, first_line, require_module
from nnmem_callbacks.cli.gpu_fits import GpuFit, gpu_rows, sequence_rows
from nnmem_callbacks.cli.models import build_model, check_forward, check_forward_inputs, load_factory, make_batch
from nnmem_callbacks.cli.targets import Target, resolve_target
from nnmem_callbacks.cli.values import parse_count, parse_input_shape, parse_model_args
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.plan import DEFAULT_MARGIN, Plan, make_plan, planning_margin
from nnmem_callbacks.estimators import napkin

__all__ = [
    "calc_mode",
    "CALC_MODES",
    "check_options_apply",
    "fit_summary",
    "FitSummary",
    "gathered_unit_bytes",
    "GpuFit",
    "napkin_from_args",
    "run_estimate",
    "sequence_summary",
    "strategy_from_args",
]


def strategy_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~nnmem_callbacks.core.strategy.Strategy` of ``--world-size``, ``--fsdp`` and ``--zero-stage``.

    ``--fsdp`` and ``--zero-stage`` shard over ``--world-size`` ranks, so they need it (both commands: without it the
    figure was one rank holding everything, titled "per rank of fsdp x1"); ``calc`` then also counts, per GPU of
    its table, the fewest ranks whose share fits.

    Raises:
        CliError: ``--fsdp`` with ``--zero-stage``, or either without ``--world-size``.

    Example:
        >>> import argparse
        >>> strategy_from_args(argparse.Namespace(world_size=8, fsdp=True, zero_stage=None)).describe()
        'fsdp x8 (reshard_after_forward=True)'
        >>> strategy_from_args(argparse.Namespace(world_size=None, fsdp=False, zero_stage=None)).kind
        'single'
        >>> strategy_from_args(argparse.Namespace(world_size=None, fsdp=False, zero_stage=3))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        nnmem_callbacks.cli.errors.CliError: --zero-stage 3 shards over --world-size ranks, and none was given; ...
    """
    from nnmem_callbacks.core.strategy import Strategy

    given = getattr(args, "world_size", None)
    world_size = int(given or 1)
    fsdp, stage = bool(getattr(args, "fsdp", False)), getattr(args, "zero_stage", None)
    if fsdp and stage:
        raise CliError("--fsdp and --zero-stage exclude each other: FSDP is PyTorch's sharding, ZeRO DeepSpeed's")
    if (fsdp or stage) and given is None:
        flag = "--fsdp" if fsdp else f"--zero-stage {stage}"
        raise CliError(
            f"{flag} shards over --world-size ranks, and none was given; give --world-size N, the ranks training "
            f"together, e.g. --world-size 8 {flag}"
        )
    if fsdp:
        return Strategy("fsdp", world_size=world_size)
    if stage:
        return Strategy("zero", world_size=world_size, zero_stage=int(stage))
    return Strategy("ddp", world_size=world_size) if world_size > 1 else Strategy("single")


def gathered_unit_bytes(estimate: MemoryEstimate) -> int:
    """FSDP/ZeRO-3 napkin: bytes of the two largest units alive at once (the current one and its prefetch).

    Transformer mode: two layers' parameters; other modes do not know their units (0, and a note says so).
    """
    spec = estimate.extra.get("napkin", {})
    params = int(estimate.extra.get("params", 0) or 0)
    layers = spec.get("layers") if spec.get("kind") == "transformer" else None
    if not layers or not params:
        return 0
    per_param = max(1, round(estimate.breakdown.get("parameters", 0) / params))
    return 2 * (params // int(layers)) * per_param


#: ``nnmem estimate`` options a saved Keras model cannot take: (flag, dest, the value that means "not written").
_FACTORY_ONLY = (("--model-arg", "model_arg", None), ("--world-size", "world_size", None), ("--fsdp", "fsdp", False))
_FACTORY_ONLY += (("--zero-stage", "zero_stage", None),)


def run_estimate(args: argparse.Namespace, target: Target) -> MemoryEstimate:
    """Builds the model and batch from ``args`` and calls the estimator."""
    spec = args.model
    if is_keras_file(spec):
        if getattr(args, "compile", False) or getattr(args, "compile_mode", None):
            raise CliError(
                "--compile estimates a torch.compile'd PyTorch step; for a Keras model set jit_compile in "
                "model.compile() before saving it"
            )
        if getattr(args, "seq_len", None):
            raise CliError("--seq-len traces the step at other lengths for PyTorch factory models only, not Keras")
        unused = [flag for flag, dest, unset in _FACTORY_ONLY if getattr(args, dest, unset) != unset]
        if unused:
            raise CliError(
                f"{' and '.join(unused)} {'applies' if len(unused) == 1 else 'apply'} to PyTorch factory models "
                f"only; a saved Keras model is estimated as saved, on one device: drop {' and '.join(unused)}"
            )
        return _keras_estimate(spec, args, target)
    if getattr(args, "seq_len", None) and strategy_from_args(args).kind != "single":
        raise CliError(
            f"--seq-len {args.seq_len} traces other lengths on one device, and the per-rank estimate of "
            "--world-size, --fsdp and --zero-stage has no sequence axis; drop --seq-len, or estimate one device"
        )
    require_module("torch", "nnmem estimate needs PyTorch for factory models: pip install 'nnmem_callbacks[torch]'")
    factory = load_factory(spec)
    inputs = [parse_input_shape(text) for text in (args.input_shape or [])]
    if not inputs:
        raise CliError("give the model's input shape, e.g. --input-shape 3,224,224 (per sample, no batch dimension)")
    precision = checked_value(napkin.check_precision, args.precision, "--precision")
    model = build_model(spec, parse_model_args(args.model_arg), factory=factory)
    if getattr(args, "seq_len", None):
        _check_token_ids(inputs, args.seq_len)
    batch = make_batch(inputs, args.batch_size)
    check_forward_inputs(model, inputs)
    traced_model = _compiled(model, args)
    import warnings

    from nnmem_callbacks.estimators.torch.estimator import estimate_training

    # a first estimate on a new machine runs its kernels for tens of seconds: say so on stderr while it does
    said = logging.StreamHandler(sys.stderr)
    said.setFormatter(logging.Formatter("nnmem: %(message)s; --no-probes skips this"))
    try:
        with (
            _logging_at("torch._subclasses.fake_tensor", logging.CRITICAL),
            _logging_at("nnmem_callbacks.probes.session", logging.INFO, said),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore", RuntimeWarning)
            strategy = strategy_from_args(args)
            probes = not getattr(args, "no_probes", False)
            device = f"cuda:{target.gpu.name}" if target.gpu is not None else target.device
            if strategy.kind == "single":
                estimate = estimate_training(
                    traced_model,
                    batch,
                    optimizer=args.optimizer,
                    precision=precision,
                    device=device,
                    sequence_dim="auto" if getattr(args, "seq_len", None) else None,
                    probe_kernels=probes,
                )
            else:
                from nnmem_callbacks.estimators.torch.distributed import estimate_per_rank

                estimate = estimate_per_rank(
                    traced_model,
                    batch,
                    optimizer=args.optimizer,
                    precision=precision,
                    device=device,
                    strategy=strategy,
                    probe_kernels=probes,
                )
    except ValueError as error:
        raise CliError(str(error)) from None
    if not estimate.method.startswith("trace"):
        check_forward(model, inputs)
    return estimate


def _check_token_ids(inputs: list[Any], seq_len: int) -> None:
    """``--seq-len`` needs an input of token ids (integer, per-sample shape ``(LEN,)``, ``LEN`` >= 4), the one
    ``sequence_dim="auto"`` takes the length from.

    Raises:
        CliError: Naming the inputs given and the ``-i`` that gives token ids.
    """
    token_ids = [spec for spec in inputs if not spec.dtype.startswith(("float", "bfloat")) and len(spec.shape) == 1]
    if any(spec.shape[0] >= 4 for spec in token_ids):
        return
    if token_ids:
        raise CliError(
            f"--seq-len {seq_len}: the token ids' length must be 4 or more to trace other lengths; "
            f"e.g. -i input_ids=int64:128"
        )
    given = " ".join(
        f"-i {spec.name + '=' if spec.name else ''}{spec.dtype}:{','.join(map(str, spec.shape))}" for spec in inputs
    )
    raise CliError(
        f"--seq-len {seq_len} scales the length of the token ids, and the inputs given ({given}) hold none; "
        f"give integer token ids, e.g. -i input_ids=int64:LEN (LEN the length to trace at, such as 128)"
    )


@contextlib.contextmanager
def _logging_at(name: str, level: int, handler: logging.Handler | None = None) -> Iterator[None]:
    """The logger ``name`` at ``level`` (and with ``handler``) inside; as it was after."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    if handler is not None:
        logger.addHandler(handler)
    try:
        yield
    finally:
        if handler is not None:
            logger.removeHandler(handler)
        logger.setLevel(before)


def sequence_summary(estimate: MemoryEstimate, seq_len: int, fit: "FitSummary") -> dict[str, Any]:
    """``--seq-len``: the peak at that length and batch, and the longest length whose peak fits the usable budget.

    The comparison is of the tensor peak; on CUDA the allocator reserve and the context are added as they are at
    the traced length (their share of the peak), which the notes of the answer say.
    """
    batch = estimate.batch_size
    peak = checked_value(lambda length: estimate.peak_bytes_at(batch, seq_len=length), seq_len, "--seq-len")
    answer: dict[str, Any] = {
        "traced_seq_len": estimate.sequence.seq_len,
        "traced_lengths": list(estimate.sequence.traced_lengths),
        "seq_len": seq_len,
        "batch_size": batch,
        "peak_bytes": peak,
        "max_sequence_length": None,
        "max_positions": estimate.sequence.max_positions,  # the model's own limit (None: none found)
    }
    usable = fit.usable_bytes
    if usable is not None:
        if fit.compared == "device" and estimate.peak_bytes > 0:
            usable = estimate.tensor_share_of_device(usable)
            answer["note"] = "device total at other lengths: the traced length's reserve ratio and context"
        answer["usable_peak_bytes"] = usable
        answer["max_sequence_length"] = estimate.max_sequence_length(usable, batch)
    if fit.gpus:  # which GPU fits at this length: each one's longest length at the batch
        answer["gpus"] = sequence_rows(estimate, fit.gpus, peak, fit.margin)
        answer["note"] = "device total at other lengths: the traced length's reserve ratio and context"
    return answer


def _compiled(model: Any, args: argparse.Namespace) -> Any:
    """``torch.compile(model, mode=...)`` for ``--compile``; the model itself without it."""
    mode = getattr(args, "compile_mode", None)
    if not getattr(args, "compile", False):
        if mode is not None:
            raise CliError(f"--compile-mode {mode} needs --compile (estimate the torch.compile'd step)")
        return model
    import torch

    return torch.compile(model, mode=None if mode in (None, "default") else mode)


def is_keras_file(spec: str) -> bool:
    """Whether ``nnmem estimate``'s model is a saved Keras model (else a PyTorch factory)."""
    return spec.endswith((".keras", ".h5"))


def keras_target(device: str | None) -> Target:
    """Where a saved Keras model is estimated: where its Keras backend runs here (the CPU, without ``--device``).

    The Keras estimators measure and replay the backend on this machine; they cannot model a GPU it does not have,
    so a GPU named from the table, or ``cuda`` without a local GPU, is refused rather than answered with the CPU's
    figure.
    """
    target = resolve_target("cpu" if device is None else device)
    if target.is_cuda and (target.gpu is not None or target.capacity_bytes is None):
        raise CliError(
            f"--device {device}: a saved Keras model is estimated with its Keras backend on this machine, which "
            "cannot model a GPU it does not have; drop --device for the CPU's figure (and give --budget), or run "
            "nnmem estimate on a machine with that GPU (--device cuda)"
        )
    return target


def _keras_estimate(spec: str, args: argparse.Namespace, target: Target) -> MemoryEstimate:
    if not os.path.isfile(spec):
        raise CliError(f"Keras model file {spec!r} not found")
    try:
        import keras

        from nnmem_callbacks.estimators.keras.estimator import estimate_training as keras_estimate
    except ImportError as error:  # no Keras, or Keras without its backend (TensorFlow by default)
        raise CliError(
            f"estimating the saved Keras model {spec!r} needs Keras and TensorFlow: "
            f"pip install 'nnmem_callbacks[keras,tensorflow]' (or Keras on JAX: 'nnmem_callbacks[jax]' with "
            f"KERAS_BACKEND=jax) ({first_line(error) or 'not importable'})"
        ) from None
    precision = checked_value(napkin.check_precision, args.precision, "--precision")
    if precision != "32-true":
        raise CliError(
            f"a saved Keras model keeps the dtype policy it was saved with, so --precision {precision} cannot be "
            f"applied to {spec!r}; save it under keras.mixed_precision.set_global_policy('mixed_bfloat16') "
            f"(or 'mixed_float16') instead, and drop --precision"
        )
    model = keras.models.load_model(spec)
    _check_keras_inputs(model, args.input_shape, spec)
    notes = []
    saved_optimizer = getattr(model, "optimizer", None)
    saved_loss = getattr(model, "loss", None)
    optimizer_given = bool(getattr(args, "optimizer_given", False))
    if optimizer_given or saved_optimizer is None:
        loss = saved_loss or "mse"
        model.compile(optimizer=_keras_optimizer(keras, args.optimizer), loss=loss)
        if saved_optimizer is None:
            notes.append(
                f"the saved model was not compiled: estimated with --optimizer {args.optimizer}"
                + ("" if optimizer_given else " (the default)")
            )
        else:
            notes.append(
                f"--optimizer {args.optimizer} replaces the saved model's {type(saved_optimizer).__name__} optimizer"
            )
        if saved_loss is None:
            notes.append(
                "the saved model has no loss: estimated with a mean squared error loss ('mse'); compile "
                "it with its real loss and save it again for an exact figure"
            )
    elif saved_loss is None:
        raise CliError(
            f"the Keras model in {spec!r} was saved without a loss; compile it with a loss and save it again"
        )
    estimate = keras_estimate(model, batch_size=args.batch_size, probe_kernels=not getattr(args, "no_probes", False))
    optimizer = type(model.optimizer).__name__  # the saved one, or the one --optimizer compiled it with
    return dataclasses.replace(
        estimate, notes=(*estimate.notes, *notes), extra={**dict(estimate.extra), "keras_optimizer": optimizer}
    )


def _check_keras_inputs(model: Any, given: list[str] | None, spec: str) -> None:
    """``--input-shape`` for a saved Keras model must be the model's own input shapes (it has them)."""
    if not given:
        return
    shapes = [tuple(int(d) if d is not None else None for d in tuple(t.shape)[1:]) for t in model.inputs]
    wanted = [parse_input_shape(text).shape for text in given]
    if len(wanted) != len(shapes) or any(
        len(w) != len(s) or any(d is not None and d != v for d, v in zip(s, w)) for w, s in zip(wanted, shapes)
    ):
        written = " ".join(f"-i {','.join(str(d) for d in s)}" for s in shapes)
        raise CliError(
            f"--input-shape {' '.join(given)} does not match the saved model {spec!r}, whose per-sample input "
            f"shape(s) are {written}; a saved Keras model knows its inputs, so --input-shape can be left out"
        )


def _keras_optimizer(keras: Any, name: str) -> Any:
    """A Keras optimizer for a canonical ``--optimizer`` name (:mod:`nnmem_callbacks.core.vocabulary`)."""
    if name == "sgd_momentum":
        return keras.optimizers.SGD(momentum=0.9)
    try:
        return keras.optimizers.get(name)
    except ValueError:
        raise CliError(
            f"--optimizer {name}: Keras has no such optimizer, so it cannot be applied to a Keras model; "
            f"use sgd, sgd_momentum, adam, adamw, adamax, nadam, adagrad, adadelta or rmsprop"
        ) from None


def napkin_from_args(args: argparse.Namespace, device: str = "cuda") -> MemoryEstimate:
    """Picks the napkin mode from the ``calc`` options and computes the estimate.

    Raises:
        CliError: When the options fit no mode, naming what each mode needs.
    """
    common = dict(optimizer=args.optimizer, precision=args.precision, device=device)
    layers = args.layers
    mode = calc_mode(args)
    if mode is not None:
        check_options_apply(args, mode)
    try:
        if mode == "lora":
            return _lora_from_args(args, common)
        if args.hidden is not None:
            missing = [
                flag
                for flag, value in (("--layers", layers), ("--heads", args.heads), ("--seq-len", args.seq_len))
                if value is None
            ]
            if missing:
                raise CliError(
                    f"transformer mode (--hidden) also needs {', '.join(missing)}; e.g. "
                    f"--layers 12 --hidden 768 --heads 12 --seq-len 128 --vocab 30522"
                )
            if not layers.strip().isdigit():
                raise CliError(
                    f"--layers {layers!r}: with --hidden, give the number of transformer layers, e.g. --layers 12"
                )
            return napkin.transformer_estimate(
                layers=int(layers),
                hidden=args.hidden,
                heads=args.heads,
                seq_len=args.seq_len,
                batch_size=args.batch_size,
                vocab=args.vocab,
                ffn=args.ffn,
                params=args.params,
                arch=args.arch,
                max_positions=args.max_positions,
                recompute=args.recompute,
                attention=args.attention or "eager",
                activation=args.activation,
                dropout=not args.no_dropout,
                **common,
            )
        if layers is not None:
            try:
                widths = [parse_count(part) for part in layers.split(",") if part.strip()]
            except ValueError:
                raise CliError(
                    f"--layers {layers!r}: write MLP widths from input to output, e.g. 1000,100,100,10"
                ) from None
            if len(widths) < 2:
                raise CliError(
                    f"--layers {layers!r}: an MLP needs at least two widths (input,output), e.g. 1000,100,10; "
                    f"for a transformer add --hidden, --heads and --seq-len"
                )
            return napkin.mlp_estimate(widths, args.batch_size, **common)
        if args.params is not None and args.activations is not None:
            return napkin.params_estimate(
                args.params, args.activations, args.batch_size, input_size=args.input_size, **common
            )
    except ValueError as error:
        raise CliError(str(error)) from None
    raise CliError(
        "nnmem calc needs one of: transformer (--layers L --hidden H --heads A --seq-len S [--vocab V]), "
        "MLP (--layers 1000,100,10) or counts (--params N --activations N); see `nnmem calc --help`"
    )


#: ``nnmem calc``'s modes, as the options that pick them are written (``nnmem calc --help``).
CALC_MODES = {
    "transformer": "transformer mode (--layers L --hidden H --heads A --seq-len S)",
    "lora": "LoRA mode (--lora-rank R with the transformer options and --ffn)",
    "mlp": "MLP mode (--layers W1,W2,..., no --hidden)",
    "counts": "counts mode (--params N --activations N)",
}

#: The mode-specific ``nnmem calc`` options: (flag, dest, the value that means "not written", modes that use it).
#: The parser records an option written even at its default (``<dest>_given``); the value is the fallback for a
#: namespace built without the parser.
_MODE_OPTIONS = (
    ("--layers", "layers", None, ("transformer", "lora", "mlp")),
    ("--heads", "heads", None, ("transformer", "lora")),
    ("--seq-len", "seq_len", None, ("transformer", "lora")),
    ("--vocab", "vocab", 0, ("transformer", "lora")),
    ("--ffn", "ffn", None, ("transformer", "lora")),
    ("--recompute", "recompute", "none", ("transformer", "lora")),
    ("--attention", "attention", None, ("transformer", "lora")),
    ("--arch", "arch", "gpt", ("transformer",)),
    ("--max-positions", "max_positions", None, ("transformer",)),
    ("--activation", "activation", "gelu", ("transformer",)),
    ("--no-dropout", "no_dropout", False, ("transformer",)),
    ("--kv-heads", "kv_heads", None, ("lora",)),
    ("--lora-targets", "lora_targets", "q,k,v,o", ("lora",)),
    ("--quantize", "quantize", "none", ("lora",)),
    ("--params", "params", None, ("transformer", "counts")),
    ("--activations", "activations", None, ("counts",)),
    ("--input-size", "input_size", 0, ("counts",)),
)


def calc_mode(args: argparse.Namespace) -> str | None:
    """The ``nnmem calc`` mode the options pick (a key of :data:`CALC_MODES`), ``None`` when they pick none.

    ``--lora-rank`` picks LoRA; else ``--hidden`` the transformer; else ``--layers`` the MLP; else ``--params``
    with ``--activations`` the counts mode.

    Example:
        >>> import argparse
        >>> calc_mode(argparse.Namespace(lora_rank=None, hidden=None, layers="784,10", params=None, activations=None))
        'mlp'
    """
    if getattr(args, "lora_rank", None) is not None:
        return "lora"
    if getattr(args, "hidden", None) is not None:
        return "transformer"
    if getattr(args, "layers", None) is not None:
        return "mlp"
    if getattr(args, "params", None) is not None and getattr(args, "activations", None) is not None:
        return "counts"
    return None


def _written(args: argparse.Namespace, dest: str, unset: Any) -> bool:
    """Whether the option ``dest`` was written (at its default too, where the parser recorded it)."""
    return bool(getattr(args, f"{dest}_given", False)) or getattr(args, dest, unset) != unset


def check_options_apply(args: argparse.Namespace, mode: str) -> None:
    """Refuses the options written that ``mode`` does not use, naming the mode each belongs to.

    Raises:
        CliError: Naming each such option and the modes in which it applies.

    Example:
        >>> import argparse
        >>> ns = argparse.Namespace(layers="784,10", params=19_000_000)
        >>> try:
        ...     check_options_apply(ns, "mlp")
        ... except CliError as error:
        ...     print(str(error).split(":")[0])
        --params does not apply in MLP mode (--layers W1,W2,..., no --hidden), which would ignore it
    """
    groups: dict[tuple[str, ...], list[str]] = {}
    for flag, dest, unset, modes in _MODE_OPTIONS:
        if mode not in modes and hasattr(args, dest) and _written(args, dest, unset):
            groups.setdefault(modes, []).append(flag)
    if not groups:
        return
    flags = [flag for group in groups.values() for flag in group]
    one = len(flags) == 1
    where = "; ".join(
        f"{_and(group) if len(groups) > 1 else 'it' if one else 'they'} {'applies' if len(group) == 1 else 'apply'} "
        f"in {' or '.join(CALC_MODES[m] for m in modes)}"
        for modes, group in groups.items()
    )
    raise CliError(
        f"{_and(flags)} {'does' if one else 'do'} not apply in {CALC_MODES[mode]}, which would ignore "
        f"{'it' if one else 'them'}: {where}; drop {'it' if one else 'them'}, or give the options of the mode meant"
    )


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _lora_from_args(args: argparse.Namespace, common: dict[str, Any]) -> MemoryEstimate:
    """``nnmem calc --lora-rank R ...``: LoRA / QLoRA of a Llama-style decoder."""
    needed = (
        ("--layers", args.layers),
        ("--hidden", args.hidden),
        ("--heads", args.heads),
        ("--seq-len", args.seq_len),
        ("--ffn", args.ffn),
        ("--vocab", args.vocab or None),
    )
    missing = [flag for flag, value in needed if value is None]
    if missing:
        raise CliError(
            f"LoRA mode (--lora-rank) also needs {', '.join(missing)}; e.g. --layers 32 --hidden 4096 --heads 32 "
            f"--ffn 11008 --vocab 32000 --seq-len 2048"
        )
    if not args.layers.strip().isdigit():
        raise CliError(f"--layers {args.layers!r}: with --lora-rank, give the number of layers, e.g. --layers 32")
    if args.recompute == "selective":
        raise CliError("--recompute selective: LoRA mode models full (gradient checkpointing) or none")
    targets = [name.strip() for name in args.lora_targets.split(",") if name.strip()]
    if not targets:
        valid = ",".join(napkin.LORA_TARGETS)
        raise CliError(f"--lora-targets {args.lora_targets!r} names no layer; give some of {valid}, e.g. q,k,v,o")
    return napkin.lora_estimate(
        layers=int(args.layers),
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        vocab=args.vocab,
        ffn=args.ffn,
        lora_rank=args.lora_rank,
        lora_targets=targets,
        quantization=args.quantize,
        recompute=args.recompute,
        attention=args.attention or "flash",
        **common,
    )


@dataclasses.dataclass(frozen=True)
class FitSummary:
    """The estimate compared with the target's budget and with the GPU table.

    The comparison is :func:`nnmem_callbacks.core.plan.make_plan`'s, the one the
    callbacks make: the batch fits exactly when it is at most ``max_batch_size``,
    the largest batch below the budget less ``margin`` (a budget resolved from no
    ``--budget`` is the free memory less ``margin`` already: ``budget_named`` False).
    """

    target: Target
    budget_bytes: int | None
    compared: str  # "device" (reserve + overhead) or "peak"
    predicted_bytes: int
    max_batch_size: int | None  # None: no budget, or not known (the step could not run)
    fits: bool | None
    gpus: tuple[GpuFit, ...]
    margin: float = DEFAULT_MARGIN
    plan: Plan | None = None
    budget_named: bool = True

    @property
    def usable_bytes(self) -> int | None:
        """What the batch must fit into: the budget less the margin (once)."""
        if self.budget_bytes is None:
            return None
        return self.plan.usable_bytes if self.plan is not None else int(self.budget_bytes * (1 - self.margin))

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": {
                "device": self.target.device,
                "gpu": self.target.gpu.name if self.target.gpu else None,
                "capacity_bytes": self.target.capacity_bytes,
                "capacity_source": self.target.capacity_source,
                "nvidia_smi_bytes": self.target.gpu.memory_bytes if self.target.gpu else None,  # shown, not fitted
                "free_bytes": self.target.free_bytes,
            },
            "budget_bytes": self.budget_bytes,
            "margin": self.margin,
            "budget_named": self.budget_named,
            "usable_bytes": self.usable_bytes,
            "compared": self.compared,
            "predicted_bytes": self.predicted_bytes,
            "max_batch_size": self.max_batch_size,
            "fits": self.fits,
            "suggestions": [dataclasses.asdict(s) for s in self.plan.suggestions] if self.plan else [],
            "verification": self.plan.verification.to_dict() if self.plan and self.plan.verification else None,
            "gpus": [row.to_dict() for row in self.gpus],
        }


def fit_summary(
    estimate: MemoryEstimate,
    target: Target,
    budget_bytes: int | None,
    margin: float = DEFAULT_MARGIN,
    *,
    budget_named: bool = True,
) -> FitSummary:
    """Compares ``estimate`` with the budget and, without a known device memory, with every GPU
    (:func:`~nnmem_callbacks.cli.gpu_fits.gpu_rows`: each card's usable memory, as CUDA reports it).

    On CUDA the device bytes (allocator reserve plus context) are compared,
    on CPU the tensor peak. Each comparison is :func:`~nnmem_callbacks.core.plan.make_plan`;
    a GPU row's budget is :func:`~nnmem_callbacks.core.plan.resolve_budget` of its usable memory with no budget.
    ``budget_named=False`` says that ``budget_bytes`` was resolved from no
    ``--budget`` and so already keeps ``margin`` free; the plan then does not
    take it again (:func:`~nnmem_callbacks.core.plan.planning_margin`).

    Example:
        >>> from nnmem_callbacks.cli.targets import resolve_budget_bytes, resolve_target
        >>> est = napkin.params_estimate(1_000_000, 100_000, 32, optimizer="sgd")
        >>> t4 = resolve_target("t4")
        >>> fit = fit_summary(est, t4, resolve_budget_bytes(None, t4))
        >>> fit.max_batch_size > 32, fit.fits, fit.gpus
        (True, True, ())
    """
    include_reserve = target.is_cuda
    predicted = estimate.device_bytes if include_reserve else estimate.peak_bytes
    known = estimate.method != "static-only"  # no forward ran: no largest batch can be given (None), nor checked
    plan = None
    if budget_bytes is not None:
        # a budget resolved from no --budget already keeps the margin free (plan.planning_margin)
        # the largest batch the command reports is checked by a direct estimate there, as the callbacks' are
        plan = make_plan(
            estimate,
            budget_bytes,
            "warn",
            margin if budget_named else planning_margin(None, margin),
            include_reserve=include_reserve,
            verify=True if estimate.verifier is not None and known else None,
        )
    rows: tuple[GpuFit, ...] = ()
    if target.is_cuda and target.gpu is None and target.capacity_bytes is None:
        rows = gpu_rows(estimate, margin, known=known)  # each card's usable memory, workspaces and context
    return FitSummary(
        target,
        budget_bytes,
        "device" if include_reserve else "peak",
        predicted,
        plan.max_fitting_batch_size if plan and known else None,
        plan.fits if plan else None,
        rows,
        margin,
        plan,
        budget_named,
    )
