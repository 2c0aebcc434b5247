"""``benchmarks/suites/largest_batch.py`` without a GPU: the dry run end to end, the refusal, the worker and the table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # benchmarks/ is not an installed package
    sys.path.insert(0, str(_ROOT))

from benchmarks.suites import largest_batch  # noqa: E402


def test_dry_run_estimates_verifies_and_writes_the_table(tmp_path):
    code = largest_batch.main(
        [
            "--models",
            "mlp",
            "--batch-size",
            "512",
            "--cap-gib",
            "0.25",
            "--dry-run",
            "--out-dir",
            str(tmp_path),
            "--stem",
            "lb",
        ]
    )
    assert code == 0
    document = json.loads((tmp_path / "lb.json").read_text())
    (row,) = document["rows"]
    assert document["meta"]["dry_run"] and row["gpu"] == "dry run"
    assert row["reserve_model"] == "replay"  # the allocator log was paired and replayed
    assert row["verified"] and 1 <= row["chosen"] <= row["lines_batch"]
    check = row["verification"]["checks"][-1]
    assert check["batch_size"] == row["chosen"] and check["fits"]
    # the direct estimate at the chosen batch fits the cap (plus the CUDA context, which is outside it)
    assert check["traced_bytes"] <= row["verification"]["budget_bytes"]
    table = (tmp_path / "lb.md").read_text()
    assert "| mlp |" in table and "dry run" in table


def test_without_a_gpu_it_refuses_and_names_the_dry_run(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert largest_batch.main(["--models", "mlp", "--out-dir", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err and "--dry-run" in largest_batch.__doc__
    assert not list(tmp_path.iterdir())


def test_bad_arguments_are_named(capsys):
    assert largest_batch.main(["--models", "no_such_model", "--dry-run"]) == 2
    assert "valid:" in capsys.readouterr().err


def test_train_worker_runs_in_a_fresh_process_and_reports():
    record = largest_batch._run_worker(
        "train",
        {
            "case_name": "mlp",
            "batch_size": 4,
            "cap_bytes": None,
            "optimizer": "sgd_momentum",
            "precision": "32-true",
            "device": "cpu",
        },
    )
    assert record == {"batch": 4, "oom": False}


def test_table_counts_safe_and_tight_runs():
    def row(name, run_oom, above_oom):
        return {
            "model": name,
            "lines_batch": 100,
            "chosen": 90,
            "verified": True,
            "seconds": 2.0,
            "run": {"oom": run_oom, "reserved_share_of_cap": 0.95},
            "run_above": {"oom": above_oom},
            "finder": {"chosen": 120, "seconds": 10.0, "run": {"oom": False, "reserved_share_of_cap": 0.997}},
        }

    meta = {
        "device": "GPU",
        "cap_gib": 12,
        "batch_size": 256,
        "optimizer": "sgd_momentum",
        "precision": "32-true",
        "torch": "x",
        "command": "c",
        "date": "d",
    }
    table = largest_batch.to_markdown([row("a", False, True), row("b", False, False), row("c", True, True)], meta)
    assert "Safe: 2 of 3 models" in table and "ran out of memory for 2 of 3" in table
    assert "ok, 95.0% of cap" in table and "ok, 99.7% of cap" in table and "| OOM |" in table


def test_batch_size_finder_wiring_on_cpu():
    pytest.importorskip("lightning")
    # nothing runs out of memory on CPU: binsearch doubles up to max_val, then Lightning's 5% margin applies
    record = largest_batch.batch_size_finder("mlp", None, "sgd_momentum", "32-true", device="cpu", max_val=16)
    assert record["chosen"] == int(16 * 0.95) and record["seconds"] > 0 and record["lightning"]
