"""Sequence-length axis: the curve's prediction at other lengths against a direct trace there.

Usage::

    python -m benchmarks.suites.sequence --stem zen4-avx512

Each model, built from a ``transformers`` config, is estimated once at its traced
length with ``sequence_dim="auto"`` (traces at half and twice the length); the
prediction at 2x, 4x and 8x the length (and at other batches) is compared with
a direct estimate traced at that length: the axis is judged against the
estimator itself, so the figures say how well the curve carries the trace to
other lengths (the trace's own accuracy is the accuracy suite's). Attention runs
the math path (``attn_implementation="eager"``) and the memory-efficient one
(``"sdpa"``, dropout off, CPU flash attention). Errors are signed:
``(predicted - direct) / direct``. Writes ``benchmarks/results/sequence/<stem>.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from typing import Any, Callable

import torch

from benchmarks.common.paths import result_dir

__all__ = ["MODELS", "main", "run"]

RESULTS = result_dir("sequence")
#: (length, batch) multiples of the traced (length, batch) compared with a direct trace.
POINTS = ((2, 1), (4, 1), (8, 1), (4, 2), (2, 0.5))


def _gpt2(attention: str) -> Any:
    import transformers

    config = transformers.GPT2Config(
        n_layer=4, n_embd=256, n_head=8, vocab_size=8192, n_positions=4096, bos_token_id=0, eos_token_id=0,
        attn_pdrop=0.0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel._from_config(config, attn_implementation=attention)


def _llama(attention: str) -> Any:
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        vocab_size=8192, max_position_embeddings=4096, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=attention)


def _bert(attention: str) -> Any:
    import transformers

    config = transformers.BertConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, vocab_size=8192,
        max_position_embeddings=4096, attention_probs_dropout_prob=0.0, num_labels=4,
    )  # fmt: skip
    return transformers.BertForSequenceClassification._from_config(config, attn_implementation=attention)


def _lm_batch(length: int, batch: int) -> dict[str, torch.Tensor]:
    ids = torch.zeros(batch, length, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _classifier_batch(length: int, batch: int) -> dict[str, torch.Tensor]:
    ids = torch.zeros(batch, length, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.zeros(batch, dtype=torch.long)}


#: name -> (builder, batch maker, traced length, traced batch)
MODELS: dict[str, tuple[Callable[[str], Any], Callable[[int, int], Any], int, int]] = {
    "gpt2": (_gpt2, _lm_batch, 256, 4),
    "llama_gqa": (_llama, _lm_batch, 256, 4),
    "bert": (_bert, _classifier_batch, 128, 8),
}


def _loss(model: Any, batch: Any) -> Any:
    return model(**batch).loss


def run(name: str, attention: str) -> list[dict[str, Any]]:
    """The rows of one model and attention path."""
    import transformers

    from nnmem_callbacks.estimators.torch.estimator import estimate_training

    transformers.logging.set_verbosity_error()
    build, make_batch, length, size = MODELS[name]
    torch.manual_seed(0)
    model = build(attention)
    started = time.perf_counter()
    estimate = estimate_training(model, make_batch(length, size), "adamw", loss_fn=_loss, sequence_dim="auto")
    seconds = time.perf_counter() - started
    rows = []
    for length_factor, batch_factor in POINTS:
        at_length, at_batch = int(length * length_factor), max(1, int(size * batch_factor))
        direct = estimate_training(model, make_batch(at_length, at_batch), "adamw", loss_fn=_loss, check_scaling=False)
        predicted = estimate.peak_bytes_at(at_batch, seq_len=at_length)
        rows.append(
            {
                "model": name,
                "attention": attention,
                "traced": [length, size],
                "length": at_length,
                "batch": at_batch,
                "predicted_bytes": predicted,
                "direct_bytes": direct.peak_bytes,
                "error": (predicted - direct.peak_bytes) / direct.peak_bytes,
                "estimate_s": round(seconds, 2),
            }
        )
    return rows


def render(rows: list[dict[str, Any]], meta: dict[str, Any], stem: str) -> str:
    errors = [abs(row["error"]) for row in rows]
    core = [
        abs(row["error"]) for row in rows if row["batch"] == row["traced"][1] and row["length"] <= 4 * row["traced"][0]
    ]
    lines = [
        f"# Sequence-length axis against direct traces: {stem}",
        "",
        f"`{meta['command']}` at {meta['commit']}, {meta['date']}; torch {meta['torch']}, transformers "
        f"{meta['transformers']}; {meta['cpu_capability']}.",
        "",
        'Each model estimated once at its traced length and batch (`sequence_dim="auto"`); predicted = '
        "`est.peak_bytes_at(batch, seq_len=...)`, direct = `estimate_training` traced at that length and batch. "
        "Error = (predicted - direct) / direct.",
        "",
        "| model | attention | traced (length, batch) | length | batch | predicted | direct | error |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['attention']} | {row['traced'][0]}, {row['traced'][1]} | {row['length']} | "
            f"{row['batch']} | {row['predicted_bytes'] / 2**20:,.1f} MiB | {row['direct_bytes'] / 2**20:,.1f} MiB | "
            f"{100 * row['error']:+.2f}% |"
        )
    lines += [
        "",
        f"At 2x and 4x the traced length (traced batch): worst |error| {100 * max(core):.2f}% over {len(core)} rows; "
        f"all {len(rows)} rows: median {100 * statistics.median(errors):.2f}%, worst {100 * max(errors):.2f}%.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stem", default="cpu", help="result file name (the host, such as zen4-avx512)")
    args = parser.parse_args(argv)
    import transformers

    from benchmarks.tools.provenance import commit_stamp, write_result

    rows = []
    for name in MODELS:
        for attention in ("eager", "sdpa"):
            rows.extend(run(name, attention))
            print(rows[-1], flush=True)
    errors = [abs(row["error"]) for row in rows]
    meta = {
        "commit": commit_stamp("nnmem_callbacks", "benchmarks"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "command": f"python -m benchmarks.suites.sequence --stem {args.stem}",
    }
    summary = {
        "n": len(rows),
        "median_abs_error_pct": round(100 * statistics.median(errors), 4),
        "worst_abs_error_pct": round(100 * max(errors), 4),
    }
    write_result(
        str(RESULTS), args.stem, {"meta": meta, "summary": summary, "rows": rows}, render(rows, meta, args.stem)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
