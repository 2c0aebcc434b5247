"""Fine-tuning as users do it: LoRA, DoRA, IA3, prompt tuning, QLoRA, 8-bit weights and optimizers, MoE, against real CPU steps.

Usage::

    python -m benchmarks.suites.finetune --stem zen4-avx512
    python -m benchmarks.suites.finetune --stem zen4-avx512 --only llama-qlora   # some cases (name prefixes)
    python -m benchmarks.suites.finetune --stem h100 --device cuda               # on a GPU machine

Every case runs in a fresh process (``--worker NAME``): the model is built from a
``transformers`` config (saved to a temporary folder, then loaded with
``from_pretrained`` so that transformers' own ``BitsAndBytesConfig`` replacement
code quantizes it, as it does for users; no weights are downloaded), wrapped by
``peft``, estimated with ``estimate_training``, then trained for two real steps
under the profiler. Truth: the peak of live CPU tensor bytes from the profiler's
allocation events (:func:`benchmarks.common.groundtruth.measure_cpu_peak`) plus
the quantization state (block scales and code books; 8-bit row scales), which is
not a parameter or buffer and so is not in that function's baseline. Paged
optimizers fall back to ordinary state on CPU (bitsandbytes warns). Error = (predicted - truth)
/ truth. Every case at two sequence lengths. Writes
``benchmarks/results/finetune/<stem>.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch

from benchmarks.common.paths import result_dir

__all__ = ["CASES", "main", "measure_case"]

RESULTS = result_dir("finetune")
LENGTHS = (64, 128)
BATCH = 4
MODEL_DIR = os.path.join(os.environ.get("TMPDIR", "/tmp"), "nnmem-finetune-models")
ATTENTION_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]

#: architecture -> (config class name, config fields, LoRA target modules)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "gpt2": ("GPT2Config", dict(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=512), ["c_attn", "c_proj"]),
    "llama": (
        "LlamaConfig",
        dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=8192, max_position_embeddings=512),
        ATTENTION_MODULES,
    ),
    "mistral": (
        "MistralConfig",
        dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=8192, max_position_embeddings=512, sliding_window=96),
        ATTENTION_MODULES,
    ),
    "qwen2": (
        "Qwen2Config",
        dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=8192, max_position_embeddings=512),
        ATTENTION_MODULES + ["gate_proj", "up_proj", "down_proj"],
    ),
    "mixtral": (
        "MixtralConfig",
        dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, vocab_size=8192,
             max_position_embeddings=512),
        ATTENTION_MODULES,
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=256, shared_expert_intermediate_size=512,
             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, num_experts=8,
             num_experts_per_tok=2, vocab_size=8192, max_position_embeddings=512),
        ATTENTION_MODULES,
    ),
}  # fmt: skip

#: name -> (architecture, adapter, quantization, options)
CASES: dict[str, tuple[str, str, dict[str, Any] | None, dict[str, Any]]] = {
    "gpt2-lora": ("gpt2", "lora", None, {}),
    "gpt2-dora": ("gpt2", "dora", None, {}),
    "llama-lora": ("llama", "lora", None, {}),
    "llama-lora-checkpointing": ("llama", "lora", None, {"checkpointing": True}),
    "llama-ia3": ("llama", "ia3", None, {}),
    "mistral-lora": ("mistral", "lora", None, {}),
    "qwen2-lora-bf16": ("qwen2", "lora", None, {"dtype": "bfloat16"}),
    "llama-qlora-nf4-dq": ("llama", "lora", {"quant_type": "nf4", "double": True}, {}),
    "llama-qlora-nf4": ("llama", "lora", {"quant_type": "nf4", "double": False}, {}),
    "llama-qlora-fp4-dq": ("llama", "lora", {"quant_type": "fp4", "double": True}, {}),
    "llama-qlora-fp4-fp32-compute": ("llama", "lora", {"quant_type": "fp4", "double": False, "compute": "float32"}, {}),
    "llama-qlora-nf4-kbit-prepared": ("llama", "lora", {"quant_type": "nf4", "double": True}, {"prepare_kbit": True}),
    "qwen2-qlora-nf4-dq": ("qwen2", "lora", {"quant_type": "nf4", "double": True}, {}),
    "llama-lora-8bit-weights": ("llama", "lora", {"bits": 8}, {}),
    "llama-lora-torchao-int8-weights": ("llama", "lora", None, {"torchao": "int8"}),
    "llama-qlora-nf4-paged-adamw-8bit": ("llama", "lora", {"quant_type": "nf4", "double": True}, {"optimizer": "paged_adamw8bit"}),
    "llama-lora-paged-adamw-32bit": ("llama", "lora", None, {"optimizer": "paged_adamw32bit"}),
    "llama-lora-adafactor": ("llama", "lora", None, {"optimizer": "adafactor"}),
    "llama-lora-fused-adamw": ("llama", "lora", None, {"optimizer": "adamw_fused"}),
    "llama-prompt-tuning": ("llama", "prompt", None, {}),
    "mixtral-full": ("mixtral", "full", None, {}),
    "mixtral-batched-mm-full": ("mixtral", "full", None, {"experts": "batched_mm"}),
    "mixtral-lora": ("mixtral", "lora", None, {}),
    "mixtral-full-one-sided-routing": ("mixtral", "full", None, {"routing": "one-sided"}),
    "qwen2-moe-full": ("qwen2_moe", "full", None, {}),
    "mistral-qlora-nf4-dq-8bit-adamw": ("mistral", "lora", {"quant_type": "nf4", "double": True}, {"optimizer": "adamw8bit"}),
}  # fmt: skip


def _saved_model(architecture: str) -> str:
    import transformers

    class_name, fields, _ = ARCHITECTURES[architecture]
    path = os.path.join(MODEL_DIR, architecture)
    if not os.path.exists(os.path.join(path, "config.json")):
        config = getattr(transformers, class_name)(**fields)
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def build(name: str, device: str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """The case's peft model, built as a user builds it on ``device``; returns ``(model, options)``."""
    import peft
    import transformers

    architecture, adapter, quantization, options = CASES[name]
    path = _saved_model(architecture)
    dtype = getattr(torch, options.get("dtype", "float32"))
    if quantization is not None and quantization.get("bits") == 8:
        config = transformers.BitsAndBytesConfig(load_in_8bit=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=config, device_map=device)
    elif quantization is not None:
        compute = getattr(torch, quantization.get("compute", "bfloat16"))
        config = transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=quantization["quant_type"],
            bnb_4bit_use_double_quant=quantization["double"],
            bnb_4bit_compute_dtype=compute,
        )
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, quantization_config=config, device_map=device, dtype=compute
        )
    else:
        extra = {"experts_implementation": options["experts"]} if "experts" in options else {}
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra).to(device)
    if options.get("torchao") == "int8":
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        def in_layers(module: torch.nn.Module, name: str) -> bool:
            return isinstance(module, torch.nn.Linear) and ".layers." in f".{name}"

        quantize_(model, Int8WeightOnlyConfig(), filter_fn=in_layers)
        model.requires_grad_(False)
    if options.get("prepare_kbit"):
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    elif options.get("checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    if options.get("routing") == "one-sided":
        _route_every_token_to_the_first_experts(model)
    targets = ARCHITECTURES[architecture][2]
    if adapter == "full":
        model.train()
        return model, options
    if adapter in ("lora", "dora"):
        adapter_config = peft.LoraConfig(
            r=16, lora_alpha=32, target_modules=targets, use_dora=adapter == "dora", task_type="CAUSAL_LM",
            fan_in_fan_out=architecture == "gpt2",
        )  # fmt: skip
    elif adapter == "prompt":
        adapter_config = peft.PromptTuningConfig(num_virtual_tokens=16, task_type="CAUSAL_LM")
    elif adapter == "ia3":
        adapter_config = peft.IA3Config(
            target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]
        )
    else:
        raise ValueError(f"unknown adapter {adapter!r}")
    model = peft.get_peft_model(model, adapter_config)
    model.train()
    return model, options


