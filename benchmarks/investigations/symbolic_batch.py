"""Question (2026-11-30): can one fake-tensor trace with a symbolic batch size stand in for the three traces at fixed
batch sizes that a PyTorch estimate runs today, and what would it cost?

    python -m benchmarks.investigations.symbolic_batch --stem zen3-avx2

Issue #45 asks for an estimate ten times faster than ``MemTracker``; ``estimate_profile`` found that the time is
the number of fake passes: the main trace at the batch, and a forward and backward at twice and a quarter of it for
the batch lines. This investigation runs, for models built from ``transformers`` configs and the speed suite's
ResNet-50, a forward and backward under a bare ``FakeTensorMode`` (no tracker; its dispatch cache warm):

* three times with fixed batch sizes (B, 2B, B/4), as the batch lines need today;
* once with the batch dimension of every input tensor symbolic (a ``ShapeEnv``; the dimension
  ``DimDynamic.DYNAMIC``, hinted at B).

It records each dispatched op and the bytes of each tensor it returns. The symbolic trace's byte counts are sympy
expressions in the batch; evaluated at B, 2B and B/4 they are compared, op by op, with the fixed traces. It reports
the time of each pass, the guards the symbolic trace installs (what a redesign must check at 2B and B/4) and whether
the op sequences and the bytes agree. Writes ``benchmarks/results/investigations/symbolic_batch/<stem>.md``.

Answer on zen3-avx2 (``benchmarks/results/investigations/symbolic_batch/zen3-avx2.md``; two helpers' test runs shared
the 2 cores, so the seconds are loaded, the ratios within one run): **no, it would not pay.** The symbolic trace is
exact: every op's bytes, evaluated at B, 2B and B/4, equal the fixed traces' (ResNet-50, GPT-2 small, a Llama with
grouped-query attention and a BERT with an attention mask; the few unaligned ops are slices that a fixed trace sees
as whole-tensor aliases). But one symbolic pass costs 5.5x to 8.7x a fixed one, 1.65x to 2.4x all three fixed passes
together: sympy's shape reasoning, and the Python dispatcher it needs (without it GPT-2's loss specialized the batch
to 8 at ``pad``). ResNet-50's trace also guards ``batch >= 16`` (a convolution path chosen by the batch), which B/4 =
8 breaks: a redesign would need a fallback trace there anyway. Issue #45's ratios need fewer passes of the fixed kind
(or a cheaper fake dispatch), not a symbolic one.

It does not run the estimator's tracker on a symbolic trace: the op memo keys on concrete shapes (a SymInt is not
hashable) and the per-op rules take concrete shapes, so the numbers here are the floor such a redesign would pay.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import difflib
import platform
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from benchmarks.common.paths import result_dir

__all__ = ["main"]


class _OpBytes(TorchDispatchMode):
    """Records each dispatched op and the bytes (``numel * itemsize``, symbolic or not) of each tensor it returns."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[Any, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.ops.append((str(func), tuple(t.numel() * t.element_size() for t in tensors)))
        return out


def _cases() -> dict[str, Callable[[], tuple[Any, Any, Any]]]:
    import transformers

    from benchmarks.suites.speed import CASES

    def from_speed(name: str) -> Callable[[], tuple[Any, Any, Any]]:
        def build() -> tuple[Any, Any, Any]:
            model, batch, _, loss_fn = CASES[name]()
            return model, batch, loss_fn

        return build

    def causal_lm(config: Any, batch: int, tokens: int) -> Callable[[], tuple[Any, Any, Any]]:
        def build() -> tuple[Any, Any, Any]:
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config)
            ids = torch.randint(0, config.vocab_size, (batch, tokens))
            return model, {"input_ids": ids, "labels": ids.clone()}, lambda m, inputs: m(**inputs).loss

        return build

    def bert() -> tuple[Any, Any, Any]:
        torch.manual_seed(0)
        config = transformers.BertConfig(
            num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024
        )
        model = transformers.BertForSequenceClassification(config)
        ids = torch.randint(0, config.vocab_size, (16, 128))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.zeros(16, dtype=torch.long)}
        return model, batch, lambda m, inputs: m(**inputs).loss

    llama = transformers.LlamaConfig(
        vocab_size=8000,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
    )
    return {
        "resnet50 b32": from_speed("resnet50 b32"),
        "gpt2-small 8x128": from_speed("gpt2-small 8x128"),
        "llama-gqa 4 layers 8x256": causal_lm(llama, 8, 256),
        "bert 4 layers 16x128 (attention mask)": bert,
    }


