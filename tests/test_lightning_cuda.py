"""CUDA paths of the Lightning callback: with fakes everywhere, and for real where a GPU exists."""

from __future__ import annotations

import os
import sys
import types
import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

sys.path.insert(0, os.path.dirname(__file__))
from _lightning_models import MLP, DataModule, trainer_kwargs  # noqa: E402

from nnmem_callbacks.adapters.lightning.planning import device_budget, includes_reserve  # noqa: E402
from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine  # noqa: E402
from nnmem_callbacks.hardware import devices  # noqa: E402
from nnmem_callbacks.lightning import MemoryBudgetCallback  # noqa: E402
from nnmem_callbacks.monitoring import meters as monitor  # noqa: E402

MiB = 2**20
GiB = 2**30


class FakeCuda:
    """Stands in for the torch.cuda memory functions; tests drive ``allocated``."""

    def __init__(self):
        self.allocated = 100 * MiB
        self.peak = self.allocated
        self.reserved_peak = 128 * MiB
        self.resets = 0
        self.total, self.free = 16 * GiB, 12 * GiB

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: self.reserved_peak)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 256 * MiB)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (self.free, self.total))

    def reset(self, device=None):
        self.resets += 1
        self.peak = self.allocated

    def touch(self, extra):
        self.peak = max(self.peak, self.allocated + extra)


class RecordingLogger:
    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step=None):
        self.calls.append((dict(metrics), step))


def fake_trainer(logger):
    strategy = types.SimpleNamespace(root_device=torch.device("cuda", 0), reduce=lambda t, reduce_op=None: t)
    return types.SimpleNamespace(
        strategy=strategy,
        loggers=[logger],
        global_step=7,
        current_epoch=0,
        world_size=1,
        is_global_zero=True,
        global_rank=0,
    )


def cuda_estimate():
    return MemoryEstimate(
        peak_bytes=400 * MiB,
        breakdown={"parameters": 100 * MiB, "activations": 300 * MiB},
        batch_size=32,
        phases=(PhaseLine("step1/backward", 100 * MiB, 300 * MiB // 32),),
        peak_phase="step1/backward",
        reserved_bytes=480 * MiB,
        overhead_bytes=500 * MiB,
        device="cuda:0",
    )


def test_peak_meter_reads_cuda_stats(monkeypatch):
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    meter = monitor.CudaMeter(torch.device("cuda", 0))
    meter.reset()
    cuda.touch(50 * MiB)
    reading = meter.read()
    assert cuda.resets == 1
    assert reading.kind == "cuda" and reading.peak_bytes == 150 * MiB
    assert reading.reserved_bytes == 128 * MiB and reading.device_used_bytes == 4 * GiB
    assert devices.device_capacity("cuda:0") == (16 * GiB, 12 * GiB)


def test_epoch_measurement_logs_cuda_series_and_warns_on_miss(monkeypatch):
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    callback = MemoryBudgetCallback(budget="8GiB")
    callback._device_kind = "cuda"
    callback.estimate = cuda_estimate()
    callback._train_batch_size = 32

    callback.on_train_epoch_start(trainer, None)
    callback.on_train_batch_start(trainer, None, None, 0)
    cuda.touch(200 * MiB)  # forward
    callback.on_before_backward(trainer, None, None)
    cuda.touch(450 * MiB)  # backward: 550 MiB > 400 MiB * 1.1
    callback.on_after_backward(trainer, None)
    callback.on_before_optimizer_step(trainer, None, None)
    callback.on_train_batch_end(trainer, None, None, None, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback.on_train_epoch_end(trainer, None)

    ((metrics, step),) = logger.calls
    assert step == 7
    assert metrics["memory/measured_peak_mib"] == 550
    assert metrics["memory/predicted_peak_mib"] == 400
    assert metrics["memory/relative_error"] == pytest.approx((400 - 550) / 550)  # (predicted - measured) / measured
    assert metrics["memory/predicted_reserved_mib"] == 480 and metrics["memory/measured_reserved_mib"] == 128
    assert metrics["memory/predicted_device_mib"] == 980 and metrics["memory/measured_device_used_mib"] == 4096
    assert cuda.resets >= 5  # one per phase boundary
    missed = [str(w.message) for w in caught if "the estimate missed" in str(w.message)]
    assert len(missed) == 1 and "'backward' phase" in missed[0] and "max_memory_allocated" in missed[0]


def test_cuda_budget_counts_memory_the_process_already_holds(monkeypatch):
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    device, estimate = torch.device("cuda", 0), cuda_estimate()
    budget = device_budget(estimate, device=device, device_kind="cuda", resident_bytes=0, budget=None, margin=0.1)
    assert includes_reserve(estimate, "cuda")
    assert budget == int((12 * GiB + 256 * MiB + 500 * MiB) * 0.9)
    half = device_budget(estimate, device=device, device_kind="cuda", resident_bytes=0, budget=0.5, margin=0.05)
    assert half == 8 * GiB


def test_cuda_oom_diagnosis_from_fakes(monkeypatch):
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    trainer = fake_trainer(RecordingLogger())
    callback = MemoryBudgetCallback(budget="8GiB")
    callback._device_kind = "cuda"
    callback.estimate = cuda_estimate()
    callback._train_batch_size = 32
    from nnmem_callbacks.core.plan import make_plan

    callback.plan = make_plan(callback.estimate, 8 * GiB)
    callback.on_train_epoch_start(trainer, None)
    callback.on_train_batch_start(trainer, None, None, 0)
    cuda.touch(3 * GiB)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        callback.on_exception(trainer, None, torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    text = callback.last_diagnosis
    assert "CUDA out of memory during the 'forward' phase" in text
    assert "Predicted peak 400.00 MiB" in text and "Measured peak before the failure: 3.10 GiB" in text
    assert "memory outside the estimate" in text


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_cuda_prediction_is_close(tmp_path):
    callback = MemoryBudgetCallback(budget=0.9)
    trainer = pl.Trainer(
        **trainer_kwargs(tmp_path, accelerator="cuda", max_epochs=2, limit_train_batches=8), callbacks=[callback]
    )
    trainer.fit(MLP(hidden=1024), datamodule=DataModule(batch_size=256))
    row = callback.measurements[-1]
    assert row["kind"] == "cuda"
    assert abs(row["relative_error"]) < 0.25, row
