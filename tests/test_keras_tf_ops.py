"""The TensorFlow replay's registry of op handlers (nnmem_callbacks.estimators.keras.tensorflow.ops) on small graphs."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from nnmem_callbacks.estimators.keras.tensorflow import ops as tf_ops  # noqa: E402
from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup  # noqa: E402

pytestmark = pytest.mark.keras
MIB = 1 << 20


def test_every_op_type_has_one_handler_and_unknown_ops_get_the_kernel_default():
    with pytest.raises(ValueError, match="'Relu' already has the handler 'elementwise_op'"):
        tf_ops.handler("Relu")(lambda run, op, category: tf_ops.NO_TRANSIENT)
    assert tf_ops.handler_for("Conv2DBackpropFilter") is tf_ops.DEFAULT_HANDLER
    assert tf_ops.handler_for("Conv2DBackpropFilter").name == "kernel_op"
    expected = {
        "Relu": "elementwise_op",
        "Softmax": "elementwise_op",
        "ReadVariableOp": "read_variable",
        "AssignSubVariableOp": "assign_variable",
        "ResourceApplyAdam": "assign_variable",
        "Identity": "alias_op",
        "Reshape": "alias_op",
        "Const": "no_alloc_op",
        "NoOp": "no_alloc_op",
        "Placeholder": "placeholder",
        "While": "control_flow_op",
        "StatefulPartitionedCall": "control_flow_op",
        "TensorListPushBack": "list_update",
        "Transpose": "transpose",
        "Cast": "cast",
    }
    assert {op: tf_ops.handler_for(op).name for op in expected} == expected
    assert [h.name for h in tf_ops.HANDLERS.values() if not h.in_schedule] == ["placeholder"]


def _replay(function, *specs, **kwargs):
    graph = function.get_concrete_function(*specs).graph
    replayer = GraphReplayer(function_lookup(graph), 1, **kwargs)
    result, _ = replayer.replay(graph, track_phases=False)
    return result


def test_elementwise_ops_write_into_a_dying_input_and_kernels_do_not():
    spec = tf.TensorSpec((256, 1024))  # 1 MiB

    @tf.function(autograph=False)
    def chain(x):
        return tf.nn.relu(tf.exp(x * 2.0))  # each op's input dies with it: one buffer passed along

    @tf.function(autograph=False)
    def kept(x):
        y = x * 2.0
        return tf.exp(y) + y  # y stays alive past exp: exp needs a buffer of its own

    # the batch (1 MiB, the caller's) + one buffer forwarded through the chain
    assert _replay(chain, spec).peak == 2 * MIB
    assert _replay(kept, spec).peak == 3 * MIB


def test_identity_transpose_aliases_and_a_real_transpose_allocates():
    spec = tf.TensorSpec((512, 512))  # 1 MiB

    @tf.function(autograph=False)
    def same(x):
        return tf.transpose(x, [0, 1])

    @tf.function(autograph=False)
    def swapped(x):
        return tf.transpose(x, [1, 0])

    assert _replay(same, spec).peak == 1 * MIB  # the output is the batch's own buffer
    assert _replay(swapped, spec).peak == 2 * MIB  # the batch + its transposed copy


def test_measured_scratch_replaces_the_workspace_rule():
    spec = tf.TensorSpec((256, 1024))

    @tf.function(autograph=False)
    def matmul(x):
        return tf.matmul(x, x, transpose_b=True)

    graph = matmul.get_concrete_function(spec).graph
    name = next(op.name for op in graph.get_operations() if op.type == "MatMul")
    plain = GraphReplayer(function_lookup(graph), 1).replay(graph, track_phases=False)[0]
    probed = GraphReplayer(function_lookup(graph), 1, scratch={name: 3 * MIB}).replay(graph, track_phases=False)[0]
    assert probed.peak == plain.peak + 3 * MIB


def test_transposes_that_undo_each_other_are_removed_as_grappler_removes_them():
    spec = tf.TensorSpec((64, 64, 64))  # 1 MiB

    @tf.function(autograph=False)
    def undone(x):
        return tf.exp(tf.transpose(tf.transpose(x, [1, 0, 2]), [1, 0, 2]))

    @tf.function(autograph=False)
    def not_undone(x):
        return tf.exp(tf.transpose(tf.transpose(x, [1, 0, 2]), [0, 2, 1]))

    # the batch + exp's output: neither transpose runs
    assert _replay(undone, spec).peak == 2 * MIB
    # the batch + the first transpose + the second (exp then writes into the second, which dies with it)
    assert _replay(not_undone, spec).peak == 3 * MIB


def test_the_gradient_of_undone_transposes_is_undone_too():
    from nnmem_callbacks.estimators.keras.tensorflow.schedule import inverse_transposes

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.exp(tf.transpose(tf.transpose(x, [1, 2, 0]), [2, 0, 1])))
        return tape.gradient(loss, x)

    graph = step.get_concrete_function(tf.TensorSpec((8, 4, 2))).graph
    bypass = inverse_transposes(graph.get_operations(), {t.ref() for t in graph.outputs})
    # the forward pair and the gradient's pair (each transposes by InvertPermutation of a constant)
    assert len(bypass) == 2
    kinds = {ref.deref().op.type for ref in bypass}
    assert kinds == {"Transpose"}
    # one pair is the gradient's: transposes whose permutation is InvertPermutation of a constant
    assert sum(ref.deref().op.inputs[1].op.type == "InvertPermutation" for ref in bypass) == 1
