"""The PyTorch estimator: categories, scaling, safety, fallback, errors and accuracy."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from nnmem_callbacks import estimate_training
from nnmem_callbacks.allocators.cuda_caching import (
    LARGE_BUFFER,
    SMALL_BUFFER,
    CachingAllocatorModel,
    replay,
    round_size,
    segment_size,
)


def xent(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def seed_mlp():
    layers = [nn.Linear(1000, 100), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(100, 100), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(100, 10))


def bn_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def image_batch(n=16):
    return torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))


def param_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ---------------------------------------------------------------------------
# categories
# ---------------------------------------------------------------------------


def test_categories_of_the_seed_mlp_with_momentum():
    model = seed_mlp()
    batch = (torch.randn(256, 1000), torch.randint(0, 10, (256,)))
    est = estimate_training(model, batch, optimizer="sgd_momentum", loss_fn=xent)
    assert est.method == "trace"
    assert est.breakdown["parameters"] == param_bytes(model)
    assert est.breakdown["inputs"] == 256 * 1000 * 4 + 256 * 8
    # step 2: momentum buffers exist for every parameter
    step2 = est.phase_breakdowns["step2/forward"]
    assert step2["optimizer_state"] == param_bytes(model)
    assert step2["activations"] > 0
    assert sum(est.breakdown.values()) == est.peak_bytes
    for phase, breakdown in est.phase_breakdowns.items():
        assert all(value >= 0 for value in breakdown.values()), phase


def test_adam_state_is_twice_the_parameters_plus_step_counters():
    model = seed_mlp()
    est = estimate_training(model, torch.randn(32, 1000), optimizer="adam")
    state = est.phase_breakdowns["step2/forward"]["optimizer_state"]
    n_params = len(list(model.parameters()))
    assert state == 2 * param_bytes(model) + 4 * n_params  # exp_avg, exp_avg_sq, float32 step
    assert est.phase_breakdowns["step1/forward"]["optimizer_state"] == 0  # lazily created


def test_gradients_exist_at_the_end_of_backward():
    model = seed_mlp()
    est = estimate_training(model, torch.randn(8, 1000), optimizer="sgd")
    optimizer_phase = est.phase_breakdowns["step1/optimizer"]
    assert optimizer_phase["gradients"] == param_bytes(model)


def test_tied_weights_are_counted_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(1000, 64)
            self.head = nn.Linear(64, 1000, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens):
            return self.head(self.embed(tokens))

    model = Tied()
    est = estimate_training(model, torch.randint(0, 1000, (4, 16)), optimizer="sgd")
    assert est.breakdown["parameters"] == 1000 * 64 * 4


def test_precision_true_half_halves_parameters_and_mixed_keeps_fp32_masters():
    model = seed_mlp()
    batch = torch.randn(64, 1000)
    fp32 = estimate_training(model, batch, optimizer="adam")
    bf16_true = estimate_training(model, batch, optimizer="adam", precision="bf16-true")
    bf16_mixed = estimate_training(model, batch, optimizer="adam", precision="bf16-mixed")
    assert bf16_true.breakdown["parameters"] == fp32.breakdown["parameters"] // 2
    assert bf16_mixed.breakdown["parameters"] == fp32.breakdown["parameters"]
    assert bf16_true.breakdown["inputs"] == fp32.breakdown["inputs"] // 2


def test_grad_scaler_clipping_and_accumulation_are_simulated():
    model = seed_mlp()
    batch = torch.randn(64, 1000)
    scaled = estimate_training(model, batch, optimizer="adam", precision="16-mixed")
    assert scaled.method == "trace"
    clipped = estimate_training(model, batch, optimizer="sgd", gradient_clip_val=1.0)
    plain = estimate_training(model, batch, optimizer="sgd")
    assert clipped.method == "trace" and clipped.peak_bytes >= plain.peak_bytes
    accumulated = estimate_training(model, batch, optimizer="sgd", accumulate_grad_batches=4)
    assert "step1/forward.2" in accumulated.phase_breakdowns
    # the second micro-batch runs while the first one's gradients are held
    assert accumulated.phase_breakdowns["step1/forward.2"]["gradients"] == param_bytes(model)


def test_checkpointing_reduces_activations():
    class Blocks(nn.Module):
        def __init__(self, use_checkpoint):
            super().__init__()
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)) for _ in range(4)
            )
            self.use_checkpoint = use_checkpoint

        def forward(self, x):
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False) if self.use_checkpoint else block(x)
            return x

    batch = torch.randn(128, 256)
    plain = estimate_training(Blocks(False), batch, optimizer="sgd")
    checkpointed = estimate_training(Blocks(True), batch, optimizer="sgd")
    assert checkpointed.method == "trace"
    assert (
        checkpointed.phase_breakdowns["step1/forward"]["activations"]
        < 0.5 * plain.phase_breakdowns["step1/forward"]["activations"]
    )


def test_custom_autograd_function_and_inplace_ops_are_traced():
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * x * grad

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(64, 64)

        def forward(self, x):
            y = self.linear(x)
            y.relu_()
            return Square.apply(y)

    est = estimate_training(Model(), torch.randn(32, 64), optimizer="sgd")
    assert est.method == "trace"
    assert est.phase_breakdowns["step1/forward"]["activations"] >= 32 * 64 * 4


# ---------------------------------------------------------------------------
# batch scaling
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "factory,batch_fn",
    [(seed_mlp, lambda n: (torch.randn(n, 1000), torch.randint(0, 10, (n,)))), (bn_cnn, image_batch)],
)
def test_scaling_lines_predict_independent_traces(factory, batch_fn):
    model = factory()
    est = estimate_training(model, batch_fn(16), optimizer="adam", loss_fn=xent)
    assert est.peak_bytes_at(16) == est.peak_bytes
    for other in (4, 48):
        truth = estimate_training(model, batch_fn(other), optimizer="adam", loss_fn=xent, check_scaling=False)
        assert est.peak_bytes_at(other) == pytest.approx(truth.peak_bytes, rel=0.01), other
    assert not any("not linear" in note for note in est.notes)


def test_non_linear_growth_is_reported():
    class Quadratic(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x):
            pairwise = x.unsqueeze(0) * x.unsqueeze(1)  # batch x batch x 8
            return self.linear(pairwise).mean()

    est = estimate_training(Quadratic(), torch.randn(64, 8), optimizer="sgd")
    assert any("not linear" in note for note in est.notes)


def test_max_batch_size_agrees_with_peak_bytes_at():
    est = estimate_training(bn_cnn(), image_batch(16), optimizer="adam", loss_fn=xent)
    budget = est.peak_bytes * 3
    best = est.max_batch_size(budget)
    assert best > 16
    assert est.peak_bytes_at(best) <= budget < est.peak_bytes_at(best + 1)


# ---------------------------------------------------------------------------
# meta batches and safety
# ---------------------------------------------------------------------------


def test_meta_batch_gives_the_same_estimate_as_a_real_one():
    model = bn_cnn()
    real = estimate_training(model, image_batch(16), optimizer="adam", loss_fn=xent)
    meta = estimate_training(
        model,
        (torch.empty(16, 3, 32, 32, device="meta"), torch.empty(16, dtype=torch.long, device="meta")),
        optimizer="adam",
        loss_fn=xent,
    )
    assert meta.peak_bytes == real.peak_bytes
    assert meta.breakdown == real.breakdown


def test_a_batch_that_could_never_fit_in_ram_is_estimated_without_allocating():
    import psutil

    model = seed_mlp()
    process = psutil.Process()
    before = process.memory_info().rss
    est = estimate_training(model, torch.empty(50_000_000, 1000, device="meta"), optimizer="sgd")
    grown = process.memory_info().rss - before
    assert est.peak_bytes > 200 * 1024**3  # the inputs alone are 200 GB
    assert grown < 500 * 1024**2


def test_meta_model_estimates_for_cpu():
    with torch.device("meta"):
        model = seed_mlp()
    est = estimate_training(model, torch.empty(32, 1000, device="meta"), optimizer="adam")
    assert est.device == "cpu"
    assert est.breakdown["parameters"] == param_bytes(model)


def test_estimation_changes_nothing_of_the_users_run():
    torch.manual_seed(0)

    class Stateful(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = bn_cnn()
            self.dropout = nn.Dropout(0.5)
            self.seen = []

        def forward(self, x):
            out = self.dropout(self.net(x))
            self.seen.append(out)  # a training_step-style side effect
            self.last = out
            return out

    model = Stateful()
    model.eval()  # estimation must restore the mode too
    batch = image_batch(8)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    xent(model, batch).backward()  # real gradients and real optimizer state exist
    optimizer.step()
    model.seen.clear()
    del model.last
    params = copy.deepcopy(model.state_dict(keep_vars=False))
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt_state = copy.deepcopy(optimizer.state_dict())
    rng = torch.get_rng_state()
    py_rng = random.getstate()
    np_rng = np.random.get_state()

    estimate_training(model, batch, optimizer=optimizer, loss_fn=xent, precision="bf16-mixed")

    assert model.training is False and all(not m.training for m in model.modules())
    for name, value in model.state_dict().items():
        assert torch.equal(value, params[name]), name  # includes BN running stats and num_batches_tracked
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter.grad, grads[name]), name
        assert type(parameter) is nn.Parameter and not isinstance(parameter.data, torch._subclasses.FakeTensor)
    after = optimizer.state_dict()
    for key, state in opt_state["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(after["state"][key][name]), torch.as_tensor(value))
    assert torch.equal(torch.get_rng_state(), rng)
    assert random.getstate() == py_rng
    assert np.array_equal(np.random.get_state()[1], np_rng[1])
    assert model.seen == [] and not hasattr(model, "last")


def test_the_optimizer_instance_is_never_stepped():
    model = seed_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = [p.detach().clone() for p in model.parameters()]
    est = estimate_training(model, torch.randn(8, 1000), optimizer=optimizer)
    assert optimizer.state == {} or all(len(s) == 0 for s in optimizer.state.values())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert est.phase_breakdowns["step2/forward"]["optimizer_state"] == param_bytes(model)


# ---------------------------------------------------------------------------
# fallback
# ---------------------------------------------------------------------------


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(64, 1)
        self.expert = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        keep = torch.nonzero(self.gate(x).squeeze(-1) > 0).squeeze(-1)
        routed = x.index_add(0, keep, self.expert(x[keep]))
        return self.head(routed)


def test_data_dependent_model_falls_back_with_a_warning_and_a_reason():
    model = DataDependent()
    batch = (torch.randn(64, 64), torch.randint(0, 10, (64,)))
    with pytest.warns(RuntimeWarning, match="closed-form"):
        est = estimate_training(model, batch, optimizer="adam", loss_fn=xent)
    assert est.method == "closed-form"
    assert any("tracing failed" in note for note in est.notes)
    assert est.breakdown["parameters"] == param_bytes(model)
    assert est.breakdown["optimizer_state"] >= 2 * param_bytes(model)
    assert est.peak_bytes_at(128) > est.peak_bytes


def test_fallback_never_crashes_when_even_the_forward_fails():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x):
            raise RuntimeError("custom kernel unavailable")

    with pytest.warns(RuntimeWarning):
        est = estimate_training(Broken(), torch.randn(2, 4), optimizer="adam")
    assert est.method == "static-only"
    assert est.breakdown["parameters"] == 4 * 4 * 4 + 4 * 4


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


def test_unknown_precision_lists_the_valid_ones():
    with pytest.raises(ValueError, match="bf16-mixed") as info:
        estimate_training(seed_mlp(), torch.randn(2, 1000), precision="fp8")
    assert "fp8" in str(info.value)


def test_unknown_optimizer_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="adamw") as info:
        estimate_training(seed_mlp(), torch.randn(2, 1000), optimizer="adamm")
    assert "did you mean 'adam'" in str(info.value)


@pytest.mark.parametrize("batch", [{"a": 1}, [], "text", None])
def test_batch_without_tensors(batch):
    with pytest.raises(ValueError, match="no tensor"):
        estimate_training(seed_mlp(), batch)


def test_loss_that_is_not_a_scalar():
    with pytest.raises(ValueError, match="scalar"):
        estimate_training(seed_mlp(), torch.randn(2, 1000), loss_fn=lambda m, b: m(b))


def test_loss_that_does_not_require_grad():
    with pytest.raises(ValueError, match="require grad"):
        estimate_training(seed_mlp(), torch.randn(2, 1000), loss_fn=lambda m, b: m(b).sum().detach())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"device": "tpu"}, "device"),
        ({"accumulate_grad_batches": 0}, "accumulate_grad_batches"),
        ({"gradient_clip_val": -1.0}, "gradient_clip_val"),
        ({"gradient_clip_algorithm": "max"}, "gradient_clip_algorithm"),
        ({"optimizer": 3}, "optimizer must be"),
        ({"loss_fn": "mse"}, "loss_fn"),
    ],
)
def test_other_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        estimate_training(seed_mlp(), torch.randn(2, 1000), **kwargs)


def test_model_must_be_a_module():
    with pytest.raises(ValueError, match="torch.nn.Module"):
        estimate_training(lambda x: x, torch.randn(2, 3))


# ---------------------------------------------------------------------------
# CUDA device model (pure simulation; real CUDA checks are marked)
# ---------------------------------------------------------------------------


def test_allocator_rounding_and_segments_by_hand():
    assert round_size(1) == 512 and round_size(1025) == 1536
    assert segment_size(1 << 20) == SMALL_BUFFER
    assert segment_size((1 << 20) + 512) == LARGE_BUFFER
    assert segment_size(10 << 20) == 10 << 20
    assert segment_size((10 << 20) + 1) == 12 << 20


def test_allocator_small_pool_reuses_freed_blocks():
    sim = CachingAllocatorModel()
    handles = [sim.malloc(4096) for _ in range(512)]  # exactly one 2 MiB segment
    assert sim.reserved == SMALL_BUFFER
    sim.malloc(1)  # a second small segment
    assert sim.reserved == 2 * SMALL_BUFFER
    for handle in handles:
        sim.free(handle)
    sim.malloc(1 << 20)  # fits into the merged first segment
    assert sim.reserved == 2 * SMALL_BUFFER
    assert sim.peak_allocated == 512 * 4096 + 512


def test_allocator_large_pool_split_and_unsplit_remainder():
    sim = CachingAllocatorModel()
    first = sim.malloc(19 << 20)  # 20 MiB segment, 1 MiB left: not split (not > 1 MiB)
    assert sim.allocated == LARGE_BUFFER
    sim.free(first)
    sim.malloc(3 << 20)  # reuses the segment, split: 17 MiB stay free
    assert sim.reserved == LARGE_BUFFER and sim.allocated == 3 << 20
    sim.malloc(17 << 20)
    assert sim.reserved == LARGE_BUFFER


def test_allocator_fragmentation_grows_the_reserve():
    # a (12 MiB), b (12 MiB) in their own segments; free a; 14 MiB cannot reuse it
    prediction = replay([(1, 12 << 20), (2, 12 << 20), (1, -1), (3, 14 << 20)])
    assert prediction.peak_reserved == (12 + 12 + 14) << 20
    assert prediction.peak_allocated == (12 + 14) << 20


def test_cuda_target_on_a_cpu_machine_reports_reserve_and_overhead():
    est = estimate_training(seed_mlp(), torch.empty(256, 1000, device="meta"), optimizer="adam", device="cuda")
    assert est.device.startswith("cuda")
    assert est.reserved_bytes >= est.peak_bytes
    assert est.overhead_bytes > 0
    assert est.device_bytes == est.reserved_bytes + est.overhead_bytes
    if not torch.cuda.is_available():
        assert any("no cuda device" in note for note in est.notes)


@pytest.mark.cuda
def test_cuda_prediction_matches_the_allocator():
    model = bn_cnn().cuda()
    batch = tuple(t.cuda() for t in image_batch(32))
    est = estimate_training(model, batch, optimizer="adam", loss_fn=xent)
    optimizer = torch.optim.Adam(model.parameters())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        xent(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    assert est.peak_bytes == pytest.approx(torch.cuda.max_memory_allocated(), rel=0.05)


# ---------------------------------------------------------------------------
# quick accuracy against the profiler's allocator events
# ---------------------------------------------------------------------------


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.1)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(64, 10)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(1))


@pytest.mark.parametrize(
    "name,factory,batch",
    [
        ("mlp", seed_mlp, lambda: (torch.randn(256, 1000), torch.randint(0, 10, (256,)))),
        ("bn_cnn", bn_cnn, lambda: image_batch(32)),
        ("transformer", TinyTransformer, lambda: (torch.randint(0, 1000, (16, 32)), torch.randint(0, 10, (16,)))),
    ],
)
@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adamw"])
def test_quick_accuracy_against_profiler_ground_truth(name, factory, batch, optimizer):
    from benchmarks.common.groundtruth import measure_cpu_peak
    from nnmem_callbacks.estimators.torch.inputs import OPTIMIZER_NAMES

    torch.manual_seed(0)
    model, example = factory(), batch()
    truth = measure_cpu_peak(model, example, OPTIMIZER_NAMES[optimizer], xent, "32-true")
    est = estimate_training(model, example, optimizer=optimizer, loss_fn=xent)
    assert est.peak_bytes == pytest.approx(truth["peak_bytes"], rel=0.02), (name, optimizer)


def test_cuda_target_traced_on_cpu_uses_cuda_like_dropout_and_attention():
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(64, 192)
            self.dropout = nn.Dropout(0.1)

        def forward(self, x):
            q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 4, 16).permute(2, 0, 3, 1, 4)
            out = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
            return self.dropout(out)

    if torch.cuda.is_available():
        pytest.skip("checks the CPU emulation of CUDA kernels")
    batch = torch.randn(8, 128, 64)
    cpu = estimate_training(Attention(), batch, optimizer="sgd", device="cpu")
    cuda = estimate_training(Attention(), batch, optimizer="sgd", device="cuda")
    scores = 8 * 4 * 128 * 128 * 4  # fp32 attention probabilities kept by the CPU math path
    saved_cpu = cpu.phase_breakdowns["step1/forward"]["activations"]
    saved_cuda = cuda.phase_breakdowns["step1/forward"]["activations"]
    assert saved_cpu - saved_cuda >= scores
    assert nn.functional.dropout.__name__ == "dropout"  # restored
    assert nn.functional.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


@pytest.mark.parametrize(
    "factory,batch_fn",
    [(bn_cnn, image_batch), (TinyTransformer, lambda: (torch.randint(0, 1000, (8, 32)), torch.randint(0, 10, (8,))))],
)
def test_fast_dispatch_gives_the_same_peaks_as_fake_tensor_mode_alone(monkeypatch, factory, batch_fn):
    import nnmem_callbacks.estimators.torch.estimator as estimator

    model, batch = factory(), batch_fn() if factory is TinyTransformer else batch_fn(16)
    results = {}
    for fast in (False, True):
        monkeypatch.setattr(estimator, "FAST_DISPATCH", fast)
        est = estimate_training(model, batch, optimizer="adamw", loss_fn=xent, precision="bf16-mixed")
        results[fast] = (est.peak_bytes, {p: sum(b.values()) for p, b in est.phase_breakdowns.items()})
    assert results[True] == results[False]


@pytest.mark.parametrize("make_optimizer", [torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad])
def test_scalar_constants_made_by_the_tracker_give_the_fake_modes_trace(monkeypatch, make_optimizer):
    # an optimizer's torch.tensor(0.0) step counts are made by the tracker, not the fake mode's converter; the
    # allocations and the values .item() reads (the step number in the bias corrections) must not change
    from nnmem_callbacks.estimators.torch import tracer

    model, batch = bn_cnn(), image_batch(8)
    made = []
    fast = tracer._fake_scalar_constant
    results = {}
    for use_fast in (False, True):
        monkeypatch.setattr(
            tracer,
            "_fake_scalar_constant",
            (lambda real: made.append(real) or fast(real)) if use_fast else (lambda real: tracer._UNCACHEABLE),
        )
        est = estimate_training(model, batch, optimizer=make_optimizer, loss_fn=xent, check_scaling=False)
        results[use_fast] = (est.peak_bytes, est.phase_breakdowns)
    assert made, "the optimizer made no scalar constants: the test no longer covers the fast path"
    assert results[True] == results[False]

    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode, tracer.StorageTracker("cpu", fake_mode=mode):
        step = torch.tensor(3.0, dtype=torch.float32)
        step += 1
        assert type(step).__name__ == "FakeTensor" and step.constant is not None
        assert step.item() == 4.0 and step.shape == () and step.dtype == torch.float32
        wide = torch.tensor([1.0, 2.0])  # more than one element: the fake mode's own path, no constant kept
        assert wide.constant is None


def test_foreach_and_fused_optimizers_are_simulated_as_they_run():
    model = nn.Sequential(*[nn.Linear(128, 128) for _ in range(8)])  # many parameters of equal size
    batch = torch.randn(16, 128)
    single = estimate_training(model, batch, optimizer=lambda p: torch.optim.Adam(p, foreach=False))
    foreach = estimate_training(model, batch, optimizer=lambda p: torch.optim.Adam(p, foreach=True))
    fused = estimate_training(model, batch, optimizer=lambda p: torch.optim.Adam(p, fused=True))
    step = "step2/optimizer"
    temporaries = {
        name: est.phase_breakdowns[step]["temporaries"]
        for name, est in (("single", single), ("foreach", foreach), ("fused", fused))
    }
    # single-tensor Adam holds one parameter's temporaries at a time, foreach holds them for all parameters
    weight = 128 * 128 * 4
    assert temporaries["single"] == pytest.approx(2 * weight, rel=0.05)
    assert temporaries["foreach"] >= param_bytes(model)
    assert temporaries["fused"] < temporaries["single"]
    assert all(est.method == "trace" for est in (single, foreach, fused))


def test_fast_dispatch_replays_out_variants_and_views_faithfully():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nnmem_callbacks.estimators.torch.tracer import StorageTracker

    mode = FakeTensorMode()
    tracker = StorageTracker("cpu", fake_mode=mode)
    with mode, tracker:
        a, b = torch.empty(8, 8), torch.empty(8, 8)
        for _ in range(2):  # the second round is replayed from the memo
            out = torch.empty(8, 8)
            result = torch.add(a, b, out=out)
            assert result is out
            view = a.t()
            assert view.untyped_storage() is a.untyped_storage() and view.shape == (8, 8) and view.stride() == (1, 8)
            fresh = a + b
            assert fresh.untyped_storage() is not a.untyped_storage()
            inplace = a.mul_(2)
            assert inplace is a


def test_fast_dispatch_runs_in_place_metadata_ops_every_time():
    """transpose_, t_, squeeze_... change the input's shape and strides; a memo
    replay that hands the input back unchanged would keep the old layout."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nnmem_callbacks.estimators.torch.tracer import StorageTracker

    mode = FakeTensorMode()
    tracker = StorageTracker("cpu", fake_mode=mode)
    with mode, tracker:
        for _ in range(3):  # later rounds would be replayed from the memo
            x = torch.empty(4, 6)
            assert x.transpose_(0, 1).shape == (6, 4) and x.stride() == (1, 6)
            assert x.t_().shape == (4, 6) and x.stride() == (6, 1)
            assert x.unsqueeze_(0).shape == (1, 4, 6)
            assert x.squeeze_(0).shape == (4, 6)
            assert x.swapdims_(0, 1).shape == (6, 4)
            assert x.as_strided_((3, 2), (2, 1)).shape == (3, 2) and x.stride() == (2, 1)


