"""cuDNN RNNs traced for CUDA targets on a CPU host: what aten._cudnn_rnn allocates, and when.

The expected sizes are written out by hand from the rule in
``nnmem_callbacks/hardware/cudnn_rnn_sizes.py`` (reserve: D * (L * (k + 1) - 1) hidden-sized
vectors per sample and step; workspace: the line through the two H100 measurements
of (reserve, workspace); weight space: the parameters with both bias vectors), not
computed by the module under test.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from nnmem_callbacks import estimate_training
from nnmem_callbacks.estimators.torch.cuda import cudnn_rnn
from nnmem_callbacks.estimators.torch.estimator import run_trace
from nnmem_callbacks.estimators.torch.step import make_config
from nnmem_callbacks.hardware import cudnn_rnn_sizes as sizes
from nnmem_callbacks.hardware.cudnn_rnn_sizes import RnnShape
from nnmem_callbacks.probes.session import ProbeSettings, kernel_probes

#: (reserve, workspace) bytes measured on the H100 (cuda_facts.json LSTM; zoo lstm case, adam, 32-true)
H100_POINTS = ((738_197_504, 484_442_112), (23_068_672, 33_688_616))


def workspace_for(reserve):
    """The cuDNN 9 workspace on the line through :data:`H100_POINTS`."""
    (r1, w1), (r2, w2) = H100_POINTS
    slope = Fraction(w1 - w2, r1 - r2)
    return int(reserve * slope) + (w1 - int(r1 * slope))


def first_output_sum(module, batch):
    return module(batch)[0].sum()


def trace(model, batch, loss_fn=first_output_sum, precision="32-true", device="cuda", optimizer=None):
    config = make_config(model, batch, optimizer, loss_fn, precision, device, 1, None, "norm")
    return run_trace(config, config.batch.batch_size, steps=1, optimizer_steps=False)


def event_phase(result, index):
    for phase, (start, end) in result.phase_ranges.items():
        if start <= index < end:
            return phase
    return "outside"


def lifetimes(result, size):
    """(allocation phase, free phase or None) of every storage of ``size`` bytes."""
    found = []
    for index, (key, nbytes) in enumerate(result.events):
        if nbytes != size:
            continue
        freed = next((j for j in range(index + 1, len(result.events)) if result.events[j] == (key, -1)), None)
        found.append(
            (
                event_phase(result, index),
                None if freed is None else event_phase(result, freed),
                freed is not None and freed == index + 1,
            )
        )
    return found


def assert_reserve_and_workspace(result, reserve, workspace):
    """The reserve: allocated in forward, freed in backward; the workspace: once in forward, twice in backward, each freed at once."""
    assert ("step1/forward", "step1/backward", False) in lifetimes(result, reserve)
    spans = lifetimes(result, workspace)
    assert sum(1 for alloc, free, _ in spans if alloc == free == "step1/forward") == 1, spans
    assert sum(1 for alloc, free, _ in spans if alloc == free == "step1/backward") == 2, spans


# ---------------------------------------------------------------------------
# the size rule against the measurements it cites
# ---------------------------------------------------------------------------


def test_rule_matches_the_h100_lstm():
    shape = RnnShape("LSTM", 512, 1024, num_layers=2)
    # 2 layers x (4 gates + c + h) - the last layer's h (= y): 11 vectors of 1024 per sample and step
    assert sizes.reserve_bytes(shape, 256, 64, 4) == 11 * 1024 * 64 * 256 * 4 == 738_197_504
    # measured after the forward: reserve + h0/c0/hy/cy (4 x 524,288 B) + 512 B allocator rounding
    assert 740_295_168 - 4 * 524_288 - sizes.reserve_bytes(shape, 256, 64, 4) == 512
    # the weight space is the 58,785,792 B of parameters (both biases)
    params = sum(p.numel() for p in nn.LSTM(512, 1024, 2, device="meta").parameters())
    assert sizes.weight_count(shape) == params == 58_785_792 // 4
    assert sizes.workspace_bytes(shape, 256, 64, 4, cudnn_major=9) == 484_442_112


def test_rule_matches_pytorch_issue_2895():
    # printed by cudnnGetRNNTrainingReserveSize (cuDNN 7); parameter counts solve to 4 layers, 123 -> 320, N*T = 25,000
    lstm, gru = RnnShape("LSTM", 123, 320, num_layers=4), RnnShape("GRU", 123, 320, num_layers=4)
    assert sum(p.numel() for p in nn.LSTM(123, 320, 4, device="meta").parameters()) + 320 * 10 + 10 == 3_038_090
    assert sum(p.numel() for p in nn.GRU(123, 320, 4, device="meta").parameters()) + 320 * 10 + 10 == 2_279_370
    assert sizes.reserve_bytes(lstm, 500, 50, 4) == 736_000_000
    assert sizes.reserve_bytes(gru, 500, 50, 4) == 864_000_000


def test_rule_rejects_unknown_modes():
    with pytest.raises(ValueError, match="valid: LSTM, GRU, RNN_TANH, RNN_RELU"):
        RnnShape("QRNN", 8, 16)
    with pytest.raises(ValueError, match="only valid for LSTM"):
        RnnShape("GRU", 8, 16, proj_size=4)


# ---------------------------------------------------------------------------
# traces of every configuration
# ---------------------------------------------------------------------------

N, T, I, H = 4, 5, 8, 16  # noqa: E741 - the cuDNN documentation's names
F32 = 4


@pytest.mark.parametrize(
    "module, batch, vectors",
    [
        # vectors per sample and step, by hand: D * (L * (k + 1) - 1) * H
        (nn.LSTM(I, H, 1), (T, N, I), 1 * (1 * 6 - 1) * H),
        (nn.LSTM(I, H, 2, bidirectional=True, batch_first=True), (N, T, I), 2 * (2 * 6 - 1) * H),
        (nn.GRU(I, H, 3), (T, N, I), 1 * (3 * 7 - 1) * H),
        (nn.GRU(I, H, 2, bidirectional=True, batch_first=True), (N, T, I), 2 * (2 * 7 - 1) * H),
        (nn.RNN(I, H, 2), (T, N, I), 1 * (2 * 2 - 1) * H),
        (nn.RNN(I, H, 2, nonlinearity="relu", bidirectional=True), (T, N, I), 2 * (2 * 2 - 1) * H),
        # projection: per layer 4 gates + c + h (H each) + the projected output (6), minus the last output
        (nn.LSTM(I, H, 2, proj_size=6), (T, N, I), 2 * (5 * H + H + 6) - 6),
    ],
    ids=["lstm", "lstm-bi-batch-first", "gru-3-layers", "gru-bi-batch-first", "rnn-tanh", "rnn-relu-bi", "lstm-proj"],
)
def test_every_configuration_traces_with_reserve_and_workspaces(module, batch, vectors):
    result = trace(module, torch.randn(batch))
    reserve = vectors * N * T * F32
    assert_reserve_and_workspace(result, reserve, workspace_for(reserve))


def test_estimate_is_a_trace_for_a_cuda_target():
    lstm = nn.LSTM(I, H, 2)
    estimate = estimate_training(lstm, torch.randn(T, N, I), optimizer="adam", device="cuda", loss_fn=first_output_sum)
    assert estimate.method == "trace"
    assert any("not probed" in note and "cudnn_rnn_sizes" in note for note in estimate.notes), estimate.notes
    # the growth per sample is linear (the reserve and workspaces scale with the batch)
    assert not any("not linear" in note for note in estimate.notes)


def test_batch_first_input_is_copied_time_major_in_forward_and_backward():
    lstm = nn.LSTM(I, H, 1, batch_first=True)
    result = trace(lstm, torch.randn(N, T, I))
    copies = lifetimes(result, N * T * I * F32)
    # forward: x.contiguous() (transient); backward: x for the data and again for the weight gradient
    assert sum(1 for alloc, free, _ in copies if alloc == free == "step1/forward") >= 1
    assert sum(1 for alloc, free, _ in copies if alloc == free == "step1/backward") >= 2


def test_flat_module_weights_are_not_copied_but_functional_weights_are():
    weight_space = (4 * H * I + 4 * H * H + 2 * 4 * H) * F32
    assert not [
        s for s in lifetimes(trace(nn.LSTM(I, H, 1), torch.randn(T, N, I)), weight_space) if s[0] == "step1/forward"
    ]

    class Functional(nn.Module):
        """Separate weights passed to torch._VF.lstm, as the Keras torch backend does."""

        def __init__(self):
            super().__init__()
            self.w_ih, self.w_hh = nn.Parameter(torch.randn(4 * H, I)), nn.Parameter(torch.randn(4 * H, H))
            self.b_ih, self.b_hh = nn.Parameter(torch.randn(4 * H)), nn.Parameter(torch.randn(4 * H))

        def forward(self, x):
            h0 = torch.zeros(1, x.shape[1], H)
            weights = [self.w_ih, self.w_hh, self.b_ih, self.b_hh]
            return torch._VF.lstm(x, (h0, h0), weights, True, 1, 0.0, True, False, False)

    result = trace(Functional(), torch.randn(T, N, I))
    # weight_buf: allocated by the forward, saved, freed after backward; dw: its gradient, in backward
    assert ("step1/forward", "step1/backward", False) in lifetimes(result, weight_space)
    assert any(alloc == "step1/backward" for alloc, _, _ in lifetimes(result, weight_space))


def test_bias_free_weights_are_copied_into_a_double_bias_weight_space():
    # cuDNN's descriptor always has both biases: dw is larger than the parameters and the gradients are copies
    lstm = nn.LSTM(I, H, 1, bias=False)
    dw = (4 * H * I + 4 * H * H + 2 * 4 * H) * F32
    result = trace(lstm, torch.randn(T, N, I))
    assert ("step1/backward", "step1/backward", False) in lifetimes(result, dw)


def test_autocast_copies_the_weights_into_an_fp16_buffer():
    lstm = nn.LSTM(I, H, 1)
    result = trace(lstm, torch.randn(T, N, I), precision="16-mixed")
    fp16_weight_space = (4 * H * I + 4 * H * H + 2 * 4 * H) * 2
    assert ("step1/forward", "step1/backward", False) in lifetimes(result, fp16_weight_space)
    # the reserve is sized in fp16 (AutocastRNN.cpp casts to half)
    assert ("step1/forward", "step1/backward", False) in lifetimes(result, 5 * H * N * T * 2)


def test_dropout_state_is_allocated_once_and_kept():
    lstm = nn.LSTM(I, H, 2, dropout=0.5)
    spans = lifetimes(trace(lstm, torch.randn(T, N, I)), sizes.DROPOUT_STATE_BYTES)
    assert spans == [("step1/forward", "outside", False)] or spans == [("step1/forward", None, False)]


def test_packed_sequences_trace_with_real_batch_sizes():
    lstm = nn.LSTM(I, H, 2)
    lengths = [5, 4, 4, 2]

    def loss_fn(module, batch):
        packed = pack_padded_sequence(batch, lengths)
        out, (h, c) = module(packed)
        assert tuple(out.data.shape) == (sum(lengths), H) and tuple(h.shape) == (2, len(lengths), H)
        padded, out_lengths = pad_packed_sequence(out)
        assert tuple(padded.shape) == (5, len(lengths), H) and out_lengths.tolist() == lengths
        return padded.sum()

    result = trace(lstm, torch.randn(T, len(lengths), I), loss_fn=loss_fn)
    assert result.placeholders == 0
    reserve = (2 * 6 - 1) * H * T * len(lengths) * F32  # sized for the padded extent
    assert_reserve_and_workspace(result, reserve, workspace_for(reserve))


def test_packed_sequence_built_by_hand():
    lstm = nn.GRU(I, H, 1)
    batch_sizes = torch.tensor([3, 3, 2, 1])

    def loss_fn(module, data):
        out, h = module(PackedSequence(data, batch_sizes))
        assert tuple(h.shape) == (1, 3, H)
        return out.data.sum()

    result = trace(lstm, torch.randn(9, I), loss_fn=loss_fn)
    assert_reserve_and_workspace(result, 6 * H * 4 * 3 * F32, workspace_for(6 * H * 4 * 3 * F32))


def test_gradients_reach_every_parameter_and_the_input():
    lstm = nn.LSTM(I, H, 2, bidirectional=True, proj_size=4)
    with cudnn_rnn.cudnn_rnn_emulation(lstm) as calls, FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(T, N, I, requires_grad=True)
        out, (h, c) = lstm(x)
        assert tuple(out.shape) == (T, N, 8) and tuple(h.shape) == (4, N, 4) and tuple(c.shape) == (4, N, H)
        (out.sum() + h.sum()).backward()
        assert tuple(x.grad.shape) == (T, N, I)
        for parameter in lstm.parameters():
            assert parameter.grad is not None and parameter.grad.shape == parameter.shape
            parameter.grad = None
    assert calls.calls == 1


def test_real_h100_lstm_forward_and_backward_peaks():
    """gpu-runs/2026-11-23-h100/cuda_facts.json: 2 layers 512 -> 1024, batch 64 x 256 steps, fp32.

    The run kept hy/cy after the forward; this loss drops them (1 MiB). The
    forward peak fixed the workspace size; the backward peak is a separate
    check of the backward's allocations (dy copy, zero grads, dx/dhx/dcx and a
    workspace of the same size).
    """
    lstm = nn.LSTM(512, 1024, 2)
    result = trace(lstm, torch.empty(256, 64, 512, device="meta"))
    start = 58_785_792 + 256 * 64 * 512 * 4  # parameters and x were allocated before the measurement
    measured_forward = 1_291_846_144 + start
    measured_backward = 1_394_607_616 + start - 2 * 524_288
    # within 2 KiB: the measured reserve is 512 B above the rule, and the allocator rounds the loss and
    # its gradient (4 B each in the trace) to 512 B
    assert abs(result.phase_peaks["step1/forward"] - measured_forward) <= 2048
    assert abs(result.phase_peaks["step1/backward"] - measured_backward) <= 2048


@pytest.mark.parametrize(
    "precision, measured, tolerance",
    [
        # a fit point of the workspace line (adam, 32-true): every phase, not only the one fitted
        (
            "32-true",
            {
                "step1/forward": 67_484_160,
                "step1/backward": 74_454_016,
                "step2/forward": 79_988_224,
                "step2/backward": 86_958_080,
            },
            0.001,
        ),
        # the check: cuDNN runs bf16-mixed in fp16 (half the reserve, the same fixed workspace part)
        (
            "bf16-mixed",
            {
                "step1/forward": 49_657_856,
                "step1/backward": 52_662_784,
                "step2/forward": 62_161_920,
                "step2/backward": 65_166_848,
            },
            0.02,
        ),
    ],
)
def test_zoo_lstm_phases_match_the_h100(precision, measured, tolerance):
    """zoo_cuda.json, lstm case (2 layers 128 -> 256, batch_first, batch 32 x 64 steps), adam."""
    from benchmarks.common.zoo import ZOO

    case = ZOO["lstm"]
    torch.manual_seed(0)
    config = make_config(
        case.make_model(),
        case.make_batch(case.batch_size, "cpu"),
        "adam",
        case.loss_fn,
        precision,
        "cuda",
        1,
        None,
        "norm",
    )
    result = run_trace(config, case.batch_size)
    for phase, value in measured.items():
        assert abs(result.phase_peaks[phase] - value) <= tolerance * value, (phase, result.phase_peaks[phase], value)


def test_cpu_targets_do_not_use_the_emulation(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the cuDNN emulation ran for a CPU target")

    monkeypatch.setattr(cudnn_rnn._CudnnRNN, "apply", refuse)
    estimate = estimate_training(
        nn.LSTM(I, H, 1), torch.randn(T, N, I), optimizer="sgd", device="cpu", loss_fn=first_output_sum
    )
    assert estimate.method == "trace"


def test_user_module_is_untouched():
    lstm = nn.LSTM(I, H, 2)
    before = {name: p.detach().clone() for name, p in lstm.named_parameters()}
    flat_before = list(lstm._flat_weights)
    estimate_training(lstm, torch.randn(T, N, I), optimizer="adam", device="cuda", loss_fn=first_output_sum)
    assert "flatten_parameters" not in vars(lstm)
    assert all(a is b for a, b in zip(lstm._flat_weights, flat_before))
    for name, parameter in lstm.named_parameters():
        assert torch.equal(parameter, before[name]) and parameter.grad is None
    out, _ = lstm(torch.randn(T, N, I))  # still a working CPU module
    assert out.shape == (T, N, H)


# ---------------------------------------------------------------------------
# the probe on a GPU (faked: no GPU here)
# ---------------------------------------------------------------------------


def fake_cudnn_rnn(reserve_per_n=96, reserve_fixed=64):
    calls = []

    def _cudnn_rnn(
        x,
        weights,
        stride0,
        weight_buf,
        hx,
        cx,
        mode,
        hidden,
        proj,
        layers,
        batch_first,
        dropout,
        train,
        bidirectional,
        batch_sizes,
        state,
    ):
        steps, batch = x.shape[0], x.shape[1]
        calls.append((steps, batch, mode, stride0))
        out = torch.empty(steps, batch, hidden)
        reserve = torch.empty(reserve_per_n * steps * batch + reserve_fixed, dtype=torch.uint8)
        flat = torch.empty(sum(w.numel() for w in weights))
        return out, torch.empty_like(hx), torch.empty_like(cx) if cx is not None else torch.empty(0), reserve, flat

    return _cudnn_rnn, calls


def test_probe_entry_reads_the_reserve_and_the_workspace(monkeypatch):
    from nnmem_callbacks.probes import runner

    function, calls = fake_cudnn_rnn()
    monkeypatch.setattr(torch, "_cudnn_rnn", function)

    def kernel_peak(call, strict=False):
        out = call()
        returned = sum(t.numel() * t.element_size() for t in out)
        n = out[0].shape[0] * out[0].shape[1]
        return out, returned + 40 * n + 1000  # a workspace of 40 B per sample-step + 1000

    monkeypatch.setattr(runner, "kernel_peak", kernel_peak)
    shape = RnnShape("LSTM", I, H, num_layers=2)
    entry = cudnn_rnn.probe_entry(shape, torch.float32, torch.device("cpu"))
    assert entry["n"] == [16, 32, 64]
    assert entry["reserve"] == [96 * n + 64 for n in (16, 32, 64)]
    assert entry["workspace"] == [40 * n + 1000 for n in (16, 32, 64)]
    assert entry["weights"] == [sum(p.numel() for p in nn.LSTM(I, H, 2, device="meta").parameters())] * 3
    assert calls[0][2:] == (2, 4)  # CUDNN_LSTM, four weights per layer


def test_probed_sizes_fit_the_probe_and_report_it(monkeypatch):
    entry = {
        "n": [4, 8, 16],
        "reserve": [96 * n + 64 for n in (4, 8, 16)],
        "workspace": [40 * n + 1000 for n in (4, 8, 16)],
        "weights": [1],
    }
    runs = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cudnn_rnn, "probe_entry", lambda *args: runs.append(args) or entry)
    cudnn_rnn._PROBE_MEMO.clear()
    shape = RnnShape("GRU", I, H)
    with kernel_probes("cuda", cache=False) as session:
        assert cudnn_rnn.probed_sizes(shape, torch.float32, torch.device("cuda", 0), 256, 64, True) == (
            96 * 256 * 64 + 64,
            40 * 256 * 64 + 1000,
        )
        assert cudnn_rnn.probed_sizes(shape, torch.float32, torch.device("cuda", 0), 10, 10, True) == (
            96 * 100 + 64,
            40 * 100 + 1000,
        )
        notes = session.notes()
    assert len(runs) == 1  # probed once per shape
    assert any("probed on this cuda: 1 op shape(s) measured (3 kernel runs" in note for note in notes)


def test_probe_is_refused_above_the_cap_and_without_a_gpu(monkeypatch):
    shape = RnnShape("LSTM", 512, 1024, num_layers=2)
    monkeypatch.setattr(cudnn_rnn, "probe_entry", lambda *args: pytest.fail("probed"))
    # no GPU: nothing runs
    with kernel_probes("cuda", cache=False):
        assert cudnn_rnn.probed_sizes(shape, torch.float32, torch.device("cuda", 0), 256, 64, True) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with kernel_probes("cuda", settings=ProbeSettings(memory_cap_bytes=2**20), cache=False) as session:
        assert cudnn_rnn.probed_sizes(shape, torch.float32, torch.device("cuda", 0), 256, 64, True) is None
        assert any("above the cap" in note and "aten._cudnn_rnn" in note for note in session.notes())
    with kernel_probes("cuda", enabled=False, cache=False):
        assert cudnn_rnn.probed_sizes(shape, torch.float32, torch.device("cuda", 0), 256, 64, True) is None


def test_trace_uses_probed_sizes(monkeypatch):
    monkeypatch.setattr(
        cudnn_rnn,
        "probed_sizes",
        lambda shape, dtype, device, steps, batch, biases: (7_000 * steps * batch, 3_000 * steps * batch),
    )
    result = trace(nn.LSTM(I, H, 1), torch.randn(T, N, I))
    assert_reserve_and_workspace(result, 7_000 * T * N, 3_000 * T * N)


# ---------------------------------------------------------------------------
# the closed-form fallback never touches the GPU
# ---------------------------------------------------------------------------


def test_fallback_allocates_nothing_on_cuda(monkeypatch):
    """Without a GPU: every CUDA tensor creation first calls torch.cuda._lazy_init, which fails the test
    (the fallback catches exceptions, so the calls are recorded, not raised through). With one: the
    allocator's peak does not move."""
    cuda_inits = []
    has_gpu = torch.cuda.is_available()
    if has_gpu:  # pragma: no cover - GPU hosts
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:

        def no_cuda(*args, **kwargs):
            cuda_inits.append(args)
            raise RuntimeError("a CUDA allocation was attempted")

        monkeypatch.setattr(torch.cuda, "_lazy_init", no_cuda)

    class Untraceable(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(I, H, 2)

        def forward(self, x):
            out, _ = self.lstm(x)
            return out[out > 0].sum()  # data-dependent shape: the trace fails

    with pytest.warns(RuntimeWarning, match="could not trace"):
        estimate = estimate_training(
            Untraceable(), torch.randn(T, N, I), optimizer="adam", device="cuda", loss_fn=lambda m, b: m(b)
        )
    assert estimate.method == "closed-form"
    assert estimate.breakdown["activations"] > 0
    assert cuda_inits == []
    if has_gpu:  # pragma: no cover - GPU hosts
        assert torch.cuda.max_memory_allocated() == before


# ---------------------------------------------------------------------------
# Keras on the torch backend
# ---------------------------------------------------------------------------

KERAS_TORCH_CUDA = """
import functools, json
import numpy as np, keras
from nnmem_callbacks.keras import estimate_training
from nnmem_callbacks.estimators.keras import torch_backend
from nnmem_callbacks.estimators.torch.cuda import cudnn_rnn

calls = []
apply = cudnn_rnn._CudnnRNN.apply
cudnn_rnn._CudnnRNN.apply = lambda spec, *args: calls.append((spec.shape.mode, spec.flattened, spec.batch_first)) or apply(spec, *args)
original_lstm = keras.src.backend.lstm
out = {}
for layer in ("LSTM", "GRU"):
    model = keras.Sequential([keras.Input((64, 32)), getattr(keras.layers, layer)(128), keras.layers.Dense(5)])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    estimates = {}
    for device in ("cpu", "cuda"):
        torch_backend_estimate = torch_backend.estimate_torch
        torch_backend.estimate_torch = functools.partial(torch_backend_estimate, device=device)
        try:
            estimates[device] = estimate_training(model, batch_size=32, method="backend")
        finally:
            torch_backend.estimate_torch = torch_backend_estimate
    out[layer] = {d: [e.method, e.peak_bytes, e.device, list(e.notes)] for d, e in estimates.items()}
out["calls"] = calls
out["restored"] = keras.src.backend.lstm is original_lstm
print("RESULT " + json.dumps(out))
"""


def test_keras_torch_backend_rnns_trace_for_a_cuda_target():
    pytest.importorskip("keras")
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, KERAS_BACKEND="torch", PYTHONPATH=root)
    done = subprocess.run(
        [sys.executable, "-c", KERAS_TORCH_CUDA], env=env, capture_output=True, text=True, timeout=600, cwd=root
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-4000:]
    result = json.loads(lines[0][len("RESULT ") :])
    # Keras' cuDNN path: functional torch._VF.lstm / gru, batch-first, weights not flat (a weight buffer per call)
    assert result["calls"] and {tuple(c) for c in result["calls"]} == {("LSTM", False, True), ("GRU", False, True)}
    assert result["restored"]
    for layer in ("LSTM", "GRU"):
        cpu, cuda = result[layer]["cpu"], result[layer]["cuda"]
        assert cpu[0] == cuda[0] == "torch-trace"
        assert cuda[2].startswith("cuda") and any("cudnn_rnn_sizes" in note for note in cuda[3])
        assert cuda[1] != cpu[1]  # the cuDNN reserve and workspaces, not Keras' per-step CPU loop


