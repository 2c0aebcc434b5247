"""Keras on TensorFlow: the graph-replay estimator against the allocator, and the callback.

Runs in-process when Keras' backend is TensorFlow (the default); skipped otherwise
(the JAX and torch backends are tested in subprocesses, tests/test_keras_backends.py).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

if keras.backend.backend() != "tensorflow":  # pragma: no cover - another test imported keras first
    pytest.skip("Keras backend is not tensorflow in this process", allow_module_level=True)

import tensorflow as tf  # noqa: E402

from nnmem_callbacks import MemoryBudgetExceeded  # noqa: E402
from nnmem_callbacks.allocators.tensorflow_cpu import tf_allocator_bytes  # noqa: E402
from nnmem_callbacks.estimators.keras.tensorflow import ops as tf_ops  # noqa: E402
from nnmem_callbacks.keras import KerasEstimationError, MemoryBudgetCallback, estimate_training, fit_plan  # noqa: E402

pytestmark = pytest.mark.keras
L = keras.layers


def mlp(hidden: int = 100) -> keras.Model:
    model = keras.Sequential(
        [keras.Input((1000,))] + [L.Dense(hidden, activation="relu") for _ in range(4)] + [L.Dense(10)]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def data(n: int = 512, features: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((n, features), dtype=np.float32), rng.integers(0, 10, n).astype("int32")


def needs_allocator_statistics() -> None:
    from nnmem_callbacks.monitoring.meters import TensorFlowMeter

    reason = TensorFlowMeter.unavailable("CPU:0")
    if reason is not None:
        pytest.skip(f"TensorFlow was started without CPU allocator statistics in this process ({reason})")


def measured_allocator_peak(model: keras.Model, x: np.ndarray, y: np.ndarray, estimate) -> int:
    """TF CPU allocator peak over two train_on_batch steps + the counted state (the benchmark's truth)."""
    needs_allocator_statistics()
    info = tf.config.experimental.get_memory_info
    xt, yt = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))
    state = estimate.extra["tf_allocator_static_bytes"] + tf_allocator_bytes(x.nbytes) + tf_allocator_bytes(y.nbytes)
    tf.config.experimental.reset_memory_stats("CPU:0")
    current = info("CPU:0")["current"]
    model.train_on_batch(xt, yt)
    model.train_on_batch(xt, yt)
    return int(state + info("CPU:0")["peak"] - current)


# -- estimator -------------------------------------------------------------------
def test_mlp_estimate_matches_the_allocator():
    model = mlp(1000)
    x, y = data(128)
    # the replay against the allocator: the step check, which would measure the same steps, is tested on its own
    est = estimate_training(model, batch_size=128, check_steps=False)
    assert est.method == "tf-graph"
    assert est.batch_size == 128
    assert sum(est.breakdown.values()) == est.peak_bytes
    assert est.breakdown["optimizer_state"] >= 2 * est.breakdown["parameters"]
    measured = measured_allocator_peak(model, x, y, est)
    predicted = est.extra["tf_allocator_peak_bytes"]
    assert abs(predicted - measured) / measured < 0.15, (predicted, measured)


def test_bfc_simulator_charges_whole_chunks():
    from nnmem_callbacks.allocators.bfc import BFCSimulator

    bfc = BFCSimulator()
    big = bfc.alloc(1_605_632)  # 1.53 MiB in the first 2 MiB region: < 2x the request, no split
    assert bfc.in_use == 2 << 20
    small = bfc.alloc(1 << 20)  # a fresh 4 MiB region, split (4 >= 2 x 1)
    assert bfc.in_use == (2 << 20) + (1 << 20)
    bfc.free(big)
    again = bfc.alloc(600 * 1024)  # best fit: the freed 2 MiB chunk is split (2 MiB >= 2 x 600 KiB)
    assert bfc.chunks[again][1] == 600 * 1024
    bfc.free(small), bfc.free(again)
    assert bfc.in_use == 0 and bfc.peak == (2 << 20) + (1 << 20)


def test_einsum_workspace_rule_follows_the_kernel_layout():
    from nnmem_callbacks.estimators.keras.tensorflow.ops import WORKSPACE_RULES

    specs = {
        "aecd,abcd->acbe": ((16, 64, 4, 32), (16, 64, 4, 32)),  # both operands transposed + output transposed
        "acbe,aecd->abcd": ((16, 4, 64, 64), (16, 64, 4, 32)),  # one operand + output
        "abc,cde->abde": ((16, 64, 128), (128, 4, 32)),  # no copy (adjoint flag)
    }
    graph = tf.Graph()
    with graph.as_default():
        ops = {eq: tf.einsum(eq, tf.zeros(a), tf.zeros(b)).op for eq, (a, b) in specs.items()}

    def size_of(tensor):
        return int(np.prod(tensor.shape.as_list())) * 4

    rule = WORKSPACE_RULES["Einsum"]
    mib = 1 << 20
    # measured peaks of one eager op (TF 2.21): 3.0, 1.5 and 0.5 MiB = output + this workspace
    assert rule(ops["aecd,abcd->acbe"], size_of) == 2 * mib
    assert rule(ops["acbe,aecd->abcd"], size_of) == 1 * mib
    assert rule(ops["abc,cde->abde"], size_of) == 0


def _grappler_regrouped_muls(function, *args) -> dict[str, list[str]]:
    """Runs ``function`` once and reads Grappler's regrouped ``Mul`` ops from the executed graph."""
    from tensorflow.python.eager import context

    context.context().enable_run_metadata()
    try:
        function(*args)
        metadata = context.context().export_run_metadata()
    finally:
        context.context().disable_run_metadata()
    graph = max(metadata.function_graphs, key=lambda g: len(g.pre_optimization_graph.node))
    before = {n.name: n for n in graph.pre_optimization_graph.node}
    regrouped = {}
    for node in graph.post_optimization_graph.node:
        old = before.get(node.name)
        if node.op == "Mul" and old is not None and sorted(node.input) != sorted(old.input):
            regrouped[node.name] = sorted(i for i in node.input if not i.startswith("^"))
    return regrouped


