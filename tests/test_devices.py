"""Device capacity and measured peaks (CPU for real; CUDA fakes live in test_lightning_cuda.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nnmem_callbacks import devices

MiB = 2**20


def test_import_is_framework_free():
    code = "import sys, nnmem_callbacks.devices; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("device, kind", [("cuda:1", "cuda"), ("cpu", "cpu"), (None, "cpu"), ("mps", "mps")])
def test_device_type(device, kind):
    assert devices.device_type(device) == kind


def test_cpu_capacity_is_host_memory():
    import psutil

    total, free = devices.device_capacity("cpu")
    assert total == psutil.virtual_memory().total and 0 < free <= total


@pytest.mark.skipif(not devices.clear_refs_writable(), reason="needs a writable /proc/self/clear_refs (Linux)")
def test_rss_peak_resets_per_interval():
    np = pytest.importorskip("numpy")
    meter = devices.PeakMeter("cpu")
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
    meter = devices.PeakMeter("cpu")
    meter.reset()
    assert meter.exact is False
    block = np.ones(64 * MiB // 8)
    meter.sample()
    del block
    reading = meter.read()
    assert reading.exact is False and reading.peak_bytes >= reading.current_bytes + 50 * MiB


def test_status_field_parsing(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n")
    assert devices.read_status_bytes("VmHWM", str(status)) == 2 * MiB
    assert devices.read_status_bytes("VmRSS", str(status)) == MiB
    assert devices.read_status_bytes("VmSwap", str(status)) is None
    assert devices.read_status_bytes("VmHWM", str(tmp_path / "nope")) is None


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
    assert devices.is_out_of_memory(exception) == kind


def test_torch_oom_error_class():
    torch = pytest.importorskip("torch")
    assert devices.is_out_of_memory(torch.cuda.OutOfMemoryError("whatever")) == "cuda"
