"""Reading a Lightning strategy (no Lightning needed: strategies are read by class name and attributes)."""

from __future__ import annotations

import types

import pytest

from nnmem_callbacks.adapters.lightning.strategy import read_strategy, units_for


def _read(class_name: str, world_size: int = 2, rank: int = 1, **attributes):
    """Reads a strategy of class ``class_name`` with ``attributes``, for rank ``rank`` of ``world_size``."""
    strategy = type(class_name, (), attributes)()
    return read_strategy(strategy, world_size=world_size, global_rank=rank)


def test_ddp_reads_its_kwargs():
    reading = _read(
        "DDPStrategy", _ddp_kwargs={"gradient_as_bucket_view": True, "bucket_cap_mb": 50}, _process_group_backend="gloo"
    )
    strategy = reading.strategy
    assert (strategy.kind, strategy.world_size, strategy.rank) == ("ddp", 2, 1)
    assert strategy.gradient_as_bucket_view and strategy.bucket_cap_mb == 50 and strategy.backend == "gloo"


def test_fsdp_reads_sharding_offload_and_units():
    torch = pytest.importorskip("torch")
    policy = types.SimpleNamespace(_module_classes={torch.nn.Linear})
    reading = _read(
        "FSDPStrategy",
        sharding_strategy=types.SimpleNamespace(name="SHARD_GRAD_OP"),
        cpu_offload=types.SimpleNamespace(offload_params=True),
        kwargs={"auto_wrap_policy": policy},
    )
    assert reading.strategy.kind == "fsdp" and reading.strategy.reshard_after_forward is False
    assert reading.strategy.offload_params
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))
    assert units_for(model, reading) == [model[0], model[2]]
    hybrid = _read("FSDPStrategy", sharding_strategy=types.SimpleNamespace(name="HYBRID_SHARD"))
    assert hybrid.strategy is None and "HYBRID_SHARD" in hybrid.reason


def test_deepspeed_reads_the_zero_stage():
    config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    reading = _read("DeepSpeedStrategy", world_size=8, rank=0, config=config)
    assert (reading.strategy.kind, reading.strategy.zero_stage) == ("zero", 3)
    assert reading.strategy.offload_optimizer and not reading.strategy.offload_params


def test_model_parallel_only_without_tensor_parallelism():
    data = _read("ModelParallelStrategy", _data_parallel_size=2, _tensor_parallel_size=1)
    assert data.strategy.kind == "fsdp"
    tensor = _read("ModelParallelStrategy", _data_parallel_size=1, _tensor_parallel_size=2)
    assert tensor.strategy is None and "tensor" in tensor.reason


def test_unknown_strategies_are_not_modelled():
    reading = _read("XLAStrategy")
    assert reading.strategy is None and "XLAStrategy is not modelled" in reading.reason


def test_the_trainer_gives_the_strategy_its_world_size_and_rank():
    from nnmem_callbacks.adapters.lightning.trainer_io import read_strategy as read_trainer_strategy

    strategy = type("DDPStrategy", (), {})()
    reading = read_trainer_strategy(types.SimpleNamespace(strategy=strategy, world_size=4, global_rank=3))
    assert (reading.strategy.kind, reading.strategy.world_size, reading.strategy.rank) == ("ddp", 4, 3)


def test_callback_does_not_act_under_an_unmodelled_strategy(tmp_path):
    """The callback warns and leaves the batch alone, even with a budget the run exceeds."""
    pytest.importorskip("pytorch_lightning")
    import sys
    import warnings

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import pytorch_lightning as pl
    from _lightning_models import MLP, DataModule, trainer_kwargs

    from nnmem_callbacks.adapters.lightning import callback as _lightning_impl
    from nnmem_callbacks.adapters.lightning.strategy import StrategyReading
    from nnmem_callbacks.lightning import MemoryBudgetCallback

    callback = MemoryBudgetCallback(budget=1024, policy="shrink")
    original = _lightning_impl.MemoryBudgetCallbackMixin.setup

    def setup(self, trainer, pl_module, stage):
        original(self, trainer, pl_module, stage)
        self._strategy_reading = StrategyReading(None, "XLAStrategy", "XLAStrategy is not modelled")

    datamodule = DataModule(batch_size=64)
    trainer = pl.Trainer(**trainer_kwargs(tmp_path, limit_train_batches=1), callbacks=[callback])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback.setup = types.MethodType(setup, callback)
        trainer.fit(MLP(), datamodule=datamodule)
    assert datamodule.batch_size == 64
    assert callback.plan is None and "not modelled" in callback.failure
    assert any("does not act under XLAStrategy" in str(w.message) for w in caught)


def test_lightning_fsdp_says_it_is_fsdp1_estimated_with_the_fsdp2_model():
    reading = _read("FSDPStrategy", _activation_checkpointing_kwargs={"auto_wrap_policy": object()})
    assert reading.strategy.kind == "fsdp"
    assert "FSDP1" in reading.reason and "FSDP2 model" in reading.reason
    assert "activation_checkpointing_policy is not traced" in reading.reason


def test_what_a_modelled_reading_assumed_is_warned_and_the_summary_says_per_rank(tmp_path):
    """A per-rank estimate says so in the fit-start line, and what the strategy reading assumed is not silent."""
    pytest.importorskip("pytorch_lightning")
    import sys
    import warnings

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import pytorch_lightning as pl
    from _lightning_models import MLP, DataModule, trainer_kwargs

    from nnmem_callbacks.adapters.lightning import callback as _lightning_impl
    from nnmem_callbacks.adapters.lightning.strategy import StrategyReading
    from nnmem_callbacks.core.strategy import Strategy
    from nnmem_callbacks.lightning import MemoryBudgetCallback

    callback = MemoryBudgetCallback(budget="1GiB", probe_kernels=False)
    original = _lightning_impl.MemoryBudgetCallbackMixin.setup
    assumed = "FSDP NO_SHARD read as DDP"

    def setup(self, trainer, pl_module, stage):
        original(self, trainer, pl_module, stage)
        self._strategy_reading = StrategyReading(Strategy("ddp", world_size=2), "FSDPStrategy", assumed)

    trainer = pl.Trainer(**trainer_kwargs(tmp_path, limit_train_batches=1), callbacks=[callback])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback.setup = types.MethodType(setup, callback)
        trainer.fit(MLP(), datamodule=DataModule(batch_size=8))
    assert callback.estimate.extra["strategy"]["kind"] == "ddp"
    assert "per rank of ddp x2" in callback.summary
    assert f"FSDPStrategy: {assumed}" in callback.estimate.notes
    assert any(f"per rank of ddp x2: {assumed}" in str(w.message) for w in caught)