@pytest.mark.parametrize("leaves", [("m", "m", "s"), ("s", "m", "m", "s"), ("m", "v", "s", "m")])
def test_minimize_broadcasts_regroups_like_grappler(leaves):
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.schedule import op_phases, schedule_ops
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup, tensor_input_name

    shapes = {"m": (16, 64, 64), "v": (64,), "s": ()}
    specs = [tf.TensorSpec(shapes[kind]) for kind in leaves]

    @tf.function(autograph=False)
    def product(*values):
        out = tf.nn.softmax(values[0]) if values[0].shape.rank else values[0] * 1.5
        for value in values[1:]:
            out = out * tf.exp(value)  # a left-deep chain of Mul, each with one consumer
        return tf.reduce_sum(out)

    graph = product.get_concrete_function(*specs).graph
    ops = graph.get_operations()
    replayer = GraphReplayer(function_lookup(graph), 16)
    _, inputs_of, _, _ = schedule_ops(ops, op_phases(ops), {t.ref() for t in graph.outputs}, replayer.elements)
    ours = {
        op.name: sorted(tensor_input_name(t) for t in inputs_of[op.name])
        for op in ops
        if op.type == "Mul" and sorted(t.name for t in inputs_of[op.name]) != sorted(t.name for t in op.inputs)
    }
    values = [tf.random.uniform(shapes[kind]) for kind in leaves]
    real = _grappler_regrouped_muls(product, *values)
    assert ours == real
    if len({shapes[kind] for kind in leaves}) > 1 and len(leaves) > 2:
        assert real, "Grappler regrouped nothing: the case no longer exercises the stage"


def test_minimize_broadcasts_moves_a_product_into_the_forward_pass():
    """``(g * softmax) * c`` in a gradient becomes ``(c * softmax) * g``, alive from the forward on."""
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup

    x = tf.Variable(tf.random.uniform((16, 4, 64, 64)))
    weight = tf.Variable(tf.random.uniform((16, 4, 64, 64)))

    @tf.function(autograph=False)
    def step():
        with tf.GradientTape() as tape:
            scores = tf.nn.softmax(x * 0.125)
            loss = tf.reduce_sum(scores * weight)
        return tape.gradient(loss, x)

    graph = step.get_concrete_function().graph
    replayer = GraphReplayer(function_lookup(graph), 1)
    replayer.replay(graph)
    real = _grappler_regrouped_muls(step)
    assert real, "Grappler did not regroup the softmax gradient"
    ordered = replayer.order
    forward_only = [
        name
        for name, inputs in real.items()
        if name.startswith("gradient_tape/") and not any(i.startswith("gradient_tape/") for i in inputs)
    ]
    assert forward_only, f"no regrouped product of forward values in {real}"
    for name in forward_only:
        # the executor runs it as soon as the softmax exists; so does the replay
        assert ordered.index(name) == ordered.index("Softmax") + 1


def test_estimate_changes_no_values_and_scales_with_the_batch():
    model = mlp()
    before = [v.numpy().copy() for v in model.trainable_variables]
    est = estimate_training(model, batch_size=64, check_steps=False)  # the check's copies: test_keras_tf_step_check
    assert int(model.optimizer.iterations.numpy()) == 0
    for old, variable in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(old, variable.numpy())
    assert est.peak_bytes_at(128) > est.peak_bytes_at(64) == est.peak_bytes
    assert est.per_sample_bytes > 0


def test_functional_cnn_lstm_and_layer_rules():
    inputs = keras.Input((16, 16, 3))
    hidden = L.Conv2D(8, 3, activation="relu")(inputs)
    hidden = L.BatchNormalization()(hidden)
    outputs = L.Dense(4)(L.GlobalAveragePooling2D()(hidden))
    cnn = keras.Model(inputs, outputs)
    cnn.compile(optimizer="sgd", loss="mse")
    est = estimate_training(cnn, batch_size=8, check_steps=False)  # what the replay tracks
    # the activations are tracked; at the step's peak they may already be freed (without oneDNN the peak is the
    # first convolution's 16 MiB backward-filter scratch, after the last activation died), so ask the forward pass
    assert est.method == "tf-graph" and est.phase_breakdowns["step/forward"]["activations"] > 0
    rules = estimate_training(cnn, batch_size=8, method="layer-rules")
    assert rules.method == "layer-rules" and rules.peak_bytes > 0

    lstm = keras.Sequential([keras.Input((20,), dtype="int32"), L.Embedding(100, 8), L.LSTM(16), L.Dense(3)])
    lstm.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    est = estimate_training(lstm, batch_size=16, check_steps=False)
    assert est.method == "tf-graph"
    # per-step gate activations kept for backward are counted (TensorList accumulators)
    assert est.breakdown["activations"] > 16 * 20 * 16 * 4 * 4


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.first = L.Dense(32, activation="relu")
        self.second = L.Dense(5)

    def call(self, x):
        return self.second(self.first(x))


def test_subclassed_models_need_x():
    model = Subclassed()
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(KerasEstimationError, match="x="):
        estimate_training(model, batch_size=4)
    x = np.zeros((4, 12), np.float32)
    est = estimate_training(model, x=x, y=np.zeros((4, 5), np.float32))
    assert est.batch_size == 4 and est.method == "tf-graph"
    assert est.breakdown["parameters"] == (12 * 32 + 32 + 32 * 5 + 5) * 4


