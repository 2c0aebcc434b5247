"""Reads how a Hugging Face ``Trainer`` spreads training over processes, as a :class:`~nnmem_callbacks.core.strategy.Strategy`.

The Trainer hands distribution to accelerate: its ``accelerator.state`` holds an
``FullyShardedDataParallelPlugin`` or a ``DeepSpeedPlugin`` when the run shards,
and neither otherwise. Read by attribute, so nothing here imports accelerate:

* more than one process, neither plugin -> ``"ddp"`` with ``ddp_bucket_cap_mb``
  and ``ddp_static_graph``;
* FSDP (``fsdp_version`` 1 or 2) -> ``"fsdp"``: ``FULL_SHARD`` / ``reshard_after_forward=True``
  reshard after forward, ``SHARD_GRAD_OP`` / ``False`` keep the gathered parameters
  to the backward, ``NO_SHARD`` is DDP, hybrid sharding is not modelled; the
  offload policy, the mixed-precision ``param_dtype`` (else ``bf16``/``fp16`` from the
  arguments) and the units: ``transformer_cls_names_to_wrap``, else the model's
  ``_no_split_modules`` (accelerate's own default), none with ``no_wrap``;
* DeepSpeed -> ``"zero"`` with the stage and offload of its config (ZeRO
  model states from DeepSpeed's formulas); without ZeRO, data parallel.

Without a Trainer (``plan_training_arguments``) the arguments are read instead:
``args.fsdp_config`` as ``TrainingArguments`` normalises it (the legacy ``args.fsdp``
options where it is silent) and ``args.deepspeed`` (a dict or a JSON file).

Example:
    >>> from types import SimpleNamespace
    >>> args = SimpleNamespace(world_size=4, process_index=1, fsdp=True, bf16=True,
    ...                        fsdp_config={"version": 2, "reshard_after_forward": False})
    >>> reading = read_ranks(args)
    >>> reading.strategy.describe(), reading.strategy.param_dtype, reading.strategy.rank
    ('fsdp x4 (reshard_after_forward=False, param_dtype=bfloat16)', 'bfloat16', None)

Known limitations:
    * Hybrid sharding (HSDP: FSDP1's ``HYBRID_SHARD``, or accelerate's ``parallelism_config`` with
      ``dp_replicate_size`` > 1), tensor, context and sequence parallelism are not modelled
      (the estimate is then of one device holding a full replica, and says so).
    * FSDP1 is estimated with the FSDP2 model (a note says so).
    * FSDP's own activation checkpointing (``activation_checkpointing=True`` in
      the plugin) is not traced unless the model has gradient checkpointing on.
    * DeepSpeed's ZeRO model states come from formulas; its communication
      buckets beyond them are not modelled.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from nnmem_callbacks.core.strategy import DEFAULT_BUCKET_CAP_MB, Strategy, deepspeed_strategy

__all__ = ["RankReading", "read_ranks", "unit_modules"]


@dataclasses.dataclass(frozen=True)
class RankReading:
    """What one rank holds.

    Attributes:
        strategy: The :class:`Strategy`; ``None`` on one process, or when the run's kind is not modelled.
        note: What was assumed or is not modelled (``None``: nothing to say).
        unit_classes: FSDP: the class names ``fully_shard`` is applied to (``()``: the root only;
            ``None``: the estimator's default, the model's blocks).
    """

    strategy: Strategy | None
    note: str | None = None
    unit_classes: tuple[str, ...] | None = None


def read_ranks(args: Any, trainer: Any = None, model: Any = None) -> RankReading:
    """How the ranks share the step of ``trainer`` (or, without one, of ``args``).

    The strategy is of the rank that holds the most (``rank=None``), whichever
    process asks: every rank then estimates, plans and acts alike (one rank
    raising while the others wait in a collective would hang the run).
    """
    world = int(getattr(args, "world_size", 1) or 1)
    if world <= 1:
        asked = [name for name, key in (("FSDP", "fsdp"), ("DeepSpeed", "deepspeed")) if getattr(args, key, None)]
        if not asked:
            return RankReading(None)
        return RankReading(
            None,
            f"the arguments ask for {' and '.join(asked)}, but this process is the only rank (world_size=1: not "
            "started by accelerate launch or torchrun), so the estimate is of one device; estimate in the "
            "launched processes for the per-rank figure",
        )
    rank = None  # every process estimates the rank with the most memory, so all of them plan alike
    state = getattr(getattr(trainer, "accelerator", None), "state", None)
    parallel = getattr(state, "parallelism_config", None) if state is not None else None
    unmodelled = _parallelism_not_modelled(parallel or getattr(args, "parallelism_config", None))
    if unmodelled:
        return RankReading(None, unmodelled)
    fsdp = getattr(state, "fsdp_plugin", None)
    deepspeed = getattr(state, "deepspeed_plugin", None)
    if fsdp is not None:
        return _from_fsdp_plugin(fsdp, args, world, rank, model)
    if deepspeed is not None:
        return _from_deepspeed_config(getattr(deepspeed, "deepspeed_config", None) or {}, world, rank)
    if trainer is None and getattr(args, "fsdp", None):
        return _from_fsdp_arguments(args, world, rank, model)
    if trainer is None and getattr(args, "deepspeed", None):
        return _from_deepspeed_config(_deepspeed_config(args.deepspeed), world, rank)
    bucket = getattr(args, "ddp_bucket_cap_mb", None)
    return RankReading(
        Strategy(
            "ddp",
            world_size=world,
            bucket_cap_mb=float(bucket) if bucket else DEFAULT_BUCKET_CAP_MB,
            static_graph=bool(getattr(args, "ddp_static_graph", False)),
            rank=rank,
            backend=_backend(args),
        )
    )


#: accelerate ``ParallelismConfig`` sizes the per-rank estimate does not model, with what each is.
_UNMODELLED_SIZES = (
    ("dp_replicate_size", "replicated shard groups, HSDP"),
    ("tp_size", "tensor parallelism"),
    ("cp_size", "context parallelism"),
    ("sp_size", "sequence parallelism"),
)


def _parallelism_not_modelled(config: Any) -> str | None:
    """Why accelerate's ``ParallelismConfig`` (``TrainingArguments(parallelism_config=...)``) is not modelled, or
    ``None`` when it is plain data parallelism (``dp_shard_size`` only, or nothing set)."""
    if config is None:
        return None
    found = []
    for name, what in _UNMODELLED_SIZES:
        size = getattr(config, name, None)
        if isinstance(size, int) and size > 1:
            found.append(f"{name}={size} ({what})")
    if not found:
        return None
    return (
        f"accelerate's parallelism_config with {', '.join(found)} is not modelled (modelled: DDP, FSDP over all "
        "ranks, DeepSpeed ZeRO); the estimate is of one device holding a full replica (an upper bound)"
    )


def unit_modules(model: Any, reading: RankReading) -> list[Any] | None:
    """The modules ``fully_shard`` is applied to besides the root, for ``estimate_per_rank(units=...)``."""
    if reading.unit_classes is None:
        return None
    names = set(reading.unit_classes)
    return [module for module in model.modules() if module is not model and type(module).__name__ in names]


# ---------------------------------------------------------------------------
# FSDP
# ---------------------------------------------------------------------------


def _name(value: Any) -> str:
    """An enum's or a string's name, upper case (``ShardingStrategy.FULL_SHARD``, ``"full_shard"``, ``1``)."""
    if value is None:
        return ""
    name = getattr(value, "name", None)
    if name is None:
        text = str(value)
        name = {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "3": "NO_SHARD", "4": "HYBRID_SHARD"}.get(text, text)
    return str(name).upper()


def _dtype_name(dtype: Any) -> str | None:
    name = str(dtype).replace("torch.", "") if dtype is not None else None
    return name if name in ("bfloat16", "float16", "float32") else None


def _argument_dtype(args: Any) -> str | None:
    if getattr(args, "bf16", False):
        return "bfloat16"
    if getattr(args, "fp16", False):
        return "float16"
    return None


def _backend(args: Any) -> str | None:
    backend = str(getattr(args, "ddp_backend", None) or "").lower()
    return backend if backend in ("gloo", "nccl") else None


def _fsdp_reading(
    sharding: str, reshard: Any, offload: bool, param_dtype: str | None, units: tuple[str, ...] | None, world: int,
    rank: int | None, backend: str | None, notes: list[str],
) -> RankReading:  # fmt: skip
    if sharding == "NO_SHARD":
        return RankReading(Strategy("ddp", world_size=world, rank=rank, backend=backend), "FSDP NO_SHARD read as DDP")
    if sharding.startswith("HYBRID"):
        return RankReading(
            None,
            f"FSDP {sharding} (hybrid sharding) is not modelled; the estimate is of one device holding a full "
            "replica (an upper bound)",
        )
    reshard_after_forward = bool(reshard) if isinstance(reshard, bool) else sharding != "SHARD_GRAD_OP"
    strategy = Strategy(
        "fsdp",
        world_size=world,
        rank=rank,
        reshard_after_forward=reshard_after_forward,
        offload_params=offload,
        offload_optimizer=offload,
        param_dtype=param_dtype,
        backend=backend,
    )
    return RankReading(strategy, "; ".join(notes) or None, units)


def _units(names: Any, policy: Any, model: Any, notes: list[str]) -> tuple[str, ...] | None:
    if isinstance(names, str):
        names = [part.strip() for part in names.split(",") if part.strip()]
    if names and model is not None and hasattr(model, "modules"):
        classes = {type(module).__name__ for module in model.modules()}
        missing = [name for name in names if name not in classes]
        if missing:
            blocks = sorted(classes & set(getattr(model, "_no_split_modules", None) or ())) or sorted(classes)[:8]
            notes.append(
                f"FSDP transformer_layer_cls_to_wrap names {', '.join(missing)}, which no module of the model is "
                f"(accelerate raises on it; the model's classes include {', '.join(blocks)}): the FSDP units are "
                "assumed to be the model's blocks"
            )
            return None
    if names:
        return tuple(names)
    policy = str(policy).lower() if isinstance(policy, str) else policy
    if policy == "no_wrap":
        return ()
    if policy in (None, "transformer_based_wrap"):
        default = getattr(model, "_no_split_modules", None) if model is not None else None
        if default:
            return tuple(default)
    notes.append("FSDP units assumed to be the model's blocks (a size-based or custom auto-wrap policy)")
    return None


#: What is said of an FSDP1 run (``fsdp_version=1``): estimated with FSDP2's model.
_FSDP1_NOTE = (
    "FSDP1 (fsdp_version=1, one flat parameter per unit) is estimated with the FSDP2 model (per-parameter dim-0 "
    "shards, the same unit lifetimes); the padding of the flat parameters differs"
)


def _from_fsdp_plugin(plugin: Any, args: Any, world: int, rank: int | None, model: Any) -> RankReading:
    version = int(getattr(plugin, "fsdp_version", 1) or 1)
    reshard = getattr(plugin, "reshard_after_forward", None)
    if version >= 2:
        sharding = (
            "FULL_SHARD"
            if reshard is None or reshard is True
            else ("SHARD_GRAD_OP" if reshard is False else _name(reshard))
        )
    else:
        sharding = _name(getattr(plugin, "sharding_strategy", None) or reshard) or "FULL_SHARD"
        reshard = None
    notes: list[str] = [_FSDP1_NOTE] if version < 2 else []
    offload_policy = getattr(plugin, "cpu_offload", None)
    offload = (
        bool(getattr(offload_policy, "offload_params", False)) or type(offload_policy).__name__ == "CPUOffloadPolicy"
    )
    mixed = getattr(plugin, "mixed_precision_policy", None)
    param_dtype = _dtype_name(getattr(mixed, "param_dtype", None)) or _argument_dtype(args)
    if getattr(plugin, "activation_checkpointing", False):
        notes.append("FSDP activation_checkpointing is not traced unless the model has gradient checkpointing on")
    units = _units(
        getattr(plugin, "transformer_cls_names_to_wrap", None), getattr(plugin, "auto_wrap_policy", None), model, notes
    )
    return _fsdp_reading(sharding, reshard, offload, param_dtype, units, world, rank, _backend(args), notes)


def _from_fsdp_arguments(args: Any, world: int, rank: int | None, model: Any) -> RankReading:
    """``args.fsdp_config`` as ``TrainingArguments`` normalises it (``version``, ``reshard_after_forward``,
    ``cpu_offload``, ``auto_wrap_policy``...), with the legacy ``args.fsdp`` options where it says nothing."""
    options = args.fsdp if not isinstance(args.fsdp, bool) else ()
    if isinstance(options, str):
        options = options.split()
    options = [str(getattr(option, "value", option)).lower() for option in options or ()]
    config = dict(getattr(args, "fsdp_config", None) or {})
    version = int(config.get("version", config.get("fsdp_version", 2)) or 2)
    legacy = next(
        (o for o in options if o in ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2")),
        None,
    )
    reshard = config.get(
        "reshard_after_forward", legacy if legacy is not None else ("full_shard" if version < 2 else True)
    )
    if version >= 2:
        if isinstance(reshard, str):
            reshard = reshard.lower() in ("true", "1", "yes", "full_shard")
        sharding = "FULL_SHARD" if reshard else "SHARD_GRAD_OP"
    else:
        sharding, reshard = str(reshard).upper(), None
    offload = bool(config.get("cpu_offload")) or "offload" in options
    notes: list[str] = [_FSDP1_NOTE] if version < 2 else []
    if config.get("activation_checkpointing"):
        notes.append("FSDP activation_checkpointing is not traced unless the model has gradient checkpointing on")
    names = config.get("transformer_layer_cls_to_wrap") or config.get("transformer_cls_names_to_wrap")
    units = _units(names, config.get("auto_wrap_policy", "transformer_based_wrap"), model, notes)
    return _fsdp_reading(sharding, reshard, offload, _argument_dtype(args), units, world, rank, _backend(args), notes)


# ---------------------------------------------------------------------------
# DeepSpeed
# ---------------------------------------------------------------------------


def _deepspeed_config(value: Any) -> dict[str, Any]:
    """``args.deepspeed``: a dict, a JSON file, or an ``HfDeepSpeedConfig``-like object with ``.config``."""
    if isinstance(value, dict):
        return value
    if isinstance(value, (str, os.PathLike)) and os.path.isfile(value):
        with open(value, encoding="utf-8") as handle:
            return json.load(handle)
    return dict(getattr(value, "config", None) or {})


def _from_deepspeed_config(config: dict[str, Any], world: int, rank: int | None) -> RankReading:
    strategy, note = deepspeed_strategy(config, world, rank)
    return RankReading(strategy, note)
