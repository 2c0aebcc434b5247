"""Compiled-step benchmark: the estimate of a ``torch.compile``'d training step against the real compiled step.

Usage::

    python -m benchmarks.suites.compile                    # every case, each in a fresh process
    python -m benchmarks.suites.compile --cases gpt2,mlp   # some cases
    python -m benchmarks.suites.compile --worker gpt2      # one case in this process (prints one JSON line)

Each case runs in a fresh process, in the order a user's fit runs it: nnmem's
estimates first (an eager estimate to warm the kernel-probe cache, then the
eager and the compiled estimate, timed), then the real run: ``torch.compile``
(Inductor, the user's settings; Inductor's caches off, so the first step
compiles cold, as a new model's does), one warm-up step (it compiles) and two
measured compiled steps, whose truth is the peak of live tensor bytes from the
profiler's allocation events (:func:`benchmarks.common.groundtruth.measure_cpu_peak`).
The estimate runs before the real compile, as at a fit start, so the real step
also shows that the estimate left Dynamo's caches as it found them.

Half the cases are built from ``transformers`` configs (GPT-2, BERT, ViT,
Llama with grouped-query attention); the others are a BatchNorm CNN, an
MLP-Mixer, an MLP, a ResNet-18, a model with a graph break, a compiled loss
function and ``module.compile()``. Errors are signed: ``(predicted - measured) / measured``.
The "eager estimate" column is what nnmem predicted before compiled steps were
modelled. Writes ``benchmarks/results/compile/<stem>.md`` and ``.json``
(``--stem``: the host, such as ``zen4-avx512``).
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
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

os.environ.setdefault("KINETO_LOG_LEVEL", "5")
# the real first step compiles cold, as a new model's does: no Inductor/AOTAutograd cache from an earlier run
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.common.paths import result_dir  # noqa: E402

__all__ = ["CASES", "CompileCase", "RESULTS", "main", "run_case"]

RESULTS = result_dir("compile")
MIB = 2**20


@dataclass(frozen=True)
class CompileCase:
    """One compiled training step.

    Attributes:
        build: ``() -> (model, batch, loss_fn)`` (seeded by the caller).
        optimizer: ``"adamw"`` or ``"sgd"`` (momentum 0.9).
        precision: ``"32-true"`` or ``"bf16-mixed"``.
        style: ``"model"`` (``torch.compile(model)``), ``"method"`` (``model.compile()``),
            ``"loss"`` (``torch.compile(loss_fn)``) or ``"model+optimizer"`` (``torch.compile(model)``
            and ``optimizer.step = torch.compile(optimizer.step)``).
        options: ``torch.compile`` keyword arguments.
        source: ``"transformers"`` for models built from a ``transformers`` config, else ``"hand"``.
    """

    build: Callable[[], tuple[nn.Module, Any, Callable]]
    optimizer: str = "adamw"
    precision: str = "32-true"
    style: str = "model"
    options: dict[str, Any] = field(default_factory=dict)
    source: str = "hand"

    def describe(self) -> str:
        what = {
            "model": "torch.compile(model)",
            "method": "model.compile()",
            "loss": "torch.compile(loss_fn)",
            "model+optimizer": "torch.compile(model), torch.compile(optimizer.step)",
        }[self.style]
        if self.options:
            what += " " + ", ".join(f"{k}={v!r}" for k, v in sorted(self.options.items()))
        return what


def _lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


def _xent(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()


def gpt2() -> tuple[nn.Module, Any, Callable]:
    from transformers import GPT2Config, GPT2LMHeadModel

    _quiet_transformers()
    config = GPT2Config(
        n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=256, bos_token_id=0, eos_token_id=0
    )
    ids = torch.randint(0, 8192, (8, 256))
    return GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}, _lm_loss


def bert() -> tuple[nn.Module, Any, Callable]:
    from transformers import BertConfig, BertForSequenceClassification

    _quiet_transformers()
    config = BertConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        vocab_size=8192,
        num_labels=4,
    )
    batch = {
        "input_ids": torch.randint(0, 8192, (16, 128)),
        "attention_mask": torch.ones(16, 128, dtype=torch.long),
        "labels": torch.randint(0, 4, (16,)),
    }
    return BertForSequenceClassification(config), batch, _lm_loss


def vit() -> tuple[nn.Module, Any, Callable]:
    from transformers import ViTConfig, ViTForImageClassification

    _quiet_transformers()
    config = ViTConfig(
        hidden_size=384,
        num_hidden_layers=4,
        num_attention_heads=6,
        intermediate_size=1536,
        image_size=128,
        patch_size=16,
        num_labels=10,
    )
    batch = {"pixel_values": torch.randn(16, 3, 128, 128), "labels": torch.randint(0, 10, (16,))}
    return ViTForImageClassification(config), batch, _lm_loss


def llama() -> tuple[nn.Module, Any, Callable]:
    from transformers import LlamaConfig, LlamaForCausalLM

    _quiet_transformers()
    config = LlamaConfig(
        hidden_size=512, intermediate_size=1376, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
        vocab_size=8192, max_position_embeddings=512, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    ids = torch.randint(0, 8192, (4, 256))
    return LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}, _lm_loss


def bn_cnn() -> tuple[nn.Module, Any, Callable]:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.GELU()]

    model = nn.Sequential(
        *block(3, 32),
        *block(32, 64),
        nn.MaxPool2d(2),
        *block(64, 64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    return model, (torch.randn(32, 3, 64, 64), torch.randint(0, 10, (32,))), _xent


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 4 * tokens), nn.GELU(), nn.Linear(4 * tokens, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, image: int = 64, patch: int = 8, width: int = 256, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, patch, stride=patch)
        self.blocks = nn.Sequential(*[MixerBlock((image // patch) ** 2, width) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))


def mixer() -> tuple[nn.Module, Any, Callable]:
    return Mixer(), (torch.randn(32, 3, 64, 64), torch.randint(0, 10, (32,))), _xent


def mlp() -> tuple[nn.Module, Any, Callable]:
    model = nn.Sequential(
        nn.Linear(1024, 4096), nn.GELU(), nn.LayerNorm(4096), nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 10)
    )
    return model, (torch.randn(256, 1024), torch.randint(0, 10, (256,))), _xent


class BrokenMLP(nn.Module):
    """Two compiled graphs with eager Python between them (a graph break)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
        self.second = nn.Sequential(nn.LayerNorm(512), nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        torch._dynamo.graph_break()
        return self.second(torch.tanh(h) + x)


def graph_break() -> tuple[nn.Module, Any, Callable]:
    return BrokenMLP(), (torch.randn(512, 512), torch.randint(0, 10, (512,))), _xent


def resnet18() -> tuple[nn.Module, Any, Callable]:
    from benchmarks.common.zoo import make_resnet18

    return make_resnet18(10), (torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))), _xent