def _route_every_token_to_the_first_experts(model: torch.nn.Module) -> None:
    """The most unbalanced routing top-k allows: every token to experts 0..k-1 (for estimate and truth alike)."""
    for module in model.modules():
        if type(module).__name__.endswith("TopKRouter"):
            original = module.forward

            def forward(hidden_states: torch.Tensor, original: Any = original) -> Any:
                logits, scores, indices = original(hidden_states)
                first = torch.arange(indices.shape[-1], device=indices.device).expand_as(indices)
                return logits, scores, first.to(indices.dtype)

            module.forward = forward


def make_optimizer(name: str):
    def build_optimizer(parameters: Any) -> torch.optim.Optimizer:
        trainable = [p for p in parameters if p.requires_grad]
        if name in ("adamw8bit", "paged_adamw8bit", "paged_adamw32bit"):
            import bitsandbytes

            kind = {
                "adamw8bit": "AdamW8bit",
                "paged_adamw8bit": "PagedAdamW8bit",
                "paged_adamw32bit": "PagedAdamW32bit",
            }
            return getattr(bitsandbytes.optim, kind[name])(trainable, lr=1e-4)
        if name == "adafactor":
            from transformers.optimization import Adafactor

            return Adafactor(trainable, lr=1e-4, relative_step=False, scale_parameter=False)
        return torch.optim.AdamW(trainable, lr=1e-4, fused=name == "adamw_fused")

    return build_optimizer


