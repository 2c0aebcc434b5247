"""Estimates of torch.compile'd training steps (nnmem_callbacks.estimators.torch.compiled).

The figures are checked against real compiled steps (profiler allocation events) on
small models; ``python -m benchmarks.suites.compile`` holds the larger cases.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from benchmarks.common.groundtruth import measure_cpu_peak
from nnmem_callbacks.estimators.torch import inductor_compat as compat
from nnmem_callbacks.estimators.torch.compiled import find_compiled
from nnmem_callbacks.estimators.torch.estimator import estimate_training


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.GELU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.GELU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(64, 256), nn.LayerNorm(256), nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.norm(nn.functional.gelu(self.up(x))))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return MLP()


def _xent(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


CNN_BATCH = (torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))
MLP_BATCH = (torch.randn(32, 64), torch.randint(0, 10, (32,)))


def _sgd(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def test_a_compiled_step_is_predicted_from_its_graphs_and_matches_the_real_compiled_step():
    model = _cnn()
    eager = estimate_training(model, CNN_BATCH, optimizer=_sgd, loss_fn=_xent, check_scaling=False)
    compiled = torch.compile(model)
    estimate = estimate_training(compiled, CNN_BATCH, optimizer=_sgd, loss_fn=_xent, check_scaling=False)
    assert estimate.method == "trace+inductor"
    assert any("no kernel was compiled" in note for note in estimate.notes)
    # the real compiled step, after one warm-up step that compiles it
    optimizer = _sgd(compiled.parameters())
    _xent(compiled, CNN_BATCH).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    truth = measure_cpu_peak(compiled, CNN_BATCH, lambda params: optimizer, _xent, copy_model=False)["peak_bytes"]
    assert abs(estimate.peak_bytes - truth) / truth < 0.005
    assert eager.peak_bytes > truth * 1.02  # the eager figure would have been wrong here: BatchNorm + GELU fuse


def test_module_compile_a_compiled_forward_attribute_and_a_compiled_loss_are_found():
    model = _mlp()
    assert find_compiled(model, None) is None
    model.compile()
    assert [t.kind for t in find_compiled(model, None).targets] == ["call_impl"]
    other = _mlp()
    other.forward = torch.compile(other.forward)
    assert [t.kind for t in find_compiled(other, None).targets] == ["attribute"]
    plain = _mlp()
    step = find_compiled(plain, torch.compile(_xent))
    assert [t.kind for t in step.targets] == ["loss"] and step.loss_fn is _xent
    estimates = [
        estimate_training(candidate, MLP_BATCH, optimizer="sgd", loss_fn=loss, check_scaling=False)
        for candidate, loss in ((model, _xent), (other, _xent), (plain, torch.compile(_xent)))
    ]
    assert [e.method for e in estimates] == ["trace+inductor"] * 3
    assert estimates[0].peak_bytes == estimates[1].peak_bytes


def test_module_compile_of_a_torch_nn_container_compiles_nothing_as_in_the_real_run():
    from torch._dynamo.testing import CompileCounter

    real = nn.Sequential(nn.Linear(64, 10))
    counter = CompileCounter()
    real.compile(backend=counter)
    real(MLP_BATCH[0]).sum().backward()
    assert counter.frame_count == 0  # Dynamo skips torch.nn's own frames: the real step runs eagerly
    sequential = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10))
    sequential.compile()
    estimate = estimate_training(sequential, MLP_BATCH, optimizer="sgd", loss_fn=_xent, check_scaling=False)
    assert estimate.method == "trace"
    assert any("Dynamo compiled no graph" in note for note in estimate.notes)


def test_graph_breaks_give_several_graphs_and_fullgraph_on_them_falls_back_with_a_warning():
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            torch._dynamo.graph_break()
            return self.b(torch.tanh(h))

    estimate = estimate_training(
        torch.compile(Broken()), MLP_BATCH, optimizer="sgd", loss_fn=_xent, check_scaling=False
    )
    assert estimate.method == "trace+inductor"
    assert any("handed 2 graph(s)" in note for note in estimate.notes)
    eager = estimate_training(Broken(), MLP_BATCH, optimizer="sgd", loss_fn=_xent, check_scaling=False)
    with pytest.warns(RuntimeWarning, match="cannot model the torch.compile'd step.*eager step is estimated instead"):
        fallback = estimate_training(
            torch.compile(Broken(), fullgraph=True), MLP_BATCH, optimizer="sgd", loss_fn=_xent, check_scaling=False
        )
    assert fallback.method == "trace" and fallback.peak_bytes == eager.peak_bytes
    assert any("usually higher than the compiled step" in note for note in fallback.notes)


def test_a_backend_that_cannot_be_modelled_and_a_model_compiled_twice_fall_back_to_the_eager_step():
    def my_backend(graph_module, example_inputs):
        return graph_module.forward

    eager = estimate_training(_mlp(), MLP_BATCH, optimizer="sgd", loss_fn=_xent, check_scaling=False)
    with pytest.warns(RuntimeWarning, match="backend 'my_backend'"):
        custom = estimate_training(
            torch.compile(_mlp(), backend=my_backend), MLP_BATCH, optimizer="sgd", loss_fn=_xent, check_scaling=False
        )
    assert custom.method == "trace" and custom.peak_bytes == eager.peak_bytes
    inner = _mlp()
    inner.compile()
    with pytest.warns(RuntimeWarning, match="compiled twice"):
        twice = estimate_training(torch.compile(inner), MLP_BATCH, optimizer="sgd", loss_fn=_xent, check_scaling=False)
    assert twice.peak_bytes == eager.peak_bytes


def test_aot_eager_runs_the_partitioner_only():
    estimate = estimate_training(
        torch.compile(_mlp(), backend="aot_eager"), MLP_BATCH, optimizer="sgd", loss_fn=_xent, check_scaling=False
    )
    assert estimate.method == "trace+aot_eager"
    assert any("AOTAutograd's partitioned forward and backward graphs ran on fake tensors" in n for n in estimate.notes)


def test_the_estimate_changes_nothing_of_the_users_model_rng_or_dynamo_caches():
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    model = _mlp()
    compiled = torch.compile(model)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    parameters = [id(p) for p in model.parameters()]
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    estimate = estimate_training(compiled, MLP_BATCH, optimizer="adamw", loss_fn=_xent)
    assert estimate.method == "trace+inductor"
    assert torch.equal(torch.get_rng_state(), rng)
    assert [id(p) for p in model.parameters()] == parameters
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    # none of the estimate's fake compiles is left where the user's real compile would find it
    leftover = [
        entry
        for entry in _debug_get_cache_entry_list(type(model).forward.__code__)
        if compat._is_ours(getattr(entry, "backend", None))
    ]
    assert leftover == []
    assert not any(compat._is_ours(backend) for backend in torch._dynamo.eval_frame.cached_backends.values())
    # the user's compiled model still trains, with real kernels
    loss = _xent(compiled, MLP_BATCH)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_batch_lines_come_from_compiled_traces_and_agree_with_a_direct_compiled_estimate():
    model = _cnn()
    estimate = estimate_training(torch.compile(model, dynamic=True), CNN_BATCH, optimizer="sgd", loss_fn=_xent)
    assert estimate.method == "trace+inductor"
    direct = estimate.verifier(48)
    assert direct.method == "trace+inductor"
    assert abs(estimate.peak_bytes_at(48) - direct.peak_bytes) / direct.peak_bytes < 0.01


def test_max_autotune_and_cuda_graph_modes_are_named_as_not_modelled():
    estimate = estimate_training(
        torch.compile(_mlp(), mode="max-autotune"), MLP_BATCH, optimizer="sgd", loss_fn=_xent, check_scaling=False
    )
    assert estimate.method == "trace+inductor"
    text = " ".join(estimate.notes)
    assert "not modelled: max_autotune=True" in text
    assert "not modelled: triton.cudagraphs=True" in text


def test_a_compiled_optimizer_step_is_predicted_from_its_graph():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
    batch = (torch.randn(32, 256), torch.randint(0, 10, (32,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    eager = estimate_training(model, batch, optimizer=optimizer, loss_fn=_xent, check_scaling=False)
    optimizer.step = torch.compile(optimizer.step)
    estimate = estimate_training(model, batch, optimizer=optimizer, loss_fn=_xent, check_scaling=False)
    assert estimate.method == "trace+inductor"
    assert any("the optimizer step" in note for note in estimate.notes)
    assert estimate.breakdown["optimizer_state"] == eager.breakdown["optimizer_state"] > 0
    _xent(model, batch).backward()
    optimizer.step()  # compiles the real one
    optimizer.zero_grad(set_to_none=True)
    truth = measure_cpu_peak(model, batch, lambda params: optimizer, _xent, copy_model=False)["peak_bytes"]
    assert abs(estimate.peak_bytes - truth) / truth < 0.005
    assert eager.peak_bytes > truth * 1.1  # the eager update's foreach temporaries, fused away when compiled


def test_a_cuda_target_without_cuda_uses_inductors_cpu_lowering_and_says_so():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimate = estimate_training(
            torch.compile(_mlp()), MLP_BATCH, optimizer="sgd", loss_fn=_xent, device="cuda:h100", check_scaling=False
        )
    assert estimate.method == "trace+inductor"
    assert any("Inductor's CPU lowering stood in" in note for note in estimate.notes)


class _Attention(nn.Module):
    """LayerNorm and a softmax over the last dimension: Inductor fuses their outer loops with a kernel-local buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.norm, self.out = nn.Linear(32, 32), nn.LayerNorm(32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.q(x))
        return self.out((torch.softmax(h @ h.transpose(-1, -2) / 4, -1) @ h).mean(1))


