"""Per-rank estimates under DDP and FSDP2: the traced single-device step, replayed for one rank.

:func:`estimate_per_rank` traces the user's step once on one device (the
ordinary :func:`~nnmem_callbacks.estimators.torch.estimator.estimate_training`), with
hooks on the FSDP units that mark in the trace's allocation log where each
unit's forward and backward begin and end, and which gradient belongs to
which unit. :func:`~nnmem_callbacks.estimators.torch.rank_replay.replay_rank` then walks that log again for one rank
(what DDP's reducer, FSDP2's unshard/reshard and gloo's collectives allocate, and when: see that module).

Example:
    >>> import torch
    >>> from nnmem_callbacks.core.strategy import Strategy
    >>> net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    >>> one = estimate_per_rank(net, torch.empty(8, 64), strategy=Strategy("single"), check_scaling=False, probe_kernels=False)
    >>> four = estimate_per_rank(net, torch.empty(8, 64), strategy=Strategy("fsdp", world_size=4), check_scaling=False, probe_kernels=False)
    >>> four.peak_bytes < one.peak_bytes
    True
    >>> four.extra["strategy"]["kind"]
    'fsdp'

Known limitations:
    * FSDP1 (``FullyShardedDataParallel``, flat parameters), HSDP, tensor and
      pipeline parallelism and DeepSpeed are not replayed; ZeRO gets model
      states from formulas (:func:`nnmem_callbacks.core.strategy.model_states_per_rank`), under
      ``*-mixed`` and 16-bit ``*-true`` those of DeepSpeed's bf16/fp16 mode (a 16-bit model, fp32 master
      weights: :func:`nnmem_callbacks.core.strategy.zero_mixed`), with the activations as traced.
    * A ``torch.compile``'d step is not replayed: its single-device estimate is
      sharded by formula (:func:`nnmem_callbacks.core.strategy.shard_estimate`), and a note says so.
    * FSDP mixed precision (``param_dtype``) is modelled for the gathered
      parameters and gradients only; activations are traced at the step's precision.
    * Gradient accumulation: a reduce-scatter is assumed after every
      micro-batch (no ``set_requires_gradient_sync(False)``).
    * On CUDA, streams let the next all-gather overlap the current compute;
      the order of allocations is the one of a synchronous run (CPU/gloo).
    * CPU offload moves sharded states to the host; the host-to-device copy of
      each shard before its all-gather is counted, pinned host memory is not.
    * Only an optimizer whose state has each parameter's shape (Adam, SGD,
      RMSprop..., :func:`not_elementwise`) has its state and step temporaries
      sharded under FSDP; others (``torch.optim.Muon``, Adafactor's factored
      state, Shampoo) are kept whole as traced, and a note names them: the
      figure may err high (FSDP splits what has a parameter's shape) or low (an
      update that gathers whole parameters holds them too).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
from torch import nn

from nnmem_callbacks.core.estimate import Category, MemoryEstimate
from nnmem_callbacks.core.strategy import Strategy
from nnmem_callbacks.core.verification import DirectEstimator
from nnmem_callbacks.estimators.torch.rank_replay import TraceMarks, replay_rank, unit_parameters

__all__ = ["MATRIX_OPTIMIZERS", "default_units", "estimate_per_rank", "fsdp_modules", "not_elementwise"]

#: Words in the class names of optimizers whose update works on whole matrices (orthogonalised or preconditioned),
#: whatever the shape of their state: ``torch.optim.Muon``, Shampoo, SOAP.
MATRIX_OPTIMIZERS = ("muon", "shampoo", "soap")


def not_elementwise(optimizer: torch.optim.Optimizer) -> str | None:
    """Why ``optimizer``'s update is not provably elementwise (so not split by FSDP's dim-0 shards), or ``None``.

    Elementwise: every per-parameter state tensor has the parameter's shape or is a scalar (``step``); bitsandbytes'
    block statistics beside its ``state1``/``state2`` count with them. Not: a matrix optimizer
    (:data:`MATRIX_OPTIMIZERS`), or a state of another shape (Adafactor's row and column factors, L-BFGS' flat history).

    Example:
        >>> weight = torch.nn.Parameter(torch.zeros(4, 3))
        >>> weight.grad = torch.ones(4, 3)
        >>> adam = torch.optim.Adam([weight])
        >>> adam.step()
        >>> not_elementwise(adam) is None
        True
        >>> not_elementwise(torch.optim.Muon([weight]))
        'Muon updates whole matrices'
    """
    name = type(optimizer).__name__
    if any(word in name.lower() for word in MATRIX_OPTIMIZERS):
        return f"{name} updates whole matrices"
    quantized = type(optimizer).__module__.startswith("bitsandbytes")
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            for key, value in optimizer.state.get(parameter, {}).items():
                if not isinstance(value, torch.Tensor) or value.numel() <= 1 or value.shape == parameter.shape:
                    continue
                if quantized and not str(key).startswith("state"):
                    continue  # absmax, qmap: statistics of the param-shaped state1/state2
                shapes = f"{tuple(value.shape)}, not its parameter's {tuple(parameter.shape)}"
                return f"{name}'s state {key!r} has shape {shapes}"
    return None


class _OptimizerShapes:
    """While open, records why the optimizers that take a step are not elementwise (:func:`not_elementwise`)."""

    def __enter__(self) -> "_OptimizerShapes":
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.reasons: dict[str, str] = {}
        self._handle = register_optimizer_step_post_hook(self._seen)
        return self

    def _seen(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        reason = not_elementwise(optimizer)
        if reason is not None:
            self.reasons.setdefault(type(optimizer).__name__, reason)

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()

    def note(self, strategy: Strategy) -> list[str]:
        """What the per-rank figure assumed of these optimizers (nothing for DDP, which does not split them)."""
        if not self.reasons or strategy.kind not in ("fsdp", "zero"):
            return []
        why = "; ".join(self.reasons.values())
        if strategy.kind == "fsdp":
            return [
                f"the optimizer's update is not elementwise ({why}): its state and step temporaries are kept whole "
                "as on one device, not sharded; the figure may err high (FSDP splits what has a parameter's shape) "
                "or low (an update that gathers whole parameters holds them too)"
            ]
        return [
            f"the optimizer's update is not elementwise ({why}): DeepSpeed hands it flat 1-D partitions, so its "
            "state there can differ from the traced one, split here as if elementwise; the figure may err either way"
        ]


# ---------------------------------------------------------------------------
# FSDP units
# ---------------------------------------------------------------------------


def default_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 is usually applied to: the blocks of a model.

    The elements of the largest ``nn.ModuleList``/``nn.Sequential`` inside the
    model (transformer layers, residual stages); without one, the model's
    direct children that hold parameters. The model itself is the root unit
    and is not listed.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))
        >>> [type(m).__name__ for m in default_units(net)]
        ['Linear', 'Linear']
    """
    best: list[nn.Module] = []
    for module in model.modules():
        if module is model:
            continue
        if isinstance(module, (nn.ModuleList, nn.Sequential)):
            blocks = [child for child in module.children() if any(True for _ in child.parameters())]
            if len(blocks) > len(best):
                best = blocks
    if len(best) >= 2:
        return best
    return [child for child in model.children() if any(True for _ in child.parameters())]


