"""Offline CUDA estimates (no GPU here) against the estimates made on a GPU and its measurements (issue #14).

For every case of the CUDA accuracy benchmark, the estimate for a named GPU
(``device="cuda:h100"``) made on this CPU-only host is compared with the
estimate made on the GPU and with the GPU's ``max_memory_allocated``, both
read from a committed on-device run (``--reference``, default the H100 run in
``/work/shared/gpu-runs``). Four models built from transformers configs (the
issue's: an encoder in fp32, a decoder in bf16-mixed, an encoder-decoder with
T5's trained position bias, a checkpointed decoder in bf16-true) are estimated
too; their on-device figures exist only as the issue's percentages, so the
table gives the offline estimate before this change (``--before``, the same
model estimated by another checkout, e.g. ``/work/main``) and what the issue's
percentages make of it.

Run::

    python -m benchmarks.suites.offline_cuda                        # zoo + transformers, writes benchmarks/results/offline_cuda/h100.*
    python -m benchmarks.suites.offline_cuda --cases mlp,gpt2 --no-transformers
    python -m benchmarks.suites.offline_cuda --only-transformers --before /work/main   # the "before" column

The estimates are fake-tensor traces; nothing of the models' activations is
allocated. Wall-clock times on a shared host are not reported.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.common import zoo
from benchmarks.common.paths import ROOT, result_dir

__all__ = [
    "DEFAULT_REFERENCE",
    "RESULTS",
    "GIB",
    "bert_base_mlm",
    "gpt2_small",
    "t5_small",
    "llama_checkpointed",
    "TRANSFORMERS",
    "estimate_transformers",
    "estimate_transformers_with",
    "estimate_zoo",
    "zoo_table",
    "transformers_table",
    "main",
]

DEFAULT_REFERENCE = Path("/work/shared/gpu-runs/2026-11-23-h100/zoo_cuda.json")
RESULTS = result_dir("offline_cuda")
GIB = 2**30


# ---------------------------------------------------------------------------
# the issue's four transformers models
# ---------------------------------------------------------------------------
def _lm_batch(batch: int, seq: int, vocab: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def bert_base_mlm():
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig()), _lm_batch(32, 128, 30522)


def gpt2_small():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config()), _lm_batch(8, 1024, 50257)  # transformers' defaults, as in the issue


def t5_small():
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(decoder_start_token_id=0, pad_token_id=0, use_cache=False))
    g = torch.Generator().manual_seed(0)
    return model, {
        "input_ids": torch.randint(1, 32128, (16, 256), generator=g),
        "labels": torch.randint(1, 32128, (16, 64), generator=g),
    }


def llama_checkpointed():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        use_cache=False,
    )
    model = LlamaForCausalLM(config)
    model.gradient_checkpointing_enable()
    return model, _lm_batch(8, 1024, 32000)


def _hf_loss(model, batch):
    return model(**batch).loss


#: name -> (factory, precision, what the issue reports for it).
TRANSFORMERS: dict[str, tuple[Callable[[], Any], str, dict[str, Any]]] = {
    "bert_base_mlm (32x128)": (
        bert_base_mlm,
        "32-true",
        {"before_vs_measured_pct": -1.2, "device_equals_before": True},
    ),
    "gpt2_small (8x1024)": (
        gpt2_small,
        "bf16-mixed",
        {"before_vs_measured_pct": -13.7, "device_vs_measured_pct": -0.5, "device_activations_bytes": 8.74e9},
    ),
    "t5_small (16x256->64)": (t5_small, "32-true", {}),
    "llama_checkpointed (8x1024)": (llama_checkpointed, "bf16-true", {}),
}


def estimate_transformers(gpu: str | None) -> list[dict[str, Any]]:
    """The four transformers models, AdamW, estimated for ``cuda:<gpu>`` (``cuda`` if ``None``).

    Uses whatever ``nnmem_callbacks`` imports (see :func:`estimate_transformers_with`).
    """
    from nnmem_callbacks import estimate_training

    rows = []
    for name, (factory, precision, _) in TRANSFORMERS.items():
        torch.manual_seed(0)
        model, batch = factory()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            est = estimate_training(
                model,
                batch,
                optimizer="adamw",
                precision=precision,
                device=f"cuda:{gpu}" if gpu else "cuda",
                loss_fn=_hf_loss,
            )
        print(f"{name}: {est.peak_bytes / GIB:.3f} GiB ({est.method})", file=sys.stderr)
        rows.append(
            {
                "name": name,
                "precision": precision,
                "method": est.method,
                "peak": int(est.peak_bytes),
                "activations": int(est.breakdown.get("activations", 0)),
                "notes": list(est.notes),
                "fallback_warnings": [str(w.message)[:300] for w in caught if "closed-form" in str(w.message)],
            }
        )
        del model, batch
    return rows


def estimate_transformers_with(root: str) -> list[dict[str, Any]]:
    """:func:`estimate_transformers` run by the checkout at ``root`` (its ``nnmem_callbacks``), in a subprocess.

    An older checkout knows no GPU names: it estimates for ``device="cuda"``.
    """
    with tempfile.TemporaryDirectory() as tmp:  # this benchmarks package first, then root's nnmem_callbacks
        (Path(tmp) / "benchmarks").symlink_to(ROOT / "benchmarks")
        out = Path(tmp) / "rows.json"
        code = (
            f"import json, sys; sys.path[:0] = [{tmp!r}, {root!r}]; "
            f"from benchmarks.suites.offline_cuda import estimate_transformers; "
            f"json.dump(estimate_transformers(None), open({str(out)!r}, 'w'))"
        )
        subprocess.run([sys.executable, "-c", code], cwd=root, check=True)
        return json.loads(out.read_text())


# ---------------------------------------------------------------------------
# the zoo
# ---------------------------------------------------------------------------
def estimate_zoo(cases: list[str], optimizers: list[str], precisions: list[str], gpu: str) -> list[dict[str, Any]]:
    from nnmem_callbacks import estimate_training

    rows = []
    for name in cases:
        case = zoo.get_case(name)
        for opt_name in optimizers:
            for precision in precisions:
                torch.manual_seed(0)
                model = case.make_model()
                batch = case.make_batch(case.batch_size, "cpu")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    est = estimate_training(
                        model,
                        batch,
                        optimizer=zoo.OPTIMIZERS[opt_name],
                        loss_fn=case.loss_fn,
                        precision=precision,
                        device=f"cuda:{gpu}",
                    )
                rows.append(
                    {
                        "case": name,
                        "optimizer": opt_name,
                        "precision": precision,
                        "method": est.method,
                        "peak": int(est.peak_bytes),
                        "notes": list(est.notes),
                    }
                )
                print(
                    f"{name} {opt_name} {precision}: {est.peak_bytes / 2**20:.1f} MiB ({est.method})", file=sys.stderr
                )
    return rows


def _pct(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else 100.0 * (a - b) / b


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:+.{digits}f}%"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def zoo_table(rows: list[dict[str, Any]], reference: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    by_key = {(r["case"], r["optimizer"], r["precision"]): r for r in reference["rows"]}
    lines = [
        "| case | optimizer | precision | offline MiB | on-device est. MiB | offline vs on-device | "
        "measured MiB | offline vs measured | on-device vs measured | method offline / on-device |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    diffs, within = [], 0
    for row in rows:
        ref = by_key.get((row["case"], row["optimizer"], row["precision"]), {})
        device_est, measured = ref.get("predicted"), ref.get("measured")
        diff = _pct(row["peak"], device_est)
        row.update(
            device_estimate=device_est,
            measured=measured,
            offline_vs_device_pct=diff,
            offline_vs_measured_pct=_pct(row["peak"], measured),
            device_method=ref.get("method"),
        )
        if diff is not None and ref.get("method") == "trace":
            diffs.append(abs(diff))
            within += abs(diff) <= 0.5
        lines.append(
            f"| {row['case']} | {row['optimizer']} | {row['precision']} | {_mib(row['peak'])} | "
            f"{_mib(device_est)} | {_fmt(diff, 2)} | {_mib(measured)} | {_fmt(row['offline_vs_measured_pct'])} | "
            f"{_fmt(_pct(device_est, measured))} | {row['method']} / {ref.get('method', '-')} |"
        )
    summary = {
        "traced_on_device": len(diffs),
        "within_0.5pct": within,
        "max_abs_offline_vs_device_pct": max(diffs) if diffs else None,
        "median_abs_offline_vs_device_pct": sorted(diffs)[len(diffs) // 2] if diffs else None,
        "offline_fallbacks_where_device_traced": sum(
            1 for r in rows if r["method"] != "trace" and r.get("device_method") == "trace"
        ),
    }
    return lines, summary


def transformers_table(rows: list[dict[str, Any]], before: list[dict[str, Any]] | None) -> list[str]:
    lines = [
        "| model | precision | offline now | method | offline before | method before | now vs before | "
        "what the issue's figures make of it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    before_by_name = {r["name"]: r for r in before or []}
    for row in rows:
        issue = TRANSFORMERS[row["name"]][2]
        old = before_by_name.get(row["name"])
        old_peak = old["peak"] if old else 0
        derived = []
        if old and "before_vs_measured_pct" in issue:
            measured = old["peak"] / (1 + issue["before_vs_measured_pct"] / 100)
            derived.append(f"measured ~{measured / GIB:.2f} GiB: now {_fmt(_pct(row['peak'], measured))}")
            if issue.get("device_equals_before"):
                derived.append(f"on-device est. = before: now {_fmt(_pct(row['peak'], old['peak']), 2)}")
            if "device_vs_measured_pct" in issue:
                device = measured * (1 + issue["device_vs_measured_pct"] / 100)
                derived.append(f"on-device est. ~{device / GIB:.2f} GiB: now {_fmt(_pct(row['peak'], device), 2)}")
        if "device_activations_bytes" in issue:
            derived.append(
                f"saved activations {row['activations'] / 1e9:.2f} GB vs {issue['device_activations_bytes'] / 1e9:.2f} GB "
                f"on the GPU ({_fmt(_pct(row['activations'], issue['device_activations_bytes']), 2)})"
            )
        lines.append(
            f"| {row['name']} | {row['precision']} | {row['peak'] / GIB:.3f} GiB | {row['method']} | "
            f"{f'{old_peak / GIB:.3f} GiB' if old else '-'} | "
            f"{old['method'] if old else '-'} | {_fmt(_pct(row['peak'], old['peak']) if old else None, 2)} | "
            f"{'; '.join(derived) or '-'} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100", help="the GPU the reference run used (default h100)")
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    parser.add_argument("--cases", default=",".join(zoo.DEFAULT_CASES))
    parser.add_argument("--optimizers", default=",".join(zoo.OPTIMIZERS))
    parser.add_argument("--precisions", default=",".join(zoo.PRECISIONS))
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--only-transformers", action="store_true")
    parser.add_argument("--before", default=None, help="a checkout whose nnmem_callbacks gives the 'before' column")
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "h100", help="output stem (.md and .json): the reference GPU"
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    started = time.time()
    document: dict[str, Any] = {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cuda_available": torch.cuda.is_available(),
            "target": f"cuda:{args.gpu}",
            "reference": str(args.reference),
        }
    }
    md = [
        "# Offline CUDA estimates vs estimates made on the GPU (issue #14)",
        "",
        f"- this host: no GPU (cuda available: {torch.cuda.is_available()}), torch {torch.__version__}, {platform.machine()}",
        f'- target: `device="cuda:{args.gpu}"`; reference: `{args.reference}` (H100, torch 2.11, estimates made there)',
        "",
    ]
    if not args.only_transformers:
        reference = json.loads(args.reference.read_text())
        rows = estimate_zoo(args.cases.split(","), args.optimizers.split(","), args.precisions.split(","), args.gpu)
        lines, summary = zoo_table(rows, reference)
        document.update(zoo=rows, zoo_summary=summary)
        md += [
            "## The CUDA accuracy benchmark's models",
            "",
            f"Offline within 0.5% of the on-device estimate: {summary['within_0.5pct']} of "
            f"{summary['traced_on_device']} combinations the GPU traced (largest absolute difference "
            f"{summary['max_abs_offline_vs_device_pct'] or 0:.2f}%); offline fallbacks where the GPU traced: "
            f"{summary['offline_fallbacks_where_device_traced']}.",
            "",
            *lines,
            "",
        ]
    if not args.no_transformers:
        rows = estimate_transformers(args.gpu)
        before = estimate_transformers_with(args.before) if args.before else None
        document.update(transformers=rows, transformers_before=before)
        md += [
            "## Models built from transformers configs (AdamW)",
            "",
            'On-device figures exist only as the issue\'s percentages; "before" is the same estimate made by the '
            "checkout before this change, from which those percentages derive the measured and on-device peaks.",
            "",
            *transformers_table(rows, before),
            "",
        ]
    document["meta"]["elapsed_s"] = round(time.time() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(document, indent=1, default=str))
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
