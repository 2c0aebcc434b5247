"""Kernel probes: fingerprint, on-disk cache, fitting, and their use by ``estimate_training``."""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import sys

import pytest
import torch
from torch import nn

from nnmem_callbacks.probes import ProbeSession, ProbeSettings, kernel_probes, probe_batch
from nnmem_callbacks.probes.cache import ProbeCache, cache_dir
from nnmem_callbacks.probes.fingerprint import fingerprint
from nnmem_callbacks.probes.runner import kernel_peak
from nnmem_callbacks.torch import UnsupportedKernelError, estimate_training

aten = torch.ops.aten
CONV = aten.convolution.default


def _conv_call(batch: int, channels: int = 8, size: int = 12):
    x, w = torch.zeros(batch, channels, size, size), torch.zeros(channels, channels, 3, 3)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return args, CONV(*args)


def _small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
    )


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NNMEM_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_the_test_suite_never_uses_the_real_user_cache():
    import platformdirs

    assert os.environ.get("NNMEM_CACHE_DIR")
    assert not str(cache_dir()).startswith(platformdirs.user_cache_dir("nnmem_callbacks"))


def test_fingerprint_names_what_decides_the_cpu_kernel_path():
    fp = fingerprint("cpu")
    assert fp["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert fp["threads"] == torch.get_num_threads()
    assert fp["mkldnn_bf16"] == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert set(fp["env"]) >= {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"}
    assert fp["onednn"] is None or fp["onednn"][0].isdigit()
    assert fingerprint("cuda")["device_type"] == "cuda"


def test_a_fingerprint_change_invalidates_the_cache(tmp_path, monkeypatch):
    fp = fingerprint("cpu")
    args, out = _conv_call(4)

    def session_for(fp_now):
        session = ProbeSession("cpu", cache=ProbeCache(fp_now, tmp_path))
        session.batch_size = 4
        value = session.peak(CONV, args, {}, out)
        session.flush()
        return session, value

    first, value = session_for(fp)
    assert (first.probed, first.from_cache) == (1, 0) and value > 0
    again, cached_value = session_for(dict(fp))
    assert (again.probed, again.from_cache, again.kernel_runs) == (0, 1, 0)
    assert cached_value == value
    other, _ = session_for({**fp, "threads": fp["threads"] + 7})
    assert (other.probed, other.from_cache) == (1, 0)
    assert len(list(tmp_path.glob("cpu-*.json"))) == 2
    # the environment variables that select the ISA are part of the fingerprint
    other_isa = "AVX512_CORE" if os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2" else "AVX2"  # a change, on any host
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", other_isa)
    assert ProbeCache(fingerprint("cpu"), tmp_path).path != ProbeCache(fp, tmp_path).path


def _write_keys(directory: str, fp: dict, worker: int, count: int) -> None:
    cache = ProbeCache(fp, directory)
    for index in range(count):
        cache.save({f"w{worker}-k{index}": {"points": [[1, worker], [2, index]]}})


def test_concurrent_writers_lose_no_key(tmp_path):
    fp = {"device_type": "cpu", "torch": "test"}
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_write_keys, args=(str(tmp_path), fp, worker, 15)) for worker in range(4)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
    assert all(process.exitcode == 0 for process in workers)
    path = ProbeCache(fp, tmp_path).path
    data = json.loads(path.read_text())  # valid JSON
    assert set(data["entries"]) == {f"w{w}-k{k}" for w in range(4) for k in range(15)}
    assert not list(tmp_path.glob("*.tmp"))


def test_a_corrupt_cache_file_is_ignored_with_a_warning_and_rewritten(tmp_path):
    fp = {"device_type": "cpu", "torch": "test"}
    cache = ProbeCache(fp, tmp_path)
    cache.path.parent.mkdir(parents=True, exist_ok=True)
    cache.path.write_text('{"version": 1, "entries": {"a": ')
    with pytest.warns(UserWarning, match=cache.path.name):
        assert cache.load() == {}
    with pytest.warns(UserWarning, match="corrupt"):
        cache.save({"b": {"points": [[1, 2]]}})
    assert json.loads(cache.path.read_text())["entries"] == {"b": {"points": [[1, 2]]}}


def test_points_are_merged_with_those_on_disk(tmp_path):
    fp = {"device_type": "cpu", "torch": "test"}
    ProbeCache(fp, tmp_path).save({"op": {"points": [[1, 10], [2, 20]]}})
    ProbeCache(fp, tmp_path).save({"op": {"points": [[4, 40]]}})
    assert ProbeCache(fp, tmp_path).load()["op"]["points"] == [[1, 10], [2, 20], [4, 40]]


def test_a_probe_matches_the_real_kernel_at_the_full_batch(tmp_path):
    args, out = _conv_call(16)
    with kernel_probes("cpu", cache=ProbeCache(fingerprint("cpu"), tmp_path)) as session, probe_batch(16):
        predicted = session.peak(CONV, args, {}, out)
    _, measured = kernel_peak(lambda: CONV(*args))
    assert session.kernel_runs >= 3  # n = 1, 2 and the check at 4
    assert abs(predicted - measured) <= 0.01 * measured
    assert predicted >= out.numel() * out.element_size()  # outputs included


def _synthetic(monkeypatch, bytes_at):
    calls = []

    def measure(self, func, args, kwargs, plan, n):
        calls.append(n)
        self.kernel_runs += 1
        return bytes_at(n)

    monkeypatch.setattr(ProbeSession, "_measure", measure)
    return calls


def test_a_linear_kernel_is_probed_at_one_two_and_four_only(monkeypatch, tmp_path):
    calls = _synthetic(monkeypatch, lambda n: 50_000 + 100_000 * n)
    args, out = _conv_call(32)
    session = ProbeSession("cpu", cache=ProbeCache({"device_type": "cpu", "t": 1}, tmp_path))
    session.batch_size = 32
    assert session.peak(CONV, args, {}, out) == 50_000 + 100_000 * 32
    assert sorted(calls) == [1, 2, 4]


def test_a_saturating_kernel_is_probed_at_doublings_and_interpolated(monkeypatch, tmp_path):
    # extra bytes grow until n = 3, then stay (blocking saturates): 1, 2 and 4 are not on one line
    calls = _synthetic(monkeypatch, lambda n: 100_000 * n + 1_000_000 * min(n, 3))
    args, out = _conv_call(32)
    cache = ProbeCache({"device_type": "cpu", "t": 2}, tmp_path)
    session = ProbeSession("cpu", cache=cache)
    session.batch_size = 32
    assert session.peak(CONV, args, {}, out) == 100_000 * 32 + 3_000_000
    assert sorted(calls) == [1, 2, 4, 8, 16, 32]
    # a batch between probed points of a non-linear kernel is probed itself
    args24, out24 = _conv_call(24)
    session.batch_size = 24
    assert session.peak(CONV, args24, {}, out24) == 100_000 * 24 + 3_000_000
    assert calls[6:] == [24]
    session.flush()
    stored = list(cache.load().values())[0]["points"]
    assert [n for n, _ in stored] == [1, 2, 4, 8, 16, 24, 32]  # the points, not just a fit


def test_interpolation_between_probed_points_when_the_batch_cannot_be_probed(monkeypatch, tmp_path):
    calls = _synthetic(monkeypatch, lambda n: 100_000 * n + 1_000_000 * min(n, 3))
    args, out = _conv_call(32)
    session = ProbeSession("cpu", cache=ProbeCache({"device_type": "cpu", "t": 5}, tmp_path))
    session.batch_size = 32
    session.peak(CONV, args, {}, out)
    args24, out24 = _conv_call(24)
    session.batch_size = 24
    session.cap = session._probe_bytes(args24, out24, session._plan(CONV, args24), 23)  # 24 is over the cap
    assert session.peak(CONV, args24, {}, out24) == 100_000 * 24 + 3_000_000  # the segment 16..32
    assert 24 not in calls
    assert any("interpolated or extrapolated" in note for note in session.notes())


def test_probes_over_the_memory_cap_are_refused_and_noted(tmp_path):
    args, out = _conv_call(8)
    settings = ProbeSettings(memory_cap_bytes=1024)
    with (
        kernel_probes("cpu", settings=settings, cache=ProbeCache({"device_type": "cpu", "t": 3}, tmp_path)) as session,
        probe_batch(8),
    ):
        assert session.peak(CONV, args, {}, out) is None
    assert session.kernel_runs == 0
    assert any("not probed" in note and "probe cap" in note and "aten.convolution" in note for note in session.notes())


def test_the_cap_counts_the_kernels_measured_peak_not_only_its_outputs(monkeypatch, tmp_path):
    # a kernel whose workspace is many times its output (a convolution's im2col columns): 1 MB per sample
    calls = _synthetic(monkeypatch, lambda n: 1_000_000 * n)
    args, out = _conv_call(32)
    inputs_and_outputs_at_4 = sum(t.numel() * t.element_size() for t in (args[0], args[1], out)) * 4 // 32
    session = ProbeSession("cpu", ProbeSettings(memory_cap_bytes=3_000_000), cache=False)
    session.batch_size = 32
    assert inputs_and_outputs_at_4 < session.cap  # the old check would have run n = 4
    assert session.peak(CONV, args, {}, out) == 32_000_000  # extrapolated along 1..2
    assert calls == [1, 2]  # n = 4 would take 4 MB: refused before it runs
    assert any("interpolated or extrapolated" in note and "probe cap" in note for note in session.notes())


def test_a_workspace_that_jumps_once_is_still_probed_up_to_the_batch(monkeypatch):
    # oneDNN's AVX2 convolution backward at 512 channels: 9 MB at one sample, 81 MB from two samples on. The cap
    # check scales the largest point in proportion (162 MB at four samples), not the jump's slope (225 MB): the
    # kernel is probed on and found flat, not extrapolated along the jump (2.2 GB at 32 samples).
    calls = _synthetic(monkeypatch, lambda n: 9_000_000 if n == 1 else 81_000_000)
    args, out = _conv_call(32)
    session = ProbeSession("cpu", ProbeSettings(memory_cap_bytes=240_000_000), cache=False)
    session.batch_size = 32
    assert session.peak(CONV, args, {}, out) == 81_000_000
    assert 4 in calls and max(calls) == 32
    assert not session.extrapolated


def test_probes_hand_freed_heap_pages_back():
    from nnmem_callbacks.probes.runner import release_freed_memory

    # glibc (the Linux hosts this runs on) has malloc_trim; elsewhere the call says there is nothing to do
    assert release_freed_memory() is (sys.platform.startswith("linux") and "glibc" in platform.libc_ver()[0])


def test_probing_stops_at_the_time_limit_with_a_warning(tmp_path):
    settings = ProbeSettings(time_limit_s=0.0)
    cache = ProbeCache({"device_type": "cpu", "t": 4}, tmp_path)
    with kernel_probes("cpu", settings=settings, cache=cache) as session, probe_batch(4):
        args, out = _conv_call(4)
        session.peak(CONV, args, {}, out)  # the first probe runs, then the limit is reached
        other, other_out = _conv_call(4, channels=4)
        assert session.peak(CONV, other, {}, other_out) is None
    assert any(note.startswith("warning: kernel probing stopped at its 0 s time limit") for note in session.notes())


def test_the_run_budget_counts_points_so_an_estimate_does_not_depend_on_the_cache(monkeypatch, tmp_path):
    # a saturating kernel takes 1, 2, 4, 8, 16, 32 at batch 32 and 1, 2, 4, 8 at batch 8
    _synthetic(monkeypatch, lambda n: 100_000 * n + 1_000_000 * min(n, 3))
    cache = ProbeCache({"device_type": "cpu", "t": 6}, tmp_path)
    args32, out32 = _conv_call(32)
    args8, out8 = _conv_call(8)
    other, other_out = _conv_call(8, channels=4)

    def estimate_at_8(budget: int) -> tuple[int | None, int | None, ProbeSession]:
        with kernel_probes("cpu", settings=ProbeSettings(kernel_runs=budget), cache=cache) as session:
            with probe_batch(8):
                return session.peak(CONV, args8, {}, out8), session.peak(CONV, other, {}, other_out), session

    cold_first, cold_other, cold = estimate_at_8(5)
    assert cold_first == 100_000 * 8 + 3_000_000 and cold.points_used == 5  # 1, 2, 4, 8, then 1 of the other
    assert cold_other is None  # the other shape's 2 and 4 are past the budget: its rule applies
    assert any("budget of 5 kernel runs" in note for note in cold.notes())
    with kernel_probes("cpu", cache=cache) as session, probe_batch(32):  # an estimate at 32 fills the cache further
        session.peak(CONV, args32, {}, out32)
    warm_first, warm_other, warm = estimate_at_8(5)
    assert (warm_first, warm_other, warm.points_used) == (cold_first, cold_other, 5)  # as with the emptier cache
    assert warm.kernel_runs == 0  # every point taken came from the cache


def test_a_point_two_batch_sizes_walk_through_counts_once(monkeypatch, tmp_path):
    # the main trace at 8 walks 1, 2, 4, 8; the trace at twice the batch walks 1, 2, 4, 8, 16 of the same op shape:
    # 5 distinct points, so a budget of 5 lets both be probed (counting every step of every walk would need 9)
    _synthetic(monkeypatch, lambda n: 100_000 * n + 1_000_000 * min(n, 3))
    cache = ProbeCache({"device_type": "cpu", "t": 7}, tmp_path)
    with kernel_probes("cpu", settings=ProbeSettings(kernel_runs=5), cache=cache) as session:
        (args8, out8), (args16, out16) = _conv_call(8), _conv_call(16)
        with probe_batch(8):
            at_8 = session.peak(CONV, args8, {}, out8)
        with probe_batch(16):
            at_16 = session.peak(CONV, args16, {}, out16)
    assert (at_8, at_16) == (100_000 * 8 + 3_000_000, 100_000 * 16 + 3_000_000)
    assert session.points_used == 5 and session.kernel_runs == 5
    assert not any("budget" in note for note in session.notes())


def test_probe_settings_refuse_what_is_not_a_budget():
    with pytest.raises(ValueError, match="kernel_runs must be an int >= 0"):
        ProbeSettings(kernel_runs=-1)
    with pytest.raises(ValueError, match="kernel_runs must be an int >= 0"):
        ProbeSettings(kernel_runs=2.5)
    with pytest.raises(ValueError, match="time_limit_s must be a number of seconds >= 0"):
        ProbeSettings(time_limit_s=float("nan"))


def test_estimate_training_takes_probe_settings(cache_env):
    model, batch = _small_cnn(), torch.zeros(8, 3, 16, 16)
    none = estimate_training(model, batch, optimizer="sgd", probe_kernels=ProbeSettings(kernel_runs=0))
    assert none.extra["kernel_probes"]["kernel_runs"] == 0
    assert any("budget of 0 kernel runs per estimate was spent" in note for note in none.notes)
    assert none.peak_bytes == estimate_training(model, batch, optimizer="sgd", probe_kernels=False).peak_bytes
    with pytest.raises(
        ValueError, match=r"probe_kernels must be True \(.*\), False \(.*\) or a .*ProbeSettings.*got 'yes'"
    ):
        estimate_training(model, batch, optimizer="sgd", probe_kernels="yes")


def test_probe_kernels_false_uses_the_rules_and_says_so(cache_env):
    model, batch = _small_cnn(), torch.zeros(8, 3, 16, 16)
    probed = estimate_training(model, batch, optimizer="sgd")
    ruled = estimate_training(model, batch, optimizer="sgd", probe_kernels=False)
    assert any(note.startswith("kernel workspaces from rules, not probed: probe_kernels=False") for note in ruled.notes)
    assert not any("not probed" in note for note in probed.notes)
    assert any("kernel workspaces probed" in note for note in probed.notes)
    assert ruled.extra["kernel_probes"]["kernel_runs"] == 0
    assert probed.extra["kernel_probes"]["probed"] > 0


def test_a_warm_cache_probes_nothing(cache_env, monkeypatch):
    model, batch = _small_cnn(), torch.zeros(8, 3, 16, 16)
    cold = estimate_training(model, batch, optimizer="adam")
    assert cold.extra["kernel_probes"]["probed"] > 0
    runs = []
    original = ProbeSession._measure
    monkeypatch.setattr(ProbeSession, "_measure", lambda self, *a: runs.append(a) or original(self, *a))
    warm = estimate_training(model, batch, optimizer="adam")
    assert runs == []
    assert warm.extra["kernel_probes"]["probed"] == 0
    assert warm.extra["kernel_probes"]["from_cache"] == cold.extra["kernel_probes"]["probed"]
    assert warm.peak_bytes == cold.peak_bytes
    assert list(cache_env.glob("cpu-*.json"))


def test_a_failed_probe_falls_back_to_the_rule_with_a_note(cache_env, monkeypatch):
    def fail(self, *args):
        raise RuntimeError("shape '[3, 4]' is invalid for input of size 5")

    monkeypatch.setattr(ProbeSession, "_measure", fail)
    estimate = estimate_training(_small_cnn(), torch.zeros(4, 3, 16, 16), optimizer="sgd")
    assert estimate.method == "trace"
    assert any("not probed: the probe of aten.convolution failed" in note for note in estimate.warnings)


def test_a_cache_that_cannot_be_written_is_a_warning_and_the_estimate_stands(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("NNMEM_CACHE_DIR", str(blocker / "cache"))  # mkdir under a file fails
    estimate = estimate_training(_small_cnn(), torch.zeros(4, 3, 16, 16), optimizer="sgd")
    assert estimate.method == "trace" and estimate.extra["kernel_probes"]["probed"] > 0
    assert any(note.startswith("warning: the kernel probe cache was not updated") for note in estimate.warnings)


def test_a_profiler_that_blocks_the_probes_is_a_warning_but_probe_kernels_false_is_not(cache_env, monkeypatch):
    from nnmem_callbacks.probes.runner import ProfilerBusy

    def busy(self, *args):
        raise ProfilerBusy("the user's profiler is running")

    model, batch = _small_cnn(), torch.zeros(4, 3, 16, 16)
    assert not estimate_training(model, batch, optimizer="sgd", probe_kernels=False).warnings
    monkeypatch.setattr(ProbeSession, "_measure", busy)
    blocked = estimate_training(model, batch, optimizer="sgd")
    assert any("not probed: another profiler is running" in note for note in blocked.warnings)


def test_a_kernel_the_device_cannot_run_is_an_error_not_an_estimate(cache_env, monkeypatch):
    def unsupported(self, *args):
        raise RuntimeError("could not create a primitive descriptor for the convolution forward propagation primitive")

    monkeypatch.setattr(ProbeSession, "_measure", unsupported)
    with pytest.raises(UnsupportedKernelError, match=r"aten\.convolution.*cpu.*precision='32-true'") as error:
        estimate_training(_small_cnn(), torch.zeros(4, 3, 16, 16), optimizer="sgd")
    assert error.value.op == "aten.convolution" and error.value.dtype == torch.float32


class _Lstm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 32, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


@pytest.mark.skipif(torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU runs oneDNN's bf16 LSTM")
def test_bf16_lstm_on_a_cpu_without_bf16_support_is_refused(cache_env):
    model, batch = _Lstm(), torch.zeros(4, 10, 16)
    with pytest.raises(RuntimeError, match="primitive"):  # the real step fails ...
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(batch).sum().backward()
    with pytest.raises(
        UnsupportedKernelError, match=r"mkldnn_rnn_layer in bfloat16.*fp32"
    ):  # ... and so does the estimate
        estimate_training(model, batch, optimizer="adam", precision="bf16-mixed")
    # fp32 runs, and its oneDNN RNN probes are cached too
    cold = estimate_training(model, batch, optimizer="adam")
    warm = estimate_training(model, batch, optimizer="adam")
    assert cold.extra["kernel_probes"]["probed"] >= 1
    assert warm.extra["kernel_probes"]["probed"] == 0 and warm.extra["kernel_probes"]["from_cache"] >= 1
    assert warm.peak_bytes == cold.peak_bytes


def test_probes_leave_the_model_the_rng_and_the_optimizer_untouched(cache_env):
    model = _small_cnn()
    optimizer = torch.optim.Adam(model.parameters())
    params = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    rng = torch.get_rng_state()
    estimate = estimate_training(model, torch.zeros(8, 3, 16, 16), optimizer=optimizer)
    assert estimate.extra["kernel_probes"]["probed"] > 0  # the probes did run (cold cache)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(params[name], tensor) for name, tensor in model.state_dict().items())
    assert optimizer.state_dict()["state"] == {}


def test_isolated_restores_the_cpu_rng_even_if_a_kernel_draws_from_it():
    from nnmem_callbacks.probes.runner import isolated

    rng = torch.get_rng_state()
    with isolated():
        torch.rand(10)
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize(
    "x_shape, w_shape, transposed",
    [((6, 4, 40), (8, 4, 3), False), ((6, 4, 6, 6, 6), (8, 4, 3, 3, 3), False), ((6, 4, 9, 9), (4, 8, 3, 3), True)],
    ids=["conv1d", "conv3d", "conv_transpose2d"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convolution_probes_of_every_rank_match_the_real_kernel(tmp_path, x_shape, w_shape, transposed, dtype):
    dims = len(x_shape) - 2
    x, w = torch.zeros(x_shape, dtype=dtype), torch.zeros(w_shape, dtype=dtype)
    args = (x, w, None, [1] * dims, [1] * dims, [1] * dims, transposed, [0] * dims, 1)
    out = CONV(*args)
    grad = torch.zeros_like(out)
    backward = aten.convolution_backward.default
    bargs = (grad, x, w, None, [1] * dims, [1] * dims, [1] * dims, transposed, [0] * dims, 1, [True, True, False])
    with kernel_probes("cpu", cache=ProbeCache(fingerprint("cpu"), tmp_path)) as session, probe_batch(6):
        forward_probe = session.peak(CONV, args, {}, out)
        backward_probe = session.peak(backward, bargs, {}, backward(*bargs))
    _, forward_real = kernel_peak(lambda: CONV(*args))
    _, backward_real = kernel_peak(lambda: backward(*bargs))
    assert abs(forward_probe - forward_real) <= 0.01 * forward_real
    assert abs(backward_probe - backward_real) <= 0.01 * backward_real
    assert session.probed == 2
