"""The ``nnmem`` command: predict training memory from a model or from bare numbers.

Subcommands:

* ``nnmem estimate MODEL``: trace one training step of a model built by a
  factory (``package.module:factory`` or ``path/to/file.py:factory``) and
  print the peak, its breakdown, the allocator reserve, the CUDA overhead and
  the largest batch that fits a GPU or a budget.
* ``nnmem calc``: the same table from bare numbers (napkin formulas in
  :mod:`nnmem_callbacks.napkin`), with a short "why".
* ``nnmem gpus``: the built-in GPU table.
* ``nnmem demo``: runs ``examples/lightning_quickstart.py``.

As in accelerate's ``commands/estimate.py``, gathering (loading the model,
building the batch), computing (:func:`fit_summary`, the estimators) and
formatting (:func:`render_estimate`, :func:`estimate_to_json`) are separate
functions, and every ``*_command_parser`` works standalone or as a
subcommand. Importing this module does not import torch; the estimators are
imported when a command needs them.

Example:
    >>> parser = calc_command_parser()
    >>> args = parser.parse_args(["--layers", "1000,100,10", "--batch-size", "4", "--optimizer", "sgd"])
    >>> est = napkin_from_args(args)
    >>> est.method, est.batch_size
    ('napkin:mlp', 4)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from nnmem_callbacks import gpus as gpu_table
from nnmem_callbacks import napkin
from nnmem_callbacks.estimate import MemoryEstimate
from nnmem_callbacks.report import breakdown_rows
from nnmem_callbacks.units import format_bytes, parse_bytes

EXIT_USAGE = 2
EXIT_FAILURE = 1

_DTYPES = {
    "float32": "float32", "float": "float32", "fp32": "float32", "f32": "float32",
    "float16": "float16", "half": "float16", "fp16": "float16", "f16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "double": "float64", "fp64": "float64",
    "int64": "int64", "long": "int64", "int": "int64", "i64": "int64",
    "int32": "int32", "i32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8",
    "bool": "bool",
}

_EPILOG_ESTIMATE = """\
examples:
  nnmem estimate examples/models.py:mlp --input-shape 1000 --batch-size 256 --optimizer sgd
  nnmem estimate examples/models.py:bert_base_mlm --input-shape input_ids=int64:128 \\
      --input-shape labels=int64:128 --batch-size 32 --optimizer adamw --device a100-80gb
  nnmem estimate examples/models.py:resnet50 --input-shape 3,224,224 --batch-size 64 \\
      --precision 16-mixed --optimizer adam --plot resnet50.png
  nnmem estimate mypkg.models:build --input-shape 3,32,32 --device cpu --budget 4GiB --json
"""

_EPILOG_CALC = """\
modes (picked from the options given):
  transformer  --layers L --hidden H --heads A --seq-len S [--vocab V] [--arch gpt|bert]
  mlp          --layers 1000,100,100,10   (layer widths, input first)
  counts       --params N --activations N [--input-size N]   (activation elements per sample)

examples:
  nnmem calc --layers 1000,100,100,100,100,10 --batch-size 256 --optimizer sgd
  nnmem calc --params 19M --activations 532752 --batch-size 128 --optimizer sgd
  nnmem calc --layers 12 --hidden 768 --heads 12 --vocab 30522 --seq-len 128 --arch bert \\
      --batch-size 32 --optimizer adamw
  nnmem calc --layers 24 --hidden 1024 --heads 16 --vocab 50257 --seq-len 1024 --batch-size 8 \\
      --precision bf16-mixed --recompute selective --device h100
