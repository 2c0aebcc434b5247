"""The ``nnmem`` command: predict training memory from a model or from bare numbers.

Subcommands:

* ``nnmem estimate MODEL``: trace one training step of a model built by a
  factory (``package.module:factory`` or ``path/to/file.py:factory``) or a
  saved Keras model, and print the peak, its breakdown, the allocator reserve,
  the CUDA overhead and the largest batch that fits a GPU or a budget.
* ``nnmem calc``: the same table from bare numbers (napkin formulas in
  :mod:`nnmem_callbacks.estimators.napkin`), with a short "why".
* ``nnmem gpus``: the built-in GPU table.
* ``nnmem demo``: runs ``examples/lightning_quickstart.py``.

The package is split by what each part does, as accelerate's
``commands/estimate.py`` separates gathering, computing and formatting:

* :mod:`~nnmem_callbacks.cli.parsers`: argparse parsers (each works standalone
  or as a subcommand);
* :mod:`~nnmem_callbacks.cli.values`: option values (counts, input shapes);
* :mod:`~nnmem_callbacks.cli.targets`: gathering the device and the budget
  (budget semantics are :func:`nnmem_callbacks.core.plan.resolve_budget`'s);
* :mod:`~nnmem_callbacks.cli.models`: gathering the model and its batch;
* :mod:`~nnmem_callbacks.cli.compute`: the estimators and the fit
  (:func:`nnmem_callbacks.core.plan.make_plan`);
* :mod:`~nnmem_callbacks.cli.render` and :mod:`~nnmem_callbacks.cli.plots`:
  tables, JSON and figures;
* :mod:`~nnmem_callbacks.cli.commands` and :mod:`~nnmem_callbacks.cli.demo`:
  the commands.

Exit status: 0 ok; 1 internal error; 2 usage error; 3 a budget or a device was
named (``--budget``/``--device``) and the batch is predicted not to fit.

Importing this package does not import torch; the estimators are imported
when a command needs them.

Example:
    >>> parser = calc_command_parser()
    >>> args = parser.parse_args(["--layers", "1000,100,10", "--batch-size", "4", "--optimizer", "sgd"])
    >>> est = napkin_from_args(args)
    >>> est.method, est.batch_size
    ('napkin:mlp', 4)
"""

from __future__ import annotations

import os
import re
import sys
from typing import Sequence

from nnmem_callbacks.cli.compute import FitSummary, GpuFit, fit_summary, napkin_from_args, run_estimate
from nnmem_callbacks.cli.demo import find_quickstart
from nnmem_callbacks.cli.errors import EXIT_DOES_NOT_FIT, EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CliError, first_line
from nnmem_callbacks.cli.models import build_model, load_factory, make_batch
from nnmem_callbacks.cli.parsers import (
    build_parser,
    calc_command_parser,
    demo_command_parser,
    estimate_command_parser,
    gpus_command_parser,
)
from nnmem_callbacks.cli.plots import plot_estimate
from nnmem_callbacks.cli.render import estimate_to_json, render_estimate
from nnmem_callbacks.cli.targets import Target, resolve_budget_bytes, resolve_target
from nnmem_callbacks.cli.values import InputSpec, parse_count, parse_input_shape, parse_model_args

__all__ = [
    "EXIT_DOES_NOT_FIT",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "FitSummary",
    "GpuFit",
    "InputSpec",
    "Target",
    "build_model",
    "build_parser",
    "calc_command_parser",
    "demo_command_parser",
    "estimate_command_parser",
    "estimate_to_json",
    "find_quickstart",
    "fit_summary",
    "gpus_command_parser",
    "load_factory",
    "main",
    "make_batch",
    "napkin_from_args",
    "parse_count",
    "parse_input_shape",
    "parse_model_args",
    "plot_estimate",
    "render_estimate",
    "resolve_budget_bytes",
    "resolve_target",
    "run_estimate",
]


def _join_negative_values(argv: Sequence[str]) -> list[str]:
    """``--budget -1GiB`` as ``--budget=-1GiB``: argparse reads a value that starts with a dash and is not a plain
    number (``-5,10``, ``-1GiB``) as an option and says only "expected one argument"; joined, the value reaches its
    own check, which names what was wrong and what is valid.

    Example:
        >>> _join_negative_values(["calc", "--layers", "-5,10", "-b", "-3", "--budget", "-1GiB", "--json"])
        ['calc', '--layers=-5,10', '-b', '-3', '--budget=-1GiB', '--json']
    """
    joined: list[str] = []
    for token in argv:
        previous = joined[-1] if joined else ""
        if previous.startswith("--") and "=" not in previous and _NEGATIVE_VALUE.match(token):
            joined[-1] = f"{previous}={token}"
        else:
            joined.append(token)
    return joined


#: A value that starts like a negative number but is not one argparse takes as a value (``-5``, ``-0.5`` are).
_NEGATIVE_VALUE = re.compile(r"^-\.?\d(?!\d*$)(?!\d*\.\d+$)")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``nnmem``; returns the exit status (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(_join_negative_values(sys.argv[1:] if argv is None else argv))
    if getattr(args, "func", None) is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe is reported here, not at interpreter exit
        return code
    except CliError as error:
        if getattr(args, "debug", False):
            raise
        print(f"nnmem {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`nnmem gpus --json | head`): not an error; silence the flush at exit
        _silence_stdout()
        return EXIT_OK
    except Exception as error:  # noqa: BLE001 - the last line of defence
        if getattr(args, "debug", False):
            raise
        if type(error).__name__ == "UnsupportedKernelError":
            # a kernel the device cannot run (a bf16 LSTM on a CPU without bf16 kernels): no bug; the message
            # names the op and the way out, and the real training step would fail the same way
            print(f"nnmem {args.command}: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        print(
            f"nnmem {args.command}: internal error: {type(error).__name__}: {first_line(error)} "
            f"(rerun with --debug for the traceback, and please report it)",
            file=sys.stderr,
        )
        return EXIT_FAILURE


def _silence_stdout() -> None:
    """Points stdout at devnull, as the Python docs advise after a BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # pragma: no cover - stdout without a descriptor
        pass
