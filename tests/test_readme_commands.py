"""The README's two commands, as written: what the main job installs, and that its Python part runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def two_commands() -> tuple[str, str]:
    section = README.split("## The two commands", 1)[1]
    commands = re.findall(r"```bash\n(python3 -m venv .*?)\n```", section)
    main_job = next(c for c in commands if "quickstart" in c)
    tests = next(c for c in commands if "pytest" in c)
    return main_job, tests


def extras_closure(extra: str) -> list[str]:
    """Every requirement an extra of this project pulls in, following self-references."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    seen, pending, requirements = set(), [extra], list(project["dependencies"])
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in optional[name]:
            nested = re.match(r"nnmem_callbacks\[(.*)\]", requirement)
            if nested:
                pending.extend(part.strip() for part in nested.group(1).split(","))
            else:
                requirements.append(requirement)
    return requirements


def test_the_main_job_installs_no_tensorflow():
    main_job, _ = two_commands()
    (extras,) = re.findall(r'-e "\.\[(.*?)\]"', main_job)
    requirements = [r for extra in extras.split(",") for r in extras_closure(extra.strip())]
    names = {re.split(r"[<>=!;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}
    assert not {n for n in names if n.startswith("tensorflow") or n in ("keras", "jax")}, names
    assert {"torch", "pytorch-lightning", "tensorboard"} <= names  # what the quickstart does need


def test_ci_runs_the_test_command_as_written():
    _, tests = two_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    install = re.search(r'pip install -c \.ci/constraints\.txt -e "\.\[(.*?)\]"', tests).group(1)
    assert f'-e ".[{install}]"' in ci and "python -m pytest" in ci


@pytest.mark.slow
def test_the_main_jobs_python_part_runs_as_written(tmp_path):
    main_job, _ = two_commands()
    python_part = main_job.rsplit("&& ", 1)[1]
    assert python_part.startswith("python examples/")
    argv = [sys.executable, *python_part.split()[1:]]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "predicted tensor peak" in done.stdout and "epoch 0" in done.stdout


def section(title: str) -> str:
    """The README section under ``## title``, up to the next one."""
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize(
    "extras, backend",
    [("tensorflow", "tensorflow"), ("jax", "jax"), ("torch,keras", "torch")],
)
def test_the_keras_install_lines_pull_keras_and_their_backend(extras, backend):
    keras = section("Keras")
    assert f'".[{extras}]"' in keras  # the install line the section gives for this backend
    requirements = [r for extra in extras.split(",") for r in extras_closure(extra)]
    names = {re.split(r"[<>=!;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}
    assert "keras" in names and any(name.startswith(backend) for name in names), names


def test_the_nnmem_commands_run_as_written(capsys):
    from nnmem_callbacks import cli

    block = re.search(r"```bash\n(nnmem .*?)```", section("The nnmem command"), flags=re.S).group(1)
    commands = [line.split("#")[0].split() for line in block.strip().splitlines()]
    assert [c[:2] for c in commands] == [["nnmem", "estimate"], ["nnmem", "calc"], ["nnmem", "gpus"]]
    for command in commands:
        assert cli.main(command[1:]) == 0, command
        assert "Traceback" not in capsys.readouterr().out


# The Keras quickstart's README line runs in tests/test_keras_quickstart.py, once per oneDNN mode.


@pytest.mark.slow
def test_the_trainer_quickstart_runs_as_written(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    section_text = section("Hugging Face Trainer")
    assert 'pip install -e ".[transformers]"' in section_text
    command = re.search(r"`(python examples/transformers_quickstart\.py)`", section_text).group(1)
    argv = [sys.executable, *command.split()[1:], "--output-dir", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "predicted" in done.stdout and "measured" in done.stdout