"""


class CliError(Exception):
    """A user mistake: printed as one short message, exit code 2, no traceback."""


# =============================================================================
# Parsers (each factory works standalone or as a subcommand)
# =============================================================================
def _subparser(subparsers: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
    if subparsers is not None:
        return subparsers.add_parser(name, **kwargs)
    kwargs.pop("help", None)
    return argparse.ArgumentParser(prog=f"nnmem {name}", **kwargs)


def _add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-size", "-b", type=_positive_int, default=1, metavar="N",
        help="batch size to estimate at (default: 1), e.g. --batch-size 32",
    )
    parser.add_argument(
        "--optimizer", default="adam", metavar="NAME",
        help="optimizer: sgd, sgd_momentum (momentum), adam, adamw, adagrad, rmsprop, adamax, "
             "adadelta, nadam, radam (default: adam), e.g. --optimizer adamw",
    )
    parser.add_argument(
        "--precision", default="32-true", metavar="P",
        help="Lightning precision: 32-true, 16-mixed, bf16-mixed, 16-true, bf16-true, 64-true "
             "(default: 32-true), e.g. --precision bf16-mixed",
    )
    parser.add_argument(
        "--device", default=None, metavar="DEV",
        help="where training runs: cpu, cuda, cuda:N, or a GPU name from `nnmem gpus` "
             "(case-insensitive: h100, 'A100 80GB', a100-40gb, rtx4090). Without it the target is "
             "cuda and a 'which GPU fits' table is printed; e.g. --device a100-80gb",
    )
    parser.add_argument(
        "--budget", default=None, metavar="SIZE",
        help="memory to fit into: bytes with a unit (6GiB, 512MiB, 16GB) or a fraction of the "
             "device (0.9); default: the device's memory, e.g. --budget 10GiB",
    )
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON instead of tables")
    parser.add_argument(
        "--plot", default=None, metavar="FILE.png",
        help="also draw the breakdown and the peak against the batch size with the budget line, "
             "e.g. --plot memory.png",
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
        subparsers, "estimate",
        help="trace a training step of a model and predict its peak memory",
        description="Predict the peak memory of training a model, without running it: the step is "
                    "traced on fake tensors (nothing large is allocated).",
        epilog=_EPILOG_ESTIMATE,
    )
    parser.add_argument(
        "model", metavar="MODEL",
        help="package.module:factory, path/to/file.py:factory (a callable returning a torch.nn.Module), "
             "or a saved Keras model (file.keras), e.g. examples/models.py:resnet50",
    )
    parser.add_argument(
        "--input-shape", "-i", action="append", default=None, metavar="[NAME=][DTYPE:]DIMS",
        help="shape of one input per sample, without the batch dimension; repeat for several inputs "
             "(passed positionally, or as keywords when named). DTYPE defaults to float32; integer "
             "inputs such as token ids: int64:128; e.g. -i 3,224,224 or -i input_ids=int64:128 -i labels=int64:128",
    )
    parser.add_argument(
        "--model-arg", "-a", action="append", default=None, metavar="KEY=VALUE",
        help="keyword argument for the factory (a Python literal, else a string); repeatable, "
             "e.g. --model-arg num_classes=10",
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
        subparsers, "calc",
        help="napkin estimate from bare numbers: parameters, layers, sequence length",
        description="Napkin mode: training memory from numbers alone (no model code). Prints the same "
                    "table as `nnmem estimate` and a short 'why': which terms dominate and what would "
                    "shrink them.",
        epilog=_EPILOG_CALC,
    )
    parser.add_argument(
        "--layers", default=None, metavar="L|W1,W2,...",
        help="transformer: number of layers (with --hidden), e.g. --layers 12; "
             "MLP: layer widths from input to output, e.g. --layers 1000,100,100,10",
    )
    parser.add_argument("--hidden", type=_positive_int, default=None, metavar="H",
                        help="transformer hidden size, e.g. --hidden 768")
    parser.add_argument("--heads", type=_positive_int, default=None, metavar="A",
                        help="transformer attention heads, e.g. --heads 12")
    parser.add_argument("--seq-len", type=_positive_int, default=None, metavar="S",
                        help="transformer sequence length, e.g. --seq-len 128")
    parser.add_argument("--vocab", type=_count, default=0, metavar="V",
                        help="vocabulary size for the LM head and loss (default 0: none), e.g. --vocab 30522")
    parser.add_argument("--ffn", type=_positive_int, default=None, metavar="F",
                        help="transformer MLP width (default 4*hidden), e.g. --ffn 3072")
    parser.add_argument("--arch", choices=napkin.ARCHITECTURES, default="gpt",
                        help="gpt: pre-LN decoder with tied LM head; bert: masked-LM encoder (default: gpt)")
    parser.add_argument("--max-positions", type=_positive_int, default=None, metavar="N",
                        help="position embeddings (default 1024 for gpt, 512 for bert), e.g. --max-positions 2048")
    parser.add_argument("--recompute", choices=napkin.RECOMPUTE, default="none",
                        help="activation recomputation: none, selective (attention scores), full "
                             "(checkpoint every layer) (default: none)")
    parser.add_argument("--attention", choices=napkin.ATTENTION, default="eager",
                        help="eager: attention scores are kept (the published formula); flash: fused "
                             "kernel (SDPA flash/memory-efficient) (default: eager)")
    parser.add_argument("--activation", choices=napkin.ACTIVATIONS, default="gelu",
                        help="transformer MLP activation: gelu (one fused kernel; BERT, most models) or gelu_new "
                             "(tanh GELU written as elementwise ops, HF GPT-2's default) (default: gelu)")
    parser.add_argument("--no-dropout", action="store_true", help="dropout off: no 1-byte masks are kept")
    parser.add_argument("--params", type=_count, default=None, metavar="N",
                        help="parameter count (19M, 1.5B, 110_000_000); for transformers it overrides "
                             "the count implied by the layer sizes, e.g. --params 19M")
    parser.add_argument("--activations", type=_count, default=None, metavar="N",
                        help="activation elements saved per sample (counts mode), e.g. --activations 532752")
    parser.add_argument("--input-size", type=_dims_product, default=0, metavar="N|D1,D2,..",
                        help="input elements per sample (counts mode), e.g. --input-size 3,224,224")
    _add_target_options(parser)
    parser.set_defaults(func=calc_command)
    return parser


def gpus_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of ``nnmem gpus``; standalone when ``subparsers`` is ``None``."""
    parser = _subparser(
        subparsers, "gpus", help="list the built-in GPU table",
        description="The GPUs --device accepts by name, with the memory nvidia-smi reports.",
        epilog="example:\n  nnmem gpus --json",
    )
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(func=gpus_command)
    return parser


