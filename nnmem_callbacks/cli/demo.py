"""``nnmem demo``: runs ``examples/lightning_quickstart.py`` in a subprocess."""

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


