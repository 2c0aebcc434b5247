"""A second new user's walkthrough of ``nnmem`` (2026-11-30): a budget larger than the device, options a run
would ignore (``--seq-len`` per rank, the factory options with a saved Keras model), the "what would shrink it"
of a per-rank ``calc``, and the order of the GPU tables."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from nnmem_callbacks import cli
from nnmem_callbacks.cli.compute import gathered_unit_bytes
from nnmem_callbacks.core.strategy import Strategy, shard_estimate
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.estimators import napkin
from nnmem_callbacks.hardware import gpus

COUNTS = ["--params", "19M", "--activations", "532752", "-b", "8"]
TRANSFORMER = ["--layers", "24", "--hidden", "1024", "--heads", "16", "--vocab", "50257", "--seq-len", "1024"]


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- a budget larger than the device ------------------------------------------------------------------
@pytest.mark.parametrize(
    "device, budget, where", [("t4", "100GiB", "the T4 16GB's usable memory"), ("cpu", "1000TiB", "RAM")]
)
def test_a_budget_above_the_device_memory_is_a_usage_error(capsys, device, budget, where):
    # it was taken as given: "batch 8 fits (device total 38.20 GiB)" on a 16 GB T4, exit status 0
    code, out, err = run_cli(capsys, "calc", *COUNTS, "--device", device, "--budget", budget)
    assert code == 2 and out == ""
    assert f"--budget {budget}" in err and where in err and "more than" in err
    assert "--budget 0.9" in err  # what is valid


def test_a_budget_up_to_the_device_memory_is_taken(capsys):
    t4 = gpus.find_gpu("t4").capacity_bytes  # the memory CUDA reports; nvidia-smi's total is more
    code, out, err = run_cli(capsys, "calc", *COUNTS, "--device", "t4", "--budget", f"{t4}B")
    assert code == 0, err
    assert f"budget {format_bytes(t4)} (T4 16GB)" in out
    smi = gpus.find_gpu("t4").memory_bytes
    code, out, err = run_cli(capsys, "calc", *COUNTS, "--device", "t4", "--budget", f"{smi}B")
    assert code == 2 and "more than the T4 16GB's usable memory" in err
    code, out, err = run_cli(capsys, "calc", *COUNTS, "--budget", "100GiB")  # no device: nothing to compare with
    assert code == 0, err


# -- options a run would have ignored -------------------------------------------------------------------
TOKENS = textwrap.dedent(
    """
    from torch import nn

    def tokens():
        return nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 100))
    """
)


@pytest.mark.parametrize(
    "strategy", [["--world-size", "2"], ["--world-size", "2", "--fsdp"], ["--world-size", "2", "--zero-stage", "2"]]
)
def test_seq_len_per_rank_is_a_usage_error(capsys, tmp_path, strategy):
    # the per-rank estimate has no sequence axis: --seq-len printed nothing and exited 0
    pytest.importorskip("torch")
    path = tmp_path / "tokens_model.py"
    path.write_text(TOKENS)
    argv = ["estimate", f"{path}:tokens", "-i", "int64:32", "--seq-len", "64", "--device", "cpu", "--no-probes"]
    code, out, err = run_cli(capsys, *argv, *strategy)
    assert code == 2 and out == ""
    assert "--seq-len 64" in err and "one device" in err


def test_seq_len_on_one_device_still_answers(capsys, tmp_path):
    pytest.importorskip("torch")
    path = tmp_path / "tokens_model.py"
    path.write_text(TOKENS)
    argv = ["estimate", f"{path}:tokens", "-i", "int64:32", "--seq-len", "64", "--device", "cpu", "--no-probes"]
    code, out, err = run_cli(capsys, *argv, "--world-size", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["sequence"]["seq_len"] == 64


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--world-size", "8"], "--world-size"),
        (["--fsdp"], "--fsdp"),
        (["--zero-stage", "1"], "--zero-stage"),
        (["-a", "units=64"], "--model-arg"),
    ],
)
def test_a_saved_keras_model_refuses_the_factory_options(capsys, tmp_path, extra, named):
    # they were accepted and ignored: a saved model's estimate came back for one device, as saved
    code, out, err = run_cli(capsys, "estimate", str(tmp_path / "model.keras"), "--device", "cpu", *extra)
    assert code == 2 and out == ""
    assert f"{named} applies to PyTorch factory models only" in err


# -- calc per rank: what would shrink it ---------------------------------------------------------------
@pytest.mark.parametrize("strategy", [["--world-size", "8", "--zero-stage", "3"], ["--world-size", "8"]])
def test_what_would_shrink_a_per_rank_step_is_per_rank(capsys, strategy):
    argv = ["calc", *TRANSFORMER, "-b", "8", "--precision", "bf16-mixed", "--device", "a100-40gb", *strategy]
    code, out, err = run_cli(capsys, *argv)
    assert code in (0, 3), err  # 3: DDP's per-rank step does not fit the A100 40GB at batch 8
    said = re.search(r"recompute=full: [^\n]*-> peak ([\d.]+ \w+) \(-(\d+)%\)", out)
    assert said is not None, out
    other = napkin.transformer_estimate(
        layers=24, hidden=1024, heads=16, seq_len=1024, batch_size=8, vocab=50257, precision="bf16-mixed",
        recompute="full", device="cuda:a100-40gb",
    )  # fmt: skip
    world = (
        Strategy("zero", world_size=8, zero_stage=3) if "--zero-stage" in strategy else Strategy("ddp", world_size=8)
    )
    params = int(other.extra.get("params") or other.extra["napkin"]["params"])
    rank = shard_estimate(other, world, parameters=params, gathered_bytes=gathered_unit_bytes(other))
    assert said.group(1) == format_bytes(rank.peak_bytes)
    assert said.group(1) != format_bytes(other.peak_bytes)  # the single-device figure it gave before
    assert "What would shrink it (per rank):" in out


# -- the GPU tables ---------------------------------------------------------------------------------------
def test_the_gpu_table_is_smallest_memory_first():
    """Smallest CUDA total first: the memory a fit is checked against. Where the driver's reserve differs by card
    (an A10's 23,028 MiB holds more than an L4's 23,034 MiB), nvidia-smi's totals are not in the same order."""
    memory = [gpu.capacity_bytes for gpu in gpus.GPUS]
    assert memory == sorted(memory)