def demo_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of ``nnmem demo``; standalone when ``subparsers`` is ``None``."""
    parser = _subparser(
        subparsers, "demo", help="run the Lightning quickstart (examples/lightning_quickstart.py)",
        description="Runs examples/lightning_quickstart.py with this Python; extra arguments are passed on.",
        epilog="example:\n  nnmem demo -- --max-epochs 1",
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
               "  nnmem estimate examples/models.py:resnet50 -i 3,224,224 -b 64 --precision 16-mixed\n"
               "  nnmem calc --layers 12 --hidden 768 --heads 12 --vocab 30522 --seq-len 128 --arch bert -b 32\n"
               "  nnmem gpus\n"
               "  nnmem demo\n"
               "Run `nnmem COMMAND --help` for the options of each command.",
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
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; e.g. 32") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


_COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(text: str) -> int:
    """Reads a count such as ``"19M"``, ``"1.5B"``, ``"532,752"`` or ``"19e6"``.

    Example:
        >>> parse_count("19M"), parse_count("1.5B"), parse_count("532,752"), parse_count("1e3")
        (19000000, 1500000000, 532752, 1000)
    """
    cleaned = str(text).strip().replace(",", "").replace("_", "").lower()
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)", cleaned)
    if match is None:
        raise ValueError(f"cannot read {text!r} as a count; write e.g. 19000000, 19M, 1.5B or 532,752")
    value = float(match.group(1)) * _COUNT_SUFFIXES[match.group(2)]
    if value != int(value) or value < 0:
        raise ValueError(f"{text!r} is not a whole, non-negative count")
    return int(value)


def _count(text: str) -> int:
    try:
        return parse_count(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _dims_product(text: str) -> int:
    try:
        dims = [parse_count(part) for part in text.split(",") if part.strip()] if "," in text else [parse_count(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read {text!r}; write a count (150528) or dims (3,224,224)") from None
    product = 1
    for dim in dims:
        product *= dim
    return product


# =============================================================================
# Gathering: GPUs and budgets, model specs, input shapes
# =============================================================================
@dataclasses.dataclass(frozen=True)
class Target:
    """Where training runs and how much memory it has.

    Attributes:
        device: What the estimator gets: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        gpu: The GPU picked by name, if any.
        capacity_bytes: Memory of the device, when known.
        free_bytes: Memory free now (local devices only).
        label: Human description, e.g. ``"cuda (A100 80GB)"``.
    """

    device: str
    gpu: gpu_table.GpuSpec | None
    capacity_bytes: int | None
    free_bytes: int | None
    label: str

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


def resolve_target(device: str | None) -> Target:
    """Turns ``--device`` into a :class:`Target`.

    ``None`` means a CUDA target of unknown size (a "which GPU fits" table is
    shown). ``"cuda"`` uses the local GPU when there is one.

    Raises:
        CliError: For a device that is neither cpu/cuda nor a known GPU name.

    Example:
        >>> resolve_target("H100").capacity_bytes // 2**20
        81559
        >>> resolve_target(None).device
        'cuda'
    """
    if device is None:
        return Target("cuda", None, None, None, "cuda (no GPU chosen: see the table of GPUs)")
    text = device.strip()
    lowered = text.lower()
    if lowered == "cpu":
        from nnmem_callbacks.devices import cpu_capacity

        total, available = cpu_capacity()
        return Target("cpu", None, total, available, "cpu (host RAM)")
    if re.fullmatch(r"cuda(:\d+)?", lowered):
        local = _local_cuda(lowered)
        if local is None:
            return Target(lowered, None, None, None, f"{lowered} (no local GPU: see the table of GPUs)")
        name, total, free = local
        return Target(lowered, None, total, free, f"{lowered} ({name}, local)")
    try:
        gpu = gpu_table.find_gpu(text)
    except ValueError as error:
        raise CliError(f"--device: {error}") from None
    return Target("cuda", gpu, gpu.memory_bytes, None, f"cuda ({gpu.name})")


def _local_cuda(device: str) -> tuple[str, int, int] | None:
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    from nnmem_callbacks.devices import cuda_capacity

    total, free = cuda_capacity(device)
    index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
    return torch.cuda.get_device_name(index), total, free


def resolve_budget_bytes(budget: str | None, target: Target) -> int | None:
    """``--budget`` in bytes: a size (``"6GiB"``) or a fraction of the device (``"0.9"``).

    Without ``--budget``, the device's capacity (a local GPU: its free memory;
    cpu: available RAM), or ``None`` when unknown.

    Raises:
        CliError: For an unreadable budget, or a fraction without a known device.

    Example:
        >>> resolve_budget_bytes("0.5", resolve_target("T4")) == 15360 * 2**20 // 2
        True
        >>> resolve_budget_bytes("6GiB", resolve_target(None))
        6442450944
    """
    if budget is None:
        if target.free_bytes is not None:
            return target.free_bytes
        return target.capacity_bytes
    text = budget.strip()
    try:
        fraction = float(text)
    except ValueError:
        fraction = None
    if fraction is not None and 0 < fraction <= 1 and not re.search(r"[a-zA-Z]", text):
        if target.capacity_bytes is None:
            raise CliError(
                f"--budget {text} is a fraction of the device, but the device's memory is unknown; "
                f"name a GPU (--device a100-80gb) or give bytes (--budget 10GiB)"
            )
        return int(target.capacity_bytes * fraction)
    try:
        value = parse_bytes(text)
    except ValueError as error:
        raise CliError(f"--budget: {error}; or a fraction of the device such as 0.9") from None
    if value <= 0:
        raise CliError(f"--budget must be positive, got {budget!r}")
    return value


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One model input per sample: ``[NAME=][DTYPE:]DIMS``."""

    name: str | None
    dtype: str
    shape: tuple[int, ...]


