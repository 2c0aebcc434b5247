"""The built-in GPU table and its forgiving name lookup."""

from __future__ import annotations

import pytest

from nnmem_callbacks.core.units import GiB
from nnmem_callbacks.hardware import gpus


@pytest.mark.parametrize(
    "spelling, expected",
    [
        ("a100-80gb", "A100 80GB"),
        ("A100 80GB", "A100 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("a100 80g", "A100 80GB"),
        ("h100", "H100 80GB"),
        ("NVIDIA H100 80GB HBM3", "H100 80GB"),
        ("H200", "H200 141GB"),
        ("Tesla T4", "T4 16GB"),
        ("t4", "T4 16GB"),
        ("L4", "L4 24GB"),
        ("a10g", "A10 24GB"),
        ("rtx 4090", "RTX 4090 24GB"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090 24GB"),
        ("Tesla V100-SXM2-16GB", "V100 16GB"),
        ("v100-32gb", "V100 32GB"),
        ("RTX A6000", "RTX A6000 48GB"),
        ("l40s", "L40S 48GB"),
    ],
)
def test_find_gpu_reads_common_spellings(spelling, expected):
    assert gpus.find_gpu(spelling).name == expected


@pytest.mark.parametrize("name, options", [("a100", ["A100 40GB", "A100 80GB"]), ("V100", ["V100 16GB", "V100 32GB"])])
def test_ambiguous_names_list_the_choices(name, options):
    with pytest.raises(ValueError) as info:
        gpus.find_gpu(name)
    message = str(info.value)
    assert "ambiguous" in message
    for option in options:
        assert option in message


def test_unknown_name_lists_valid_gpus():
    with pytest.raises(ValueError, match="valid GPUs: .*H100 80GB"):
        gpus.find_gpu("tpu-v5")


def test_issue_capacities():
    """The capacities the issue names: T4 16, L4/A10/3090/4090 24, A100 40/80, H100 80, H200 141, A6000/L40S 48."""
    expected = {
        "T4 16GB": 16,
        "L4 24GB": 24,
        "A10 24GB": 24,
        "A100 40GB": 40,
        "A100 80GB": 80,
        "H100 80GB": 80,
        "H200 141GB": 141,
        "RTX 3090 24GB": 24,
        "RTX 4090 24GB": 24,
        "V100 16GB": 16,
        "V100 32GB": 32,
        "RTX A6000 48GB": 48,
        "L40S 48GB": 48,
    }
    table = {gpu.name: gpu for gpu in gpus.GPUS}
    for name, nominal in expected.items():
        assert table[name].nominal_gb == nominal


@pytest.mark.parametrize("gpu", gpus.GPUS, ids=lambda g: g.name)
def test_memory_is_close_to_the_box(gpu):
    # nvidia-smi totals sit between ~93% of the decimal GB on the box and the binary GiB.
    assert 0.93 * gpu.nominal_gb * 1000**3 <= gpu.memory_bytes <= gpu.nominal_gb * GiB
    assert isinstance(gpu.memory_bytes, int)


def test_every_card_is_reachable_by_its_display_name():
    for gpu in gpus.GPUS:
        assert gpus.find_gpu(gpu.name) is gpu
        assert gpus.is_gpu_name(gpu.name.lower())


def test_non_gpu_names():
    assert not gpus.is_gpu_name("cpu")
    assert not gpus.is_gpu_name("a100")
    with pytest.raises(ValueError, match="empty GPU name"):
        gpus.find_gpu("  ")


@pytest.mark.parametrize(
    "name, capability, arch",
    [
        ("h100", (9, 0), "Hopper"),
        ("a100-40gb", (8, 0), "Ampere"),
        ("t4", (7, 5), "Turing"),
        ("l4", (8, 9), "Ada"),
        ("sm86", (8, 6), "Ampere"),
        ("9.0", (9, 0), "Hopper"),
        ("a100", (8, 0), "Ampere"),
        ("Volta", (7, 0), "Volta"),
    ],
)
def test_find_arch_reads_gpus_capabilities_and_names(name, capability, arch):
    found = gpus.find_arch(name)
    assert found.capability == capability and found.name == arch


def test_every_gpu_has_a_known_architecture():
    for gpu in gpus.GPUS:
        assert gpu.arch.capability in gpus.ARCHITECTURES


def test_unknown_architecture_names_what_is_valid():
    with pytest.raises(ValueError, match="unknown CUDA architecture 'x9'.*sm80.*Hopper.*H100 80GB"):
        gpus.find_arch("x9")
    with pytest.raises(ValueError, match="unknown compute capability 4.2"):
        gpus.cuda_arch((4, 2))
