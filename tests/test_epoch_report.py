"""The shared measuring pieces both callbacks call: phase tracking, the epoch comparison, the miss warning and the
out-of-memory diagnosis. Framework-free: a scripted meter stands in for the runtime."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
from nnmem_callbacks.core.plan import make_plan
from nnmem_callbacks.monitoring import epoch_comparison as epoch_report
from nnmem_callbacks.monitoring import meters as monitor
from nnmem_callbacks.monitoring import oom
from nnmem_callbacks.monitoring import tensorboard as tensorboard_report
from nnmem_callbacks.monitoring.meters import Meter, PeakReading
from nnmem_callbacks.monitoring.phase_tracking import BETWEEN_STEPS, PhaseTracker
from nnmem_callbacks.monitoring.step_sampling import TensorPeakMeter

MiB = 2**20


class ScriptedMeter(Meter):
    """A resettable allocator whose use the test drives; counts the calls the tracker makes."""

    kind = "cuda"
    source = "scripted allocator"

    def __init__(self, process_level=False):
        super().__init__()
        self.process_level = process_level
        self.kind = "rss" if process_level else "cuda"
        self.current = self.peak = 100 * MiB
        self.reads = self.resets = self.samples = 0
        self.fail_reads = False

    def use(self, delta):
        self.current += delta
        self.peak = max(self.peak, self.current)

    def reset(self):
        self.resets += 1
        self.peak = self.current

    def sample(self):
        self.samples += 1

    def read(self):
        self.reads += 1
        if self.fail_reads:
            raise RuntimeError("driver gone")
        return PeakReading(
            kind=self.kind,
            peak_bytes=self.peak,
            current_bytes=self.current,
            reserved_bytes=self.peak + 10 * MiB,
            device_used_bytes=self.peak + 500 * MiB,
        )


def step(tracker, meter, forward, backward_transient):
    tracker.enter("forward")
    meter.use(forward)
    tracker.enter("backward")
    meter.use(backward_transient)
    meter.use(-backward_transient - forward)
    tracker.enter("optimizer")
    meter.use(5 * MiB)
    meter.use(-5 * MiB)
    tracker.end_batch()


# -- phase tracking ----------------------------------------------------------------
def test_phase_tracker_books_peaks_and_rises_per_phase():
    meter = ScriptedMeter()
    tracker = PhaseTracker()
    tracker.start_epoch(meter)
    step(tracker, meter, 40 * MiB, 200 * MiB)
    assert tracker.peaks == {
        BETWEEN_STEPS: 100 * MiB,
        "forward": 140 * MiB,
        "backward": 340 * MiB,
        "optimizer": 105 * MiB,
    }
    # the backward rise is measured from where backward began (140 MiB), not from the epoch start
    assert tracker.rises == {BETWEEN_STEPS: 0, "forward": 40 * MiB, "backward": 200 * MiB, "optimizer": 5 * MiB}
    assert tracker.largest_rise_phase() == "backward"
    assert tracker.peak_bytes(tracker.finish_epoch()) == 340 * MiB
    assert tracker.batches == 1 and tracker.phase == BETWEEN_STEPS


def test_phase_tracker_stops_reading_after_the_tracked_batches_and_samples_instead():
    meter = ScriptedMeter()
    tracker = PhaseTracker(tracked_batches=2)
    tracker.start_epoch(meter)
    for _ in range(2):
        step(tracker, meter, 10 * MiB, 20 * MiB)
    reads, resets = meter.reads, meter.resets
    assert meter.samples == 0
    step(tracker, meter, 300 * MiB, 20 * MiB)  # untracked: no read or reset at its boundaries
    assert (meter.reads, meter.resets) == (reads, resets) and meter.samples == 1
    assert tracker.phase == BETWEEN_STEPS and max(tracker.peaks.values()) < 300 * MiB
    # the epoch end books what the meter saw since the last reset, under the phase the step is in
    reading = tracker.finish_epoch()
    assert tracker.peak_bytes(reading) == 420 * MiB == tracker.peaks[BETWEEN_STEPS]


def test_phase_tracker_starts_each_epoch_with_clean_books():
    meter = ScriptedMeter()
    tracker = PhaseTracker(tracked_batches=1)
    tracker.start_epoch(meter)
    step(tracker, meter, 10 * MiB, 500 * MiB)
    step(tracker, meter, 10 * MiB, 500 * MiB)
    tracker.start_epoch(meter)
    assert tracker.peaks == {} and tracker.rises == {} and tracker.batches == 0
    step(tracker, meter, 10 * MiB, 20 * MiB)
    assert tracker.peaks["backward"] == 130 * MiB


def test_phase_tracker_without_meter_only_follows_the_phase():
    tracker = PhaseTracker()
    tracker.enter("backward")
    assert tracker.phase == "backward" and tracker.read() is None and tracker.peaks == {}
    tracker.end_batch()
    assert tracker.phase == BETWEEN_STEPS


def test_phase_tracker_guard_catches_meter_failures_and_the_phase_still_advances():
    failures = []

    def guard(function, what):
        try:
            return function()
        except RuntimeError:
            failures.append(what)
            return None

    meter = ScriptedMeter()
    tracker = PhaseTracker(guard=guard)
    tracker.start_epoch(meter)
    meter.fail_reads = True
    tracker.enter("forward")
    assert tracker.phase == "forward" and tracker.peaks == {}
    assert failures == ["reading the memory peak"]
    assert tracker.finish_epoch() is None
    with pytest.raises(RuntimeError, match="driver gone"):  # without a guard, failures propagate
        PhaseTracker(meter).enter("forward")


def test_phase_tracker_rejects_a_bad_batch_count():
    with pytest.raises(ValueError, match="tracked_batches"):
        PhaseTracker(tracked_batches=-1)


# -- epoch comparison ------------------------------------------------------------------
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


def test_keras_comparison_logs_the_comparison_keys_only_and_nan_when_unmeasured():
    meter = ScriptedMeter()
    names = monitor.metric_names(meter)
    kwargs = dict(names=names, predicted_bytes=400 * MiB, predicted_peak_bytes=400 * MiB, budget_bytes=2048 * MiB)
    measured = epoch_report.compare_epoch(meter, meter.read(), epoch=0, **kwargs)
    unmeasured = epoch_report.compare_epoch(meter, None, epoch=1, **kwargs)
    expected = {names.measured, names.predicted_peak, names.predicted, names.relative_error, names.budget}
    assert set(measured.metrics) == set(unmeasured.metrics) == expected  # every key, every epoch
    assert measured.metrics[names.relative_error] == pytest.approx(
        (400 - 100) / 100
    )  # (predicted - measured) / measured
    assert math.isnan(unmeasured.metrics[names.measured]) and math.isnan(unmeasured.metrics[names.relative_error])
    assert unmeasured.row == {
        "epoch": 1,
        "kind": "cuda",
        "measured_bytes": None,
        "exact": False,
        "predicted_bytes": 400 * MiB,
        "relative_error": unmeasured.row["relative_error"],
    }
    assert set(measured.row) == {"epoch", "kind", "measured_bytes", "exact", "predicted_bytes", "relative_error"}


def test_without_prediction_only_the_measurement_is_logged():
    meter = ScriptedMeter()
    names = monitor.metric_names(meter)
    done = epoch_report.compare_epoch(meter, meter.read(), epoch=0, names=names)
    assert done.metrics == {names.measured: 100.0} and "predicted_bytes" not in done.row
    assert not epoch_report.missed(done)


def test_process_rss_is_compared_as_its_rise_above_the_baseline():
    meter = ScriptedMeter(process_level=True)
    names = monitor.metric_names(meter)
    reading = PeakReading(kind="rss", peak_bytes=900 * MiB, current_bytes=800 * MiB)
    done = epoch_report.compare_epoch(
        meter,
        reading,
        epoch=0,
        names=names,
        baseline_bytes=1000 * MiB,
        predicted_bytes=50 * MiB,
        predicted_peak_bytes=300 * MiB,
    )
    assert done.measured_bytes == 0  # below the baseline: no rise, never negative
    assert done.metrics[names.predicted_peak] == 300 and done.metrics[names.predicted] == 50
    assert names.predicted_peak != names.predicted  # the tensor peak is logged beside the compared rise


@pytest.mark.parametrize("kind", ["cuda", "cpu"], ids=["allocator", "process-rss"])  # "cuda" would skip (conftest)
def test_lightning_details_log_every_series_the_tensorboard_layout_charts(kind):
    meter = ScriptedMeter(process_level=kind == "cpu")
    estimate = cuda_estimate()
    done = epoch_report.compare_epoch(
        meter,
        meter.read(),
        epoch=0,
        names=monitor.metric_names(meter).for_lightning(),
        baseline_bytes=50 * MiB,
        predicted_bytes=400 * MiB,
        predicted_peak_bytes=400 * MiB,
        budget_bytes=1024 * MiB,
        phase_peaks={"forward": 1},
        phase_rises={"forward": 1},
        predicted_reserved_bytes=estimate.reserved_bytes_at(32),
        predicted_device_bytes=estimate.device_bytes_at(32),
        details=True,
    )
    if kind == "cpu":  # the sampled step's tensor peak is compared; the RSS rise is kept beside it
        tensors = TensorPeakMeter(90 * MiB)
        compared = epoch_report.compare_epoch(
            tensors,
            tensors.read(),
            epoch=0,
            names=monitor.metric_names(tensors).for_lightning(),
            predicted_bytes=100 * MiB,
            predicted_peak_bytes=100 * MiB,
            budget_bytes=1024 * MiB,
            details=True,
            phase_peaks=done.phase_peaks,
            phase_rises=done.phase_rises,
        )
        done = epoch_report.beside(compared, done)
        assert done.row["relative_error"] == pytest.approx(10 / 90) and done.row["rss_rise_bytes"] == 50 * MiB
    layout = tensorboard_report.custom_scalars_layout(kind)
    charted = {tag for chart in layout["memory"].values() for tag in chart[1]}
    assert charted <= set(done.metrics), charted - set(done.metrics)
    assert done.row["phase_peaks"] == {"forward": 1}
    assert done.row["measured_peak_bytes"] == (90 if kind == "cpu" else 100) * MiB
    if kind == "cuda":
        assert done.metrics[tensorboard_report.MEASURED_RESERVED] == 110
        assert done.metrics[tensorboard_report.PREDICTED_DEVICE] == estimate.device_bytes_at(32) / MiB
        assert done.row["measured_device_used_bytes"] == 600 * MiB
    else:
        assert tensorboard_report.MEASURED_RESERVED not in done.metrics  # no allocator reserve for RSS


def test_metric_names_agree_with_the_tensorboard_constants():
    names = monitor.metric_names(monitor.CudaMeter()).for_lightning()
    assert (names.predicted_peak, names.measured, names.relative_error, names.budget) == (
        tensorboard_report.PREDICTED_PEAK,
        tensorboard_report.MEASURED_PEAK,
        tensorboard_report.RELATIVE_ERROR,
        tensorboard_report.BUDGET,
    )
    assert (
        names.predicted_tensor_peak,
        names.predicted_reserved,
        names.measured_reserved,
        names.predicted_device,
        names.measured_device,
    ) == (
        tensorboard_report.PREDICTED_TENSOR_PEAK,
        tensorboard_report.PREDICTED_RESERVED,
        tensorboard_report.MEASURED_RESERVED,
        tensorboard_report.PREDICTED_DEVICE,
        tensorboard_report.MEASURED_DEVICE,
    )


# -- miss warning -------------------------------------------------------------------------
def compared(meter, peak, predicted, baseline=0, rises=None, peaks=None):
    return epoch_report.compare_epoch(
        meter,
        PeakReading(kind=meter.kind, peak_bytes=peak),
        epoch=3,
        names=monitor.metric_names(meter),
        baseline_bytes=baseline,
        predicted_bytes=predicted,
        predicted_peak_bytes=predicted,
        phase_rises=rises,
        phase_peaks=peaks,
        details=True,
    )


def test_miss_is_beyond_the_tolerance_of_the_prediction():
    meter = ScriptedMeter()
    assert not epoch_report.missed(compared(meter, 110 * MiB, 100 * MiB))
    assert epoch_report.missed(compared(meter, 110 * MiB + 1, 100 * MiB))
    assert not epoch_report.missed(compared(meter, 120 * MiB, 100 * MiB), tolerance=0.25)


def test_rss_miss_tolerates_a_tenth_of_the_fit_start_rss():
    meter = ScriptedMeter(process_level=True)
    # a rise of 150 MiB over a 100 MiB prediction, in a process that held 1 GiB at fit start: within 10% of 1 GiB
    assert not epoch_report.missed(compared(meter, 1174 * MiB, 100 * MiB, baseline=1024 * MiB))
    assert epoch_report.missed(compared(meter, 1230 * MiB, 100 * MiB, baseline=1024 * MiB))


def test_miss_warning_names_the_phase_of_the_largest_rise():
    meter = ScriptedMeter()
    rises = {"forward": 300 * MiB, "backward": 50 * MiB}
    text = epoch_report.miss_warning(
        compared(meter, 500 * MiB, 200 * MiB, rises=rises), predicted_phase="step1/backward"
    )
    assert "memory rose most in the 'forward' phase" in text and "'step1/backward'" in text
    assert "scripted allocator 500.00 MiB in epoch 3" in text and "by 300.00 MiB (150%)" in text
    assert text.endswith(epoch_report.MISS_CAUSES)
    # without rises, the phase of the largest peak; within the tolerance, nothing
    peaks = {"forward": 10, "optimizer": 20}
    assert "'optimizer' phase" in epoch_report.miss_warning(
        compared(meter, 500 * MiB, 200 * MiB, peaks=peaks), predicted_phase=None
    )
    assert epoch_report.miss_warning(compared(meter, 200 * MiB, 200 * MiB, rises=rises), predicted_phase="x") is None


def test_rss_miss_warning_says_it_measured_a_rise():
    meter = ScriptedMeter(process_level=True)
    text = epoch_report.miss_warning(compared(meter, 1500 * MiB, 100 * MiB, baseline=1000 * MiB), predicted_phase="p")
    assert "rise of the process's peak RSS above fit start 500.00 MiB" in text


# -- out-of-memory diagnosis ------------------------------------------------------------------
def test_diagnosis_of_a_run_that_was_predicted_to_fit_blames_memory_outside_the_estimate():
    estimate = cuda_estimate()
    plan = make_plan(estimate, 8 * 1024 * MiB)
    text = oom.diagnose_out_of_memory(
        "cuda",
        phase="backward",
        plan=plan,
        estimate=estimate,
        predicted_bytes=400 * MiB,
        batch_size=32,
        measured_peak_bytes=3 * 1024 * MiB,
        phase_peaks={"forward": 1024 * MiB},
        advice=("Use a policy.",),
    )
    lines = text.splitlines()
    assert lines[0] == "MemoryBudgetCallback: CUDA out of memory during the 'backward' phase."
    assert lines[1] == "Predicted peak 400.00 MiB at batch size 32 (phase 'step1/backward'), budget 8.00 GiB."
    assert "Measured peak before the failure: 3.00 GiB." in lines
    assert "Measured peaks by phase: forward=1.00 GiB" in lines
    assert "Use a policy." in lines and any("memory outside the estimate" in line for line in lines)
    assert oom.NO_PLAN_ADVICE not in text


def test_diagnosis_of_a_run_predicted_not_to_fit_gives_the_largest_batch_and_remedies():
    estimate = cuda_estimate()
    plan = make_plan(estimate, 300 * MiB)
    assert not plan.fits and plan.max_fitting_batch_size
    text = oom.diagnose_out_of_memory(
        "cpu", phase="forward", plan=plan, estimate=estimate, predicted_bytes=400 * MiB, batch_size=32
    )
    assert f"Largest batch size predicted to fit: {plan.max_fitting_batch_size}." in text
    assert "memory outside the estimate" not in text
    assert all(f"- {s.text}" in text for s in plan.suggestions) and plan.suggestions


def test_diagnosis_without_a_prediction_says_why_and_what_to_do():
    text = oom.diagnose_out_of_memory(
        "cuda", phase="optimizer", failure="the estimator failed", no_plan_advice="Try bf16-mixed."
    )
    assert text.splitlines()[1:] == ["No prediction was available (the estimator failed).", "Try bf16-mixed."]
    assert "did not run at fit start" in oom.diagnose_out_of_memory("cpu", phase="forward")


def test_shared_measuring_modules_import_no_framework():
    code = (
        "import sys, nnmem_callbacks.monitoring.epoch_comparison, nnmem_callbacks.monitoring.phase_tracking, "
        "nnmem_callbacks.monitoring.oom; "
        "assert not {'torch', 'tensorflow', 'jax', 'keras'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