CASES: dict[str, CompileCase] = {
    "gpt2": CompileCase(gpt2, source="transformers"),
    "gpt2_bf16": CompileCase(gpt2, precision="bf16-mixed", source="transformers"),
    "gpt2_method": CompileCase(gpt2, optimizer="sgd", style="method", source="transformers"),
    "bert": CompileCase(bert, source="transformers"),
    "bert_dynamic": CompileCase(bert, optimizer="sgd", options={"dynamic": True}, source="transformers"),
    "vit": CompileCase(vit, optimizer="sgd", source="transformers"),
    "llama_gqa": CompileCase(llama, source="transformers"),
    "llama_gqa_bf16": CompileCase(llama, precision="bf16-mixed", source="transformers"),
    "bn_cnn": CompileCase(bn_cnn),
    "bn_cnn_sgd_bf16": CompileCase(bn_cnn, optimizer="sgd", precision="bf16-mixed"),
    "mixer": CompileCase(mixer),
    "mlp": CompileCase(mlp, optimizer="sgd"),
    "graph_break": CompileCase(graph_break),
    "compiled_loss": CompileCase(mlp, style="loss"),
    "resnet18_fullgraph": CompileCase(resnet18, options={"fullgraph": True}),
    "mixer_compiled_optimizer": CompileCase(mixer, style="model+optimizer"),
}


