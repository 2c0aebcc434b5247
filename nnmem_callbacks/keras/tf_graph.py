"""TensorFlow backend: simulate tensor lifetimes over the traced graph of ``model.train_step``.

How it works:

1. ``tf.function(model.train_step).get_concrete_function(specs)`` traces the
   real Keras train step (forward, loss, ``GradientTape`` gradients, the
   optimizer's update) on :class:`tf.TensorSpec` inputs of the requested batch
   size, and again at twice it (TensorFlow specializes the function to the
   shapes it is called with, and so must the replay: a ``Tensordot`` flattens
   ``batch x steps`` rows that a symbolic batch leaves unknown). Tracing does
   not execute anything: no variable changes and the optimizer's
   ``iterations`` stays where it was. If the optimizer was not yet
   built, tracing builds it (creates its slot variables) exactly as Keras does
   at the start of the first ``fit``; that is the only side effect.
2. The ops of the graph are replayed in creation order (a topological order:
   forward, gradient), except that an optimizer op runs as soon as its inputs
   exist, as TensorFlow's data-flow executor runs it: a variable's update starts
   right after its gradient, in the middle of the backward pass (the
   ``IdentityN`` gathering the gradients is skipped, as Grappler removes it).
   Ready optimizer ops run in waves as wide as the inter-op thread pool, so
   that Adam's two moment updates of one variable overlap as they do for real.
   Before that, Grappler's regrouping of ``Mul`` trees
   (:func:`minimize_broadcasts`) is replayed: it moves a part of a gradient
   (``scale * softmax`` in attention) into the forward pass.
   An op's outputs are allocated when it runs, a tensor is freed when its last
   consumer has run. The runtime's aliasing rules are followed:
   ``ReadVariableOp`` on CPU returns the variable's own buffer,
   ``Identity``/``Reshape``/``ExpandDims``/``Squeeze``/identity ``Transpose``
   alias their input, element-wise ops (and ``Softmax``) reuse an input buffer
   that dies with them (TensorFlow's ``forward_input_or_allocate_output``), and
   ``Assign*VariableOp`` update in place, or copy when a read of the old value
   is still alive (copy-on-write) and, in the first step, because the buffer is
   still shared with the variable's initial value. Kernel scratch comes from
   :data:`WORKSPACE_RULES` (``Einsum``'s operand transposes) and hidden outputs
   from :data:`COMPANION_RULES` (oneDNN's ``MaxPool`` workspace).
3. Called functions (``PartitionedCall``), ``If`` branches and ``While`` bodies
   are simulated recursively; their transient peak is added at the call. A
   ``While`` loop's ``TensorList`` accumulators (what the gradient of an RNN
   keeps per time step) are sized as iterations x element.
4. The replays at the requested batch and at twice it give each phase's
   line in the batch size.

TensorFlow's CPU allocator statistics (``get_memory_info('CPU:0')``) count only
allocations of at least 256 KiB; smaller tensors come from ``malloc`` (oneDNN's
``MklCPUAllocator``). The large ones come from a best-fit-with-coalescing
allocator that charges whole chunks (up to ~2x a request); :class:`BFCSimulator`
replays it over the allocations of the replay, starting from the variables and
slots. The estimate's ``peak_bytes`` counts every tensor (the package's
definition of the peak); the figure comparable to
``get_memory_info('CPU:0')['peak']`` is in ``extra["tf_allocator_peak_bytes"]``.

Known limitations (see ``benchmarks/results/keras_tensorflow_cpu_onednn{0,1}.md``):
    * Forward and backward ops run in creation order; the executor may run
      independent ones in another order (inter-op parallelism). Running every
      backward op as soon as it is ready was tried and overestimated ResNet-50
      by ~10 %. Only the optimizer's ops (and ops regrouped by Grappler) run as
      soon as they are ready, in waves as wide as the inter-op pool, each op
      taking the same time: a crude model of the thread pool.
    * Of Grappler's rewrites only ``ArithmeticOptimizer``'s
      ``MinimizeBroadcasts`` regrouping of ``Mul`` trees is replayed (checked
      against the executed graph); fusions, constant folding and layout changes
      are not. Shape-only consumers (``Shape``, ``Size``...) are assumed to run
      at once and not to keep their input alive.
    * The measured truth itself varies from run to run with the executor's thread
      interleaving. In the benchmark LSTM, the gradient ``While`` loop computes
      each step's recurrent-kernel gradient (256 KiB) in parallel iterations and
      adds them one after the other; how many wait for the add depends on thread
      timing (7.3 to 12.0 MiB peaks over six runs of the same first two steps;
      under the profiler, 33 were waiting at the peak). The replay assumes none
      wait.
    * With ``jit_compile=True`` (Keras' default on GPUs) XLA owns the buffers;
      the replay then approximates XLA's buffer assignment (a note says so).
    * The first step's copy-on-write of ``AssignAdd``/``AssignSub`` is modelled as
      a transient copy; when the initial value outlives the step the copy stays
      (``persistent_growth_first_steps`` in the benchmark, <= 1.2 MiB there).
    * ``While`` loops whose trip count cannot be read from the graph are
      assumed to run ``parallel_iterations`` times (reported in ``notes``).
    * The graph is traced twice (at the batch and at twice it), as TensorFlow
      specializes the function to the shapes it is called with.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import Counter
from typing import Any, Callable

from nnmem_callbacks.estimate import Category

#: oneDNN's CPU allocator (``MklCPUAllocator``, TensorFlow's with oneDNN on) keeps allocations under this size in
#: a separate pool that its statistics do not report. The BFC allocator of ``TF_CPU_ALLOCATOR_USE_BFC=true``
#: reports every allocation.
TF_CPU_COUNTED_MIN_BYTES = 256 * 1024
#: ... rounded up to this granularity.
TF_CPU_ROUNDING = 256

#: Ops whose output ``i`` shares the buffer of input ``i`` (or input 0).
ALIAS_OPS = frozenset(
    {
        "Identity", "IdentityN", "Reshape", "ExpandDims", "Squeeze", "StopGradient", "Snapshot",
        "EnsureShape", "PreventGradient", "CheckNumerics", "DebugIdentity", "Bitcast",
        "ReadVariableOp", "ResourceGather_NoAlias_Placeholder",
    }
)

#: Element-wise ops that write into an input buffer when that input dies with them.
FORWARDING_OPS = frozenset(
    {
        "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Maximum", "Minimum", "Pow",
        "SquaredDifference", "FloorDiv", "FloorMod", "Neg", "Abs", "Sqrt", "Rsqrt", "Square", "Exp",
        "Log", "Log1p", "Tanh", "Sigmoid", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Softplus",
        "Softsign", "Reciprocal", "Sign", "Floor", "Ceil", "Round", "Erf", "Erfc", "Sin", "Cos",
        "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad", "SoftplusGrad", "TanhGrad",
        "SigmoidGrad", "SqrtGrad", "RsqrtGrad", "ReciprocalGrad", "AddN", "BiasAdd", "ClipByValue",
        "SelectV2", "Select", "OnesLike", "ZerosLike", "Inv", "Xlogy", "Xdivy", "MulNoNan",
        # SoftmaxOp: forward_input_or_allocate_output({0}, 0, ...); the profiler shows no Softmax buffer
        "Softmax", "LogSoftmax",
    }
)

#: Ops that allocate nothing (resources, control, host-side scalars) or update in place.
NO_ALLOC_OPS = frozenset(
    {
        "NoOp", "Placeholder", "VarHandleOp", "AssignVariableOp", "AssignAddVariableOp",
        "AssignSubVariableOp", "ResourceApplyAdam", "ResourceApplyGradientDescent",
        "ResourceApplyKerasMomentum", "ResourceApplyRMSProp", "ResourceApplyAdagradV2",
        "ResourceScatterAdd", "ResourceScatterUpdate", "ResourceScatterSub", "VarIsInitializedOp",
        "Assert", "PrintV2", "StatelessRandomGetKeyCounter", "DestroyResourceOp",
    }
)

#: Einsum label types, as TensorFlow's ``EinsumDimensionType`` numbers them.
_EINSUM_BATCH, _EINSUM_FREE, _EINSUM_CONTRACT, _EINSUM_REDUCE = 1, 2, 3, 4


def _einsum_workspace(op: Any, size_of: Callable[[Any], int]) -> int:
    """Scratch of TensorFlow's two-operand ``Einsum`` kernel (``einsum_op_impl.h``).

    Each operand whose labels are not already ordered ``[batch, free, contract]``
    (or ``[batch, contract, free]``, which BatchMatMul reads with an adjoint flag)
    is transposed into a copy; the contraction writes ``[batch, free0, free1]`` into
    a buffer that becomes the output when the output labels are in that order, and
    is transposed into a fresh output otherwise. The copies live until the kernel
    returns. Measured (``get_memory_info`` peak of one eager op, two batch sizes,
    four equations of Keras' ``MultiHeadAttention`` and ``EinsumDense``): the peak
    is exactly output + this workspace (e.g. ``aecd,abcd->acbe`` on 2 x 0.5 MiB
    operands: 0.5 + 0.5 + 1.0 + 1.0 MiB output = 3.0 MiB).
    """
    equation = op.get_attr("equation")
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    if "->" not in equation or "." in equation:
        return 0
    inputs_part, output_part = equation.replace(" ", "").split("->")
    subscripts = inputs_part.split(",")
    if len(subscripts) != 2 or len(op.inputs) != 2:
        return 0
    ids: dict[str, int] = {}
    for char in "".join(subscripts) + output_part:
        ids.setdefault(char, len(ids))
    types = {}
    for char, label in ids.items():
        in0, in1, out = char in subscripts[0], char in subscripts[1], char in output_part
        if in0 and in1:
            types[label] = _EINSUM_BATCH if out else _EINSUM_CONTRACT
        else:
            types[label] = _EINSUM_FREE if out else _EINSUM_REDUCE
    remap = {0: 0, 1: 1, 2: 3, 3: 2, 4: 4}
    workspace = 0
    free_labels: list[list[int]] = []
    for index, subscript in enumerate(subscripts):
        labels = [ids[c] for c in subscript]
        swap = all(
            (remap[types[a]], a) <= (remap[types[b]], b) for a, b in zip(labels, labels[1:])
        )
        if swap:
            permuted = labels
        else:
            permuted = sorted(labels, key=lambda label: (types[label], label))
            if permuted != labels and len(labels) >= 2:
                workspace += size_of(op.inputs[index])
        free_labels.append([label for label in permuted if types[label] == _EINSUM_FREE])
    batch = sorted(label for label, kind in types.items() if kind == _EINSUM_BATCH)
    result = batch + free_labels[0] + free_labels[1]
    if result != [ids[c] for c in output_part]:
        workspace += size_of(op.outputs[0])  # the contraction buffer, transposed into the output
    return workspace


#: Kernel-internal scratch memory per op type: ``rule(op, size_of) -> bytes`` alive while the op runs
#: (``size_of(tensor)`` gives a tensor's bytes at the replayed batch size). Each rule comes from
#: op-level measurements (one op run eagerly between ``reset_memory_stats`` and ``get_memory_info``,
#: several shapes). Measured without scratch on TF 2.21 (oneDNN): Conv2D, Conv2DBackpropInput,
#: Conv2DBackpropFilter, DepthwiseConv2dNative, MatMul (all transposes), BatchMatMulV2, AvgPool: the
#: peak is the output alone, up to the allocator's chunk rounding (modelled by :class:`BFCSimulator`).
WORKSPACE_RULES: dict[str, Callable[[Any, Callable[[Any], int]], int]] = {
    "Einsum": _einsum_workspace,
}

#: Hidden outputs that live as long as the op's first output: ``rule(op, size_of) -> bytes``, applied
#: when oneDNN is on. oneDNN's max pooling keeps a workspace (1 byte per output element) for
#: ``MaxPoolGrad``; the profiler shows it as a second allocation of the ``MaxPool`` node
#: (``[32,1,98,128]`` output + a 401,408-byte buffer), freed after the gradient. TensorFlow's own
#: (Eigen) max pooling keeps none: its gradient recomputes the argmax.
COMPANION_RULES: dict[str, Callable[[Any, Callable[[Any], int]], int]] = {
    "MaxPool": lambda op, size_of: (
        size_of(op.outputs[0]) // max(op.outputs[0].dtype.size, 1)
        if any(c.type.startswith("MaxPoolGrad") for c in op.outputs[0].consumers())
        else 0
    ),
}

#: Ops that update a variable in place (a copy when a read of the old value is still alive).
ASSIGN_OPS = frozenset(
    {
        "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceApplyAdam",
        "ResourceApplyGradientDescent", "ResourceApplyKerasMomentum", "ResourceApplyRMSProp",
        "ResourceApplyAdagradV2",
    }
)


#: Updates that copy the variable in the first step of a fresh run (copy-on-write of a buffer shared
#: with the variable's initial value).
FIRST_STEP_COPY_OPS = frozenset({"AssignAddVariableOp", "AssignSubVariableOp"})


class _Hidden:
    """A buffer that is no graph tensor (a kernel's hidden output), keyed like one."""

    class _Dtype:
        name = "float32"

    dtype = _Dtype()

    def __init__(self, name: str) -> None:
        self.name = f"{name}:hidden"

    def ref(self) -> Any:
        return self


#: Ops that read only the shape of their input: they do not keep it alive.
METADATA_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})