def parse_input_shape(text: str) -> InputSpec:
    """Reads one ``--input-shape``.

    Raises:
        CliError: Naming the valid syntax and dtypes.

    Example:
        >>> parse_input_shape("3,224,224")
        InputSpec(name=None, dtype='float32', shape=(3, 224, 224))
        >>> parse_input_shape("input_ids=int64:128")
        InputSpec(name='input_ids', dtype='int64', shape=(128,))
        >>> parse_input_shape("labels=long:")
        InputSpec(name='labels', dtype='int64', shape=())
    """
    raw = text.strip()
    name = None
    match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", raw)
    if match:
        name, raw = match.group(1), match.group(2)
    dtype = "float32"
    if ":" in raw:
        dtype_text, raw = raw.split(":", 1)
        key = dtype_text.strip().lower()
        if key not in _DTYPES:
            raise CliError(
                f"--input-shape {text!r}: unknown dtype {dtype_text!r}; valid dtypes: "
                f"{', '.join(sorted(set(_DTYPES.values())))} (e.g. int64:128)"
            )
        dtype = _DTYPES[key]
    raw = raw.strip().strip("()[]")
    dims: list[int] = []
    for part in (p.strip() for p in re.split(r"[,x×]", raw) if p.strip()):
        if not part.isdigit() or int(part) < 1:
            raise CliError(
                f"cannot read input shape {text!r}: write the per-sample dimensions without the batch "
                f"dimension, separated by commas, e.g. 3,224,224 or int64:128 or input_ids=int64:128"
            )
        dims.append(int(part))
    return InputSpec(name, dtype, tuple(dims))


