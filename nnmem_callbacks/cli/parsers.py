"""The argparse parsers; each ``*_command_parser`` works standalone or as a subcommand."""

from __future__ import annotations

import argparse
from typing import Any

from nnmem_callbacks.cli.commands import calc_command, estimate_command, gpus_command
from nnmem_callbacks.cli.demo import demo_command
from nnmem_callbacks.cli.values import count_arg, dims_product_arg, positive_int_arg
from nnmem_callbacks.core import vocabulary
from nnmem_callbacks.estimators import napkin

__all__ = [
    "build_parser",
    "calc_command_parser",
    "COMPILE_MODES",
    "demo_command_parser",
    "DEMO_EXAMPLE",
    "estimate_command_parser",
    "gpus_command_parser",
]

_EXIT_STATUS = """\
exit status:
  0  done; with --budget or --device, the batch fits
  1  internal error (please report it)
  2  usage error: a bad option, model, input shape, budget or device
  3  --budget or --device was given and the batch is predicted NOT to fit
     (a pre-flight check: nnmem calc ... --device a100-80gb || exit 1)
"""

_EPILOG_ESTIMATE = (
    """\
examples:
  nnmem estimate nnmem_callbacks.examples.models:mlp --input-shape 1000 --batch-size 256 --optimizer sgd
  nnmem estimate nnmem_callbacks.examples.models:bert_base_mlm --input-shape input_ids=int64:128 \\
      --input-shape labels=int64:128 --batch-size 32 --optimizer adamw --device a100-80gb
  nnmem estimate nnmem_callbacks.examples.models:resnet50 --input-shape 3,224,224 --batch-size 64 \\
      --precision 16-mixed --optimizer adam --plot resnet50.png
  nnmem estimate mypkg.models:build --input-shape 3,32,32 --device cpu --budget 4GiB --json
  nnmem estimate nnmem_callbacks.examples.models:gpt2 --input-shape input_ids=int64:512 \\
      --input-shape labels=int64:512 --batch-size 8 --world-size 8 --fsdp --device h100
"""
    + "\n"
    + _EXIT_STATUS
)

_EPILOG_CALC = (
    """\
modes (picked from the options given):
  transformer  --layers L --hidden H --heads A --seq-len S [--vocab V] [--arch gpt|bert]
  mlp          --layers 1000,100,100,10   (layer widths, input first)
  counts       --params N --activations N [--input-size N]   (activation elements per sample)
  lora         --lora-rank R with the transformer options and --ffn: LoRA / QLoRA of a Llama-style decoder
               [--kv-heads K] [--lora-targets q,k,v,o] [--quantize none|4bit|8bit] [--recompute full|none]
  an option of another mode is an error (exit status 2), not ignored

examples:
  nnmem calc --layers 1000,100,100,100,100,10 --batch-size 256 --optimizer sgd
  nnmem calc --params 19M --activations 532752 --batch-size 128 --optimizer sgd
  nnmem calc --layers 12 --hidden 768 --heads 12 --vocab 30522 --seq-len 128 --arch bert \\
      --batch-size 32 --optimizer adamw
  nnmem calc --layers 24 --hidden 1024 --heads 16 --vocab 50257 --seq-len 1024 --batch-size 8 \\
      --precision bf16-mixed --recompute selective --device h100
  nnmem calc --lora-rank 16 --quantize 4bit --layers 32 --hidden 4096 --heads 32 --ffn 11008 \\
      --vocab 32000 --seq-len 2048 --recompute full --precision bf16-true --device a100-40gb
  nnmem calc --layers 24 --hidden 1024 --heads 16 --vocab 50257 --seq-len 1024 --batch-size 8 \\
      --precision bf16-mixed --world-size 8 --zero-stage 3
"""
    + "\n"
    + _EXIT_STATUS
)