def test_metadata_queries_are_counted_but_never_memoised():
    """prim.device (asked by C++ for every gradient the autograd engine handles), size, stride and storage_offset
    go straight to the fake mode: counted as ops, no memo entry, no storage."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nnmem_callbacks.estimators.torch.tracer import OpMemo, StorageTracker

    mode = FakeTensorMode()
    tracker = StorageTracker("cpu", memo=OpMemo(mode))
    with mode, tracker:
        weight = torch.empty(4, 4, requires_grad=True)
        (torch.empty(3, 4) @ weight).sum().backward()
        assert weight.grad.device == torch.device("cpu")
    funcs = {key[0] for key in tracker._memo.entries}
    assert torch.ops.aten.mm.default in funcs
    assert not funcs & {torch.ops.prim.device.default, torch.ops.aten.size.default, torch.ops.aten.stride.default}
    assert tracker.op_count > len(tracker._memo.entries)


def test_the_memo_replays_missing_gradients_an_optimizers_scalars_and_its_step_count():
    """convolution_backward with an output it was not asked for (None), an element-wise op whose float differs
    in every optimizer step, and ``step_t += 1`` on the step count the fake mode keeps the value of."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nnmem_callbacks.estimators.torch.tracer import _UNCACHEABLE, OpMemo, StorageTracker

    mode = FakeTensorMode(allow_non_fake_inputs=True)  # as the estimator's: .item() reads a constant for real
    tracker = StorageTracker("cpu", memo=OpMemo(mode))
    with mode, tracker:
        conv = nn.Conv2d(3, 4, 3)
        for _ in range(2):  # the input needs no gradient: grad_input is None
            conv(torch.empty(2, 3, 8, 8)).sum().backward()
        param, avg, denom = torch.empty(5), torch.empty(5), torch.empty(5)
        for step_size in (0.1, 0.2):
            param.addcdiv_(avg, denom, value=-step_size)
        step = torch.tensor(0.0)
        step += 1
        step += 1
        assert step.item() == 2.0
    entries = {key[0]: entry for key, entry in tracker._memo.entries.items()}
    backward = entries[torch.ops.aten.convolution_backward.default]
    assert backward is not _UNCACHEABLE and ("none",) in backward[1]
    assert sum(key[0] is torch.ops.aten.addcdiv_.default for key in tracker._memo.entries) == 1
    counts = [key for key in tracker._memo.entries if key[0] is torch.ops.aten.add_.Tensor and key[1][1][0][1] == ()]
    assert not counts  # the step count never reaches the memo (the gradients' add_ does)


