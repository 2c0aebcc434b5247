"""TensorFlow's CPU allocator, as the graph replay charges it.

What ``tf.config.experimental.get_memory_info('CPU:0')`` counts: with oneDNN on,
allocations of at least :data:`TF_CPU_COUNTED_MIN_BYTES` (smaller ones go to
``malloc``); with ``TF_CPU_ALLOCATOR_USE_BFC=true``, every allocation. The large
ones come from a best-fit-with-coalescing allocator that charges whole chunks;
:class:`BFCSimulator` replays its policy.

Design: docs/keras-tensorflow-replay.md, "The allocator model".

Known limitations (evidence: docs/keras-tensorflow-replay.md, "The allocator model"):
    * The simulator follows ``bfc_allocator.cc``'s policy (bins, best fit, split
      rule, coalescing, doubling regions), not its garbage collection or the
      ``allow_growth=False`` single region.
    * A ``TensorList`` whose element size the list ops tell is charged one chunk per element, allocated when the
      list is made or the loop ends (not one by one between the loop body's other buffers); other lists are
      counted by their total (:func:`list_counted_bytes`), outside the chunk model.
    * The replay starts from the allocator as building a Keras model leaves it (:func:`allocator_after_build`);
      anything else the user's process allocated before (data pipelines, other models, loaded weights) is not
      modelled.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from nnmem_callbacks.allocators.bfc import BFCSimulator

__all__ = [
    "allocator_after_build",
    "Buffer",
    "list_counted_bytes",
    "onednn_enabled",
    "tf_allocator_bytes",
    "tf_cpu_allocator",
    "TF_CPU_COUNTED_MIN_BYTES",
    "TF_CPU_ROUNDING",
    "VariablePlacement",
]

#: oneDNN's CPU allocator (``MklCPUAllocator``, TensorFlow's with oneDNN on) keeps allocations under this size in
#: a separate pool that its statistics do not report. The BFC allocator of ``TF_CPU_ALLOCATOR_USE_BFC=true``
#: reports every allocation.
TF_CPU_COUNTED_MIN_BYTES = 256 * 1024
#: ... rounded up to this granularity.
TF_CPU_ROUNDING = 256


def tf_cpu_allocator() -> str:
    """Which CPU allocator this process's TensorFlow uses (read from the environment TensorFlow started with).

    ``"bfc"``: ``TF_CPU_ALLOCATOR_USE_BFC=true``, statistics for every allocation; ``"onednn"``: oneDNN's
    ``MklCPUAllocator`` (oneDNN on), statistics for allocations of :data:`TF_CPU_COUNTED_MIN_BYTES` and more;
    ``"default"``: no statistics (they are then predicted as the BFC allocator would count them).
    """
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").strip().lower() in ("true", "1"):
        return "bfc"
    return "onednn" if onednn_enabled() else "default"


def onednn_enabled() -> bool:
    """Whether this process's TensorFlow runs its oneDNN kernels (``TF_ENABLE_ONEDNN_OPTS`` or the host default)."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):  # pragma: no cover - a TensorFlow without the query
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "0") == "1"


def tf_allocator_bytes(num_bytes: int, min_bytes: int | None = None) -> int:
    """What TensorFlow's CPU allocator statistics count for one allocation.

    Args:
        num_bytes: The bytes requested.
        min_bytes: Allocations below this are not counted; default: this
            process's allocator (:data:`TF_CPU_COUNTED_MIN_BYTES` for oneDNN's,
            0 for the BFC allocator).

    Example:
        >>> tf_allocator_bytes(1000, min_bytes=TF_CPU_COUNTED_MIN_BYTES), tf_allocator_bytes(400_000, min_bytes=0)
        (0, 400128)
        >>> tf_allocator_bytes(1000, min_bytes=0)
        1024
    """
    if min_bytes is None:
        min_bytes = _counted_min_bytes()
    if num_bytes < min_bytes or num_bytes <= 0:
        return 0
    return int(math.ceil(num_bytes / TF_CPU_ROUNDING) * TF_CPU_ROUNDING)


