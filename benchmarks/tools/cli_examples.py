"""``examples/cli_examples.md``, rendered from the ``nnmem`` commands it shows and their real output.

Usage::

    python -m benchmarks.tools.cli_examples            # prints the Markdown
    python -m benchmarks.tools.cli_examples --write    # rewrites examples/cli_examples.md
    python -m benchmarks.tools.cli_examples --check    # exit 1 when examples/cli_examples.md differs

Each command runs in this process through :func:`nnmem_callbacks.cli.main` (stdout and stderr captured, Python
warnings silenced; the console is rich's non-terminal one, 110 columns). Its output is then cut, deterministically,
to the parts that answer the example's question (:data:`EXAMPLES` names them; ``...`` marks what was left out) and
stripped of trailing spaces. Every command names ``--device`` or ``--budget`` where it prints a budget, so nothing
depends on this host's free memory. Rendered on a host without a GPU: CUDA targets use the CUDA model and the
measured context tables. ``tests/test_doc_numbers.py`` fails when the committed file differs from this render
(it skips when the installed torch differs from the one the file names, or a GPU is visible). About 20 s on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import io
import json
import os
import re
import shlex
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["EXAMPLES", "Example", "OUTPUT", "blocks", "main", "render", "run_example", "trim"]

ROOT = Path(__file__).resolve().parents[2]
#: The file this tool writes.
OUTPUT = ROOT / "examples" / "cli_examples.md"
#: The model factories as installed (``examples/`` ships as ``nnmem_callbacks.examples``).
MODELS = "nnmem_callbacks.examples.models"

#: How each kind of output block begins (the first match wins; other lines continue the block before them).
_STARTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("title", r"^nnmem (estimate|calc) "),
        ("gpus", r"^Which GPU fits"),
        ("breakdown", r"^┏"),
        ("phase", r"^peak phase "),
        ("budget", r"^budget "),
        ("verified", r"^(verified batch \d+|batch \d+ not verified)"),
        ("fit", r"^batch \d+ (fits|does NOT fit)"),
        ("footnote", r"^\* this card"),
        ("why", r"^The peak is at "),
        ("shrink", r"^What would shrink it"),
        ("note", r"^note: "),
        ("status", r"^exit status "),
    )
)


def blocks(text: str) -> list[tuple[str, list[str]]]:
    """The output cut into blocks, each ``(kind, lines)``; a table's rows and a wrapped line stay with their block.

    Example:
        >>> [kind for kind, _ in blocks("nnmem calc (x): batch 1\\n┏━┓\\n└━┘\\nnote: a\\n  wrapped\\nnote: b")]
        ['title', 'breakdown', 'note', 'note']
    """
    out: list[tuple[str, list[str]]] = []
    seen_breakdown = False
    for line in text.splitlines():
        kind = next((k for k, pattern in _STARTS if pattern.match(line)), None)
        if kind == "breakdown" and (seen_breakdown or (out and out[-1][0] == "gpus")):
            kind = None  # the GPU table's own box, or a second table: part of the block before
        if kind is None and out:
            out[-1][1].append(line)
            continue
        seen_breakdown = seen_breakdown or kind == "breakdown"
        out.append((kind or "other", [line]))
    return out


def trim(text: str, keep: Sequence[str] | None, notes: Sequence[str] = ()) -> str:
    """The blocks of ``keep`` (all when ``None``) and the notes containing one of ``notes``; ``...`` where some
    were left out; trailing spaces stripped.

    Example:
        >>> print(trim("nnmem calc (x): batch 1\\nnote: a\\nnote: b  ", ["title"], notes=["b"]))
        nnmem calc (x): batch 1
        ...
        note: b
    """
    lines: list[str] = []
    for kind, block in blocks(text):
        shown = keep is None or kind in keep or kind in ("other", "status")
        shown = shown or (kind == "note" and any(part in block[0] for part in notes))
        if shown:
            lines.extend(line.rstrip() for line in block)
        elif not lines or lines[-1] != "...":
            lines.append("...")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Example:
    """One command: what it asks, the command line after ``nnmem``, and which parts of its output to show.

    ``keep``: the block kinds shown (``None``: all); ``notes``: notes shown when they contain one of these strings;
    ``json_keys``: for ``--json``, the keys shown (dotted for nested ones); ``status``: the shell shows the exit
    status; ``expect``: the exit status the example is about (another one is an error of the render, not an output).
    """

    question: str
    line: str
    keep: tuple[str, ...] | None = ("title", "breakdown", "phase", "budget", "fit", "verified")
    notes: tuple[str, ...] = ()
    json_keys: tuple[str, ...] = ()
    status: bool = False
    expect: int = 0
    heading: str = ""

    @property
    def argv(self) -> list[str]:
        """The arguments after ``nnmem``."""
        return shlex.split(self.line)

    @property
    def command(self) -> str:
        """The shell line, wrapped before an option where it would pass 100 columns."""
        lines, line = [], "nnmem"
        for word in map(shlex.quote, self.argv):
            if len(line) + 1 + len(word) > 100 and word.startswith("-"):
                lines.append(line + " \\")
                line = "    " + word
            else:
                line = f"{line} {word}"
        lines.append(line)
        text = "\n".join(lines)
        if self.status:
            text += ' || echo "exit status $?"'
        return text


BERT = "--layers 12 --hidden 768 --heads 12 --vocab 30522 --seq-len 128 --arch bert"
RESNET = f"estimate {MODELS}:resnet50 -i 3,224,224 -b 64 --precision 16-mixed --optimizer adam"
MLP = f"estimate {MODELS}:mlp -i 1000 -b 256"

#: The examples, in the file's order.
EXAMPLES: tuple[Example, ...] = (
    Example("The built-in GPU table (`--device` accepts these names)", "gpus", keep=None, heading="Getting around"),
    Example(
        "1. MLP 1000-100-100-100-100-10, batch 256, fp32, SGD (seed: 1,820 activation elements per sample, ~1.8 MB); "
        "napkin formulas",
        "calc --layers 1000,100,100,100,100,10 -b 256 --optimizer sgd --device cpu --budget 1GiB",
        heading="The seed questions",
    ),
    Example("The same MLP, its real training step traced", f"{MLP} --optimizer sgd --device cpu --budget 1GiB"),
    Example(
        "2. A 19M-parameter CNN with 532,752 activations per sample, batch 128 (seed rule: 742 MB), with SGD",
        "calc --params 19M --activations 532752 -b 128 --optimizer sgd",
        keep=("title", "breakdown", "phase"),
    ),
    Example(
        "The same CNN with Adam, and what would shrink it",
        "calc --params 19M --activations 532752 -b 128 --optimizer adam",
        keep=("title", "breakdown", "phase", "shrink"),
    ),
    Example(
        "3. BERT-base, AdamW, batch 32, sequence 128, on an A100 40GB (seed calculator: ~1.9 GB); napkin formulas",
        f"calc {BERT} -b 32 --optimizer adamw --device a100-40gb",
    ),
    Example(
        "The same BERT, its real training step traced for the A100 40GB",
        f"estimate {MODELS}:bert_base_mlm -i input_ids=int64:128 -i labels=int64:128 -b 32 --optimizer adamw "
        "--device a100-40gb",
        notes=("CUDA context and libraries",),
    ),
    Example(
        '4. ResNet-50, batch 64, fp16 AMP, Adam, on an A100 80GB (seed: 1-2 GB; "fp16" is ambiguous, so say '
        "16-mixed or 16-true)",
        f"{RESNET} --device a100-80gb",
    ),
    Example(
        "The largest batch of the same ResNet-50 on a T4, checked by a direct estimate at that batch",
        f"{RESNET} --device t4",
        keep=("title", "budget", "fit", "verified"),
    ),
    Example(
        "Which GPU fits a GPT-2-medium fine-tune in bf16 with selective recomputation",
        "calc --layers 24 --hidden 1024 --heads 16 --vocab 50257 --seq-len 1024 -b 8 --precision bf16-mixed "
        "--recompute selective --activation gelu_new",
        keep=("title", "phase", "gpus", "shrink"),
        heading="More",
    ),
    Example(
        "A budget instead of a GPU, and JSON for scripts (some of its keys shown; bytes are integers)",
        f"{MLP} --optimizer adam --device cpu --budget 1GiB --json",
        json_keys=(
            "peak_bytes",
            "device_bytes",
            "peak_phase",
            "method",
            "fixed_bytes",
            "per_sample_bytes",
            "fit.budget_bytes",
            "fit.usable_bytes",
            "fit.predicted_bytes",
            "fit.max_batch_size",
            "fit.fits",
        ),
    ),
    Example(
        "Per rank: the same GPT-2-medium under DeepSpeed ZeRO-3 on 8 GPUs (`--world-size 8 --zero-stage 3`; "
        "`--fsdp` for FSDP2). Under bf16-mixed the states are DeepSpeed's: a 16-bit model with fp32 master weights. "
        "Without `--device`, the table also counts the fewest GPUs of each kind whose share fits",
        "calc --layers 24 --hidden 1024 --heads 16 --vocab 50257 --seq-len 1024 -b 8 --precision bf16-mixed "
        "--activation gelu_new --world-size 8 --zero-stage 3",
        keep=("title", "breakdown", "gpus"),
    ),
    Example(
        "`--fsdp` and `--zero-stage` shard over `--world-size` ranks, so both commands need it",
        "calc --layers 24 --hidden 1024 --heads 16 --vocab 50257 --seq-len 1024 -b 8 --zero-stage 3",
        keep=(),
        status=True,
        expect=2,
    ),
    Example(
        "A pre-flight check in a job script: exit status 3 when `--budget` or `--device` is given and the batch "
        "does not fit (here a 7B-parameter model with AdamW in fp32, at any batch)",
        "calc --params 7B --activations 20M -b 8 --optimizer adamw --device a100-40gb",
        keep=("title", "budget", "fit", "shrink"),
        status=True,
        expect=3,
    ),
)


def _pick(document: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The dotted ``keys`` of ``document``, nested as there.

    Example:
        >>> _pick({"a": 1, "b": {"c": 2, "d": 3}}, ["b.c", "a"])
        {'b': {'c': 2}, 'a': 1}
    """
    out: dict[str, Any] = {}
    for key in keys:
        source, target, parts = document, out, key.split(".")
        for part in parts[:-1]:
            source = source[part]
            target = target.setdefault(part, {})
        target[parts[-1]] = source[parts[-1]]
    return out


