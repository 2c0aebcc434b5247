"""What the ranks of a distributed Lightning run agree on (``adapters/lightning/ranks.py``), through a fake strategy's
``reduce`` as the callback calls it (``trainer_io.reduce_max``)."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from nnmem_callbacks.adapters.lightning.ranks import agreed_plan, what_this_rank_sends  # noqa: E402
from nnmem_callbacks.adapters.lightning.trainer_io import reduce_max  # noqa: E402
from nnmem_callbacks.core.plan import Plan  # noqa: E402
from nnmem_callbacks.core.verification import Verification, VerificationCheck  # noqa: E402


def fake_trainer(world_size: int, other_rank: list[int], accumulate: int = 1):
    """A trainer whose strategy reduces this rank's int64 tensor with ``other_rank``'s values by ``max``."""

    def reduce(tensor, reduce_op):
        assert reduce_op == "max"
        return torch.maximum(tensor, torch.tensor(other_rank, dtype=torch.int64))

    strategy = types.SimpleNamespace(root_device=torch.device("cpu"), reduce=reduce)
    return types.SimpleNamespace(world_size=world_size, strategy=strategy, accumulate_grad_batches=accumulate)


def agree(trainer, plan: Plan | None, policy: str) -> Plan | None:
    """What the callback does: send, reduce over the ranks, make the plan from what came back."""
    received = reduce_max(trainer, what_this_rank_sends(plan))
    return agreed_plan(plan, received, policy=policy, accumulate_grad_batches=trainer.accumulate_grad_batches)


def shrunk_plan(batch_size: int) -> Plan:
    check = VerificationCheck(batch_size=batch_size, predicted_bytes=90, traced_bytes=95, fits=True, method="trace")
    verification = Verification(
        budget_bytes=100,
        measure="peak",
        predicted_batch_size=batch_size,
        batch_size=batch_size,
        checks=(check,),
        verified=True,
    )
    return Plan(
        policy="accumulate",
        budget_bytes=100,
        predicted_bytes=400,
        original_batch_size=64,
        batch_size=batch_size,
        accumulate_grad_batches=64 // batch_size,
        max_fitting_batch_size=batch_size,
        fits=False,
        verification=verification,
    )


def test_ranks_train_with_the_smallest_batch_and_keep_only_a_check_of_that_batch():
    plan = shrunk_plan(16)
    # the other rank chose batch 8 (sent as -8 so that max picks the smallest), did not fail, does not fit
    agreed = agree(fake_trainer(2, [0, -8, 1]), plan, "accumulate")
    assert agreed.batch_size == 8
    assert agreed.accumulate_grad_batches == 8  # 64 samples per optimizer step, as configured
    assert agreed.verification is None  # this rank checked batch 16, not 8
    same = agree(fake_trainer(2, [0, -16, 1]), plan, "accumulate")
    assert same is plan


def test_a_failure_on_any_rank_disables_every_rank():
    assert agree(fake_trainer(2, [1, -64, 0]), shrunk_plan(16), "shrink") is None
    assert agree(fake_trainer(2, [0, -64, 0]), None, "shrink") is None  # this rank has no plan
    assert agree(fake_trainer(1, [1, -64, 0]), shrunk_plan(16), "shrink").batch_size == 16


def test_the_measured_peak_is_the_largest_over_ranks():
    assert reduce_max(fake_trainer(2, [500]), [300]) == [500]
    assert reduce_max(fake_trainer(2, [100]), [300]) == [300]
    assert reduce_max(fake_trainer(1, [500]), [300]) == [300]
