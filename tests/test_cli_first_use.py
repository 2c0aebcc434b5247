"""Issue 12, the first ten minutes: what a new user types, and the answer being right or a clear exit status."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nnmem_callbacks import cli
from nnmem_callbacks.cli import parsers
from nnmem_callbacks.cli.render import readable_note
from nnmem_callbacks.core import plan, vocabulary
from nnmem_callbacks.estimators import napkin
from nnmem_callbacks.hardware import gpus

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
CALC = ["calc", "--params", "1M", "--activations", "1000", "-b", "8", "--optimizer", "sgd"]


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "first_models.py"
    path.write_text(
        textwrap.dedent(
            """
        from torch import nn

        def mlp():
            return nn.Sequential(nn.Linear(1000, 100), nn.ReLU(), nn.Linear(100, 100), nn.ReLU(), nn.Linear(100, 10))
        """
        )
    )
    return str(path)


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def shell(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", "set -o pipefail; " + command], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120
    )


# -- input shapes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["3,x", "1000,x", "x", "3,,4", "3;4", ",3", "int64:x"])
def test_input_shapes_with_a_stray_x_or_empty_dimension_are_errors(text):
    with pytest.raises(cli.CliError, match="cannot read input shape") as info:
        cli.parse_input_shape(text)
    assert "e.g. 3,224,224" in str(info.value)


@pytest.mark.parametrize(
    "text, shape",
    [("3x224x224", (3, 224, 224)), ("3 x 32", (3, 32)), ("(3,)", (3,)), ("[4, 8]", (4, 8)), ("1000", (1000,))],
)
def test_input_shapes_that_are_read(text, shape):
    assert cli.parse_input_shape(text).shape == shape


def test_the_mlp_with_a_stray_x_exits_2_naming_the_fix(capsys, mlp_file):
    pytest.importorskip("torch")
    code, out, err = run_cli(capsys, "estimate", f"{mlp_file}:mlp", "-i", "1000,x", "--device", "cpu")
    assert code == 2 and out == ""
    assert "cannot read input shape '1000,x'" in err and "'x' is not a positive whole number" in err


# -- budgets: one rule for the CLI and the API --------------------------------------------------------
@pytest.mark.parametrize("text", ["1.5", "16", "0", "2e3"])
def test_a_bare_number_above_1_is_not_bytes(capsys, text):
    code, out, err = run_cli(capsys, *CALC, "--device", "t4", "--budget", text)
    assert code == 2 and out == ""
    assert f"--budget: budget '{text}' has no unit" in err
    assert f"e.g. '{text}GiB'" in err or "(0, 1]" in err
    with pytest.raises(ValueError) as info:  # the same rule and message in the API
        plan.resolve_budget(text, capacity_bytes=gpus.find_gpu("t4").capacity_bytes)
    assert str(info.value) in err


@pytest.mark.parametrize("text", ["0.5", "1", "6GiB", "512 MiB", "12GB"])  # 16GB is more than a T4 gives CUDA
def test_budgets_resolve_as_the_api_resolves_them(capsys, text):
    capacity = gpus.find_gpu("t4").capacity_bytes
    code, out, _ = run_cli(capsys, *CALC, "--device", "t4", "--budget", text, "--json")
    assert code in (0, 3)
    assert json.loads(out)["fit"]["budget_bytes"] == plan.resolve_budget(text, capacity_bytes=capacity)


def test_no_budget_is_the_callbacks_rule_free_memory_minus_the_margin(capsys):
    capacity = gpus.find_gpu("t4").capacity_bytes
    code, out, _ = run_cli(capsys, *CALC, "--device", "t4", "--json")
    fit = json.loads(out)["fit"]
    assert fit["budget_bytes"] == plan.resolve_budget(None, capacity_bytes=capacity) < capacity
    assert fit["margin"] == plan.DEFAULT_MARGIN


def test_the_fit_is_make_plans(capsys):
    code, out, _ = run_cli(capsys, *CALC, "--device", "cpu", "--budget", "60MiB", "--json")
    document = json.loads(out)
    est = napkin.params_estimate(1_000_000, 1000, 8, optimizer="sgd", device="cpu")
    expected = plan.make_plan(est, 60 * 2**20, "warn")
    assert document["fit"]["max_batch_size"] == expected.max_fitting_batch_size
    assert document["fit"]["fits"] == expected.fits


# -- exit status for a pre-flight check ------------------------------------------------------------
def test_a_batch_that_does_not_fit_a_named_budget_exits_3(capsys):
    code, out, _ = run_cli(capsys, *CALC, "--device", "cpu", "--budget", "1MiB")
    assert code == cli.EXIT_DOES_NOT_FIT == 3
    assert "does NOT fit" in out
    code, out, _ = run_cli(capsys, *CALC, "--device", "cpu", "--budget", "1MiB", "--json")
    assert code == 3 and json.loads(out)["fit"]["fits"] is False
    code, _, _ = run_cli(capsys, *CALC, "--device", "cpu", "--budget", "1GiB")
    assert code == 0


def test_a_batch_that_does_not_fit_a_named_gpu_exits_3(capsys):
    big = ["calc", "--params", "20B", "--activations", "1M", "-b", "8", "--optimizer", "adam"]
    assert run_cli(capsys, *big, "--device", "t4")[0] == 3
    assert run_cli(capsys, *big, "--device", "h200")[0] == 3
    # without --device or --budget nothing was named: the table of GPUs is the answer, exit 0
    code, out, _ = run_cli(capsys, *big)
    assert code == 0 and "Which GPU fits" in out


def test_the_exit_status_is_documented_in_help_and_readme(capsys):
    for command in ([], ["estimate"], ["calc"]):
        with pytest.raises(SystemExit):
            cli.main([*command, "--help"])
        out = capsys.readouterr().out
        assert "exit status:" in out and re.search(r"\n\s+3\s+--budget or --device was given", out), command
    readme = (ROOT / "README.md").read_text()
    assert "Exit status: 0 done" in readme and "3 when `--budget` or `--device` was given" in readme


def test_the_exit_status_in_a_shell_pipeline():
    result = shell(
        f"{shlex.quote(sys.executable)} -m nnmem_callbacks.cli {' '.join(CALC)} --device cpu --budget 1MiB > /dev/null"
    )
    assert result.returncode == 3, result.stderr


# -- devices --------------------------------------------------------------------------------------
def test_a_local_gpu_that_is_not_there_is_an_error(capsys):
    code, out, err = run_cli(capsys, *CALC, "--device", "cuda:99")
    assert code == 2 and out == ""
    assert "--device cuda:99: this machine has" in err and "nnmem gpus" in err


# -- broken pipes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("reader", ["head -3", "true"])
def test_a_closed_pipe_is_not_an_error(reader):
    result = shell(f"{shlex.quote(sys.executable)} -m nnmem_callbacks.cli gpus --json | {reader}")
    assert result.returncode == 0, result.stderr
    assert "internal error" not in result.stderr and "Exception ignored" not in result.stderr
    assert "BrokenPipeError" not in result.stderr
    if reader == "head -3":
        assert result.stdout.splitlines() == ["[", "  {", f'    "name": "{gpus.GPUS[0].name}",']


def test_python_dash_m_runs_the_cli():
    result = shell(f"{shlex.quote(sys.executable)} -m nnmem_callbacks.cli --version")
    assert result.returncode == 0 and result.stdout.startswith("nnmem ")


# -- demo ---------------------------------------------------------------------------------------
def test_the_demo_help_examples_parse_with_the_quickstart():
    pytest.importorskip("pytorch_lightning")
    import importlib.util

    spec = importlib.util.spec_from_file_location("_quickstart", ROOT / "examples" / "lightning_quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    examples = [line.strip() for line in parsers.DEMO_EXAMPLE.splitlines() if line.strip().startswith("nnmem demo")]
    assert examples
    for example in examples:
        argv = shlex.split(example)[2:]
        args = cli.demo_command_parser().parse_args(argv)
        extra = args.args[1:] if args.args[:1] == ["--"] else args.args
        if "--help" in extra:
            with pytest.raises(SystemExit) as info:
                quickstart.build_parser().parse_args(extra)
            assert info.value.code == 0
        else:
            parsed = quickstart.build_parser().parse_args(extra)
            assert parsed.epochs == 1
    with pytest.raises(SystemExit) as info:  # the old example
        quickstart.build_parser().parse_args(["--max-epochs", "1"])
    assert info.value.code == 2


def test_readme_mentions_nnmem_demo():
    assert "nnmem demo" in (ROOT / "README.md").read_text()


# -- one vocabulary -----------------------------------------------------------------------------------
PRECISION_SPELLINGS = [*vocabulary.PRECISIONS, *vocabulary.PRECISION_ALIASES, "BF16-Mixed"]
BAD_PRECISIONS = ["fp16", "half", "float16", "bfloat16", "fp8", "16mixed"]


def _cli_precision(capsys, command, precision, mlp_file):
    if command == "calc":
        code, out, err = run_cli(
            capsys,
            "calc",
            "--layers",
            "1000,100,100,10",
            "-b",
            "4",
            "--device",
            "cpu",
            "--precision",
            precision,
            "--json",
        )
    else:
        code, out, err = run_cli(
            capsys,
            "estimate",
            f"{mlp_file}:mlp",
            "-i",
            "1000",
            "-b",
            "4",
            "--device",
            "cpu",
            "--precision",
            precision,
            "--json",
        )
    return (json.loads(out)["precision"], None) if code == 0 else (None, err)


@pytest.mark.parametrize("precision", PRECISION_SPELLINGS + BAD_PRECISIONS)
def test_each_precision_spelling_gets_one_answer_everywhere(capsys, mlp_file, precision):
    torch = pytest.importorskip("torch")
    from nnmem_callbacks import estimate_training
    from nnmem_callbacks.estimators.torch.inputs import resolve_precision

    try:
        expected, message = vocabulary.canonical_precision(precision), None
    except ValueError as error:
        expected, message = None, str(error)
    # the napkin formulas and the torch estimator's table read it the same way
    for check in (napkin.check_precision, lambda p: resolve_precision(p).name):
        if expected is None:
            with pytest.raises(ValueError) as info:
                check(precision)
            assert str(info.value) == message
        else:
            assert check(precision) == expected
    # the CLI's two commands: same canonical name, or the same message
    for command in ("calc", "estimate"):
        got, err = _cli_precision(capsys, command, precision, mlp_file)
        assert got == expected, (command, err)
        if message is not None:
            assert err.strip() == f"nnmem {command}: error: --precision: {message}"
    if expected is not None:  # and the API
        model = torch.nn.Sequential(torch.nn.Linear(8, 4))
        assert (
            estimate_training(model, torch.empty(2, 8, device="meta"), precision=precision, device="cpu").precision
            == expected
        )


def test_fp32_is_32_true_and_fp16_is_ambiguous_everywhere():
    assert vocabulary.canonical_precision("fp32") == "32-true"
    with pytest.raises(ValueError, match="ambiguous; write 16-mixed .* or 16-true"):
        vocabulary.canonical_precision("fp16")


@pytest.mark.parametrize("optimizer", [*vocabulary.OPTIMIZERS, *vocabulary.OPTIMIZER_ALIASES, "AdamW", "adamm", "lamb"])
def test_each_optimizer_name_gets_one_answer_everywhere(capsys, mlp_file, optimizer):
    pytest.importorskip("torch")
    from nnmem_callbacks.estimators.torch.inputs import check_optimizer_spec

    try:
        expected, message = vocabulary.canonical_optimizer(optimizer), None
    except ValueError as error:
        expected, message = None, str(error)
    for argv in (
        ["calc", "--layers", "1000,100,10", "-b", "4", "--device", "cpu"],
        ["estimate", f"{mlp_file}:mlp", "-i", "1000", "-b", "4", "--device", "cpu"],
    ):
        code, out, err = run_cli(capsys, *argv, "--optimizer", optimizer, "--json")
        if expected is None:
            assert code == 2 and err.strip() == f"nnmem {argv[0]}: error: --optimizer: {message}"
        else:
            assert code == 0, err
    if expected is None:
        with pytest.raises(ValueError) as info:
            check_optimizer_spec(optimizer)
        assert str(info.value).startswith(message)
        assert napkin.check_optimizer.__doc__ and pytest.raises(ValueError, napkin.check_optimizer, optimizer)
    else:
        check_optimizer_spec(optimizer)
        assert napkin.check_optimizer(optimizer) == expected


def test_the_vocabularies_are_the_estimators_tables():
    torch_inputs = pytest.importorskip("nnmem_callbacks.estimators.torch.inputs")
    assert set(torch_inputs.PRECISIONS) == set(vocabulary.PRECISIONS) == set(napkin.PRECISIONS)
    assert set(torch_inputs.OPTIMIZER_NAMES) == set(vocabulary.OPTIMIZERS) | set(vocabulary.OPTIMIZER_ALIASES)
    assert set(vocabulary.OPTIMIZERS) <= set(napkin.OPTIMIZER_STATE)


def test_help_lists_the_whole_vocabulary():
    for factory in (cli.estimate_command_parser, cli.calc_command_parser):
        text = " ".join(factory().format_help().split())
        for name in (*vocabulary.OPTIMIZERS, *vocabulary.PRECISIONS):
            assert name in text, (factory.__name__, name)
        assert "16 = 16-mixed" in text and "fp32 = 32-true" in text and "momentum = sgd_momentum" in text


# -- output details -----------------------------------------------------------------------------------
def test_json_phase_labels_are_distinct_and_say_where_each_is_the_peak(capsys, mlp_file):
    pytest.importorskip("torch")
    code, out, err = run_cli(
        capsys,
        "estimate",
        f"{mlp_file}:mlp",
        "-i",
        "1000",
        "-b",
        "64",
        "--optimizer",
        "sgd",
        "--device",
        "cpu",
        "--json",
    )
    assert code == 0, err
    phases = json.loads(out)["phases"]
    labels = [phase["phase"] for phase in phases]
    assert len(labels) == len(set(labels)), labels
    for phase in phases:
        low, high = phase["peak_at_batches"]
        at = lambda line, n: line["fixed_bytes"] + line["per_sample_bytes"] * n  # noqa: E731
        assert at(phase, low) == max(at(other, low) for other in phases)


def test_napkin_mlp_phases_read_as_words():
    est = napkin.mlp_estimate([1000, 100, 100, 10], 8, optimizer="sgd")
    names = [line.phase for line in est.phases]
    assert not any(":linear" in name for name in names)
    assert any(re.fullmatch(r"step2/backward \(layer \d of 3\)", name) for name in names), names


def test_notes_show_bytes_with_units(capsys):
    import io

    from rich.console import Console

    from nnmem_callbacks.core.estimate import MemoryEstimate

    est = MemoryEstimate(
        peak_bytes=2**20,
        breakdown={"parameters": 2**20},
        batch_size=1,
        notes=("CUDA allocator rounding and unsplit blocks add 28971460 bytes to the tensor peak",),
    )
    target = cli.resolve_target("cpu")
    buffer = io.StringIO()
    cli.render_estimate(est, cli.fit_summary(est, target, None), title="t", console=Console(file=buffer, width=200))
    assert "add 27.63 MiB to the tensor peak" in buffer.getvalue()
    assert "28971460" not in buffer.getvalue()
    assert readable_note("12 bytes per sample") == "12 bytes per sample"  # small counts stay as they are


def test_a_kernel_the_device_cannot_run_is_a_clear_error_not_an_internal_one(capsys, monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from nnmem_callbacks.estimators.torch import estimator
    from nnmem_callbacks.probes.runner import UnsupportedKernelError

    def refuses(*args, **kwargs):
        raise UnsupportedKernelError(
            "aten.mkldnn_rnn_layer", "bfloat16", "cpu", "could not create a primitive descriptor"
        )

    monkeypatch.setattr(estimator, "estimate_training", refuses)
    factories = tmp_path / "lstm_models.py"
    factories.write_text("import torch\n\ndef lstm():\n    return torch.nn.LSTM(8, 8)\n")
    code = cli.main(["estimate", f"{factories}:lstm", "-i", "4,8", "-b", "2", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert "bfloat16 cannot run" in err and "precision='32-true'" in err and "internal error" not in err
