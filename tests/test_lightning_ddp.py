"""DDP on 2 CPU processes (gloo): every rank estimates, ranks agree on the smallest batch size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("pytorch_lightning")

pytestmark = [pytest.mark.lightning, pytest.mark.slow]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, warnings
    sys.path.insert(0, {tests!r})
    import pytorch_lightning as pl
    from _lightning_models import MLP, DataModule, end_process_groups, trainer_kwargs
    from nnmem_callbacks.lightning import MemoryBudgetCallback

    class Record(pl.Callback):
        sizes = []
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.sizes.append(int(batch[0].shape[0]))

    if __name__ == "__main__":
        rank = int(os.environ.get("LOCAL_RANK", "0"))
        # rank 0 has room for everything; rank 1 must shrink: the ranks have to agree on rank 1's choice
        budget = "1TiB" if rank == 0 else {budget}
        callback = MemoryBudgetCallback(budget=budget, policy="accumulate")
        datamodule = DataModule(batch_size=64)
        record = Record()
        trainer = pl.Trainer(**trainer_kwargs({root!r}, strategy="ddp", devices=2, limit_train_batches=2),
                             callbacks=[callback, record])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(MLP(), datamodule=datamodule)
        with open(os.path.join({root!r}, f"rank{{trainer.global_rank}}.json"), "w") as out:
            json.dump({{
                "batch_size": datamodule.batch_size,
                "accumulate": trainer.accumulate_grad_batches,
                "sizes": record.sizes,
                "fits": callback.plan.fits,
                "max_fit": callback.plan.max_fitting_batch_size,
                "measured": [row["measured_peak_bytes"] for row in callback.measurements],
                "strategy": callback.estimate.extra.get("strategy", {{}}).get("kind"),
                "warnings": [str(w.message) for w in caught if "MemoryBudgetCallback" in str(w.message)],
            }}, out)
        end_process_groups()
    """
)


def test_ddp_ranks_agree_on_the_smallest_batch(tmp_path):
    script = tmp_path / "ddp_run.py"
    script.write_text(
        SCRIPT.format(tests=os.path.dirname(__file__), root=str(tmp_path), budget=190 * 1024)
    )  # above the per-rank fixed bytes (model states plus DDP buckets), below batch 64
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's nnmem_callbacks
    env = dict(
        os.environ,
        PYTHONWARNINGS="ignore",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    )
    result = subprocess.run(
        [sys.executable, str(script)], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["batch_size"] == ranks[1]["batch_size"] < 64
    assert ranks[0]["accumulate"] == ranks[1]["accumulate"] >= 2
    assert ranks[0]["batch_size"] * ranks[0]["accumulate"] >= 64
    for rank in ranks:
        assert set(rank["sizes"]) == {ranks[0]["batch_size"]}
        assert rank["fits"] is False  # rank 0 fits alone, but the agreed plan is rank 1's
        assert len(rank["measured"]) == 1 and rank["measured"][0] > 0
        assert rank["strategy"] == "ddp"  # the per-rank estimate: the model plus DDP's gradient buckets
    # the agreed plan is rank 1's: the batch keeping 64 exactly where a divisor fits (core.plan.accumulation_split)
    from nnmem_callbacks.core.plan import accumulation_split

    assert ranks[0]["batch_size"] == accumulation_split(64, ranks[1]["max_fit"])[0] <= ranks[1]["max_fit"]
    assert ranks[1]["warnings"] == []  # rank-zero warnings only
    assert any("changed the run" in w for w in ranks[0]["warnings"])