def _loss(model: Any, batch: Any) -> Any:
    return model(**batch).loss


def quantization_state_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The block scales, offsets and code books of bitsandbytes' 4-bit weights, and the row scales of 8-bit ones."""
    out = []
    for module in model.modules():
        state = getattr(module, "state", None)
        weight = getattr(module, "weight", None)
        scales = getattr(state, "SCB", None) if state is not None else None
        scales = scales if scales is not None else getattr(weight, "SCB", None)
        if isinstance(scales, torch.Tensor):
            out.append(scales)
    for parameter in model.parameters():
        state = getattr(parameter, "quant_state", None)
        while state is not None:
            out += [t for t in (state.absmax, state.code, getattr(state, "offset", None)) if t is not None]
            state = state.state2
    return out


def measure_case(name: str, length: int, device: str = "cpu") -> dict[str, Any]:
    """One case in this process. CPU: estimate, then two real steps under the profiler. CUDA: the real steps first
    (``max_memory_allocated`` in a fresh process, as the accuracy suite measures), then the estimate."""
    from benchmarks.common import groundtruth
    from nnmem_callbacks.torch import estimate_training

    model, options = build(name, device)
    optimizer = make_optimizer(options.get("optimizer", "adamw"))
    torch.manual_seed(1)
    ids = torch.randint(0, 8192, (BATCH, length), device=device)
    batch = {"input_ids": ids, "labels": ids}
    state_bytes = 0
    if device.startswith("cuda"):  # the quantization state is on the device before the peak statistics are reset
        truth = groundtruth.measure_cuda_peak(model, batch, optimizer, _loss)
        measured = truth["peak_bytes"]
    started = time.perf_counter()
    estimate = estimate_training(model, batch, optimizer=optimizer, loss_fn=_loss, check_scaling=False, device=device)
    seconds = time.perf_counter() - started
    if not device.startswith("cuda"):
        state_bytes = groundtruth.live_bytes(quantization_state_tensors(model), "cpu")
        truth = groundtruth.measure_cpu_peak(model, batch, optimizer, _loss, copy_model=False)
        measured = truth["peak_bytes"] + state_bytes
    return {
        "case": name,
        "length": length,
        "batch": BATCH,
        "device": device,
        "method": estimate.method,
        "predicted_bytes": estimate.peak_bytes,
        "measured_bytes": measured,
        "predicted_reserved_bytes": estimate.reserved_bytes,
        "measured_reserved_bytes": truth.get("reserved_bytes"),
        "quantization_state_bytes": state_bytes,
        "error": (estimate.peak_bytes - measured) / measured,
        "measured_phase": truth["peak_phase"],
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "estimate_seconds": round(seconds, 2),
        "notes": [note for note in estimate.notes if "workspaces" not in note],
    }


