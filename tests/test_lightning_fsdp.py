"""FSDP2 (ModelParallelStrategy, fully_shard) on 2 CPU processes (gloo) with the callback in every policy.

The budget lies between the per-rank estimate and the single-device one: every
policy must leave the run alone (the single-device estimate would have shrunk
a batch that fits). Below the per-rank estimate, ``shrink`` must act, the same
on both ranks, and the run must train.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("pytorch_lightning")
dist = pytest.importorskip("torch.distributed")

pytestmark = [pytest.mark.lightning, pytest.mark.slow]

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, warnings
    sys.path.insert(0, {tests!r})
    import torch
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import ModelParallelStrategy
    from _lightning_models import MLP, DataModule, end_process_groups, trainer_kwargs
    from nnmem_callbacks.lightning import MemoryBudgetCallback
    from nnmem_callbacks.core.strategy import Strategy
    from nnmem_callbacks.estimators.torch.distributed import estimate_per_rank

    class ShardedMLP(MLP):
        def configure_model(self):
            from torch.distributed.fsdp import fully_shard
            mesh = self.device_mesh["data_parallel"]
            for layer in self.net:
                if any(True for _ in layer.parameters()):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self, mesh=mesh)

    def estimate(kind, world_size):
        model = ShardedMLP(hidden=256)
        batch = (torch.zeros(64, 32), torch.zeros(64, dtype=torch.long))
        loss = lambda m, b: m.training_step(b, 0)
        return estimate_per_rank(model, batch, model.configure_optimizers(), loss,
                                 strategy=Strategy(kind, world_size=world_size, backend="gloo"),
                                 check_scaling=False, zero_grad="before_backward").peak_bytes

    if __name__ == "__main__":
        rank = int(os.environ.get("LOCAL_RANK", "0"))
        per_rank, single = estimate("fsdp", 2), estimate("single", 1)
        between = (per_rank + single) // 2
        runs = [(policy, between) for policy in ("warn", "raise", "shrink", "accumulate")] + [("shrink", per_rank * 3 // 4)]
        results = []
        for policy, budget in runs:
            callback = MemoryBudgetCallback(budget=budget, policy=policy, margin=0.0)
            datamodule = DataModule(batch_size=64)
            trainer = pl.Trainer(**trainer_kwargs({root!r}, strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
                                                  devices=2, limit_train_batches=2), callbacks=[callback])
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trainer.fit(ShardedMLP(hidden=256), datamodule=datamodule)
            results.append({{
                "policy": policy, "budget": budget, "per_rank": per_rank, "single": single,
                "predicted": callback.estimate.peak_bytes if callback.estimate else None,
                "kind": callback.estimate.extra.get("strategy", {{}}).get("kind") if callback.estimate else None,
                "batch_size": datamodule.batch_size, "fits": callback.plan.fits if callback.plan else None,
                "steps": int(trainer.global_step), "failure": callback.failure,
                "warnings": [str(w.message) for w in caught if "MemoryBudgetCallback" in str(w.message)],
            }})
        with open(os.path.join({root!r}, f"rank{{trainer.global_rank}}.json"), "w") as out:
            json.dump(results, out)
        end_process_groups()
    """
)


def test_fsdp_callback_acts_on_the_per_rank_estimate(tmp_path):
    script = tmp_path / "fsdp_run.py"
    script.write_text(SCRIPT.format(tests=os.path.dirname(__file__), root=str(tmp_path)))
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
    for runs in ranks:
        for run in runs:
            assert run["failure"] is None, run
            assert run["kind"] == "fsdp"
            assert run["steps"] == 2  # the run trained
            # the callback's estimate is the per-rank one, far below the single-device one
            assert run["predicted"] < run["single"]
        between, tight = runs[:4], runs[4]
        for run in between:  # fits per rank: no policy acts (the single-device estimate would not fit)
            assert run["single"] > run["budget"] >= run["predicted"]
            assert run["fits"] is True
            assert run["batch_size"] == 64
        assert tight["fits"] is False
        assert tight["batch_size"] < 64
    assert [r["batch_size"] for r in ranks[0]] == [r["batch_size"] for r in ranks[1]]  # the ranks agree
    assert any("changed the run" in w for w in ranks[0][4]["warnings"])
