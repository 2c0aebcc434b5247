"""A named card's fits use the memory CUDA reports, and the napkin sizes the CUDA libraries for the named card.

CUDA's total (``torch.cuda.mem_get_info()[1]``, an out-of-memory message's "total capacity") is ``nvidia-smi``'s
less the driver's reserve; checking a plan against ``nvidia-smi``'s total told a whole-card budget that it fits
when it runs out of memory. Before Hopper, PyTorch gives each cuBLAS handle 8.125 MiB of workspace, not 32 MiB.
"""

from __future__ import annotations

import json
import re

import pytest

from nnmem_callbacks import cli
from nnmem_callbacks.cli.gpu_fits import gpu_rows, on_card
from nnmem_callbacks.core.plan import DEFAULT_MARGIN
from nnmem_callbacks.estimators import napkin
from nnmem_callbacks.hardware import cuda_tables, gpus

H100_CUDA_TOTAL = 85_017_493_504  # gpu-runs/2026-11-23-h100/cuda_facts.json, "total"
PRE_HOPPER_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- the table ---------------------------------------------------------------------------------------------
ISSUE_URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/issues/\d+")
REPORTED = [g for g in gpus.GPUS if g.capacity_basis == "reported"]
ASSUMED = [g for g in gpus.GPUS if g.capacity_basis == "assumed"]


def test_the_measured_cuda_totals_are_the_table_s():
    h100, h200 = gpus.find_gpu("h100"), gpus.find_gpu("h200")
    assert h100.capacity_bytes == H100_CUDA_TOTAL and h100.capacity_measured and h100.capacity_basis == "measured"
    assert "cuda_facts.json" in h100.capacity_source
    # the H200's out-of-memory message: "a total capacity of 139.80 GiB" (PyTorch prints GiB to two decimals)
    assert f"{h200.capacity_bytes / 2**30:.2f}" == "139.80" and h200.capacity_measured
    assert f"{(h200.capacity_bytes - 2**20) / 2**30:.2f}" == "139.79"  # the smallest MiB that prints so
    assert "largest_batch/h200.json" in h200.capacity_source
    assert [g.name for g in gpus.GPUS if g.capacity_measured] == ["H100 80GB", "H200 141GB"]  # by this project only


@pytest.mark.parametrize("gpu", REPORTED, ids=lambda g: g.name)
def test_a_reported_total_is_the_lower_edge_of_its_figure_and_names_its_sources(gpu):
    figure = gpu.reported_gib
    assert f"{gpu.capacity_bytes / 2**30:.2f}" == figure  # prints as the message did
    assert f"{(gpu.capacity_bytes - 2**20) / 2**30:.2f}" != figure  # and is the smallest whole MiB that does
    assert not gpu.capacity_measured and gpu.capacity_reported
    assert gpu.capacity_source.startswith(f"reported: 'total capacity of {figure} GiB'")
    assert ISSUE_URL.search(gpu.capacity_source), gpu.capacity_source


# The lowest credible "total capacity" found in public out-of-memory messages naming the card (see gpus.py).
PUBLIC_FIGURES = {
    "RTX 3060 12GB": "11.75", "T4 16GB": "14.56", "A10 24GB": "21.99", "RTX 4090 24GB": "23.52",
    "RTX 3090 24GB": "23.70", "V100 32GB": "31.74", "A100 40GB": "39.50", "L40S 48GB": "44.53",
    "A100 80GB": "79.14", "H100 NVL 94GB": "93.00",
}  # fmt: skip


def test_the_public_figures_are_the_table_s():
    """The old table assumed 620 MiB off nvidia-smi's total everywhere: an A100 80GB's 79.39 GiB is more than the
    79.25 GiB (and 79.14 GiB) that A100 80GB owners' out-of-memory messages print."""
    assert {g.name: g.reported_gib for g in REPORTED} == PUBLIC_FIGURES
    for name, figure in PUBLIC_FIGURES.items():
        assert gpus.find_gpu(name).capacity_bytes == gpus.lower_edge_mib(figure) * 2**20
    assert gpus.find_gpu("a100-80gb").capacity_bytes <= gpus.lower_edge_mib("79.25") * 2**20
    assert gpus.find_gpu("t4").capacity_bytes // 2**20 == 14_905


def test_lower_edge_mib_is_the_smallest_mib_that_prints_as_the_figure():
    for figure in ("0.01", "14.56", "79.14", "93.00", "139.80"):
        mib = gpus.lower_edge_mib(figure)
        assert f"{mib / 1024:.2f}" == figure and f"{(mib - 1) / 1024:.2f}" != figure
    with pytest.raises(ValueError, match=r"two decimals, e\.g\. '14\.56'; got '14\.5'"):
        gpus.lower_edge_mib("14.5")


