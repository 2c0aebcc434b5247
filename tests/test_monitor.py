"""Meters, metric names and the out-of-memory classification shared by both callbacks (CPU for real; CUDA fakes live
in test_lightning_cuda.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nnmem_callbacks.hardware import devices
from nnmem_callbacks.monitoring import meters as monitor
from nnmem_callbacks.monitoring import oom

MiB = 2**20


def test_import_is_framework_free():
    code = (
        "import sys, nnmem_callbacks.monitoring.meters, nnmem_callbacks.monitoring.oom, "
        "nnmem_callbacks.monitoring.tensorboard; assert not {'torch', 'tensorflow', 'jax', 'keras'} & set(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.skipif(not devices.clear_refs_writable(), reason="needs a writable /proc/self/clear_refs (Linux)")
def test_rss_peak_resets_per_interval():
    np = pytest.importorskip("numpy")
    meter = monitor.RssMeter()
    meter.reset()
    start = meter.read()
    block = np.ones(96 * MiB // 8)  # touch 96 MiB
    del block
    first = meter.read()
    assert first.exact and first.peak_bytes - start.current_bytes >= 90 * MiB
    assert first.current_bytes < first.peak_bytes - 50 * MiB  # freed again
    meter.reset()
    second = meter.read()
    assert second.peak_bytes < first.peak_bytes - 50 * MiB  # the peak was reset


def test_rss_fallback_without_clear_refs(monkeypatch, tmp_path):
    np = pytest.importorskip("numpy")
    monkeypatch.setattr(devices, "_CLEAR_REFS_PATH", str(tmp_path / "missing" / "clear_refs"))
    monkeypatch.setattr(devices.reset_rss_peak, "__defaults__", (str(tmp_path / "missing" / "clear_refs"),))
    meter = monitor.RssMeter()
    meter.reset()
    assert meter.exact is False
    block = np.ones(64 * MiB // 8)
    meter.sample()
    del block
    reading = meter.read()
    assert reading.exact is False and reading.peak_bytes >= reading.current_bytes + 50 * MiB


@pytest.mark.parametrize(
    "exception, kind",
    [
        (MemoryError(), "cpu"),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:116] DefaultCPUAllocator: can't allocate memory"), "cpu"),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "cuda"),
        (RuntimeError("CUDA error: out of memory"), "cuda"),
        (RuntimeError("HIP out of memory"), "cuda"),
        (RuntimeError("shape mismatch"), None),
        (ValueError("out of range"), None),
    ],
)
def test_out_of_memory_classification(exception, kind):
    assert oom.is_out_of_memory(exception) == kind


def test_torch_oom_error_class():
    torch = pytest.importorskip("torch")
    assert oom.is_out_of_memory(torch.cuda.OutOfMemoryError("whatever")) == "cuda"


class FakeJaxDevice:
    """A device whose memory_stats() behave like JAX's: a process-wide peak that never resets."""

    def __init__(self, in_use: int = 0, peak: int = 0) -> None:
        self.in_use, self.peak = in_use, peak

    def use(self, nbytes: int) -> None:
        self.in_use += nbytes
        self.peak = max(self.peak, self.in_use)

    def memory_stats(self) -> dict[str, int]:
        return {"bytes_in_use": self.in_use, "peak_bytes_in_use": self.peak, "bytes_limit": 16 * 1024 * MiB}


def test_jax_meter_never_reports_an_earlier_models_peak():
    device = FakeJaxDevice(in_use=100 * MiB, peak=900 * MiB)  # an earlier model peaked at 900 MiB
    meter = monitor.JaxMeter(device, sample_interval_s=None)  # samples only where the test says
    meter.start()
    meter.reset()  # epoch 0
    device.use(50 * MiB)
    meter.sample()
    device.use(-50 * MiB)
    first = meter.read()
    assert not first.exact and first.peak_bytes == 150 * MiB  # the sampled floor, not 900 MiB
    meter.reset()  # epoch 1: the process peak does not rise: still the floor
    device.use(20 * MiB)
    meter.sample()
    assert meter.read().peak_bytes == 120 * MiB


def test_jax_meter_samples_in_the_background_while_a_step_holds_its_buffers():
    import time

    device = FakeJaxDevice(in_use=100 * MiB, peak=900 * MiB)  # autotuning left the process peak at 900 MiB
    meter = monitor.JaxMeter(device, sample_interval_s=0.001)
    meter.start()
    try:
        meter.reset()
        device.use(300 * MiB)  # a step's temporary buffer, held while the step runs; no sample() call
        seen = meter.samples
        deadline = time.monotonic() + 30
        while meter.samples < seen + 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        device.use(-300 * MiB)  # the step ends: between steps only the state is in use
        reading = meter.read()
        assert meter.samples >= seen + 3
        assert not reading.exact and reading.peak_bytes == 400 * MiB  # the step's, not the state's, not 900 MiB
    finally:
        meter.close()
    stopped = meter.samples
    time.sleep(0.05)
    assert meter.samples <= stopped + 1  # close() stops the sampler


def test_jax_meter_sampler_stops_when_the_loop_goes_quiet_and_restarts_on_the_next_batch():
    import time

    device = FakeJaxDevice(in_use=100 * MiB, peak=100 * MiB)
    meter = monitor.JaxMeter(device, sample_interval_s=0.001, idle_stop_s=0.05)
    meter.start()
    try:
        assert meter.sampling
        deadline = time.monotonic() + 30  # a fit that raised: no batch end, no on_train_end
        while meter.sampling and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not meter.sampling
        stopped = meter.samples
        time.sleep(0.1)
        assert meter.samples == stopped  # no polling of the device once stopped
        meter.sample()  # the loop is back (a batch end)
        assert meter.sampling
    finally:
        meter.close()
    assert not meter.sampling


def test_jax_meter_separates_compilation_from_the_training_peak():
    device = FakeJaxDevice(in_use=10 * MiB, peak=10 * MiB)
    meter = monitor.JaxMeter(device, sample_interval_s=None)  # samples only where the test says
    meter.start()
    meter.reset()  # epoch 0 holds the compilation
    device.use(500 * MiB)  # autotuning scratch at compile time
    device.use(-500 * MiB)
    device.use(40 * MiB)  # the training step
    meter.sample()
    first = meter.read()
    assert not first.exact and first.peak_bytes == 50 * MiB  # the 510 MiB compile peak is not reported
    device.use(-40 * MiB)
    meter.reset()  # epoch 1: a larger step sets the process peak: exact
    device.use(600 * MiB)
    device.use(-600 * MiB)
    second = meter.read()
    assert second.exact and second.peak_bytes == 610 * MiB


def test_metric_names_say_what_is_compared():
    rss, cuda = monitor.metric_names(monitor.RssMeter()), monitor.metric_names(monitor.CudaMeter())
    assert "rss" in rss.measured and "rss" in rss.predicted and "rss" in rss.relative_error
    assert rss.predicted_peak == cuda.predicted_peak == "memory_predicted_peak_mib"
    assert cuda.measured == "memory_measured_peak_mib"
    assert cuda.for_lightning().relative_error == "memory/relative_error"
    assert monitor.predicted_rss_rise(300, 100) == 200