def test_a_cnn_with_adam_is_estimated_byte_for_byte_as_without_the_memo(monkeypatch):
    import nnmem_callbacks.estimators.torch.estimator as estimator

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 5))
    batch = (torch.randn(8, 3, 16, 16), torch.randint(0, 5, (8,)))
    logs = {}
    for fast in (False, True):
        monkeypatch.setattr(estimator, "FAST_DISPATCH", fast)
        est = estimate_training(model, batch, optimizer="adam", loss_fn=xent)
        logs[fast] = (repr(est.allocation_log), est.peak_bytes, est.peak_bytes_at(64))
    assert logs[True] == logs[False]


class _Recurrent(nn.Module):
    def __init__(self, cls, num_layers, bidirectional):
        super().__init__()
        self.rnn = cls(12, 16, num_layers=num_layers, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(16 * (2 if bidirectional else 1), 5)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


@pytest.mark.parametrize("cls", [nn.GRU, nn.RNN])
@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (2, True)])
def test_batch_first_gru_and_rnn_are_traced_like_without_the_memo(monkeypatch, cls, num_layers, bidirectional):
    """nn.GRU/nn.RNN with batch_first end in the in-place ``output.transpose_(0, 1)``;
    a memo replay of it broke backward in the second step (fallback estimate)."""
    import nnmem_callbacks.estimators.torch.estimator as estimator

    torch.manual_seed(0)
    model = _Recurrent(cls, num_layers, bidirectional)
    batch = (torch.randn(8, 10, 12), torch.randint(0, 5, (8,)))
    results = {}
    for fast in (False, True):
        monkeypatch.setattr(estimator, "FAST_DISPATCH", fast)
        est = estimate_training(model, batch, optimizer="adam", loss_fn=xent)
        assert est.method == "trace", est.notes
        results[fast] = (est.peak_bytes, {p: sum(b.values()) for p, b in est.phase_breakdowns.items()})
    assert results[True] == results[False]


