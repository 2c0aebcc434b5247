"""The README's minimal example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_minimal_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(block for block in blocks if "estimate_training(" in block and "import torch" in block)
    exec(compile(example, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4
    assert printed[0].split()[-1].startswith("step")  # "<size> <phase>"
    assert int(printed[2]) > 0 and int(printed[3]) > 256
