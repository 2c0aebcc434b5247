"""The framework-free strategy description and its closed-form model states."""

from __future__ import annotations

import pytest

from nnmem_callbacks.core.strategy import Strategy, model_states_per_rank, shard_numel, zero_model_states


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": "tp"}, "strategy kind must be one of"),
        ({"kind": "ddp", "world_size": 0}, "world_size must be a positive integer"),
        ({"kind": "zero", "world_size": 2}, "zero_stage must be 1, 2 or 3"),
        ({"kind": "fsdp", "world_size": 2, "zero_stage": 2}, "zero_stage is only valid with kind='zero'"),
        ({"kind": "ddp", "world_size": 2, "backend": "mpi"}, "backend must be one of"),
        ({"kind": "fsdp", "world_size": 2, "rank": 2}, "rank must be in 0..1"),
        ({"kind": "single", "world_size": 2}, "kind='single' means world_size=1"),
        ({"kind": "fsdp", "world_size": 2, "param_dtype": "int8"}, "param_dtype must be"),
        ({"kind": "ddp", "world_size": 2, "offload_params": True}, "offload_params applies to kind='fsdp'"),
        ({"kind": "zero", "world_size": 2, "zero_stage": 2, "offload_params": True}, "not to kind='zero' with zero_st"),
        ({"kind": "ddp", "world_size": 2, "offload_optimizer": True}, "offload_optimizer applies to kind='fsdp'"),
        ({"kind": "ddp", "world_size": 2, "param_dtype": "bfloat16"}, "applies to kind='fsdp' only"),
        ({"kind": "fsdp", "world_size": 2, "gradient_as_bucket_view": True}, "applies to kind='ddp' only"),
        ({"kind": "zero", "world_size": 2, "zero_stage": True}, "zero_stage must be 1, 2 or 3"),
    ],
)
def test_invalid_strategies_name_what_is_valid(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Strategy(**kwargs)


def test_shards_follow_torch_chunk():
    torch = pytest.importorskip("torch")
    for rows in (1, 3, 7, 10, 64):
        for world_size in (1, 2, 3, 4, 8):
            chunks = torch.empty(rows, 5).chunk(world_size, dim=0)
            for rank in range(world_size):
                expected = chunks[rank].numel() if rank < len(chunks) else 0
                assert shard_numel((rows, 5), world_size, rank) == expected
            assert shard_numel((rows, 5), world_size, padded=True) == max(c.numel() for c in chunks)


def test_model_states_shrink_with_the_stage():
    params = 10_000
    per_stage = [model_states_per_rank(params, Strategy("zero", world_size=8, zero_stage=s)) for s in (1, 2, 3)]
    ddp = model_states_per_rank(params, Strategy("ddp", world_size=8))
    totals = [sum(s.values()) for s in per_stage]
    assert sum(ddp.values()) > totals[0] > totals[1] > totals[2]
    assert per_stage[2]["parameters"] == params * 4 // 8
    offloaded = model_states_per_rank(
        params, Strategy("zero", world_size=8, zero_stage=3, offload_params=True, offload_optimizer=True)
    )
    assert offloaded["parameters"] == offloaded["optimizer_state"] == offloaded["gradients"] == 0


@pytest.mark.parametrize("gpus", [1, 4, 16])
def test_zero3_states_agree_with_deepspeeds_estimator(gpus):
    """fp16 parameters and gradients, fp32 master weights, momentum and variance (12 bytes).

    DeepSpeed's ``estimate_zero3_model_states_mem_needs`` counts 18 bytes per
    parameter split over the GPUs plus 4 bytes per parameter of the largest
    layer (gathered); ours counts the 16 bytes of the states split over the GPUs.
    """
    params, largest = 10**9, 10**7
    ours = sum(
        model_states_per_rank(
            params,
            Strategy("zero", world_size=gpus, zero_stage=3),
            param_bytes=2,
            grad_bytes=2,
            optimizer_bytes_per_param=12,
        ).values()
    )
    theirs = zero_model_states(params, 3, num_gpus_per_node=gpus, largest_layer_params=largest)["gpu"]
    assert ours == -(-16 * params // gpus)
    assert 16 / 18 * (theirs - 4 * largest) <= ours <= theirs


def test_zero_formulas_are_deepspeeds():
    # values of DeepSpeed's functions for these inputs (stage_1_and_2.py, stage3.py); stages 1-2 as of DeepSpeed
    # #5099 (2024): 2 bytes of 16-bit parameters whole, 18 split (the copy here had the older 4 + 16 / N)
    assert zero_model_states(1000, 2, num_gpus_per_node=4) == {
        "gpu": 2 * 1000 + 18 * 1000 // 4,
        "cpu": int(1000 * 4 * 4 * 1.5),
    }
    assert zero_model_states(1000, 2, num_gpus_per_node=4, cpu_offload=True) == {
        "gpu": 2000,
        "cpu": int(1000 * 16 * 1.5),
    }
    assert zero_model_states(1000, 3, largest_layer_params=100, cpu_offload=True, cpu_offload_params=True)["gpu"] == 400
    with pytest.raises(ValueError, match="stage must be 1, 2 or 3"):
        zero_model_states(1000, 4)


def test_shard_estimate_keeps_batch_scaling_and_counts_gpus():
    from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
    from nnmem_callbacks.core.strategy import gpus_needed, shard_estimate

    single = MemoryEstimate(
        peak_bytes=2_000,
        batch_size=10,
        breakdown={"parameters": 400, "gradients": 400, "optimizer_state": 800, "activations": 400},
        phases=(PhaseLine("step2/backward", 1_600, 40),),
        peak_phase="step2/backward",
    )
    sharded = shard_estimate(single, Strategy("fsdp", world_size=4), parameters=100, gathered_bytes=50)
    assert sharded.peak_bytes == 2_000 - 1_600 + 400 + 50
    assert sharded.peak_bytes_at(20) - sharded.peak_bytes == single.peak_bytes_at(20) - single.peak_bytes
    assert sum(sharded.breakdown.values()) == sharded.peak_bytes
    # activations do not shrink with the ranks: a device smaller than them never fits
    assert gpus_needed(single, Strategy("fsdp"), 1_000, parameters=100, margin=0.0) == 4
    assert gpus_needed(single, Strategy("fsdp"), 300, parameters=100, margin=0.0) is None
    assert gpus_needed(single, Strategy("single"), 1_000, parameters=100, margin=0.0) is None  # DDP never shards


def test_cli_calc_per_rank_flags():
    import contextlib
    import io
    import json

    from nnmem_callbacks.cli import main

    def run(*flags):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(
                [
                    "calc",
                    "--layers",
                    "12",
                    "--hidden",
                    "768",
                    "--heads",
                    "12",
                    "--seq-len",
                    "128",
                    "--vocab",
                    "30522",
                    "--batch-size",
                    "8",
                    "--optimizer",
                    "adamw",
                    "--json",
                    *flags,
                ]
            )
        return json.loads(out.getvalue())

    single, fsdp, zero3, ddp = (
        run(),
        run("--world-size", "8", "--fsdp"),
        run("--world-size", "8", "--zero-stage", "3"),
        run("--world-size", "8"),
    )

    def peak(r):
        return r["estimate"]["peak_bytes"] if "estimate" in r else r["peak_bytes"]

    assert peak(fsdp) < peak(single) < peak(ddp)
    assert peak(zero3) < peak(single)
    assert (
        main(["calc", "--params", "1M", "--activations", "10", "--fsdp", "--zero-stage", "2", "--world-size", "2"]) != 0
    )


def test_a_deepspeed_offload_param_below_stage_3_keeps_the_parameters_on_the_device():
    """DeepSpeed offloads parameters at stage 3 only; the note says the option was not applied."""
    from nnmem_callbacks.core.strategy import deepspeed_strategy

    config = {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    strategy, note = deepspeed_strategy(config, world_size=4)
    assert strategy.zero_stage == 2 and not strategy.offload_params
    assert "offload_param is for stage 3 only" in note
    assert model_states_per_rank(1000, strategy)["parameters"] == 4000


def test_shard_estimate_of_zero_under_16bit_mixed_is_deepspeeds_2_2_12():
    """A ZeRO-2 share of a bf16-mixed estimate (fp32 parameters, gradients and Adam state as traced) holds what
    DeepSpeed's bf16 mode holds: its estimator's 2 + 18 / N bytes per parameter; a LoRA's frozen parameters in 16
    bits too, with no master weights; FSDP and 32-true unchanged."""
    from nnmem_callbacks.core.estimate import MemoryEstimate
    from nnmem_callbacks.core.strategy import shard_estimate

    def single(precision, trainable=1000):
        states = {"parameters": 4000, "gradients": 4 * trainable, "optimizer_state": 8 * trainable}
        return MemoryEstimate(peak_bytes=sum(states.values()), batch_size=8, breakdown=states, precision=precision)

    zero2 = Strategy("zero", world_size=8, zero_stage=2)
    rank = shard_estimate(single("bf16-mixed"), zero2, parameters=1000)
    assert rank.peak_bytes == zero_model_states(1000, 2, num_gpus_per_node=8)["gpu"] == 2000 + 18 * 1000 // 8
    assert rank.breakdown["parameters"] == 2000
    lora = shard_estimate(single("16-mixed", trainable=10), zero2, parameters=1000, trainable=10)
    assert lora.breakdown["parameters"] == 2000 and lora.breakdown["optimizer_state"] == -(-10 * 12 // 8)
    assert shard_estimate(single("32-true"), zero2, parameters=1000).breakdown["parameters"] == 4000
    fsdp = shard_estimate(single("bf16-mixed"), Strategy("fsdp", world_size=8), parameters=1000)
    assert fsdp.breakdown["parameters"] == 500  # FSDP keeps the estimate's own dtype (param_dtype is its own)
    offloaded = Strategy("zero", world_size=8, zero_stage=2, offload_optimizer=True)
    assert shard_estimate(single("bf16-mixed"), offloaded, parameters=1000).breakdown["optimizer_state"] == 0


def test_shard_estimate_of_zero_under_16bit_true_holds_deepspeeds_fp32_masters_and_state():
    """Under bf16-true / 16-true DeepSpeed's ZeRO still keeps fp32 master weights, an fp32 gradient partition and
    fp32 Adam state beside them: the same 2 + 18 / N bytes per parameter as under bf16-mixed. The share held the
    trace's 16-bit Adam state (4 bytes) and no master weights or fp32 gradients."""
    from nnmem_callbacks.core.estimate import MemoryEstimate
    from nnmem_callbacks.core.strategy import shard_estimate

    states = {"parameters": 2000, "gradients": 2000, "optimizer_state": 4000}  # a 16-bit step: Adam's state in 16 bits
    for precision in ("bf16-true", "16-true"):
        single = MemoryEstimate(peak_bytes=8000, batch_size=8, breakdown=states, precision=precision)
        for stage in (1, 2):
            rank = shard_estimate(single, Strategy("zero", world_size=8, zero_stage=stage), parameters=1000)
            if stage == 2:  # DeepSpeed's estimator splits the 16-bit gradients at stage 1 too
                assert rank.peak_bytes == zero_model_states(1000, 2, num_gpus_per_node=8)["gpu"] == 4250
            assert rank.breakdown["optimizer_state"] == (4 + 8) * 1000 // 8, (precision, stage)
            assert "the state in fp32 too" in rank.notes[-1]
    fsdp = shard_estimate(single, Strategy("fsdp", world_size=8), parameters=1000)
    assert fsdp.breakdown["optimizer_state"] == 500  # FSDP holds the step's own 16-bit state


def test_fsdp_describes_its_mixed_precision():
    assert Strategy("fsdp", world_size=4, param_dtype="bfloat16").describe().endswith("param_dtype=bfloat16)")
    assert "param_dtype" not in Strategy("fsdp", world_size=4).describe()


def test_shard_estimate_keeps_a_non_elementwise_optimizer_state_whole_under_fsdp():
    from nnmem_callbacks.core.estimate import MemoryEstimate
    from nnmem_callbacks.core.strategy import shard_estimate

    single = MemoryEstimate(
        peak_bytes=1600, batch_size=8, breakdown={"parameters": 400, "gradients": 400, "optimizer_state": 800}
    )
    fsdp = Strategy("fsdp", world_size=4)
    assert shard_estimate(single, fsdp, parameters=100).breakdown["optimizer_state"] == 200
    kept = shard_estimate(single, fsdp, parameters=100, elementwise_optimizer=False)
    assert kept.breakdown["optimizer_state"] == 800 and kept.breakdown["parameters"] == 100
