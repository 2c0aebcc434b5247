"""Which dims of an op's arguments grow with the batch (one entry per op packet).

A spec lists ``(arg index, dim)`` pairs; ``dim=None`` marks an int argument
that is itself the batch count (``native_group_norm_backward``'s ``N``). The
outputs follow from the inputs. Weights never scale.

Example:
    >>> import torch
    >>> spec = BATCH_DIMS[torch.ops.aten.convolution_backward]
    >>> spec(())
    ((0, 0), (1, 0))
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["aten", "BATCH_DIMS", "REAL_DTYPES", "register_batch_dims"]

aten = torch.ops.aten

#: op packet -> spec(args) -> ((arg index, dim or None), ...)
BATCH_DIMS: dict[Any, Callable[[tuple], tuple[tuple[int, int | None], ...]]] = {}


def register_batch_dims(*ops: Any, dims: tuple[tuple[int, int | None], ...] | None = None):
    """Registers fixed batch dims for ops (or, used as a decorator, a spec function)."""
    if dims is not None:
        for op in ops:
            BATCH_DIMS[op] = lambda args, _dims=dims: _dims
        return None

    def decorator(spec):
        for op in ops:
            BATCH_DIMS[op] = spec
        return spec

    return decorator


register_batch_dims(aten.convolution, aten.mm, dims=((0, 0),))
register_batch_dims(aten.convolution_backward, aten.bmm, aten.native_batch_norm_backward, dims=((0, 0), (1, 0)))
register_batch_dims(
    aten.max_pool2d_with_indices_backward, aten.max_pool3d_with_indices_backward, dims=((0, 0), (1, 0), (7, 0))
)
register_batch_dims(
    aten.avg_pool2d_backward,
    aten.avg_pool3d_backward,
    aten._adaptive_avg_pool2d_backward,
    aten._adaptive_avg_pool3d_backward,
    aten.adaptive_max_pool2d_backward,
    dims=((0, 0), (1, 0)),
)
register_batch_dims(aten.native_layer_norm_backward, dims=((0, 0), (1, 0), (3, 0), (4, 0)))
register_batch_dims(aten.native_group_norm_backward, dims=((0, 0), (1, 0), (2, 0), (3, 0), (5, None)))


register_batch_dims(aten.embedding_dense_backward, dims=((0, 0), (1, 0)))
register_batch_dims(aten._softmax, aten._safe_softmax, dims=((0, 0),))


@register_batch_dims(aten.add, aten.sub, aten.mul, aten.div)
def _elementwise(args: tuple) -> tuple[tuple[int, int | None], ...]:
    """Tensor operands with a leading dim (a broadcast operand of size 1 makes the op unscaled)."""
    return tuple((i, 0) for i in (0, 1) if i < len(args) and isinstance(args[i], torch.Tensor) and args[i].dim() > 0)


@register_batch_dims(aten.addmm)
def _addmm(args: tuple) -> tuple[tuple[int, int | None], ...]:
    bias = args[0] if args else None
    if isinstance(bias, torch.Tensor) and bias.dim() == 2 and len(args) > 1 and bias.shape[0] == args[1].shape[0]:
        return ((0, 0), (1, 0))
    return ((1, 0),)


@register_batch_dims(aten.baddbmm)
def _baddbmm(args: tuple) -> tuple[tuple[int, int | None], ...]:
    bias = args[0] if args else None
    if isinstance(bias, torch.Tensor) and bias.dim() == 3 and bias.shape[0] == args[1].shape[0] and bias.shape[0] > 1:
        return ((0, 0), (1, 0), (2, 0))
    return ((1, 0), (2, 0))


#: op packet -> fix(args) -> {arg index: dtype}: arguments whose real dtype differs
#: from the fake one (the probe builds them with the real dtype)
REAL_DTYPES: dict[Any, Callable[[tuple], dict[int, torch.dtype]]] = {}


def _batch_norm_backward_dtypes(args: tuple) -> dict[int, torch.dtype]:
    """bf16/fp16 batch norm with fp32 parameters: the real forward returns fp32
    ``save_mean``/``save_invstd`` (the meta kernel says bf16), and the backward
    kernel insists on fp32 statistics.

    Example:
        >>> x, w = torch.zeros(2, 4, 3, 3, dtype=torch.bfloat16), torch.zeros(4)
        >>> _batch_norm_backward_dtypes((x, x, w, None, None, x[0, :, 0, 0], x[0, :, 0, 0]))
        {3: torch.float32, 4: torch.float32, 5: torch.float32, 6: torch.float32}
    """
    source, weight = args[1], args[2] if len(args) > 2 else None
    if not isinstance(source, torch.Tensor) or source.dtype not in (torch.bfloat16, torch.float16):
        return {}
    if isinstance(weight, torch.Tensor) and weight.dtype != torch.float32:
        return {}
    return {index: torch.float32 for index in (3, 4, 5, 6)}


REAL_DTYPES[aten.native_batch_norm_backward] = _batch_norm_backward_dtypes
