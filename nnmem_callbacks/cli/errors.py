"""What every part of the ``nnmem`` command shares: the user-error type, exit codes, small helpers."""

from __future__ import annotations

import importlib.util
from typing import Any

from nnmem_callbacks.core.formatting import first_line

__all__ = [
    "checked_value",
    "CliError",
    "EXIT_DOES_NOT_FIT",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "first_line",
    "require_module",
]

#: Exit status of a run that worked (and, with a budget or device named, whose batch fits).
EXIT_OK = 0
#: Exit status of an internal failure (a bug: please report it).
EXIT_FAILURE = 1
#: Exit status of a usage error: a bad option, model spec or input shape.
EXIT_USAGE = 2
#: Exit status when a budget or a device was named and the batch is predicted not to fit.
EXIT_DOES_NOT_FIT = 3


class CliError(Exception):
    """A user mistake: printed as one short message, exit code 2, no traceback."""


def checked_value(check: Any, value: Any, flag: str) -> Any:
    try:
        return check(value)
    except ValueError as error:
        raise CliError(f"{flag}: {error}") from None


def require_module(module: str, message: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise CliError(message)
