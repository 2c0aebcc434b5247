"""Napkin formulas (``nnmem calc``) against the traced PyTorch estimator.

For GPT-2 and BERT models built from ``transformers`` configs (random
weights, nothing downloaded) and for MLPs, compare the closed-form estimate of
:mod:`nnmem_callbacks.estimators.napkin` with ``estimate_training`` on the same step
(same batch, optimizer, precision and CUDA target; the loss is the model's own
cross-entropy over ``labels``). Writes ``benchmarks/results/napkin_vs_trace/<stem>.md``
and ``.json`` (``--stem``, the host, default ``cpu``).

The traced estimator is the reference here, not a measurement; its own
accuracy against real runs is in ``benchmarks/results`` (accuracy suite).

Run: ``python -m benchmarks.suites.napkin_vs_trace [--targets cpu,cuda] [--stem HOST]`` (about two minutes on 2 CPU cores).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
import time
import warnings
from typing import Any, Callable

import torch

from benchmarks.common.paths import result_dir
from nnmem_callbacks import estimate_training
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.estimators import napkin

__all__ = [
    "RESULTS",
    "CATEGORIES",
    "Case",
    "transformer_case",
    "mlp_case",
    "CASES",
    "run_case",
    "to_markdown",
    "main",
]

RESULTS = result_dir("napkin_vs_trace")
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")


@dataclasses.dataclass
class Case:
    name: str
    description: str
    make_model: Callable[[], torch.nn.Module]
    make_batch: Callable[[], Any]
    napkin: Callable[[str], MemoryEstimate]
    optimizer: str
    precision: str


def _gpt2(layers: int, hidden: int, heads: int, vocab: int, positions: int, attn: str) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab, n_positions=positions, use_cache=False
        )
        config._attn_implementation = attn
        return GPT2LMHeadModel(config)

    return make


def _bert(layers: int, hidden: int, heads: int, vocab: int, attn: str) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
            vocab_size=vocab,
        )
        config._attn_implementation = attn
        return BertForMaskedLM(config)

    return make


def _tokens(batch: int, seq: int) -> Callable[[], Any]:
    def make() -> dict[str, torch.Tensor]:
        ids = torch.empty(batch, seq, dtype=torch.int64, device="meta")
        return {"input_ids": ids, "labels": torch.empty(batch, seq, dtype=torch.int64, device="meta")}

    return make


def _mlp(widths: list[int]) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        layers: list[torch.nn.Module] = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            layers.append(torch.nn.Linear(a, b))
            if i < len(widths) - 2:
                layers.append(torch.nn.ReLU())
        return torch.nn.Sequential(*layers)

    return make


def _mlp_batch(batch: int, widths: list[int]) -> Callable[[], Any]:
    return lambda: (torch.empty(batch, widths[0], device="meta"), torch.empty(batch, dtype=torch.int64, device="meta"))


def _mlp_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def transformer_case(
    name: str,
    arch: str,
    layers: int,
    hidden: int,
    heads: int,
    vocab: int,
    seq: int,
    batch: int,
    optimizer: str,
    precision: str,
    attn: str = "eager",
) -> Case:
    positions = 1024 if arch == "gpt" else 512
    make_model = (
        _gpt2(layers, hidden, heads, vocab, positions, attn)
        if arch == "gpt"
        else _bert(layers, hidden, heads, vocab, attn)
    )
    attention = "eager" if attn == "eager" else "flash"
    return Case(
        name,
        f"{arch} L={layers} h={hidden} a={heads} V={vocab} s={seq} b={batch}, {optimizer}, {precision}, {attn} attention",
        make_model,
        _tokens(batch, seq),
        lambda device: napkin.transformer_estimate(
            device=device,
            layers=layers,
            hidden=hidden,
            heads=heads,
            vocab=vocab,
            seq_len=seq,
            batch_size=batch,
            arch=arch,
            optimizer=optimizer,
            precision=precision,
            attention=attention,
            max_positions=positions,
            activation="gelu_new" if arch == "gpt" else "gelu",
        ),
        optimizer,
        precision,
    )


#: The 7B shape of Llama 2: layers, hidden, heads, ffn, vocab.
LLAMA_7B = (32, 4096, 32, 11008, 32000)


def _llama_lora(quantization: str, checkpointing: bool) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        import peft
        import transformers

        layers, hidden, heads, ffn, vocab = LLAMA_7B
        config = transformers.LlamaConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=ffn,
            vocab_size=vocab, max_position_embeddings=4096, use_cache=False,
        )  # fmt: skip
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        if quantization != "none":
            from transformers.integrations.bitsandbytes import replace_with_bnb_linear

            quantized = transformers.BitsAndBytesConfig(
                load_in_4bit=quantization == "4bit",
                load_in_8bit=quantization == "8bit",
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=torch.bfloat16,
            )
            model = replace_with_bnb_linear(model, quantization_config=quantized, modules_to_not_convert=["lm_head"])
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        adapters = peft.LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        return peft.get_peft_model(model, adapters)

    return make


def lora_case(name: str, quantization: str, checkpointing: bool, seq: int = 2048, batch: int = 1) -> Case:
    """Llama-2-7B-shaped LoRA / QLoRA from meta tensors; the trace keeps the model's dtypes (bf16 base, fp32 adapters
    as peft makes them), which is what the napkin's ``bf16-true`` means for a fine-tune."""
    layers, hidden, heads, ffn, vocab = LLAMA_7B
    recompute = "full" if checkpointing else "none"
    return Case(
        name,
        f"Llama-7B shape, LoRA r=16 on q,k,v,o, base {quantization}, s={seq} b={batch}, adamw, "
        f"checkpointing {'on' if checkpointing else 'off'}",
        _llama_lora(quantization, checkpointing),
        _tokens(batch, seq),
        lambda device: napkin.lora_estimate(
            layers=layers,
            hidden=hidden,
            heads=heads,
            ffn=ffn,
            vocab=vocab,
            seq_len=seq,
            batch_size=batch,
            quantization=quantization,
            recompute=recompute,
            optimizer="adamw",
            precision="bf16-true",
            device=device,
        ),  # fmt: skip
        "adamw",
        "32-true",
    )