@pytest.mark.parametrize("build", [_Attention, _cnn], ids=["attention", "bn_cnn"])
def test_scalar_cpp_kernels_leave_every_allocation_of_the_compiled_estimate_as_it_was(monkeypatch, build):
    from torch._inductor import metrics

    def estimate(scalar: bool):
        monkeypatch.setattr(compat, "SCALAR_CPP_KERNELS", scalar)
        torch.manual_seed(0)
        model, x = build(), torch.randn(8, 16, 32) if build is _Attention else torch.randn(8, 3, 16, 16)
        batch = (x, torch.randint(0, 4, (8,)))
        metrics.reset()
        est = estimate_training(
            torch.compile(model),
            batch,
            optimizer="adamw",
            loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]),
        )
        return est, metrics.generated_cpp_vec_kernel_count, list(metrics.cpp_outer_loop_fused_inner_counts)

    fast, fast_vectorized, fast_outer = estimate(True)
    real, real_vectorized, real_outer = estimate(False)
    assert fast_vectorized < real_vectorized  # the shortcut was taken
    assert fast_outer == real_outer  # outer-loop fusion (and its kernel-local buffers) decided as in a real compile
    assert repr(fast.allocation_log) == repr(real.allocation_log)
    assert [fast.peak_bytes_at(b) for b in (1, 8, 64)] == [real.peak_bytes_at(b) for b in (1, 8, 64)]


