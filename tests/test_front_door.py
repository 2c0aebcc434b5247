"""What a new user tripped on (issue #16 of the front door): each defect, with the test that would have caught it.

The numbers in the test names are the defects' numbers in the issue.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nnmem_callbacks import cli

ROOT = Path(__file__).resolve().parents[1]

FACTORIES = textwrap.dedent(
    """
    import torch

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.ReLU(), torch.nn.Linear(30, 10))

    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 4)

        def forward(self, x):
            raise ValueError("my model is broken")

    def broken():
        return Broken()
    """
)


@pytest.fixture(scope="module")
def factory_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "front_door_models.py"
    path.write_text(FACTORIES)
    return str(path)


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- 3: a closed pipe ends the command with status 0 --------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["calc", "--layers", "1000,100,10", "-b", "32"],
        ["calc", "--layers", "1000,100,10", "-b", "32", "--json"],
        ["gpus"],
    ],
)
def test_3_a_reader_that_goes_away_is_not_an_error(argv):
    process = subprocess.Popen(
        [sys.executable, "-m", "nnmem_callbacks.cli", *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # as `| head -0`: every write meets a closed pipe
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err.decode()
    assert b"Traceback" not in err and b"internal error" not in err


# -- 4: usage errors are usage errors (exit 2, a message naming the fix), found before any work --------------
def test_4_a_batch_size_too_large_to_estimate_is_a_usage_error(capsys, factory_file):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["estimate", f"{factory_file}:mlp", "-i", "20", "-b", "99999999999999999999999999"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--batch-size" in err and "at most 16,777,216" in err


def test_4_a_plot_format_matplotlib_cannot_write_is_refused_before_estimating(capsys, factory_file):
    code, out, err = run_cli(capsys, "estimate", f"{factory_file}:mlp", "-i", "20", "-b", "4", "--plot", "out.txt")
    assert code == 2 and out == ""  # nothing printed: the check comes before the estimate
    assert "--plot out.txt" in err and "png" in err and "internal error" not in err


def test_4_a_saved_keras_model_without_keras_names_the_extra(capsys, tmp_path, monkeypatch):
    saved = tmp_path / "model.keras"
    saved.write_bytes(b"not really a model")
    monkeypatch.setitem(sys.modules, "keras", None)  # as if Keras were not installed
    code, out, err = run_cli(capsys, "estimate", str(saved), "-b", "8")
    assert code == 2
    assert "pip install 'nnmem_callbacks[keras,tensorflow]'" in err and "internal error" not in err


# -- 12: a saved Keras model: --input-shape is checked, a chosen optimizer or loss is said -------------------
@pytest.fixture(scope="module")
def keras_files(tmp_path_factory):
    keras = pytest.importorskip("keras")
    if keras.backend.backend() == "tensorflow":
        pytest.importorskip("tensorflow")
    folder = tmp_path_factory.mktemp("keras")

    def build():
        inputs = keras.Input((8,))
        return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(16, activation="relu")(inputs)))

    compiled = build()
    compiled.compile(optimizer="sgd", loss="mse")
    compiled.save(folder / "compiled.keras")
    build().save(folder / "uncompiled.keras")
    return folder


def test_12_a_wrong_input_shape_for_a_saved_keras_model_is_an_error(capsys, keras_files):
    code, out, err = run_cli(
        capsys, "estimate", str(keras_files / "compiled.keras"), "-b", "4", "-i", "7,7", "--device", "cpu"
    )
    assert code == 2
    assert "does not match" in err and "-i 8" in err


@pytest.mark.slow
def test_12_an_uncompiled_keras_model_says_which_optimizer_and_loss_it_was_estimated_with(capsys, keras_files):
    code, out, err = run_cli(
        capsys, "estimate", str(keras_files / "uncompiled.keras"), "-b", "4", "--device", "cpu", "--json"
    )
    assert code == 0, err
    import json

    notes = json.loads(out)["notes"]
    assert any("not compiled" in note and "adam" in note for note in notes)
    assert any("no loss" in note and "mse" in note for note in notes)


# -- 14: hints that lead somewhere ------------------------------------------------------------------------------
def test_14_a_forward_that_raises_is_not_blamed_on_the_input_shape(capsys, factory_file):
    code, out, err = run_cli(capsys, "estimate", f"{factory_file}:broken", "-i", "4", "-b", "2", "--device", "cpu")
    assert code == 2
    assert "my model is broken" in err and "fix --input-shape" not in err


@pytest.mark.parametrize(
    "budget, suggestion, wrong",
    [
        ("0", "must be more than 0", "'0GiB'"),
        ("2200000", "'2200000B' is 2200000 bytes", "2200000GiB"),
        ("0GiB", "positive size", "None"),
    ],
)
def test_14_budget_hints_suggest_what_would_be_accepted(capsys, factory_file, budget, suggestion, wrong):
    code, out, err = run_cli(capsys, "estimate", f"{factory_file}:mlp", "-i", "20", "-b", "4", "--budget", budget)
    assert code == 2
    assert suggestion in err and wrong not in err


def test_14_a_factory_that_returns_no_module_is_named_plainly(capsys, tmp_path):
    path = tmp_path / "numbers.py"
    path.write_text("def three():\n    return 3\n")
    code, out, err = run_cli(capsys, "estimate", f"{path}:three", "-i", "4")
    assert code == 2
    assert "returned an object of type 'int' (3)" in err and "a int" not in err


# -- 15: the plot labels the search's cap as a cap ---------------------------------------------------------------
def test_15_the_plot_labels_the_search_cap_as_one(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    from nnmem_callbacks.cli.compute import fit_summary
    from nnmem_callbacks.cli.plots import plot_estimate
    from nnmem_callbacks.cli.targets import resolve_target
    from nnmem_callbacks.estimators import napkin

    labels = []
    original = matplotlib.axes.Axes.legend

    def legend(self, *args, **kwargs):
        labels.extend(self.get_legend_handles_labels()[1])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "legend", legend)
    tiny = napkin.params_estimate(1_000, 10, 4, optimizer="sgd", device="cpu")
    fit = fit_summary(tiny, resolve_target(None), 64 * 2**30)
    plot_estimate(tiny, fit, str(tmp_path / "tiny.png"))
    capped = [label for label in labels if "16,777,216" in label or "16777216" in label]
    assert capped and all("cap" in label for label in capped)


# -- 13: the installed command carries its demo ----------------------------------------------------------------
def test_13_the_demo_is_found_from_any_folder(tmp_path):
    code = "from nnmem_callbacks.cli.demo import find_quickstart; print(find_quickstart())"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = Path(done.stdout.strip())
    assert found.name == "lightning_quickstart.py" and found.is_file()
    assert "MemoryBudgetCallback" in found.read_text()


# -- 11: the step check's figures are said to be the allocator's, beside the prediction in the same terms ---------
@pytest.mark.slow
def test_11_the_step_check_notes_say_which_figure_they_compare():
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the step check is TensorFlow's")
    pytest.importorskip("tensorflow")
    from nnmem_callbacks.core.units import format_bytes
    from nnmem_callbacks.keras import estimate_training

    inputs = keras.Input((16, 16, 3))
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(8, 3)(inputs)))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="mse")
    estimate = estimate_training(model, batch_size=16)
    if "step_check_batch_size" not in estimate.extra:
        pytest.skip("the step check did not run here")
    # (not "allocator peak" alone: with oneDNN off a note says in which replayed step "the allocator peaks")
    (terms,) = [note for note in estimate.notes if note.startswith("the step check's figures are")]
    assert "not the tensor peak" in terms
    assert format_bytes(estimate.extra["tf_allocator_peak_bytes"]) in terms
    assert format_bytes(estimate.peak_bytes) in terms


# -- 2: the Keras quickstart says what to install when Keras or its backend is missing ---------------------------
def test_2_the_keras_quickstart_without_its_backend_says_what_to_install(tmp_path):
    blocker = tmp_path / "sitecustomize.py"  # makes `import keras` fail in the child, as on a machine without it
    blocker.write_text("import sys\nsys.modules['keras'] = None\n")
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{ROOT}", "KERAS_BACKEND": "tensorflow"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "keras_quickstart.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert 'pip install -e ".[tensorflow]"' in done.stderr and "Traceback" not in done.stderr


# -- 1: one budget rule: a batch fits exactly when it is at most the largest batch that fits --------------------
def test_1_fits_exactly_when_at_most_the_largest_fitting_batch():
    from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
    from nnmem_callbacks.core.plan import make_plan

    for per_sample in (10, 100, 1_000):
        for batch in (1, 7, 64, 300):
            estimate = MemoryEstimate(
                peak_bytes=5_000 + per_sample * batch,
                breakdown={"parameters": 5_000},
                batch_size=batch,
                phases=(PhaseLine("step", 5_000, per_sample),),
            )
            for budget in range(4_000, 400_000, 7_919):
                for margin in (0.0, 0.05, 0.2):
                    plan = make_plan(estimate, budget, "warn", margin)
                    assert plan.fits == (batch <= plan.max_fitting_batch_size), (per_sample, batch, budget, margin)
                    assert plan.usable_bytes == int(budget * (1 - margin))


def test_1_the_cli_answer_agrees_with_itself(capsys, factory_file):
    pytest.importorskip("torch")
    import json

    argv = ["estimate", f"{factory_file}:mlp", "-i", "20", "-b", "256", "--optimizer", "sgd", "--device", "cpu"]
    code, out, _ = run_cli(capsys, *argv, "--json")
    fit = json.loads(out)
    predicted = fit["fit"]["predicted_bytes"]
    budget = f"{int(predicted / 0.97)}B"  # the whole budget holds batch 256, the budget less the 5% margin does not
    code, out, _ = run_cli(capsys, *argv, "--budget", budget, "--json")
    document = json.loads(out)["fit"]
    assert document["fits"] is False and document["max_batch_size"] < 256 and code == 3
    code, out, _ = run_cli(capsys, *argv, "--budget", budget)
    assert "does NOT fit" in out and "keeping 5% free" in out and "usable" in out


@pytest.mark.slow
def test_1_the_lightning_callback_plans_on_the_budget_less_the_margin(tmp_path):
    pytest.importorskip("pytorch_lightning")
    import pytorch_lightning as pl
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from _lightning_models import MLP, DataModule

    from nnmem_callbacks.estimators.torch.estimator import estimate_training
    from nnmem_callbacks.lightning import MemoryBudgetCallback

    model = MLP()
    peak = estimate_training(
        model,
        (torch.zeros(64, 32), torch.zeros(64, dtype=torch.long)),
        optimizer=torch.optim.Adam(model.parameters()),
        loss_fn=lambda m, b: m.training_step(b, 0),
        device="cpu",
        zero_grad="before_backward",  # as Lightning's automatic optimization, which the callback estimates
    ).peak_bytes
    callback = MemoryBudgetCallback(budget=int(peak / 0.97), policy="shrink")  # within the budget, over the margin
    datamodule = DataModule(batch_size=64)
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        max_epochs=1,
        limit_train_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(model, datamodule=datamodule)
    plan = callback.plan
    assert not plan.fits and plan.batch_size == plan.max_fitting_batch_size < 64
    assert datamodule.batch_size == plan.batch_size


def _lightning_fit(tmp_path, callback, model, *, epochs=2, batches=4, **fit_kwargs):
    """Fits ``model`` on CPU with ``callback``; returns the callback's warnings."""
    import warnings

    import pytorch_lightning as pl

    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        max_epochs=epochs,
        limit_train_batches=batches,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, **fit_kwargs)
    return [str(w.message) for w in caught if "MemoryBudgetCallback" in str(w.message)]