def test_a_recorded_total_needs_a_known_basis():
    with pytest.raises(ValueError, match="unknown CUDA total basis 'guessed'; use 'measured' or 'reported'"):
        gpus.GpuSpec("X 1GB", "x", 1, 2**30, cuda_total_bytes=2**29, cuda_total_basis="guessed")
    with pytest.raises(ValueError, match="needs its basis"):
        gpus.GpuSpec("X 1GB", "x", 1, 2**30, cuda_total_bytes=2**29)


@pytest.mark.parametrize("gpu", gpus.GPUS, ids=lambda g: g.name)
def test_every_card_offers_less_than_nvidia_smi_says(gpu):
    assert isinstance(gpu.capacity_bytes, int) and 0 < gpu.capacity_bytes < gpu.memory_bytes
    assert gpu.capacity_bytes % 2**20 == 0
    assert gpu.capacity_basis in gpus.CAPACITY_BASES


def test_the_fallback_reserve_counts_every_measured_and_reported_card():
    recorded = [g for g in gpus.GPUS if g.capacity_basis != "assumed"]
    assert sorted(gpus.recorded_reserves()) == sorted(
        (g.memory_bytes, g.memory_bytes - g.capacity_bytes) for g in recorded
    )
    a100, t4 = gpus.find_gpu("a100-80gb"), gpus.find_gpu("t4")
    assert gpus.driver_reserve_rule() == "the larger of 885 MiB and 2.96% of it"
    for smi_mib in (12_288, 16_160, 23_034, 46_068, 49_140, 200_000):
        reserve = gpus.driver_reserve_bytes(smi_mib * 2**20)
        assert reserve >= a100.memory_bytes - a100.capacity_bytes  # 885 MiB, the largest in bytes
        assert reserve / (smi_mib * 2**20) >= (t4.memory_bytes - t4.capacity_bytes) / t4.memory_bytes  # 2.96%


@pytest.mark.parametrize("gpu", ASSUMED, ids=lambda g: g.name)
def test_an_assumed_reserve_is_at_least_each_recorded_one_in_bytes_and_in_share(gpu):
    reserve = gpu.memory_bytes - gpu.capacity_bytes
    assert reserve == gpus.driver_reserve_bytes(gpu.memory_bytes)
    assert gpu.capacity_source.startswith("assumed") and gpus.driver_reserve_rule() in gpu.capacity_source
    for recorded in (g for g in gpus.GPUS if g.capacity_basis != "assumed"):
        recorded_reserve = recorded.memory_bytes - recorded.capacity_bytes
        assert reserve >= recorded_reserve
        assert reserve / gpu.memory_bytes >= recorded_reserve / recorded.memory_bytes


def test_the_known_limitations_give_the_range_of_recorded_reserves():
    def reserve(g):
        return g.memory_bytes - g.capacity_bytes

    recorded = [g for g in gpus.GPUS if g.capacity_basis != "assumed"]
    text = " ".join(gpus.__doc__.split())
    low, high = min(recorded, key=reserve), max(recorded, key=reserve)
    assert f"{reserve(low) // 2**20} MiB ({low.name}, {reserve(low) / low.memory_bytes:.2%})" in text
    assert f"to {reserve(high) // 2**20} MiB ({high.name}, {reserve(high) / high.memory_bytes:.2%})" in text
    share_low = min(recorded, key=lambda g: reserve(g) / g.memory_bytes)
    share_high = max(recorded, key=lambda g: reserve(g) / g.memory_bytes)
    assert f"from {reserve(share_low) / share_low.memory_bytes:.2%} ({share_low.name})" in text
    assert f"to {reserve(share_high) / share_high.memory_bytes:.2%} ({share_high.name})" in text
    assert "(885 MiB) and the largest recorded share of the total (the T4's, 2.96%)" in text


# -- a named card ------------------------------------------------------------------------------------------
def test_a_whole_card_budget_is_cuda_s_total():
    h100 = cli.resolve_target("h100")
    assert h100.capacity_bytes == H100_CUDA_TOTAL
    assert cli.resolve_budget_bytes("1.0", h100) == H100_CUDA_TOTAL
    assert cli.resolve_budget_bytes(None, h100) == int(H100_CUDA_TOTAL * (1 - DEFAULT_MARGIN))