def run_example(example: Example, main: Callable[[list[str]], int] | None = None) -> tuple[int, str]:
    """Runs ``nnmem ARGV`` in this process; returns its exit status and its output (stdout, then stderr)."""
    if main is None:
        from nnmem_callbacks.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(list(example.argv))
    if code != example.expect:
        raise RuntimeError(
            f"{example.command} exited with {code}, not {example.expect}:\n{out.getvalue()}{err.getvalue()}"
        )
    text = out.getvalue() + err.getvalue()
    if example.json_keys:
        text = json.dumps(_pick(json.loads(out.getvalue()), example.json_keys), indent=2) + "\n" + err.getvalue()
    else:
        text = trim(text, example.keep, example.notes)
    if example.status:
        text = text.rstrip("\n") + f"\nexit status {code}"
    return code, text.rstrip("\n")


def _versions() -> tuple[str, str]:
    import torch

    import nnmem_callbacks

    return nnmem_callbacks.__version__, torch.__version__


def _wrap(text: str) -> str:
    """A paragraph wrapped at 115 columns (links and code spans unbroken)."""
    unbroken = re.sub(r"`[^`]*`", lambda match: match.group(0).replace(" ", "\0"), text)
    return textwrap.fill(unbroken, width=115, break_long_words=False, break_on_hyphens=False).replace("\0", " ")