def test_invalid_inputs():
    model = keras.Sequential([keras.Input((3,)), L.Dense(2)])
    with pytest.raises(KerasEstimationError, match="compile"):
        estimate_training(model, batch_size=2)
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(KerasEstimationError, match="batch_size"):
        estimate_training(model)
    with pytest.raises(KerasEstimationError, match="method"):
        estimate_training(model, 2, method="guess")


def test_mixed_precision_accumulation_and_remat_are_reflected():
    def build(policy=None, accumulate=None, remat=False):
        keras.mixed_precision.set_global_policy(policy or "float32")
        try:

            def make():
                return keras.Sequential(
                    [keras.Input((256,))] + [L.Dense(256, activation="relu") for _ in range(6)] + [L.Dense(4)]
                )

            if remat:
                with keras.RematScope(mode="activations"):  # "full" fails in Keras' own fit on TF
                    model = make()
            else:
                model = make()
        finally:
            keras.mixed_precision.set_global_policy("float32")
        optimizer = keras.optimizers.Adam(gradient_accumulation_steps=accumulate) if accumulate else "adam"
        model.compile(optimizer=optimizer, loss="mse")
        # what the replay makes of each: the step check's real steps at batch 512 move the lines' offsets by their
        # run-to-run spread, more than the difference asserted below (a CI run with the check: remat's growth from
        # 1024 to 2048 came out 8.7 MB, the plain model's 17.0 MB)
        return estimate_training(model, batch_size=512, check_steps=False)

    base = build()
    mixed = build("mixed_float16")
    assert mixed.precision == "16-mixed"

    def growth(est):  # bytes per 1024 more samples: activations and temporaries
        return est.peak_bytes_at(2048) - est.peak_bytes_at(1024)

    # the forward keeps float16 activations, and the casts around them are temporaries. On TensorFlow's CPU
    # kernels the real step does not get smaller: from 1024 to 2048 samples this model's allocator peak grew by
    # 9.5 MB in mixed precision against 7.1 MB in float32 with oneDNN off (10.2 against 8.1 with it on)
    assert mixed.breakdown["activations"] < base.breakdown["activations"]
    assert mixed.breakdown["temporaries"] > base.breakdown["temporaries"]
    accumulated = build(accumulate=4)
    assert accumulated.breakdown["optimizer_state"] >= base.breakdown["optimizer_state"] + base.breakdown["parameters"]
    remat = build(remat=True)
    assert remat.method == "tf-graph"
    # On TF, RematScope(mode="activations") wraps each activation in tf.recompute_grad; the allocator
    # measures *more* memory than without it (12.3 vs 9.4 MiB at batch 512), and the replay follows.
    assert growth(remat) > growth(base)


def test_fallback_when_the_trace_fails(monkeypatch):
    import nnmem_callbacks.estimators.keras.tensorflow.graph as tf_graph

    def broken(*args, **kwargs):
        raise RuntimeError("no graph today")

    monkeypatch.setattr(tf_graph, "estimate_tensorflow", broken)
    model = mlp()
    with pytest.warns(RuntimeWarning, match="no graph today"):
        est = estimate_training(model, batch_size=32)
    assert est.method == "layer-rules"
    assert any("no graph today" in note for note in est.notes)
    with pytest.raises(RuntimeError):
        estimate_training(model, batch_size=32, method="backend")


def test_fit_plan_keeps_the_effective_batch(replay_only):
    # the plan's logic on the replay's figures: each estimate's step check runs real steps, whose peak moves from
    # run to run (10-20% on this 3 MiB model on a busy host), and with one check per estimate this test took
    # 4 minutes per oneDNN mode in CI. fit_plan with its checks runs in the quickstart (test_keras_quickstart.py).
    model = mlp()
    # fit_plan checks the batch it chooses by a direct estimate at that batch: budget for one at batch 100. The
    # requested batch is far over it (its upper bound is about 3x that of 512), so that it cannot fit by chance
    budget = int(replay_only(model, batch_size=100).upper_bytes / 0.7) + 1
    plan = fit_plan(model, budget=budget, batch_size=2048)
    assert not plan.fits and 1 <= plan.batch_size < 2048
    assert plan.batch_size * plan.gradient_accumulation_steps >= 2048
    assert plan.verification is not None and plan.verification.verified
    assert replay_only(model, batch_size=plan.batch_size, check_scaling=False).upper_bytes <= budget
    assert "gradient_accumulation_steps=" in plan.code and f"batch_size={plan.batch_size}" in plan.code


# -- callback --------------------------------------------------------------------
@pytest.fixture
def replay_only(monkeypatch):
    """The callback's logic on the replay's estimates: no step check (3-7 child processes per estimate).

    The callback with its check runs in fresh processes in tests/test_keras_every_host.py and tests/test_keras_quickstart.py.
    """
    import nnmem_callbacks.estimators.keras.estimator as estimator

    real = estimator.estimate_training
    monkeypatch.setattr(estimator, "estimate_training", lambda *a, **k: real(*a, **{**k, "check_steps": False}))
    return estimator.estimate_training


def test_callback_logs_and_reuse_across_fits(replay_only):
    callback = MemoryBudgetCallback(batch_size=64, budget="8GiB")
    x, y = data(256)
    model = mlp()
    history = model.fit(x, y, batch_size=64, epochs=2, callbacks=[callback], verbose=0)
    names = callback.metric_names
    rss = callback._meter.process_level  # no relative error is logged from process RSS
    for key in (names.predicted_peak, names.measured, names.predicted, names.budget) + (
        () if rss else (names.relative_error,)
    ):
        assert len(history.history[key]) == 2, key
    assert (names.relative_error in history.history) is not rss
    assert history.history[names.measured][0] > 0
    first = callback.estimate
    assert callback.plan.fits and len(callback.measurements) == 2
    # a second fit with another model and batch size: state is reset
    callback.batch_size = 32
    other = mlp(200)
    history = other.fit(x, y, batch_size=32, epochs=1, callbacks=[callback], verbose=0)
    assert callback.estimate is not first and callback.estimate.batch_size == 32
    assert len(callback.measurements) == 1 and len(history.history[names.measured]) == 1


