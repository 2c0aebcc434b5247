"""``nnmem`` per rank (2026-11-30, third walk): ``--fsdp``/``--zero-stage`` need ``--world-size`` in both commands,
and ZeRO under bf16-mixed / 16-mixed holds DeepSpeed's bytes through both."""

from __future__ import annotations

import json
import textwrap

import pytest

from nnmem_callbacks import cli

COUNTS = ["--params", "1M", "--activations", "1000", "-b", "8"]
MLP = textwrap.dedent(
    """
    from torch import nn

    def mlp():
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    """
)


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def mlp_file(tmp_path):
    pytest.importorskip("torch")
    path = tmp_path / "per_rank_mlp.py"
    path.write_text(MLP)
    return f"{path}:mlp"


@pytest.mark.parametrize("flags, named", [(["--fsdp"], "--fsdp"), (["--zero-stage", "3"], "--zero-stage 3")])
def test_sharding_without_a_world_size_is_a_usage_error_in_calc(capsys, flags, named):
    # it answered for one rank holding everything, titled "per rank of fsdp x1", with exit status 0
    code, out, err = run_cli(capsys, "calc", *COUNTS, *flags)
    assert code == 2 and out == ""
    assert f"{named} shards over --world-size ranks" in err and f"--world-size 8 {named}" in err


@pytest.mark.parametrize("flags, named", [(["--fsdp"], "--fsdp"), (["--zero-stage", "2"], "--zero-stage 2")])
def test_sharding_without_a_world_size_is_a_usage_error_in_estimate(capsys, mlp_file, flags, named):
    code, out, err = run_cli(capsys, "estimate", mlp_file, "-i", "64", "--device", "cpu", "--no-probes", *flags)
    assert code == 2 and out == ""
    assert f"{named} shards over --world-size ranks" in err


def test_a_world_size_given_keeps_the_per_rank_answer_and_calcs_gpu_counts(capsys):
    code, out, err = run_cli(capsys, "calc", *COUNTS, "--world-size", "8", "--fsdp", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["extra"]["strategy"]["world_size"] == 8
    assert any(row.get("gpus_needed") for row in document["fit"]["gpus"])
    code, out, err = run_cli(capsys, "calc", *COUNTS, "--world-size", "1", "--json")  # one device, said explicitly
    assert code == 0, err


def test_the_help_says_sharding_needs_a_world_size(capsys):
    for command in ("estimate", "calc"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "over --world-size (required with it" in out, command


def test_calc_zero_under_bf16_mixed_holds_deepspeeds_bytes(capsys):
    """DeepSpeed's bf16 mode at ZeRO-2 over 4 ranks: 2 bytes of 16-bit parameters whole, 2 + 4 of gradients (16-bit
    partition and its fp32 copy) and 4 + 8 of master weights and Adam state split (it held fp32 parameters before)."""
    argv = ["calc", *COUNTS, "--world-size", "4", "--zero-stage", "2", "--device", "h100", "--json"]
    code, out, err = run_cli(capsys, *argv, "--precision", "bf16-mixed")
    assert code == 0, err
    breakdown = json.loads(out)["breakdown"]
    assert breakdown["parameters"] == 2 * 10**6
    assert breakdown["optimizer_state"] == 12 * 10**6 // 4
    code, out, err = run_cli(capsys, *argv)
    assert json.loads(out)["breakdown"]["parameters"] == 4 * 10**6  # 32-true: DeepSpeed in fp32


def test_calc_zero_under_bf16_true_holds_deepspeeds_fp32_masters(capsys):
    """bf16-true under ZeRO (Lightning's DeepSpeedStrategy runs DeepSpeed's bf16 mode): the same bytes as
    bf16-mixed, fp32 master weights and Adam state split; it held 16-bit Adam state and no master weights."""
    argv = ["calc", *COUNTS, "--world-size", "4", "--zero-stage", "2", "--device", "h100", "--json"]
    code, out, err = run_cli(capsys, *argv, "--precision", "bf16-true")
    assert code == 0, err
    breakdown = json.loads(out)["breakdown"]
    code, out, err = run_cli(capsys, *argv, "--precision", "bf16-mixed")
    mixed = json.loads(out)["breakdown"]
    assert breakdown["parameters"] == 2 * 10**6 and breakdown["optimizer_state"] == 12 * 10**6 // 4
    assert breakdown["gradients"] == mixed["gradients"] == (2 + 4) * 10**6 // 4


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_estimate_zero_under_bf16_mixed_holds_deepspeeds_bytes(capsys, mlp_file, precision):
    params = 2 * 64 * 65 + 650
    argv = ["estimate", mlp_file, "-i", "64", "-b", "4", "--device", "cpu", "--no-probes", "--json"]
    code, out, err = run_cli(capsys, *argv, "--world-size", "4", "--zero-stage", "3", "--precision", precision)
    assert code == 0, err
    breakdown = json.loads(out)["breakdown"]
    assert breakdown["parameters"] == -(-2 * params // 4)
    assert breakdown["optimizer_state"] == -(-12 * params // 4)
