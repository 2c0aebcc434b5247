"""The Keras quickstart as the README writes it, in this process's oneDNN mode (CI runs this file with 0 and with 1).

The first run on a host: the kernel probes and every step check run (the cache is the test session's own).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")
pytestmark = pytest.mark.keras

ROOT = Path(__file__).resolve().parents[1]


def readme_command() -> list[str]:
    """The README's Keras command: ``KERAS_BACKEND=tensorflow python examples/keras_quickstart.py``."""
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"```bash\n(KERAS_BACKEND=tensorflow python examples/keras_quickstart\.py)[ \n]", readme)
    assert line is not None, "the README's Keras section lost its quickstart command"
    return line.group(1).split()


@pytest.mark.slow
def test_the_keras_quickstart_prints_a_plan_and_both_figures_in_this_mode():
    """The quickstart as a user runs it, in this process's oneDNN mode (CI runs this file with 0 and with 1)."""
    setting, _python, *argv = readme_command()
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    environ.update([setting.split("=", 1)])
    done = subprocess.run(
        [sys.executable, *argv],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    plan = out.split("To fit ", 1)[1].split("\n\n", 1)[0]
    if "largest batch 0;" in plan:  # nothing fits: the code must not suggest a batch size
        assert "# no batch size fits" in plan and "model.fit(" not in plan, plan
    else:
        assert "model.fit(..., batch_size=" in plan, plan
    epochs = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2, out[-2000:]
    for line in epochs:
        assert "predicted" in line and "measured" in line and "measured nan" not in line, line
    if "memory_measured_rss_rise_mib" in epochs[0]:  # the fallback is announced, with the way to the precise figure
        assert "note: MemoryBudgetCallback cannot read" in out and "TF_CPU_ALLOCATOR_USE_BFC=true" in out
    else:
        assert "memory_measured_peak_mib" in epochs[0]
