"""``nnmem demo``: runs the Lightning quickstart (``examples/lightning_quickstart.py``, installed with the package as
``nnmem_callbacks.examples.lightning_quickstart``) in a subprocess, from any folder."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

from nnmem_callbacks.cli.errors import CliError

__all__ = ["demo_command", "find_quickstart"]


def demo_command(args: argparse.Namespace) -> int:
    """``nnmem demo``: run examples/lightning_quickstart.py in a subprocess."""
    script = find_quickstart()
    if script is None:
        raise CliError(
            "examples/lightning_quickstart.py not found: the package is installed without its examples "
            "(nnmem_callbacks.examples); reinstall it (pip install 'nnmem_callbacks[lightning]')"
        )
    if importlib.util.find_spec("pytorch_lightning") is None and importlib.util.find_spec("lightning") is None:
        raise CliError("the demo needs PyTorch Lightning: pip install 'nnmem_callbacks[lightning]'")
    extra = list(args.args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return subprocess.call([sys.executable, str(script), *extra])


def find_quickstart() -> Path | None:
    """The installed quickstart's file (``nnmem_callbacks.examples.lightning_quickstart``), wherever nnmem runs.

    Example:
        >>> find_quickstart().name
        'lightning_quickstart.py'
    """
    try:
        spec = importlib.util.find_spec("nnmem_callbacks.examples.lightning_quickstart")
    except ModuleNotFoundError:  # installed without its examples
        return None
    if spec is None or spec.origin is None or not Path(spec.origin).is_file():
        return None
    return Path(spec.origin)
