"""Per-rank estimates for DDP and FSDP2 (nnmem_callbacks.estimators.torch.distributed)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nnmem_callbacks.core.strategy import Strategy  # noqa: E402
from nnmem_callbacks.estimators.torch.distributed import default_units, estimate_per_rank  # noqa: E402

FAST = {"check_scaling": False, "probe_kernels": False}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(4)], torch.nn.Linear(64, 10)
    )


def _estimate(strategy, model=None, **kwargs):
    model = model or _model()
    return estimate_per_rank(model, torch.randn(16, 64), "adam", strategy=strategy, **FAST, **kwargs)


def test_ddp_adds_one_bucket_copy_of_the_gradients_to_every_phase():
    model = _model()
    single = _estimate(Strategy("single"), model)
    ddp = _estimate(Strategy("ddp", world_size=4, backend="gloo"), model)
    gradient_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert ddp.peak_bytes == single.peak_bytes + gradient_bytes
    for line_single, line_ddp in zip(single.phases, ddp.phases):
        assert line_ddp.fixed_bytes - line_single.fixed_bytes == gradient_bytes
    assert ddp.extra["single_device_peak_bytes"] == single.peak_bytes
    assert any("bucket" in note for note in ddp.notes)


def test_fsdp_per_rank_shrinks_with_the_world_size_and_never_changes_the_model():
    model = _model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    peaks = [_estimate(Strategy("fsdp", world_size=n, backend="nccl"), model).peak_bytes for n in (1, 2, 4, 8)]
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0] / 2
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, before[name]) and parameter.grad is None
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_fsdp_states_are_sharded_in_the_breakdown():
    model = _model()
    single = _estimate(Strategy("single"), model)
    sharded = _estimate(Strategy("fsdp", world_size=4, reshard_after_forward=False, backend="nccl"), model)
    assert sharded.breakdown["parameters"] < single.breakdown["parameters"] / 2
    assert sum(sharded.breakdown.values()) == sharded.peak_bytes
    assert sharded.extra["strategy"]["reshard_after_forward"] is False


def test_resharding_after_forward_saves_memory():
    model = _model()
    keep = _estimate(Strategy("fsdp", world_size=4, reshard_after_forward=False, backend="nccl"), model)
    reshard = _estimate(Strategy("fsdp", world_size=4, reshard_after_forward=True, backend="nccl"), model)
    assert reshard.peak_bytes < keep.peak_bytes


def test_later_ranks_hold_smaller_uneven_shards():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 7), torch.nn.ReLU(), torch.nn.Linear(7, 5))
    first = _estimate(Strategy("fsdp", world_size=4, rank=0, backend="nccl"), model)
    last = _estimate(Strategy("fsdp", world_size=4, rank=3, backend="nccl"), model)
    assert last.peak_bytes < first.peak_bytes


def test_zero3_is_below_zero1_and_says_it_is_not_traced():
    model = _model()
    stages = [_estimate(Strategy("zero", world_size=8, zero_stage=s), model) for s in (1, 2, 3)]
    assert stages[0].peak_bytes > stages[1].peak_bytes > stages[2].peak_bytes
    assert any("not modelled" in n for n in stages[2].notes)
    assert stages[2].extra["deepspeed_model_states"]["gpu"] > 0


def test_zero3_counts_the_gathered_parameters_as_fsdp_does():
    """ZeRO-3 gathers each module's parameters around its use, as FSDP does; its per-rank figure is near FSDP's."""
    model = _model()
    zero3 = _estimate(Strategy("zero", world_size=8, zero_stage=3), model)
    fsdp = _estimate(Strategy("fsdp", world_size=8), model)
    layer = 65 * 64 * 4  # one Linear(64, 64): weight and bias, fp32
    assert zero3.breakdown["temporaries"] >= _estimate(Strategy("single"), model).breakdown["temporaries"] + 2 * layer
    assert abs(zero3.peak_bytes - fsdp.peak_bytes) < 0.2 * fsdp.peak_bytes
    assert any("gathered parameters of the root and of the two largest units" in n for n in zero3.notes)


def test_zero_keeps_the_frozen_parameters_of_a_partly_frozen_model():
    """A LoRA-like model: ZeRO-2 holds every parameter whole, ZeRO-3 a shard of all of them, frozen ones too."""
    model = _model()
    for block in list(model)[:4]:
        block.requires_grad_(False)
    single = _estimate(Strategy("single"), model)
    whole = single.breakdown["parameters"]
    zero2 = _estimate(Strategy("zero", world_size=8, zero_stage=2), model)
    zero3 = _estimate(Strategy("zero", world_size=8, zero_stage=3), model)
    assert zero2.breakdown["parameters"] == whole
    assert abs(zero3.breakdown["parameters"] - whole / 8) <= 8 * 4
    assert zero2.peak_bytes <= single.peak_bytes


def test_the_default_backend_is_nccl_on_a_cuda_target_and_gloo_on_the_cpu():
    """Strategy's documented default (backend=None: NCCL for CUDA): gloo's extra buffer copies only on the CPU."""
    model = _model()

    def fsdp(backend, device):
        strategy = Strategy("fsdp", world_size=8, backend=backend)
        return estimate_per_rank(model, torch.empty(16, 64), "adam", device=device, strategy=strategy, **FAST)

    cuda = fsdp(None, "cuda:a100-80gb")
    assert cuda.peak_bytes == fsdp("nccl", "cuda:a100-80gb").peak_bytes < fsdp("gloo", "cuda:a100-80gb").peak_bytes
    assert cuda.extra["strategy"]["backend"] == "nccl" and "nccl collectives work in place" in cuda.notes[-1]
    cpu = fsdp(None, "cpu")
    assert cpu.peak_bytes == fsdp("gloo", "cpu").peak_bytes and cpu.extra["strategy"]["backend"] == "gloo"


def test_a_compiled_step_is_sharded_by_formula_from_its_own_single_device_estimate():
    """The unit marks used to run inside the compiled step (other graphs, another single-device peak), and the note
    said the step "could not be traced"."""
    from nnmem_callbacks.estimators.torch.estimator import estimate_training

    compiled = torch.compile(_model(), backend="aot_eager")
    single = estimate_training(compiled, torch.randn(16, 64), "adam", **FAST)
    for strategy in (Strategy("fsdp", world_size=2), Strategy("ddp", world_size=2)):
        estimate = _estimate(strategy, compiled)
        assert estimate.extra["single_device_peak_bytes"] == single.peak_bytes
        assert any("a torch.compile'd step is not replayed per rank" in note for note in estimate.notes)
        assert not any("could not be traced" in note for note in estimate.notes)
    assert any("DDP's gradient buckets added" in note for note in estimate.notes)


def test_a_wrapped_model_is_refused_with_a_clear_error():
    model = _model()
    fake = type(
        "FSDPLinear", (torch.nn.Linear, __import__("torch.distributed.fsdp", fromlist=["FSDPModule"]).FSDPModule), {}
    )
    model[4].__class__ = fake
    with pytest.raises(ValueError, match="already wrapped by fully_shard"):
        _estimate(Strategy("fsdp", world_size=2), model)


def test_default_units_are_the_blocks():
    model = _model()
    assert default_units(model) == list(model)


@pytest.mark.slow
def test_fsdp_per_rank_estimate_matches_gloo_processes():
    """Two real gloo processes run fully_shard steps; each rank's measured peak is the prediction's truth."""
    dist = pytest.importorskip("torch.distributed")
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("gloo is not available")
    import tempfile

    from benchmarks.suites.distributed import measure, predict

    # a free that gloo makes on its own thread is not recorded by the profiler and can only add to a run's
    # measured peak (benchmarks.suites.distributed repairs most, not all): each rank's truth is its smallest peak over
    # up to 8 runs (about 40% of runs miss a free on one rank here), and runs stop once every rank is within 3%
    predicted = {rank: predict("resmlp", "fsdp", 2, rank)["predicted_bytes"] for rank in (0, 1)}
    best: dict[int, dict] = {}
    for _ in range(8):
        with tempfile.TemporaryDirectory() as tmp:
            runs = measure("resmlp", "fsdp", 2, tmp, timeout=240)
        for run in runs:
            if run["rank"] not in best or run["peak_bytes"] < best[run["rank"]]["peak_bytes"]:
                best[run["rank"]] = run
        if all(abs(predicted[r] - run["peak_bytes"]) / run["peak_bytes"] < 0.03 for r, run in best.items()):
            break
    assert set(best) == {0, 1}
    for rank, run in best.items():
        assert abs(predicted[rank] - run["peak_bytes"]) / run["peak_bytes"] < 0.03, (predicted[rank], run)


@pytest.mark.parametrize(
    "strategy", [Strategy("fsdp", world_size=4, backend="nccl"), Strategy("ddp", world_size=2, backend="gloo")]
)
def test_a_per_rank_plan_is_checked_by_a_per_rank_trace_not_a_single_device_one(strategy):
    from nnmem_callbacks.core.plan import make_plan

    model = _model()
    per_rank = estimate_per_rank(model, torch.randn(64, 64), "sgd", strategy=strategy, probe_kernels=False)
    assert per_rank.allocation_log is None  # the single-device log does not describe one rank
    direct = per_rank.verifier(24)
    assert direct.extra["strategy"]["kind"] == strategy.kind and direct.batch_size == 24
    # the rank's lines are the single-device lines shifted by the rank's difference at the batch: not tight
    # away from it (+35% at 24 under Adam FSDP), but a plan's choice is checked by the rank's own trace
    assert direct.peak_bytes <= per_rank.peak_bytes_at(24)
    # a budget that fits batch 32 on one rank: the shrink is checked by per-rank traces and kept near 32
    budget = per_rank.peak_bytes_at(32)
    plan = make_plan(per_rank, int(budget / 0.95) + 1, "shrink", margin=0.05)
    assert not plan.fits and plan.verification is not None and plan.verification.checks
    for check in plan.verification.checks:  # a single-device trace would be about twice the rank's lines
        assert check.traced_bytes is not None and check.traced_bytes <= 1.02 * check.predicted_bytes
    assert plan.verification.verified and 1 <= plan.batch_size < 64


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "bf16-true", "16-true"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_under_16bit_mixed_holds_deepspeeds_bytes(precision, stage):
    """DeepSpeed's bf16/fp16 mode holds a 16-bit model: 2 bytes of parameters and of gradients (whole or split by
    the stage), and in each rank's partition fp32 master weights (4), an fp32 gradient copy (4) and Adam's state (8).
    Under ``*-mixed`` the estimate's own fp32 parameters and gradients were kept (4 + 4 bytes; 8 of Adam state, no
    master weights); under ``*-true`` (Lightning's DeepSpeedStrategy enables the same mode) its 16-bit Adam state
    (4) with no master weights and no fp32 gradient copy."""
    model = _model()
    n, params = 4, sum(p.numel() for p in model.parameters())
    mixed = _estimate(Strategy("zero", world_size=n, zero_stage=stage), model, precision=precision)
    fp32 = _estimate(Strategy("zero", world_size=n, zero_stage=stage), model)

    def split(total):
        return -(-total // n)

    assert mixed.breakdown["parameters"] == (split(2 * params) if stage == 3 else 2 * params)
    assert mixed.breakdown["gradients"] == (2 * params if stage == 1 else split(2 * params)) + split(4 * params)
    assert mixed.breakdown["optimizer_state"] == split(12 * params)
    assert fp32.breakdown["parameters"] == (split(4 * params) if stage == 3 else 4 * params)  # 32-true: as traced
    states = sum(mixed.breakdown[k] for k in ("parameters", "gradients", "optimizer_state"))
    if stage == 3:  # DeepSpeed's stage-3 estimate (less its gathered largest layer) splits 18 bytes per parameter;
        # its stage-2 itemisation (2 + 4 gradients, 4 + 8 optimizer) plus the 16-bit parameters' 2 makes 20
        theirs = mixed.extra["deepspeed_model_states"]["gpu"] - 4 * 64 * 65
        assert states == split(20 * params) and abs(theirs - split(18 * params)) <= 1
    assert any("DeepSpeed's bf16/fp16 mode" in note for note in mixed.notes)
    assert not any("DeepSpeed's bf16/fp16 mode" in note for note in fp32.notes)


class _Factored(torch.optim.Optimizer):
    """Adafactor-like: a row and a column factor per matrix, not of the parameter's shape."""

    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if p.ndim == 2:
                    if not state:
                        state["row"] = torch.zeros(p.shape[0], device=p.device, dtype=p.dtype)
                        state["col"] = torch.zeros(p.shape[1], device=p.device, dtype=p.dtype)
                    square = p.grad.square()
                    state["row"].add_(square.mean(1))
                    state["col"].add_(square.mean(0))
                    p.sub_(p.grad / (state["row"][:, None] * state["col"][None, :]).sqrt().add(1e-8))
                else:
                    p.sub_(p.grad)


def _muon(params):
    params = list(params)
    return [torch.optim.Muon([p for p in params if p.ndim == 2]), torch.optim.AdamW([p for p in params if p.ndim != 2])]


@pytest.mark.parametrize("optimizer, named", [(_Factored, "_Factored's state 'row'"), (_muon, "Muon updates whole")])
def test_fsdp_keeps_a_non_elementwise_optimizer_whole_and_says_so(optimizer, named):
    """Its state and step temporaries were scaled by the local shard as if elementwise, silently."""
    if optimizer is _muon and not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon is torch 2.9+")
    model = _model()

    def run(strategy):
        return estimate_per_rank(model, torch.randn(16, 64), optimizer, strategy=strategy, **FAST)

    single, fsdp = run(Strategy("single")), run(Strategy("fsdp", world_size=4, backend="nccl"))
    assert fsdp.breakdown["optimizer_state"] == single.breakdown["optimizer_state"] > 0
    assert fsdp.breakdown["parameters"] < single.breakdown["parameters"] / 2  # the rest is still sharded
    said = [note for note in fsdp.notes if "not elementwise" in note]
    assert len(said) == 1 and named in said[0] and "err high" in said[0]
    adam = _estimate(Strategy("fsdp", world_size=4, backend="nccl"), model)
    assert not any("not elementwise" in note for note in adam.notes)
    assert not any("not elementwise" in note for note in run(Strategy("ddp", world_size=4)).notes)


def test_not_elementwise_reads_the_state_shapes():
    from nnmem_callbacks.estimators.torch.distributed import not_elementwise

    weight = torch.nn.Parameter(torch.zeros(4, 3))
    weight.grad = torch.ones(4, 3)
    for make in (torch.optim.Adam, torch.optim.Adagrad, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)):
        optimizer = make([weight])
        optimizer.step()
        assert not_elementwise(optimizer) is None
    factored = _Factored([weight])
    factored.step()
    assert "'row' has shape (4,), not its parameter's (4, 3)" in not_elementwise(factored)
