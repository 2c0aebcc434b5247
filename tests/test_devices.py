"""Device capacity and the operating system's figures (meters are tested in test_monitor.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nnmem_callbacks.hardware import devices

MiB = 2**20


def test_import_is_framework_free():
    code = "import sys, nnmem_callbacks.hardware.devices; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("device, kind", [("cuda:1", "cuda"), ("cpu", "cpu"), (None, "cpu"), ("mps", "mps")])
def test_device_type(device, kind):
    assert devices.device_type(device) == kind


def test_cpu_capacity_is_host_memory():
    import psutil

    total, free = devices.device_capacity("cpu")
    assert total == psutil.virtual_memory().total and 0 < free <= total


def test_status_field_parsing(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n")
    assert devices.read_status_bytes("VmHWM", str(status)) == 2 * MiB
    assert devices.read_status_bytes("VmRSS", str(status)) == MiB
    assert devices.read_status_bytes("VmSwap", str(status)) is None
    assert devices.read_status_bytes("VmHWM", str(tmp_path / "nope")) is None