def test_nnmem_gpus_and_which_gpu_fits_list_the_cards_in_one_order(capsys):
    code, out, _ = run_cli(capsys, "gpus", "--json")
    listed = [row["name"] for row in json.loads(out)]
    code, out, err = run_cli(capsys, "calc", *COUNTS, "--json")
    assert code == 0, err
    assert [row["name"] for row in json.loads(out)["fit"]["gpus"]] == listed


# -- calc: a model that cannot take its input ------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, positions",
    [(["--seq-len", "2048", "--arch", "bert"], 512), (["--seq-len", "128", "--max-positions", "64"], 64)],
)
def test_a_sequence_beyond_the_learned_positions_is_a_usage_error(capsys, extra, positions):
    # it was answered for a model of 512 (or 64) learned positions at 2048 (or 128) tokens
    code, out, err = run_cli(capsys, "calc", "--layers", "2", "--hidden", "64", "--heads", "4", *extra)
    assert code == 2 and out == ""
    assert f"{positions} learned positions" in err and "--max-positions" in err


def test_a_sequence_within_the_positions_is_taken(capsys):
    argv = ["calc", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "2048", "--max-positions", "2048"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    code, out, err = run_cli(capsys, "calc", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "1024")
    assert code == 0, err  # gpt's default: 1024 positions


@pytest.mark.parametrize("targets", [",", ""])
def test_lora_targets_that_name_no_layer_are_a_usage_error(capsys, targets):
    # LoRA without adapters was estimated
    argv = ["calc", "--lora-rank", "8", "--layers", "2", "--hidden", "64", "--heads", "4", "--ffn", "128"]
    code, out, err = run_cli(capsys, *argv, "--vocab", "100", "--seq-len", "32", "--lora-targets", targets)
    assert code == 2 and out == ""
    assert "names no layer" in err and "q,k,v,o,gate,up,down" in err


@pytest.mark.parametrize("name", ["NVIDIA H100 NVL", "H100 NVL", "h100-nvl", "H100 94GB"])
def test_the_h100_nvl_is_its_own_card(name):
    # "NVL" was dropped as a form factor, so the 94 GB H100 NVL (nvidia-smi: 95,830 MiB) was read as the H100 80GB
    gpu = gpus.find_gpu(name)
    assert gpu.nominal_gb == 94 and gpu.memory_bytes == 95_830 * 2**20
    assert gpus.find_gpu("NVIDIA H200 NVL").name == "H200 141GB"  # the H200's NVL is a form factor
    assert gpus.find_gpu("NVIDIA H100 PCIe").name == gpus.find_gpu("h100").name == "H100 80GB"


@pytest.mark.parametrize("strategy, said", [(["--world-size", "8", "--zero-stage", "3"], "per rank of zero-3 x8")])
def test_the_title_says_the_figures_are_per_rank(capsys, strategy, said):
    # the breakdown was one rank's, but only a note at the end said so
    code, out, err = run_cli(capsys, "calc", *COUNTS, *strategy)
    assert code == 0, err
    assert said in " ".join(" ".join(out.splitlines()[:2]).split())
    code, out, err = run_cli(capsys, "calc", *COUNTS)
    assert "per rank" not in out.splitlines()[0]


# -- --plot is checked before the estimate ---------------------------------------------------------------
def test_a_plot_in_a_missing_folder_is_refused_before_the_trace(capsys, tmp_path, monkeypatch):
    # the whole step was traced first (40 s for a small MLP on a busy host), then writing the figure failed
    pytest.importorskip("matplotlib")
    from nnmem_callbacks.cli import commands

    monkeypatch.setattr(commands, "run_estimate", lambda *a, **k: pytest.fail("estimated before checking --plot"))
    argv = ["estimate", "m.py:f", "-i", "4", "--device", "cpu", "--plot", str(tmp_path / "missing" / "m.png")]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert "does not exist" in err and str(tmp_path / "missing") in err


def test_a_plot_path_that_is_a_folder_names_a_file_in_it(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, out, err = run_cli(capsys, "calc", *COUNTS, "--plot", str(tmp_path))
    assert code == 2 and out == ""
    assert "is a folder" in err and str(tmp_path / "memory.png") in err
    code, out, err = run_cli(capsys, "calc", *COUNTS, "--plot", str(tmp_path / "memory"))
    assert code == 2 and "has no file suffix" in err and "not an image format" not in err


def test_input_size_takes_the_dims_input_shape_takes(capsys):
    # -i 3x224x224 was read, --input-size 3x224x224 was refused
    sizes = []
    for text in ("3,224,224", "3x224x224"):
        code, out, err = run_cli(capsys, "calc", *COUNTS, "--input-size", text, "--json")
        assert code == 0, err
        sizes.append(json.loads(out)["extra"]["napkin"]["input_size"])
    assert sizes == [3 * 224 * 224] * 2
    assert cli.parse_input_shape("3x224x224").shape == (3, 224, 224)


def test_a_factory_returning_a_keras_model_is_told_how_keras_is_estimated(capsys, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("keras")
    path = tmp_path / "keras_factory.py"
    path.write_text(
        "import keras\n\ndef build():\n    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])\n"
    )
    code, out, err = run_cli(capsys, "estimate", f"{path}:build", "-i", "8", "--device", "cpu")
    assert code == 2 and out == ""
    assert "torch.nn.Module" in err and "model.save('model.keras')" in err


def test_a_cpu_budget_line_names_the_host_ram_once(capsys):
    # "budget 1.00 GiB (cpu (host RAM))" and "cpu (host RAM)'s free memory less 5%"
    code, out, err = run_cli(capsys, "calc", *COUNTS, "--device", "cpu", "--budget", "1GiB")
    assert code == 0, err
    assert "budget 1.00 GiB (host RAM), keeping 5% free" in out and "(cpu (host RAM))" not in out
    code, out, err = run_cli(capsys, "calc", *COUNTS, "--device", "cpu")
    assert "host RAM's free memory less 5%" in out and "cpu (host RAM)'s" not in out


# -- a step that cannot run -------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", "a100-80gb", "cuda"])
def test_no_largest_batch_is_given_when_the_step_could_not_run(capsys, device):
    # the fallback counted only parameters, gradients and optimizer state (every forward failed: a GQA model for
    # a named GPU did), and the CLI said "largest batch that fits: >= 16,777,216", "verified" at that batch
    from nnmem_callbacks.cli.compute import fit_summary
    from nnmem_callbacks.cli.render import estimate_to_json, render_estimate
    from nnmem_callbacks.cli.targets import resolve_budget_bytes, resolve_target
    from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine

    static = MemoryEstimate(
        peak_bytes=3 * 2**30,
        breakdown={"parameters": 2**30, "optimizer_state": 2 * 2**30},
        batch_size=8,
        phases=(PhaseLine("step2/optimizer", 3 * 2**30 - 8 * 64, 64),),
        method="static-only",
        reserved_bytes=3 * 2**30,
    )
    target = resolve_target(device)
    budget = None if device == "cuda" and target.capacity_bytes is None else resolve_budget_bytes(None, target)
    fit = fit_summary(static, target, budget, budget_named=False)
    render_estimate(static, fit, title="static", why=())
    out = capsys.readouterr().out
    assert "16,777,216" not in out and "verified" not in out.lower()
    if budget is not None:
        assert "largest batch that fits: unknown (the step could not run" in out
    document = json.loads(estimate_to_json(static, fit))
    assert document["fit"]["max_batch_size"] is None
    assert all(row["max_batch_size"] is None for row in document["fit"]["gpus"])


@pytest.mark.parametrize(
    "argv, named",
    [
        (["calc", "--params", "1M", "--activations", "1000", "-b", "2", "--budget", "-1GiB"], "cannot read '-1GiB'"),
        (
            ["calc", "--layers", "-5,10", "--hidden", "64", "--heads", "4", "--vocab", "100", "--seq-len", "16"],
            "--layers",
        ),
    ],
)
def test_a_negative_value_gets_its_own_check_not_argparses_expected_one_argument(capsys, argv, named):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert named in err and "expected one argument" not in err
