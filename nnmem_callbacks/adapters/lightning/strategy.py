"""Reads a Lightning strategy as a :class:`~nnmem_callbacks.core.strategy.Strategy`.

Works for both Lightning namespaces (``pytorch_lightning`` and
``lightning.pytorch``): strategies are recognised by class name and read by
attribute, so nothing here imports Lightning.

* ``SingleDeviceStrategy`` -> ``Strategy("single")``
* ``DDPStrategy`` (``ddp``, ``ddp_spawn``, ``ddp_fork``, ``ddp_notebook``) ->
  ``"ddp"`` with its ``gradient_as_bucket_view``, ``static_graph`` and ``bucket_cap_mb``
* ``FSDPStrategy`` -> ``"fsdp"`` (``FULL_SHARD``: reshard after forward;
  ``SHARD_GRAD_OP``: not), units from its ``auto_wrap_policy`` when that is a
  set of module classes; ``NO_SHARD`` reads as DDP. Lightning's FSDPStrategy is
  FSDP1 (flat parameters); its units' lifetimes are FSDP2's, so the FSDP2 model applies,
  and the reading's ``reason`` says so (the callback warns it).
* ``DeepSpeedStrategy`` -> ``"zero"`` with the stage and offload of its config
* ``ModelParallelStrategy`` with ``tensor_parallel_size=1`` -> ``"fsdp"`` (FSDP2,
  ``fully_shard`` assumed on the model's blocks and the root)
* anything else (tensor parallelism, XLA, hybrid sharding...) -> not modelled

Example:
    >>> class SingleDeviceStrategy: pass
    >>> read_strategy(SingleDeviceStrategy()).strategy.kind
    'single'
    >>> class XLAStrategy: pass
    >>> read_strategy(XLAStrategy(), world_size=8, global_rank=3).strategy is None
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nnmem_callbacks.core.strategy import DEFAULT_BUCKET_CAP_MB, Strategy, deepspeed_strategy

__all__ = ["read_strategy", "StrategyReading", "units_for"]

_DDP = {"DDPStrategy", "DDPSpawnStrategy", "DDPFullyShardedStrategy"}


@dataclasses.dataclass(frozen=True)
class StrategyReading:
    """What :func:`read_strategy` found.

    Attributes:
        strategy: The description, or ``None`` when the strategy is not modelled.
        name: The Lightning strategy's class name.
        reason: Why it is not modelled (``None`` when it is), or what is approximated.
        unit_classes: FSDP: the module classes its auto-wrap policy wraps
            (``None``: the default units of :func:`nnmem_callbacks.estimators.torch.distributed.default_units`).
    """

    strategy: Strategy | None
    name: str
    reason: str | None = None
    unit_classes: tuple[type, ...] | None = None


def _classes(strategy: Any) -> list[str]:
    return [cls.__name__ for cls in type(strategy).__mro__]


def read_strategy(strategy: Any, *, world_size: int = 1, global_rank: int = 0) -> StrategyReading:
    """A Lightning strategy (``trainer.strategy``) as a :class:`Strategy` for rank ``global_rank`` of ``world_size``."""
    name = type(strategy).__name__
    names = _classes(strategy)
    world_size = int(world_size or 1)
    rank = int(global_rank or 0)
    rank = rank if 0 <= rank < world_size else None
    if "SingleDeviceStrategy" in names:
        return StrategyReading(Strategy("single"), name)
    if "DeepSpeedStrategy" in names:
        return _deepspeed(strategy, name, world_size, rank)
    if "FSDPStrategy" in names:
        return _fsdp(strategy, name, world_size, rank)
    if "ModelParallelStrategy" in names:
        tensor_parallel = getattr(strategy, "_tensor_parallel_size", None)
        data_parallel = getattr(strategy, "_data_parallel_size", None)
        if tensor_parallel == 1 and data_parallel == world_size:
            return StrategyReading(
                Strategy("fsdp", world_size=world_size, rank=rank, backend=_backend(strategy)),
                name,
                "ModelParallelStrategy with data parallelism only: fully_shard (FSDP2) on the model's blocks and "
                "the root assumed (configure_model has not run when the estimate is made)",
            )
        return StrategyReading(
            None,
            name,
            f"ModelParallelStrategy with tensor_parallel_size={tensor_parallel!r} (tensor parallelism "
            "is not modelled; data_parallel_size=world size with tensor_parallel_size=1 is)",
        )
    if any(n in _DDP for n in names):
        kwargs = dict(getattr(strategy, "_ddp_kwargs", None) or {})
        return StrategyReading(
            Strategy(
                "ddp",
                world_size=world_size,
                rank=rank,
                bucket_cap_mb=float(kwargs.get("bucket_cap_mb") or DEFAULT_BUCKET_CAP_MB),
                gradient_as_bucket_view=bool(kwargs.get("gradient_as_bucket_view", False)),
                static_graph=bool(kwargs.get("static_graph", False)),
                backend=_backend(strategy),
            ),
            name,
        )
    return StrategyReading(None, name, f"{name} is not modelled (modelled: single device, DDP, FSDP, DeepSpeed)")


def _backend(strategy: Any) -> str | None:
    backend = str(getattr(strategy, "_process_group_backend", None) or "").lower()
    return backend if backend in ("gloo", "nccl") else None


def _fsdp(strategy: Any, name: str, world_size: int, rank: int | None) -> StrategyReading:
    sharding = getattr(getattr(strategy, "sharding_strategy", None), "name", "FULL_SHARD")
    backend = _backend(strategy)
    if sharding == "NO_SHARD":
        return StrategyReading(
            Strategy("ddp", world_size=world_size, rank=rank, backend=backend), name, "FSDP NO_SHARD read as DDP"
        )
    if sharding not in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return StrategyReading(None, name, f"FSDP sharding_strategy={sharding} (hybrid sharding) is not modelled")
    offload = bool(getattr(getattr(strategy, "cpu_offload", None), "offload_params", False))
    param_dtype = None
    mixed = getattr(strategy, "mixed_precision_config", None) or getattr(strategy, "mixed_precision", None)
    dtype = getattr(mixed, "param_dtype", None)
    if dtype is not None:
        param_dtype = str(dtype).replace("torch.", "")
        if param_dtype not in ("bfloat16", "float16", "float32"):
            param_dtype = None
    kwargs = getattr(strategy, "kwargs", None) or {}
    policy = kwargs.get("auto_wrap_policy")
    unit_classes = getattr(policy, "_module_classes", None)
    reasons = [
        "Lightning's FSDPStrategy is FSDP1 (one flat parameter per unit), estimated with the FSDP2 model "
        "(per-parameter dim-0 shards, the same unit lifetimes); the padding of the flat parameters differs"
    ]
    if policy is not None and unit_classes is None:
        reasons.append("a callable auto_wrap_policy: the FSDP units are assumed to be the model's blocks")
    if getattr(strategy, "_activation_checkpointing_kwargs", None):
        reasons.append("activation_checkpointing_policy is not traced (the estimate keeps every activation)")
    reason = "; ".join(reasons)
    return StrategyReading(
        Strategy(
            "fsdp",
            world_size=world_size,
            rank=rank,
            reshard_after_forward=sharding == "FULL_SHARD",
            offload_params=offload,
            offload_optimizer=offload,
            param_dtype=param_dtype,
            backend=backend,
        ),
        name,
        reason,
        tuple(unit_classes) if unit_classes else None,
    )


def _deepspeed(strategy: Any, name: str, world_size: int, rank: int | None) -> StrategyReading:
    reading, note = deepspeed_strategy(getattr(strategy, "config", None) or {}, world_size, rank)
    return StrategyReading(reading, name, note)


def units_for(model: Any, reading: StrategyReading) -> list[Any] | None:
    """The FSDP units of ``model`` for ``reading`` (``None``: the estimator's default)."""
    if not reading.unit_classes:
        return None
    classes = reading.unit_classes
    return [module for module in model.modules() if module is not model and isinstance(module, classes)]