def test_warn_policy_warns_once_with_code(replay_only):
    model = mlp()
    est = replay_only(model, batch_size=256)
    budget = int(est.upper_bytes_at(64) / 0.95) + 1  # planning budgets with the upper bound
    x, y = data(512)
    callback = MemoryBudgetCallback(batch_size=256, budget=budget)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=256, epochs=2, callbacks=[callback], verbose=0)
    # the budget warning, once for the whole fit (a meter fallback, where the allocator keeps no statistics, is
    # another warning, said once too)
    messages = [str(w.message) for w in caught if "MemoryBudgetCallback: Predicted peak" in str(w.message)]
    assert len(messages) == 1
    text = messages[0]
    assert "Largest batch size that fits" in text
    assert "batch_size=" in text and "gradient_accumulation_steps=" in text
    # offered whenever 16-bit activations would save anything (the check's real runs move the breakdown's
    # temporaries from run to run, and with them the saving)
    breakdown = callback.estimate.breakdown
    halvable = breakdown["activations"] + breakdown["temporaries"] + breakdown["inputs"] // 2
    assert ("mixed_precision.set_global_policy" in text) == (halvable // 2 > 0), (breakdown, text)
    assert callback.plan.max_fitting_batch_size < 256


def test_raise_policy_stops_before_any_step(replay_only):
    model = mlp(1000)
    x, y = data(128)
    callback = MemoryBudgetCallback(batch_size=128, budget=1024, policy="raise")
    with pytest.raises(MemoryBudgetExceeded, match="Predicted peak"):
        model.fit(x, y, batch_size=128, epochs=1, callbacks=[callback], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_policy_and_argument_validation():
    with pytest.raises(ValueError, match="cannot change its batch size"):
        MemoryBudgetCallback(policy="accumulate")
    with pytest.raises(ValueError, match="valid policies are 'warn', 'raise'"):
        MemoryBudgetCallback(policy="explode")
    with pytest.raises(ValueError, match="budget"):
        MemoryBudgetCallback(budget=-3)
    with pytest.raises(ValueError, match="batch_size"):
        MemoryBudgetCallback(batch_size=0)


def test_batch_size_from_a_dataset_and_missing_batch_size(replay_only):
    x, y = data(128)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32, drop_remainder=True)
    callback = MemoryBudgetCallback(data=dataset)
    mlp().fit(dataset, epochs=1, callbacks=[callback], verbose=0)
    assert callback.estimate is not None and callback.estimate.batch_size == 32

    unknown = MemoryBudgetCallback()  # no batch size given: fit's own is read from its data adapter
    history = mlp().fit(x, y, batch_size=32, epochs=1, callbacks=[unknown], verbose=0)
    assert unknown.estimate is not None and unknown.estimate.batch_size == 32
    assert unknown.metric_names.measured in history.history
    assert "memory_predicted_peak_mib" in history.history


def test_failed_estimate_lets_training_go_on(monkeypatch):
    import nnmem_callbacks.estimators.keras.estimator as estimator

    def broken(*args, **kwargs):
        raise KerasEstimationError("cannot estimate this one")

    monkeypatch.setattr(estimator, "estimate_training", broken)
    x, y = data(64)
    callback = MemoryBudgetCallback(batch_size=32, policy="raise")
    with pytest.warns(UserWarning, match="cannot estimate this one"):
        history = mlp().fit(x, y, batch_size=32, epochs=1, callbacks=[callback], verbose=0)
    assert len(history.history["loss"]) == 1
    assert callback.failure and callback.metric_names.measured in history.history


def test_the_estimates_missing_measurements_are_warnings_of_the_callback(monkeypatch):
    import dataclasses

    import nnmem_callbacks.estimators.keras.estimator as estimator

    real = estimator.estimate_training

    def cut_short(*args, **kwargs):
        estimate = real(*args, **{**kwargs, "probe_kernels": False, "check_steps": False})
        note = "warning: only 1 of the step check's 3 runs finished within its 300 s budget"
        return dataclasses.replace(estimate, notes=estimate.notes + (note,))

    monkeypatch.setattr(estimator, "estimate_training", cut_short)
    x, y = data(64)
    callback = MemoryBudgetCallback(batch_size=32, budget="8GiB")
    with pytest.warns(UserWarning, match="MemoryBudgetCallback: warning: only 1 of the step check's 3 runs"):
        history = mlp().fit(x, y, batch_size=32, epochs=1, callbacks=[callback], verbose=0)
    assert callback.estimate is not None and len(history.history["loss"]) == 1


def test_tensorboard_files_read_back(tmp_path, replay_only):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    x, y = data(128)
    own = tmp_path / "own"
    keras_logs = tmp_path / "keras"
    callbacks = [MemoryBudgetCallback(batch_size=32, log_dir=str(own)), keras.callbacks.TensorBoard(str(keras_logs))]
    mlp().fit(x, y, batch_size=32, epochs=2, callbacks=callbacks, verbose=0)
    names = callbacks[0].metric_names.for_lightning()  # the memory/... spelling of the event files
    accumulator = EventAccumulator(str(own))
    accumulator.Reload()
    tags = accumulator.Tags()
    compared = {names.predicted_peak, names.measured, names.predicted}
    if not callbacks[0]._meter.process_level:  # no relative error is logged from process RSS
        compared.add(names.relative_error)
    assert compared <= set(tags["scalars"])
    assert [event.step for event in accumulator.Scalars(names.measured)] == [0, 1]
    assert "memory/estimate" in tags["tensors"]
    # values placed in logs reach the Keras TensorBoard callback that runs after ours
    train_dir = keras_logs / "train"
    keras_accumulator = EventAccumulator(str(train_dir))
    keras_accumulator.Reload()
    keras_tags = set(keras_accumulator.Tags()["scalars"]) | set(keras_accumulator.Tags()["tensors"])
    assert any("memory_predicted_peak_mib" in tag for tag in keras_tags), keras_tags


def test_importing_the_keras_package_does_not_import_torch():
    import subprocess
    import sys

    code = "import nnmem_callbacks.keras as k, sys; k.estimate_training; print('torch' in sys.modules)"
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr[-2000:]


def test_a_convolutions_two_gradients_run_together_with_their_scratch():
    """The executor runs both gradients of a convolution as soon as the output's gradient exists: their scratch overlaps."""
    from nnmem_callbacks.estimators.keras.tensorflow.probes import PROBED_OPS
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.schedule import sibling_waves
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup

    kernel = tf.Variable(tf.random.uniform((3, 3, 8, 16)))

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.nn.relu(tf.nn.conv2d(x, kernel, 1, "SAME")))
        return tape.gradient(loss, [x, kernel])

    graph = step.get_concrete_function(tf.TensorSpec((4, 32, 32, 8))).graph
    ops = graph.get_operations()
    gradients = [op.name for op in ops if op.type in ("Conv2DBackpropInput", "Conv2DBackpropFilter")]
    assert len(gradients) == 2
    inputs_of = {op.name: list(op.inputs) for op in ops}
    order, waves = sibling_waves(ops, inputs_of, {}, 2, PROBED_OPS)
    assert waves.get(gradients[0]) is not None and waves.get(gradients[0]) == waves.get(gradients[1])
    assert sorted(op.name for op in order) == sorted(op.name for op in ops)
    assert sibling_waves(ops, inputs_of, {}, 1, PROBED_OPS)[1] == {}
    scratch = 8 << 20
    peaks = {}
    for threads in (1, 2):
        replayer = GraphReplayer(
            function_lookup(graph), 4, parallel_ops=threads, scratch=dict.fromkeys(gradients, scratch)
        )
        peaks[threads] = replayer.replay(graph)[0].peak
    # one thread: one work buffer at a time; two: both while the second runs
    assert peaks[2] - peaks[1] >= scratch - (64 << 10)