def test_batch_first_bidirectional_gru_matches_the_profiler():
    from benchmarks.common.groundtruth import measure_cpu_peak
    from nnmem_callbacks.estimators.torch.inputs import OPTIMIZER_NAMES

    torch.manual_seed(0)
    model = _Recurrent(nn.GRU, 2, True)
    batch = (torch.randn(16, 12, 12), torch.randint(0, 5, (16,)))
    truth = measure_cpu_peak(model, batch, OPTIMIZER_NAMES["adam"], xent, "32-true")
    est = estimate_training(model, batch, optimizer="adam", loss_fn=xent)
    assert est.method == "trace"
    assert est.peak_bytes == pytest.approx(truth["peak_bytes"], rel=0.01)


def test_cuda_allocator_rounding_keeps_the_batch_ranges_of_piecewise_lines(monkeypatch):
    """The CUDA adjustment shifts every phase line by the allocator rounding;
    it must keep each line's batch range (the piecewise fit of non-linear growth)."""
    from nnmem_callbacks.allocators import cuda_caching as allocator
    from nnmem_callbacks.core.estimate import PhaseLine
    from nnmem_callbacks.estimators.torch import estimator

    below = PhaseLine("step2/backward", 1_000, 500, 1, 16)  # steep, valid up to the batch only
    above = PhaseLine("step2/backward", 6_000, 100, 16, None)
    seen = {}

    def scaling_lines(config, main, notes, session):
        seen["tensor_peak"] = max(main.phase_peaks.values())
        return [below, above]

    real_replay = allocator.replay

    def replay(events, *args, **kwargs):
        prediction = real_replay(events, *args, **kwargs)
        seen.setdefault("allocated", prediction.peak_allocated)  # the main trace's replay
        return prediction

    monkeypatch.setattr(estimator, "_scaling_lines", scaling_lines)
    monkeypatch.setattr(allocator, "replay", replay)
    model = nn.Sequential(nn.Linear(13, 7), nn.ReLU(), nn.Linear(7, 3))  # odd sizes: 512-byte rounding
    est = estimate_training(model, torch.randn(16, 13), optimizer="adam", device="cuda")
    rounding = seen["allocated"] - seen["tensor_peak"]
    assert rounding > 0
    assert sorted((p.min_batch, p.max_batch) for p in est.phases) == [(1, 16), (16, None)]
    assert est.peak_bytes_at(64) == above.at(64) + rounding  # without ranges: below.at(64) + rounding
    assert est.peak_bytes_at(4) == below.at(4) + rounding