def mlp_case(name: str, widths: list[int], batch: int, optimizer: str, precision: str) -> Case:
    return Case(
        name,
        f"MLP {','.join(map(str, widths))} b={batch}, {optimizer}, {precision}",
        _mlp(widths),
        _mlp_batch(batch, widths),
        lambda device: napkin.mlp_estimate(widths, batch, optimizer=optimizer, precision=precision, device=device),
        optimizer,
        precision,
    )


CASES = [
    transformer_case("gpt2-small fp32", "gpt", 12, 768, 12, 50257, 128, 8, "adamw", "32-true"),
    transformer_case("gpt2-small bf16-mixed", "gpt", 12, 768, 12, 50257, 128, 8, "adamw", "bf16-mixed"),
    transformer_case("gpt2-small fp32 sdpa", "gpt", 12, 768, 12, 50257, 128, 8, "adamw", "32-true", attn="sdpa"),
    transformer_case("gpt-mini long seq", "gpt", 4, 256, 4, 8000, 512, 8, "adam", "32-true"),
    transformer_case("bert-base fp32 (seed)", "bert", 12, 768, 12, 30522, 128, 32, "adamw", "32-true"),
    transformer_case("bert-base 16-mixed", "bert", 12, 768, 12, 30522, 128, 32, "adamw", "16-mixed"),
    mlp_case("mlp seed", [1000, 100, 100, 100, 100, 10], 256, "sgd", "32-true"),
    mlp_case("mlp 784-512-512-10", [784, 512, 512, 10], 128, "adam", "16-mixed"),
    lora_case("7B QLoRA nf4, checkpointing", "4bit", True),
    lora_case("7B QLoRA nf4", "4bit", False, seq=512),
    lora_case("7B LoRA 8-bit base, checkpointing", "8bit", True),
    lora_case("7B LoRA bf16 base, checkpointing", "none", True),
]


