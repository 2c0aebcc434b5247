"""Validation and normalisation of what users pass to ``estimate_training``:
precisions, optimizers, batches and devices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from nnmem_callbacks.core import vocabulary

__all__ = [
    "BatchSpec",
    "check_optimizer_spec",
    "describe_batch",
    "model_device",
    "named_cuda_arch",
    "optimizer_class_label",
    "optimizer_label",
    "OPTIMIZER_NAMES",
    "OptimizerFactory",
    "PRECISION_ALIASES",
    "PRECISIONS",
    "PrecisionSpec",
    "resolve_device",
    "resolve_precision",
    "TensorSpec",
]

# ---------------------------------------------------------------------------
# Precision
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PrecisionSpec:
    """How one Lightning precision setting runs a training step.

    Attributes:
        name: The canonical Lightning spelling (``"bf16-mixed"``...).
        param_dtype: The dtype of the parameters themselves.
        autocast_dtype: The autocast dtype for forward and loss, or ``None``.
        grad_scaler: Whether a GradScaler scales the loss (``16-mixed``).
        input_dtype: Floating inputs are converted to this dtype (``-true``
            modes do so, like Lightning's ``HalfPrecision``/``DoublePrecision``).
    """

    name: str
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None = None
    grad_scaler: bool = False
    input_dtype: torch.dtype | None = None


PRECISIONS: dict[str, PrecisionSpec] = {
    "32-true": PrecisionSpec("32-true", torch.float32),
    "16-mixed": PrecisionSpec("16-mixed", torch.float32, torch.float16, grad_scaler=True),
    "bf16-mixed": PrecisionSpec("bf16-mixed", torch.float32, torch.bfloat16),
    "16-true": PrecisionSpec("16-true", torch.float16, input_dtype=torch.float16),
    "bf16-true": PrecisionSpec("bf16-true", torch.bfloat16, input_dtype=torch.bfloat16),
    "64-true": PrecisionSpec("64-true", torch.float64, input_dtype=torch.float64),
}

#: Accepted spellings besides the keys of :data:`PRECISIONS` (:data:`nnmem_callbacks.core.vocabulary.PRECISION_ALIASES`)
PRECISION_ALIASES: dict[str, str] = vocabulary.PRECISION_ALIASES


def resolve_precision(precision: Any) -> PrecisionSpec:
    """Returns the :class:`PrecisionSpec` for a Lightning precision spelling.

    Names are read by :func:`nnmem_callbacks.core.vocabulary.canonical_precision`,
    as the napkin formulas and the CLI read them.

    Raises:
        ValueError: Naming the valid spellings.

    Example:
        >>> resolve_precision("bf16").name
        'bf16-mixed'
        >>> resolve_precision(32).param_dtype
        torch.float32
    """
    return PRECISIONS[vocabulary.canonical_precision(precision)]


# ---------------------------------------------------------------------------
# Optimizers
# ---------------------------------------------------------------------------

OptimizerFactory = Callable[[Sequence[torch.Tensor]], torch.optim.Optimizer]

#: name -> factory of a default-configured optimizer over a parameter list
OPTIMIZER_NAMES: dict[str, OptimizerFactory] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "momentum": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params),
    "adamw": lambda params: torch.optim.AdamW(params),
    "adamax": lambda params: torch.optim.Adamax(params),
    "nadam": lambda params: torch.optim.NAdam(params),
    "radam": lambda params: torch.optim.RAdam(params),
    "adagrad": lambda params: torch.optim.Adagrad(params),
    "adadelta": lambda params: torch.optim.Adadelta(params),
    "rmsprop": lambda params: torch.optim.RMSprop(params),
    "rprop": lambda params: torch.optim.Rprop(params),
}


def check_optimizer_spec(optimizer: Any) -> None:
    """Validates an optimizer spec early (names, types).

    Raises:
        ValueError: For an unknown name or an unusable object.
    """
    if optimizer is None:
        return
    if isinstance(optimizer, str):
        try:
            vocabulary.canonical_optimizer(optimizer)
        except ValueError as error:
            raise ValueError(f"{error}; or pass an optimizer instance or a callable params -> optimizer") from None
        return
    if isinstance(optimizer, torch.optim.Optimizer) or callable(optimizer):
        return
    if (
        isinstance(optimizer, (list, tuple))
        and optimizer
        and all(isinstance(o, torch.optim.Optimizer) for o in optimizer)
    ):
        return
    raise ValueError(
        f"optimizer must be a name ({', '.join(OPTIMIZER_NAMES)}), a torch.optim.Optimizer instance, a list of "
        f"instances, or a callable params -> optimizer; got {type(optimizer).__name__}"
    )


def optimizer_label(optimizer: Any) -> str:
    """A short human name for an optimizer spec."""
    if optimizer is None:
        return "none"
    if isinstance(optimizer, str):
        return optimizer.lower()
    if isinstance(optimizer, (list, tuple)):
        return "+".join(optimizer_label(o) for o in optimizer)
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer_class_label(type(optimizer), getattr(getattr(optimizer, "args", None), "optim_bits", None))
    return getattr(optimizer, "__name__", type(optimizer).__name__)


def optimizer_class_label(cls: type, optim_bits: Any = None) -> str:
    """An optimizer class's name, marked where bitsandbytes runs it with 8-bit state (``optim_bits=8``, as the
    Trainer's ``optim="adamw_8bit"`` builds ``bnb.optim.AdamW``) and the name does not say so already.

    Example:
        >>> optimizer_class_label(torch.optim.AdamW, 8), optimizer_class_label(torch.optim.AdamW)
        ('AdamW (8-bit)', 'AdamW')
    """
    name = cls.__name__
    return f"{name} (8-bit)" if optim_bits == 8 and "8bit" not in name else name


# ---------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """The shape, dtype and device of one batch tensor (no data)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    scales: bool  # whether dim 0 is the batch dimension
    seq_dims: tuple[int, ...] = ()  # the dimensions that hold the sequence length (BatchSpec.seq_len)


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    """A batch reduced to tensor specs plus its non-tensor leaves."""

    leaves: tuple[Any, ...]
    treespec: Any
    batch_size: int
    #: Rebuilds the user's own mapping type (a transformers ``BatchEncoding``, any
    #: ``UserDict``) from the plain dict the tree was flattened as; ``None`` for
    #: batches that ``torch.utils._pytree`` flattens itself.
    mapping_type: type | None = None
    #: The sequence length (the size of every tensor's ``TensorSpec.seq_dims``); ``None``: no sequence axis.
    seq_len: int | None = None
    #: The input dimension the sequence was found in (for notes).
    seq_dim: int | None = None

    def tensor_specs(self) -> list[TensorSpec]:
        return [leaf for leaf in self.leaves if isinstance(leaf, TensorSpec)]

    def build(
        self,
        batch_size: int,
        device: torch.device,
        dtype_map: Callable[[torch.dtype], torch.dtype],
        seq_len: int | None = None,
    ) -> tuple[Any, list[torch.Tensor]]:
        """Creates the batch at ``batch_size`` (and ``seq_len``) with empty tensors (call under a fake mode)."""
        leaves, tensors = [], []
        for leaf in self.leaves:
            if isinstance(leaf, TensorSpec):
                shape = (batch_size,) + leaf.shape[1:] if leaf.scales else leaf.shape
                if seq_len is not None and leaf.seq_dims:
                    shape = tuple(seq_len if dim in leaf.seq_dims else size for dim, size in enumerate(shape))
                tensor = torch.empty(shape, dtype=dtype_map(leaf.dtype), device=device)
                leaves.append(tensor)
                tensors.append(tensor)
            else:
                leaves.append(leaf)
        batch = tree_unflatten(leaves, self.treespec)
        if self.mapping_type is not None:
            batch = _rebuild_mapping(self.mapping_type, batch)
        return batch, tensors


def _rebuild_mapping(mapping_type: type, items: dict) -> Any:
    """``mapping_type(items)``, or the plain dict where that type cannot be built from one."""
    try:
        return mapping_type(items)
    except Exception:  # noqa: BLE001 - any constructor failure: the model still gets the same keys
        return items


def describe_batch(batch: Any, sequence_dim: int | str | None = None) -> BatchSpec:
    """Reduces a batch to a :class:`BatchSpec`.

    The batch size is the leading dimension of the first tensor (as Lightning's
    ``extract_batch_size`` does); every tensor whose leading dimension equals it
    scales with the batch.

    A mapping that ``torch.utils._pytree`` does not know (a transformers
    ``BatchEncoding``, any ``collections.UserDict``) is read as a dict and
    rebuilt as its own type for the traced step.

    With ``sequence_dim`` the batch also gets a sequence axis: ``"auto"`` takes
    dim 1 of the first integer tensor of shape ``(batch, length)`` (token ids),
    an int that dimension of the first tensor; every batch tensor's dimensions
    (after the first) of that size then scale with the length (token ids,
    attention masks, labels, a ``(batch, 1, length, length)`` mask).

    Raises:
        ValueError: If the batch holds no tensor, or its first tensor is a
            scalar; for a ``sequence_dim`` that finds no sequence.

    Example:
        >>> ids = torch.empty(8, 128, dtype=torch.long)
        >>> spec = describe_batch({"input_ids": ids, "labels": ids, "mask": torch.empty(8, 1, 128, 128)}, "auto")
        >>> spec.seq_len, [s.seq_dims for s in spec.tensor_specs()]
        (128, [(1,), (1,), (2, 3)])
        >>> spec = describe_batch({"x": torch.empty(8, 3), "y": torch.empty(8, dtype=torch.long)})
        >>> spec.batch_size, [s.shape for s in spec.tensor_specs()]
        (8, [(8, 3), (8,)])
        >>> from collections import UserDict
        >>> describe_batch(UserDict(x=torch.empty(4, 3))).mapping_type.__name__
        'UserDict'
    """
    mapping_type = None
    if isinstance(batch, torch.Tensor):
        leaves, treespec = [batch], None
    else:
        leaves, treespec = tree_flatten(batch)
        if treespec.num_leaves == 1 and leaves and leaves[0] is batch and isinstance(batch, Mapping):
            mapping_type = type(batch)
            leaves, treespec = tree_flatten(dict(batch))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if not tensors:
        raise ValueError(
            f"the batch holds no tensor (got {type(batch).__name__}); pass a tensor, or a tuple/list/dict of tensors "
            f"(real or on the meta device)"
        )
    if tensors[0].dim() == 0:
        raise ValueError("the first tensor of the batch is a scalar; its leading dimension must be the batch size")
    batch_size = int(tensors[0].shape[0])
    if batch_size < 1:
        raise ValueError(f"the batch is empty (leading dimension {batch_size}); pass at least one sample")
    specs = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if leaf.layout != torch.strided:
                raise ValueError(f"batch tensors must be dense (strided); got layout {leaf.layout}")
            scales = leaf.dim() > 0 and int(leaf.shape[0]) == batch_size
            specs.append(TensorSpec(tuple(int(d) for d in leaf.shape), leaf.dtype, leaf.device, scales))
        else:
            specs.append(leaf)
    if treespec is None:
        from torch.utils._pytree import tree_flatten as _tf

        treespec = _tf(batch)[1]
    seq_len, seq_dim = None, None
    if sequence_dim is not None:
        seq_len, seq_dim = _sequence_length(tensors, sequence_dim)
        specs = [
            dataclasses.replace(spec, seq_dims=tuple(d for d in range(1, len(spec.shape)) if spec.shape[d] == seq_len))
            if isinstance(spec, TensorSpec) and spec.scales
            else spec
            for spec in specs
        ]
    return BatchSpec(tuple(specs), treespec, batch_size, mapping_type, seq_len, seq_dim)


def _sequence_length(tensors: list[torch.Tensor], sequence_dim: int | str) -> tuple[int, int]:
    """The sequence length ``sequence_dim`` points at, and the dimension."""
    if sequence_dim == "auto":
        for tensor in tensors:
            if tensor.dim() == 2 and not tensor.dtype.is_floating_point and not tensor.dtype.is_complex:
                length = int(tensor.shape[1])
                if length >= 4:
                    return length, 1
        raise ValueError(
            "sequence_dim='auto' found no token ids (an integer tensor of shape (batch, length), length 4 or "
            "more) in the batch; pass sequence_dim=<the dimension of the first tensor that holds the length>"
        )
    if isinstance(sequence_dim, bool) or not isinstance(sequence_dim, int) or sequence_dim < 1:
        raise ValueError(
            f"sequence_dim must be 'auto', a dimension >= 1 of the batch's first tensor, or None; got {sequence_dim!r}"
        )
    first = tensors[0]
    if sequence_dim >= first.dim():
        raise ValueError(
            f"sequence_dim={sequence_dim} is not a dimension of the batch's first tensor (shape {tuple(first.shape)})"
        )
    length = int(first.shape[sequence_dim])
    if length < 4:
        raise ValueError(f"the sequence length must be 4 or more for a sequence axis; dim {sequence_dim} is {length}")
    return length, sequence_dim


# ---------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------


def model_device(model: torch.nn.Module) -> torch.device | None:
    """The device of the model's first parameter or buffer (``None`` if it has none)."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return None


def resolve_device(device: Any, model: torch.nn.Module, batch: BatchSpec) -> torch.device:
    """Where training will run.

    Default: the model's device; a model on the meta device trains where its
    batch is, and a meta batch with a meta model means CPU.

    A named GPU (``"cuda:h100"``, ``"a100-80gb"``, ``"cuda:sm86"``, see
    :func:`named_cuda_arch`) means CUDA.

    Raises:
        ValueError: For a device string torch cannot parse or a type other than cpu/cuda.
    """
    if device is not None:
        try:
            resolved = torch.device(device)
        except (RuntimeError, TypeError) as error:
            if named_cuda_arch(device) is not None:
                return torch.device("cuda")
            raise ValueError(
                f"invalid device {device!r}: {error}; use 'cpu', 'cuda', 'cuda:N' or a GPU ('cuda:h100', 'a100-80gb')"
            ) from None
    else:
        resolved = model_device(model) or torch.device("cpu")
        if resolved.type == "meta":
            batch_devices = [s.device for s in batch.tensor_specs() if s.device.type != "meta"]
            resolved = batch_devices[0] if batch_devices else torch.device("cpu")
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device type {resolved.type!r}; valid device types are 'cpu' and 'cuda'")
    return resolved


def named_cuda_arch(device: Any):
    """The :class:`~nnmem_callbacks.hardware.gpus.CudaArch` a device string names, else ``None``.

    ``"cuda:h100"``, ``"cuda:a100-80gb"``, ``"a100-80gb"``, ``"cuda:sm86"``,
    ``"cuda:8.0"`` name one; ``"cuda"``, ``"cuda:0"`` and ``"cpu"`` do not.

    Raises:
        ValueError: For ``"cuda:<text>"`` whose text is neither an index nor a
            known GPU or architecture (the message lists the valid ones).

    Example:
        >>> named_cuda_arch("cuda:h100").capability, named_cuda_arch("cuda:0")
        ((9, 0), None)
        >>> named_cuda_arch("a100-80gb").label
        'sm80 (Ampere)'
    """
    from nnmem_callbacks.hardware.gpus import find_arch

    if not isinstance(device, str):
        return None
    text = device.strip()
    lowered = text.lower()
    if lowered in ("cpu", "cuda", "meta") or lowered.startswith("cpu:"):
        return None
    if lowered.startswith("cuda:"):
        rest = text.split(":", 1)[1].strip()
        if rest.isdigit():
            return None
        return find_arch(rest)
    try:
        return find_arch(text)
    except ValueError:
        return None