def _optimizer(name: str) -> Callable[[Any], torch.optim.Optimizer]:
    if name == "adamw":
        return lambda params: torch.optim.AdamW(params, lr=1e-4)
    return lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9)


def _compiled(case: CompileCase, model: nn.Module, loss_fn: Callable) -> tuple[nn.Module, Callable]:
    if case.style in ("model", "model+optimizer"):
        return torch.compile(model, **case.options), loss_fn
    if case.style == "method":
        model.compile(**case.options)
        return model, loss_fn
    return model, torch.compile(loss_fn, **case.options)


def run_case(name: str) -> dict[str, Any]:
    """Estimates and measures one case in this process (see the module docstring)."""
    from benchmarks.common.groundtruth import measure_cpu_peak
    from nnmem_callbacks.estimators.torch.estimator import estimate_training

    case = CASES[name]
    torch.manual_seed(0)
    model, batch, loss_fn = case.build()
    make_optimizer = _optimizer(case.optimizer)
    kwargs = {"optimizer": make_optimizer, "precision": case.precision}
    # warms the kernel-probe cache at every batch size the timed eager estimate traces (with check_scaling=False
    # the probes of its two scaling traces ran inside the timing: a bf16 GPT-2's eager estimate took 22 s, not 1 s)
    estimate_training(model, batch, loss_fn=loss_fn, **kwargs)
    started = time.perf_counter()
    eager = estimate_training(model, batch, loss_fn=loss_fn, **kwargs)
    eager_s = time.perf_counter() - started
    compiled_model, compiled_loss = _compiled(case, model, loss_fn)
    optimizer = make_optimizer(compiled_model.parameters())
    if case.style == "model+optimizer":
        optimizer.step = torch.compile(optimizer.step)
        kwargs["optimizer"] = optimizer  # the estimate clones it and finds its compiled step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.perf_counter()
        estimate = estimate_training(compiled_model, batch, loss_fn=compiled_loss, **kwargs)
        compiled_s = time.perf_counter() - started
    estimate_warnings = [str(w.message)[:300] for w in caught if "nnmem" in str(w.message)]

    from benchmarks.common.groundtruth import autocast_for

    started = time.perf_counter()
    with autocast_for(case.precision, "cpu"):
        loss = compiled_loss(compiled_model, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del loss
    compile_s = time.perf_counter() - started
    truth = measure_cpu_peak(
        compiled_model, batch, lambda params: optimizer, compiled_loss, case.precision, copy_model=False
    )
    measured = truth["peak_bytes"]
    return {
        "case": name,
        "source": case.source,
        "compiled": case.describe(),
        "optimizer": case.optimizer,
        "precision": case.precision,
        "measured_bytes": measured,
        "measured_phase": truth["peak_phase"],
        "predicted_bytes": estimate.peak_bytes,
        "predicted_phase": estimate.peak_phase,
        "method": estimate.method,
        "error": (estimate.peak_bytes - measured) / measured,
        "eager_predicted_bytes": eager.peak_bytes,
        "eager_error": (eager.peak_bytes - measured) / measured,
        "eager_estimate_s": round(eager_s, 3),
        "compiled_estimate_s": round(compiled_s, 3),
        "time_ratio": round(compiled_s / eager_s, 2),
        "real_first_step_s": round(compile_s, 3),
        "graphs": next((n for n in estimate.notes if "graph(s)" in n), "")[:400],
        "warnings": estimate_warnings,
    }


def _environment(elapsed: float, cases: list[str], argv: list[str]) -> dict[str, Any]:
    import nnmem_callbacks
    from benchmarks.common.keras_env import host_fingerprint
    from benchmarks.tools.provenance import commit_stamp

    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:  # pragma: no cover
        transformers_version = None
    host = host_fingerprint()
    return {
        "commit": commit_stamp("nnmem_callbacks", "benchmarks"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nnmem_callbacks": nnmem_callbacks.__version__,
        "torch": torch.__version__,
        "transformers": transformers_version,
        "python": platform.python_version(),
        "cpu": host.get("cpu"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_threads": torch.get_num_threads(),
        "cases": cases,
        "runtime_s": round(elapsed, 1),
        "command": "python -m benchmarks.suites.compile" + (" " + " ".join(argv) if argv else ""),
    }


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:+.2f}%"


def render(rows: list[dict[str, Any]], meta: dict[str, Any], stem: str) -> str:
    """The Markdown table of a run."""
    ok = [row for row in rows if "error_text" not in row]
    errors = [abs(row["error"]) for row in ok]
    ratios = [row["time_ratio"] for row in ok]
    lines = [
        f"# Compiled training steps (`torch.compile`, Inductor, CPU): {stem}",
        "",
        f"`{meta['command']}` at {meta['commit']}, {meta['date']}; torch {meta['torch']}, transformers "
        f"{meta['transformers']}; {meta['cpu']} ({meta['cpu_capability']}, {meta['cpu_threads']} threads).",
        "",
        "Truth: peak live tensor bytes of two warm compiled steps (profiler allocation events). "
        "Error = (predicted - measured) / measured. *Eager estimate*: the step estimated as if not compiled "
        "(what nnmem predicted before compiled steps were modelled). *Time*: the compiled estimate's seconds "
        "over the eager estimate's (same process, warm kernel-probe cache); *first step*: the real run's "
        "compiling step.",
        "",
        "| case | model | compiled | optimizer | precision | measured | predicted | error | eager estimate | "
        "estimate s | time x eager | first step s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error_text" in row:
            lines.append(f"| {row['case']} | failed: {row['error_text']} |||||||||||")
            continue
        lines.append(
            f"| {row['case']} | {row['source']} | `{row['compiled']}` | {row['optimizer']} | {row['precision']} | "
            f"{row['measured_bytes'] / MIB:,.1f} MiB | {row['predicted_bytes'] / MIB:,.1f} MiB | "
            f"{_pct(row['error'])} | {row['eager_predicted_bytes'] / MIB:,.1f} MiB ({_pct(row['eager_error'])}) | "
            f"{row['compiled_estimate_s']:.1f} | {row['time_ratio']:.1f} | {row['real_first_step_s']:.1f} |"
        )
    if errors:
        lines += [
            "",
            f"**{len(ok)} of {len(rows)} cases**: median |error| {100 * statistics.median(errors):.2f}%, "
            f"worst {100 * max(errors):.2f}%; the compiled estimate took {statistics.median(ratios):.1f}x the eager "
            f"estimate's time (median; {min(ratios):.1f}x to {max(ratios):.1f}x) and "
            f"{statistics.median(row['compiled_estimate_s'] / row['real_first_step_s'] for row in ok):.2f}x the real "
            "compiling first step's (median).",
        ]
    if meta.get("merged_from"):
        lines += ["", f"Merged from {', '.join(meta['merged_from'])}; each case's run:"]
        lines += [f"- {row['case']}: {row['run']}" for row in rows if "run" in row]
    warned = [row for row in ok if row["warnings"]]
    for row in warned:
        lines.append(f"- {row['case']}: warned: {row['warnings'][0]}")
    return "\n".join(lines) + "\n"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst absolute error of the compiled estimate, and of the eager figure on the same cases."""
    ok = [row for row in rows if "error_text" not in row]
    if not ok:
        return {"n": 0, "failed": len(rows)}
    errors = [100 * abs(row["error"]) for row in ok]
    eager = [100 * abs(row["eager_error"]) for row in ok]
    return {
        "n": len(ok),
        "failed": len(rows) - len(ok),
        "median_abs_error_pct": round(statistics.median(errors), 4),
        "worst_abs_error_pct": round(max(errors), 4),
        "eager_median_abs_error_pct": round(statistics.median(eager), 4),
        "eager_worst_abs_error_pct": round(max(eager), 4),
        "time_ratio_median": statistics.median(row["time_ratio"] for row in ok),
        "estimate_over_real_first_step_median": round(
            statistics.median(row["compiled_estimate_s"] / row["real_first_step_s"] for row in ok), 3
        ),
    }


#: What must agree between runs merged into one result.
MERGE_KEYS = ("torch", "transformers", "cpu", "cpu_capability", "cpu_threads")


def merge(paths: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows and metadata of one result joined from several runs (each row keeps its run's commit and date).

    Raises:
        ValueError: The runs differ in a :data:`MERGE_KEYS` field, or two runs measured the same case.
    """
    rows: list[dict[str, Any]] = []
    metas = []
    for path in paths:
        document = json.loads(open(path, encoding="utf-8").read())
        meta = document["meta"]
        for key in MERGE_KEYS:
            if metas and meta.get(key) != metas[0].get(key):
                raise ValueError(f"{path}: {key} is {meta.get(key)!r}, the first run's is {metas[0].get(key)!r}")
        metas.append(meta)
        for row in document["rows"]:
            if any(row["case"] == other["case"] for other in rows):
                raise ValueError(f"{path}: case {row['case']} was measured by an earlier run too")
            rows.append({**row, "run": row.get("run", f"{meta['commit']}, {meta['date']}")})
    order = {name: index for index, name in enumerate(CASES)}
    rows.sort(key=lambda row: order.get(row["case"], len(order)))
    merged = {key: metas[0].get(key) for key in (*MERGE_KEYS, "nnmem_callbacks", "python")}
    merged.update(
        commit="; ".join(dict.fromkeys(meta["commit"] for meta in metas)),
        date="; ".join(dict.fromkeys(meta["date"] for meta in metas)),
        cases=[row["case"] for row in rows],
        runtime_s=round(sum(meta.get("runtime_s", 0) for meta in metas), 1),
        command="; ".join(dict.fromkeys(meta["command"] for meta in metas)),
        merged_from=[os.path.basename(path) for path in paths],
    )
    return rows, merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--worker", help="run one case in this process and print its record as JSON")
    parser.add_argument("--stem", default=None, help="result file name (the host, such as zen4-avx512)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="RUN.json",
        help="join runs of this suite (same host and versions, no case twice) into --stem; measures nothing",
    )
    args = parser.parse_args(argv)
    if args.worker:
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        print(json.dumps(run_case(args.worker)))
        return 0
    from benchmarks.common.isolated import run_worker
    from benchmarks.tools.provenance import write_result

    stem = args.stem or "cpu"
    if args.merge:
        try:
            rows, meta = merge(args.merge)
        except ValueError as error:
            parser.error(str(error))
        write_result(
            str(RESULTS), stem, {"meta": meta, "summary": summarize(rows), "rows": rows}, render(rows, meta, stem)
        )
        return 0
    names = [name for name in args.cases.split(",") if name]
    unknown = [name for name in names if name not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; valid: {', '.join(CASES)}")
    started = time.perf_counter()
    rows = []
    for name in names:
        record = run_worker("benchmarks.suites.compile", ["--worker", name], timeout=args.timeout)
        record.setdefault("case", name)
        rows.append(record)
        print(json.dumps({k: v for k, v in record.items() if k not in ("graphs", "warnings")}), flush=True)
    given = list(sys.argv[1:] if argv is None else argv)
    if "--stem" in given:
        index = given.index("--stem")
        del given[index : index + 2]
    meta = _environment(time.perf_counter() - started, names, given)
    write_result(str(RESULTS), stem, {"meta": meta, "summary": summarize(rows), "rows": rows}, render(rows, meta, stem))
    return 0


if __name__ == "__main__":
    sys.exit(main())