#: TensorList ops that return their input list, changed in place.
LIST_UPDATE_OPS = frozenset({"TensorListPushBack", "TensorListPopBack", "TensorListSetItem"})

CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
IF_OPS = frozenset({"If", "StatelessIf"})
WHILE_OPS = frozenset({"While", "StatelessWhile"})
CASE_OPS = frozenset({"Case", "StatelessCase"})


def tf_cpu_allocator() -> str:
    """Which CPU allocator this process's TensorFlow uses (read from the environment TensorFlow started with).

    ``"bfc"``: ``TF_CPU_ALLOCATOR_USE_BFC=true``, statistics for every allocation; ``"onednn"``: oneDNN's
    ``MklCPUAllocator`` (oneDNN on), statistics for allocations of :data:`TF_CPU_COUNTED_MIN_BYTES` and more;
    ``"default"``: no statistics (they are then predicted as the BFC allocator would count them).
    """
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").strip().lower() in ("true", "1"):
        return "bfc"
    return "onednn" if onednn_enabled() else "default"


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


_COUNTED_MIN: list[int] = []


def _counted_min_bytes() -> int:
    """The smallest allocation this process's TensorFlow CPU allocator counts (fixed once TensorFlow started)."""
    if not _COUNTED_MIN:
        _COUNTED_MIN.append(TF_CPU_COUNTED_MIN_BYTES if tf_cpu_allocator() == "onednn" else 0)
    return _COUNTED_MIN[0]


# -- TensorFlow's CPU allocator ------------------------------------------------------------------------
#: BFC constants (tensorflow/core/common_runtime/bfc_allocator.{h,cc}).
BFC_MIN_ALLOCATION = 256
BFC_NUM_BINS = 21
BFC_MAX_INTERNAL_FRAGMENTATION = 128 << 20
#: ``allow_growth``: the first region is 2 MiB, each later region doubles (MklCPUAllocator's large allocator).
BFC_INITIAL_REGION = 2 << 20


