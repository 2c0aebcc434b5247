"""A new user's walkthrough of ``nnmem``: options no mode uses, messages that agree with the parser, inputs counted
against forward, ``--seq-len`` without token ids, what is traced, the plot's legend and the help's examples."""

from __future__ import annotations

import ast
import json
import re
import shlex
import textwrap
from pathlib import Path

import pytest

from nnmem_callbacks import cli
from nnmem_callbacks.cli import parsers
from nnmem_callbacks.cli.compute import CALC_MODES

ROOT = Path(__file__).resolve().parent.parent
TRANSFORMER = ["--layers", "4", "--hidden", "256", "--heads", "4", "--seq-len", "128"]
LORA = [*TRANSFORMER, "--lora-rank", "8", "--ffn", "1024", "--vocab", "1000"]
COUNTS = ["--params", "1M", "--activations", "1000"]
MLP = ["--layers", "784,512,10"]

FACTORIES = textwrap.dedent(
    """
    from torch import nn

    class TwoIn(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(10, 8), nn.Linear(5, 8)

        def forward(self, x, z):
            return self.a(x) + self.b(z)

    class StarArgs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(10, 8)

        def forward(self, *inputs):
            return sum(self.a(x) for x in inputs)

    def two_inputs():
        return TwoIn()

    def star_args():
        return StarArgs()

    def cnn():
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))

    def tokens():
        return nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 100))
    """
)


@pytest.fixture(scope="module")
def factories(tmp_path_factory):
    path = tmp_path_factory.mktemp("walkthrough") / "walk_models.py"
    path.write_text(FACTORIES)
    return str(path)


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- 1. nnmem calc refuses the options its mode would ignore ----------------------------------------
@pytest.mark.parametrize(
    "base, extra, mode, belongs",
    [
        (TRANSFORMER, ["--quantize", "4bit"], "transformer", ["lora"]),
        (TRANSFORMER, ["--kv-heads", "2"], "transformer", ["lora"]),
        (TRANSFORMER, ["--lora-targets", "q,v"], "transformer", ["lora"]),
        (TRANSFORMER, ["--lora-targets", "q,k,v,o"], "transformer", ["lora"]),  # written, though the default
        (TRANSFORMER, ["--activations", "1000"], "transformer", ["counts"]),
        (MLP, ["--params", "19M"], "mlp", ["transformer", "counts"]),
        (MLP, ["--seq-len", "64"], "mlp", ["transformer", "lora"]),
        (MLP, ["--recompute", "full"], "mlp", ["transformer", "lora"]),
        (MLP, ["--recompute", "none"], "mlp", ["transformer", "lora"]),
        (MLP, ["--arch", "gpt"], "mlp", ["transformer"]),
        (MLP, ["--no-dropout"], "mlp", ["transformer"]),
        (MLP, ["--input-size", "784"], "mlp", ["counts"]),
        (COUNTS, ["--vocab", "1000"], "counts", ["transformer", "lora"]),
        (COUNTS, ["--attention", "flash"], "counts", ["transformer", "lora"]),
        (LORA, ["--params", "7B"], "lora", ["transformer", "counts"]),
        (LORA, ["--max-positions", "2048"], "lora", ["transformer"]),
        (LORA, ["--activation", "gelu_new"], "lora", ["transformer"]),
    ],
)
def test_an_option_of_another_mode_is_a_usage_error(capsys, base, extra, mode, belongs):
    code, out, err = run_cli(capsys, "calc", *base, *extra, "--json")
    assert code == 2 and out == ""
    assert f"{extra[0]} does not apply in {CALC_MODES[mode]}" in err
    assert all(CALC_MODES[other] in err for other in belongs)


def test_every_option_the_walkthrough_wrote_is_named(capsys):
    argv = ["--quantize", "4bit", "--kv-heads", "2", "--lora-targets", "q,v", *TRANSFORMER]
    code, _, err = run_cli(capsys, "calc", *argv)
    assert code == 2
    assert f"--kv-heads, --lora-targets and --quantize do not apply in {CALC_MODES['transformer']}" in err
    assert f"they apply in {CALC_MODES['lora']}" in err


