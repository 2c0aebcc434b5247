"""Fast checks of the benchmark infrastructure: ground truth against hand counts, and the zoo."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # benchmarks/ is not an installed package
    sys.path.insert(0, str(_ROOT))

from benchmarks.common import zoo  # noqa: E402
from benchmarks.common.baselines import memtracker_peak, rule_of_thumb_bytes  # noqa: E402
from benchmarks.common.groundtruth import live_bytes, measure_cpu_peak  # noqa: E402

F32 = 4


def _two_layer() -> tuple[nn.Module, tuple, int]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1000, 100), nn.ReLU(), nn.Linear(100, 10))
    batch = (torch.randn(64, 1000), torch.randint(0, 10, (64,)))
    params = sum(p.numel() for p in model.parameters()) * F32
    return model, batch, params


def _xent(model: nn.Module, batch: tuple) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def test_baseline_counts_params_and_batch():
    model, batch, params = _two_layer()
    r = measure_cpu_peak(model, batch, lambda p: torch.optim.SGD(p, lr=0.1), _xent)
    assert r["baseline_bytes"] == params + 64 * 1000 * F32 + 64 * 8


def test_forward_peak_matches_hand_count():
    # ReLU is computed while the Linear output it reads is still alive: 2 x (64 x 100) floats.
    model, batch, _ = _two_layer()
    r = measure_cpu_peak(model, batch, lambda p: torch.optim.SGD(p, lr=0.1), _xent)
    fwd = r["phase_peaks"]["step1/forward"] - r["baseline_bytes"]
    assert fwd == pytest.approx(2 * 64 * 100 * F32, rel=0.02)


def test_sgd_peak_is_grads_plus_live_activation_gradient():
    # At the last AccumulateGrad: all grads + grad of the hidden pre-activation (+ loss scalars).
    model, batch, params = _two_layer()
    r = measure_cpu_peak(model, batch, lambda p: torch.optim.SGD(p, lr=0.1), _xent)
    hand = r["baseline_bytes"] + params + 64 * 100 * F32
    assert r["peak_bytes"] == pytest.approx(hand, rel=0.02)
    assert r["peak_phase"].endswith("/backward")
    assert r["end_bytes"] == r["baseline_bytes"]  # grads set to None, SGD keeps no state


def test_adam_state_is_two_moments():
    model, batch, params = _two_layer()
    r = measure_cpu_peak(model, batch, lambda p: torch.optim.Adam(p, lr=1e-3), _xent)
    state = r["end_bytes"] - r["baseline_bytes"]
    assert state == pytest.approx(2 * params, rel=0.01)
    # peak: during step 1's update, at least grads + both moments are live
    assert r["peak_bytes"] >= r["baseline_bytes"] + 3 * params


def test_bf16_autocast_runs_and_differs():
    model, batch, _ = _two_layer()
    opt = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    fp32 = measure_cpu_peak(model, batch, opt, _xent, "32-true")
    bf16 = measure_cpu_peak(model, batch, opt, _xent, "bf16-mixed")
    assert fp32["phase_peaks"]["step1/forward"] != bf16["phase_peaks"]["step1/forward"]


def test_fresh_copy_leaves_model_untouched():
    model, batch, _ = _two_layer()
    before = [p.detach().clone() for p in model.parameters()]
    measure_cpu_peak(model, batch, lambda p: torch.optim.SGD(p, lr=0.1), _xent)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_live_bytes_counts_tied_weights_and_views_once():
    emb = nn.Embedding(100, 16)
    head = nn.Linear(16, 100, bias=False)
    head.weight = emb.weight
    assert live_bytes([emb.weight, head.weight, emb.weight[:10]]) == 100 * 16 * F32


def test_rule_of_thumb_formula():
    assert rule_of_thumb_bytes(nn.Linear(10, 10), 4, 10.0) == 4 * (3 * 110 + 2 * 10 * 4)


def test_memtracker_crash_is_reported_not_raised():
    case = zoo.get_case("data_dependent")
    result = memtracker_peak(case.make_model(), case.make_batch(2, "cpu"), zoo.OPTIMIZERS["adam"], case.loss_fn)
    assert result["peak_bytes"] is None
    assert result["error"]


@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_zoo_case_builds_and_runs_forward(name):
    case = zoo.get_case(name)
    torch.manual_seed(0)
    model = case.make_model()
    batch = case.make_batch(2, "cpu")
    loss = case.loss_fn(model, batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert case.batch_size >= 1


def test_zoo_names_and_helpers():
    assert set(zoo.ZOO) >= {
        "mlp",
        "bn_cnn",
        "resnet18",
        "resnet50",
        "lstm",
        "transformer_encoder",
        "gpt2",
        "vit",
        "unet",
        "embedding_heavy",
        "checkpointed",
        "data_dependent",
    }
    assert [c.name for c in zoo.ZOO.values() if c.data_dependent] == ["data_dependent"]
    assert set(zoo.OPTIMIZERS) == {"sgd_momentum", "adam", "adamw"}
    assert zoo.PRECISIONS == ("32-true", "bf16-mixed")
    with pytest.raises(KeyError, match="valid"):
        zoo.get_case("nope")


def test_outside_cases_are_marked_and_not_in_the_default_run():
    assert zoo.OUTSIDE_CASES == ("hf_bert", "hf_llama", "hf_t5", "hf_vit", "hf_convnext")
    assert all(zoo.ZOO[name].outside for name in zoo.OUTSIDE_CASES)
    assert set(zoo.DEFAULT_CASES).isdisjoint(zoo.OUTSIDE_CASES)
    assert set(zoo.DEFAULT_CASES) | set(zoo.OUTSIDE_CASES) == set(zoo.ZOO)
    assert "gpt2" in zoo.DEFAULT_CASES and not zoo.ZOO["gpt2"].outside
    batch = zoo.get_case("hf_bert").make_batch(4, "cpu")
    assert (batch["attention_mask"] == 0).any(), "the BERT case must carry padding"


class _FakeCudaAllocator:
    """Just enough of torch.cuda for measure_cuda_peak: counters the fake steps move."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.allocated = 0
        self.peak = 0
        self.reserved = 0
        self.set_device_calls = []

    def set_device(self, device):
        # torch 2.11 raises for an unindexed device
        if isinstance(device, torch.device) and device.index is None:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        self.set_device_calls.append(device)

    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated)

    def install(self, monkeypatch, groundtruth) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "set_device", self.set_device)
        monkeypatch.setattr(cuda, "current_device", lambda: self.index)
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: self.reserved)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda device=None: self.reserved)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: setattr(self, "peak", self.allocated))
        monkeypatch.setattr(
            cuda, "mem_get_info", lambda device=None: (80 * 2**30 - self.reserved - 500 * 2**20, 80 * 2**30)
        )
        monkeypatch.setattr(groundtruth, "_fresh", lambda model, batch, device, seed: (model, batch))

        def steps(model, batch, optimizer, loss_fn, precision, device_type, phase, n_steps):
            for step in range(1, n_steps + 1):
                with phase(f"step{step}/forward"):
                    self.alloc(100)
                    if step == 1:
                        self.alloc(32 * 2**20)  # the first GEMM's cuBLAS workspace, kept
                    self.alloc(-100)
            return [0.0] * n_steps

        monkeypatch.setattr(groundtruth, "_steps", steps)