def _params_for_device_bytes(low: int, high: int, **options) -> int:
    """A parameter count whose napkin device total (batch 1, no activations) lies in ``(low, high]``."""
    lo, hi = 1, 10**11
    while lo < hi:
        mid = (lo + hi) // 2
        if napkin.params_estimate(mid, 0, 1, optimizer="sgd", **options).device_bytes <= high:
            lo = mid + 1
        else:
            hi = mid
    params = lo - 1
    assert low < napkin.params_estimate(params, 0, 1, optimizer="sgd", **options).device_bytes <= high
    return params


def _counts(params: int) -> list[str]:
    """``nnmem calc``'s options for :func:`_params_for_device_bytes`'s step."""
    return ["--params", str(params), "--activations", "0", "-b", "1", "--optimizer", "sgd"]


def test_a_plan_between_the_two_totals_does_not_fit_the_whole_card(capsys):
    h100 = gpus.find_gpu("h100")
    keep = 1 - DEFAULT_MARGIN  # a named --budget keeps the margin free
    params = _params_for_device_bytes(int(h100.capacity_bytes * keep), int(h100.memory_bytes * keep), device="cuda")
    argv = ["calc", *_counts(params)]
    code, out, err = run_cli(capsys, *argv, "--device", "h100", "--budget", "1.0", "--json")
    fit = json.loads(out)["fit"]
    assert fit["budget_bytes"] == H100_CUDA_TOTAL and fit["target"]["capacity_bytes"] == H100_CUDA_TOTAL
    assert fit["target"]["nvidia_smi_bytes"] == 81_559 * 2**20 and "cuda_facts.json" in fit["target"]["capacity_source"]
    assert code == 3 and fit["fits"] is False  # nvidia-smi's total said it fits
    code, out, err = run_cli(capsys, *argv, "--device", "h100", "--budget", "1.0")
    assert code == 3 and "does NOT fit" in out
    code, out, err = run_cli(capsys, *argv, "--device", "h100")
    assert "H100 80GB's CUDA-reported memory less 5% (79.18 GiB, measured: see `nnmem gpus`)" in out


def test_which_gpu_fits_checks_each_card_against_cuda_s_total(capsys):
    h100 = gpus.find_gpu("h100")
    keep = 1 - DEFAULT_MARGIN  # a row's budget: the card's memory less the margin
    params = _params_for_device_bytes(int(h100.capacity_bytes * keep), int(h100.memory_bytes * keep), device="cuda")
    code, out, err = run_cli(capsys, "calc", *_counts(params), "--json")
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)["fit"]["gpus"]}
    row = rows["H100 80GB"]
    assert row["memory_bytes"] == h100.memory_bytes and row["capacity_bytes"] == H100_CUDA_TOTAL
    assert row["capacity_measured"] is True and row["fits"] is False and row["max_batch_size"] == 0
    code, out, err = run_cli(capsys, "calc", *_counts(params))
    table = out[out.index("Which GPU fits") :]
    assert "device total vs CUDA total minus 5%" in table and "nvidia-smi" in table
    assert " 79.65 GiB " in table and " 79.18 GiB " in table and "^14.56 GiB" in table and "~21.63 GiB" in table
    note = " ".join(table.split())  # wrapped
    assert "~ assumed: nvidia-smi's total less the driver's reserve" in note
    assert "^ reported: the lowest figure found in public out-of-memory messages" in note
    assert rows["T4 16GB"]["capacity_basis"] == "reported" and rows["L4 24GB"]["capacity_basis"] == "assumed"