@pytest.mark.parametrize(
    "argv",
    [
        [*TRANSFORMER, "--vocab", "1000", "--ffn", "1024", "--params", "5M", "--arch", "bert", "--max-positions",
         "512", "--recompute", "selective", "--attention", "flash", "--activation", "gelu_new", "--no-dropout"],
        [*LORA, "--kv-heads", "2", "--lora-targets", "q,v", "--quantize", "4bit", "--recompute", "full",
         "--attention", "eager"],
        [*MLP, "--batch-size", "4"],
        [*COUNTS, "--input-size", "3,32,32"],
    ],
)  # fmt: skip
def test_the_options_of_each_mode_are_still_taken(capsys, argv):
    code, out, err = run_cli(capsys, "calc", *argv, "--json")
    assert code == 0, err
    assert json.loads(out)["peak_bytes"] > 0


def test_options_of_the_mode_change_the_answer(capsys):
    """What the walkthrough saw: --quantize and friends left the LoRA answer as it was without them."""
    peaks = []
    for extra in ([], ["--quantize", "4bit", "--kv-heads", "2", "--lora-targets", "q,v"]):
        code, out, err = run_cli(capsys, "calc", *LORA, *extra, "--json")
        assert code == 0, err
        peaks.append(json.loads(out)["peak_bytes"])
    assert peaks[0] != peaks[1]


# -- 2. the budget's examples are budgets -------------------------------------------------------------
@pytest.mark.parametrize("text", ["abc", "1,5GiB", "GiB"])
def test_every_example_in_the_budget_error_is_accepted(capsys, text):
    # an L4: every example size ('16GB' too) is within its memory (a T4 gives CUDA less than 16 GB)
    code, _, err = run_cli(capsys, "calc", *MLP, "--device", "l4", "--budget", text)
    assert code == 2 and f"cannot read {text!r} as a budget" in err
    examples = re.findall(r"'([^']+)'", err.split("as a budget", 1)[1])
    assert "1048576B" in examples and "0.9" in examples
    for example in examples:
        code, out, err = run_cli(capsys, "calc", *MLP, "--device", "l4", "--budget", example, "--json")
        assert code in (0, 3), (example, err)
        assert json.loads(out)["fit"]["budget_bytes"] > 0


# -- 3. inputs counted against forward ----------------------------------------------------------------
@pytest.mark.parametrize(
    "inputs, expected",
    [
        (["-i", "10"], "forward takes 2 inputs (x, z), 1 given; add another -i"),
        (["-i", "10", "-i", "5", "-i", "3"], "forward takes 2 inputs (x, z), 3 given; drop 1 -i"),
        (["-i", "x=10"], "also needs z"),
        (["-i", "x=10", "-i", "z=5", "-i", "w=3"], "has no input named w"),
    ],
)
def test_a_missing_or_extra_input_is_named_as_such(capsys, factories, inputs, expected):
    pytest.importorskip("torch")
    code, out, err = run_cli(capsys, "estimate", f"{factories}:two_inputs", *inputs, "--device", "cpu", "--no-probes")
    assert code == 2 and out == ""
    assert expected in err
    assert "error in the model code" not in err


