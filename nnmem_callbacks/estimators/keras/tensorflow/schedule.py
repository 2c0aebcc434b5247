"""The order the TensorFlow graph replay runs ops in: phases, Grappler's regrouping, ready-op waves.

:func:`_phases` splits the traced step into forward, backward and optimizer;
:func:`_schedule` orders the ops as the replay runs them (creation order, with
the optimizer's ops, and ops Grappler regrouped with :func:`minimize_broadcasts`,
run as soon as they are ready, in *waves* as wide as the inter-op thread pool);
:func:`sibling_waves` runs kernels that become ready together (a convolution's
two gradients) in one wave; :func:`wave_holds` says which ops keep their inputs
until their wave is done. :func:`inverse_transposes` replays Grappler's removal
of transposes that undo each other, and :func:`pruned` drops what TensorFlow
never runs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from nnmem_callbacks.estimators.keras.tensorflow.trace import constant_array, tensor_input_name

__all__ = [
    "EAGER_PHASES",
    "inverse_transposes",
    "minimize_broadcasts",
    "op_phases",
    "pruned",
    "read_through",
    "schedule_ops",
    "sibling_waves",
    "SIBLING_WINDOW",
    "TRANSPOSE_OPS",
    "wave_holds",
]

#: Phases whose ops the replay runs as soon as their inputs exist (the others run in creation order).
EAGER_PHASES = ("optimizer",)


def _phase_of(op_name: str, state: dict[str, Any]) -> str:
    lowered = op_name.lower()
    if "gradient_tape/" in lowered or lowered.startswith("gradients/"):
        state["seen_backward"] = True
        return "backward"
    if state.get("seen_backward"):
        return "optimizer"
    return "forward"


def op_phases(ops: list) -> dict[str, str]:
    """Phase of each op: forward, backward (up to the last op of the gradient tape), optimizer.

    Ops that a custom gradient creates while the tape differentiates (``tf.nn.silu``'s
    ``Square``, ``zeros_like``...) carry no ``gradient_tape/`` prefix; they belong to the
    backward pass all the same, so the backward ends at the last tape op, not the first.
    """
    state: dict[str, Any] = {}
    phases = {op.name: _phase_of(op.name, state) for op in ops}
    last = max((i for i, op in enumerate(ops) if phases[op.name] == "backward"), default=-1)
    for op in ops[: last + 1]:
        if phases[op.name] == "optimizer":
            phases[op.name] = "backward"
    return phases


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


def _all_ones_or_zeros(tensor: Any) -> bool:
    value = constant_array(tensor)
    return value is not None and (bool((value == 1).all()) or bool((value == 0).all()))


#: Transposes whose consecutive pairs Grappler cancels (``ArithmeticOptimizer/RemoveIdentityTranspose``).
TRANSPOSE_OPS = frozenset({"Transpose", "ConjugateTranspose"})


def _permutation(tensor: Any) -> tuple[int, ...] | None:
    """A transpose's permutation when the graph fixes it, else ``None``.

    A constant, or the ``InvertPermutation`` of one: the gradient of a transpose
    transposes by the inverse permutation, which Grappler's constant folding
    turns into a constant before the arithmetic stages run.
    """
    value = constant_array(tensor)
    if value is not None:
        return tuple(int(v) for v in value.reshape(-1))
    if tensor.op.type == "InvertPermutation" and tensor.op.inputs:
        inner = _permutation(tensor.op.inputs[0])
        if inner is not None and sorted(inner) == list(range(len(inner))):
            inverse = [0] * len(inner)
            for position, axis in enumerate(inner):
                inverse[axis] = position
            return tuple(inverse)
    return None


def inverse_transposes(ops: list, graph_outputs: set) -> dict[Any, Any]:
    """Replays Grappler's ``ArithmeticOptimizer/RemoveIdentityTranspose`` stage: transposes that undo each other.

    A transpose whose input is a transpose (directly or through ``Identity``
    ops that nothing else reads) by the inverse permutation is removed: its
    consumers read the first transpose's input, and the first one runs only
    if something else reads it. Keras' recurrent layers run time-major, so a
    layer returning sequences transposes its output to batch-major and the
    next recurrent layer transposes it straight back; the same pair, inverted,
    sits in the gradient. The profiler's allocator events of two stacked
    ``LSTM`` layers (``python -m benchmarks.tf_memory_events stacked_lstm``)
    show neither transpose: the stacked sequence is the only buffer of its
    size. The stage as in ``tensorflow/core/grappler/optimizers/arithmetic_optimizer.cc``:
    both permutations must be constants (after constant folding) and the
    second transpose must not produce a graph output (Grappler preserves those).

    Args:
        ops: The graph's ops.
        graph_outputs: Refs of the graph's outputs.

    Returns:
        For each removed transpose's output (by ref), the tensor its consumers read instead.

    Example:
        >>> import tensorflow as tf
        >>> @tf.function
        ... def f(x):
        ...     y = tf.transpose(tf.transpose(x, [1, 0, 2]), [1, 0, 2])
        ...     return y * 2.0
        >>> graph = f.get_concrete_function(tf.TensorSpec([4, 3, 2])).graph
        >>> bypass = inverse_transposes(graph.get_operations(), {t.ref() for t in graph.outputs})
        >>> [(ref.deref().op.name, t.op.name) for ref, t in bypass.items()]
        [('transpose_1', 'x')]
    """
    preserved = {ref.deref().op.name for ref in graph_outputs}
    bypass: dict[Any, Any] = {}
    for op in ops:
        if op.type not in TRANSPOSE_OPS or op.name in preserved or len(op.inputs) != 2:
            continue
        first = op.inputs[0]
        while (
            first.op.type in ("Identity", "Snapshot") and len(first.consumers()) == 1 and first.op.name not in preserved
        ):
            first = first.op.inputs[0]
        if first.op.type != op.type or len(first.op.inputs) != 2:
            continue
        second_perm, first_perm = _permutation(op.inputs[1]), _permutation(first.op.inputs[1])
        if second_perm is None or first_perm is None or len(second_perm) != len(first_perm):
            continue
        if all(second_perm[first_perm[i]] == i for i in range(len(first_perm))):
            bypass[op.outputs[0].ref()] = first.op.inputs[0]
    return bypass


def read_through(tensor: Any, bypass: dict[Any, Any] | None) -> Any:
    """The tensor a read of ``tensor`` really reads, when ``bypass`` maps removed ops' outputs to their replacements."""
    while bypass and tensor.ref() in bypass:
        tensor = bypass[tensor.ref()]
    return tensor


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
    for inputs in inputs_of.values():
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
        return sorted(inputs_of[op.name], key=tensor_input_name)

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