def list_counted_bytes(num_bytes: int, min_bytes: int | None = None) -> int:
    """What the CPU allocator's statistics count of a ``TensorList`` holding ``num_bytes`` of elements.

    Each element is its own allocation. The BFC allocator
    (``TF_CPU_ALLOCATOR_USE_BFC=true``, and what the replay predicts where the
    allocator keeps no statistics) counts every one of them; oneDNN's counts
    none below :data:`TF_CPU_COUNTED_MIN_BYTES`, and an RNN's per-step elements
    (batch x units) are below it at the sizes seen in practice. Measured on an
    LSTM with oneDNN off: the steps' peak grew by the lists' bytes per sample
    (``benchmarks/results/keras_tensorflow_cpu_onednn0.md``).

    Example:
        >>> list_counted_bytes(3_276_800, min_bytes=0), list_counted_bytes(3_276_800, min_bytes=TF_CPU_COUNTED_MIN_BYTES)
        (3276800, 0)
    """
    if min_bytes is None:
        min_bytes = _counted_min_bytes()
    return tf_allocator_bytes(num_bytes, min_bytes=0) if min_bytes == 0 else 0


_COUNTED_MIN: list[int] = []


def _counted_min_bytes() -> int:
    """The smallest allocation this process's TensorFlow CPU allocator counts (fixed once TensorFlow started)."""
    if not _COUNTED_MIN:
        _COUNTED_MIN.append(TF_CPU_COUNTED_MIN_BYTES if tf_cpu_allocator() == "onednn" else 0)
    return _COUNTED_MIN[0]


def allocator_after_build(variables: list[tuple[int, bool]], min_bytes: int | None = None) -> BFCSimulator:
    """The allocator as a train step finds it after Keras built the model and its optimizer.

    Keras 3 on TensorFlow creates each variable from its initializer's output.
    A random initializer runs three kernels of the variable's size: the raw
    random values (``StatelessRandomUniformV2``, ``...Normal``,
    ``...TruncatedNormal``), a scale (``Mul``) and a shift (``AddV2``); the
    variable adopts the shift's buffer and the first two are freed, so every
    such variable lies behind a free hole of twice its size, which later
    buffers fill. A constant initializer (zeros, ones: ``Fill``) and the
    optimizer's slots leave the variable alone in its chunk. Measured with the
    allocator's events (``python -m benchmarks.tf_allocator_fidelity``): fed
    the real requests of two train steps, a simulator started this way gives
    TensorFlow's window peak within median 0.31 %, worst 3.2 % on 12 models;
    one that holds only the live buffers: median 0.72 %, worst -7.0 %
    (ResNet-50).

    Args:
        variables: ``(bytes, initialized_at_random)`` per variable, in creation
            order (the model's, then the optimizer's).
        min_bytes: Allocations below this are not the simulated allocator's
            (default: this process's allocator, see :func:`tf_allocator_bytes`).

    Returns:
        The simulator holding the variables, with the initializers' temporaries
        freed, and each variable's chunk (``None`` for one below ``min_bytes``).

    Example:
        >>> bfc, chunks = allocator_after_build([(256 << 10, True), (256 << 10, False)], min_bytes=0)
        >>> bfc.in_use >> 10, bfc.peak >> 10  # two variables held; three buffers at once while the first was made
        (512, 768)
        >>> [bfc.chunks[c][0] >> 10 for c in chunks]  # KiB from the region's start: the second fills the hole
        [512, 0]
    """
    bfc = BFCSimulator()
    chunks: list[int | None] = []
    for size, at_random in variables:
        if not tf_allocator_bytes(size, min_bytes):
            chunks.append(None)
            continue
        if at_random:
            raw, scaled = bfc.alloc(size), bfc.alloc(size)
            chunks.append(bfc.alloc(size))
            bfc.free(scaled)
            bfc.free(raw)
        else:
            chunks.append(bfc.alloc(size))
    return bfc, chunks