def intro() -> str:
    version, torch_version = _versions()
    return "\n\n".join(
        [
            "# `nnmem` from the command line",
            "<!-- generated by `python -m benchmarks.tools.cli_examples --write`; "
            "tests/test_doc_numbers.py checks it -->",
            _wrap(
                "`nnmem estimate` traces the real training step of a model from a factory (`package.module:factory`, "
                "`file.py:factory` or a saved `model.keras`) on fake tensors; `nnmem calc` answers from bare numbers with "
                "closed-form napkin formulas (`nnmem_callbacks/estimators/napkin/`, [docs/napkin.md](../docs/napkin.md)). "
                "`nnmem --help` lists the commands, `nnmem COMMAND --help` their options."
            ),
            _wrap(
                f"Every output below is what the command printed (nnmem_callbacks {version}, torch {torch_version}, "
                "no GPU: CUDA targets use the CUDA model and the measured context tables). Long outputs are cut to the "
                'lines that answer the question; `...` marks where lines (the notes, the "why", the suggestions) were '
                "left out."
            ),
        ]
    )


#: Said before the seed questions: where their measured answers are.
SEEDS = (
    "The seeds' own answers, these commands' answers and real measurements on CPU, side by side: "
    "[benchmarks/results/seeds/zen4-avx512.md](../benchmarks/results/seeds/zen4-avx512.md) "
    "(`python -m benchmarks.suites.seeds`). The napkin formulas against the trace: "
    "[benchmarks/results/napkin_vs_trace/zen4-avx512.md](../benchmarks/results/napkin_vs_trace/zen4-avx512.md)."
)

#: The closing lines: commands whose output is not text.
OUTRO = (
    "`--plot memory.png` (with `estimate` or `calc`) also draws the memory against the batch size, and "
    "`nnmem demo -- --epochs 1` runs the Lightning quickstart (its options after `--`)."
)


def render(examples: Sequence[Example] = EXAMPLES, progress: Any = None) -> str:
    """The Markdown file: the intro, then each example's command and output."""
    os.environ.setdefault("COLUMNS", "110")
    parts = [intro()]
    for example in examples:
        if example.heading:
            parts.append(f"## {example.heading}")
            if example.heading == "The seed questions":
                parts.append(_wrap(SEEDS))
        _, output = run_example(example)
        if progress is not None:
            print(f"ran {example.command.splitlines()[0]}", file=progress)
        parts.append(f"{_wrap(example.question)}:\n\n```bash\n{example.command}\n```\n\n```text\n{output}\n```")
    parts.append(_wrap(OUTRO))
    return "\n\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tools.cli_examples", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"rewrite {OUTPUT.relative_to(ROOT)}")
    group.add_argument("--check", action="store_true", help=f"exit 1 when {OUTPUT.relative_to(ROOT)} differs")
    args = parser.parse_args(argv)
    text = render(progress=sys.stderr if args.write else None)
    if args.write:
        OUTPUT.write_text(text)
        return 0
    if args.check:
        committed = OUTPUT.read_text() if OUTPUT.exists() else ""
        if committed == text:
            return 0
        sys.stdout.writelines(
            difflib.unified_diff(
                committed.splitlines(keepends=True), text.splitlines(keepends=True), "committed", "rendered"
            )
        )
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
