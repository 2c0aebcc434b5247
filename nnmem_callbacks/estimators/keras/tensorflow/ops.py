"""Per-op rules of the TensorFlow graph replay: a registry of op handlers, looked up by op type.

Each handler says what one op does to memory when TensorFlow's executor runs it (outputs, aliases, scratch from
:data:`WORKSPACE_RULES` or the probes, hidden outputs from :data:`COMPANION_RULES`, ``TensorList`` sizes, calls and
``While`` loops). Handlers are registered with :func:`handler` and found with :func:`handler_for` (default
:func:`kernel_op`); a handler is ``function(run, op, category) -> (transient, transient_counted)``.

Design: docs/keras-tensorflow-replay.md, "Per-op rules".

Example:
    >>> handler_for("Conv2DBackpropInput") is handler_for("SomeOpNobodyRegistered")
    True
    >>> handler_for("Relu").name, handler_for("While").name, handler_for("Placeholder").in_schedule
    ('elementwise_op', 'control_flow_op', False)

Known limitations:
    * Only the kernel scratch of :data:`WORKSPACE_RULES` (and what the probes
      measured) is modelled; other kernels are assumed to need none.
    * Shape-only consumers (:data:`METADATA_OPS`) are assumed not to keep their
      input alive.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from nnmem_callbacks.allocators.tensorflow_cpu import tf_allocator_bytes
from nnmem_callbacks.core.estimate import Category
from nnmem_callbacks.estimators.keras.tensorflow.trace import (
    const_value,
    element_bytes,
    identity_permutation,
    reads_variable,
)

__all__ = [
    "alias_op",
    "ALIAS_OPS",
    "ASSIGN_OPS",
    "assign_variable",
    "body_pieces",
    "CALL_OPS",
    "call_transient",
    "CASE_OPS",
    "cast",
    "COMPANION_RULES",
    "control_flow_op",
    "DEFAULT_HANDLER",
    "elementwise_op",
    "forwardable_input",
    "FORWARDING_OPS",
    "handler",
    "handler_for",
    "HANDLERS",
    "IF_OPS",
    "kernel_op",
    "list_sizes",
    "list_update",
    "LIST_UPDATE_OPS",
    "METADATA_OPS",
    "no_alloc_op",
    "NO_ALLOC_OPS",
    "NO_TRANSIENT",
    "OpHandler",
    "placeholder",
    "read_variable",
    "transpose",
    "trip_count",
    "WHILE_OPS",
    "WORKSPACE_RULES",
]


#: Ops whose output ``i`` shares the buffer of input ``i`` (or input 0).
ALIAS_OPS = frozenset(
    "Identity IdentityN Reshape ExpandDims Squeeze StopGradient Snapshot EnsureShape PreventGradient "
    "CheckNumerics DebugIdentity Bitcast ReadVariableOp ResourceGather_NoAlias_Placeholder".split()
)

#: Element-wise ops that write into an input buffer when that input dies with them.
FORWARDING_OPS = frozenset(
    {
        "Add",
        "AddV2",
        "Sub",
        "Mul",
        "RealDiv",
        "Div",
        "DivNoNan",
        "Maximum",
        "Minimum",
        "Pow",
        "SquaredDifference",
        "FloorDiv",
        "FloorMod",
        "Neg",
        "Abs",
        "Sqrt",
        "Rsqrt",
        "Square",
        "Exp",
        "Log",
        "Log1p",
        "Tanh",
        "Sigmoid",
        "Relu",
        "Relu6",
        "Elu",
        "Selu",
        "LeakyRelu",
        "Softplus",
        "Softsign",
        "Reciprocal",
        "Sign",
        "Floor",
        "Ceil",
        "Round",
        "Erf",
        "Erfc",
        "Sin",
        "Cos",
        "ReluGrad",
        "Relu6Grad",
        "EluGrad",
        "SeluGrad",
        "LeakyReluGrad",
        "SoftplusGrad",
        "TanhGrad",
        "SigmoidGrad",
        "SqrtGrad",
        "RsqrtGrad",
        "ReciprocalGrad",
        "AddN",
        "BiasAdd",
        "ClipByValue",
        "SelectV2",
        "Select",
        "OnesLike",
        "ZerosLike",
        "Inv",
        "Xlogy",
        "Xdivy",
        "MulNoNan",
        # SoftmaxOp: forward_input_or_allocate_output({0}, 0, ...); the profiler shows no Softmax buffer
        "Softmax",
        "LogSoftmax",
    }
)

#: Ops that allocate nothing (resources, control, host-side scalars) or update in place.
NO_ALLOC_OPS = frozenset(
    "NoOp Placeholder VarHandleOp AssignVariableOp AssignAddVariableOp AssignSubVariableOp "
    "ResourceApplyAdam ResourceApplyGradientDescent ResourceApplyKerasMomentum ResourceApplyRMSProp "
    "ResourceApplyAdagradV2 ResourceScatterAdd ResourceScatterUpdate ResourceScatterSub "
    "VarIsInitializedOp Assert PrintV2 StatelessRandomGetKeyCounter DestroyResourceOp".split()
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
        swap = all((remap[types[a]], a) <= (remap[types[b]], b) for a, b in zip(labels, labels[1:]))
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
    "AssignVariableOp AssignAddVariableOp AssignSubVariableOp ResourceApplyAdam "
    "ResourceApplyGradientDescent ResourceApplyKerasMomentum ResourceApplyRMSProp ResourceApplyAdagradV2".split()
)


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


# -- the registry ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OpHandler:
    """A registered op handler.

    Attributes:
        name: The handler function's name (for messages and tests).
        function: ``function(run, op, category) -> (transient, transient_counted)``.
        in_schedule: ``False`` for ops the executor does not schedule as kernels
            (a graph's placeholders): their outputs are bound when the graph
            starts, they join no wave and free nothing when done.
    """

    name: str
    function: Callable[[Any, Any, str], tuple[int, int]]
    in_schedule: bool = True


#: Op type -> its handler; :func:`handler_for` falls back to :func:`kernel_op`.
HANDLERS: dict[str, OpHandler] = {}

NO_TRANSIENT = (0, 0)


def handler(*op_types: str, in_schedule: bool = True) -> Callable[[Callable], Callable]:
    """Registers the decorated function as the handler of ``op_types`` (one handler per op type)."""

    def register(function: Callable) -> Callable:
        entry = OpHandler(function.__name__, function, in_schedule)
        for op_type in op_types:
            if op_type in HANDLERS:
                raise ValueError(f"op type {op_type!r} already has the handler {HANDLERS[op_type].name!r}")
            HANDLERS[op_type] = entry
        return function

    return register


def handler_for(op_type: str) -> OpHandler:
    """The handler of ``op_type``: the registered one, else :data:`DEFAULT_HANDLER`."""
    return HANDLERS.get(op_type, DEFAULT_HANDLER)


# -- kernels -----------------------------------------------------------------------------------------
def kernel_op(run: Any, op: Any, category: str) -> tuple[int, int]:
    """The default: a kernel that allocates its outputs, with scratch from the probes or :data:`WORKSPACE_RULES`."""
    return _kernel(run, op, category, forwarding=False)


DEFAULT_HANDLER = OpHandler("kernel_op", kernel_op)


@handler(*FORWARDING_OPS)
def elementwise_op(run: Any, op: Any, category: str) -> tuple[int, int]:
    """An element-wise kernel: writes into an input buffer that dies with it, else allocates (``forward_input_or_allocate_output``).

    A replay with ``forwarding=False`` (an upper bound's run) always allocates.
    """
    return _kernel(run, op, category, forwarding=run.replayer.forwarding)


def _kernel(run: Any, op: Any, category: str, *, forwarding: bool) -> tuple[int, int]:
    replayer = run.replayer
    kind = op.type
    transient, transient_counted = 0, 0
    list_sizes(replayer, op, run.list_bytes)
    rule = WORKSPACE_RULES.get(kind)
    if op.name in replayer.scratch:
        # measured under the BFC allocator; counted as this process's allocator counts it
        transient = int(replayer.scratch[op.name])
        transient_counted = tf_allocator_bytes(transient)
    elif rule is not None:
        try:
            transient = int(rule(op, replayer.size_of))
        except Exception:  # noqa: BLE001 - a rule never breaks the replay
            replayer.approx[f"workspace {kind}"] += 1
        transient_counted = tf_allocator_bytes(transient)
    forwarded: set = set()
    companion_rule = COMPANION_RULES.get(kind) if replayer.onednn else None
    if companion_rule is not None and op.outputs:
        try:
            hidden = int(companion_rule(op, replayer.size_of))
        except Exception:  # noqa: BLE001 - a rule never breaks the replay
            hidden = 0
            replayer.approx[f"companion {kind}"] += 1
        if hidden:
            key = _Hidden(op.name)
            run.allocate(key, hidden, category)
            run.companions[op.outputs[0].ref()] = key
    inputs = run.inputs_of[op.name]
    for t in op.outputs:
        size = replayer.size_of(t, run.list_bytes)
        if forwarding:
            source = forwardable_input(inputs, t, size, run.buffer_of, run.remaining, forwarded)
            if source is not None:
                forwarded.add(source.ref())
                run.forward(source, t, category)
                continue
        run.allocate(t, size, category)
    return transient, transient_counted


def forwardable_input(inputs: list, out: Any, size: int, buffer_of: dict, remaining: dict, taken: set) -> Any:
    """The input whose buffer ``out`` can take over (owned, same size and dtype, read last by this op), or ``None``."""
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


# -- inputs, constants, variables --------------------------------------------------------------------
@handler("Placeholder", in_schedule=False)
def placeholder(run: Any, op: Any, category: str) -> tuple[int, int]:
    """A graph input: a resource (a variable's handle), a caller's ``TensorList``, or the batch."""
    t = op.outputs[0]
    if t.dtype.name == "resource":
        run.allocate(t, 0, Category.PARAMETERS.value, owned=False)
    elif t.dtype.name == "variant":
        index = run.placeholder_index.get(t.ref())
        run.list_bytes[t.ref()] = (run.input_list_bytes or {}).get(index, 0) if index is not None else 0
        run.allocate(t, 0, Category.TEMPORARIES.value, owned=False)
    elif run.inputs_category is None:
        run.allocate(t, run.replayer.size_of(t), Category.INPUTS.value, owned=False)
    else:
        # the caller (the iterator, or the Python tensor) holds the batch for the whole step
        run.allocate(t, run.replayer.size_of(t), run.inputs_category, owned=True)
        run.buffer_of[t.ref()].refs += 1
    return NO_TRANSIENT


@handler(*(NO_ALLOC_OPS - ASSIGN_OPS - {"Placeholder"}), "Const")
def no_alloc_op(run: Any, op: Any, category: str) -> tuple[int, int]:
    """Resources, control, host-side scalars and constants: nothing allocated."""
    for t in op.outputs:
        run.allocate(t, 0, category, owned=False)
    return NO_TRANSIENT


@handler("ReadVariableOp")
def read_variable(run: Any, op: Any, category: str) -> tuple[int, int]:
    """On CPU a read returns the variable's own buffer (an update while a read is alive copies it)."""
    if not op.inputs:
        return kernel_op(run, op, category)
    resource = run.inputs_of[op.name][0].ref()
    value = run.variable_value(resource, run.replayer.size_of(op.outputs[0]), category)
    value.refs += 1
    run.buffer_of[op.outputs[0].ref()] = value
    return NO_TRANSIENT


@handler(*ASSIGN_OPS)
def assign_variable(run: Any, op: Any, category: str) -> tuple[int, int]:
    """An in-place update; a copy when a read of the old value is still alive.

    Copy-on-write: the profiler shows ``AssignSubVariableOp`` temp allocations while a read is
    alive, in every step. A first-step copy of each updated variable (a buffer still shared with
    its initial value) was modelled until the allocator's per-buffer events
    (``python -m benchmarks.tf_memory_events CASE --fresh --grep Assign``) showed none, in either
    oneDNN mode, on an AVX2 and an AVX-512 host.

    An update whose variable a kernel of a sibling wave read (a convolution's input gradient reads
    the kernel while the update after its filter gradient runs) copies it too: the variable moves to
    a new chunk, which the next replayed step finds (:meth:`~nnmem_callbacks.estimators.keras.tensorflow.replay.ReplayRun.copy_racing`).
    """
    if not op.inputs:
        return no_alloc_op(run, op, category)
    resource = run.inputs_of[op.name][0].ref()
    value = run.values.get(resource)
    if value is not None and value.refs > 0 and value.nbytes:
        run.take_ownership(value, resource)
        run.values.pop(resource)
    elif value is not None and value.nbytes:
        run.copy_racing(value, resource)
    for t in op.outputs:
        run.allocate(t, 0, category, owned=False)
    return NO_TRANSIENT


# -- aliases ------------------------------------------------------------------------------------------
@handler(*(ALIAS_OPS - {"ReadVariableOp"}))
def alias_op(run: Any, op: Any, category: str) -> tuple[int, int]:
    """Output ``i`` shares the buffer of input ``i`` (``IdentityN``) or input 0."""
    if not op.inputs:
        return kernel_op(run, op, category)
    inputs = run.inputs_of[op.name]
    for i, t in enumerate(op.outputs):
        source = inputs[i] if op.type == "IdentityN" else inputs[0]
        if not run.alias(t, source):
            run.allocate(t, run.replayer.size_of(t), category)
        if t.dtype.name == "variant":
            run.list_bytes[t.ref()] = run.list_bytes.get(source.ref(), 0)
    return NO_TRANSIENT


@handler("Transpose")
def transpose(run: Any, op: Any, category: str) -> tuple[int, int]:
    """``TransposeOp`` returns its input when the permutation is the identity.

    Keras' ``Tensordot`` emits such transposes; the profiler shows no buffer for them.
    """
    if not identity_permutation(op):
        return kernel_op(run, op, category)
    return _alias_or_allocate(run, op, category)


@handler("Cast")
def cast(run: Any, op: Any, category: str) -> tuple[int, int]:
    """A cast to the input's own dtype returns the input."""
    if not (op.inputs and op.inputs[0].dtype == op.outputs[0].dtype):
        return kernel_op(run, op, category)
    return _alias_or_allocate(run, op, category)


def _alias_or_allocate(run: Any, op: Any, category: str) -> tuple[int, int]:
    if not run.alias(op.outputs[0], run.inputs_of[op.name][0]):
        run.allocate(op.outputs[0], run.replayer.size_of(op.outputs[0]), category)
    return NO_TRANSIENT


# -- TensorLists --------------------------------------------------------------------------------------
@handler(*LIST_UPDATE_OPS)
def list_update(run: Any, op: Any, category: str) -> tuple[int, int]:
    """Lists are updated in place: the output list is the input's buffer, resized."""
    if not (op.inputs and op.inputs[0].ref() in run.buffer_of):
        return kernel_op(run, op, category)
    replayer, list_bytes = run.replayer, run.list_bytes
    source = op.inputs[0]
    before = list_bytes.get(source.ref(), 0)
    list_sizes(replayer, op, list_bytes)
    after = list_bytes.get(op.outputs[0].ref(), before)
    run.resize_list(source, op.outputs[0], after - before, category)
    for t in op.outputs[1:]:
        run.allocate(t, replayer.size_of(t, list_bytes), category, owned=not (op.type == "TensorListPopBack"))
    return NO_TRANSIENT


def list_sizes(replayer: Any, op: Any, list_bytes: dict[Any, int]) -> None:
    """Sizes of ``TensorList`` variants produced by list ops."""
    kind = op.type
    if not op.outputs or op.outputs[0].dtype.name != "variant":
        return
    out = op.outputs[0].ref()
    elements = replayer.list_elements
    try:
        if kind == "TensorListFromTensor":
            list_bytes[out] = replayer.size_of(op.inputs[0])
            rows = op.inputs[0].shape.as_list()[0] if op.inputs[0].shape.rank else None
            if rows:
                elements[out] = list_bytes[out] // int(rows)
        elif kind == "TensorListReserve":
            count = const_value(op.inputs[1])
            element = element_bytes(op, replayer.n)
            list_bytes[out] = int(count) * element if count is not None and count >= 0 else 0
            elements[out] = element
        elif kind in ("TensorListPushBack", "TensorListSetItem"):
            base = list_bytes.get(op.inputs[0].ref(), 0)
            element = op.inputs[-1] if kind == "TensorListPushBack" else op.inputs[2]
            # pushing a variable read stores a reference to the variable's buffer, not a copy
            item = 0 if reads_variable(element) else replayer.size_of(element)
            list_bytes[out] = base + (item if kind == "TensorListPushBack" else 0)
            elements[out] = elements.get(op.inputs[0].ref(), 0) or item
        elif kind == "TensorListPopBack":
            item = replayer.size_of(op.outputs[1]) if len(op.outputs) > 1 else 0
            list_bytes[out] = max(list_bytes.get(op.inputs[0].ref(), 0) - item, 0)
            elements[out] = elements.get(op.inputs[0].ref(), 0) or item
        elif kind == "EmptyTensorList":
            list_bytes[out] = 0
    except Exception:  # noqa: BLE001 - sizes of lists are best effort
        replayer.approx[kind] += 1


# -- functions, branches, loops -----------------------------------------------------------------------
@handler(*CALL_OPS, *IF_OPS, *CASE_OPS, *WHILE_OPS)
def control_flow_op(run: Any, op: Any, category: str) -> tuple[int, int]:
    """A call, branch or loop: its body is replayed; its transient peak is alive at the call."""
    transient = call_transient(run.replayer, op, run.list_bytes)
    for t in op.outputs:
        run.allocate(t, run.replayer.size_of(t, run.list_bytes), category)
    return transient


def call_transient(replayer: Any, op: Any, list_bytes: dict[Any, int]) -> tuple[int, int | list[int]]:
    """Transient bytes of a call, branch or loop; sets the sizes of variant outputs."""
    kind = op.type
    try:
        if kind in CALL_OPS:
            body = replayer.lookup(op.get_attr("f").name)
            return _replay_function(replayer, body, op, list_bytes, inputs=list(op.inputs))
        if kind in IF_OPS or kind in CASE_OPS:
            names = (
                [op.get_attr(a).name for a in ("then_branch", "else_branch")]
                if kind in IF_OPS
                else [f.name for f in op.get_attr("branches")]
            )
            results = [
                _replay_function(replayer, replayer.lookup(name), op, list_bytes, inputs=list(op.inputs)[1:])
                for name in names
            ]
            return max(r[0] for r in results), max((r[1] for r in results), key=sum)
        if kind in WHILE_OPS:
            return _replay_loop(replayer, op, list_bytes)
    except Exception:  # noqa: BLE001 - unknown function layouts: count the op only
        replayer.approx[kind] += 1
    return 0, 0


def _replay_function(
    replayer: Any, graph: Any, op: Any, list_bytes: dict[Any, int], *, inputs: list
) -> tuple[int, list[int]]:
    incoming = {i: list_bytes.get(t.ref(), 0) for i, t in enumerate(inputs) if t.dtype.name == "variant"}
    result, out_lists = replayer.child().replay(
        graph, inputs_category=None, input_list_bytes=incoming, track_phases=False
    )
    for size, out in zip(out_lists.values(), [t for t in op.outputs if t.dtype.name == "variant"]):
        list_bytes[out.ref()] = size
    return result.peak, body_pieces(result)


def body_pieces(result: Any, copies: int = 1) -> list[int]:
    """What the caller's allocator is charged for a body's transient peak: its allocations, ``copies`` times.

    A body's peak is many small buffers (a recurrent cell's gates, one step's
    list elements); charged as one allocation of their sum, the caller's
    allocator model would open a region for a block the kernels never ask for.
    """
    pieces = list(result.peak_pieces) or ([result.peak_counted] if result.peak_counted else [])
    return pieces * copies


def _replay_loop(replayer: Any, op: Any, list_bytes: dict[Any, int]) -> tuple[int, list[int]]:
    """A ``While`` loop: one pass of its body; its ``TensorList`` accumulators grow by trips x a pass's growth."""
    body = replayer.lookup(op.get_attr("body").name)
    inputs = list(op.inputs)
    trips = trip_count(replayer, op)
    replayer.trips[op.name] = trips
    incoming = {i: list_bytes.get(t.ref(), 0) for i, t in enumerate(inputs) if t.dtype.name == "variant"}
    child = replayer.child()
    child.trips = replayer.trips
    result, out_lists = child.replay(body, inputs_category=None, input_list_bytes=incoming, track_phases=False)
    # growth of each list per iteration = its size after one body pass - before
    body_outputs = list(body.outputs)
    for i, out in enumerate(op.outputs):
        if out.dtype.name != "variant":
            continue
        before = incoming.get(i, 0)
        after = out_lists.get(body_outputs[i].ref(), before) if i < len(body_outputs) else before
        growth = after - before  # pushes grow a list, pops (gradient loops) shrink it
        list_bytes[out.ref()] = max(before + growth * trips, 0)
        element = child.list_elements.get(body_outputs[i].ref(), 0) if i < len(body_outputs) else 0
        if element or growth > 0:
            replayer.list_elements[out.ref()] = element or growth
    if replayer.unlucky:
        # the executor runs up to ``parallel_iterations`` iterations of the body at once
        try:
            in_flight = max(1, min(int(op.get_attr("parallel_iterations")), trips))
        except (ValueError, TypeError):  # pragma: no cover - every While op has the attribute
            in_flight = 1
        return result.peak * in_flight, body_pieces(result, in_flight)
    return result.peak, body_pieces(result)


def trip_count(replayer: Any, op: Any) -> int:
    """How often a ``While`` loop runs, read from the graph (else ``parallel_iterations``, noted as approximated)."""
    # Keras' RNN loops: the unstacked input list holds one element per step
    candidates = []
    for t in op.inputs:
        producer = t.op
        if producer.type == "TensorListFromTensor":
            dim = producer.inputs[0].shape.as_list()[0] if producer.inputs[0].shape.rank else None
            if dim is not None:
                candidates.append(int(dim))
        if producer.type == "TensorListReserve":
            count = const_value(producer.inputs[1])
            if count is not None and count > 0:
                candidates.append(int(count))
        if producer.type in WHILE_OPS and producer.name in replayer.trips:
            candidates.append(replayer.trips[producer.name])  # a gradient loop runs as often as its forward loop
    if candidates:
        return max(candidates)
    try:
        maximum = op.get_attr("parallel_iterations")  # not a trip count; last resort
    except Exception:  # noqa: BLE001
        maximum = 1
    replayer.approx["While trip count"] += 1
    return max(int(maximum), 1)