def _lightning_models():
    pytest.importorskip("pytorch_lightning")
    sys.path.insert(0, str(ROOT / "tests"))
    import _lightning_models

    return _lightning_models


@pytest.mark.slow
def test_6_on_cpu_the_measured_figure_is_the_tensor_peak_the_estimate_predicts(tmp_path):
    models = _lightning_models()
    from nnmem_callbacks.lightning import MemoryBudgetCallback

    for batch_size in (64, 9):  # a second fit in the same process measures as well as the first
        callback = MemoryBudgetCallback(budget="2GiB")
        said = _lightning_fit(tmp_path, callback, models.MLP(), datamodule=models.DataModule(batch_size=batch_size))
        assert [row["kind"] for row in callback.measurements] == ["tensors", "tensors"]
        for row in callback.measurements:
            assert abs(row["relative_error"]) < 0.10, row  # the RSS rise swung from -100% to +182%
            assert row["predicted_bytes"] == callback.estimate.peak_bytes_at(batch_size)
            assert row["rss_rise_bytes"] is not None and "predicted_rss_rise_bytes" in row  # kept beside it
            assert row["sampled_step_seconds"] > 0 and row["step_seconds"] > 0  # the stated cost
        assert not [line for line in said if "the estimate missed" in line]


@pytest.mark.slow
def test_6_without_a_sampled_step_the_rss_rise_is_not_blamed_on_the_estimate(tmp_path):
    import torch

    models = _lightning_models()
    from nnmem_callbacks.lightning import MemoryBudgetCallback

    class Hog(models.MLP):
        def on_train_batch_start(self, batch, batch_idx):
            self._hog = bytearray(256 * 2**20) if batch_idx == 0 else None  # resident, but no tensor

    callback = MemoryBudgetCallback(budget="2GiB")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):  # the user's profiler
        said = _lightning_fit(tmp_path, callback, Hog(), datamodule=models.DataModule(batch_size=32))
    assert [row["kind"] for row in callback.measurements] == ["rss", "rss"]
    assert any("cannot sample the step's tensor peak" in line for line in said)
    assert not [line for line in said if "the estimate missed" in line]