def test_gradients_nothing_reads_are_not_replayed():
    """TensorFlow prunes a function's ops that nothing needed reads: the data's gradient of a first convolution."""
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup

    kernel = tf.Variable(tf.random.uniform((3, 3, 8, 16)))

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.conv2d(x, kernel, 1, "SAME"))
        return tape.gradient(loss, kernel)

    graph = step.get_concrete_function(tf.TensorSpec((4, 32, 32, 8))).graph
    dead = [op.name for op in graph.get_operations() if op.type == "Conv2DBackpropInput"]
    if not dead:  # pragma: no cover - a TensorFlow that no longer builds the unused gradient
        pytest.skip("this TensorFlow does not build the unused gradient")
    replayer = GraphReplayer(function_lookup(graph), 4, scratch=dict.fromkeys(dead, 64 << 20))
    result = replayer.replay(graph)[0]
    assert not set(dead) & set(replayer.order)
    assert any(op.endswith("Conv2DBackpropFilter") for op in replayer.order)
    assert result.peak < 64 << 20  # the dead op's work buffer is never charged


def test_an_unlucky_run_keeps_a_slow_kernels_scratch_while_the_next_kernel_runs():
    """The upper bound's replay lets a kernel's work buffer live on until the next kernel with scratch is done."""
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup

    first, second = tf.Variable(tf.random.uniform((3, 3, 8, 8))), tf.Variable(tf.random.uniform((3, 3, 8, 8)))

    @tf.function(autograph=False)
    def chain(x):
        return tf.reduce_sum(tf.nn.conv2d(tf.nn.conv2d(x, first, 1, "SAME"), second, 1, "SAME"))

    graph = chain.get_concrete_function(tf.TensorSpec((2, 16, 16, 8))).graph
    convolutions = [op.name for op in graph.get_operations() if op.type == "Conv2D"]
    assert len(convolutions) == 2
    scratch = dict(zip(convolutions, (6 << 20, 4 << 20)))
    peaks = {}
    for unlucky in (False, True):
        replayer = GraphReplayer(function_lookup(graph), 2, parallel_ops=2, scratch=scratch, unlucky=unlucky)
        peaks[unlucky] = replayer.replay(graph)[0].peak
    # expected: one work buffer at a time (the larger); unlucky: the first still alive while the second runs
    assert peaks[False] < (6 << 20) + (1 << 20)
    assert peaks[True] >= (10 << 20)