class VariablePlacement:
    """Where each variable's value lies in the allocator model, from one replayed step to the next.

    An update of a variable that a live read still shares (copy-on-write, see
    :func:`~nnmem_callbacks.estimators.keras.tensorflow.ops.assign_variable`) gives the variable a
    new buffer, allocated where the allocator has room at that moment, and the
    old value is freed when its last read is done. The variable keeps the new
    buffer: the next step finds it there, in a region the first step's large
    buffers had to themselves. That decides what a later large buffer is
    charged. Measured on MobileNetV3-Small with oneDNN off at batch 8, ten
    profiled processes (``python -m benchmarks.tf_memory_events
    mobilenetv3small --regions --large 8``): Adam copied the 2.25 MiB kernel
    of its last 1x1 convolution in both steps of all ten; in half of them the
    second step's 20.9 MiB scratch was handed a 38.3-40.9 MiB chunk whole
    (under twice its size: no split) and the step peaked at 94.2-101.1 MiB,
    against 75.7-79.8 in the others; where the simulated region agrees, the
    copy sat in the free 64 MiB region.

    Args:
        bfc: The allocator model the variables' chunks belong to.
        chunks: Each variable's chunk (``None`` where the allocator does not
            hold it), as :func:`allocator_after_build` gives them.
        index_of: The state index of the variable behind each resource
            (keyed by whatever the replay keys resources by).

    Example:
        >>> bfc, chunks = allocator_after_build([(1 << 20, False), (1 << 20, False)], min_bytes=0)
        >>> placement = VariablePlacement(bfc, chunks, {"w": 0})
        >>> old = placement.relocate("w", 1 << 20)  # the update's copy: a new chunk for w
        >>> old == chunks[0], placement.chunks[0] != old, bfc.in_use >> 20
        (True, True, 3)
        >>> bfc.free(old); bfc.in_use >> 20  # the last read of the old value done
        2
        >>> placement.relocate("b", 1 << 20) is None  # a resource the placement does not know
        True
    """

    def __init__(self, bfc: BFCSimulator, chunks: list[int | None], index_of: dict[Any, int]) -> None:
        self.bfc = bfc
        self.chunks = list(chunks)
        self.index_of = dict(index_of)

    def relocate(self, resource: Any, nbytes: int) -> int | None:
        """Gives the variable behind ``resource`` a new chunk; returns its old one (``None``: not placed here)."""
        index = self.index_of.get(resource)
        if index is None or index >= len(self.chunks):
            return None
        old = self.chunks[index]
        if old is None or old not in self.bfc.chunks or self.bfc.chunks[old][1] < BFCSimulator.rounded(nbytes):
            return None
        self.chunks[index] = self.bfc.alloc(nbytes)
        return old


@dataclasses.dataclass
class Buffer:
    """One buffer of the replay: its bytes, what the allocator charges for it, and who holds it.

    Attributes:
        nbytes: The tensor's bytes.
        counted: The bytes the allocator's statistics count (a whole chunk under :class:`BFCSimulator`).
        category: The breakdown category it is counted in.
        refs: How many live tensors (aliases included) share it.
        owned: ``False`` for a variable's or a caller's buffer (never forwarded, never freed here).
        chunk: The :class:`BFCSimulator` chunk holding it, when an allocator is simulated.
        element: A ``TensorList``'s element bytes, when the replay knows them (0 otherwise).
        element_chunks: The chunks of a ``TensorList``'s elements, one per element, when an
            allocator is simulated and the element size is known.
    """

    nbytes: int
    counted: int
    category: str
    refs: int = 0
    owned: bool = True
    chunk: int | None = None
    element: int = 0
    element_chunks: list[int] = dataclasses.field(default_factory=list)
