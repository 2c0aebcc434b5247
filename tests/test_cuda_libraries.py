"""CUDA library model: cuBLAS workspaces as allocations, cuDNN conv workspaces, context overhead.

Every test runs on a CPU host: CUDA targets are traced on CPU kernels, and the
device paths are driven by a fake driver (monkeypatched ``torch.cuda``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from nnmem_callbacks.allocators import cuda_caching as allocator  # noqa: E402
from nnmem_callbacks.core.estimate import Category  # noqa: E402
from nnmem_callbacks.estimators.torch.cuda import libraries as cuda_libraries
from nnmem_callbacks.estimators.torch.estimator import estimate_training  # noqa: E402
from nnmem_callbacks.estimators.torch.tracer import StorageTracker  # noqa: E402
from nnmem_callbacks.hardware import cuda_tables  # noqa: E402

MiB = 2**20
_ENV = ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "TORCH_CUBLASLT_UNIFIED_WORKSPACE")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    if not torch.cuda.is_available():
        yield
        return
    pytest.skip("these tests drive the no-device paths and fake drivers; a real GPU is present")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))


def _estimate(model=None, batch_size=64, **kwargs):
    model = model or _mlp()
    return estimate_training(
        model, torch.empty(batch_size, 256, device="meta"), optimizer="adam", device="cuda", **kwargs
    )


# ---------------------------------------------------------------------------
# cuBLAS workspaces in the trace
# ---------------------------------------------------------------------------


def test_forward_and_backward_threads_each_get_a_cublas_workspace():
    est = _estimate()
    assert est.breakdown[str(Category.WORKSPACES)] == 2 * 32 * MiB
    # forward: only the user's thread has run a GEMM
    assert est.phase_breakdowns["step1/forward"][str(Category.WORKSPACES)] == 32 * MiB
    assert est.phase_breakdowns["step1/backward"][str(Category.WORKSPACES)] == 64 * MiB
    # step 2 reuses them
    assert est.phase_breakdowns["step2/backward"][str(Category.WORKSPACES)] == 64 * MiB
    assert any("cuBLAS workspaces from the caching allocator" in note for note in est.notes)
    assert est.reserved_bytes >= est.peak_bytes


def test_workspace_size_follows_cublas_workspace_config_and_stays_out_of_the_slope(monkeypatch):
    default = _estimate()
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8")
    small = _estimate()
    size = (4096 * 2 + 16 * 8) * 1024
    assert small.breakdown[str(Category.WORKSPACES)] == 2 * size
    assert small.per_sample_bytes == default.per_sample_bytes
    assert default.peak_bytes - small.peak_bytes == pytest.approx(2 * (32 * MiB - size), abs=64 * 1024)


def test_cpu_targets_have_no_library_workspaces():
    est = estimate_training(_mlp(), torch.empty(64, 256), optimizer="adam")
    assert est.breakdown[str(Category.WORKSPACES)] == 0
    assert est.overhead_bytes == 0


def test_separate_cublaslt_workspace_only_when_unification_is_off(monkeypatch):
    unified = _estimate()
    monkeypatch.setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "0")
    separate = _estimate()
    # the forward's Linear-with-bias runs addmm (cuBLASLt epilogue); the backward runs mm only
    assert unified.breakdown[str(Category.WORKSPACES)] == 64 * MiB
    assert separate.breakdown[str(Category.WORKSPACES)] == 64 * MiB + 1 * MiB


def test_first_matmul_matches_the_h100_allocator_reading():
    # cuda_facts.json: one 512-byte tensor, then the first fp32 matmul of 512x512 -> memory_allocated 35,652,096
    model = cuda_libraries.LibraryModel(capability=(9, 0), cublas_bytes=cuda_tables.cublas_workspace_bytes((9, 0), {}))
    with FakeTensorMode() as mode:
        tracker = StorageTracker("cuda", fake_mode=mode, libraries=model)
        with tracker:
            tracker.set_phase("step1/forward")
            first = torch.empty(128)
            tracker.register(first, Category.INPUTS)
            x = torch.empty(512, 512)
            out = x @ x
            del out
            tracker.end()
        result = tracker.result()
    live = sum(size if size >= 0 else 0 for _, size in result.events)  # every allocation
    freed = {key for key, size in result.events if size < 0}
    sizes = {key: size for key, size in result.events if size >= 0}
    allocated_at_end = live - sum(sizes[key] for key in freed)
    assert allocated_at_end == 35_652_096 - 512 * 512 * 4  # the output (1 MiB) was freed here
    prediction = allocator.replay(result.events)
    assert prediction.peak_allocated == 35_652_096
    # and the reserve: a 2 MiB small segment for the tensors, another for the output, 32 MiB for the workspace
    assert prediction.peak_reserved == 37_748_736  # cuda_facts.json after_fp32_matmul "reserved"


def test_conv_forward_workspace_from_the_table_matches_the_measured_layer():
    # cuda_facts.json: 64->64 3x3 on 32x64x56x56 fp32: the peak rose 25,838,080 B beyond the output
    model = cuda_libraries.LibraryModel(capability=(9, 0))
    with FakeTensorMode() as mode:
        tracker = StorageTracker("cuda", fake_mode=mode, libraries=model)
        with tracker:
            tracker.set_phase("step1/forward")
            x = torch.empty(32, 64, 56, 56)
            w = torch.empty(64, 64, 3, 3)
            tracker.register(x, Category.INPUTS)
            tracker.register(w, Category.PARAMETERS)
            before = tracker.current
            out = torch.nn.functional.conv2d(x, w, padding=1)
            after = tracker.current
            tracker.end()
        result = tracker.result()
    output = after - before
    assert output == 32 * 64 * 56 * 56 * 4
    assert result.phase_peaks["step1/forward"] - before - output == 25_838_080
    del out


def test_reduced_precision_convolutions_have_no_table_workspace_and_fp32_backward_is_noted():
    conv = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 4))
    batch = torch.empty(4, 3, 16, 16, device="meta")
    bf16 = estimate_training(conv, batch, optimizer="sgd", device="cuda", precision="bf16-mixed")
    fp32 = estimate_training(conv, batch, optimizer="sgd", device="cuda")
    assert not any("not modelled" in note for note in bf16.notes)
    assert any("not modelled" in note and "backward float32" in note for note in fp32.notes)
    assert any("cuDNN aten.convolution" in note for note in fp32.notes)


# ---------------------------------------------------------------------------
# sizes from the running torch, context from the device (fake driver)
# ---------------------------------------------------------------------------


def _fake_device(monkeypatch, *, capability=(8, 0), free=70 * 2**30, total=80 * 2**30, reserved=9 * 2**30):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=None: (free, total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index=None: reserved)
    loaded = []
    monkeypatch.setattr(
        cuda_libraries, "load_libraries", lambda device, dtype, gemm, cudnn: loaded.append((device, dtype, gemm, cudnn))
    )
    return loaded


def test_library_sizes_come_from_the_device_capability_and_the_running_torch(monkeypatch):
    _fake_device(monkeypatch, capability=(8, 0))
    monkeypatch.delattr(torch._C, "_cuda_getCublasWorkspaceSize", raising=False)
    notes: list[str] = []
    model = cuda_libraries.library_model(torch.device("cuda"), notes)
    assert model.capability == (8, 0)
    assert model.cublas_bytes == 4096 * 1024 * 2 + 16 * 1024 * 8
    assert not notes  # nothing assumed
    monkeypatch.setattr(torch._C, "_cuda_getCublasWorkspaceSize", lambda: 12 * MiB, raising=False)
    model = cuda_libraries.library_model(torch.device("cuda"), notes)
    assert model.cublas_bytes == 12 * MiB and model.source == "the running torch"


def test_device_overhead_is_read_after_the_bounded_probe(monkeypatch):
    loaded = _fake_device(monkeypatch)
    notes: list[str] = []
    overhead = cuda_libraries.device_overhead(torch.device("cuda"), notes, reduced_dtype=torch.bfloat16, cudnn=False)
    assert overhead == 80 * 2**30 - 70 * 2**30 - 9 * 2**30
    assert loaded == [(torch.device("cuda", 0), torch.bfloat16, True, False)]
    assert any("read from the device" in note and "bfloat16" in note for note in notes)


def test_device_overhead_without_a_device_comes_from_the_table(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    notes: list[str] = []
    overhead = cuda_libraries.device_overhead(torch.device("cuda"), notes, capability=(9, 0))
    assert overhead == 1_015_873_536 - 211_812_352  # cuda_facts.json after_conv_bwd: both libraries loaded
    assert any("from the table" in note and "cuBLAS and cuDNN" in note for note in notes)
    figures = cuda_tables.CONTEXT_TABLE[(9, 13)]
    assert cuda_libraries.device_overhead(torch.device("cuda"), [], gemm=False, cudnn=False) == figures.after_init
    # the MLP runs GEMMs and no cuDNN layer: the zoo's mlp figure
    est = _estimate()
    assert est.overhead_bytes == figures.gemm == 787_283_968
    assert est.device_bytes == est.reserved_bytes + est.overhead_bytes


def test_estimate_asks_for_the_libraries_the_run_uses(monkeypatch):
    calls = []

    def spy(device, notes, *, reduced_dtype=None, gemm=True, cudnn=True, capability=None):
        calls.append((reduced_dtype, gemm, cudnn, capability))
        return 123

    monkeypatch.setattr(cuda_libraries, "device_overhead", spy)
    est = _estimate(precision="bf16-mixed")
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    estimate_training(conv, torch.empty(2, 3, 8, 8, device="meta"), optimizer="sgd", device="cuda")
    only_conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    estimate_training(only_conv, torch.empty(2, 3, 8, 8, device="meta"), optimizer="sgd", device="cuda")
    assert est.overhead_bytes == 123
    assert calls == [(torch.bfloat16, True, False, (9, 0)), (None, True, True, (9, 0)), (None, False, True, (9, 0))]


def test_context_table_falls_back_to_the_nearest_stack():
    figures, exact = cuda_tables.context_figures((8, 6), 12)
    assert not exact and figures is cuda_tables.CONTEXT_TABLE[(9, 13)]


def test_cublas_workspace_config_parsing_follows_pytorch():
    assert (
        cuda_tables.cublas_workspace_bytes((9, 0), {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8"})
        == (4096 * 2 + 16 * 8) * 1024
    )
    assert cuda_tables.cublas_workspace_bytes((9, 0), {"CUBLAS_WORKSPACE_CONFIG": "garbage"}) == 32 * MiB
    assert cuda_tables.cublas_workspace_bytes((7, 5), {}) == 4096 * 1024 * 2 + 16 * 1024 * 8
    assert (
        cuda_tables.cublaslt_workspace_bytes((7, 5), {"CUBLASLT_WORKSPACE_SIZE": str(64 * 1024)})
        == 4096 * 1024 * 2 + 16 * 1024 * 8
    )
    assert (
        cuda_tables.cublaslt_workspace_bytes(
            (7, 5), {"CUBLASLT_WORKSPACE_SIZE": str(64 * 1024), "TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"}
        )
        == 64 * MiB
    )


def test_conv_table_rejects_an_unknown_direction():
    with pytest.raises(ValueError, match="'forward' or 'backward'"):
        cuda_tables.conv_workspace_rule((9, 0), "float32", "sideways")


# ---------------------------------------------------------------------------
# cuDNN convolution probe (fake meter, real CPU kernels) and cudnn.benchmark
# ---------------------------------------------------------------------------


class _FakeMeter:
    """Allocator counters as a device would report them: outputs plus a workspace of 1000 + 10 * batch.

    ``batches`` are the batch sizes the probe is expected to run, in order.
    """

    def __init__(self, output_bytes_per_sample: int, batches: tuple[int, ...] = (1, 2)) -> None:
        self.output = output_bytes_per_sample
        self.batches = batches
        self.calls = 0

    def start(self) -> int:
        self.calls += 1
        return 5_000  # what was allocated before the call

    def peak(self) -> int:
        batch = self.batches[self.calls - 1]
        return 5_000 + self.output * batch + self.workspace(batch)

    def workspace(self, batch: int) -> int:
        return 1000 + 10 * batch


def _two_convolutions(probe) -> tuple[list[int], "cuda_libraries.LibraryModel"]:
    model = cuda_libraries.LibraryModel(capability=(9, 0), conv_probe=probe)
    with FakeTensorMode() as mode:
        tracker = StorageTracker("cuda", fake_mode=mode, libraries=model)
        with tracker:
            tracker.set_phase("step1/forward")
            x = torch.empty(32, 3, 8, 8)
            w = torch.empty(8, 3, 3, 3)
            first = torch.nn.functional.conv2d(x, w)
            second = torch.nn.functional.conv2d(x, w)
            tracker.end()
        result = tracker.result()
    assert result.workspace_ops["cuDNN aten.convolution"] == 2
    del first, second
    return [size for _, size in result.events if size > 0], model


def test_conv_probe_measures_a_small_layer_at_the_training_batch_once():
    class PlanChangesWithTheBatch(_FakeMeter):
        def workspace(self, batch):  # like cuDNN's heuristics: another plan at batch 32, nothing like batch 1 and 2
            return 520 * 2**20 if batch >= 16 else 1000

    probe = cuda_libraries.ConvProbe(torch.device("cpu"), meter=PlanChangesWithTheBatch(8 * 6 * 6 * 4, batches=(32,)))
    sizes, model = _two_convolutions(probe)
    assert probe.runs == 1 and len(probe.exact) == 1 and not probe.fits
    assert sizes.count(520 * 2**20) == 2
    note = next(note for note in model.notes({}) if "measured on the device" in note)
    assert "at the traced batch" in note and "resets the CUDA peak" in note


def test_conv_probe_fits_a_large_layer_from_batch_1_and_2():
    probe = cuda_libraries.ConvProbe(torch.device("cpu"), meter=_FakeMeter(8 * 6 * 6 * 4), exact_bytes=1024)
    sizes, model = _two_convolutions(probe)
    assert probe.runs == 2 and len(probe.fits) == 1 and not probe.exact
    assert sizes.count(1000 + 10 * 32) == 2
    note = next(note for note in model.notes({}) if "measured on the device" in note)
    assert "fitted from batch 1 and 2" in note


def test_one_dimensional_convolutions_are_probed_and_not_taken_from_the_2d_table():
    x, w = torch.zeros(4, 6, 50), torch.zeros(8, 6, 3)
    args = (x, w, None, [1], [0], [1], False, [0], 1)
    probe = cuda_libraries.ConvProbe(torch.device("cpu"), meter=_FakeMeter(8 * 48 * 4, batches=(4,)))
    probed = cuda_libraries.LibraryModel(capability=(9, 0), conv_probe=probe)
    assert probed.transient(torch.ops.aten.convolution, args, None) == 1000 + 10 * 4
    assert probed.probed["forward"] == 1
    table_only = cuda_libraries.LibraryModel(capability=(9, 0))
    assert table_only.transient(torch.ops.aten.convolution, args, None) == 0
    assert table_only.unmodelled["forward float32 1-D"] == 1
    assert any("1-D" in note for note in table_only.notes({}))


def test_conv_probe_failure_falls_back_to_the_table():
    class Refusing:
        def start(self):
            raise RuntimeError("CUDA out of memory")

    probe = cuda_libraries.ConvProbe(torch.device("cpu"), meter=Refusing())
    model = cuda_libraries.LibraryModel(capability=(9, 0), conv_probe=probe)
    x, w = torch.zeros(2, 4, 5, 5), torch.zeros(4, 4, 3, 3)
    assert model.transient(
        torch.ops.aten.convolution, (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), None
    ) == (x.numel() * 4 + w.numel() * 4 + 512)
    assert probe.failed["RuntimeError"] == 1


def test_cudnn_benchmark_adds_a_first_step_note(monkeypatch):
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    batch = torch.empty(2, 3, 8, 8, device="meta")
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    on = estimate_training(conv, batch, optimizer="sgd", device="cuda")
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    off = estimate_training(conv, batch, optimizer="sgd", device="cuda")
    assert any("cudnn.benchmark is on" in note for note in on.notes)
    assert not any("cudnn.benchmark is on" in note for note in off.notes)
    assert on.peak_bytes == off.peak_bytes


def test_closed_form_estimates_for_cuda_get_the_workspaces_and_the_overhead(monkeypatch):
    from nnmem_callbacks.estimators.torch import estimator

    monkeypatch.setattr(estimator, "_warned", set())  # its warn-once cache stays as other tests expect it

    class NonzeroRouting(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(16, 16)

        def forward(self, x):
            x = self.linear(x)
            return x[x.nonzero(as_tuple=True)].sum()  # data-dependent shape: no trace

    model = NonzeroRouting()
    batch = torch.randn(8, 16)
    with pytest.warns(RuntimeWarning):
        cuda = estimate_training(model, batch, optimizer="sgd", device="cuda", loss_fn=lambda m, b: m(b))
        cpu = estimate_training(model, batch, optimizer="sgd", device="cpu", loss_fn=lambda m, b: m(b))
    assert cuda.method == cpu.method != "trace"
    assert cuda.breakdown[str(Category.WORKSPACES)] == 64 * MiB
    assert cuda.peak_bytes == cpu.peak_bytes + 64 * MiB
    assert cuda.peak_bytes_at(16) - cuda.peak_bytes_at(8) == cpu.peak_bytes_at(16) - cpu.peak_bytes_at(8)
    assert cuda.overhead_bytes == cuda_tables.CONTEXT_TABLE[(9, 13)].gemm


def test_conv_probe_measures_with_cudnn_benchmark_off_and_restores_it(monkeypatch):
    seen = []

    class Meter(_FakeMeter):
        def start(self):
            seen.append(torch.backends.cudnn.benchmark)
            return super().start()

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    probe = cuda_libraries.ConvProbe(torch.device("cpu"), meter=Meter(4 * 3 * 3 * 4, batches=(8,)))
    x, w = torch.zeros(8, 2, 5, 5), torch.zeros(4, 2, 3, 3)
    probe(torch.ops.aten.convolution, (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), None)
    assert seen == [False]
    assert torch.backends.cudnn.benchmark is True


def test_a_bf16_matmul_after_an_fp32_one_adds_only_its_output():
    # cuda_facts.json: the first bf16 autocast matmul raised memory_allocated by 524,288 B (its 512x512 bf16 output)
    model = cuda_libraries.LibraryModel(capability=(9, 0))
    with FakeTensorMode() as mode:
        tracker = StorageTracker("cuda", fake_mode=mode, libraries=model)
        with tracker:
            tracker.set_phase("step1/forward")
            x = torch.empty(512, 512)
            kept = [x @ x]
            before = tracker.current
            with torch.autocast("cpu", dtype=torch.bfloat16):
                kept.append(x @ x)
            after = tracker.current
            tracker.end()
    assert after - before == 512 * 512 * 2
    assert tracker.workspace_ops["cuBLAS workspace (user thread)"] == 1


def test_the_workspaces_category_reaches_the_tables_and_the_json():
    from nnmem_callbacks.core import formatting as report

    est = _estimate()
    assert "| workspaces | 64.00 MiB |" in report.format_markdown_breakdown(est)
    assert "workspaces" in report.format_summary(est)
    assert est.to_dict()["breakdown"]["workspaces"] == 64 * MiB
    assert est.static_bytes >= 64 * MiB  # fixed, not per sample


def test_an_estimate_can_be_resized_for_another_gpu():
    est = _estimate()
    assert est.extra["cuda_libraries"]["cublas_workspaces"] == 2
    t4 = cuda_tables.for_capability(est, (7, 5), env={})
    small = cuda_tables.CUBLAS_SMALL_DEFAULT
    assert t4.breakdown[str(Category.WORKSPACES)] == 2 * small
    assert est.peak_bytes - t4.peak_bytes == 2 * (32 * MiB - small)
    assert t4.per_sample_bytes == est.per_sample_bytes
    assert t4.peak_bytes_at(1000) == est.peak_bytes_at(1000) - 2 * (32 * MiB - small)
    assert cuda_tables.for_capability(est, (9, 0), env={}) is est
    cpu = estimate_training(_mlp(), torch.empty(8, 256), optimizer="sgd")
    assert cuda_tables.for_capability(cpu, (7, 5)) is cpu


def test_a_failing_device_probe_falls_back_to_the_table(monkeypatch):
    _fake_device(monkeypatch)

    def refuse(device, dtype, gemm, cudnn):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(cuda_libraries, "load_libraries", refuse)
    notes: list[str] = []
    overhead = cuda_libraries.device_overhead(torch.device("cuda"), notes, gemm=True, cudnn=False, capability=(9, 0))
    assert overhead == cuda_tables.CONTEXT_TABLE[(9, 13)].gemm
    assert any("probe failed" in note and "out of memory" in note for note in notes)
    assert any("from the table" in note for note in notes)