def run_case(case: Case, device: str) -> dict[str, Any]:
    model = case.make_model()
    batch = case.make_batch()
    loss_fn = _mlp_loss if isinstance(batch, tuple) else None
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = estimate_training(
            model, batch, optimizer=case.optimizer, loss_fn=loss_fn, precision=case.precision, device=device
        )
    trace_seconds = time.perf_counter() - started
    started = time.perf_counter()
    napkin_est = case.napkin(device)
    napkin_seconds = time.perf_counter() - started
    error = (napkin_est.peak_bytes - traced.peak_bytes) / traced.peak_bytes
    return {
        "case": case.name,
        "target": device,
        "description": case.description,
        "trace_peak_bytes": traced.peak_bytes,
        "napkin_peak_bytes": napkin_est.peak_bytes,
        "error": round(error, 4),
        "trace_method": traced.method,
        "trace_peak_phase": traced.peak_phase,
        "napkin_peak_phase": napkin_est.peak_phase,
        "trace_breakdown": dict(traced.breakdown),
        "napkin_breakdown": dict(napkin_est.breakdown),
        "trace_seconds": round(trace_seconds, 2),
        "napkin_seconds": round(napkin_seconds, 5),
        "trace_notes": list(traced.notes),
    }


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| case | setting | trace peak | napkin peak | error | trace phase | napkin phase |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['case']} | {row['description']} | {format_bytes(row['trace_peak_bytes'])} | "
            f"{format_bytes(row['napkin_peak_bytes'])} | {row['error']:+.1%} | {row['trace_peak_phase']} | "
            f"{row['napkin_peak_phase']} |"
        )
    errors = [abs(row["error"]) for row in rows]
    lines += ["", f"Mean absolute error {sum(errors) / len(errors):.1%}, worst {max(errors):.1%}."]
    return lines


def to_markdown(rows: list[dict[str, Any]], environment: dict[str, str]) -> str:
    lines = [
        "# Napkin formulas vs the traced estimator",
        "",
        f"Generated by `benchmarks/suites/napkin_vs_trace.py` ({environment['torch']}, transformers "
        f"{environment['transformers']}, {environment['machine']}; no GPU). Error = (napkin - trace) / trace "
        "of the tensor peak; the trace (`estimate_training`) is the reference. Each case runs for a CPU target "
        "and for a CUDA target (the CUDA trace runs on CPU fake tensors with the CUDA allocator model).",
        "",
        "Known difference on the CUDA target: without a GPU the trace runs CPU kernels, and CPU dropout keeps a "
        "noise tensor in the activation dtype (4 bytes in fp32) where CUDA's fused dropout keeps a 1-byte mask. "
        "The napkin formula uses CUDA's 1-byte masks for CUDA targets, so transformer cases with dropout differ "
        "by about 3 bytes per mask element (per layer ~6*s*b*h + 3*a*s*s*b in fp32).",
    ]
    for target in ("cpu", "cuda"):
        subset = [row for row in rows if row["target"] == target]
        if subset:
            lines += ["", f"## Target {target}", ""] + _table(subset)
    lines += [
        "",
        "## Per category at the peak (trace / napkin)",
        "",
        "| case | target | " + " | ".join(CATEGORIES) + " |",
        "|---|---|" + "---:|" * len(CATEGORIES),
    ]
    for row in rows:
        cells = [
            f"{format_bytes(row['trace_breakdown'][c])} / {format_bytes(row['napkin_breakdown'][c])}"
            for c in CATEGORIES
        ]
        lines.append(f"| {row['case']} | {row['target']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Trace time per case (three traces for the batch scaling): "
        + ", ".join(f"{row['case']} ({row['target']}) {row['trace_seconds']} s" for row in rows)
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="cpu,cuda", help="comma-separated targets, e.g. --targets cuda")
    parser.add_argument("--stem", default="cpu", help="the result's file name: the host (zen4-avx512, ...)")
    args = parser.parse_args(argv)
    environment = {
        "torch": f"torch {torch.__version__}",
        "transformers": transformers.__version__,
        "machine": f"{platform.machine()} {platform.system()}, python {platform.python_version()}",
    }
    rows = []
    for target in args.targets.split(","):
        for case in CASES:
            row = run_case(case, target)
            rows.append(row)
            print(
                f"{target:<5} {row['case']:<24} trace {format_bytes(row['trace_peak_bytes']):>12}  napkin "
                f"{format_bytes(row['napkin_peak_bytes']):>12}  error {row['error']:+.1%}  ({row['trace_seconds']} s)",
                flush=True,
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps({"environment": environment, "cases": rows}, indent=2) + "\n")
    (RESULTS / f"{args.stem}.md").write_text(to_markdown(rows, environment))
    print(f"wrote {RESULTS / args.stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
