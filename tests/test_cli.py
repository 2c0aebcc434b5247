"""The nnmem command: parsing, JSON equal to the API, GPU fits, napkin mode and error messages."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

import pytest

from nnmem_callbacks import cli
from nnmem_callbacks.cli import demo as cli_demo
from nnmem_callbacks.core.batch_search import MAX_BATCH_SEARCH_LIMIT
from nnmem_callbacks.core.plan import DEFAULT_MARGIN, make_plan, resolve_budget
from nnmem_callbacks.estimators import napkin
from nnmem_callbacks.hardware import gpus

FACTORIES = textwrap.dedent(
    """
    import torch
    from torch import nn

    def mlp(hidden=30):
        return nn.Sequential(nn.Linear(20, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def small_cnn():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))

    class TokenModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(100, 16)
            self.head = nn.Linear(16, 100)

        def forward(self, input_ids, labels):
            logits = self.head(self.embed(input_ids))
            return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())

    def two_inputs():
        class Add(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(8, 4)
                self.b = nn.Linear(6, 4)
            def forward(self, x, y):
                return self.a(x) + self.b(y)
        return Add()

    def broken():
        raise ValueError("boom: no such layer")

    def not_a_model():
        return 42
    """
)


@pytest.fixture(scope="module")
def factory_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny_models.py"
    path.write_text(FACTORIES)
    return str(path)


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def comparable(document):
    keys = (
        "peak_bytes",
        "breakdown",
        "batch_size",
        "fixed_bytes",
        "per_sample_bytes",
        "peak_phase",
        "phases",
        "reserved_bytes",
        "overhead_bytes",
        "device_bytes",
        "device",
        "precision",
        "method",
    )
    return {key: document[key] for key in keys}


# -- import hygiene and help ---------------------------------------------------------------------
def test_importing_cli_does_not_import_torch():
    code = "import sys, nnmem_callbacks.cli; print('torch' in sys.modules, 'tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False False"


def _option_actions(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        yield action


@pytest.mark.parametrize(
    "factory", [cli.estimate_command_parser, cli.calc_command_parser, cli.gpus_command_parser, cli.demo_command_parser]
)
def test_every_option_is_described_with_an_example(factory):
    parser = factory()
    for action in _option_actions(parser):
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{action.dest} has no help"
        takes_value = action.nargs != 0 and not isinstance(action, (argparse._StoreTrueAction,))
        if takes_value and action.choices is None:
            assert "e.g." in action.help, f"{parser.prog} {action.option_strings or action.dest}: no example"
    assert "example" in (parser.epilog or "")


def test_help_of_main_and_subcommands(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("estimate", "calc", "gpus", "demo"):
        assert command in out
    for command in ("estimate", "calc", "gpus", "demo"):
        with pytest.raises(SystemExit) as info:
            cli.main([command, "--help"])
        assert info.value.code == 0
        assert f"nnmem {command}" in capsys.readouterr().out


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


# -- parsing ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("3,224,224", cli.InputSpec(None, "float32", (3, 224, 224))),
        ("int64:128", cli.InputSpec(None, "int64", (128,))),
        ("input_ids=long:128", cli.InputSpec("input_ids", "int64", (128,))),
        ("x=bf16:(4, 8)", cli.InputSpec("x", "bfloat16", (4, 8))),
        ("labels=int64:", cli.InputSpec("labels", "int64", ())),
    ],
)
def test_parse_input_shape(text, expected):
    assert cli.parse_input_shape(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [("3;224", "cannot read input shape"), ("int65:3", "unknown dtype"), ("0,3", "cannot read input shape")],
)
def test_bad_input_shapes_name_the_syntax(text, fragment):
    with pytest.raises(cli.CliError, match=fragment) as info:
        cli.parse_input_shape(text)
    assert "e.g." in str(info.value) or "valid dtypes" in str(info.value)


def test_parse_count():
    assert cli.parse_count("19M") == 19_000_000
    assert cli.parse_count("532,752") == 532_752
    assert cli.parse_count("1.5B") == 1_500_000_000
    with pytest.raises(ValueError, match="19M"):
        cli.parse_count("lots")


def test_targets_and_budgets():
    # a named card's capacity is the total CUDA reports, not nvidia-smi's (which the driver's reserve exceeds)
    assert cli.resolve_target("A100 80GB").capacity_bytes == gpus.find_gpu("a100-80gb").capacity_bytes
    assert cli.resolve_target("H100").capacity_bytes == 85_017_493_504 < gpus.find_gpu("h100").memory_bytes
    assert cli.resolve_target("cpu").device == "cpu"
    with pytest.raises(cli.CliError, match="valid GPUs"):
        cli.resolve_target("tpu")
    t4 = cli.resolve_target("t4")
    assert cli.resolve_budget_bytes("0.5", t4) == t4.capacity_bytes // 2
    assert cli.resolve_budget_bytes("6GiB", t4) == 6 * 2**30
    # no --budget: the rule of MemoryBudgetCallback(budget=None): the device's memory minus the margin
    assert cli.resolve_budget_bytes(None, t4) == int(t4.capacity_bytes * (1 - DEFAULT_MARGIN))
    assert cli.resolve_budget_bytes(None, t4) == resolve_budget(None, capacity_bytes=t4.capacity_bytes)
    with pytest.raises(cli.CliError, match="fraction of the device"):
        cli.resolve_budget_bytes("0.9", cli.resolve_target(None))
    with pytest.raises(cli.CliError, match="--budget"):
        cli.resolve_budget_bytes("lots", t4)


# -- estimate: JSON equals the API ---------------------------------------------------------------
@pytest.mark.parametrize("device, api_device", [("cpu", "cpu"), ("t4", "cuda:t4")])  # a named GPU: its architecture
def test_estimate_json_equals_estimate_training(capsys, factory_file, device, api_device):
    torch = pytest.importorskip("torch")
    from nnmem_callbacks import estimate_training

    code, out, err = run_cli(
        capsys,
        "estimate",
        f"{factory_file}:mlp",
        "-i",
        "20",
        "-b",
        "8",
        "--optimizer",
        "adam",
        "--device",
        device,
        "--json",
    )
    assert code == 0, err
    document = json.loads(out)
    model = cli.build_model(f"{factory_file}:mlp")
    api = estimate_training(
        model, torch.empty(8, 20, device="meta"), optimizer="adam", precision="32-true", device=api_device
    )
    assert comparable(document) == comparable(api.to_dict())
    fit = document["fit"]
    include_reserve = api_device == "cuda"
    plan = make_plan(api, fit["budget_bytes"], "warn", include_reserve=include_reserve)
    assert fit["max_batch_size"] == plan.max_fitting_batch_size
    assert fit["fits"] == plan.fits
    if device == "t4":
        assert fit["budget_bytes"] == resolve_budget(None, capacity_bytes=gpus.find_gpu("t4").capacity_bytes)


def test_estimate_named_and_positional_inputs_and_model_args(capsys, factory_file):
    torch = pytest.importorskip("torch")
    from nnmem_callbacks import estimate_training

    code, out, err = run_cli(
        capsys,
        "estimate",
        f"{factory_file}:TokenModel",
        "-i",
        "input_ids=int64:12",
        "-i",
        "labels=int64:12",
        "-b",
        "4",
        "--optimizer",
        "sgd",
        "--precision",
        "bf16-mixed",
        "--device",
        "cpu",
        "--json",
    )
    assert code == 0, err
    batch = {
        "input_ids": torch.empty(4, 12, dtype=torch.int64, device="meta"),
        "labels": torch.empty(4, 12, dtype=torch.int64, device="meta"),
    }
    api = estimate_training(
        cli.build_model(f"{factory_file}:TokenModel"), batch, optimizer="sgd", precision="bf16-mixed", device="cpu"
    )
    assert comparable(json.loads(out)) == comparable(api.to_dict())

    code, out, err = run_cli(
        capsys, "estimate", f"{factory_file}:two_inputs", "-i", "8", "-i", "6", "-b", "3", "--device", "cpu", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["batch_size"] == 3

    code, out, err = run_cli(
        capsys, "estimate", f"{factory_file}:mlp", "-i", "20", "--model-arg", "hidden=64", "--device", "cpu", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["breakdown"]["parameters"] == (20 * 64 + 64 + 64 * 10 + 10) * 4


def test_no_probes_estimates_from_the_rules_and_says_so(capsys, factory_file):
    pytest.importorskip("torch")
    argv = ("estimate", f"{factory_file}:small_cnn", "-i", "3,8,8", "-b", "4", "--device", "cpu", "--json")
    code, out, err = run_cli(capsys, *argv, "--no-probes")
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert any("kernel workspaces from rules, not probed: probe_kernels=False" in note for note in notes)
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert any("kernel workspaces probed on this cpu" in note for note in notes)
    assert not any("probe_kernels=False" in note for note in notes)


def test_a_first_estimate_on_a_machine_says_on_stderr_that_it_runs_kernels(capsys, factory_file, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from nnmem_callbacks.probes import session

    monkeypatch.setenv("NNMEM_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(session, "_ANNOUNCED", set())
    argv = ("estimate", f"{factory_file}:small_cnn", "-i", "3,8,8", "-b", "4", "--device", "cpu", "--json")
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "nnmem: running this machine's cpu kernels once to measure their scratch memory" in err
    assert "--no-probes skips this" in err and str(tmp_path / "empty-cache") in err
    json.loads(out)  # stdout stays the JSON document
    session._ANNOUNCED.clear()
    code, out, err = run_cli(capsys, *argv)  # now cached: nothing runs, nothing is said
    assert code == 0 and "running this machine" not in err


def test_estimate_table_and_gpu_fit_table(capsys, factory_file):
    pytest.importorskip("torch")
    code, out, err = run_cli(capsys, "estimate", f"{factory_file}:mlp", "-i", "20", "-b", "16")
    assert code == 0, err
    for text in (
        "parameters",
        "peak (tensors)",
        "allocator reserve",
        "CUDA context",
        "Which GPU fits",
        "H100 80GB",
        "max batch",
    ):
        assert text in out


def test_estimate_json_gpu_rows_match_the_estimate(capsys, factory_file):
    pytest.importorskip("torch")
    # wide enough that no GPU's largest batch reaches the search limit (2**24 samples)
    code, out, _ = run_cli(
        capsys, "estimate", f"{factory_file}:mlp", "-i", "20", "-b", "16", "--model-arg", "hidden=2048", "--json"
    )
    assert code == 0
    document = json.loads(out)
    rows = {row["name"]: row for row in document["fit"]["gpus"]}
    assert set(rows) == {gpu.name for gpu in gpus.GPUS}
    t4 = rows["T4 16GB"]
    # the device total (reserve + overhead) at the max batch fits, one more does not
    est_line = max(document["phases"], key=lambda p: p["per_sample_bytes"])
    assert t4["max_batch_size"] > 16 and est_line["per_sample_bytes"] > 0
    # a larger card fits a larger batch, unless even the small one reaches the search limit (this MLP's step
    # is a few hundred bytes per sample: its replayed reserve at 2**24 samples fits 16 GB)
    small, large = rows["T4 16GB"]["max_batch_size"], rows["H200 141GB"]["max_batch_size"]
    assert large > small or small == large == MAX_BATCH_SEARCH_LIMIT


def test_estimate_with_budget(capsys, factory_file):
    pytest.importorskip("torch")
    code, out, _ = run_cli(
        capsys,
        "estimate",
        f"{factory_file}:mlp",
        "-i",
        "20",
        "-b",
        "16",
        "--device",
        "cpu",
        "--budget",
        "20KiB",
        "--json",
    )
    document = json.loads(out)
    assert document["fit"]["budget_bytes"] == 20 * 1024
    assert document["fit"]["fits"] == (document["peak_bytes"] <= 20 * 1024)
    assert code == (cli.EXIT_OK if document["fit"]["fits"] else cli.EXIT_DOES_NOT_FIT)


def test_estimate_checks_its_largest_batch_by_a_direct_trace(capsys, factory_file):
    pytest.importorskip("torch")
    code, out, _ = run_cli(
        capsys,
        "estimate",
        f"{factory_file}:mlp",
        "-i",
        "20",
        "-b",
        "16",
        "--device",
        "cpu",
        "--budget",
        "1MiB",
        "--json",
    )
    fit = json.loads(out)["fit"]
    verification = fit["verification"]
    assert verification is not None and verification["checks"]
    assert verification["batch_size"] == fit["max_batch_size"] >= 1
    # the reported batch was traced directly and fits the budget (kept free of the margin) there
    last = [c for c in verification["checks"] if c["batch_size"] == fit["max_batch_size"]]
    assert last and last[-1]["fits"] and last[-1]["traced_bytes"] <= 1024 * 1024
    code, out, _ = run_cli(
        capsys, "estimate", f"{factory_file}:mlp", "-i", "20", "-b", "16", "--device", "cpu", "--budget", "1MiB"
    )
    assert "by direct estimate" in out


# -- calc -----------------------------------------------------------------------------------------
def test_calc_json_equals_napkin_functions(capsys):
    code, out, err = run_cli(
        capsys,
        "calc",
        "--layers",
        "12",
        "--hidden",
        "768",
        "--heads",
        "12",
        "--vocab",
        "30522",
        "--seq-len",
        "128",
        "--arch",
        "bert",
        "-b",
        "32",
        "--optimizer",
        "adamw",
        "--json",
    )
    assert code == 0, err
    expected = napkin.transformer_estimate(
        layers=12, hidden=768, heads=12, vocab=30522, seq_len=128, batch_size=32, arch="bert", optimizer="adamw"
    )
    assert comparable(json.loads(out)) == comparable(expected.to_dict())
    assert json.loads(out)["why"][0].startswith("The peak is at")

    code, out, _ = run_cli(
        capsys, "calc", "--layers", "1000,100,100,100,100,10", "-b", "256", "--optimizer", "sgd", "--json"
    )
    assert comparable(json.loads(out)) == comparable(
        napkin.mlp_estimate([1000, 100, 100, 100, 100, 10], 256, optimizer="sgd").to_dict()
    )

    code, out, _ = run_cli(
        capsys, "calc", "--params", "19M", "--activations", "532752", "-b", "128", "--json", "--device", "cpu"
    )
    assert comparable(json.loads(out)) == comparable(
        napkin.params_estimate(19_000_000, 532_752, 128, device="cpu").to_dict()
    )


def test_calc_table_has_why(capsys):
    code, out, _ = run_cli(
        capsys,
        "calc",
        "--layers",
        "2",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--seq-len",
        "256",
        "--vocab",
        "1000",
        "-b",
        "8",
        "--device",
        "h100",
    )
    assert code == 0
    assert "The peak is at" in out and "What would shrink it" in out and "largest batch that fits" in out


def test_calc_plot_writes_png(capsys, tmp_path):
    target = tmp_path / "mem.png"
    code, out, _ = run_cli(
        capsys, "calc", "--params", "1M", "--activations", "10000", "-b", "16", "--device", "t4", "--plot", str(target)
    )
    assert code == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(target) in out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["calc"], "needs one of: transformer"),
        (["calc", "--hidden", "64"], "also needs --layers, --heads, --seq-len"),
        (["calc", "--layers", "100"], "at least two widths"),
        (["calc", "--layers", "2", "--hidden", "10", "--heads", "3", "--seq-len", "4"], "divisible by heads"),
        (["calc", "--params", "1M", "--activations", "10", "--precision", "fp16"], "ambiguous; write 16-mixed"),
        (["calc", "--params", "1M", "--activations", "10", "--optimizer", "lamb"], "valid optimizers"),
        (["calc", "--params", "1M", "--activations", "10", "--device", "a100"], "add the memory"),
    ],
)
def test_calc_errors_are_short_and_name_the_fix(capsys, argv, fragment):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert fragment in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


# -- errors for model specs -------------------------------------------------------------------------
def test_model_spec_errors(capsys, factory_file, tmp_path):
    cases = [
        (["estimate", "resnet50", "-i", "3"], "MODEL must be 'package.module:factory'"),
        (["estimate", factory_file, "-i", "3"], "name the factory in it"),
        (["estimate", str(tmp_path / "missing.py") + ":make", "-i", "3"], "not found"),
        (["estimate", "no_such_pkg_xyz.models:make", "-i", "3"], "cannot import module 'no_such_pkg_xyz.models'"),
        (["estimate", f"{factory_file}:nope", "-i", "3"], "callables defined there: TokenModel, broken, mlp"),
        (["estimate", f"{factory_file}:broken", "-i", "3"], "raised ValueError: boom: no such layer"),
        (
            ["estimate", f"{factory_file}:not_a_model", "-i", "3"],
            "returned an object of type 'int' (42); it must return a torch.nn.Module",
        ),
        (["estimate", f"{factory_file}:mlp"], "give the model's input shape"),
        (["estimate", f"{factory_file}:mlp", "-i", "20;3"], "cannot read input shape"),
        (["estimate", f"{factory_file}:mlp", "-i", "20", "--optimizer", "adamm"], "did you mean 'adam'"),
        (["estimate", f"{factory_file}:mlp", "-i", "20", "--precision", "half"], "ambiguous"),
        (["estimate", f"{factory_file}:mlp", "-i", "20", "--model-arg", "oops"], "KEY=VALUE"),
    ]
    for argv, fragment in cases:
        if "raised" in fragment or "returned" in fragment or "adamm" in argv or "oops" in argv:
            pytest.importorskip("torch")
        code, out, err = run_cli(capsys, *argv)
        assert code == 2, (argv, err)
        assert fragment in err, (argv, err)
        assert "Traceback" not in err


def test_wrong_input_shape_for_the_model(capsys, factory_file):
    pytest.importorskip("torch")
    code, out, err = run_cli(capsys, "estimate", f"{factory_file}:mlp", "-i", "21", "-b", "4", "--device", "cpu")
    assert code == 2
    assert "cannot run on inputs of per-sample shape float32[21]" in err
    assert "fix --input-shape" in err


def test_keras_model_gives_a_clear_message(capsys, tmp_path, monkeypatch):
    saved = tmp_path / "model.keras"
    saved.write_bytes(b"not really a model")
    monkeypatch.setitem(sys.modules, "nnmem_callbacks.estimators.keras.estimator", None)  # as if Keras were missing
    code, out, err = run_cli(capsys, "estimate", str(saved), "-b", "8")
    assert code == 2
    assert "needs Keras and TensorFlow" in err and "pip install 'nnmem_callbacks[keras,tensorflow]'" in err
    assert "not available yet" not in err


def test_user_errors_exit_2_without_traceback_in_a_subprocess(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "nnmem_callbacks.cli", "estimate", "not-a-spec"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "MODEL must be" in result.stderr


# -- gpus and demo ---------------------------------------------------------------------------------
def test_gpus_command(capsys):
    code, out, _ = run_cli(capsys, "gpus", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [row["name"] for row in rows] == gpus.gpu_names()
    code, out, _ = run_cli(capsys, "gpus")
    assert "H200 141GB" in out


def test_demo_runs_the_quickstart_with_extra_args(capsys, monkeypatch, tmp_path):
    script = tmp_path / "examples" / "lightning_quickstart.py"
    script.parent.mkdir()
    script.write_text("")
    monkeypatch.setattr(cli_demo, "find_quickstart", lambda: script)
    monkeypatch.setattr(cli_demo.importlib.util, "find_spec", lambda name: object())
    calls = []
    monkeypatch.setattr(cli_demo.subprocess, "call", lambda argv: calls.append(argv) or 0)
    assert cli.main(["demo", "--", "--max-epochs", "1"]) == 0
    assert calls == [[sys.executable, str(script), "--max-epochs", "1"]]


def test_demo_without_quickstart_or_lightning(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli_demo, "find_quickstart", lambda: None)
    code, _, err = run_cli(capsys, "demo")
    assert code == 2 and "lightning_quickstart.py not found" in err
    monkeypatch.setattr(cli_demo, "find_quickstart", lambda: tmp_path / "q.py")
    monkeypatch.setattr(cli_demo.importlib.util, "find_spec", lambda name: None)
    code, _, err = run_cli(capsys, "demo")
    assert code == 2 and "pip install 'nnmem_callbacks[lightning]'" in err


def test_estimate_a_saved_keras_model(capsys, tmp_path):
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("checks the TensorFlow backend")
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    path = tmp_path / "tiny.keras"
    model.save(path)
    for gpu in ("a100-80gb", "cuda"):  # no GPU here: a GPU's figure cannot be had from the CPU's
        code, _, err = run_cli(capsys, "estimate", str(path), "--batch-size", "16", "--device", gpu)
        assert code == 2 and f"--device {gpu}: a saved Keras model is estimated with its Keras backend" in err
    code, out, _ = run_cli(capsys, "estimate", str(path), "--batch-size", "16", "--json")  # no --device: the CPU
    assert code == 0
    data = json.loads(out)
    assert data["fit"]["target"]["device"] == "cpu" and not data["fit"].get("gpus")
    assert data["optimizer"] == "SGD"  # the saved model's, not --optimizer's default
    from nnmem_callbacks.keras import estimate_training as keras_estimate

    expected = keras_estimate(keras.models.load_model(path), batch_size=16)
    assert data["peak_bytes"] == expected.peak_bytes
    assert data["method"] == "tf-graph"
    code, _, err = run_cli(capsys, "estimate", str(path), "--batch-size", "16", "--precision", "bf16-mixed")
    assert code == 2 and "dtype policy" in err