class BFCSimulator:
    """A model of the best-fit-with-coalescing allocator behind ``get_memory_info('CPU:0')``.

    With oneDNN (the default on x86), TensorFlow's CPU allocator is ``MklCPUAllocator``:
    allocations below 256 KiB go to ``malloc`` (and are not counted); larger ones go to a
    ``BFCAllocator`` with ``allow_growth`` whose ``bytes_in_use`` / ``peak_bytes_in_use`` are what
    ``get_memory_info`` reports. The BFC allocator hands out whole *chunks*: a request takes the
    smallest free chunk that fits and splits it only when the chunk is at least twice the
    request, so a request can be charged up to ~2x its size (a 1.5 MiB tensor placed in a fresh
    2 MiB region is charged 2 MiB). Measured on TF 2.21 with the profiler's ``MemoryAllocation``
    events (``allocation_bytes`` vs ``requested_bytes``). This class replays the same policy:
    256-byte rounding, 21 power-of-two bins ordered by (size, address), split rule, coalescing
    of free neighbours within a region, regions of 2 MiB doubling with each extension.

    Example:
        >>> bfc = BFCSimulator()
        >>> a = bfc.alloc(1_605_632)   # 1.53 MiB in a fresh 2 MiB region: no split
        >>> bfc.in_use
        2097152
        >>> bfc.free(a); bfc.in_use
        0
    """

    def __init__(self) -> None:
        self.region_bytes = BFC_INITIAL_REGION
        self.next_address = 0
        # chunk id -> [address, size, in_use, prev_id, next_id]
        self.chunks: dict[int, list] = {}
        self.free_chunks: dict[int, set[int]] = {b: set() for b in range(BFC_NUM_BINS)}
        self.in_use = 0
        self.peak = 0
        self._ids = 0

    @staticmethod
    def rounded(num_bytes: int) -> int:
        return max(BFC_MIN_ALLOCATION, -(-int(num_bytes) // BFC_MIN_ALLOCATION) * BFC_MIN_ALLOCATION)

    @staticmethod
    def bin_for(size: int) -> int:
        return min(max((size >> 8).bit_length() - 1, 0), BFC_NUM_BINS - 1)

    def _new_chunk(self, address: int, size: int, prev: int | None, nxt: int | None) -> int:
        self._ids += 1
        self.chunks[self._ids] = [address, size, False, prev, nxt]
        return self._ids

    def _insert_free(self, cid: int) -> None:
        self.free_chunks[self.bin_for(self.chunks[cid][1])].add(cid)

    def _remove_free(self, cid: int) -> None:
        self.free_chunks[self.bin_for(self.chunks[cid][1])].discard(cid)

    def _find(self, rounded: int) -> int | None:
        for b in range(self.bin_for(rounded), BFC_NUM_BINS):
            best = None
            for cid in self.free_chunks[b]:
                address, size = self.chunks[cid][0], self.chunks[cid][1]
                if size >= rounded and (best is None or (size, address) < best[0]):
                    best = ((size, address), cid)
            if best is not None:
                cid = best[1]
                self._remove_free(cid)
                chunk = self.chunks[cid]
                if chunk[1] >= 2 * rounded or chunk[1] - rounded >= BFC_MAX_INTERNAL_FRAGMENTATION:
                    rest = self._new_chunk(chunk[0] + rounded, chunk[1] - rounded, cid, chunk[4])
                    if chunk[4] is not None:
                        self.chunks[chunk[4]][3] = rest
                    chunk[4] = rest
                    chunk[1] = rounded
                    self._insert_free(rest)
                chunk[2] = True
                self.in_use += chunk[1]
                self.peak = max(self.peak, self.in_use)
                return cid
        return None

    def _extend(self, rounded: int) -> None:
        increased = False
        while rounded > self.region_bytes:
            self.region_bytes *= 2
            increased = True
        size = self.region_bytes
        cid = self._new_chunk(self.next_address, size, None, None)
        self.next_address += size + (1 << 40)  # regions are never adjacent
        self._insert_free(cid)
        if not increased:
            self.region_bytes *= 2

    def alloc(self, num_bytes: int) -> int:
        """Allocates; returns a chunk id (its charged size is ``self.chunks[id][1]``)."""
        rounded = self.rounded(num_bytes)
        cid = self._find(rounded)
        if cid is None:
            self._extend(rounded)
            cid = self._find(rounded)
        return cid  # type: ignore[return-value]

    def free(self, cid: int) -> None:
        chunk = self.chunks[cid]
        chunk[2] = False
        self.in_use -= chunk[1]
        nxt = chunk[4]
        if nxt is not None and not self.chunks[nxt][2]:
            self._remove_free(nxt)
            self._merge(cid, nxt)
        prev = chunk[3]
        if prev is not None and not self.chunks[prev][2]:
            self._remove_free(prev)
            self._merge(prev, cid)
            cid = prev
        self._insert_free(cid)

    def _merge(self, first: int, second: int) -> None:
        a, b = self.chunks[first], self.chunks.pop(second)
        a[1] += b[1]
        a[4] = b[4]
        if b[4] is not None:
            self.chunks[b[4]][3] = first


@dataclasses.dataclass
class Size:
    """Bytes of a tensor as a polynomial in the batch size: ``sum(coef[k] * n**k)``."""

    coefs: tuple[int, ...]

    def at(self, n: int) -> int:
        return int(sum(c * n**k for k, c in enumerate(self.coefs)))


def _shape_size(shape: Any, dtype_size: int) -> Size | None:
    """The size of a static shape whose unknown dimensions equal the batch size."""
    if shape.rank is None:
        return None
    known = dtype_size
    unknown = 0
    for dim in shape.as_list():
        if dim is None:
            unknown += 1
        else:
            known *= int(dim)
    coefs = [0] * (unknown + 1)
    coefs[unknown] = known
    return Size(tuple(coefs))


def _dtype_size(dtype: Any) -> int:
    if dtype.name in ("resource", "variant", "string"):
        return 0
    try:
        return int(dtype.size)
    except Exception:  # noqa: BLE001 - exotic dtypes
        return 0


@dataclasses.dataclass
class Buffer:
    nbytes: int
    counted: int
    category: str
    refs: int = 0
    owned: bool = True  # False: a variable or a caller's tensor (never forwarded, never freed here)
    chunk: int | None = None  # the BFC chunk holding it, when an allocator is simulated


@dataclasses.dataclass
class ReplayResult:
    """The outcome of replaying one graph at one batch size."""

    peak: int = 0
    peak_counted: int = 0
    peak_phase: str = ""
    peak_breakdown: dict[str, int] = dataclasses.field(default_factory=dict)
    phase_peaks: dict[str, int] = dataclasses.field(default_factory=dict)
    phase_breakdowns: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    unknown_shapes: Counter = dataclasses.field(default_factory=Counter)
    ops: int = 0
    approximations: Counter = dataclasses.field(default_factory=Counter)


def _phase_of(op_name: str, state: dict[str, Any]) -> str:
    lowered = op_name.lower()
    if "gradient_tape/" in lowered or lowered.startswith("gradients/"):
        state["seen_backward"] = True
        return "backward"
    if state.get("seen_backward"):
        return "optimizer"
    return "forward"


def _phases(ops: list) -> dict[str, str]:
    """Phase of each op: forward, backward (up to the last op of the gradient tape), optimizer.

    Ops that a custom gradient creates while the tape differentiates (``tf.nn.silu``'s
    ``Square``, ``zeros_like``...) carry no ``gradient_tape/`` prefix; they belong to the
    backward pass all the same, so the backward ends at the last tape op, not the first.
    """
    state: dict[str, Any] = {}
    phases = {op.name: _phase_of(op.name, state) for op in ops}
    last = max((i for i, op in enumerate(ops) if phases[op.name] == "backward"), default=-1)
    for i, op in enumerate(ops[: last + 1]):
        if phases[op.name] == "optimizer":
            phases[op.name] = "backward"
    return phases


class GraphReplayer:
    """Replays the ops of a TensorFlow ``FuncGraph`` with reference-counted buffers.

    Args:
        lookup: Finds a function graph by name (for calls, branches, loop bodies).
        batch_size: The batch size substituted for unknown dimensions.
        bfc: The allocator model charged for each counted buffer, if any.
        parallel_ops: How many ready optimizer ops run at once (TensorFlow's
            inter-op threads, :func:`inter_op_threads`).
        scratch: Kernel scratch measured on this host (allocator-counted bytes at
            this batch size) by op name; it replaces the op's rule
            (:mod:`nnmem_callbacks.keras.tf_probes`).
        onednn: Whether TensorFlow runs its oneDNN kernels (companion rules
            such as oneDNN's max-pooling workspace apply only then).
        unlucky: Replay an unlucky run of the executor instead of the expected
            one: the ready ops of every phase run ``parallel_ops`` at a time
            (not only the optimizer's), and a ``While`` loop has
            ``min(parallel_iterations, trips)`` iterations in flight. Its peak
            bounds what run-to-run scheduling adds.
    """

    def __init__(
        self,
        lookup: Callable[[str], Any],
        batch_size: int,
        bfc: BFCSimulator | None = None,
        parallel_ops: int = 1,
        scratch: dict[str, int] | None = None,
        onednn: bool = True,
        unlucky: bool = False,
    ) -> None:
        self.lookup = lookup
        self.n = batch_size
        self.bfc = bfc
        self.parallel_ops = max(1, int(parallel_ops))
        self.scratch = dict(scratch or {})
        self.onednn = bool(onednn)
        self.unlucky = bool(unlucky)
        self.trace: list | None = None  # (+/-, tensor, bytes, charged bytes, in use) when debugging
        self.trips: dict[str, int] = {}
        self.unknown = Counter()
        self.approx = Counter()
        self.shapes: dict[Any, Any] = {}  # output shapes changed by a replayed Grappler rewrite
        self.order: list[str] = []  # the op names of the last replay, in the order they ran

    def shape_of(self, tensor: Any) -> Any:
        """The static shape of ``tensor``, as a replayed Grappler rewrite left it."""
        return self.shapes.get(tensor.ref(), tensor.shape)

    def elements(self, tensor: Any) -> int:
        """Number of elements of ``tensor`` at the replayed batch size (0 when unknown)."""
        size = _shape_size(self.shape_of(tensor), 1)
        return size.at(self.n) if size is not None else 0

    # -- sizes ---------------------------------------------------------------
    def size_of(self, tensor: Any, list_bytes: dict[Any, int] | None = None) -> int:
        if list_bytes is not None and tensor.dtype.name == "variant":
            return int(list_bytes.get(tensor.ref(), 0))
        size = _shape_size(self.shape_of(tensor), _dtype_size(tensor.dtype))
        if size is None:
            if _dtype_size(tensor.dtype):
                self.unknown[tensor.op.type] += 1
            return 0
        return size.at(self.n)

    # -- the replay ----------------------------------------------------------
    def replay(
        self,
        graph: Any,
        *,
        inputs_category: str | None = Category.INPUTS.value,
        input_list_bytes: dict[int, int] | None = None,
        track_phases: bool = True,
    ) -> tuple[ReplayResult, dict[Any, int]]:
        """Replays ``graph``; returns the result and the sizes of its variant outputs.

        Args:
            graph: A ``FuncGraph``.
            inputs_category: The category of non-resource placeholders (the
                batch) when they are allocated here; ``None`` when they belong
                to a caller (function bodies).
            input_list_bytes: Sizes of incoming ``TensorList`` arguments, by
                input position.
            track_phases: Split the peak by forward/backward/optimizer phase.
        """
        result = ReplayResult()
        created = graph.get_operations()
        phases_created = _phases(created) if track_phases else {op.name: "body" for op in created}
        graph_outputs = {t.ref() for t in graph.outputs}
        ops, inputs_of, self.shapes, waves = _schedule(
            created,
            phases_created,
            graph_outputs,
            self.elements,
            self.parallel_ops,
            eager_phases=tuple(set(phases_created.values())) if self.unlucky else EAGER_PHASES,
        )
        self.order = [op.name for op in ops]
        # an op whose successor runs in the same wave keeps its inputs until the wave is done
        holds = [
            i + 1 < len(ops) and ops[i].name in waves and waves.get(ops[i + 1].name) == waves[ops[i].name]
            for i in range(len(ops))
        ]
        deferred: list = []
        result.ops = len(ops)
        remaining: dict[Any, int] = {}
        for op in ops:
            for t in op.outputs:
                remaining[t.ref()] = 1 if t.ref() in graph_outputs else 0
        for op in ops:
            if op.type in METADATA_OPS:
                continue  # reads only the shape; runs as soon as its input exists (or is folded away)
            for t in inputs_of[op.name]:
                remaining[t.ref()] = remaining.get(t.ref(), 0) + 1
        buffer_of: dict[Any, Buffer] = {}
        list_bytes: dict[Any, int] = {}
        placeholder_index = {t.ref(): i for i, t in enumerate(graph.inputs)}
        live = {str(c): 0 for c in Category}
        live_counted = [0]
        bfc = self.bfc
        base_counted = bfc.in_use if bfc is not None else 0

        def allocate(tensor: Any, nbytes: int, category: str, owned: bool = True) -> None:
            counted = tf_allocator_bytes(nbytes) if owned else 0
            if tensor.dtype.name == "variant":
                # a TensorList's elements are separate allocations, each below the allocator's
                # reporting threshold for the RNN step sizes seen in practice
                counted = 0
            buffer = Buffer(nbytes, counted, category, 1, owned)
            if counted and bfc is not None:
                buffer.chunk = bfc.alloc(nbytes)
                buffer.counted = bfc.chunks[buffer.chunk][1]
                if self.trace is not None:
                    self.trace.append(("+", tensor.name, nbytes, buffer.counted, bfc.in_use))
            buffer_of[tensor.ref()] = buffer
            if owned:
                live[category] += nbytes
                live_counted[0] += buffer.counted

        def alias(tensor: Any, source: Any) -> bool:
            buffer = buffer_of.get(source.ref())
            if buffer is None:
                return False
            buffer.refs += 1
            buffer_of[tensor.ref()] = buffer
            return True

        companions: dict[Any, Any] = {}  # tensor -> a hidden buffer that dies with it
        values: dict[Any, Buffer] = {}  # resource -> the buffer its reads alias (the variable's value)

        def release(tensor: Any) -> None:
            companion = companions.pop(tensor.ref(), None)
            if companion is not None:
                release(companion)
            buffer = buffer_of.pop(tensor.ref(), None)
            if buffer is None:
                return
            buffer.refs -= 1
            if buffer.refs <= 0 and buffer.owned:
                live[buffer.category] -= buffer.nbytes
                live_counted[0] -= buffer.counted
                if buffer.chunk is not None and bfc is not None:
                    bfc.free(buffer.chunk)
                    buffer.chunk = None
                    if self.trace is not None:
                        self.trace.append(("-", tensor.name, buffer.nbytes, buffer.counted, bfc.in_use))

        def record(phase: str, extra: int = 0, extra_counted: int = 0) -> None:
            total = sum(live.values()) + extra
            if bfc is not None:
                if extra_counted:
                    scratch = bfc.alloc(extra_counted)
                    counted = bfc.in_use - base_counted
                    bfc.free(scratch)
                else:
                    counted = bfc.in_use - base_counted
            else:
                counted = live_counted[0] + extra_counted
            if counted > result.peak_counted:
                result.peak_counted = counted
            if track_phases and total > result.phase_peaks.get(phase, -1):
                result.phase_peaks[phase] = total
                snapshot = dict(live)
                snapshot[str(Category.TEMPORARIES)] += extra
                result.phase_breakdowns[phase] = snapshot
            if total > result.peak:
                result.peak = total
                result.peak_phase = phase
                snapshot = dict(live)
                snapshot[str(Category.TEMPORARIES)] += extra
                result.peak_breakdown = snapshot

        phases = [phases_created[op.name] for op in ops]
        phase_by_op = phases_created
        wave_scratch = [0, 0]  # scratch (bytes, counted) of the earlier ops of the running wave
        for index, (op, phase) in enumerate(zip(ops, phases)):
            kind = op.type
            category = {
                "forward": Category.ACTIVATIONS.value,
                "backward": Category.TEMPORARIES.value,
                "optimizer": Category.TEMPORARIES.value,
                "body": Category.TEMPORARIES.value,
            }[phase]
            if phase == "backward" and any(
                phase_by_op.get(c.name) == "optimizer" for t in op.outputs for c in t.consumers()
            ):
                category = Category.GRADIENTS.value
            transient, transient_counted = 0, 0
            if kind == "Placeholder":
                t = op.outputs[0]
                if t.dtype.name == "resource":
                    allocate(t, 0, Category.PARAMETERS.value, owned=False)
                elif t.dtype.name == "variant":
                    index = placeholder_index.get(t.ref())
                    list_bytes[t.ref()] = (input_list_bytes or {}).get(index, 0) if index is not None else 0
                    allocate(t, 0, Category.TEMPORARIES.value, owned=False)
                elif inputs_category is None:
                    allocate(t, self.size_of(t), Category.INPUTS.value, owned=False)
                else:
                    # the caller (the iterator, or the Python tensor) holds the batch for the whole step
                    allocate(t, self.size_of(t), inputs_category, owned=True)
                    buffer_of[t.ref()].refs += 1
                record(phase)
                continue
            if kind == "ReadVariableOp" and op.inputs:
                # reads share the variable's buffer; an update while a read is still alive copies
                # (copy-on-write: the profiler shows such ``AssignSubVariableOp`` temp allocations)
                resource = inputs_of[op.name][0].ref()
                value = values.get(resource)
                if value is None:
                    value = values[resource] = Buffer(self.size_of(op.outputs[0]), 0, category, 0, owned=False)
                value.refs += 1
                buffer_of[op.outputs[0].ref()] = value
            elif kind in ASSIGN_OPS and op.inputs:
                resource = inputs_of[op.name][0].ref()
                value = values.get(resource)
                if value is not None and value.refs > 0 and value.nbytes:
                    value.owned = True
                    value.counted = tf_allocator_bytes(value.nbytes)
                    live[value.category] += value.nbytes
                    if value.counted and bfc is not None:
                        value.chunk = bfc.alloc(value.nbytes)
                        value.counted = bfc.chunks[value.chunk][1]
                    live_counted[0] += value.counted
                    values.pop(resource)
                elif kind in FIRST_STEP_COPY_OPS and len(op.inputs) > 1:
                    # the first step of a fresh run: the variable still shares its buffer with its
                    # initial value, so the update writes a fresh copy (profiler: a variable-sized
                    # ``temp`` allocation in every AssignAdd/AssignSub of the first step, freed soon after)
                    transient = self.size_of(op.inputs[1])
                    transient_counted = tf_allocator_bytes(transient)
                for t in op.outputs:
                    allocate(t, 0, category, owned=False)
            elif kind in NO_ALLOC_OPS or kind == "Const":
                for t in op.outputs:
                    allocate(t, 0, category, owned=False)
            elif kind in ALIAS_OPS and op.inputs:
                for i, t in enumerate(op.outputs):
                    source = inputs_of[op.name][i] if kind == "IdentityN" else inputs_of[op.name][0]
                    if kind == "ReadVariableOp" or not alias(t, source):
                        allocate(t, 0 if kind == "ReadVariableOp" else self.size_of(t), category, owned=kind != "ReadVariableOp")
                    if t.dtype.name == "variant":
                        list_bytes[t.ref()] = list_bytes.get(source.ref(), 0)
            elif kind == "Transpose" and _identity_permutation(op):
                # TransposeOp returns its input when the permutation is the identity (Keras' Tensordot
                # emits such transposes; the profiler shows no buffer for them)
                if not alias(op.outputs[0], inputs_of[op.name][0]):
                    allocate(op.outputs[0], self.size_of(op.outputs[0]), category)
            elif kind == "Cast" and op.inputs and op.inputs[0].dtype == op.outputs[0].dtype:
                if not alias(op.outputs[0], inputs_of[op.name][0]):
                    allocate(op.outputs[0], self.size_of(op.outputs[0]), category)
            elif kind in CALL_OPS or kind in IF_OPS or kind in CASE_OPS or kind in WHILE_OPS:
                transient, transient_counted = self._call(op, list_bytes)
                for t in op.outputs:
                    allocate(t, self.size_of(t, list_bytes), category)
            elif kind in LIST_UPDATE_OPS and op.inputs and op.inputs[0].ref() in buffer_of:
                # lists are updated in place: the output list is the input's buffer, resized
                source = op.inputs[0]
                before = list_bytes.get(source.ref(), 0)
                self._list_sizes(op, list_bytes)
                after = list_bytes.get(op.outputs[0].ref(), before)
                buffer = buffer_of[source.ref()]
                buffer.refs += 1
                buffer_of[op.outputs[0].ref()] = buffer
                delta = after - before
                if buffer.owned:
                    buffer.nbytes += delta
                    live[buffer.category] += delta
                elif delta > 0:
                    grown = Buffer(delta, 0, category, 1, True)
                    live[category] += delta
                    buffer_of[op.outputs[0].ref()] = grown
                    buffer.refs -= 1
                for t in op.outputs[1:]:
                    allocate(t, self.size_of(t, list_bytes), category, owned=not (kind == "TensorListPopBack"))
            else:
                self._list_sizes(op, list_bytes)
                rule = WORKSPACE_RULES.get(kind)
                if op.name in self.scratch:
                    # measured under the BFC allocator; counted as this process's allocator counts it
                    transient = int(self.scratch[op.name])
                    transient_counted = tf_allocator_bytes(transient)
                elif rule is not None:
                    try:
                        transient = int(rule(op, self.size_of))
                    except Exception:  # noqa: BLE001 - a rule never breaks the replay
                        self.approx[f"workspace {kind}"] += 1
                    transient_counted = tf_allocator_bytes(transient)
                forwarded = set()
                companion_rule = COMPANION_RULES.get(kind) if self.onednn else None
                if companion_rule is not None and op.outputs:
                    try:
                        hidden = int(companion_rule(op, self.size_of))
                    except Exception:  # noqa: BLE001 - a rule never breaks the replay
                        hidden = 0
                        self.approx[f"companion {kind}"] += 1
                    if hidden:
                        key = _Hidden(op.name)
                        allocate(key, hidden, category)
                        companions[op.outputs[0].ref()] = key
                for t in op.outputs:
                    size = self.size_of(t, list_bytes)
                    if kind in FORWARDING_OPS:
                        source = self._forwardable(inputs_of[op.name], t, size, buffer_of, remaining, forwarded)
                        if source is not None:
                            forwarded.add(source.ref())
                            buffer = buffer_of[source.ref()]
                            buffer.refs += 1
                            buffer_of[t.ref()] = buffer
                            if buffer.category != category:
                                live[buffer.category] -= buffer.nbytes
                                live[category] += buffer.nbytes
                                buffer.category = category
                            continue
                    allocate(t, size, category)
            # ops of one wave run at the same time: their scratch is alive together until the wave is done
            record(phase, transient + wave_scratch[0], transient_counted + wave_scratch[1])
            deferred.append(op)
            if holds[index]:
                wave_scratch[0] += transient
                wave_scratch[1] += transient_counted
                continue
            wave_scratch[0] = wave_scratch[1] = 0
            for done_op in deferred:
                # free what this op consumed last, and outputs nobody reads
                for t in inputs_of[done_op.name] if done_op.type not in METADATA_OPS else ():
                    key = t.ref()
                    if key in remaining:
                        remaining[key] -= 1
                        if remaining[key] <= 0:
                            release(t)
                for t in done_op.outputs:
                    if remaining.get(t.ref(), 0) <= 0:
                        release(t)
            deferred.clear()
        result.unknown_shapes = Counter(self.unknown)
        result.approximations = Counter(self.approx)
        outputs_lists = {t.ref(): list_bytes.get(t.ref(), 0) for t in graph.outputs if t.dtype.name == "variant"}
        return result, outputs_lists

    @staticmethod
    def _forwardable(inputs, out, size, buffer_of, remaining, taken) -> Any:
        for source in inputs:
            buffer = buffer_of.get(source.ref())
            if (
                buffer is not None
                and buffer.owned
                and buffer.refs == 1
                and remaining.get(source.ref(), 0) == 1
                and buffer.nbytes == size
                and source.dtype == out.dtype
                and source.ref() not in taken
            ):
                return source
        return None

    def _list_sizes(self, op: Any, list_bytes: dict[Any, int]) -> None:
        """Sizes of ``TensorList`` variants produced by list ops."""
        kind = op.type
        if not op.outputs or op.outputs[0].dtype.name != "variant":
            return
        out = op.outputs[0].ref()
        try:
            if kind == "TensorListFromTensor":
                list_bytes[out] = self.size_of(op.inputs[0])
            elif kind == "TensorListReserve":
                count = _const_value(op.inputs[1])
                element = _element_bytes(op, self.n)
                list_bytes[out] = int(count) * element if count is not None and count >= 0 else 0
            elif kind in ("TensorListPushBack", "TensorListSetItem"):
                base = list_bytes.get(op.inputs[0].ref(), 0)
                element = op.inputs[-1] if kind == "TensorListPushBack" else op.inputs[2]
                # pushing a variable read stores a reference to the variable's buffer, not a copy
                item = 0 if _reads_variable(element) else self.size_of(element)
                list_bytes[out] = base + (item if kind == "TensorListPushBack" else 0)
            elif kind == "TensorListPopBack":
                item = self.size_of(op.outputs[1]) if len(op.outputs) > 1 else 0
                list_bytes[out] = max(list_bytes.get(op.inputs[0].ref(), 0) - item, 0)
            elif kind == "EmptyTensorList":
                list_bytes[out] = 0
        except Exception:  # noqa: BLE001 - sizes of lists are best effort
            self.approx[kind] += 1

    # -- functions -----------------------------------------------------------
    def _call(self, op: Any, list_bytes: dict[Any, int]) -> tuple[int, int]:
        """Transient bytes of a call, branch or loop; sets the sizes of variant outputs."""
        kind = op.type
        try:
            if kind in CALL_OPS:
                body = self.lookup(op.get_attr("f").name)
                return self._sub(body, op, list_bytes, inputs=list(op.inputs))
            if kind in IF_OPS:
                branches = [self.lookup(op.get_attr(a).name) for a in ("then_branch", "else_branch")]
                results = [self._sub(b, op, list_bytes, inputs=list(op.inputs)[1:]) for b in branches]
                return max(r[0] for r in results), max(r[1] for r in results)
            if kind in CASE_OPS:
                branches = [self.lookup(f.name) for f in op.get_attr("branches")]
                results = [self._sub(b, op, list_bytes, inputs=list(op.inputs)[1:]) for b in branches]
                return max(r[0] for r in results), max(r[1] for r in results)
            if kind in WHILE_OPS:
                return self._while(op, list_bytes)
        except Exception:  # noqa: BLE001 - unknown function layouts: count the op only
            self.approx[kind] += 1
        return 0, 0

    def _sub(self, graph: Any, op: Any, list_bytes, *, inputs: list) -> tuple[int, int]:
        incoming = {i: list_bytes.get(t.ref(), 0) for i, t in enumerate(inputs) if t.dtype.name == "variant"}
        result, out_lists = GraphReplayer(self.lookup, self.n, onednn=self.onednn, unlucky=self.unlucky).replay(
            graph, inputs_category=None, input_list_bytes=incoming, track_phases=False
        )
        for (key, size), out in zip(out_lists.items(), [t for t in op.outputs if t.dtype.name == "variant"]):
            list_bytes[out.ref()] = size
        return result.peak, result.peak_counted

    def _while(self, op: Any, list_bytes: dict[Any, int]) -> tuple[int, int]:
        body = self.lookup(op.get_attr("body").name)
        inputs = list(op.inputs)
        trips = self._trip_count(op, list_bytes)
        self.trips[op.name] = trips
        incoming = {i: list_bytes.get(t.ref(), 0) for i, t in enumerate(inputs) if t.dtype.name == "variant"}
        replayer = GraphReplayer(self.lookup, self.n, onednn=self.onednn, unlucky=self.unlucky)
        replayer.trips = self.trips
        result, out_lists = replayer.replay(body, inputs_category=None, input_list_bytes=incoming, track_phases=False)
        # growth of each list per iteration = its size after one body pass - before
        body_outputs = list(body.outputs)
        for i, out in enumerate(op.outputs):
            if out.dtype.name != "variant":
                continue
            before = incoming.get(i, 0)
            after = out_lists.get(body_outputs[i].ref(), before) if i < len(body_outputs) else before
            growth = after - before  # pushes grow a list, pops (gradient loops) shrink it
            list_bytes[out.ref()] = max(before + growth * trips, 0)
        if self.unlucky:
            # the executor runs up to ``parallel_iterations`` iterations of the body at once
            try:
                in_flight = max(1, min(int(op.get_attr("parallel_iterations")), trips))
            except (ValueError, TypeError):  # pragma: no cover - every While op has the attribute
                in_flight = 1
            return result.peak * in_flight, result.peak_counted * in_flight
        return result.peak, result.peak_counted

    def _trip_count(self, op: Any, list_bytes: dict[Any, int]) -> int:
        # Keras' RNN loops: the unstacked input list holds one element per step
        candidates = []
        for t in op.inputs:
            producer = t.op
            if producer.type == "TensorListFromTensor":
                dim = producer.inputs[0].shape.as_list()[0] if producer.inputs[0].shape.rank else None
                if dim is not None:
                    candidates.append(int(dim))
            if producer.type == "TensorListReserve":
                count = _const_value(producer.inputs[1])
                if count is not None and count > 0:
                    candidates.append(int(count))
            if producer.type in WHILE_OPS and producer.name in self.trips:
                candidates.append(self.trips[producer.name])  # a gradient loop runs as often as its forward loop
        if candidates:
            return max(candidates)
        try:
            maximum = op.get_attr("parallel_iterations")  # not a trip count; last resort
        except Exception:  # noqa: BLE001
            maximum = 1
        self.approx["While trip count"] += 1
        return max(int(maximum), 1)


#: Phases whose ops the replay runs as soon as their inputs exist (the others run in creation order).
EAGER_PHASES = ("optimizer",)


def _tensor_input_name(tensor: Any) -> str:
    """The name a ``GraphDef`` input string gives ``tensor`` (``op`` for output 0, ``op:i`` else)."""
    return tensor.op.name if tensor.value_index == 0 else f"{tensor.op.name}:{tensor.value_index}"


def _broadcastable(shape: Any, target: Any) -> bool:
    """Whether ``shape`` broadcasts to ``target`` (unknown dimensions only match unknown or 1)."""
    if shape.rank is None or target.rank is None or shape.rank > target.rank:
        return False
    for dim, goal in zip(reversed(shape.as_list()), reversed(target.as_list())):
        if dim == 1 or dim == goal:
            continue
        return False
    return True


def _broadcast_shape(first: Any, second: Any) -> Any:
    import tensorflow as tf

    a, b = first.as_list(), second.as_list()
    rank = max(len(a), len(b))
    a, b = [1] * (rank - len(a)) + a, [1] * (rank - len(b)) + b
    return tf.TensorShape([y if x == 1 else x for x, y in zip(a, b)])


def _constant_array(tensor: Any) -> Any:
    """The value of ``tensor`` when the graph fixes it (a numpy array), else ``None``."""
    from tensorflow.python.framework import tensor_util

    try:
        return tensor_util.constant_value(tensor)
    except Exception:  # noqa: BLE001
        return None


def _all_ones_or_zeros(tensor: Any) -> bool:
    value = _constant_array(tensor)
    return value is not None and (bool((value == 1).all()) or bool((value == 0).all()))


def minimize_broadcasts(
    ops: list, inputs_of: dict[str, list], graph_outputs: set, elements: Callable[[Any], int]
) -> tuple[set[str], dict[Any, Any]]:
    """Replays Grappler's ``ArithmeticOptimizer/MinimizeBroadcasts`` stage on ``inputs_of``.

    Grappler regroups a tree of ``Mul`` ops whose operands have different shapes so
    that the smallest operands meet first: ``(grad * softmax) * scale`` becomes
    ``(scale * softmax) * grad``. The regrouped inner product then depends on
    forward values only, and TensorFlow's data-flow executor computes it during
    the forward pass and keeps it until the backward pass reads it (the
    profiler's ``MemoryAllocation`` events of a ``MultiHeadAttention`` step show
    ``gradient_tape/.../mul_1`` allocated right after the forward ``Softmax``).

    The stage as in ``tensorflow/core/grappler/optimizers/arithmetic_optimizer.cc``:
    roots are visited from the last op back; a root absorbs ``Mul`` inputs that
    have a single consumer and no control edges (depth first, operands of a
    commutative op in name order, as Grappler canonicalizes them); when the
    operands have more than one shape they are stably sorted by size, the
    largest of an odd count is kept for the root, and pairs are combined from the
    smallest (a regrouped node counts as a scalar when sorting, as Grappler's
    shapeless placeholder does). Trees with more than one constant operand, or a
    product by one or zero, are left alone: Grappler's constant folding, which
    runs before this stage, rewrites those first.

    Args:
        ops: The graph's ops in creation (topological) order.
        inputs_of: Each op's data inputs; regrouped ops get their new operands here.
        graph_outputs: Refs of the graph's outputs (Grappler preserves their producers).
        elements: Number of elements of a tensor at the replayed batch size.

    Returns:
        The names of the regrouped ops (they run as soon as their new operands
        exist) and the new static shapes of their outputs, by tensor ref.
    """
    by_name = {op.name: op for op in ops}
    consumers: Counter = Counter()
    for name, inputs in inputs_of.items():
        for t in inputs:
            consumers[t.op.name] += 1
    drives_control = {c.name for op in ops for c in op.control_inputs}
    preserved = {ref.deref().op.name for ref in graph_outputs}
    tagged: set[str] = set()
    rewritten: set[str] = set()
    shapes: dict[Any, Any] = {}

    def shape_of(tensor: Any) -> Any:
        return shapes.get(tensor.ref(), tensor.shape)

    def canonical(op: Any) -> list:
        return sorted(inputs_of[op.name], key=_tensor_input_name)

    def operands_fit(op: Any) -> bool:
        target = shape_of(op.outputs[0])
        return target.rank is not None and all(_broadcastable(shape_of(t), target) for t in inputs_of[op.name])

    def absorbable(op: Any) -> bool:
        return (
            op.type == "Mul"
            and op.name in by_name
            and op.name not in tagged
            and op.name not in preserved
            and not op.control_inputs
            and op.name not in drives_control
            and consumers[op.name] == 1
            and operands_fit(op)
        )

    for root in reversed(ops):
        if root.type != "Mul" or root.name in tagged or root.name in preserved or len(inputs_of[root.name]) != 2:
            continue
        if not operands_fit(root):
            continue
        absorbed: list = []
        leaves: list = []
        pending = list(canonical(root))
        while pending:
            tensor = pending.pop(0)
            producer = tensor.op
            if absorbable(producer):
                absorbed.append(producer)
                pending[:0] = canonical(producer)
            else:
                leaves.append(tensor)
        if not absorbed:
            continue
        tagged.update([root.name] + [op.name for op in absorbed])
        constants = [t for t in leaves if t.op.type == "Const"]
        if len(constants) > 1 or any(_all_ones_or_zeros(t) for t in constants):
            # ConstantFolding, which runs first, merges the constants of such a tree or drops a
            # product by one (or zero); the tree the stage then sees is not this one
            continue
        if len({tuple(shape_of(t).as_list()) for t in leaves}) <= 1:
            continue
        # (tensor, sort size); a regrouped node sorts as a scalar
        queue = sorted(((t, elements(t)) for t in leaves), key=lambda item: item[1])
        leftover = queue.pop() if len(queue) % 2 else None
        spare = list(absorbed)
        while len(queue) > 1:
            (lhs, _), (rhs, _) = queue.pop(0), queue.pop(0)
            node = spare.pop() if spare else root
            inputs_of[node.name] = [lhs, rhs]
            shapes[node.outputs[0].ref()] = _broadcast_shape(shape_of(lhs), shape_of(rhs))
            rewritten.add(node.name)
            if len(queue) >= 2 and queue[0][1] < queue[1][1]:
                queue.insert(0, (node.outputs[0], 1))
            else:
                queue.append((node.outputs[0], 1))
        if leftover is not None:
            inputs_of[root.name] = [queue[0][0], leftover[0]]
            shapes[root.outputs[0].ref()] = _broadcast_shape(shape_of(queue[0][0]), shape_of(leftover[0]))
            rewritten.add(root.name)
    return rewritten, shapes


def _schedule(
    ops: list,
    phases: dict[str, str],
    graph_outputs: set | None = None,
    elements: Callable[[Any], int] | None = None,
    width: int = 1,
    eager_phases: tuple[str, ...] = EAGER_PHASES,
) -> tuple[list, dict[str, list], dict[Any, Any], dict[str, int]]:
    """The order the replay runs ops in, each op's data inputs, changed output shapes, and waves.

    Forward and gradient ops run in creation order. An optimizer op runs as soon
    as its inputs are ready: TensorFlow's executor is data-flow driven, so the
    update of a variable starts as soon as its gradient exists, in the middle of
    the backward pass, and the gradient is freed there (the profiler's
    ``MemoryAllocation`` events of a ResNet-50 step show ``adam/*`` buffers between
    the ``Conv2DBackpropFilter`` of successive layers). The ``IdentityN`` that
    gathers the gradients is a pass-through that Grappler removes: consumers of
    its outputs read its inputs directly and do not wait for the others.

    With ``elements`` (tensor sizes at the replayed batch), Grappler's
    broadcast-minimizing regrouping of ``Mul`` trees is replayed first
    (:func:`minimize_broadcasts`); a regrouped op runs as soon as its new operands
    exist, as the executor runs it.

    Ops that run as soon as they are ready (the optimizer's) run ``width`` at a
    time, as the executor's inter-op threads run them: the ops of one *wave* hold
    their inputs and outputs at the same time (Adam's first- and second-moment
    updates of a variable overlap). ``waves`` maps each op of a wave of two or
    more to the wave's first position in the order.
    """
    by_name = {op.name: op for op in ops}

    def source(tensor: Any) -> Any:
        while tensor.op.type == "IdentityN" and tensor.op.name in by_name:
            tensor = tensor.op.inputs[tensor.value_index]
        return tensor

    inputs_of = {op.name: [source(t) for t in op.inputs] for op in ops}
    eager: set[str] = set()
    shapes: dict[Any, Any] = {}
    if elements is not None:
        eager, shapes = minimize_broadcasts(ops, inputs_of, graph_outputs or set(), elements)
    if not eager and not any(phase in eager_phases for phase in phases.values()):
        return list(ops), inputs_of, shapes, {}
    outputs = {t.ref() for inputs in inputs_of.values() for t in inputs}
    # an IdentityN nobody reads any more (all its consumers were rewired) does not run
    dropped = {op.name for op in ops if op.type == "IdentityN" and not any(t.ref() in outputs for t in op.outputs)}
    waiting: dict[str, set[str]] = {}
    consumers: dict[str, list[str]] = {}
    for op in ops:
        if phases.get(op.name) not in eager_phases and op.name not in eager:
            continue
        deps = {t.op.name for t in inputs_of[op.name]} | {c.name for c in op.control_inputs}
        deps = {d for d in deps if d in by_name and by_name[d].type != "IdentityN"}
        waiting[op.name] = deps
        for d in deps:
            consumers.setdefault(d, []).append(op.name)
    order: list = []
    done: set[str] = set()
    position = {op.name: i for i, op in enumerate(ops)}

    waves: dict[str, int] = {}

    def emit(op: Any) -> None:
        import heapq

        heap = [(position[op.name], op.name)]
        while heap:
            # the ready ops run ``width`` at a time (the inter-op thread pool); an op's
            # consumers become ready once its wave is done
            wave = []
            while heap and len(wave) < width:
                _, name = heapq.heappop(heap)
                if name in done:
                    continue
                done.add(name)
                wave.append(name)
            if not wave:
                break
            start = len(order)
            for name in wave:
                order.append(by_name[name])
                if len(wave) > 1:
                    waves[name] = start
            for name in wave:
                for consumer in consumers.get(name, ()):
                    deps = waiting[consumer]
                    deps.discard(name)
                    if not deps and consumer not in done:
                        heapq.heappush(heap, (position[consumer], consumer))

    done.update(dropped)
    for op in ops:  # captured resources, constants: ready from the start
        if op.name in waiting and not waiting[op.name] and op.name not in done:
            emit(op)
    for op in ops:
        if op.name in done:
            continue
        if op.name in waiting:
            if waiting[op.name]:
                continue  # runs when its last input is produced
        emit(op)
    for op in ops:  # anything left (cycles through control edges never happen; defensive)
        if op.name not in done:
            done.add(op.name)
            order.append(op)
    return order, inputs_of, shapes, waves


def _identity_permutation(op: Any) -> bool:
    perm = _constant_array(op.inputs[1])
    return perm is not None and [int(v) for v in perm.reshape(-1)] == list(range(int(perm.size)))


def _reads_variable(tensor: Any) -> bool:
    while tensor.op.type in ("Identity", "Cast") and tensor.op.inputs and (
        tensor.op.type == "Identity" or tensor.op.inputs[0].dtype == tensor.dtype
    ):
        tensor = tensor.op.inputs[0]
    return tensor.op.type == "ReadVariableOp"


def _const_value(tensor: Any) -> Any:
    value = _constant_array(tensor)
    if value is None:
        return None
    try:
        return int(value)
    except Exception:  # noqa: BLE001
        return None


def _element_bytes(op: Any, batch_size: int) -> int:
    from tensorflow.python.framework import tensor_util

    shape = tensor_util.constant_value(op.inputs[0])
    dtype = op.get_attr("element_dtype")
    if shape is None:
        return 0
    total = _dtype_size(dtype)
    for dim in list(shape.reshape(-1)) if getattr(shape, "ndim", 0) else []:
        total *= batch_size if int(dim) < 0 else int(dim)
    return total


def function_lookup(root_graph: Any) -> Callable[[str], Any]:
    """Finds the ``FuncGraph`` of a function called anywhere inside ``root_graph``."""
    cache: dict[str, Any] = {}
    graphs = [root_graph]

    def lookup(name: str) -> Any:
        if name in cache:
            return cache[name]
        for graph in list(graphs):
            functions = getattr(graph, "_functions", {}) or {}
            function = functions.get(name)
            if function is None:
                continue
            inner = getattr(function, "graph", None)
            if inner is None:
                from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

                inner = function_def_to_graph(function.definition)
            cache[name] = inner
            graphs.append(inner)
            return inner
        from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

        for graph in list(graphs):
            try:
                function = graph._get_function(name)  # noqa: SLF001 - no public accessor
            except Exception:  # noqa: BLE001
                function = None
            if function is not None:
                inner = getattr(function, "graph", None) or function_def_to_graph(function.definition)
                cache[name] = inner
                graphs.append(inner)
                return inner
        raise KeyError(f"function {name!r} not found in the traced graph")

    return lookup


# -- the estimator -------------------------------------------------------------
def inter_op_threads() -> int:
    """The size of TensorFlow's inter-op thread pool: the configured value, else the usable CPUs."""
    import os

    import tensorflow as tf

    configured = int(tf.config.threading.get_inter_op_parallelism_threads() or 0)
    if configured > 0:
        return configured
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def trace_train_step(model: Any, x_specs: Any, y_specs: Any, batch_size: int | None = None) -> Any:
    """The concrete graph of ``model.train_step`` on ``(x, y)`` specs.

    With ``batch_size`` the batch dimension is that number, as in the function
    TensorFlow runs (Keras calls it with concrete tensors, and the runtime
    specializes the graph to their shapes); without it, it stays ``None``.
    """
    import tensorflow as tf

    from nnmem_callbacks.keras.common import tree_map

    def tensor_spec(spec: Any) -> Any:
        shape = spec.shape if batch_size is None else spec.at(batch_size)
        return tf.TensorSpec(shape, tf.as_dtype(spec.dtype))

    data = (tree_map(tensor_spec, x_specs), tree_map(tensor_spec, y_specs))
    function = tf.function(model.train_step, autograph=False)
    return function.get_concrete_function(data)


def onednn_enabled() -> bool:
    """Whether this process's TensorFlow runs its oneDNN kernels (``TF_ENABLE_ONEDNN_OPTS`` or the host default)."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):  # pragma: no cover - a TensorFlow without the query
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "0") == "1"


def estimate_tensorflow(
    model: Any, batch_size: int, x_specs: Any, y_specs: Any, notes: list[str], *, probe_kernels: bool = True
) -> Any:
    """Estimates the TensorFlow train step by graph replay (see the module docstring).

    With ``probe_kernels`` the scratch of the step's kernels is measured on this
    host (:mod:`nnmem_callbacks.keras.tf_probes`); without, the graph's rules apply.
    """
    from nnmem_callbacks.estimate import MemoryEstimate, PhaseLine, upper_envelope
    from nnmem_callbacks.keras.common import accumulation_steps, precision_of, static_bytes, tree_leaves, unique

    import time

    started = time.perf_counter()
    optimizer = model.optimizer
    was_built = bool(getattr(optimizer, "built", False))
    iterations = int(optimizer.iterations.numpy()) if was_built else 0
    # one trace per replayed batch size: with a symbolic batch, shapes computed at run time
    # (``Tensordot``'s flattened ``batch x steps`` rows) would be unknown or wrongly sized
    concretes = {n: trace_train_step(model, x_specs, y_specs, n) for n in (batch_size, 2 * batch_size)}
    if not was_built:
        notes.append("tracing built the optimizer (its slot variables), as Keras does at the first fit step")
    if was_built and int(optimizer.iterations.numpy()) != iterations:  # pragma: no cover - tracing never runs
        notes.append("warning: optimizer iterations changed during tracing")
    static = static_bytes(model, unique(optimizer.variables))
    from nnmem_callbacks.keras.common import variable_bytes

    state_sizes = [variable_bytes(v) for v in unique(model.variables) + unique(optimizer.variables)]
    counted_static = sum(tf_allocator_bytes(size) for size in state_sizes)
    static_total = sum(static.values())
    onednn = onednn_enabled()
    scratch_curves: dict[str, Any] = {}
    if probe_kernels:
        from nnmem_callbacks.keras import tf_probes

        try:
            probes, undescribed = tf_probes.collect(
                concretes[batch_size].graph, concretes[2 * batch_size].graph, batch_size, onednn=onednn
            )
            scratch_curves, report = tf_probes.measure(probes, (batch_size, 2 * batch_size))
            report.skipped += undescribed
            notes.append(report.note())
        except Exception as error:  # noqa: BLE001 - probing never breaks the estimate
            notes.append(f"TensorFlow kernel scratch not probed ({type(error).__name__}: {error}); graph rules apply")
    else:
        notes.append("TensorFlow kernel scratch from the graph's rules (probe_kernels=False)")
    notes.append(f"TensorFlow kernels: oneDNN {'on' if onednn else 'off'} in this process")
    results, unlucky = {}, {}
    for n in (batch_size, 2 * batch_size):
        graph = concretes[n].graph
        scratch = {name: curve.at(n) for name, curve in scratch_curves.items()}  # curves are over samples
        for bad_luck, into in ((False, results), (True, unlucky)):
            # the allocator as the step finds it: the variables and slots in their chunks
            bfc = BFCSimulator()
            for size in state_sizes:
                if tf_allocator_bytes(size):
                    bfc.alloc(size)
            replayer = GraphReplayer(
                function_lookup(graph), n, bfc=bfc, parallel_ops=inter_op_threads(), scratch=scratch,
                onednn=onednn, unlucky=bad_luck,
            )
            into[n], _ = replayer.replay(graph)
    main = results[batch_size]
    double = results[2 * batch_size]
    # what the executor's scheduling may add in an unlucky run, as a line in the batch size
    spread = {n: max(unlucky[n].peak - results[n].peak, 0) for n in results}
    spread_slope = max((spread[2 * batch_size] - spread[batch_size]) / batch_size, 0.0)
    variability = PhaseLine(
        "tensorflow scheduling", int(round(spread[batch_size] - spread_slope * batch_size)), int(round(spread_slope))
    )
    if spread[batch_size]:
        notes.append(
            f"TensorFlow's executor overlaps ops and loop iterations differently from run to run: an unlucky run "
            f"may reach {spread[batch_size] / 2**20:.1f} MiB more; planning budgets with that upper bound"
        )
    lines = []
    phase_breakdowns = {}
    for phase, value in main.phase_peaks.items():
        slope = max(int(round((double.phase_peaks.get(phase, value) - value) / batch_size)), 0)
        lines.append(PhaseLine(f"step/{phase}", static_total + value - slope * batch_size, slope))
        breakdown = dict(main.phase_breakdowns[phase])
        for key, value_static in static.items():
            breakdown[key] += value_static
        phase_breakdowns[f"step/{phase}"] = breakdown
    breakdown = dict(main.peak_breakdown)
    for key, value_static in static.items():
        breakdown[key] += value_static
    if main.unknown_shapes:
        notes.append(
            "tensors of unknown shape counted as 0 bytes: "
            + ", ".join(f"{k} x{v}" for k, v in sorted(main.unknown_shapes.items()))
        )
    if main.approximations:
        notes.append("approximated: " + ", ".join(f"{k} x{v}" for k, v in sorted(main.approximations.items())))
    if getattr(model, "jit_compile", False):
        notes.append(
            "the model is compiled with jit_compile=True: XLA assigns the buffers in the real run, the graph "
            "replay approximates it"
        )
    accumulate = accumulation_steps(model)
    if accumulate > 1:
        notes.append(f"gradient_accumulation_steps={accumulate}: accumulators are counted in optimizer_state")
    peak_phase = f"step/{main.peak_phase}"
    counted_peak = counted_static + main.peak_counted
    return MemoryEstimate(
        peak_bytes=int(static_total + main.peak),
        breakdown=breakdown,
        batch_size=batch_size,
        phases=tuple(upper_envelope(lines)) or (PhaseLine(peak_phase, static_total + main.peak, 0),),
        peak_phase=peak_phase,
        device="cpu",
        precision=precision_of(model),
        method="tf-graph",
        notes=tuple(notes),
        phase_breakdowns=phase_breakdowns,
        variability=variability,
        extra={
            "backend": "tensorflow",
            "ops": main.ops,
            "tf_allocator_peak_bytes": int(counted_peak),
            "tf_allocator_static_bytes": int(counted_static),
            "tf_allocator_peak_bytes_2x": int(counted_static + double.peak_counted),
            "tf_allocator_peak_upper_bytes": int(counted_static + max(unlucky[batch_size].peak_counted, main.peak_counted)),
            "seconds": round(time.perf_counter() - started, 3),
            "inputs": len(tree_leaves(x_specs)) + len(tree_leaves(y_specs)),
        },
    )