def fsdp_modules(model: nn.Module) -> list[nn.Module] | None:
    """The modules already wrapped by ``fully_shard`` (root first), or ``None``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    found = [m for m in model.modules() if isinstance(m, FSDPModule)]
    return found or None


# ---------------------------------------------------------------------------
# the public entry point
# ---------------------------------------------------------------------------


def estimate_per_rank(
    model: nn.Module,
    batch: Any,
    optimizer: Any = "adam",
    loss_fn: Any = None,
    precision: str | int = "32-true",
    device: str | torch.device | None = None,
    *,
    strategy: Strategy,
    units: Sequence[nn.Module] | None = None,
    **kwargs: Any,
) -> MemoryEstimate:
    """Predicts one rank's peak memory of training ``model`` under ``strategy``.

    Args:
        model: The unwrapped model (before DDP or ``fully_shard``); not changed.
        batch: One rank's batch.
        optimizer, loss_fn, precision, device: As for
            :func:`~nnmem_callbacks.estimators.torch.estimator.estimate_training`.
        strategy: A :class:`~nnmem_callbacks.core.strategy.Strategy`.
        units: FSDP: the modules ``fully_shard`` is applied to, besides the
            model itself (the root); default :func:`default_units`.
        **kwargs: Passed to ``estimate_training`` (``accumulate_grad_batches``,
            ``gradient_clip_val``, ``check_scaling``, ``probe_kernels``...).

    Returns:
        A :class:`~nnmem_callbacks.core.estimate.MemoryEstimate` for the rank
        (``strategy.rank``, default rank 0, which holds the largest shards);
        ``extra["strategy"]`` describes the strategy and ``extra["single_device_peak_bytes"]``
        the unsharded step's peak.

    Raises:
        ValueError: If the model is already wrapped by ``fully_shard`` (estimate
            before wrapping), or for an argument ``estimate_training`` rejects.
    """
    if not isinstance(strategy, Strategy):
        raise ValueError(f"strategy must be a nnmem_callbacks.core.strategy.Strategy, got {type(strategy).__name__}")
    if isinstance(model, nn.Module) and fsdp_modules(model):
        raise ValueError(
            "the model is already wrapped by fully_shard (its parameters are DTensor shards); "
            "estimate with the unwrapped model and Strategy('fsdp', world_size=N)"
        )
    estimate = _estimate_per_rank(model, batch, optimizer, loss_fn, precision, device, strategy, units, kwargs)
    if strategy.kind == "single":
        return estimate
    # the single-device step's allocation log and direct estimate do not describe one rank: the reserve at
    # another batch scales by the ratio, and a plan's check traces the rank again
    verifier = _RankVerifier(
        model, batch, optimizer, loss_fn, precision, device or estimate.device, strategy, units, kwargs
    )
    return dataclasses.replace(estimate, allocation_log=None, verifier=verifier)


class _RankVerifier(DirectEstimator):
    """A direct per-rank estimate at another batch size (``MemoryEstimate.verifier`` of a per-rank estimate).

    The batch is rebuilt on the meta device at the new size, so nothing real is allocated.
    """

    def __init__(self, model, batch, optimizer, loss_fn, precision, device, strategy, units, kwargs) -> None:
        from nnmem_callbacks.estimators.torch.inputs import describe_batch

        self._spec = describe_batch(batch)
        self._arguments = (model, optimizer, loss_fn, precision, device)
        self._strategy, self._units = strategy, None if units is None else list(units)
        self._kwargs = dict(kwargs, check_scaling=False)

    def estimate_at(self, batch_size: int) -> MemoryEstimate:
        model, optimizer, loss_fn, precision, device = self._arguments
        batch, _ = self._spec.build(batch_size, torch.device("meta"), lambda dtype: dtype)
        return estimate_per_rank(
            model,
            batch,
            optimizer,
            loss_fn,
            precision,
            device,
            strategy=self._strategy,
            units=self._units,
            **self._kwargs,
        )


def _estimate_per_rank(
    model,
    batch,
    optimizer,
    loss_fn,
    precision,
    device,
    strategy: Strategy,
    units: Sequence[nn.Module] | None,
    kwargs: dict[str, Any],
) -> MemoryEstimate:
    from nnmem_callbacks.estimators.torch.estimator import estimate_training

    if strategy.kind in ("single", "zero"):
        with _OptimizerShapes() as shapes:
            single = estimate_training(model, batch, optimizer, loss_fn, precision, device, **kwargs)
        if strategy.kind == "single":
            return _tagged(single, strategy, single.peak_bytes, [])
        estimate = _zero_estimate(single, model, strategy)
        return dataclasses.replace(estimate, notes=(*estimate.notes, *shapes.note(strategy)))
    if strategy.kind == "fsdp":
        units = list(units) if units is not None else default_units(model)
    else:
        units = []
    from nnmem_callbacks.estimators.torch.compiled import find_compiled

    if find_compiled(model, loss_fn, optimizer) is not None:  # the units' marks would break its compiled graphs
        with _OptimizerShapes() as shapes:
            single = estimate_training(model, batch, optimizer, loss_fn, precision, device, **kwargs)
        why = "a torch.compile'd step is not replayed per rank"
        return _formula_estimate(single, model, strategy, why, units, shapes)
    with TraceMarks(model, units) as marks, _OptimizerShapes() as shapes:
        single = estimate_training(model, batch, optimizer, loss_fn, precision, device, **kwargs)
    if marks.tracker is None or single.method != "trace":
        return _formula_estimate(single, model, strategy, "the step could not be traced", units, shapes)
    if strategy.backend is None:  # Strategy's default: NCCL on CUDA, gloo on the CPU
        strategy = dataclasses.replace(strategy, backend="nccl" if str(single.device).startswith("cuda") else "gloo")
    rank = strategy.rank or 0
    unit_params = unit_parameters(model, units)

    def stored_itemsize(parameter: torch.Tensor) -> int:
        return _stored_dtype(parameter, single.precision).itemsize

    replay = replay_rank(marks, strategy, rank, unit_params, stored_itemsize, elementwise_optimizer=not shapes.reasons)
    trace_peaks = {p: v for p, v in marks.tracker.phase_peaks.items()}
    deltas = {
        phase: replay.phase_peaks[phase] - trace_peaks[phase] for phase in trace_peaks if phase in replay.phase_peaks
    }
    fallback_delta = max(deltas.values()) if deltas else 0
    phases = tuple(
        dataclasses.replace(line, fixed_bytes=line.fixed_bytes + deltas.get(line.phase, fallback_delta))
        for line in single.phases
    )
    notes = [_strategy_note(strategy, units), *shapes.note(strategy)]
    return _with_phases(single, phases, replay.breakdown, strategy, notes, rank)


def _stored_dtype(parameter: torch.Tensor, precision: str) -> torch.dtype:
    from nnmem_callbacks.estimators.torch.inputs import resolve_precision
    from nnmem_callbacks.estimators.torch.step import parameter_dtype

    return parameter_dtype(parameter.dtype, resolve_precision(precision))


def _strategy_note(strategy: Strategy, units: Sequence[nn.Module]) -> str:
    if strategy.kind == "ddp":
        text = (
            "per-rank estimate for DDP: the whole model on every rank plus the reducer's gradient buckets "
            f"(one flat copy of the trainable gradients{', gradients as bucket views' if strategy.gradient_as_bucket_view else ''})"
        )
    else:
        text = (
            f"per-rank estimate for FSDP2 x{strategy.world_size} over {len(units)} unit(s) and the root: padded dim-0 "
            "shards of parameters and gradients, local shards of optimizer state, each unit's all-gather and "
            "unsharded parameters around its forward and backward (reshard_after_forward="
            f"{strategy.reshard_after_forward}), backward prefetch of the next unit, reduce-scatter buffers"
        )
        if strategy.param_dtype:
            text += f", gathered parameters and gradients in {strategy.param_dtype}"
        if strategy.offload_params or strategy.offload_optimizer:
            text += "; offloaded states counted on the host, not the device"
    backend = strategy.backend or "gloo"
    text += f"; {backend} collectives" + (" copy their buffers once more" if backend == "gloo" else " work in place")
    return text


def _with_phases(
    single: MemoryEstimate, phases: tuple, breakdown: dict[str, int], strategy: Strategy, notes: list[str], rank: int
) -> MemoryEstimate:
    batch = single.batch_size
    covering = [line for line in phases if line.covers(batch)]
    peak_line = max(covering, key=lambda line: line.at(batch))
    peak = peak_line.at(batch)
    breakdown = dict(breakdown)
    difference = peak - sum(breakdown.values())
    breakdown[str(Category.TEMPORARIES)] = max(0, breakdown.get(str(Category.TEMPORARIES), 0) + difference)
    reserved = None if single.reserved_bytes is None else max(peak, single.reserved_bytes + peak - single.peak_bytes)
    estimate = dataclasses.replace(
        single,
        peak_bytes=int(peak),
        breakdown=breakdown,
        phases=phases,
        peak_phase=peak_line.phase,
        reserved_bytes=reserved,
        phase_breakdowns={},
        notes=(*single.notes, *notes),
    )
    return _tagged(estimate, strategy, single.peak_bytes, [], rank=rank)


def _tagged(
    estimate: MemoryEstimate, strategy: Strategy, single_peak: int, notes: list[str], rank: int = 0
) -> MemoryEstimate:
    extra = dict(estimate.extra)
    extra["strategy"] = strategy.to_dict()
    extra["rank"] = rank
    extra["single_device_peak_bytes"] = int(single_peak)
    return dataclasses.replace(estimate, extra=extra, notes=(*estimate.notes, *notes))


def _formula_estimate(
    single: MemoryEstimate,
    model: nn.Module,
    strategy: Strategy,
    why: str,
    units: Sequence[nn.Module] | None = None,
    shapes: _OptimizerShapes | None = None,
) -> MemoryEstimate:
    from nnmem_callbacks.core.strategy import shard_estimate

    parameters = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    gathered = _gathered_bytes(single, model, strategy, parameters, units)
    elementwise = shapes is None or not shapes.reasons
    estimate = shard_estimate(
        single,
        strategy,
        parameters=parameters,
        trainable=trainable,
        gathered_bytes=gathered,
        elementwise_optimizer=elementwise,
    )
    if gathered:
        added = "the gathered parameters of the root and of the two largest units (the current one and its prefetch)"
        note = f"per-rank estimate from closed-form model states ({why}); {added} added; "
    elif strategy.kind == "ddp":
        note = f"per-rank estimate from closed-form model states ({why}); DDP's gradient buckets added; other "
    else:
        note = f"per-rank estimate from closed-form model states ({why}); "
    note += "communication buffers are not modelled"
    shape_notes = shapes.note(strategy) if shapes is not None and strategy.kind == "fsdp" else []
    return _tagged(
        dataclasses.replace(estimate, notes=(*estimate.notes, note, *shape_notes)),
        strategy,
        single.peak_bytes,
        [],
        rank=strategy.rank or 0,
    )


def _gathered_bytes(
    single: MemoryEstimate, model: nn.Module, strategy: Strategy, parameters: int, units: Sequence[nn.Module] | None
) -> int:
    """FSDP and ZeRO-3 by formula: the whole parameters of the root (those in no unit: embeddings, heads) and
    of the two largest units (the one running and its prefetch), at the bytes per element the estimate holds
    parameters in; ``0`` for kinds that keep whole parameters."""
    if not (strategy.kind == "fsdp" or (strategy.kind == "zero" and strategy.zero_stage == 3)) or not parameters:
        return 0
    units = list(units) if units is not None else default_units(model)
    in_units = {id(p) for unit in units for p in unit.parameters()}
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_units)
    sizes = sorted((sum(p.numel() for p in unit.parameters()) for unit in units), reverse=True)
    per_element = single.breakdown.get(str(Category.PARAMETERS), 0) / parameters
    return int((root + sum(sizes[:2])) * per_element)


def _zero_estimate(single: MemoryEstimate, model: nn.Module, strategy: Strategy) -> MemoryEstimate:
    from nnmem_callbacks.core.strategy import zero_mixed, zero_model_states

    estimate = _formula_estimate(single, model, strategy, "DeepSpeed ZeRO is not traced")
    total = sum(p.numel() for p in model.parameters())
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    reference = zero_model_states(
        total,
        strategy.zero_stage,
        num_gpus_per_node=strategy.world_size,
        largest_layer_params=largest,
        cpu_offload=strategy.offload_optimizer,
        cpu_offload_params=strategy.offload_params,
    )
    extra = dict(estimate.extra)
    extra["deepspeed_model_states"] = reference
    note = (
        f"ZeRO-{strategy.zero_stage}: parameters, gradients and optimizer state split as DeepSpeed partitions them; "
        "its bucket buffers (reduce_bucket_size, allgather_bucket_size) and stage-3 prefetch beyond the next unit "
        f"(stage3_prefetch_bucket_size, stage3_max_live_parameters) are not modelled; DeepSpeed's own model-state estimate for this model: {reference['gpu']} bytes per GPU "
        "(16-bit parameters and fp32 Adam)"
    )
    if not zero_mixed(strategy, single.precision):
        note += (
            f"; under {single.precision} the states are held at the step's own precision (DeepSpeed without bf16/fp16)"
        )
    return dataclasses.replace(estimate, extra=extra, notes=(*estimate.notes, note))
