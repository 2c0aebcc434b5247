"""The commit stamp every benchmark result carries (benchmarks/tools/provenance.py), on a throwaway repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.tools.provenance import changed_files, commit_stamp, file_commit, head_commit


def _git(root: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false", *args]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    try:
        _git(tmp_path, "init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not available")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "code.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results" / "run.json").write_text("{}\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_a_clean_tree_is_stamped_with_its_commit(repo: Path) -> None:
    head = _git(repo, "rev-parse", "--short", "HEAD")
    assert head_commit(repo) == head
    assert commit_stamp(root=repo) == head
    assert changed_files(root=repo) == []


def test_rewritten_results_do_not_mark_the_code_changed(repo: Path) -> None:
    (repo / "benchmarks" / "results" / "run.json").write_text('{"rewritten": true}\n')
    assert commit_stamp(root=repo) == head_commit(repo)
    assert file_commit("benchmarks/results/run.json", root=repo).endswith(" +changes")


def test_changed_code_is_marked_and_listed_by_path(repo: Path) -> None:
    (repo / "pkg" / "code.py").write_text("x = 2\n")
    assert commit_stamp(root=repo) == f"{head_commit(repo)} +changes"
    assert changed_files(root=repo) == ["pkg/code.py"]  # the whole path, first letter included
    assert changed_files("benchmarks", root=repo) == []
    assert commit_stamp("benchmarks", root=repo) == head_commit(repo)


def test_a_result_names_the_commit_that_last_wrote_it(repo: Path) -> None:
    first = head_commit(repo)
    (repo / "pkg" / "code.py").write_text("x = 3\n")
    _git(repo, "commit", "-q", "-am", "second")
    assert head_commit(repo) != first
    assert file_commit("benchmarks/results/run.json", root=repo) == first
    assert file_commit("benchmarks/results/never.json", root=repo) == "uncommitted"


def test_outside_git_the_stamp_says_unknown(tmp_path: Path) -> None:
    assert commit_stamp(root=tmp_path) == "unknown"
    assert head_commit(tmp_path) is None
    assert changed_files(root=tmp_path) == []
    assert file_commit("x.json", root=tmp_path) == "unknown"