def test_a_forward_of_star_args_takes_any_count(capsys, factories):
    pytest.importorskip("torch")
    argv = ["estimate", f"{factories}:star_args", "-i", "10", "-i", "10", "--device", "cpu", "--no-probes", "--json"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert json.loads(out)["peak_bytes"] > 0


# -- 4. --seq-len without token ids -------------------------------------------------------------------
def test_seq_len_without_token_ids_names_the_cli_syntax(capsys, factories):
    pytest.importorskip("torch")
    argv = ["estimate", f"{factories}:cnn", "-i", "3,8,8", "--seq-len", "64", "--device", "cpu", "--no-probes"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert "give integer token ids, e.g. -i input_ids=int64:LEN" in err
    assert "sequence_dim" not in err
    # the syntax it names is the CLI's
    assert cli.parse_input_shape("input_ids=int64:128").dtype == "int64"


# -- 5. the lengths said to be traced are the ones traced ---------------------------------------------
def test_seq_len_says_which_lengths_were_traced(capsys, factories):
    pytest.importorskip("torch")
    argv = ["estimate", f"{factories}:tokens", "-i", "int64:32", "--seq-len", "64", "--device", "cpu", "--no-probes"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    said = re.search(r"at sequence length 64 \(traced at ([\d, and]+)\)", out).group(1)
    noted = re.search(r"through the traces at ([\d, ]+\d)", " ".join(out.split())).group(1)
    assert re.findall(r"\d+", said) == re.findall(r"\d+", noted) == ["16", "32", "64"]
    assert "quarter" not in out
    code, out, _ = run_cli(capsys, *argv, "--json")
    assert json.loads(out)["sequence"]["traced_lengths"] == [16, 32, 64]


def test_the_seq_len_help_names_the_traced_lengths():
    text = " ".join(parsers.estimate_command_parser().format_help().split())
    assert "quarter" not in text and "at half it and at twice it" in text


# -- 6. the plot's legend says where the margin went --------------------------------------------------
@pytest.fixture
def legends(monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    seen: list[str] = []

    def savefig(figure, path, **kwargs):
        for axes in figure.axes:
            legend = axes.get_legend()
            if legend is not None:
                seen.extend(text.get_text() for text in legend.get_texts())

    monkeypatch.setattr(Figure, "savefig", savefig)
    return seen


def test_the_legend_of_a_budget_from_the_device(capsys, tmp_path, legends):
    argv = ["calc", *MLP, "-b", "64", "--device", "t4", "--plot", str(tmp_path / "mlp.png"), "--json"]
    code, out, _ = run_cli(capsys, *argv)
    fit = json.loads(out)["fit"]
    assert code == 0 and fit["budget_bytes"] == fit["usable_bytes"]
    assert not any("of the budget free" in label for label in legends)
    assert any(label.startswith("budget") and "memory less 5%" in label for label in legends), legends
    assert f"max batch {fit['max_batch_size']} (the largest under the budget line)" in legends


def test_the_legend_of_a_named_budget(capsys, tmp_path, legends):
    argv = ["calc", *MLP, "-b", "64", "--device", "t4", "--budget", "1GiB", "--plot", str(tmp_path / "mlp.png")]
    code, _, _ = run_cli(capsys, *argv, "--json")
    assert code == 0
    assert any("keeps 5% of the budget free" in label for label in legends), legends


# -- 7. the help's examples run from any folder -------------------------------------------------------
def _examples(help_text: str, command: str) -> list[str]:
    """The example command lines of a help text, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", "", help_text)
    return [line.strip() for line in joined.splitlines() if line.strip().startswith(f"nnmem {command} ")]


def _help(*argv: str) -> str:
    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])


def test_the_estimate_examples_name_the_installed_models(capsys):
    defined = {
        node.name for node in ast.parse((ROOT / "examples" / "models.py").read_text()).body if hasattr(node, "name")
    }
    for argv in ([], ["estimate"]):
        _help(*argv)
        text = capsys.readouterr().out
        assert "examples/models.py" not in text
        examples = _examples(text, "estimate")
        assert examples
        for example in examples:
            model = shlex.split(example)[2]
            if not model.startswith("mypkg."):
                module, _, name = model.partition(":")
                assert module == "nnmem_callbacks.examples.models" and name in defined, example


def test_the_calc_examples_are_whole_commands_that_run(capsys):
    _help("calc")
    text = capsys.readouterr().out
    assert not re.search(r"\S {3,}--", text.split("examples:", 1)[1]), "a line continuation lost its backslash"
    examples = _examples(text, "calc")
    assert len(examples) >= 5
    for example in examples:
        code, out, err = run_cli(capsys, *shlex.split(example)[1:], "--json")
        assert code in (0, 3), (example, err)
        assert json.loads(out)["peak_bytes"] > 0