@pytest.mark.slow
def test_7_a_shrink_that_falls_back_to_warn_does_not_report_a_new_batch_size(tmp_path):
    models = _lightning_models()
    from torch.utils.data import DataLoader

    from nnmem_callbacks.lightning import MemoryBudgetCallback

    model = models.MLP()
    probe = MemoryBudgetCallback(budget="2GiB")
    loader = DataLoader(models.make_dataset(), batch_size=64)
    _lightning_fit(tmp_path, probe, models.MLP(), epochs=1, batches=1, train_dataloaders=loader)
    budget = int(probe.estimate.peak_bytes * 0.85)  # a smaller batch fits
    callback = MemoryBudgetCallback(budget=budget, policy="shrink")
    said = _lightning_fit(tmp_path, callback, model, epochs=1, batches=2, train_dataloaders=loader)
    assert any("Falling back to policy='warn'" in line for line in said), said
    summary = callback.summary  # the line logged at fit start
    assert "64 ->" not in summary and "training unchanged at batch size 64" in summary
    assert callback.plan.batch_size == 64 and callback.state_dict()["batch_size"] == 64
    assert "64 ->" not in callback.state_dict()["decision"]


@pytest.mark.slow
def test_8_a_shrink_when_not_even_batch_1_fits_says_training_goes_on_unchanged(tmp_path):
    models = _lightning_models()
    from nnmem_callbacks.lightning import MemoryBudgetCallback

    callback = MemoryBudgetCallback(budget=1024, policy="shrink")
    said = _lightning_fit(
        tmp_path, callback, models.MLP(), epochs=1, batches=1, datamodule=models.DataModule(batch_size=32)
    )
    assert any("not even batch size 1" in line or "does not fit even" in line for line in said), said
    summary = callback.summary
    assert "does not fit even at batch size 1" in summary
    assert "training unchanged at batch size 32" in summary and "not even batch size 1 fits" in summary