def schedule_ops(
    ops: list,
    phases: dict[str, str],
    graph_outputs: set | None = None,
    elements: Callable[[Any], int] | None = None,
    width: int = 1,
    eager_phases: tuple[str, ...] = EAGER_PHASES,
    bypass: dict[Any, Any] | None = None,
    newest_first: bool = False,
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

    ``bypass`` maps outputs of ops Grappler removed to the tensor their consumers
    read instead (:func:`inverse_transposes`).

    Among the ready ops the one created first runs first, or with
    ``newest_first`` the one that became ready last: TensorFlow's inter-op pool
    is Eigen's work-stealing pool, where a task scheduled from a worker thread
    goes to the front of that thread's own queue and is taken from the front,
    the newest first (other threads steal from the back). The upper bound
    replays that order too (:data:`~nnmem_callbacks.estimators.keras.tensorflow.graph.UNLUCKY_RUNS`).

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
        tensor = read_through(tensor, bypass)  # a transpose Grappler removed (inverse_transposes)
        while tensor.op.type == "IdentityN" and tensor.op.name in by_name:
            tensor = read_through(tensor.op.inputs[tensor.value_index], bypass)
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
    readied = [0]  # ops that became ready so far: the newest-first priority counts down

    def priority(name: str) -> int:
        if newest_first:
            readied[0] += 1
            return -readied[0]
        return position[name]

    waves: dict[str, int] = {}

    def emit(op: Any) -> None:
        import heapq

        heap = [(priority(op.name), op.name)]
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
                        heapq.heappush(heap, (priority(consumer), consumer))

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


#: How many ops later in the order a sibling kernel may stand and still join a wave (ops the executor runs as soon
#: as they are ready, such as the optimizer's, may come between two gradients of one convolution).
SIBLING_WINDOW = 8


def pruned(ops: list, graph_outputs: set, control_outputs: tuple = (), bypass: dict[Any, Any] | None = None) -> list:
    """``ops`` without those TensorFlow prunes when it instantiates the function: ops nothing needed reads.

    TensorFlow keeps an op only if a needed op reads it (``PruneFunctionBody``):
    the needed ones are the producers of the outputs, the control outputs, and
    stateful ops (variable updates, random ops; not the arguments). The rest
    never runs: a gradient nothing asks for, such as ``Conv2DBackpropInput`` of
    a first convolution whose input is the data, with its work buffer. The
    arguments (``Placeholder``) stay, as the caller's tensors. Reads of a
    tensor in ``bypass`` (an op Grappler removed) are reads of its replacement.

    Example:
        >>> from types import SimpleNamespace as Op
        >>> def op(name, kind, *reads, stateful=False):
        ...     return Op(name=name, type=kind, inputs=[Op(op=r) for r in reads], control_inputs=[],
        ...               op_def=Op(is_stateful=stateful), outputs=[])
        >>> x = op("x", "Placeholder")
        >>> used, unused = op("used", "Relu", x), op("unused", "Conv2DBackpropInput", x)
        >>> out = op("out", "Identity", used)
        >>> out.outputs = ["out:0"]
        >>> [o.name for o in pruned([x, used, unused, out], {"out:0"})]
        ['x', 'used', 'out']
    """
    by_name = {op.name: op for op in ops}
    if all(hasattr(ref, "deref") for ref in graph_outputs):  # TensorFlow's references: their ops, read directly
        output_ops = {ref.deref().op.name for ref in graph_outputs}
    else:
        output_ops = {op.name for op in ops if any(t in graph_outputs for t in _refs(op.outputs))}

    def stateful(op: Any) -> bool:
        try:
            return bool(op.op_def.is_stateful)
        except (AttributeError, ValueError):  # an op without a registered definition: keep it
            return True

    needed = {
        op.name for op in ops
        if op.name in output_ops or op in control_outputs or (op.type != "Placeholder" and stateful(op))
    }  # fmt: skip
    stack = list(needed)
    while stack:
        op = by_name.get(stack.pop())
        if op is None:
            continue
        for name in [read_through(t, bypass).op.name for t in op.inputs] + [c.name for c in op.control_inputs]:
            if name not in needed:
                needed.add(name)
                stack.append(name)
    return [op for op in ops if op.name in needed or op.type == "Placeholder"]


def _refs(tensors: Any) -> list:
    return [t.ref() if hasattr(t, "ref") else t for t in tensors]


def sibling_waves(
    order: list, inputs_of: dict[str, list], waves: dict[str, int], width: int, kernels: frozenset[str]
) -> tuple[list, dict[str, int]]:
    """``order`` and ``waves`` with waves of ``kernels`` ops that become ready at the same moment.

    In creation order one op runs at a time, but TensorFlow's executor runs
    every op that is ready: when the op all of them wait for finishes, it keeps
    one on its thread and hands the others to the inter-op pool. A
    convolution's two gradients (``Conv2DBackpropInput`` and
    ``Conv2DBackpropFilter``, both waiting for the output's gradient) therefore
    run at the same time, and so do their scratch buffers: the profiler's
    ``MemoryAllocation`` events of EfficientNet-B0 and MobileNetV3-Small with
    oneDNN off show the two ~21-24 MiB work buffers of one convolution's
    gradients allocated back to back, at the step's peak.

    Only ops of ``kernels`` (the kernels known to take scratch) are grouped, up
    to ``width`` (the inter-op threads) at a time. An op ready at the same
    moment as an earlier one, at most :data:`SIBLING_WINDOW` places after it, is
    moved next to it (nothing it reads runs in between). Ops already in a wave
    keep it.

    Returns:
        The order (a new list) and the waves, as :func:`_schedule` gives them.

    Example:
        >>> from types import SimpleNamespace as Op
        >>> w, x, dy = Op(name="w", type="ReadVariableOp"), Op(name="x", type="Relu"), Op(name="dy", type="Mul")
        >>> gi, gf = Op(name="gi", type="Conv2DBackpropInput"), Op(name="gf", type="Conv2DBackpropFilter")
        >>> out = Op(name="out", type="Identity")  # reads gi; runs as soon as gi is done
        >>> def tensor(op): return Op(op=op)
        >>> inputs = {"w": [], "x": [], "dy": [], "gi": [tensor(w), tensor(dy)], "gf": [tensor(x), tensor(dy)],
        ...           "out": [tensor(gi)]}
        >>> kernels = frozenset({"Conv2DBackpropInput", "Conv2DBackpropFilter"})
        >>> order, waves = sibling_waves([w, x, dy, gi, out, gf], inputs, {}, 2, kernels)
        >>> [op.name for op in order], waves
        (['w', 'x', 'dy', 'gi', 'gf', 'out'], {'gi': 3, 'gf': 3})
        >>> sibling_waves([w, x, dy, gi, out, gf], inputs, {}, 1, kernels)[1]  # one inter-op thread
        {}
    """
    order, waves = list(order), dict(waves)
    if width < 2:
        return order, waves
    position = {op.name: i for i, op in enumerate(order)}

    def producers(op: Any) -> set[str]:
        return {t.op.name for t in inputs_of.get(op.name, ())} | {c.name for c in getattr(op, "control_inputs", ())}

    # the op each one waits for last (by its place in the order before any move)
    ready_after = {op.name: max(producers(op), key=lambda name: position.get(name, -1), default=None) for op in order}
    i = 0
    while i < len(order):
        op = order[i]
        if op.type not in kernels or op.name in waves:
            i += 1
            continue
        group = [op]
        j = i + 1
        while j < len(order) and j <= i + SIBLING_WINDOW and len(group) < width:
            candidate = order[j]
            if candidate.type in kernels and candidate.name not in waves:
                if ready_after[candidate.name] != ready_after[op.name]:
                    break  # the next kernel waits for something else: the pair is over
                order.insert(i + len(group), order.pop(j))
                group.append(candidate)
            j += 1
        if len(group) > 1:
            for member in group:
                waves[member.name] = i
        i += len(group)
    return order, waves


def wave_holds(ops: list, waves: dict[str, int]) -> list[bool]:
    """For each op of ``ops``: whether its successor runs in the same wave (it then keeps its inputs until the wave is done)."""
    return [
        i + 1 < len(ops) and ops[i].name in waves and waves.get(ops[i + 1].name) == waves[ops[i].name]
        for i in range(len(ops))
    ]