def test_the_kernel_a_wave_hands_to_the_pool_outlives_the_wave_by_one_kernel():
    """Expected replay: a wave's last kernel started late; its scratch is alive while the next kernel runs, not beyond."""
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup

    first, second = tf.Variable(tf.random.uniform((3, 3, 8, 8))), tf.Variable(tf.random.uniform((3, 3, 8, 8)))

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.conv2d(tf.nn.relu(tf.nn.conv2d(x, first, 1, "SAME")), second, 1, "SAME"))
        return tape.gradient(loss, [first, second])

    graph = step.get_concrete_function(tf.TensorSpec((2, 16, 16, 8))).graph
    gradients = [op.name for op in graph.get_operations() if op.type in ("Conv2DBackpropInput", "Conv2DBackpropFilter")]
    mib = 1 << 20

    def replay(threads: int, last_kernel_mib: int) -> tuple[int, list[str]]:
        probe = GraphReplayer(function_lookup(graph), 2, parallel_ops=threads)
        probe.replay(graph)
        kernels = [name for name in probe.order if name in gradients]
        scratch = {name: 3 * mib for name in kernels[:-1]} | {kernels[-1]: last_kernel_mib * mib}
        replayer = GraphReplayer(function_lookup(graph), 2, parallel_ops=threads, scratch=scratch)
        return replayer.replay(graph)[0].peak, kernels

    tensors = 256 << 10  # the step's own tensors: 16 KiB each
    peak, kernels = replay(2, 5)
    # the second convolution's two gradients (a wave), then the first's filter gradient (its input gradient is pruned)
    assert len(kernels) == 3 and "Conv2DBackpropFilter" in kernels[-1]
    # two inter-op threads: the wave (3 + 3 MiB), then the last kernel (5 MiB) beside the wave's pool kernel (3 MiB)
    assert 8 * mib <= peak < 8 * mib + tensors
    # with a small last kernel the wave's two work buffers are the peak: no three kernels at once
    assert 6 * mib <= replay(2, 1)[0] < 6 * mib + tensors
    # one thread: no waves, one work buffer at a time
    assert 5 * mib <= replay(1, 5)[0] < 5 * mib + tensors


def test_newest_first_runs_the_op_that_became_ready_last():
    """The upper bound's newest-first order (Eigen's work-stealing queues) follows a branch down before the older ready op."""
    from nnmem_callbacks.estimators.keras.tensorflow.schedule import schedule_ops

    @tf.function(autograph=False)
    def branches(x):
        kept, followed = tf.sin(x), tf.cos(x)
        return kept + tf.tanh(followed)

    ops = branches.get_concrete_function(tf.TensorSpec((8, 8))).graph.get_operations()
    phases = {op.name: "forward" for op in ops}
    orders = {}
    for newest_first in (False, True):
        order, *_ = schedule_ops(ops, phases, width=1, eager_phases=("forward",), newest_first=newest_first)
        orders[newest_first] = [op.type for op in order if op.type in ("Sin", "Cos", "Tanh")]
    assert orders[False] == ["Sin", "Cos", "Tanh"]  # the oldest ready op first
    assert orders[True] == ["Cos", "Tanh", "Sin"]  # Cos became ready after Sin, and Tanh after both


def test_without_forwarding_an_elementwise_chain_holds_input_and_output_together():
    """forwarding=False replays runs where element-wise kernels cannot write into their input's buffer."""
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup

    @tf.function(autograph=False)
    def chain(x):
        return tf.reduce_sum(tf.exp(x) * 2.0 + 1.0)

    graph = chain.get_concrete_function(tf.TensorSpec((512, 512))).graph
    peaks = {
        forwarding: GraphReplayer(function_lookup(graph), 1, forwarding=forwarding).replay(graph)[0].peak
        for forwarding in (True, False)
    }
    one = 512 * 512 * 4
    # the batch, and one buffer that Mul and AddV2 take over in turn (a scalar beside)
    assert 2 * one <= peaks[True] < 2 * one + 1024
    assert 3 * one <= peaks[False] < 3 * one + 1024  # the batch, exp's output and Mul's output while Mul runs


def test_the_upper_bound_takes_the_largest_of_the_unlucky_runs(monkeypatch):
    """``_replay_at`` replays every unlucky run and keeps the one with the largest counted peak, by name."""
    from nnmem_callbacks.estimators.keras.tensorflow import graph as tf_graph

    @tf.function(autograph=False)
    def chain(x):
        return tf.reduce_sum(tf.exp(x) * 2.0 + 1.0)

    concrete = chain.get_concrete_function(tf.TensorSpec((512, 512)))
    forwarding_only = (tf_graph.UnluckyRun("every ready op at once", every_phase_at_once=True),)
    without = tf_graph.UnluckyRun("no forwarding", forwarding=False)
    first = tf_graph._replay_at(concrete, 1, [], {}, True, unlucky_runs=forwarding_only)
    both = tf_graph._replay_at(concrete, 1, [], {}, True, unlucky_runs=forwarding_only + (without,))
    assert first.worst_counted[0] == "every ready op at once"
    assert first.worst_counted[1].peak_counted == first.expected.peak_counted
    name, worst = both.worst_counted
    assert name == "no forwarding" and worst.peak_counted > first.expected.peak_counted
    assert both.worst_tensors.peak > both.expected.peak  # the tensor bytes planning budgets with, too
    assert tf_graph._replay_at(concrete, 1, [], {}, True, unlucky_runs=()).worst_counted[0] == "none"
    # every replay runs the first two steps on one allocator model; its counted peak is the larger step's
    steps = first.expected.step_peaks_counted
    assert len(steps) == tf_graph.REPLAYED_STEPS == 2 and first.expected.peak_counted == max(steps)


def test_the_scratch_of_one_wave_is_charged_allocation_by_allocation():
    """Each kernel of a wave allocates its own work buffer: a free chunk is split for each, not charged whole for their sum."""
    from nnmem_callbacks.allocators.bfc import BFCSimulator
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer, ReplayRun
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup

    @tf.function(autograph=False)
    def nothing(x):
        return x

    graph = nothing.get_concrete_function(tf.TensorSpec((1,))).graph
    peaks = {}
    for name, scratch in (("two kernels", [5 << 19, 5 << 19]), ("one kernel", 5 << 20)):
        bfc = BFCSimulator()
        bfc.free(bfc.alloc(8 << 20))  # a free 8 MiB chunk, as an earlier layer leaves behind
        run = ReplayRun(
            GraphReplayer(function_lookup(graph), 1, bfc=bfc),
            graph,
            [],
            {},
            set(),
            inputs_category=None,
            input_list_bytes=None,
            track_phases=False,
        )
        run.record("backward", 5 << 20, scratch)
        peaks[name] = run.result.peak_counted
        assert bfc.in_use == 0  # the scratch is released after the peak is read
    assert peaks["two kernels"] == 5 << 20  # 2.5 MiB twice, each split off the free chunk
    assert peaks["one kernel"] == 8 << 20  # 5 MiB is less than half of 8: the whole chunk is charged


