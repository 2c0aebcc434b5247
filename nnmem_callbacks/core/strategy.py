"""How training is spread over devices: a framework-free description, and the
closed-form model states per rank of each kind.

A :class:`Strategy` says what one rank holds. The PyTorch estimator
(:mod:`nnmem_callbacks.estimators.torch.distributed`) turns a traced single-device step
into a per-rank step for it; the napkin calculator and the CLI use
:func:`model_states_per_rank` for the answer without a model.

Kinds:

* ``"single"``: one device, nothing sharded.
* ``"ddp"``: every rank holds the whole model; DistributedDataParallel adds
  its gradient buckets (one flat copy of all gradients, ``bucket_cap_mb`` only
  splits it); ``gradient_as_bucket_view`` makes the gradients views of them.
* ``"fsdp"``: PyTorch FSDP2 (``fully_shard``): parameters, gradients and
  optimizer state sharded on dim 0 over ``world_size`` ranks; each unit's
  parameters gathered around its forward and backward.
* ``"zero"``: DeepSpeed ZeRO stage 1, 2 or 3 (model states by formula,
  cross-checked with DeepSpeed's own, :func:`zero_model_states`; under
  ``16-mixed``/``bf16-mixed``/``16-true``/``bf16-true`` those of its bf16/fp16
  mode, :func:`zero_mixed`).

Nothing here imports torch, keras or lightning.

Example:
    >>> s = Strategy("fsdp", world_size=4)
    >>> s.describe()
    'fsdp x4 (reshard_after_forward=True)'
    >>> Strategy("zero", world_size=8, zero_stage=3).describe()
    'zero-3 x8'
    >>> Strategy("ddp", world_size=0)
    Traceback (most recent call last):
    ...
    ValueError: world_size must be a positive integer, got 0

Known limitations:
    * Tensor, pipeline and context parallelism are not modelled (a
      ModelParallelStrategy with a tensor-parallel mesh is reported as not
      modelled by the Lightning callback).
    * HSDP (replicate + shard meshes) is not modelled.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = [
    "BACKENDS",
    "DEEPSPEED_BUFFER_FACTOR",
    "DEFAULT_BUCKET_CAP_MB",
    "deepspeed_strategy",
    "gpus_needed",
    "KINDS",
    "model_states_per_rank",
    "shard_estimate",
    "shard_numel",
    "Strategy",
    "ZERO_MIXED_PRECISIONS",
    "zero_mixed",
    "zero_model_states",
]

#: The kinds of :class:`Strategy`.
KINDS = ("single", "ddp", "fsdp", "zero")

#: Collective backends whose own buffers are modelled (gloo copies the
#: all-gather and reduce-scatter buffers on CPU; NCCL works in place).
BACKENDS = ("gloo", "nccl")

#: DDP's default bucket size (``torch.nn.parallel.DistributedDataParallel``).
DEFAULT_BUCKET_CAP_MB = 25.0

#: ``additional_buffer_factor`` of DeepSpeed's model-state estimators (their default).
DEEPSPEED_BUFFER_FACTOR = 1.5

#: Precisions that DeepSpeed runs in its bf16/fp16 mode (``"bf16": {"enabled": true}``): a 16-bit model with fp32
#: master weights in the optimizer's partition (Lightning's DeepSpeed precision and the Trainer's ``bf16``/``fp16``).
#: The ``*-true`` ones too: Lightning's DeepSpeedStrategy enables the same mode for them, and DeepSpeed's ZeRO keeps
#: fp32 master weights of a 16-bit model whatever its config (:func:`zero_mixed`).
ZERO_MIXED_PRECISIONS = ("16-mixed", "bf16-mixed", "16-true", "bf16-true")


@dataclasses.dataclass(frozen=True)
class Strategy:
    """What each of ``world_size`` ranks holds and does in a training step.

    Args:
        kind: One of :data:`KINDS`.
        world_size: Ranks the model is replicated or sharded over.
        zero_stage: 1, 2 or 3 for ``kind="zero"`` (0 otherwise).
        reshard_after_forward: FSDP: free each unit's gathered parameters after
            its forward (``True``, ZeRO-3-like) or keep them to the backward
            (``False``, ZeRO-2-like). The root unit never reshards after forward.
        bucket_cap_mb: DDP bucket size (splits the flat gradient copy; the
            total does not change).
        gradient_as_bucket_view: DDP: gradients are views of the buckets.
        static_graph: DDP ``static_graph`` (buckets rebuilt once, as without it).
        offload_params: FSDP ``CPUOffloadPolicy`` / ZeRO-3 ``offload_param``:
            sharded parameters live on the host.
        offload_optimizer: Optimizer state (and for FSDP, sharded gradients)
            live on the host (FSDP's offload policy moves both with the parameters).
        param_dtype: FSDP mixed precision: the dtype of gathered parameters
            (``"bfloat16"``, ``"float16"``), ``None`` for the parameters' own.
        backend: ``"gloo"`` or ``"nccl"``; ``None``: gloo for CPU, NCCL for CUDA.
        rank: The rank to predict; ``None``: the rank with the most memory.
    """

    kind: str = "single"
    world_size: int = 1
    zero_stage: int = 0
    reshard_after_forward: bool = True
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    offload_params: bool = False
    offload_optimizer: bool = False
    param_dtype: str | None = None
    backend: str | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"strategy kind must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {self.world_size!r}")
        if self.kind == "zero":
            if isinstance(self.zero_stage, bool) or self.zero_stage not in (1, 2, 3):
                raise ValueError(f"zero_stage must be 1, 2 or 3 for kind='zero', got {self.zero_stage!r}")
        elif self.zero_stage:
            raise ValueError(
                f"zero_stage is only valid with kind='zero' (got kind={self.kind!r}, zero_stage={self.zero_stage!r})"
            )
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)} or None, got {self.backend!r}")
        if not (isinstance(self.bucket_cap_mb, (int, float)) and self.bucket_cap_mb > 0):
            raise ValueError(f"bucket_cap_mb must be a positive number, got {self.bucket_cap_mb!r}")
        if self.param_dtype not in (None, "bfloat16", "float16", "float32"):
            raise ValueError(f"param_dtype must be 'bfloat16', 'float16', 'float32' or None, got {self.param_dtype!r}")
        if self.rank is not None and not (isinstance(self.rank, int) and 0 <= self.rank < self.world_size):
            raise ValueError(f"rank must be in 0..{self.world_size - 1} or None, got {self.rank!r}")
        if self.kind == "single" and self.world_size != 1:
            raise ValueError("kind='single' means world_size=1; use kind='ddp' for replicas")
        self._check_options()

    def _check_options(self) -> None:
        """Options of one kind given to another would be ignored, or (offload) change the figure: refused."""
        sharding = self.kind == "fsdp" or (self.kind == "zero" and self.zero_stage == 3)
        if self.offload_params and not sharding:
            raise ValueError(
                f"offload_params applies to kind='fsdp' and to kind='zero' with zero_stage=3 only, not to "
                f"{self.describe_kind()} (its parameters stay on the device)"
            )
        if self.offload_optimizer and self.kind not in ("fsdp", "zero"):
            raise ValueError(
                f"offload_optimizer applies to kind='fsdp' and kind='zero' only, not to {self.describe_kind()}"
            )
        if self.param_dtype is not None and self.kind != "fsdp":
            raise ValueError(
                f"param_dtype is FSDP's mixed precision and applies to kind='fsdp' only, not to {self.describe_kind()}"
                "; give the training precision to the estimator instead"
            )
        if self.gradient_as_bucket_view and self.kind != "ddp":
            raise ValueError(f"gradient_as_bucket_view applies to kind='ddp' only, not to {self.describe_kind()}")

    def describe_kind(self) -> str:
        """``kind='ddp'``, or ``kind='zero' with zero_stage=2``: the words of an error."""
        text = f"kind={self.kind!r}"
        return text + (f" with zero_stage={self.zero_stage}" if self.kind == "zero" else "")

    @property
    def sharded(self) -> bool:
        """Whether parameters, gradients or optimizer state are split over ranks."""
        return self.kind in ("fsdp", "zero") and self.world_size > 1

    def describe(self) -> str:
        """A short label, such as ``"fsdp x4 (reshard_after_forward=True)"``; FSDP's mixed precision is named.

        Example:
            >>> Strategy("fsdp", world_size=8, param_dtype="bfloat16").describe()
            'fsdp x8 (reshard_after_forward=True, param_dtype=bfloat16)'
        """
        if self.kind == "single":
            return "single device"
        if self.kind == "zero":
            text = f"zero-{self.zero_stage} x{self.world_size}"
        else:
            text = f"{self.kind} x{self.world_size}"
        if self.kind == "fsdp":
            dtype = f", param_dtype={self.param_dtype}" if self.param_dtype else ""
            text += f" (reshard_after_forward={self.reshard_after_forward}{dtype})"
        if self.kind == "ddp" and self.gradient_as_bucket_view:
            text += " (gradient_as_bucket_view)"
        if self.offload_params or self.offload_optimizer:
            text += " offload:" + "+".join(
                n for n, on in (("params", self.offload_params), ("optimizer", self.offload_optimizer)) if on
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        """Plain values (for ``MemoryEstimate.extra`` and JSON)."""
        return dataclasses.asdict(self)


def shard_numel(
    shape: tuple[int, ...] | list[int], world_size: int, rank: int | None = None, *, padded: bool = False
) -> int:
    """Elements of one rank's dim-0 shard of a tensor (FSDP2's ``torch.chunk`` split).

    Args:
        shape: The full tensor's shape.
        world_size: Ranks.
        rank: Which rank; ``None``: rank 0 (which holds the largest shard).
        padded: The padded shard FSDP2 stores (``ceil(dim0 / world_size)`` rows on every rank).

    Example:
        >>> shard_numel((10, 3), 4), shard_numel((10, 3), 4, rank=3), shard_numel((10, 3), 4, rank=3, padded=True)
        (9, 3, 9)
        >>> shard_numel((), 4)  # scalars are padded to one element per rank
        1
    """
    if len(shape) == 0:
        shape = (1,)
    rows = shape[0]
    rest = math.prod(shape[1:])
    chunk = -(-rows // world_size) if rows else 0
    if padded:
        return chunk * rest
    rank = rank or 0
    local = max(0, min(chunk, rows - rank * chunk))
    return local * rest


# ---------------------------------------------------------------------------
# closed-form model states per rank
# ---------------------------------------------------------------------------


def model_states_per_rank(
    parameters: int,
    strategy: Strategy,
    *,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    optimizer_bytes_per_param: int = 8,
    master_bytes_per_param: int = 0,
    master_grad_bytes_per_param: int = 0,
) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state one rank holds.

    Each of the three is split over the ranks the strategy shards it over:
    DDP and ZeRO-0 none; ZeRO-1 the optimizer state; ZeRO-2 also the
    gradients; ZeRO-3 and FSDP also the parameters. Offloaded states count 0
    on the device. DDP adds its bucket copy of the gradients.

    Args:
        parameters: Trainable parameters (count).
        strategy: The :class:`Strategy`.
        param_bytes: Bytes per parameter as stored.
        grad_bytes: Bytes per gradient element.
        optimizer_bytes_per_param: Optimizer state per parameter (Adam fp32: 8).
        master_bytes_per_param: fp32 master weights kept by the optimizer
            (4 under ``*-mixed`` ZeRO / ``16-true`` with fp32 master weights).
        master_grad_bytes_per_param: The fp32 copy of the gradient partition ZeRO's
            step hands the optimizer (4 under ``*-mixed`` ZeRO): split at every
            stage, counted with the gradients, on the host when the optimizer is.

    Returns:
        ``{"parameters", "gradients", "optimizer_state", "comm_buffers"}`` in bytes.

    Example:
        >>> model_states_per_rank(1000, Strategy("zero", world_size=4, zero_stage=3))
        {'parameters': 1000, 'gradients': 1000, 'optimizer_state': 2000, 'comm_buffers': 0}
        >>> model_states_per_rank(1000, Strategy("ddp", world_size=4))
        {'parameters': 4000, 'gradients': 4000, 'optimizer_state': 8000, 'comm_buffers': 4000}
        >>> model_states_per_rank(1000, Strategy("ddp", world_size=4, gradient_as_bucket_view=True))["gradients"]
        0
    """
    n = strategy.world_size

    def split(total: int, sharded: bool) -> int:
        return -(-total // n) if sharded else total

    stage = strategy.zero_stage if strategy.kind == "zero" else (3 if strategy.kind == "fsdp" else 0)
    params = split(parameters * param_bytes, stage >= 3)
    grads = split(parameters * grad_bytes, stage >= 2)
    optim = split(parameters * (optimizer_bytes_per_param + master_bytes_per_param), stage >= 1)
    grads += split(parameters * master_grad_bytes_per_param, True) if not strategy.offload_optimizer else 0
    buffers = 0
    if strategy.kind == "ddp":
        buffers = parameters * grad_bytes
        if strategy.gradient_as_bucket_view:
            grads = 0  # views of the buckets
    if strategy.offload_params:
        params = 0
    if strategy.offload_optimizer:
        optim = 0
        if strategy.kind == "fsdp" or stage >= 2:
            grads = 0
    return {"parameters": params, "gradients": grads, "optimizer_state": optim, "comm_buffers": buffers}


def zero_mixed(strategy: Strategy, precision: Any) -> bool:
    """Whether ZeRO's model states are DeepSpeed's bf16/fp16 ones: ``kind="zero"`` under a precision of
    :data:`ZERO_MIXED_PRECISIONS`.

    What DeepSpeed then holds (sources of 2026-08-22, commit ``edaa722``): the engine casts the model's parameters,
    not its buffers, to 16 bits (``deepspeed/runtime/engine.py``, ``_configure_distributed_model``); stages 1 and 2
    (``stage_1_and_2.py``, ``DeepSpeedZeroOptimizer``) keep every 16-bit parameter whole, an fp32 clone of the
    rank's partition (``single_partition_of_fp32_groups``: the master weights the optimizer and its state live on),
    the 16-bit gradients (whole at stage 1, the rank's partition at stage 2: ``partition_gradients``) and, in
    ``step``, an fp32 copy of the gradient partition (``single_grad_partition = flat_grad_partition.to(...)``);
    stage 3 (``stage3.py``, ``DeepSpeedZeroOptimizer_Stage3``) partitions the 16-bit parameters too
    (``fp16_partitioned_groups_flat``), its 16-bit gradient partitions (``grad_partitions_flat_buffer``), fp32
    master partitions (``fp32_partitioned_groups_flat``) and, per sub-group, the fp32 gradient
    (``_prepare_fp32_grad_for_sub_group``; counted here for the whole partition: an upper bound once a partition
    exceeds ``sub_group_size``). So stage 3 holds 2 + 2 + 4 + 4 + 8 = 20 bytes per parameter split, where
    ``estimate_zero3_model_states_mem_needs`` splits 18 (its stage-2 itemisation of the same states, plus the 16-bit
    parameters, makes 20). The gradients are accumulated in the model's dtype unless ``data_types.grad_accum_dtype``
    says otherwise.

    ``16-true`` / ``bf16-true`` hold the same: Lightning's DeepSpeedStrategy enables DeepSpeed's fp16/bf16 mode for
    them as for ``*-mixed`` (``_format_precision_config``), and ZeRO's master weights and gradient partition are in
    ``master_weights_and_grads_dtype``, fp32 unless ``bf16_master_weights_and_grads`` / ``fp16_master_weights_and_grads``
    is set (``runtime/base_optimizer.py``, ``_configure_master_weights``; used by ``stage_1_and_2.py``, where
    ``single_partition_of_fp32_groups`` is the 16-bit partition ``.to(dtype=master_weights_and_grads_dtype)``, and by
    ``stage3.py``), so the optimizer's state, created beside those fp32 master weights, is fp32 too (not the 16-bit
    state a single-device ``*-true`` step holds). Not modelled: bf16 with ``data_types.grad_accum_dtype: "fp32"`` at
    stage 1 without offload, which DeepSpeed runs with its ``BF16_Optimizer`` (``engine.py``,
    ``_do_optimizer_sanity_check``; ``runtime/bf16_optimizer.py``): it keeps the same 16-bit model and fp32 master
    and optimizer partitions, but its fp32 gradient buffer (``fp32_groups_gradients_flat``) is whole on every rank,
    not a partition (the optimizer steps on a view of it), so it holds ``4 * (1 - 1 / world_size)`` bytes per
    parameter more than estimated here; nor ``bf16_master_weights_and_grads`` / ``bf16_optimizer_states``.

    Example:
        >>> zero_mixed(Strategy("zero", world_size=8, zero_stage=2), "bf16-mixed")
        True
        >>> zero_mixed(Strategy("zero", world_size=8, zero_stage=2), "bf16-true")
        True
        >>> zero_mixed(Strategy("zero", world_size=8, zero_stage=2), "32-true")
        False
    """
    return strategy.kind == "zero" and str(precision) in ZERO_MIXED_PRECISIONS


def zero_model_states(
    total_params: int,
    stage: int,
    *,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    largest_layer_params: int = 0,
    cpu_offload: bool = False,
    cpu_offload_params: bool = False,
    zero_init: bool = True,
    additional_buffer_factor: float = DEEPSPEED_BUFFER_FACTOR,
) -> dict[str, int]:
    """DeepSpeed's own estimate of the model states per GPU and per node (bytes).

    These are the formulas of ``estimate_zero2_model_states_mem_needs``
    (``deepspeed/runtime/zero/stage_1_and_2.py``, used for stages 1 and 2; as
    changed by DeepSpeed #5099, 2024-06: 2 bytes of 16-bit parameters on every
    GPU, and "18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit +
    8_optimizer_states_32bit" split over the GPUs) and
    ``estimate_zero3_model_states_mem_needs`` (``deepspeed/runtime/zero/stage3.py``),
    copied to cross-check :func:`model_states_per_rank` without installing
    DeepSpeed. They assume fp16/bf16 parameters and gradients with fp32 Adam
    (master weights, momentum, variance) and an fp32 copy of the gradients.

    Example:
        >>> zero_model_states(10**9, 3, num_gpus_per_node=8, largest_layer_params=10**7)["gpu"]
        2290000000
        >>> zero_model_states(10**9, 2, num_gpus_per_node=8)["gpu"]
        4250000000
    """
    if stage not in (1, 2, 3):
        raise ValueError(f"stage must be 1, 2 or 3, got {stage!r}")
    total_gpus = num_nodes * num_gpus_per_node
    if stage in (1, 2):
        # estimate_zero2_model_states_mem_needs
        if cpu_offload:
            gpu_mem = 2 * total_params
            cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
        else:
            gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
        return {"gpu": int(gpu_mem), "cpu": int(cpu_mem)}
    # estimate_zero3_model_states_mem_needs
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return {"gpu": int(gpu_mem), "cpu": int(cpu_mem)}


def shard_estimate(
    estimate: Any,
    strategy: Strategy,
    *,
    parameters: int,
    trainable: int | None = None,
    gathered_bytes: int = 0,
    elementwise_optimizer: bool = True,
) -> Any:
    """One rank's share of a single-device :class:`~nnmem_callbacks.core.estimate.MemoryEstimate`, by formula.

    The parameters, gradients and optimizer state at the single-device peak
    are replaced by :func:`model_states_per_rank` (bytes per element taken from
    the estimate's own breakdown); ``gathered_bytes`` (FSDP / ZeRO-3: the
    unsharded units alive at once) and DDP's buckets are added as temporaries.
    Every phase line moves by the same amount, so the batch scaling is kept.
    This is the napkin answer; the PyTorch trace replays the step instead
    (:func:`nnmem_callbacks.estimators.torch.distributed.estimate_per_rank`).

    ZeRO under ``16-mixed`` / ``bf16-mixed`` / ``16-true`` / ``bf16-true`` (:func:`zero_mixed`) holds what
    DeepSpeed's bf16/fp16 mode holds instead of the estimate's own byte sizes:
    16-bit parameters (frozen ones too) and gradients, and in the optimizer's
    partition fp32 master weights and an fp32 copy of the gradients beside the
    traced optimizer state (for Adam DeepSpeed's 2 + 2 + 4 + 4 + 8 bytes per
    parameter, see :func:`zero_model_states`); ``gathered_bytes`` (given at the
    estimate's bytes per parameter) is held in 16 bits too. Under ``*-true`` the
    traced optimizer state, held in the parameters' 16 bits (``torch.optim``'s
    state is ``zeros_like`` the parameter), is counted at 4 bytes per element,
    as DeepSpeed's optimizer steps the fp32 master weights. Activations stay as
    traced. ``elementwise_optimizer=False`` (FSDP): the optimizer state is not
    of the parameters' shapes, so it is kept whole rather than split.

    Example:
        >>> from nnmem_callbacks.core.estimate import MemoryEstimate
        >>> single = MemoryEstimate(peak_bytes=1600, batch_size=8, breakdown={
        ...     "parameters": 400, "gradients": 400, "optimizer_state": 800})
        >>> shard_estimate(single, Strategy("fsdp", world_size=4), parameters=100).peak_bytes
        400
        >>> shard_estimate(single, Strategy("ddp", world_size=4), parameters=100).peak_bytes
        2000
        >>> lora = MemoryEstimate(peak_bytes=480, batch_size=8, breakdown={
        ...     "parameters": 400, "gradients": 40, "optimizer_state": 40})
        >>> shard_estimate(lora, Strategy("zero", world_size=4, zero_stage=2), parameters=100, trainable=10
        ...                ).breakdown["parameters"]  # the frozen 90 are held whole at stage 2
        400
    """
    from nnmem_callbacks.core.estimate import Category

    trainable = parameters if trainable is None else trainable
    breakdown = dict(estimate.breakdown)
    params_b = breakdown.get(str(Category.PARAMETERS), 0)
    grads_b = breakdown.get(str(Category.GRADIENTS), 0)
    optim_b = breakdown.get(str(Category.OPTIMIZER_STATE), 0)
    param_bytes = max(1, round(params_b / parameters)) if parameters else 0
    grad_bytes = round(grads_b / trainable) if trainable else 0
    optim_per_param = round(optim_b / trainable) if trainable else 0
    master = master_grad = 0
    mixed = zero_mixed(strategy, getattr(estimate, "precision", None))
    if mixed:  # DeepSpeed's bf16/fp16 mode: a 16-bit model, fp32 master weights and gradients in the partition
        if str(estimate.precision).endswith("-true") and 0 < param_bytes < 4:
            optim_per_param = optim_per_param * 4 // param_bytes  # 16-bit state traced; fp32 beside the masters
        if param_bytes > 2:
            gathered_bytes = gathered_bytes * 2 // param_bytes
        param_bytes, grad_bytes = min(param_bytes, 2), min(grad_bytes, 2)
        master, master_grad = (4, 4 if grads_b else 0) if trainable else (0, 0)
    per = model_states_per_rank(
        trainable,
        strategy,
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
        optimizer_bytes_per_param=optim_per_param,
        master_bytes_per_param=master,
        master_grad_bytes_per_param=master_grad,
    )
    if not elementwise_optimizer and strategy.kind == "fsdp" and not strategy.offload_optimizer:
        per["optimizer_state"] = optim_b  # not of the parameters' shapes: FSDP's dim-0 shards do not split it
    # frozen parameters (a LoRA's base model) are held, and sharded, as the trainable ones: no gradient, no state
    frozen = model_states_per_rank(
        max(0, parameters - trainable), strategy, param_bytes=param_bytes, grad_bytes=0, optimizer_bytes_per_param=0
    )
    per["parameters"] += frozen["parameters"]
    if strategy.kind == "ddp" and per["comm_buffers"] == 0 and trainable:
        per["comm_buffers"] = round(grads_b / trainable) * trainable if grads_b else 4 * trainable
    gathered = (
        gathered_bytes if (strategy.kind == "fsdp" or (strategy.kind == "zero" and strategy.zero_stage == 3)) else 0
    )
    new = {
        str(Category.PARAMETERS): per["parameters"],
        str(Category.GRADIENTS): per["gradients"],
        str(Category.OPTIMIZER_STATE): per["optimizer_state"],
    }
    delta = sum(new.values()) + per["comm_buffers"] + gathered - (params_b + grads_b + optim_b)
    breakdown.update(new)
    breakdown[str(Category.TEMPORARIES)] = breakdown.get(str(Category.TEMPORARIES), 0) + per["comm_buffers"] + gathered
    phases = tuple(dataclasses.replace(line, fixed_bytes=line.fixed_bytes + delta) for line in estimate.phases)
    reserved = None if estimate.reserved_bytes is None else max(0, estimate.reserved_bytes + delta)
    note = (
        f"per rank under {strategy.describe()} by formula: parameters, gradients and optimizer state at the "
        f"single-device peak replaced by one rank's share"
        + (f", {gathered} bytes of gathered units added" if gathered else "")
        + ("; DDP gradient buckets added" if per["comm_buffers"] else "")
        + (
            f"; under {estimate.precision} DeepSpeed's bf16/fp16 mode: 16-bit parameters and gradients, fp32 master "
            "weights and gradient partition beside the optimizer state ("
            + ("the state in fp32 too; " if str(estimate.precision).endswith("-true") else "")
            + "activations as traced)"
            if mixed
            else ""
        )
    )
    extra = dict(estimate.extra, strategy=strategy.to_dict(), single_device_peak_bytes=int(estimate.peak_bytes))
    return dataclasses.replace(
        estimate,
        peak_bytes=max(0, int(estimate.peak_bytes + delta)),
        breakdown=breakdown,
        phases=phases,
        reserved_bytes=reserved,
        phase_breakdowns={},
        notes=(*estimate.notes, note),
        extra=extra,
    )


def gpus_needed(
    estimate: Any,
    strategy: Strategy,
    capacity_bytes: int,
    *,
    parameters: int,
    gathered_bytes: int = 0,
    margin: float = 0.05,
    counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
) -> int | None:
    """The fewest ranks (of ``counts``) at which one rank's device bytes fit ``capacity_bytes`` less ``margin``.

    ``estimate`` is the single-device estimate; ``strategy`` gives the kind
    (its world size is replaced by each count). ``None``: not even at the largest count.

    Example:
        >>> from nnmem_callbacks.core.estimate import MemoryEstimate
        >>> single = MemoryEstimate(peak_bytes=1600, batch_size=8, breakdown={
        ...     "parameters": 400, "gradients": 400, "optimizer_state": 800})
        >>> gpus_needed(single, Strategy("fsdp"), 700, parameters=100)
        4
    """
    for count in counts:
        kind = "ddp" if strategy.kind == "single" and count > 1 else strategy.kind
        candidate = dataclasses.replace(strategy, kind=kind, world_size=count, rank=None)
        per_rank = shard_estimate(estimate, candidate, parameters=parameters, gathered_bytes=gathered_bytes)
        if per_rank.device_bytes <= capacity_bytes * (1 - margin):
            return count
    return None


def deepspeed_strategy(config: Any, world_size: int, rank: int | None = None) -> tuple[Strategy, str]:
    """A DeepSpeed config (``{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}...}``) as a
    :class:`Strategy` and a note: ZeRO 1-3 with its offload, anything else (no ZeRO, ``"auto"`` not yet filled in)
    as data parallel.

    Example:
        >>> strategy, note = deepspeed_strategy({"zero_optimization": {"stage": 2}}, world_size=8)
        >>> strategy.describe(), note
        ('zero-2 x8', "DeepSpeed ZeRO: model states from DeepSpeed's formulas, not traced")
    """
    zero = (config or {}).get("zero_optimization") or {}
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    try:
        stage = int(stage or 0)
    except (TypeError, ValueError):  # "auto" is filled in by accelerate later
        stage = 0
    if stage not in (1, 2, 3):
        return Strategy("ddp", world_size=world_size, rank=rank), "DeepSpeed without ZeRO read as data parallel"

    def offloaded(key: str) -> bool:
        value = zero.get(key) or {}
        return isinstance(value, dict) and str(value.get("device", "none")).lower() in ("cpu", "nvme")

    note = "DeepSpeed ZeRO: model states from DeepSpeed's formulas, not traced"
    offload_params = offloaded("offload_param")
    if offload_params and stage != 3:  # DeepSpeed offloads parameters at stage 3 only
        offload_params = False
        note += f"; offload_param is for stage 3 only, so at stage {stage} the parameters stay on the device"
    strategy = Strategy(
        "zero",
        world_size=world_size,
        rank=rank,
        zero_stage=stage,
        offload_params=offload_params,
        offload_optimizer=offloaded("offload_optimizer"),
    )
    return strategy, note