def test_fallback_probe_never_creates_tensors_on_a_cuda_target():
    """The fallback's small real probe runs on the CPU even when the step would
    be traced on a CUDA device (here a fake one: only fake tensors may be on it)."""
    import dataclasses

    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten

    from nnmem_callbacks.estimators.torch.fallback import estimate_closed_form
    from nnmem_callbacks.estimators.torch.step import make_config

    class RealCudaTensors(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.created = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for item in tree_flatten(out)[0]:
                if isinstance(item, torch.Tensor) and not isinstance(item, FakeTensor) and item.device.type == "cuda":
                    self.created.append(getattr(func, "__name__", str(func)))
            return out

    torch.manual_seed(0)
    model = DataDependent()
    batch = (torch.randn(16, 64), torch.randint(0, 10, (16,)))
    cpu_config = make_config(model, batch, "adam", xent, "32-true", "cpu", 1, None, "norm")
    cuda = torch.device("cuda", 0)
    cuda_config = dataclasses.replace(cpu_config, target_device=cuda, trace_device=cuda)
    spy = RealCudaTensors()
    with spy:
        on_cuda = estimate_closed_form(cuda_config, "test", [])
    on_cpu = estimate_closed_form(cpu_config, "test", [])
    assert spy.created == []
    assert on_cuda.method == "closed-form"  # the probe ran (a real CUDA tensor fails on a CPU-only host)
    backward = "step2/backward"
    assert on_cuda.phase_breakdowns[backward]["activations"] == on_cpu.phase_breakdowns[backward]["activations"] > 0