def test_a_tensor_lists_elements_are_counted_by_the_bfc_allocator_only(monkeypatch):
    """An RNN's per-step TensorList elements are separate small allocations: BFC counts them, oneDNN's allocator does not."""
    from nnmem_callbacks.allocators import tensorflow_cpu as tf_allocator
    from nnmem_callbacks.allocators.bfc import BFCSimulator
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup

    steps, batch, units = 64, 16, 1024  # 64 KiB elements, 4 MiB in all

    @tf.function(autograph=False)
    def loop(x):
        array = tf.TensorArray(tf.float32, size=steps, element_shape=(batch, units))

        def body(i, array):
            return i + 1, array.write(i, x * tf.cast(i, tf.float32))

        _, array = tf.while_loop(lambda i, array: i < steps, body, (0, array))
        return array.stack()

    graph = loop.get_concrete_function(tf.TensorSpec((batch, units))).graph
    results = {}
    for allocator, min_bytes in (("bfc", 0), ("onednn", tf_allocator.TF_CPU_COUNTED_MIN_BYTES)):
        monkeypatch.setattr(tf_allocator, "_COUNTED_MIN", [min_bytes])
        results[allocator] = GraphReplayer(function_lookup(graph), batch, bfc=BFCSimulator()).replay(
            graph, track_phases=False
        )[0]
    element_bytes = batch * units * 4
    assert results["bfc"].peak == results["onednn"].peak  # the same tensors either way
    # the list, plus the batch and the few elements in flight (below oneDNN's threshold too)
    difference = results["bfc"].peak_counted - results["onednn"].peak_counted
    assert steps * element_bytes <= difference <= (steps + 4) * element_bytes


def _list_loop(steps, batch, units):
    @tf.function(autograph=False)
    def loop(x):
        array = tf.TensorArray(tf.float32, size=steps, element_shape=(batch, units))

        def body(i, array):
            scaled = x * tf.cast(i, tf.float32)
            return i + 1, array.write(i, tf.exp(scaled) + scaled)

        _, array = tf.while_loop(lambda i, array: i < steps, body, (0, array))
        return array.stack()

    return loop.get_concrete_function(tf.TensorSpec((batch, units))).graph


def test_a_lists_elements_take_chunks_of_the_allocator_model_one_by_one(monkeypatch):
    """The elements an RNN saves per step are separate allocations: they fill the allocator's regions and make it
    open new ones, which decides what a later large buffer is charged (measured: an LSTM's saved steps made the
    difference between 32 and 17 MiB charged for a 17 MiB convolution scratch)."""
    from nnmem_callbacks.allocators import tensorflow_cpu as tf_allocator
    from nnmem_callbacks.allocators.bfc import BFCSimulator
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup

    monkeypatch.setattr(tf_allocator, "_COUNTED_MIN", [0])  # the BFC allocator: every allocation counted
    steps, batch, units = 48, 16, 1024  # 64 KiB elements, 3 MiB in all

    class RecordingBFC(BFCSimulator):
        requests: list = []

        def alloc(self, num_bytes):
            self.requests.append(num_bytes)
            return super().alloc(num_bytes)

    graph = _list_loop(steps, batch, units)
    bfc = RecordingBFC()
    result, _ = GraphReplayer(function_lookup(graph), batch, bfc=bfc).replay(graph, track_phases=False)
    element = batch * units * 4
    assert bfc.requests.count(element) >= steps  # one request per saved element, none for the list as a block
    assert max(bfc.requests) <= steps * element  # the largest: the stacked output
    assert result.peak_counted >= 2 * steps * element  # the list's elements and the stacked copy, together


def test_a_loops_transient_is_charged_as_its_bodys_allocations():
    """A loop body's peak is many small buffers; its caller's allocator model is charged them one by one, not as one
    block of their sum (a block the kernels never ask for, which would open a region of its own)."""
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup

    steps, batch, units = 8, 64, 1024  # 256 KiB per body tensor
    graph = _list_loop(steps, batch, units)
    loop = next(op for op in graph.get_operations() if op.type in tf_ops.WHILE_OPS)
    replayer = GraphReplayer(function_lookup(graph), batch)
    transient, pieces = tf_ops.call_transient(replayer, loop, {})
    body_tensor = batch * units * 4
    assert isinstance(pieces, list) and len(pieces) >= 2
    assert max(pieces) <= body_tensor + 256 and sum(pieces) >= 2 * body_tensor
    assert transient >= 2 * body_tensor


def test_body_pieces_fall_back_to_the_counted_peak_and_repeat_for_iterations_in_flight():
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayResult

    assert tf_ops.body_pieces(GraphReplayResult(peak_counted=3 << 20)) == [3 << 20]
    assert tf_ops.body_pieces(GraphReplayResult(peak_counted=0)) == []
    assert tf_ops.body_pieces(GraphReplayResult(peak_counted=768, peak_pieces=[256, 512]), copies=2) == [
        256,
        512,
        256,
        512,
    ]


def test_a_list_of_known_elements_is_counted_once_without_an_allocator_model():
    """Where no allocator is simulated (a loop or call body), a list's elements count once while it lives."""
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup

    steps, batch, units = 8, 64, 1024  # 256 KiB elements, 2 MiB in all

    @tf.function(autograph=False)
    def unstack_and_stack(x):
        array = tf.TensorArray(tf.float32, size=steps, element_shape=(batch, units))
        return array.unstack(tf.tile(x[None], [steps, 1, 1])).stack()

    graph = unstack_and_stack.get_concrete_function(tf.TensorSpec((batch, units))).graph
    result, _ = GraphReplayer(function_lookup(graph), batch).replay(graph, track_phases=False)
    # every buffer is a multiple of 256 KiB, counted exactly by either CPU allocator: counted bytes = tensor bytes
    assert result.peak == 4 * (1 << 20) + batch * units * 4  # the tiled copy and the list (2 MiB each), and x
    assert result.peak_counted == result.peak