def test_9_one_sign_convention_predicted_minus_measured_over_measured():
    from nnmem_callbacks.monitoring import epoch_comparison
    from nnmem_callbacks.monitoring.meters import CudaMeter, PeakReading, metric_names

    meter = CudaMeter("cuda:0")
    over = epoch_comparison.compare_epoch(
        meter,
        PeakReading(kind="cuda", peak_bytes=100),
        epoch=0,
        names=metric_names(meter),
        predicted_bytes=110,
        predicted_peak_bytes=110,
    )
    assert over.metrics["memory_relative_error"] == pytest.approx(0.10)  # an over-prediction is positive
    from nnmem_callbacks.monitoring.meters import MetricNames

    assert "(predicted - measured) / measured" in MetricNames.__doc__
    readme = (ROOT / "README.md").read_text()
    assert "(predicted - measured) / measured" in readme
    assert "(predicted - measured) / measured" in (ROOT / "benchmarks" / "README.md").read_text()


def test_10_the_readme_says_what_the_upper_bound_bounds_and_the_quickstart_shows_the_check():
    readme = (ROOT / "README.md").read_text()
    keras = " ".join(readme[readme.index("## Keras") : readme.index("## The nnmem command")].split())
    assert "not a direct estimate at another batch" in keras and "plan.verification" in keras
    quickstart = (ROOT / "examples" / "keras_quickstart.py").read_text()
    assert "plan.verification.text" in quickstart and "a little above batch 64's upper bound asks" not in quickstart


def test_16_the_keras_quickstart_says_how_long_a_first_run_takes():
    import ast

    quickstart = ast.get_docstring(ast.parse((ROOT / "examples" / "keras_quickstart.py").read_text()))
    text = " ".join(quickstart.split())
    assert "first run" in text and "minutes" in text  # it said "seconds" and took 2 min 20 s
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "a first estimate takes seconds to minutes" in readme