def test_the_internals_used_exist_in_the_installed_torch():
    compat.check_supported()
    settings = compat.compile_settings(torch.compile(nn.Linear(2, 2), mode="reduce-overhead"))
    assert settings.backend == "inductor" and settings.options.get("triton.cudagraphs") is True
    assert compat.compile_settings(torch.compile(nn.Linear(2, 2), backend="aot_eager")).backend == "aot_eager"


@pytest.mark.lightning
@pytest.mark.parametrize("how", ["fit_compiled_module", "compiled_inner_model"])
def test_the_lightning_callback_plans_on_the_compiled_step_and_measures_it(tmp_path, how):
    pl = pytest.importorskip("pytorch_lightning")
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from _lightning_models import DataModule, trainer_kwargs

    from nnmem_callbacks.lightning import MemoryBudgetCallback

    class Wide(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(32, 512), nn.LayerNorm(512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 4)
            )
            if how == "compiled_inner_model":
                self.net = torch.compile(self.net)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    module = Wide()
    given = torch.compile(module) if how == "fit_compiled_module" else module
    callback = MemoryBudgetCallback(budget="1TiB")
    trainer = pl.Trainer(**trainer_kwargs(tmp_path, limit_train_batches=3), callbacks=[callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(given, datamodule=DataModule(batch_size=64))
    assert callback.estimate.method == "trace+inductor"
    row = callback.measurements[0]
    assert row["kind"] == "tensors" and abs(row["relative_error"]) < 0.01


def test_the_cli_estimates_the_compiled_step_when_asked(capsys):
    import json
    import os

    from nnmem_callbacks import cli

    factory = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "models.py") + ":mlp"
    base = ["estimate", factory, "-i", "1000", "-b", "64", "--device", "cpu", "--json"]
    assert cli.main([*base, "--compile", "--compile-mode", "max-autotune-no-cudagraphs"]) == 0
    document = json.loads(capsys.readouterr().out)
    estimate = document.get("estimate", document)
    assert estimate["method"] == "trace+inductor"
    assert any("not modelled: max_autotune=True" in note for note in estimate["notes"])
    assert cli.main([*base, "--compile-mode", "max-autotune"]) == 2
    assert "--compile-mode max-autotune needs --compile" in capsys.readouterr().err


def test_an_eager_fallback_leaves_the_users_own_compile_working():
    from torch._dynamo.testing import CompileCounter

    model = _mlp()
    counter = CompileCounter()  # a custom backend: the estimate falls back to the eager step
    model.compile(backend=counter)
    with pytest.warns(RuntimeWarning, match="cannot model"):
        estimate = estimate_training(model, MLP_BATCH, optimizer="sgd", loss_fn=_xent, check_scaling=False)
    assert estimate.method == "trace" and counter.frame_count == 0
    model(MLP_BATCH[0])  # the user's first real call compiles, as it would have without the estimate
    assert counter.frame_count == 1