def test_the_replays_allocator_starts_as_keras_build_left_it():
    """Random-initialized variables are made through two freed temporaries; zero-filled ones and slots are not."""
    from nnmem_callbacks.allocators.tensorflow_cpu import allocator_after_build
    from nnmem_callbacks.estimators.keras.tensorflow.state import build_state

    model = keras.Sequential([keras.Input((64,)), L.Dense(1024), L.Dense(1024, kernel_initializer="zeros")])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    state = build_state(model)
    assert [at_random for _, at_random in state[:4]] == [True, False, False, False]
    assert not any(at_random for _, at_random in state[4:])  # the optimizer's variables are zero-filled
    assert len(state) == len({id(v) for v in model.variables} | {id(v) for v in model.optimizer.variables})
    bfc, chunks = allocator_after_build(state, min_bytes=0)
    kernel = bfc.chunks[chunks[0]]
    assert kernel[0] >= 2 * state[0][0]  # behind the random values and their scaled copy
    # the holes they left are free and take later buffers: the allocator holds only the variables
    assert bfc.in_use == sum(bfc.chunks[c][1] for c in chunks if c is not None)
    # trained values read as random
    model.layers[1].bias.assign(tf.range(1024, dtype="float32"))
    assert build_state(model)[3] == (state[3][0], True)


def test_an_update_racing_its_layers_input_gradient_moves_the_variable_for_the_next_step():
    """A 1x1 convolution's two gradients run as one wave; the kernel's update then copies it (its input gradient may
    still read it) and the variable keeps the copy's chunk, freeing the old one. With one inter-op thread, no wave,
    no copy."""
    from nnmem_callbacks.allocators.tensorflow_cpu import VariablePlacement, allocator_after_build
    from nnmem_callbacks.estimators.keras.common import input_specs
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.state import build_state, resource_indices, state_variables
    from nnmem_callbacks.estimators.keras.tensorflow.trace import function_lookup, trace_train_step

    model = keras.Sequential(
        [
            keras.Input((8, 8, 8)),
            L.Conv2D(256, 3, padding="same"),
            L.Conv2D(512, 1),
            L.GlobalAveragePooling2D(),
            L.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    x_specs, y_specs, _ = input_specs(model, np.zeros((4, 8, 8, 8), "float32"), np.zeros((4, 1), "float32"))
    graph = trace_train_step(model, x_specs, y_specs, 4).graph
    state = build_state(model)
    resources = resource_indices(graph, model)
    kernel = [id(v) for v in state_variables(model)[0]].index(id(model.layers[1].kernel))
    assert kernel in resources.values()  # the placeholder of the kernel's handle maps to its state index
    moved = {}
    for threads in (1, 2):
        bfc, chunks = allocator_after_build(state, min_bytes=0)
        placement = VariablePlacement(bfc, chunks, resources)
        GraphReplayer(function_lookup(graph), 4, bfc=bfc, parallel_ops=threads, placement=placement).replay(graph)
        moved[threads] = placement.chunks[kernel] != chunks[kernel]
        if moved[threads]:
            old = bfc.chunks.get(chunks[kernel])
            assert old is None or not old[2]  # the old value's chunk is free (or merged into a free one)
            assert bfc.chunks[placement.chunks[kernel]][2]  # the copy is held
    assert moved == {1: False, 2: True}


def test_an_estimates_replays_make_each_order_once_and_replay_as_without_the_memo(monkeypatch):
    """The steps of a replay and the calls of a loop body share the op order made once, with the same result."""
    from nnmem_callbacks.estimators.keras.common import input_specs
    from nnmem_callbacks.estimators.keras.estimator import build_like_fit
    from nnmem_callbacks.estimators.keras.tensorflow import graph as tf_graph
    from nnmem_callbacks.estimators.keras.tensorflow.replay import GraphReplayer
    from nnmem_callbacks.estimators.keras.tensorflow.trace import trace_train_step

    model = keras.Sequential([keras.Input((12, 6)), L.Conv1D(8, 3), L.LSTM(8), L.Dense(3)])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x_specs, y_specs, _ = input_specs(model)
    build_like_fit(model, 4, x_specs, y_specs)
    concrete = trace_train_step(model, x_specs, y_specs, 4)
    state = tf_graph.build_state(model)
    made = []
    schedule = GraphReplayer._schedule

    def counted(self, graph, graph_outputs, track_phases):
        made.append((graph, self.unlucky, self.newest_first))
        return schedule(self, graph, graph_outputs, track_phases)

    monkeypatch.setattr(GraphReplayer, "_schedule", counted)
    shared = tf_graph._replay_at(concrete, 4, state, {}, False)
    replays = 1 + len(tf_graph.UNLUCKY_RUNS)
    assert len(made) == len(set(made)), "an order was made twice in one estimate"
    assert len({key[0] for key in made}) >= 2  # the step and the LSTM's loop body
    assert len(made) < replays * tf_graph.REPLAYED_STEPS * len({key[0] for key in made})
    # without the memo (a new one at every replayer) every step and body call makes its order again
    monkeypatch.setattr(GraphReplayer, "schedules", property(lambda self: {}, lambda self, value: None), raising=False)
    made.clear()
    alone = tf_graph._replay_at(concrete, 4, state, {}, False)
    assert len(made) > len(set(made))
    assert alone.expected == shared.expected and alone.unlucky == shared.unlucky