# =============================================================================
# Parsers (each factory works standalone or as a subcommand)
# =============================================================================
def _subparser(subparsers: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
    if subparsers is not None:
        return subparsers.add_parser(name, **kwargs)
    kwargs.pop("help", None)
    return argparse.ArgumentParser(prog=f"nnmem {name}", **kwargs)


class _StoreGiven(argparse.Action):
    """Stores the value and records that the option was written (``args.<dest>_given``), as a default is not."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


#: ``torch.compile`` modes ``nnmem estimate --compile-mode`` accepts.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-size",
        "-b",
        type=positive_int_arg,
        default=1,
        metavar="N",
        help="batch size to estimate at (default: 1), e.g. --batch-size 32",
    )
    parser.add_argument(
        "--optimizer",
        default="adam",
        metavar="NAME",
        action=_StoreGiven,
        help=f"optimizer: {vocabulary.optimizer_help()} (default: adam), e.g. --optimizer adamw",
    )
    parser.add_argument(
        "--precision",
        default="32-true",
        metavar="P",
        help=f"Lightning precision: {vocabulary.precision_help()}; fp16/half/bfloat16 are ambiguous and rejected "
        f"(default: 32-true), e.g. --precision bf16-mixed",
    )
    parser.add_argument(
        "--device",
        default=None,
        metavar="DEV",
        help="where training runs: cpu, cuda, cuda:N, or a GPU name from `nnmem gpus` "
        "(case-insensitive: h100, 'A100 80GB', a100-40gb, rtx4090); cuda:N must exist on this machine. "
        "Without it the target is cuda and a 'which GPU fits' table is printed; e.g. --device a100-80gb",
    )
    parser.add_argument(
        "--budget",
        default=None,
        metavar="SIZE",
        help="memory to fit into: a size with a unit (6GiB, 512MiB, 16GB) or a bare number, read as a fraction "
        "of the device in (0, 1] (0.9; '1.5' is an error: write 1.5GiB); default: the device's free memory "
        "(a named GPU: the memory CUDA reports for it, see `nnmem gpus`) minus 5%%, as "
        "MemoryBudgetCallback(budget=None); e.g. --budget 10GiB",
    )
    parser.add_argument(
        "--world-size",
        type=positive_int_arg,
        default=None,
        metavar="N",
        help="ranks training together (default: one device); alone it means DDP (every rank holds the model plus "
        "its gradient buckets), with --fsdp or --zero-stage (which need it) the states are sharded; the estimate "
        "is per rank, and calc's GPU table also counts the fewest ranks of each GPU that fit, e.g. "
        "--world-size 8 --fsdp",
    )
    parser.add_argument(
        "--fsdp",
        action="store_true",
        help="FSDP2 (fully_shard): parameters, gradients and optimizer state sharded over --world-size "
        "(required with it), e.g. --world-size 8 --fsdp",
    )
    parser.add_argument(
        "--zero-stage",
        type=int,
        choices=(1, 2, 3),
        default=None,
        metavar="K",
        help="DeepSpeed ZeRO stage 1, 2 or 3 over --world-size (required with it; model states by formula, "
        "under 16-mixed/bf16-mixed DeepSpeed's 16-bit model and fp32 master weights), "
        "e.g. --world-size 8 --zero-stage 3",
    )
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON instead of tables")
    parser.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="also draw the breakdown and the peak against the batch size with the budget line, e.g. --plot memory.png",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for errors")


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of ``nnmem estimate``; standalone when ``subparsers`` is ``None``.

    Example:
        >>> args = estimate_command_parser().parse_args(["m.py:make", "--input-shape", "3,32,32"])
        >>> args.model, args.input_shape
        ('m.py:make', ['3,32,32'])
    """
    parser = _subparser(
        subparsers,
        "estimate",
        help="trace a training step of a model and predict its peak memory",
        description="Predict the peak memory of training a model, without running it: the step is "
        "traced on fake tensors (nothing large is allocated).",
        epilog=_EPILOG_ESTIMATE,
    )
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="package.module:factory, path/to/file.py:factory (a callable returning a torch.nn.Module), "
        "or a saved Keras model (file.keras), e.g. nnmem_callbacks.examples.models:resnet50",
    )
    parser.add_argument(
        "--input-shape",
        "-i",
        action="append",
        default=None,
        metavar="[NAME=][DTYPE:]DIMS",
        help="shape of one input per sample, without the batch dimension; repeat for several inputs "
        "(passed positionally, or as keywords when named). DTYPE defaults to float32; integer "
        "inputs such as token ids: int64:128; e.g. -i 3,224,224 or -i input_ids=int64:128 -i labels=int64:128",
    )
    parser.add_argument(
        "--model-arg",
        "-a",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="keyword argument for the factory (a Python literal, else a string); repeatable, "
        "e.g. --model-arg num_classes=10",
    )
    parser.add_argument(
        "--seq-len",
        type=positive_int_arg,
        default=None,
        metavar="N",
        help="also answer at sequence length N and give the longest sequence that fits the budget at the batch: "
        "the step is traced at the length of the token ids (-i input_ids=int64:LEN), at half it and at twice it; "
        "e.g. --seq-len 4096",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="estimate the torch.compile'd step (Inductor: what it saves for backward, fuses and reuses) "
        "instead of the eager one; PyTorch factories only",
    )
    parser.add_argument(
        "--compile-mode",
        default=None,
        choices=COMPILE_MODES,
        metavar="MODE",
        help=f"torch.compile's mode with --compile: {', '.join(COMPILE_MODES)} (default: torch's default); "
        "autotuning and CUDA graphs are not modelled and notes say so, e.g. --compile-mode max-autotune",
    )
    parser.add_argument(
        "--no-probes",
        action="store_true",
        help="for a CPU target, do not run the CPU kernels once to measure their scratch memory (cached per "
        "machine; a first estimate on a new machine spends most of its time there): the rules' formulas give "
        "it instead, faster and less exact; the notes say so",
    )
    _add_target_options(parser)
    parser.set_defaults(func=estimate_command)
    return parser