def render(rows: list[dict[str, Any]], meta: dict[str, Any], stem: str, summary: dict[str, Any]) -> str:
    lines = [
        f"# Fine-tuning (LoRA, DoRA, IA3, prompt tuning, QLoRA, 8-bit, MoE) against real steps on "
        f"{meta.get('device', 'cpu')}: {stem}",
        "",
        f"`{meta['command']}` at {meta['commit']}, {meta['date']}; torch {meta['torch']}, transformers "
        f"{meta['transformers']}, peft {meta['peft']}, bitsandbytes {meta['bitsandbytes']}; {meta['cpu']}, "
        f"{meta['cpu_capability']}.",
        "",
        f"Batch {BATCH}; truth = peak live tensor bytes of two real steps (CPU: profiler allocation events plus the "
        "quantization state; CUDA: `max_memory_allocated`). Error = (predicted - truth) / truth.",
        "",
        "| case | length | method | predicted | measured | error | estimate |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        if "error_text" in row:
            lines.append(f"| {row['case']} | {row.get('length', '')} | failed: {row['error_text'][:120]} | | | | |")
            continue
        lines.append(
            f"| {row['case']} | {row['length']} | {row['method']} | {row['predicted_bytes'] / 2**20:,.2f} MiB | "
            f"{row['measured_bytes'] / 2**20:,.2f} MiB | {100 * row['error']:+.2f}% | {row['estimate_seconds']:.1f} s |"
        )
    lines += [
        "",
        f"{summary['n']} rows, {summary['traced']} traced: median |error| {summary['median_abs_error_pct']:.2f}%, "
        f"worst {summary['worst_abs_error_pct']:.2f}%.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stem", default="cpu", help="result file name (the host, such as zen4-avx512)")
    parser.add_argument("--only", nargs="*", help="run only the cases whose names start with these")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine (truth: max_memory_allocated)")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure_case(args.worker, args.length, args.device)), flush=True)
        return 0
    import bitsandbytes
    import peft
    import transformers

    from benchmarks.common.isolated import run_worker
    from benchmarks.tools.provenance import commit_stamp, write_result

    names = [n for n in CASES if not args.only or any(n.startswith(p) for p in args.only)]
    rows = []
    for name in names:
        for length in LENGTHS:
            row = run_worker(
                "benchmarks.suites.finetune", ["--worker", name, "--length", str(length), "--device", args.device]
            )
            row.setdefault("case", name)
            row.setdefault("length", length)
            rows.append(row)
            print(json.dumps(row), flush=True)
    good = [row for row in rows if "error" in row]
    errors = [abs(row["error"]) for row in good]
    meta = {
        "commit": commit_stamp("nnmem_callbacks", "benchmarks"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "bitsandbytes": bitsandbytes.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "command": f"python -m benchmarks.suites.finetune --stem {args.stem}"
        + (f" --device {args.device}" if args.device != "cpu" else ""),
    }
    summary = {
        "n": len(rows),
        "traced": sum(1 for row in good if row["method"].startswith("trace")),
        "median_abs_error_pct": round(100 * statistics.median(errors), 4) if errors else None,
        "worst_abs_error_pct": round(100 * max(errors), 4) if errors else None,
    }
    write_result(
        str(RESULTS),
        args.stem,
        {"meta": meta, "summary": summary, "rows": rows},
        render(rows, meta, args.stem, summary),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
