"""TensorFlow backend: simulate tensor lifetimes over the traced graph of ``model.train_step``.

How it works:

1. ``tf.function(model.train_step).get_concrete_function(specs)`` traces the
   real Keras train step (forward, loss, ``GradientTape`` gradients, the
   optimizer's update) on :class:`tf.TensorSpec` inputs whose batch dimension
   is ``None``. Tracing does not execute anything: no variable changes and the
   optimizer's ``iterations`` stays where it was. If the optimizer was not yet
   built, tracing builds it (creates its slot variables) exactly as Keras does
   at the start of the first ``fit``; that is the only side effect.
2. The ops of the graph are replayed in creation order (a topological order:
   forward, gradient, optimizer update). An op's outputs are allocated when it
   runs, a tensor is freed when its last consumer has run. The runtime's
   aliasing rules are followed: ``ReadVariableOp`` on CPU returns the
   variable's own buffer, ``Identity``/``Reshape``/``ExpandDims``/``Squeeze``
   alias their input, element-wise ops reuse an input buffer that dies with
   them (TensorFlow's ``forward_input_or_allocate_output``), and
   ``Assign*VariableOp`` update in place.
3. Called functions (``PartitionedCall``), ``If`` branches and ``While`` bodies
   are simulated recursively; their transient peak is added at the call. A
   ``While`` loop's ``TensorList`` accumulators (what the gradient of an RNN
   keeps per time step) are sized as iterations x element.
4. Every tensor size is a line in the batch size ``n`` (the ``None`` dimension
   is ``n``), so a single trace gives the peak at any batch size: the replay is
   run at the requested batch and at twice it.

TensorFlow's CPU allocator statistics (``get_memory_info('CPU:0')``) count only
allocations of at least 256 KiB (rounded up to 256 bytes); smaller tensors come
from a pool it does not report. The estimate's ``peak_bytes`` counts every
tensor (the package's definition of the peak); the figure comparable to
``get_memory_info('CPU:0')['peak']`` is in ``extra["tf_allocator_peak_bytes"]``.

Known limitations (see ``benchmarks/results/keras_tensorflow_cpu.md``):
    * The executor may run independent ops in another order than creation
      order (inter-op parallelism); Grappler's rewrites (fusions, constant
      folding, layout changes) are not replayed. Shape-only consumers
      (``Shape``, ``Size``...) are assumed to run at once and not to keep their
      input alive.
    * Kernel scratch memory (oneDNN reorders and workspaces, im2col buffers) is
      not modelled (:data:`WORKSPACE_RULES` is empty): convolution models are
      underestimated by up to ~10-20 % against the allocator.
    * RNN loops: the allocator sees far more than the replay for the first
      steps of an LSTM (-39 % on the benchmark LSTM; -20 % at steps 3-4).
    * With ``jit_compile=True`` (Keras' default on GPUs) XLA owns the buffers;
      the replay then approximates XLA's buffer assignment (a note says so).
    * The first train step keeps copies of some variable buffers alive
      (copy-on-write of buffers still shared with their initial values); that
      growth is not predicted.
    * ``While`` loops whose trip count cannot be read from the graph are
      assumed to run ``parallel_iterations`` times (reported in ``notes``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any, Callable

from nnmem_callbacks.estimate import Category

#: TensorFlow's CPU allocator reports only allocations at least this large.
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

#: Kernel-internal scratch memory per op type: ``rule(op, size_of) -> bytes`` alive while the op runs.
#: Empty: no rule has been validated against the allocator yet (an Einsum operand-copy rule was tried and
#: changed nothing on the benchmark); oneDNN reorders and workspaces are the known gap.
WORKSPACE_RULES: dict[str, Callable[[Any, Callable[[Any], int]], int]] = {}

#: Ops that read only the shape of their input: they do not keep it alive.
METADATA_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})

#: TensorList ops that return their input list, changed in place.
LIST_UPDATE_OPS = frozenset({"TensorListPushBack", "TensorListPopBack", "TensorListSetItem"})

CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
IF_OPS = frozenset({"If", "StatelessIf"})
WHILE_OPS = frozenset({"While", "StatelessWhile"})
CASE_OPS = frozenset({"Case", "StatelessCase"})


def tf_allocator_bytes(num_bytes: int) -> int:
    """What TensorFlow's CPU allocator statistics count for one allocation.

    Example:
        >>> tf_allocator_bytes(1000), tf_allocator_bytes(400_000)
        (0, 400128)
    """
    if num_bytes < TF_CPU_COUNTED_MIN_BYTES:
        return 0
    return int(math.ceil(num_bytes / TF_CPU_ROUNDING) * TF_CPU_ROUNDING)


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


class GraphReplayer:
    """Replays the ops of a TensorFlow ``FuncGraph`` with reference-counted buffers.

    Args:
        lookup: Finds a function graph by name (for calls, branches, loop bodies).
        batch_size: The batch size substituted for unknown dimensions.
    """

    def __init__(self, lookup: Callable[[str], Any], batch_size: int) -> None:
        self.lookup = lookup
        self.n = batch_size
        self.trips: dict[str, int] = {}
        self.unknown = Counter()
        self.approx = Counter()

    # -- sizes ---------------------------------------------------------------
    def size_of(self, tensor: Any, list_bytes: dict[Any, int] | None = None) -> int:
        if list_bytes is not None and tensor.dtype.name == "variant":
            return int(list_bytes.get(tensor.ref(), 0))
        size = _shape_size(tensor.shape, _dtype_size(tensor.dtype))
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
        phase_state: dict[str, Any] = {}
        created = graph.get_operations()
        phases_created = {op.name: (_phase_of(op.name, phase_state) if track_phases else "body") for op in created}
        ops, inputs_of = _schedule(created, phases_created)
        result.ops = len(ops)
        graph_outputs = {t.ref() for t in graph.outputs}
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

        def allocate(tensor: Any, nbytes: int, category: str, owned: bool = True) -> None:
            counted = tf_allocator_bytes(nbytes) if owned else 0
            if tensor.dtype.name == "variant":
                # a TensorList's elements are separate allocations, each below the allocator's
                # reporting threshold for the RNN step sizes seen in practice
                counted = 0
            buffer = Buffer(nbytes, counted, category, 1, owned)
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

        def release(tensor: Any) -> None:
            buffer = buffer_of.pop(tensor.ref(), None)
            if buffer is None:
                return
            buffer.refs -= 1
            if buffer.refs <= 0 and buffer.owned:
                live[buffer.category] -= buffer.nbytes
                live_counted[0] -= buffer.counted

        def record(phase: str, extra: int = 0, extra_counted: int = 0) -> None:
            total = sum(live.values()) + extra
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
        for op, phase in zip(ops, phases):
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
            if kind in NO_ALLOC_OPS or kind == "Const":
                for t in op.outputs:
                    allocate(t, 0, category, owned=False)
            elif kind in ALIAS_OPS and op.inputs:
                for i, t in enumerate(op.outputs):
                    source = op.inputs[i] if kind == "IdentityN" else op.inputs[0]
                    if kind == "ReadVariableOp" or not alias(t, source):
                        allocate(t, 0 if kind == "ReadVariableOp" else self.size_of(t), category, owned=kind != "ReadVariableOp")
                    if t.dtype.name == "variant":
                        list_bytes[t.ref()] = list_bytes.get(source.ref(), 0)
            elif kind == "Cast" and op.inputs and op.inputs[0].dtype == op.outputs[0].dtype:
                if not alias(op.outputs[0], op.inputs[0]):
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
                if rule is not None:
                    try:
                        transient = int(rule(op, self.size_of))
                    except Exception:  # noqa: BLE001 - a rule never breaks the replay
                        self.approx[f"workspace {kind}"] += 1
                    transient_counted = tf_allocator_bytes(transient)
                forwarded = set()
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
            record(phase, transient, transient_counted)
            # free what this op consumed last, and outputs nobody reads
            for t in inputs_of[op.name] if kind not in METADATA_OPS else ():
                key = t.ref()
                if key in remaining:
                    remaining[key] -= 1
                    if remaining[key] <= 0:
                        release(t)
            for t in op.outputs:
                if remaining.get(t.ref(), 0) <= 0:
                    release(t)
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
        result, out_lists = GraphReplayer(self.lookup, self.n).replay(
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
        replayer = GraphReplayer(self.lookup, self.n)
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


def _schedule(ops: list, phases: dict[str, str]) -> tuple[list, dict[str, list]]:
    """The order the replay runs ops in, and each op's data inputs.

    Creation order: forward, gradient, then the optimizer's updates in program
    order (TensorFlow runs stateful ops in program order, and the updates wait
    for the ``IdentityN`` that gathers every gradient). Running the update ops
    as soon as their gradient is ready was tried and overestimated the measured
    peaks (element-wise ops that do not read the variables got hoisted).
    """
    return list(ops), {op.name: list(op.inputs) for op in ops}


def _reads_variable(tensor: Any) -> bool:
    while tensor.op.type in ("Identity", "Cast") and tensor.op.inputs and (
        tensor.op.type == "Identity" or tensor.op.inputs[0].dtype == tensor.dtype
    ):
        tensor = tensor.op.inputs[0]
    return tensor.op.type == "ReadVariableOp"


def _const_value(tensor: Any) -> Any:
    from tensorflow.python.framework import tensor_util

    try:
        value = tensor_util.constant_value(tensor)
    except Exception:  # noqa: BLE001
        return None
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
def trace_train_step(model: Any, x_specs: Any, y_specs: Any) -> Any:
    """The concrete graph of ``model.train_step`` on ``(x, y)`` specs with a ``None`` batch dimension."""
    import tensorflow as tf

    from nnmem_callbacks.keras.common import tree_map

    def tensor_spec(spec: Any) -> Any:
        return tf.TensorSpec(spec.shape, tf.as_dtype(spec.dtype))

    data = (tree_map(tensor_spec, x_specs), tree_map(tensor_spec, y_specs))
    function = tf.function(model.train_step, autograph=False)
    return function.get_concrete_function(data)


def estimate_tensorflow(model: Any, batch_size: int, x_specs: Any, y_specs: Any, notes: list[str]) -> Any:
    """Estimates the TensorFlow train step by graph replay (see the module docstring)."""
    from nnmem_callbacks.estimate import MemoryEstimate, PhaseLine, upper_envelope
    from nnmem_callbacks.keras.common import accumulation_steps, precision_of, static_bytes, tree_leaves, unique

    import time

    started = time.perf_counter()
    optimizer = model.optimizer
    was_built = bool(getattr(optimizer, "built", False))
    iterations = int(optimizer.iterations.numpy()) if was_built else 0
    concrete = trace_train_step(model, x_specs, y_specs)
    if not was_built:
        notes.append("tracing built the optimizer (its slot variables), as Keras does at the first fit step")
    if was_built and int(optimizer.iterations.numpy()) != iterations:  # pragma: no cover - tracing never runs
        notes.append("warning: optimizer iterations changed during tracing")
    graph = concrete.graph
    lookup = function_lookup(graph)
    static = static_bytes(model, unique(optimizer.variables))
    counted_static = 0
    for variable in unique(model.variables) + unique(optimizer.variables):
        from nnmem_callbacks.keras.common import variable_bytes

        counted_static += tf_allocator_bytes(variable_bytes(variable))
    static_total = sum(static.values())
    results = {}
    for n in (batch_size, 2 * batch_size):
        replayer = GraphReplayer(lookup, n)
        results[n], _ = replayer.replay(graph)
    main = results[batch_size]
    double = results[2 * batch_size]
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
        extra={
            "backend": "tensorflow",
            "ops": main.ops,
            "tf_allocator_peak_bytes": int(counted_peak),
            "tf_allocator_static_bytes": int(counted_static),
            "tf_allocator_peak_bytes_2x": int(counted_static + double.peak_counted),
            "seconds": round(time.perf_counter() - started, 3),
            "inputs": len(tree_leaves(x_specs)) + len(tree_leaves(y_specs)),
        },
    )