def calc_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of ``nnmem calc`` (napkin mode); standalone when ``subparsers`` is ``None``.

    Example:
        >>> args = calc_command_parser().parse_args(["--params", "19M", "--activations", "532752"])
        >>> args.params, args.activations
        (19000000, 532752)
    """
    parser = _subparser(
        subparsers,
        "calc",
        help="napkin estimate from bare numbers: parameters, layers, sequence length",
        description="Napkin mode: training memory from numbers alone (no model code). Prints the same "
        "table as `nnmem estimate` and a short 'why': which terms dominate and what would "
        "shrink them.",
        epilog=_EPILOG_CALC,
    )
    parser.add_argument(
        "--layers",
        default=None,
        metavar="L|W1,W2,...",
        help="transformer: number of layers (with --hidden), e.g. --layers 12; "
        "MLP: layer widths from input to output, e.g. --layers 1000,100,100,10",
    )
    parser.add_argument(
        "--hidden", type=positive_int_arg, default=None, metavar="H", help="transformer hidden size, e.g. --hidden 768"
    )
    parser.add_argument(
        "--heads", type=positive_int_arg, default=None, metavar="A", help="transformer attention heads, e.g. --heads 12"
    )
    parser.add_argument(
        "--seq-len",
        type=positive_int_arg,
        default=None,
        metavar="S",
        help="transformer sequence length, e.g. --seq-len 128",
    )
    parser.add_argument(
        "--vocab",
        type=count_arg,
        default=0,
        metavar="V",
        help="vocabulary size for the LM head and loss (default 0: none), e.g. --vocab 30522",
        action=_StoreGiven,
    )
    parser.add_argument(
        "--ffn",
        type=positive_int_arg,
        default=None,
        metavar="F",
        help="transformer MLP width (default 4*hidden), e.g. --ffn 3072",
    )
    parser.add_argument(
        "--arch",
        choices=napkin.ARCHITECTURES,
        default="gpt",
        help="gpt: pre-LN decoder with tied LM head; bert: masked-LM encoder (default: gpt)",
        action=_StoreGiven,
    )
    parser.add_argument(
        "--max-positions",
        type=positive_int_arg,
        default=None,
        metavar="N",
        help="position embeddings (default 1024 for gpt, 512 for bert), e.g. --max-positions 2048",
    )
    parser.add_argument(
        "--recompute",
        choices=napkin.RECOMPUTE,
        default="none",
        help="activation recomputation: none, selective (attention scores), full "
        "(checkpoint every layer) (default: none)",
        action=_StoreGiven,
    )
    parser.add_argument(
        "--attention",
        choices=napkin.ATTENTION,
        default=None,
        help="eager: attention scores are kept (the published formula); flash: fused "
        "kernel (SDPA flash/memory-efficient) (default: eager; flash with --lora-rank)",
    )
    parser.add_argument(
        "--activation",
        choices=napkin.ACTIVATIONS,
        default="gelu",
        help="transformer MLP activation: gelu (one fused kernel; BERT, most models) or gelu_new "
        "(tanh GELU written as elementwise ops, HF GPT-2's default) (default: gelu)",
        action=_StoreGiven,
    )
    parser.add_argument("--no-dropout", action="store_true", help="dropout off: no 1-byte masks are kept")
    parser.add_argument(
        "--lora-rank",
        type=positive_int_arg,
        default=None,
        metavar="R",
        help="LoRA / QLoRA of a Llama-style decoder (RMSNorm, gated MLP, untied head): the adapters' rank, "
        "e.g. --lora-rank 16",
    )
    parser.add_argument(
        "--lora-targets",
        default="q,k,v,o",
        metavar="NAMES",
        help=f"layers with adapters, from {','.join(napkin.LORA_TARGETS)} (default: q,k,v,o), "
        "e.g. --lora-targets q,k,v,o,gate,up,down",
        action=_StoreGiven,
    )
    parser.add_argument(
        "--quantize",
        choices=napkin.QUANTIZATIONS,
        default="none",
        help="the frozen base's linear layers with --lora-rank: none, 4bit (QLoRA, nf4 with double "
        "quantization) or 8bit (default: none)",
        action=_StoreGiven,
    )
    parser.add_argument(
        "--kv-heads",
        type=positive_int_arg,
        default=None,
        metavar="K",
        help="key/value heads with --lora-rank (grouped-query attention; default: --heads), e.g. --kv-heads 8",
    )
    parser.add_argument(
        "--params",
        type=count_arg,
        default=None,
        metavar="N",
        help="parameter count (19M, 1.5B, 110_000_000); for transformers it overrides "
        "the count implied by the layer sizes, e.g. --params 19M",
    )
    parser.add_argument(
        "--activations",
        type=count_arg,
        default=None,
        metavar="N",
        help="activation elements saved per sample (counts mode), e.g. --activations 532752",
    )
    parser.add_argument(
        "--input-size",
        type=dims_product_arg,
        default=0,
        metavar="N|D1,D2,..",
        help="input elements per sample (counts mode), e.g. --input-size 3,224,224",
        action=_StoreGiven,
    )
    _add_target_options(parser)
    parser.set_defaults(func=calc_command)
    return parser


def gpus_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of ``nnmem gpus``; standalone when ``subparsers`` is ``None``."""
    parser = _subparser(
        subparsers,
        "gpus",
        help="list the built-in GPU table",
        description="The GPUs --device accepts by name, with the memory nvidia-smi reports and the total CUDA "
        "reports (torch.cuda.mem_get_info), which fits are checked against: measured here, reported by public "
        "out-of-memory messages (sources in --json), else assumed.",
        epilog="example:\n  nnmem gpus --json",
    )
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(func=gpus_command)
    return parser