def _batch_size(batch: Any) -> int:
    return int(next(t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor)).shape[0])


def _resized(batch: Any, size: int) -> Any:
    """The batch with ``size`` samples (rows repeated or cut), every tensor whose first dimension is the batch."""
    full = _batch_size(batch)

    def resize(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != full:
            return t
        reps = -(-size // full)
        return t.repeat(reps, *([1] * (t.dim() - 1)))[:size].clone()

    return tree_map(resize, batch)


def _pass(
    model: Any, batch: Any, loss_fn: Any, mode: Any, symbolic: bool, python_dispatcher: bool | None = None
) -> tuple[float, list, Any]:
    """One forward and backward of ``model`` (already fake in ``mode``) on ``batch``: seconds, ops, shape env."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    full = _batch_size(batch)

    def to_fake(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if symbolic and t.dim() > 0 and t.shape[0] == full:
            dims = [DimDynamic.DYNAMIC] + [DimDynamic.STATIC] * (t.dim() - 1)
            return mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims))
        return mode.from_tensor(t)

    fake_batch = tree_map(to_fake, batch)
    recorder = _OpBytes()
    started = time.perf_counter()
    from torch._dispatch.python import enable_python_dispatcher

    # as AOTAutograd traces: composite ops take their Python decompositions, which keep sizes symbolic (without it,
    # C++ composites such as ``pad`` read concrete sizes and specialize the batch)
    python_dispatcher = symbolic if python_dispatcher is None else python_dispatcher
    with mode, recorder, enable_python_dispatcher() if python_dispatcher else contextlib.nullcontext():
        loss = loss_fn(model, fake_batch)
        loss.backward()
    seconds = time.perf_counter() - started
    for p in model.parameters():
        p.grad = None
    return seconds, recorder.ops, mode.shape_env


def _evaluate(expr: Any, shape_env: Any, value: int) -> int:
    """An op's byte count at batch ``value``: every free symbol (all are the batch, unified by the guards) set to it."""
    if isinstance(expr, int):
        return expr
    node = expr.node.expr if hasattr(expr, "node") else expr
    node = shape_env.replace(node) if shape_env is not None else node
    return int(node.subs({s: value for s in node.free_symbols}))


def investigate(name: str, build: Callable[[], tuple[Any, Any, Any]], repeats: int = 3) -> dict[str, Any]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    model, batch, loss_fn = build()
    size = _batch_size(batch)
    sizes = {"B": size, "2B": 2 * size, "B/4": max(size // 4, 1)}
    result: dict[str, Any] = {"case": name, "sizes": sizes, "fixed_seconds": {}, "mismatches": {}}

    static_mode = FakeTensorMode(allow_non_fake_inputs=True)
    static_model = copy.deepcopy(model)
    with static_mode:
        static_model = static_model.to_empty(device="cpu")
    fixed_ops: dict[str, list] = {}
    for label, n in sizes.items():
        runs = [_pass(static_model, _resized(batch, n), loss_fn, static_mode, False) for _ in range(repeats + 1)]
        result["fixed_seconds"][label] = statistics.median(r[0] for r in runs[1:])  # the first warms the cache
        # the ops to compare with: the same decompositions as the symbolic trace (Python dispatcher on)
        fixed_ops[label] = _pass(static_model, _resized(batch, n), loss_fn, static_mode, False, True)[1]
        if label == "B":
            result["ops_today"] = len(runs[-1][1])

    symbolic_runs = []
    for _ in range(repeats + 1):  # a fresh ShapeEnv each time, as an estimate would have
        mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
        sym_model = copy.deepcopy(model)
        with mode:
            sym_model = sym_model.to_empty(device="cpu")
        symbolic_runs.append(_pass(sym_model, batch, loss_fn, mode, True))
    result["symbolic_seconds"] = statistics.median(r[0] for r in symbolic_runs[1:])
    _, sym_ops, shape_env = symbolic_runs[-1]
    guards = [str(g.expr) for g in shape_env.guards]
    result["guards"] = guards
    result["ops"] = len(sym_ops)
    for label, n in sizes.items():
        fixed = fixed_ops[label]
        # aligned by op name: a slice the fixed trace sees as the whole tensor (an alias) stays a slice symbolically
        matcher = difflib.SequenceMatcher(None, [op for op, _ in fixed], [op for op, _ in sym_ops], autojunk=False)
        wrong = unmatched = 0
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag != "equal":
                unmatched += max(i2 - i1, j2 - j1)
                continue
            for (_, fixed_bytes), (_, sym_bytes) in zip(fixed[i1:i2], sym_ops[j1:j2]):
                if tuple(_evaluate(e, shape_env, n) for e in sym_bytes) != tuple(fixed_bytes):
                    wrong += 1
        result["mismatches"][label] = f"{wrong}" + (f" ({unmatched} unaligned)" if unmatched else "")
    return result


def render(results: list[dict[str, Any]]) -> str:
    lines = [
        "# One symbolic-batch trace instead of three fixed ones",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {platform.processor() or platform.machine()},"
        f" {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Question and method: "
        "`benchmarks/investigations/symbolic_batch.py`.",
        "",
        "Forward and backward under a bare `FakeTensorMode` (median of the warm passes). *Fixed*: the three batch sizes "
        "the batch lines trace today; *symbolic*: one pass with the batch dimension symbolic, under the Python "
        "dispatcher (as AOTAutograd traces; without it C++ composites such as `pad` read concrete sizes and "
        "specialize the batch: GPT-2's loss did). *Ops wrong*: ops whose output bytes, evaluated from the symbolic "
        "trace at that batch, differ from a fixed trace's at that batch with the same decompositions (the Python "
        "dispatcher on), the two op sequences aligned by name; *unaligned*: ops only one trace has.",
        "",
        "| case | ops today, symbolic | fixed B s | fixed 2B s | fixed B/4 s | fixed total s | symbolic s | symbolic / fixed B "
        "| symbolic / fixed total | guards | ops wrong at B, 2B, B/4 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        fixed = r["fixed_seconds"]
        total = sum(fixed.values())
        wrong = ", ".join(str(r["mismatches"][k]) for k in ("B", "2B", "B/4"))
        lines.append(
            f"| {r['case']} | {r['ops_today']}, {r['ops']} | {fixed['B']:.3f} | {fixed['2B']:.3f} | {fixed['B/4']:.3f} | {total:.3f} | "
            f"{r['symbolic_seconds']:.3f} | {r['symbolic_seconds'] / fixed['B']:.2f}x | "
            f"{r['symbolic_seconds'] / total:.2f}x | {len(r['guards'])} | {wrong} |"
        )
    lines += ["", "Guards the symbolic traces installed:", ""]
    for r in results:
        shown = "; ".join(f"`{g}`" for g in r["guards"][:6]) or "none"
        more = f" (and {len(r['guards']) - 6} more)" if len(r["guards"]) > 6 else ""
        lines.append(f"- {r['case']}: {shown}{more}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stem", required=True, help="result file name, for example the host kind: zen3-avx2")
    parser.add_argument("--cases", nargs="*", default=None, help="a subset of the cases (default: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    cases = _cases()
    chosen = args.cases or list(cases)
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in chosen:
            results.append(investigate(name, cases[name]))
            print(results[-1]["case"], results[-1]["symbolic_seconds"], results[-1]["mismatches"], flush=True)
    out = result_dir("investigations/symbolic_batch") / f"{args.stem}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