def parse_model_args(items: Sequence[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; values are Python literals where they parse, else strings.

    Example:
        >>> parse_model_args(["num_classes=10", "name=tiny", "dims=(1, 2)"])
        {'num_classes': 10, 'name': 'tiny', 'dims': (1, 2)}
    """
    import ast

    kwargs: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise CliError(f"--model-arg {item!r}: write KEY=VALUE, e.g. --model-arg num_classes=10")
        try:
            kwargs[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key.strip()] = value
    return kwargs


_MODEL_SPEC_HELP = (
    "MODEL must be 'package.module:factory', 'path/to/file.py:factory' (a callable returning a "
    "torch.nn.Module) or a saved Keras model 'model.keras'"
)


def load_factory(spec: str) -> Any:
    """Imports the callable (or module instance) a ``MODEL`` spec names.

    Raises:
        CliError: For a malformed spec, a missing file or module, or a
            missing attribute; the message names the fix.
    """
    location, sep, attribute = spec.rpartition(":")
    if not sep or not location or not attribute:
        hint = ""
        if spec.endswith(".py") and os.path.isfile(spec):
            hint = f"; name the factory in it: {spec}:FACTORY (callables there: {_callables_in_file(spec)})"
        raise CliError(f"{_MODEL_SPEC_HELP}; got {spec!r}{hint}")
    if not attribute.isidentifier():
        raise CliError(f"{_MODEL_SPEC_HELP}; {attribute!r} is not a Python name (in {spec!r})")
    is_path = location.endswith(".py") or "/" in location or os.sep in location
    if is_path:
        path = Path(location)
        if not path.is_file():
            raise CliError(f"model file {location!r} not found (from {spec!r}); give a path to a .py file")
        module = _import_file(path, spec)
    else:
        try:
            module = importlib.import_module(location)
        except ModuleNotFoundError as error:
            raise CliError(
                f"cannot import module {location!r} ({error}); is it installed or on PYTHONPATH? "
                f"For a file, write path/to/{location.replace('.', '/')}.py:{attribute}"
            ) from None
        except Exception as error:  # noqa: BLE001 - user code
            raise CliError(f"importing {location!r} raised {type(error).__name__}: {_first_line(error)}") from None
    if not hasattr(module, attribute):
        names = _public_callables(module)
        raise CliError(
            f"{location!r} has no attribute {attribute!r}; callables defined there: {', '.join(names) or 'none'}"
        )
    return getattr(module, attribute)


def _import_file(path: Path, spec: str) -> Any:
    name = "_nnmem_model_" + re.sub(r"\W", "_", str(path.resolve().with_suffix("")))
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise CliError(f"cannot load {str(path)!r} as a Python file (from {spec!r})")
    module = importlib.util.module_from_spec(module_spec)
    directory = str(path.resolve().parent)
    sys.path.insert(0, directory)
    try:
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - user code
        sys.modules.pop(name, None)
        raise CliError(f"running {str(path)!r} raised {type(error).__name__}: {_first_line(error)}") from None
    finally:
        if directory in sys.path:
            sys.path.remove(directory)
    return module


def _public_callables(module: Any) -> list[str]:
    return sorted(
        name for name, value in vars(module).items()
        if callable(value) and not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
    )


def _callables_in_file(path: str) -> str:
    import ast

    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError):
        return "unknown"
    names = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
             and not node.name.startswith("_")]
    return ", ".join(names) or "none"


def build_model(spec: str, model_args: dict[str, Any] | None = None, *, factory: Any = None) -> Any:
    """Loads ``spec`` (unless ``factory`` is given) and calls the factory; returns the ``torch.nn.Module``.

    Raises:
        CliError: If the factory raises or returns something else than a module.
    """
    if factory is None:
        factory = load_factory(spec)
    import torch

    if isinstance(factory, torch.nn.Module):
        if model_args:
            raise CliError(f"{spec!r} is a module instance, not a factory; --model-arg cannot be applied")
        return factory
    if not callable(factory):
        raise CliError(f"{spec!r} is a {type(factory).__name__}, not a callable; point MODEL at a function or class")
    try:
        model = factory(**(model_args or {}))
    except Exception as error:  # noqa: BLE001 - user code
        raise CliError(
            f"the factory {spec!r} raised {type(error).__name__}: {_first_line(error)}; "
            f"check that it runs on its own (and its --model-arg values)"
        ) from None
    if not isinstance(model, torch.nn.Module):
        raise CliError(f"the factory {spec!r} returned a {type(model).__name__}; it must return a torch.nn.Module")
    return model


def make_batch(inputs: Sequence[InputSpec], batch_size: int) -> Any:
    """Meta tensors of the given per-sample shapes (no memory is allocated).

    One unnamed input gives a tensor, several give a tuple (``model(*batch)``),
    named inputs give a dict (``model(**batch)``).
    """
    import torch

    if not inputs:
        raise CliError("give the model's input shape, e.g. --input-shape 3,224,224 (per sample, no batch dimension)")
    named = [spec.name is not None for spec in inputs]
    if any(named) and not all(named):
        raise CliError("name all inputs or none: e.g. -i input_ids=int64:128 -i labels=int64:128")
    tensors = [
        torch.empty((batch_size, *spec.shape), dtype=getattr(torch, spec.dtype), device="meta") for spec in inputs
    ]
    if all(named):
        return {spec.name: tensor for spec, tensor in zip(inputs, tensors)}
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def _real_batch(inputs: Sequence[InputSpec], batch_size: int) -> Any:
    import torch

    tensors = [torch.zeros((batch_size, *spec.shape), dtype=getattr(torch, spec.dtype)) for spec in inputs]
    if inputs and inputs[0].name is not None:
        return {spec.name: tensor for spec, tensor in zip(inputs, tensors)}
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def _check_forward(model: Any, inputs: Sequence[InputSpec]) -> None:
    """Runs the model once on a real batch of 2; a failure is a shape mistake."""
    import torch

    if any(t.is_meta for t in list(model.parameters())[:1]):
        return
    batch = _real_batch(inputs, 2)
    try:
        with torch.no_grad():
            if isinstance(batch, dict):
                model(**batch)
            elif isinstance(batch, tuple):
                model(*batch)
            else:
                model(batch)
    except Exception as error:  # noqa: BLE001 - user code
        shapes = ", ".join(_describe_input(spec) for spec in inputs)
        raise CliError(
            f"the model cannot run on inputs of per-sample shape {shapes}: {type(error).__name__}: "
            f"{_first_line(error)}; fix --input-shape (per-sample dimensions, without the batch dimension)"
        ) from None


def _describe_input(spec: InputSpec) -> str:
    text = f"{spec.dtype}{list(spec.shape)}"
    return f"{spec.name}={text}" if spec.name else text


# =============================================================================
# Computing
# =============================================================================
def run_estimate(args: argparse.Namespace, target: Target) -> MemoryEstimate:
    """Builds the model and batch from ``args`` and calls the estimator."""
    spec = args.model
    if spec.endswith((".keras", ".h5")):
        return _keras_estimate(spec, args, target)
    _require("torch", "nnmem estimate needs PyTorch for factory models: pip install 'nnmem_callbacks[torch]'")
    factory = load_factory(spec)
    inputs = [parse_input_shape(text) for text in (args.input_shape or [])]
    if not inputs:
        raise CliError("give the model's input shape, e.g. --input-shape 3,224,224 (per sample, no batch dimension)")
    precision = _checked(napkin.check_precision, args.precision, "--precision")
    model = build_model(spec, parse_model_args(args.model_arg), factory=factory)
    batch = make_batch(inputs, args.batch_size)
    from nnmem_callbacks import estimate_training

    import logging
    import warnings

    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            estimate = estimate_training(
                model, batch, optimizer=args.optimizer, precision=precision, device=target.device
            )
    except ValueError as error:
        raise CliError(str(error)) from None
    finally:
        quiet.setLevel(level)
    if estimate.method != "trace":
        _check_forward(model, inputs)
    return estimate


def _keras_estimate(spec: str, args: argparse.Namespace, target: Target) -> MemoryEstimate:
    if not os.path.isfile(spec):
        raise CliError(f"Keras model file {spec!r} not found")
    try:
        from nnmem_callbacks.keras import estimate_training as keras_estimate  # type: ignore[attr-defined]
    except ImportError:
        raise CliError(
            f"Keras estimation is not available yet in this version of nnmem_callbacks, so {spec!r} cannot be "
            f"estimated; for now use `nnmem calc --params N --activations N` (napkin mode) or a PyTorch factory"
        ) from None
    precision = _checked(napkin.check_precision, args.precision, "--precision")
    if precision != "32-true":
        raise CliError(
            f"a saved Keras model keeps the dtype policy it was saved with, so --precision {precision} cannot be "
            f"applied to {spec!r}; save it under keras.mixed_precision.set_global_policy('mixed_bfloat16') "
            f"(or 'mixed_float16') instead, and drop --precision"
        )
    import keras

    model = keras.models.load_model(spec)
    if args.optimizer != "adam" or getattr(model, "optimizer", None) is None:
        model.compile(optimizer=_keras_optimizer(keras, args.optimizer), loss=getattr(model, "loss", None) or "mse")
    if getattr(model, "loss", None) is None:
        raise CliError(f"the Keras model in {spec!r} was saved without a loss; compile it with a loss and save it again")
    return keras_estimate(model, batch_size=args.batch_size)


def _keras_optimizer(keras: Any, name: str) -> Any:
    """A Keras optimizer for an ``--optimizer`` name (the same names as for PyTorch)."""
    key = name.lower()
    if key in ("sgd_momentum", "momentum"):
        return keras.optimizers.SGD(momentum=0.9)
    try:
        return keras.optimizers.get(key)
    except ValueError:
        raise CliError(
            f"unknown optimizer {name!r} for a Keras model; use sgd, sgd_momentum, adam, adamw, adagrad, rmsprop, "
            f"adamax, adadelta or nadam"
        ) from None


def napkin_from_args(args: argparse.Namespace, device: str = "cuda") -> MemoryEstimate:
    """Picks the napkin mode from the ``calc`` options and computes the estimate.

    Raises:
        CliError: When the options fit no mode, naming what each mode needs.
    """
    common = dict(optimizer=args.optimizer, precision=args.precision, device=device)
    layers = args.layers
    try:
        if args.hidden is not None:
            missing = [flag for flag, value in (("--layers", layers), ("--heads", args.heads),
                                                ("--seq-len", args.seq_len)) if value is None]
            if missing:
                raise CliError(f"transformer mode (--hidden) also needs {', '.join(missing)}; e.g. "
                               f"--layers 12 --hidden 768 --heads 12 --seq-len 128 --vocab 30522")
            if not layers.strip().isdigit():
                raise CliError(f"--layers {layers!r}: with --hidden, give the number of transformer layers, e.g. --layers 12")
            return napkin.transformer_estimate(
                layers=int(layers), hidden=args.hidden, heads=args.heads, seq_len=args.seq_len,
                batch_size=args.batch_size, vocab=args.vocab, ffn=args.ffn, params=args.params,
                arch=args.arch, max_positions=args.max_positions, recompute=args.recompute,
                attention=args.attention, activation=args.activation, dropout=not args.no_dropout, **common,
            )
        if layers is not None:
            try:
                widths = [parse_count(part) for part in layers.split(",") if part.strip()]
            except ValueError:
                raise CliError(f"--layers {layers!r}: write MLP widths from input to output, e.g. 1000,100,100,10") from None
            if len(widths) < 2:
                raise CliError(
                    f"--layers {layers!r}: an MLP needs at least two widths (input,output), e.g. 1000,100,10; "
                    f"for a transformer add --hidden, --heads and --seq-len"
                )
            return napkin.mlp_estimate(widths, args.batch_size, **common)
        if args.params is not None and args.activations is not None:
            return napkin.params_estimate(args.params, args.activations, args.batch_size,
                                          input_size=args.input_size, **common)
    except ValueError as error:
        raise CliError(str(error)) from None
    raise CliError(
        "nnmem calc needs one of: transformer (--layers L --hidden H --heads A --seq-len S [--vocab V]), "
        "MLP (--layers 1000,100,10) or counts (--params N --activations N); see `nnmem calc --help`"
    )


@dataclasses.dataclass(frozen=True)
class GpuFit:
    """How an estimate fits one GPU."""

    name: str
    memory_bytes: int
    max_batch_size: int
    fits: bool


@dataclasses.dataclass(frozen=True)
class FitSummary:
    """The estimate compared with the target's budget and with the GPU table."""

    target: Target
    budget_bytes: int | None
    compared: str  # "device" (reserve + overhead) or "peak"
    predicted_bytes: int
    max_batch_size: int | None
    fits: bool | None
    gpus: tuple[GpuFit, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": {
                "device": self.target.device,
                "gpu": self.target.gpu.name if self.target.gpu else None,
                "capacity_bytes": self.target.capacity_bytes,
                "free_bytes": self.target.free_bytes,
            },
            "budget_bytes": self.budget_bytes,
            "compared": self.compared,
            "predicted_bytes": self.predicted_bytes,
            "max_batch_size": self.max_batch_size,
            "fits": self.fits,
            "gpus": [dataclasses.asdict(row) for row in self.gpus],
        }


def fit_summary(estimate: MemoryEstimate, target: Target, budget_bytes: int | None) -> FitSummary:
    """Compares ``estimate`` with the budget and, without a named GPU, with every GPU.

    On CUDA the device bytes (allocator reserve plus context) are compared,
    on CPU the tensor peak.

    Example:
        >>> est = napkin.params_estimate(1_000_000, 100_000, 32, optimizer="sgd")
        >>> t4 = resolve_target("t4")
        >>> fit = fit_summary(est, t4, resolve_budget_bytes(None, t4))
        >>> fit.max_batch_size > 32, fit.fits, fit.gpus
        (True, True, ())
    """
    include_reserve = target.is_cuda
    predicted = estimate.device_bytes if include_reserve else estimate.peak_bytes
    max_batch = fits = None
    if budget_bytes is not None:
        max_batch = estimate.max_batch_size(budget_bytes, include_reserve=include_reserve)
        fits = predicted <= budget_bytes
    rows: tuple[GpuFit, ...] = ()
    if target.is_cuda and target.gpu is None and target.capacity_bytes is None:
        rows = tuple(
            GpuFit(gpu.name, gpu.memory_bytes, estimate.max_batch_size(gpu.memory_bytes, include_reserve=True),
                   estimate.device_bytes <= gpu.memory_bytes)
            for gpu in sorted(gpu_table.GPUS, key=lambda g: g.memory_bytes)
        )
    return FitSummary(target, budget_bytes, "device" if include_reserve else "peak", predicted, max_batch, fits, rows)


# =============================================================================
# Formatting
# =============================================================================
def estimate_to_json(estimate: MemoryEstimate, fit: FitSummary, **extra: Any) -> str:
    """The estimate and the fit as one JSON document (bytes as integers)."""
    document = estimate.to_dict()
    document["fit"] = fit.to_dict()
    document.update(extra)
    return json.dumps(document, indent=2, default=str)


def _console(file: Any = None) -> Any:
    from rich.console import Console

    return Console(file=file or sys.stdout, highlight=False, width=None if (file or sys.stdout).isatty() else 110)


def _batch_text(batch_size: int | None) -> str:
    """A batch size for the tables; the search's upper bound reads as "at least".

    Example:
        >>> _batch_text(1 << 24), _batch_text(12), _batch_text(0)
        ('>= 16,777,216', '12', '0 (not even 1)')
    """
    from nnmem_callbacks.estimate import MAX_BATCH_SEARCH_LIMIT

    if batch_size is None:
        return "-"
    if batch_size >= MAX_BATCH_SEARCH_LIMIT:
        return f">= {MAX_BATCH_SEARCH_LIMIT:,}"
    if batch_size == 0:
        return "0 (not even 1)"
    return str(batch_size)


def render_estimate(
    estimate: MemoryEstimate, fit: FitSummary, *, title: str, why: Sequence[str] = (), console: Any = None
) -> None:
    """Prints the breakdown, device figures, fits and notes as rich tables."""
    from rich.table import Table

    console = console or _console()
    console.print(f"[bold]{title}[/bold]")
    table = Table()
    table.add_column("category")
    table.add_column("size", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("share", justify="right")
    for name, value, share in breakdown_rows(estimate):
        table.add_row(name, format_bytes(value), f"{value:,}", f"{share:.1%}")
    table.add_section()
    table.add_row("[bold]peak (tensors)[/bold]", f"[bold]{format_bytes(estimate.peak_bytes)}[/bold]",
                  f"{estimate.peak_bytes:,}", "100.0%")
    if estimate.reserved_bytes is not None:
        table.add_row("allocator reserve", format_bytes(estimate.reserved_bytes), f"{estimate.reserved_bytes:,}", "")
    if estimate.overhead_bytes:
        table.add_row("CUDA context + cuBLAS", format_bytes(estimate.overhead_bytes), f"{estimate.overhead_bytes:,}", "")
    if estimate.reserved_bytes is not None or estimate.overhead_bytes:
        table.add_row("[bold]device total[/bold]", f"[bold]{format_bytes(estimate.device_bytes)}[/bold]",
                      f"{estimate.device_bytes:,}", "")
    console.print(table)
    console.print(
        f"peak phase {estimate.peak_phase}: {format_bytes(estimate.fixed_bytes)} fixed + "
        f"{format_bytes(estimate.per_sample_bytes)} per sample; method {estimate.method}"
    )
    if fit.budget_bytes is not None:
        where = fit.target.gpu.name if fit.target.gpu else fit.target.label
        what = "device total" if fit.compared == "device" else "peak"
        verdict = "fits" if fit.fits else "does NOT fit"
        console.print(
            f"budget {format_bytes(fit.budget_bytes)} ({where}): batch {estimate.batch_size} {verdict} "
            f"({what} {format_bytes(fit.predicted_bytes)}); largest batch that fits: "
            f"[bold]{_batch_text(fit.max_batch_size)}[/bold]"
        )
    if fit.gpus:
        gpu_rows = Table(title="Which GPU fits (device total vs memory)", title_justify="left")
        gpu_rows.add_column("GPU")
        gpu_rows.add_column("memory", justify="right")
        gpu_rows.add_column(f"batch {estimate.batch_size}", justify="center")
        gpu_rows.add_column("max batch", justify="right")
        for row in fit.gpus:
            gpu_rows.add_row(row.name, format_bytes(row.memory_bytes), "yes" if row.fits else "no",
                             _batch_text(row.max_batch_size))
        console.print(gpu_rows)
    for line in why:
        console.print(line)
    for note in estimate.notes:
        console.print(f"[dim]note: {note}[/dim]")


def plot_estimate(estimate: MemoryEstimate, fit: FitSummary, path: str, *, title: str = "") -> str:
    """Draws the breakdown and the peak against the batch size (with the budget) to ``path``.

    Returns:
        The path written.
    """
    try:
        import matplotlib
    except ImportError:
        raise CliError("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nnmem_callbacks.units import GiB, MiB

    scale, unit = (GiB, "GiB") if estimate.peak_bytes >= GiB else (MiB, "MiB")
    rows = breakdown_rows(estimate)
    top = max(2 * estimate.batch_size, int((fit.max_batch_size or 0) * 1.25), 8)
    sizes = sorted({max(1, round(top * i / 60)) for i in range(61)})
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.barh([name for name, _, _ in rows], [value / scale for _, value, _ in rows], color="tab:blue")
    left.invert_yaxis()
    left.set_xlabel(unit)
    left.set_title(f"breakdown at batch {estimate.batch_size} (peak {format_bytes(estimate.peak_bytes)})")
    right.plot(sizes, [estimate.peak_bytes_at(n) / scale for n in sizes], label="peak (tensors)")
    if estimate.reserved_bytes is not None or estimate.overhead_bytes:
        right.plot(sizes, [estimate.device_bytes_at(n) / scale for n in sizes], label="device total", linestyle="--")
    if fit.budget_bytes is not None:
        right.axhline(fit.budget_bytes / scale, color="tab:red", label=f"budget {format_bytes(fit.budget_bytes)}")
        if fit.max_batch_size:
            right.axvline(fit.max_batch_size, color="tab:red", linestyle=":", label=f"max batch {fit.max_batch_size}")
    right.axvline(estimate.batch_size, color="gray", linestyle=":", label=f"batch {estimate.batch_size}")
    right.set_xlabel("batch size")
    right.set_ylabel(unit)
    right.set_title("peak against batch size")
    right.legend(loc="upper left")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=110)
    except OSError as error:
        raise CliError(f"--plot: cannot write {path!r}: {error.strerror or error}") from None
    finally:
        plt.close(figure)
    return path


def _emit(estimate: MemoryEstimate, fit: FitSummary, args: argparse.Namespace, *, title: str,
          why: Sequence[str] = (), **json_extra: Any) -> None:
    if args.plot:
        plot_estimate(estimate, fit, args.plot, title=title)
    if args.json:
        if why:
            json_extra["why"] = list(why)
        if args.plot:
            json_extra["plot"] = args.plot
        print(estimate_to_json(estimate, fit, **json_extra))
        return
    render_estimate(estimate, fit, title=title, why=why)
    if args.plot:
        print(f"plot written to {args.plot}")


# =============================================================================
# Commands
# =============================================================================
def estimate_command(args: argparse.Namespace) -> int:
    """``nnmem estimate``: trace a model's training step."""
    target = resolve_target(args.device)
    budget = resolve_budget_bytes(args.budget, target)
    estimate = run_estimate(args, target)
    fit = fit_summary(estimate, target, budget)
    title = (f"nnmem estimate {args.model}: batch {estimate.batch_size}, {estimate.precision}, "
             f"{args.optimizer}, target {target.label}")
    _emit(estimate, fit, args, title=title, model=args.model, inputs=list(args.input_shape or []),
          optimizer=args.optimizer)
    return 0


def calc_command(args: argparse.Namespace) -> int:
    """``nnmem calc``: napkin estimate from numbers."""
    target = resolve_target(args.device)
    budget = resolve_budget_bytes(args.budget, target)
    device = "cpu" if target.device == "cpu" else "cuda"
    estimate = napkin_from_args(args, device=device)
    fit = fit_summary(estimate, target, budget)
    why = napkin.explain(estimate)
    title = (f"nnmem calc ({estimate.method}): batch {estimate.batch_size}, {estimate.precision}, "
             f"{estimate.extra['napkin']['optimizer']}, target {target.label}")
    _emit(estimate, fit, args, title=title, why=why)
    return 0


def gpus_command(args: argparse.Namespace) -> int:
    """``nnmem gpus``: print the built-in GPU table."""
    if args.json:
        print(json.dumps([{"name": g.name, "nominal_gb": g.nominal_gb, "memory_bytes": g.memory_bytes}
                          for g in gpu_table.GPUS], indent=2))
        return 0
    from rich.table import Table

    table = Table(title="Built-in GPUs (--device NAME); memory as nvidia-smi reports it", title_justify="left")
    table.add_column("GPU")
    table.add_column("on the box", justify="right")
    table.add_column("memory", justify="right")
    table.add_column("bytes", justify="right")
    for gpu in gpu_table.GPUS:
        table.add_row(gpu.name, f"{gpu.nominal_gb} GB", format_bytes(gpu.memory_bytes), f"{gpu.memory_bytes:,}")
    _console().print(table)
    return 0


def demo_command(args: argparse.Namespace) -> int:
    """``nnmem demo``: run examples/lightning_quickstart.py in a subprocess."""
    script = find_quickstart()
    if script is None:
        raise CliError(
            "examples/lightning_quickstart.py not found; `nnmem demo` runs it from a source checkout of "
            "nnmem_callbacks (run nnmem from the repository root)"
        )
    if importlib.util.find_spec("pytorch_lightning") is None and importlib.util.find_spec("lightning") is None:
        raise CliError("the demo needs PyTorch Lightning: pip install 'nnmem_callbacks[lightning]'")
    extra = list(args.args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return subprocess.call([sys.executable, str(script), *extra])


def find_quickstart() -> Path | None:
    """``examples/lightning_quickstart.py`` next to the package or below the working directory."""
    for root in (Path(__file__).resolve().parent.parent, Path.cwd()):
        candidate = root / "examples" / "lightning_quickstart.py"
        if candidate.is_file():
            return candidate
    return None


# =============================================================================
# Entry point
# =============================================================================
def _checked(check: Any, value: Any, flag: str) -> Any:
    try:
        return check(value)
    except ValueError as error:
        raise CliError(f"{flag}: {error}") from None


def _require(module: str, message: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise CliError(message)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else ""


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``nnmem``; returns the exit code (0 ok, 1 internal failure, 2 usage error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except CliError as error:
        if getattr(args, "debug", False):
            raise
        print(f"nnmem {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # noqa: BLE001 - the last line of defence
        if getattr(args, "debug", False):
            raise
        print(
            f"nnmem {args.command}: internal error: {type(error).__name__}: {_first_line(error)} "
            f"(rerun with --debug for the traceback, and please report it)",
            file=sys.stderr,
        )
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