#: The example in ``nnmem demo --help`` (a test runs it through the quickstart's parser).
DEMO_EXAMPLE = "example:\n  nnmem demo -- --epochs 1 --log-dir runs/demo\n  nnmem demo -- --help"


def demo_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of ``nnmem demo``; standalone when ``subparsers`` is ``None``."""
    parser = _subparser(
        subparsers,
        "demo",
        help="run the Lightning quickstart (examples/lightning_quickstart.py)",
        description="Runs examples/lightning_quickstart.py with this Python; extra arguments are passed on.",
        epilog=DEMO_EXAMPLE,
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the quickstart, e.g. -- --help")
    parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(func=demo_command)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The top-level ``nnmem`` parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="nnmem",
        description="Predict the peak memory of training before it runs: from a model (estimate) or "
        "from bare numbers (calc), with the largest batch that fits each GPU.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  nnmem estimate nnmem_callbacks.examples.models:resnet50 -i 3,224,224 -b 64 --precision 16-mixed\n"
        "  nnmem calc --layers 12 --hidden 768 --heads 12 --vocab 30522 --seq-len 128 --arch bert -b 32\n"
        "  nnmem gpus\n"
        "  nnmem demo\n"
        "Run `nnmem COMMAND --help` for the options of each command.\n"
        f"{_EXIT_STATUS}",
    )
    from nnmem_callbacks import __version__

    parser.add_argument("--version", action="version", version=f"nnmem {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    estimate_command_parser(subparsers)
    calc_command_parser(subparsers)
    gpus_command_parser(subparsers)
    demo_command_parser(subparsers)
    return parser


# -- argument types ------------------------------------------------------------
