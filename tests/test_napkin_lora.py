"""The LoRA / QLoRA napkin formula (`nnmem calc --lora-rank`): its terms, its CLI, and what it must not do."""

from __future__ import annotations

import json

import pytest

from nnmem_callbacks import cli
from nnmem_callbacks.estimators import napkin
from nnmem_callbacks.estimators.napkin.finetune import quantized_linear_bytes

SEVEN_B = dict(layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000, seq_len=2048, batch_size=1)


def test_the_adapters_are_rank_times_in_plus_out_for_each_target_with_grouped_query_heads():
    est = napkin.lora_estimate(**{**SEVEN_B, "kv_heads": 8}, lora_rank=8, lora_targets=["q", "v", "down"])
    h, kv, f = 4096, 4096 // 32 * 8, 11008
    assert est.extra["adapter_parameters"] == 32 * 8 * ((h + h) + (h + kv) + (f + h))
    adapters = est.extra["adapter_parameters"] * 4
    assert est.breakdown["optimizer_state"] == 2 * adapters  # adam, fp32 adapters


def test_quantizing_the_base_shrinks_it_by_its_bits():
    base = {q: napkin.lora_estimate(**SEVEN_B, quantization=q).extra["base_bytes"] for q in ("none", "8bit", "4bit")}
    assert base["4bit"] < base["8bit"] < base["none"]
    linear = 4096 * 4096
    assert quantized_linear_bytes(4096, 4096, "4bit", double_quant=False) == linear // 2 + 4 * linear // 64 + 64
    assert quantized_linear_bytes(4096, 4096, "4bit") < quantized_linear_bytes(4096, 4096, "4bit", double_quant=False)


def test_checkpointing_keeps_only_layer_inputs():
    full = napkin.lora_estimate(**SEVEN_B, recompute="full")
    none = napkin.lora_estimate(**SEVEN_B, recompute="none")
    assert full.peak_bytes < none.peak_bytes / 2
    longer = napkin.lora_estimate(**{**SEVEN_B, "seq_len": 4096}, recompute="full")
    assert longer.peak_bytes > full.peak_bytes


def test_bad_input_names_what_is_valid():
    with pytest.raises(ValueError, match="lora target"):
        napkin.lora_estimate(**SEVEN_B, lora_targets=["qkv"])
    with pytest.raises(ValueError, match="kv_heads"):
        napkin.lora_estimate(**SEVEN_B, kv_heads=5)


def test_calc_lora_mode_matches_the_function_and_names_missing_options(capsys):
    argv = ["calc", "--lora-rank", "16", "--quantize", "4bit", "--layers", "32", "--hidden", "4096", "--heads", "32"]
    argv += ["--ffn", "11008", "--vocab", "32000", "--seq-len", "2048", "--recompute", "full"]
    argv += ["--precision", "bf16-true", "--optimizer", "adamw", "--device", "a100-80gb", "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    # --device a100-80gb: the A100's cuBLAS workspaces (sm80), as the function gives them for that device
    expected = napkin.lora_estimate(
        **SEVEN_B, quantization="4bit", recompute="full", precision="bf16-true", device="cuda:a100-80gb"
    )
    assert out["peak_bytes"] == expected.peak_bytes and out["method"] == "napkin:lora"
    assert cli.main(["calc", "--lora-rank", "16", "--layers", "32", "--hidden", "4096", "--heads", "32"]) == 2
    assert "also needs --seq-len, --ffn, --vocab" in capsys.readouterr().err
