"""TensorFlow kernel probes: what is collected from the traced step, the cache, and a real child run."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "tensorflow":  # pragma: no cover - another test imported keras first
    pytest.skip("Keras backend is not tensorflow in this process", allow_module_level=True)

from nnmem_callbacks.estimators.keras.common import input_specs  # noqa: E402
from nnmem_callbacks.estimators.keras.estimator import build_like_fit  # noqa: E402
from nnmem_callbacks.estimators.keras.tensorflow import probes as tf_probes
from nnmem_callbacks.estimators.keras.tensorflow.trace import trace_train_step  # noqa: E402
from nnmem_callbacks.keras import estimate_training  # noqa: E402
from nnmem_callbacks.probes.cache import ProbeCache  # noqa: E402
from nnmem_callbacks.probes.fit import Curve  # noqa: E402

pytestmark = pytest.mark.keras
L = keras.layers


def conv_model() -> keras.Model:
    # the 1x1 convolution first: TensorFlow prunes the data's gradient, so only a later convolution has an input gradient
    model = keras.Sequential(
        [keras.Input((50, 8)), L.Conv1D(8, 1), L.Conv1D(16, 3), L.MaxPooling1D(2), L.Flatten(), L.Dense(4)]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def traced_probes(model: keras.Model, batch: int) -> dict:
    x_specs, y_specs, _ = input_specs(model)
    build_like_fit(model, batch, x_specs, y_specs)
    graph = trace_train_step(model, x_specs, y_specs, batch).graph
    double = trace_train_step(model, x_specs, y_specs, 2 * batch).graph
    probes, undescribed = tf_probes.collect(graph, double, batch)
    assert undescribed == 0
    return probes


def test_collect_marks_the_batch_dims_and_shape_values():
    probes = traced_probes(conv_model(), 6)
    by_type = {}
    for probe in probes.values():
        by_type.setdefault(probe.op_type, []).append(probe)
    assert {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul"} <= set(by_type)
    (backprop_input,) = by_type["Conv2DBackpropInput"]
    sizes, kernel, grad = backprop_input.inputs
    assert sizes.value == ("b1", 1, 50, 8)  # input_sizes comes from a Shape op: the batch entry is per sample
    assert kernel.shape == (1, 3, 8, 16) and kernel.value is None  # the weights do not scale
    assert grad.shape == ("b1", 1, 48, 16)
    assert grad.at(4) == ((4, 1, 48, 16), None)
    # the same op at another batch size is the same probe (one cache entry serves every batch)
    again = traced_probes(conv_model(), 10)
    assert {p.key() for p in again.values()} == {p.key() for p in probes.values()}


class FakeChild:
    """Stands in for the probe process: scratch = 1000 + 10 x samples, or saturating at 3 samples, or failing."""

    def __init__(self, shape: str = "linear") -> None:
        self.calls: list[list[dict]] = []
        self.shape = shape

    def __call__(self, requests: list[dict], timeout: float):
        self.calls.append(requests)
        results, errors = {}, []
        for request in requests:
            if self.shape == "failing":
                errors.append((request["key"], f"{request['op']}: InvalidArgumentError: no kernel"))
                continue
            for n in request["samples"]:
                value = 1000 + 10 * n if self.shape == "linear" else min(n, 3) * 100_000
                results.setdefault(request["key"], {})[n] = value
        return results, errors, False


def test_measure_caches_points_and_a_warm_cache_probes_nothing(tmp_path, monkeypatch):
    probes = traced_probes(conv_model(), 6)
    child = FakeChild()
    monkeypatch.setattr(tf_probes, "_run_child", child)
    fingerprint = {"device_type": "cpu", "framework": "tensorflow", "test": 1}
    curves, report = tf_probes.measure(probes, (6, 12), cache=ProbeCache(fingerprint, tmp_path))
    assert len(child.calls) == 1 and report.probed == len(probes) and report.cached == 0
    assert all(curve.at(6) == 1060 for curve in curves.values())
    curves, report = tf_probes.measure(probes, (6, 12), cache=ProbeCache(fingerprint, tmp_path))
    assert len(child.calls) == 1, "a warm cache must not start the probe process"
    assert report.cached == len(probes) and report.probed == 0
    assert "from the probe cache" in report.note()
    # another host fingerprint (oneDNN on instead of off, say) starts over
    tf_probes.measure(probes, (6, 12), cache=ProbeCache({**fingerprint, "onednn": True}, tmp_path))
    assert len(child.calls) == 2


def test_probing_cut_short_by_the_time_limit_is_a_warning_and_the_next_estimate_continues(tmp_path, monkeypatch):
    probes = traced_probes(conv_model(), 6)
    finished = FakeChild()

    def timed_out(requests, timeout):  # the child ran out of time after its first request
        results, errors, _ = finished(requests[:1], timeout)
        return results, [(None, "the probe process ran out of its time limit")], True

    monkeypatch.setattr(tf_probes, "_run_child", timed_out)
    cache = ProbeCache({"device_type": "cpu", "t": 9}, tmp_path)
    _, report = tf_probes.measure(probes, (6, 12), cache=cache)
    keys = {probe.key() for probe in probes.values()}
    assert report.out_of_time > 0 and report.probed + report.out_of_time == len(probes) and len(keys) > 1
    limit = tf_probes.DEFAULT_TIME_LIMIT
    assert report.time_warning().startswith(f"warning: TensorFlow kernel probing stopped at its {limit:g} s limit")
    monkeypatch.setattr(tf_probes, "_run_child", finished)
    _, report = tf_probes.measure(probes, (6, 12), cache=cache)  # the rest now, the first from the cache
    assert report.out_of_time == 0 and report.time_warning() is None and report.cached > 0 and report.probed > 0


def test_the_point_budget_reaches_the_same_ops_whatever_the_cache_holds(tmp_path, monkeypatch):
    probes = traced_probes(conv_model(), 6)
    keys = list(dict.fromkeys(probe.key() for probe in probes.values()))  # the graph's order
    assert len(keys) >= 3
    monkeypatch.setattr(tf_probes, "_run_child", FakeChild())
    budget = 12  # two ops' points at batch 6 (1, 2, 4, 6 and 12 samples) fit, a third op's do not
    cache = ProbeCache({"device_type": "cpu", "t": 5}, tmp_path)
    cold, report = tf_probes.measure(probes, (6, 12), cache=cache, point_budget=budget)
    assert report.points == 10 and report.over_budget == len(probes) - report.probed > 0
    assert f"{report.over_budget} past the probe budget of 12 points" in report.note()
    _, full = tf_probes.measure(probes, (6, 12), cache=cache)  # fills the cache with every op's points
    assert full.over_budget == 0 and full.probed > 0
    warm, report = tf_probes.measure(probes, (6, 12), cache=cache, point_budget=budget)
    assert report.probed == 0 and report.points == 10
    assert set(warm) == set(cold) and {probes[name].key() for name in warm} == set(keys[:2]), (
        "the cache must not let the budget reach more ops than a cold estimate reaches"
    )


def test_a_curve_is_made_of_this_estimates_points_only(tmp_path, monkeypatch):
    probes = traced_probes(conv_model(), 8)
    monkeypatch.setattr(tf_probes, "_run_child", FakeChild("saturating"))
    cache = ProbeCache({"device_type": "cpu", "t": 6}, tmp_path)
    tf_probes.measure(probes, (8, 64), cache=cache)  # the cache now holds 64 samples too
    curves, report = tf_probes.measure(probes, (8, 16), cache=cache)
    assert report.probed == len(probes)  # 16 was missing
    assert all(sorted(dict(curve.points)) == [1, 2, 4, 8, 16] for curve in curves.values())
    stored = cache.load()
    assert all(
        sorted(dict(Curve.from_json(stored[p.key()]["points"]).points)) == [1, 2, 4, 8, 16, 64] for p in probes.values()
    )
    again, report = tf_probes.measure(probes, (8, 16), cache=cache)
    assert report.cached == len(probes) and all(
        dict(again[name].points) == dict(curves[name].points) for name in curves
    )


def test_the_replays_batch_sizes_are_probed_and_points_accumulate_in_the_cache(tmp_path, monkeypatch):
    probes = traced_probes(conv_model(), 8)
    child = FakeChild("saturating")
    monkeypatch.setattr(tf_probes, "_run_child", child)
    fingerprint = {"device_type": "cpu", "t": 2}
    curves, _ = tf_probes.measure(probes, (8, 16), cache=ProbeCache(fingerprint, tmp_path))
    # a kernel's path can change at large sizes: the sizes the replay evaluates are measured, not extrapolated
    assert all(sorted(request["samples"]) == [1, 2, 4, 8, 16] for request in child.calls[0])
    assert all(curve.at(16) == 300_000 and curve.at(8) == 300_000 for curve in curves.values())
    # another batch size probes only its own sizes; the cache keeps every point
    tf_probes.measure(probes, (8, 32), cache=ProbeCache(fingerprint, tmp_path))
    assert all(request["samples"] == [32] for request in child.calls[1])
    tf_probes.measure(probes, (16, 32), cache=ProbeCache(fingerprint, tmp_path))
    assert len(child.calls) == 2


def test_sizes_over_the_memory_cap_are_extrapolated_from_the_small_ones(tmp_path, monkeypatch):
    filters = sorted(
        (name, p) for name, p in traced_probes(conv_model(), 8).items() if p.op_type == "Conv2DBackpropFilter"
    )
    name, probe = filters[-1]  # one of the two convolutions' filter gradients
    probes = {name: probe}
    child = FakeChild()
    monkeypatch.setattr(tf_probes, "_run_child", child)
    cap = probe.tensor_bytes(4)  # 4 samples fit, 8 do not
    curves, _ = tf_probes.measure(
        probes, (8, 16), memory_cap=cap, cache=ProbeCache({"device_type": "cpu", "t": 5}, tmp_path)
    )
    assert [sorted(request["samples"]) for request in child.calls[0]] == [[1, 2, 4]]
    assert [curve.at(16) for curve in curves.values()] == [1160]


def test_failures_are_reported_cached_and_not_retried(tmp_path, monkeypatch):
    probes = traced_probes(conv_model(), 6)
    child = FakeChild("failing")
    monkeypatch.setattr(tf_probes, "_run_child", child)
    fingerprint = {"device_type": "cpu", "t": 3}
    curves, report = tf_probes.measure(probes, (6, 12), cache=ProbeCache(fingerprint, tmp_path))
    assert curves == {} and report.failed == len(probes)
    assert "failed" in report.note() and "no kernel" in report.note()
    _, report = tf_probes.measure(probes, (6, 12), cache=ProbeCache(fingerprint, tmp_path))
    assert len(child.calls) == 1 and report.failed == len(probes)


def test_the_probe_process_runs_real_kernels():
    probes = traced_probes(conv_model(), 6)
    requests = [probe.request([1, 2]) for probe in probes.values()]
    results, errors, timed_out = tf_probes._run_child(requests, timeout=240)
    assert not timed_out and not errors, errors
    assert set(results) == {probe.key() for probe in probes.values()}
    assert all(set(points) == {1, 2} and min(points.values()) >= 0 for points in results.values())


def test_probe_kernels_false_uses_the_graph_rules(monkeypatch):
    def no_child(*args, **kwargs):
        raise AssertionError("probe_kernels=False must not start the probe process")

    monkeypatch.setattr(tf_probes, "_run_child", no_child)
    estimate = estimate_training(conv_model(), batch_size=6, probe_kernels=False)
    assert estimate.method == "tf-graph"
    assert any("probe_kernels=False" in note for note in estimate.notes)
    assert any("oneDNN" in note for note in estimate.notes)


def test_measured_scratch_enters_the_replay(tmp_path, monkeypatch):
    model = conv_model()
    monkeypatch.setenv("NNMEM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tf_probes, "_run_child", FakeChild())
    with_scratch = estimate_training(model, batch_size=6, x=np.zeros((6, 50, 8), "float32"))
    without = estimate_training(model, batch_size=6, x=np.zeros((6, 50, 8), "float32"), probe_kernels=False)
    assert any("measured on this host" in note for note in with_scratch.notes)
    # ~1 KiB per probed op, alive while it runs: the peak can only grow (never by more than the largest scratch)
    assert without.extra["tf_allocator_peak_bytes"] <= with_scratch.extra["tf_allocator_peak_bytes"]
    assert with_scratch.peak_bytes - without.peak_bytes <= 2048


def test_a_capped_onednn_isa_or_another_allocator_is_another_host(tmp_path, monkeypatch):
    """``ONEDNN_MAX_CPU_ISA`` and ``TF_CPU_ALLOCATOR_USE_BFC`` change the kernels and what is counted: not this cache's probes."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "TF_CPU_ALLOCATOR_USE_BFC"):
        monkeypatch.delenv(name, raising=False)
    plain = tf_probes.host_fingerprint()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = tf_probes.host_fingerprint()
    assert capped["env"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert ProbeCache(capped, tmp_path).path != ProbeCache(plain, tmp_path).path
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "true")
    assert tf_probes.host_fingerprint()["allocator"] == "bfc"
    assert ProbeCache(tf_probes.host_fingerprint(), tmp_path).path != ProbeCache(plain, tmp_path).path