@pytest.mark.parametrize("device,index", [("cuda", 3), ("cuda:1", 1)])
def test_measure_cuda_peak_passes_an_indexed_device_to_set_device(monkeypatch, device, index):
    from benchmarks.common import groundtruth

    fake = _FakeCudaAllocator(index=3)
    fake.install(monkeypatch, groundtruth)
    model, batch, _ = _two_layer()
    result = groundtruth.measure_cuda_peak(model, batch, lambda p: torch.optim.SGD(p, lr=0.1), _xent, device=device)
    assert fake.set_device_calls == [torch.device("cuda", index)]
    # a fresh process: nothing left over, and the workspace of the first GEMM is inside the peak
    assert result["leftover_bytes"] == 0
    assert result["peak_bytes"] == 32 * 2**20 + 100
    assert result["overhead_bytes"] == 500 * 2**20


def test_accuracy_runs_every_cuda_combination_in_its_own_process(monkeypatch):
    from benchmarks.suites import accuracy

    calls = []
    original = accuracy.run_case_isolated

    def spy(name, optimizers, precisions, device, with_memtracker=True, timeout_s=600.0):
        calls.append((tuple(optimizers), tuple(precisions)))
        if len(optimizers) * len(precisions) > 1:
            return original(name, optimizers, precisions, device, with_memtracker, timeout_s)
        return [{"case": name, "optimizer": optimizers[0], "precision": precisions[0]}]

    monkeypatch.setattr(accuracy, "run_case_isolated", spy)
    rows = accuracy.run_case_isolated("mlp", ["adam", "sgd_momentum"], ["32-true", "bf16-mixed"], "cuda")
    assert len(rows) == 4
    assert sorted(calls[1:]) == sorted(
        ((o,), (p,)) for o in ("adam", "sgd_momentum") for p in ("32-true", "bf16-mixed")
    )


def test_accuracy_measures_the_cuda_truth_before_the_estimate(monkeypatch):
    from benchmarks.suites import accuracy

    order = []
    monkeypatch.setattr(accuracy, "_estimate_stage", lambda row, *a: order.append("estimate"))
    monkeypatch.setattr(accuracy, "_truth_stage", lambda row, *a: order.append("truth"))
    monkeypatch.setattr(accuracy, "_baselines", lambda row, *a: None)
    case = zoo.get_case("mlp")
    for device in ("cuda", "cpu"):
        accuracy.run_combo(case, None, None, "adam", "32-true", device, {}, with_memtracker=False)
    assert order == ["truth", "estimate", "estimate", "truth"]