def test_probe_inside_a_trace_is_invisible_to_it(monkeypatch):
    """The probe's real tensors pass no fake mode and no storage tracker (and no autocast)."""
    from nnmem_callbacks.estimators.torch.tracer import StorageTracker
    from nnmem_callbacks.probes import runner

    function, calls = fake_cudnn_rnn()
    seen = []

    def checked(*args):
        seen.append((type(args[0]).__name__, torch.is_autocast_enabled("cpu")))
        return function(*args)

    monkeypatch.setattr(torch, "_cudnn_rnn", checked)
    monkeypatch.setattr(
        runner,
        "kernel_peak",
        lambda call, strict=False: (lambda out: (out, sum(t.numel() * t.element_size() for t in out)))(call()),
    )
    tracker = StorageTracker("cuda")
    with FakeTensorMode(), tracker, torch.autocast("cpu", dtype=torch.bfloat16):
        tracker.set_phase("step1/forward")
        entry = cudnn_rnn.probe_entry(RnnShape("GRU", I, H), torch.float32, torch.device("cpu"))
    assert tracker.events == [] and entry["reserve"] == [96 * n + 64 for n in (16, 32, 64)]
    assert seen == [("Tensor", False)] * 3


def test_probe_refuses_a_profiler_that_misses_the_device(monkeypatch):
    from nnmem_callbacks.probes import runner

    function, _ = fake_cudnn_rnn()
    monkeypatch.setattr(torch, "_cudnn_rnn", function)
    monkeypatch.setattr(runner, "kernel_peak", lambda call, strict=False: (call(), 0))
    with pytest.raises(RuntimeError, match="the profiler saw 0 B"):
        cudnn_rnn.probe_entry(RnnShape("LSTM", I, H), torch.float32, torch.device("cpu"))