def test_nnmem_gpus_shows_both_sizes_and_says_which_is_which(capsys):
    code, out, _ = run_cli(capsys, "gpus", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert (
        rows["H100 80GB"]["memory_bytes"] == 81_559 * 2**20 and rows["H100 80GB"]["capacity_bytes"] == H100_CUDA_TOTAL
    )
    t4, l4 = rows["T4 16GB"], rows["L4 24GB"]
    assert t4["capacity_measured"] is False and t4["capacity_basis"] == "reported"
    assert "https://github.com/Zheng-Chong/CatVTON/issues/133" in t4["capacity_source"]
    assert l4["capacity_basis"] == "assumed" and l4["capacity_source"].startswith("assumed")
    assert rows["H100 80GB"]["capacity_basis"] == "measured"
    code, out, _ = run_cli(capsys, "gpus")
    assert code == 0 and "nvidia-smi" in out and "CUDA total" in out and "85,017,493,504" in out
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert "^14.56 GiB" in lines["T4 16GB"] and " reported " in lines["T4 16GB"]
    assert "~21.63 GiB" in lines["L4 24GB"] and " assumed " in lines["L4 24GB"]
    assert " 79.18 GiB" in lines["H100 80GB"] and " measured " in lines["H100 80GB"]


def test_a_keras_plan_for_a_named_card_uses_cuda_s_total():
    pytest.importorskip("keras")
    from nnmem_callbacks.adapters.keras.planning import budget_capacity

    assert budget_capacity("h100", 1.0) == (H100_CUDA_TOTAL, H100_CUDA_TOTAL)


# -- the napkin's CUDA libraries per card -----------------------------------------------------------------
SHAPE = dict(layers=2, hidden=64, heads=4, seq_len=32, batch_size=4, vocab=1000)


@pytest.mark.parametrize(
    "device, workspace",
    [("cuda", 32 * 2**20), ("cuda:h100", 32 * 2**20), ("cuda:a100-80gb", PRE_HOPPER_WORKSPACE),
     ("t4", PRE_HOPPER_WORKSPACE), ("cuda:sm86", PRE_HOPPER_WORKSPACE)],
)  # fmt: skip
def test_the_napkin_counts_the_named_card_s_cublas_workspaces(device, workspace, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    for estimate in (
        napkin.transformer_estimate(**SHAPE, device=device),
        napkin.mlp_estimate([100, 50, 10], 8, device=device),
        napkin.params_estimate(10_000, 1_000, 8, device=device),
    ):
        assert estimate.breakdown["workspaces"] == 2 * workspace
        assert estimate.overhead_bytes == cuda_tables.context_figures(estimate_capability(device))[0].gemm
        assert all(values["workspaces"] == 2 * workspace for values in estimate.phase_breakdowns.values())
    assert napkin.CUDA_WORKSPACE_BYTES == napkin.cuda_workspace_bytes() == 2 * 32 * 2**20  # the default: Hopper


def estimate_capability(device: str) -> tuple[int, int]:
    return gpus.find_arch(device.split(":", 1)[-1]).capability if device not in ("cuda",) else (9, 0)


def test_a_named_card_s_napkin_is_its_own_in_what_if_and_says_so():
    estimate = napkin.transformer_estimate(**SHAPE, device="cuda:a100-80gb")
    assert any("CUDA libraries for sm80 (Ampere)" in note for note in estimate.notes)
    for _, variant in napkin.what_if(estimate):
        assert variant.breakdown["workspaces"] == 2 * PRE_HOPPER_WORKSPACE
    assert not any("CUDA libraries for" in note for note in napkin.transformer_estimate(**SHAPE).notes)


def test_an_unknown_named_device_names_what_is_valid():
    with pytest.raises(ValueError, match="device 'cuda:tpu'.*unknown CUDA architecture.*sm80.*A100 80GB"):
        napkin.params_estimate(10, 10, 1, device="cuda:tpu")
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda', 'cuda:N' or a CUDA GPU by name"):
        napkin.params_estimate(10, 10, 1, device="tpu")


def test_calc_for_a_named_card_counts_its_workspaces(capsys, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    code, out, err = run_cli(
        capsys, "calc", "--params", "1M", "--activations", "10k", "--device", "a100-80gb", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["breakdown"]["workspaces"] == 2 * PRE_HOPPER_WORKSPACE


def test_which_gpu_fits_counts_each_card_s_workspaces(capsys, monkeypatch):
    """A step whose Hopper-sized device total is just over a T4's budget fits with the T4's own workspaces."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    t4 = gpus.find_gpu("t4")
    budget = int(t4.capacity_bytes * (1 - DEFAULT_MARGIN))
    saved = 2 * (32 * 2**20 - PRE_HOPPER_WORKSPACE)
    params = _params_for_device_bytes(budget, budget + saved // 2, device="cuda")
    code, out, err = run_cli(capsys, "calc", *_counts(params), "--json")
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)["fit"]["gpus"]}
    assert rows["T4 16GB"]["fits"] is True and rows["T4 16GB"]["max_batch_size"] >= 1
    hopper = napkin.params_estimate(params, 0, 1, optimizer="sgd")
    assert hopper.device_bytes > budget  # the Hopper-sized step does not fit the T4
    assert on_card(hopper, t4).device_bytes == hopper.device_bytes - saved
    by_name = {row.name: row for row in gpu_rows(hopper, DEFAULT_MARGIN)}
    assert by_name["T4 16GB"].fits and by_name["T4 16GB"].capacity_bytes == t4.capacity_bytes
