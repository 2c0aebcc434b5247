"""Per-op and per-layer rules, kept in registries.

Two registries live here:

* **Workspace rules** (``WORKSPACE_RULES[device_type][op] -> rule``): transient
  bytes a kernel allocates internally and frees before it returns, which fake
  tensors cannot see (oneDNN scratchpads and reorders on CPU, cuDNN and
  cuBLAS workspaces on CUDA). Every rule has one signature:
  ``rule(func, args, kwargs, out) -> bytes``: the peak of the kernel's own
  allocations, outputs included. On CPU the bytes come from probes of the real
  kernels on this machine (:mod:`nnmem_callbacks.probes`, through the session
  ``estimate_training`` makes current); the formulas below, fitted with
  ``python -m benchmarks.workspaces`` on one AVX-512 machine, are only the
  fallback when probing is off or fails (the estimate's notes then say so).
* **Output rules** (``OUTPUT_RULES[device_type][op] -> rule``): outputs whose
  fake size differs from the real one, such as oneDNN's LSTM workspace, which
  the meta kernel returns empty. ``rule(func, args, kwargs, out) -> out`` returns
  the outputs with the real sizes (as fake tensors).
* **Decompositions** (``DECOMPOSITIONS[device_type][op] -> impl``): custom ops
  whose fake kernel returns only the output while the real kernel on that device
  is Python built from other ops (bitsandbytes' ``gemm_4bit`` dequantizes the
  weight, then calls ``linear``). The tracer runs ``impl(*args, **kwargs)`` on
  fake tensors instead, so the temporaries inside are tracked as they happen.
* **Layer rules** (``LAYER_RULES[module type] -> rule``): for the closed-form
  fallback, the bytes a layer saves for backward given its inputs and output.
  One signature: ``rule(module, inputs, output) -> bytes``. Layers without a
  rule are counted and reported, and charged their output size.

Example:
    >>> import torch
    >>> rule = LAYER_RULES[torch.nn.ReLU]
    >>> rule(torch.nn.ReLU(), (torch.empty(4, 8),), torch.empty(4, 8))
    128
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import torch
from torch import nn

from nnmem_callbacks.probes.runner import ProfilerBusy, UnsupportedKernelError, is_unsupported, isolated
from nnmem_callbacks.probes.runner import kernel_peak as _kernel_peak
from nnmem_callbacks.probes.session import current_session

__all__ = [
    "aten",
    "IGNORED_LAYERS",
    "input_bytes",
    "LAYER_RULES",
    "LayerRule",
    "onednn_bf16_matmul_workspace",
    "output_bytes",
    "OUTPUT_RULES",
    "output_rules",
    "DECOMPOSITIONS",
    "decompositions",
    "register_decomposition",
    "probed",
    "register_layer",
    "register_output",
    "register_workspace",
    "WORKSPACE_RULES",
    "workspace_rules",
    "WorkspaceRule",
]

WorkspaceRule = Callable[[Any, tuple, dict, Any], int]
LayerRule = Callable[[nn.Module, tuple, Any], int]

aten = torch.ops.aten

#: device type -> op overload packet -> rule
WORKSPACE_RULES: dict[str, dict[Any, WorkspaceRule]] = {"cpu": {}, "cuda": {}}


def register_workspace(device_type: str, *ops: Any) -> Callable[[WorkspaceRule], WorkspaceRule]:
    """Registers a workspace rule for ops on a device type."""

    def decorator(rule: WorkspaceRule) -> WorkspaceRule:
        for op in ops:
            WORKSPACE_RULES[device_type][op] = rule
        return rule

    return decorator


def workspace_rules(device_type: str) -> dict[Any, WorkspaceRule]:
    """The workspace rules for a device type (empty for unknown types)."""
    return WORKSPACE_RULES.get(device_type, {})


#: device type -> op overload packet -> rule(func, args, kwargs, out) -> corrected out
OUTPUT_RULES: dict[str, dict[Any, Callable[[Any, tuple, dict, Any], Any]]] = {"cpu": {}, "cuda": {}}


def register_output(device_type: str, *ops: Any):
    """Registers an output-size correction rule for ops on a device type."""

    def decorator(rule):
        for op in ops:
            OUTPUT_RULES[device_type][op] = rule
        return rule

    return decorator


def output_rules(device_type: str) -> dict[Any, Callable[[Any, tuple, dict, Any], Any]]:
    """The output rules for a device type (empty for unknown types)."""
    return OUTPUT_RULES.get(device_type, {})


#: device type -> op overload packet -> the Python implementation that really runs there
DECOMPOSITIONS: dict[str, dict[Any, Callable[..., Any]]] = {"cpu": {}, "cuda": {}}


def decompositions(device_type: str) -> dict[Any, Callable[..., Any]]:
    """The decompositions for a device type (empty for unknown types)."""
    return DECOMPOSITIONS.get(device_type, {})


def register_decomposition(device_type: str, *ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Registers the Python implementation that really runs for ops on a device type."""

    def decorator(implementation: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            DECOMPOSITIONS[device_type].setdefault(op, implementation)
        return implementation

    return decorator


def _grouped_mm_output(mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Any:
    """``aten._grouped_mm`` on CPU (mixture-of-experts layers): the output, in every dtype.

    The meta kernel checks the CUDA kernel's dtype rule (bf16 only) and fails
    for fp32, which the CPU kernel runs (one ``mm`` per group into the output).
    The output is made as the meta kernel makes it, without the check.
    """
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)


if hasattr(aten, "_grouped_mm"):
    register_decomposition("cpu", aten._grouped_mm)(_grouped_mm_output)


@dataclasses.dataclass(frozen=True)
class _Linear2:
    """``a * T * B + b * B + c``, fitted from three probes."""

    a: float
    b: float
    c: float

    def at(self, steps: int, batch: int) -> int:
        return max(0, int(round(self.a * steps * batch + self.b * batch + self.c)))

    @staticmethod
    def fit(values: list[int]) -> "_Linear2":
        (t1, b1), (t2, _), (_, b3) = _RNN_PROBES
        a = (values[1] - values[0]) / ((t2 - t1) * b1)
        b = (values[2] - values[0]) / (b3 - b1) - a * t1
        return _Linear2(a, b, values[0] - a * t1 * b1 - b * b1)


@dataclasses.dataclass(frozen=True)
class _RnnFit:
    workspace: _Linear2  # the workspace tensor the forward returns
    forward_peak: _Linear2  # peak of the forward kernel's own allocations (outputs included)
    backward_peak: _Linear2  # the same for the backward kernel


_RNN_FITS: dict[tuple, _RnnFit] = {}

#: (sequence length, batch) of the three real probes used to fit the oneDNN RNN sizes
_RNN_PROBES = ((8, 8), (16, 8), (8, 16))


def _onednn_rnn_fit(key: tuple, args: tuple) -> _RnnFit:
    """Measures oneDNN's LSTM/GRU kernels on three tiny real calls and fits their sizes.

    oneDNN sizes the training workspace and its scratchpads from the gates and
    states of every time step, with padded leading dimensions, page alignment
    and packed weight copies; the probes measure them for this layer's sizes
    and dtype instead of copying oneDNN's internal layout rules. Measured: the
    workspace tensor the forward returns, and the peak of each kernel's own
    allocations (outputs, packed weights, scratchpad).
    """
    session = current_session()
    if session is None:  # outside estimate_training: a process-wide memo
        fit = _RNN_FITS.get(key)
        if fit is None:
            fit = _RNN_FITS[key] = _rnn_fit_from(_onednn_rnn_probe(key, args))
        return fit
    cache_key = "rnn:" + repr(key)
    entry = session.lookup(cache_key)
    if entry is None:
        started = time.perf_counter()
        try:
            entry = _onednn_rnn_probe(key, args, strict=True)
        except ProfilerBusy:  # measured nothing: use it for this estimate only
            return _rnn_fit_from(_onednn_rnn_probe(key, args))
        session.record(cache_key, entry, runs=2 * len(_RNN_PROBES), seconds=time.perf_counter() - started)
    return _rnn_fit_from(entry)


def _rnn_fit_from(entry: dict[str, list[int]]) -> _RnnFit:
    return _RnnFit(*(_Linear2.fit(entry[name]) for name in ("workspace", "forward_peak", "backward_peak")))


def _onednn_rnn_probe(key: tuple, args: tuple, strict: bool = False) -> dict[str, list[int]]:
    """The three probes behind :func:`_onednn_rnn_fit` (raw bytes, for the cache).

    Raises:
        UnsupportedKernelError: oneDNN has no such RNN primitive on this CPU
            (for example bf16 without bf16 support): the real step would fail.
    """
    try:
        return _onednn_rnn_measure(args, strict)
    except RuntimeError as error:
        if isinstance(error, (ProfilerBusy, UnsupportedKernelError)) or not is_unsupported(error):
            raise
        reason = (str(error).strip().splitlines() or [""])[0]
        raise UnsupportedKernelError("aten.mkldnn_rnn_layer", args[0].dtype, "cpu", reason) from error


def _onednn_rnn_measure(args: tuple, strict: bool) -> dict[str, list[int]]:

    source = args[0]
    input_size, hidden_size = int(source.shape[-1]), int(args[10])
    workspaces, forward_peaks, backward_peaks = [], [], []
    forward = torch.ops.aten.mkldnn_rnn_layer.default
    backward = torch.ops.aten.mkldnn_rnn_layer_backward.default
    # the kernel makes no workspace under no_grad
    with isolated(), torch.enable_grad():
        weights = [torch.zeros(tuple(w.shape), dtype=w.dtype) if isinstance(w, torch.Tensor) else w for w in args[1:5]]
        reverse, batch_sizes, mode, _, num_layers, has_biases, bidirectional, batch_first, train = args[7:16]
        for steps, batch in _RNN_PROBES:
            # the kernel always receives time-major input, whatever batch_first says
            probe_input = torch.zeros((steps, batch, input_size), dtype=source.dtype)
            hx = torch.zeros((batch, hidden_size), dtype=args[5].dtype)
            cx = torch.zeros((batch, hidden_size), dtype=args[6].dtype)
            out, peak = _kernel_peak(
                functools.partial(forward, probe_input, *weights, hx, cx, *args[7:]), strict=strict
            )
            workspaces.append(out[3].numel() * out[3].element_size())
            forward_peaks.append(peak)
            grads = (torch.zeros_like(out[0]), torch.zeros_like(out[1]), torch.zeros_like(out[2]))
            _, peak = _kernel_peak(
                functools.partial(
                    backward,
                    probe_input,
                    *weights,
                    hx,
                    cx,
                    out[0],
                    out[1],
                    out[2],
                    *grads,
                    reverse,
                    mode,
                    hidden_size,
                    num_layers,
                    has_biases,
                    train,
                    bidirectional,
                    batch_sizes,
                    batch_first,
                    out[3],
                ),
                strict=strict,
            )
            backward_peaks.append(peak)
    return {"workspace": workspaces, "forward_peak": forward_peaks, "backward_peak": backward_peaks}


def _rnn_key(source: Any, args: tuple) -> tuple:
    return (
        source.dtype,
        int(source.shape[-1]),
        int(args[10]),
        bool(args[12]),
        bool(args[13]),
        int(args[9]),
        bool(args[7]),
    )


@register_output("cpu", aten.mkldnn_rnn_layer)
def _onednn_rnn_workspace(func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
    workspace = out[3]
    train = args[15] if len(args) > 15 else kwargs.get("train", True)
    if not train or workspace.numel() > 0:
        return out
    source = args[0]
    steps, batch = int(source.shape[0]), int(source.shape[1])  # time-major at this level
    nbytes = _onednn_rnn_fit(_rnn_key(source, args), args).workspace.at(steps, batch)
    real_workspace = torch.empty((nbytes,), dtype=workspace.dtype, device=workspace.device)
    return (out[0], out[1], out[2], real_workspace)


@register_workspace("cpu", aten.mkldnn_rnn_layer)
def _onednn_rnn_forward_scratch(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    train = args[15] if len(args) > 15 else kwargs.get("train", True)
    if not train:
        return 0
    source = args[0]
    return _onednn_rnn_fit(_rnn_key(source, args), args).forward_peak.at(int(source.shape[0]), int(source.shape[1]))


@register_workspace("cpu", aten.mkldnn_rnn_layer_backward)
def _onednn_rnn_backward_scratch(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    source = args[0]
    forward_args = (
        source,
        *args[1:7],
        args[13],
        args[20],
        args[14],
        args[15],
        args[16],
        args[17],
        args[19],
        args[21],
        args[18],
    )
    return _onednn_rnn_fit(_rnn_key(source, forward_args), forward_args).backward_peak.at(
        int(source.shape[0]), int(source.shape[1])
    )


def _nbytes(tensor: Any) -> int:
    if isinstance(tensor, torch.Tensor):
        return tensor.numel() * tensor.element_size()
    return 0


# ---------------------------------------------------------------------------
# Workspace rules
# ---------------------------------------------------------------------------


def onednn_bf16_matmul_workspace(m: int, k: int, n: int) -> int:
    """Scratch bytes oneDNN's bf16 GEMM (brgemm) allocates per call on CPU.

    A packed block of B (``Kb x 128`` bf16) plus an fp32 accumulator tile
    (``Mb x Nb``) and a small fixed part. Measured with the profiler's
    allocator events for ``mm``/``addmm``/``bmm`` over sweeps of M, K and N
    (``python -m benchmarks.workspaces``); exact for every measured shape with
    ``N >= 8``. fp32 (MKL) and fp16 GEMMs allocate nothing.

    Example:
        >>> onednn_bf16_matmul_workspace(256, 512, 256), onednn_bf16_matmul_workspace(128, 64, 128)
        (263808, 83584)
    """
    if k <= 512:
        k_block = -(-k // 32) * 32
    elif k <= 1024:
        k_block = 512
    else:
        k_block = 1024
    m_block = m if m <= 256 else -(-m // -(-m // 256))
    n_block = n if n <= 64 else 128
    return 1664 + 256 * k_block + 4 * m_block * n_block


def _matmul_dims(func: Any, args: tuple) -> tuple[int, int, int] | None:
    packet = func.overloadpacket
    if packet in (aten.addmm, aten.baddbmm, aten.addbmm):
        first, second = args[1], args[2]
    else:
        first, second = args[0], args[1]
    if not isinstance(first, torch.Tensor) or not isinstance(second, torch.Tensor):
        return None
    if first.dtype != torch.bfloat16 or first.dim() < 2 or second.dim() < 2:
        return None
    return int(first.shape[-2]), int(first.shape[-1]), int(second.shape[-1])


def _onednn_bf16_matmul(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    dims = _matmul_dims(func, args)
    if dims is None or min(dims) == 0:
        return 0
    return onednn_bf16_matmul_workspace(*dims)


_ONEDNN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _onednn_conv(args: tuple) -> bool:
    source, weight = args[0], args[1]
    return (
        isinstance(source, torch.Tensor)
        and isinstance(weight, torch.Tensor)
        and source.dtype in _ONEDNN_DTYPES
        and weight.dim() in (3, 4, 5)
    )


def _onednn_conv_forward(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Peak of oneDNN's convolution forward: input and weight reordered to the
    blocked layout next to the output, or the output twice (blocked, then
    plain), whichever is larger. Exact for the shapes measured in
    ``benchmarks/workspaces.py`` (fp32 and bf16, 1x1/3x3/7x7, strided)."""
    if not _onednn_conv(args):
        return 0
    output = _nbytes(out)
    return max(_nbytes(args[0]) + _nbytes(args[1]) + output, 2 * output)


def _onednn_conv_backward(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Peak of oneDNN's convolution backward: grad_output, input and weight
    reordered next to the gradients it returns, or three input-sized buffers
    for strided convolutions. Within 1% on most measured shapes, up to 25%
    low on first-layer convolutions with few input channels."""
    grad_output, source, weight = args[0], args[1], args[2]
    if not _onednn_conv((source, weight)):
        return 0
    grads = (
        sum(_nbytes(t) for t in out if isinstance(t, torch.Tensor)) if isinstance(out, (tuple, list)) else _nbytes(out)
    )
    return max(_nbytes(grad_output) + _nbytes(source) + _nbytes(weight) + grads, 3 * _nbytes(source))


def _batch_norm_backward(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Batch-norm backward on CPU keeps one input-sized buffer next to grad_input."""
    return 2 * _nbytes(args[1]) if isinstance(args[1], torch.Tensor) and args[1].dim() > 2 else 0


def _no_formula(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    return 0


_REDUCED = (torch.bfloat16, torch.float16)
_FLOATING = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _mixed_floating(args: tuple) -> bool:
    dtypes = {a.dtype for a in args[:2] if isinstance(a, torch.Tensor) and a.dim() > 0}
    return len(dtypes) > 1 and all(d.is_floating_point for d in dtypes)


def probed(
    fallback: WorkspaceRule,
    dtypes: tuple[torch.dtype, ...] = _FLOATING,
    dtype_arg: int = 0,
    when: Callable[[tuple], bool] | None = None,
) -> WorkspaceRule:
    """A workspace rule whose bytes come from a probe of the real kernel.

    The current :class:`~nnmem_callbacks.probes.session.ProbeSession` (set by
    ``estimate_training``) measures the kernel on this machine; ``fallback``
    (a formula) applies when there is no session, probing is off, refused
    (memory cap, run budget, time limit) or failed, or ``args[dtype_arg]`` has a dtype
    outside ``dtypes`` or ``when(args)`` is false (then the kernel is known to
    allocate only its outputs).
    """

    def rule(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
        session = current_session()
        source = args[dtype_arg] if len(args) > dtype_arg else None
        if (
            session is not None
            and isinstance(source, torch.Tensor)
            and source.dtype in dtypes
            and (when is None or when(args))
        ):
            value = session.peak(func, args, kwargs, out)
            if value is not None:
                return value
        return fallback(func, args, kwargs, out)

    rule.__doc__ = f"Probed; fallback: {fallback.__name__}. " + (fallback.__doc__ or "")
    rule.__name__ = f"probed_{fallback.__name__.lstrip('_')}"
    return rule


# CPU: probed kernels (formulas only as the fallback). fp32/fp64 mm and addmm
# (MKL sgemm/dgemm) allocate only their outputs, so only reduced-precision
# GEMMs are probed; bmm allocates an output-sized copy even in fp32 here.
register_workspace("cpu", aten.convolution)(probed(_onednn_conv_forward))
register_workspace("cpu", aten.convolution_backward)(probed(_onednn_conv_backward, dtype_arg=1))
register_workspace("cpu", aten.mm)(probed(_onednn_bf16_matmul, _REDUCED))
register_workspace("cpu", aten.addmm)(probed(_onednn_bf16_matmul, _REDUCED, dtype_arg=1))
register_workspace("cpu", aten.bmm)(probed(_onednn_bf16_matmul))
register_workspace("cpu", aten.baddbmm)(probed(_onednn_bf16_matmul, dtype_arg=1))
register_workspace("cpu", aten.native_batch_norm_backward)(probed(_batch_norm_backward, dtype_arg=1))
register_workspace(
    "cpu",
    aten.native_layer_norm_backward,
    aten.native_group_norm_backward,
    aten.max_pool2d_with_indices_backward,
    aten.max_pool3d_with_indices_backward,
    aten.avg_pool2d_backward,
    aten.avg_pool3d_backward,
    aten._adaptive_avg_pool2d_backward,
    aten._adaptive_avg_pool3d_backward,
)(probed(_no_formula, dtype_arg=1))
# sorts the indices (buffers of the index count)
register_workspace("cpu", aten.embedding_dense_backward)(probed(_no_formula))
# fp32 softmax keeps a row buffer; mixed-dtype elementwise ops (fp32 + bf16
# under autocast) convert the other operand into a temporary first
register_workspace("cpu", aten._softmax, aten._safe_softmax)(probed(_no_formula))
register_workspace("cpu", aten.add, aten.sub, aten.mul, aten.div)(probed(_no_formula, when=_mixed_floating))


# ---------------------------------------------------------------------------
# Layer rules for the closed-form fallback
# ---------------------------------------------------------------------------

#: module type -> rule(module, inputs, output) -> bytes saved for backward
LAYER_RULES: dict[type, LayerRule] = {}

#: module types that save nothing and produce only views
IGNORED_LAYERS: tuple[type, ...] = (nn.Identity, nn.Flatten, nn.Unflatten, nn.Sequential, nn.ModuleList, nn.ModuleDict)


def register_layer(*types: type) -> Callable[[LayerRule], LayerRule]:
    """Registers a fallback rule for module types."""

    def decorator(rule: LayerRule) -> LayerRule:
        for module_type in types:
            LAYER_RULES[module_type] = rule
        return rule

    return decorator


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def output_bytes(output: Any) -> int:
    """Bytes of every tensor in a layer's output."""
    return sum(_nbytes(t) for t in _tensors(output))


def input_bytes(inputs: tuple) -> int:
    """Bytes of every tensor in a layer's inputs."""
    return sum(_nbytes(t) for t in _tensors(inputs))


@register_layer(
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Bilinear
)
def _saves_input_and_output(module: nn.Module, inputs: tuple, output: Any) -> int:
    # the input is saved for the weight gradient; the output is alive for the next layer
    return input_bytes(inputs) + output_bytes(output)


@register_layer(nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Softplus)
def _saves_output(module: nn.Module, inputs: tuple, output: Any) -> int:
    if getattr(module, "inplace", False):
        return 0
    return output_bytes(output)


@register_layer(nn.GELU, nn.SiLU, nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.Softmax, nn.LogSoftmax)
def _saves_input_output(module: nn.Module, inputs: tuple, output: Any) -> int:
    return output_bytes(output)


@register_layer(
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
)
def _norm(module: nn.Module, inputs: tuple, output: Any) -> int:
    # input saved for backward, output alive
    return input_bytes(inputs) + output_bytes(output)


@register_layer(nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
def _dropout(module: nn.Module, inputs: tuple, output: Any) -> int:
    if not module.training or module.p == 0:
        return 0
    # a boolean mask plus the output
    return sum(t.numel() for t in _tensors(output)) + output_bytes(output)


@register_layer(nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)
def _maxpool(module: nn.Module, inputs: tuple, output: Any) -> int:
    # output plus int64 indices
    return output_bytes(output) + sum(t.numel() * 8 for t in _tensors(output))


@register_layer(
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.Embedding,
    nn.EmbeddingBag,
    nn.Upsample,
)
def _output_only(module: nn.Module, inputs: tuple, output: Any) -> int:
    return output_bytes(output)


@register_layer(nn.LSTM, nn.GRU, nn.RNN)
def _recurrent(module: nn.Module, inputs: tuple, output: Any) -> int:
    # per-step gates (4 or 3 hidden-sized blocks) are saved for every time step
    gates = {nn.LSTM: 4, nn.GRU: 3, nn.RNN: 1}.get(type(module), 4)
    out = _tensors(output)
    seq_bytes = _nbytes(out[0]) if out else 0
    directions = 2 if module.bidirectional else 1
    return (
        input_bytes(inputs[:1])
        + seq_bytes * (1 + gates) * module.num_layers // max(directions, 1)
        + output_bytes(output)
    )


@register_layer(nn.MultiheadAttention)
def _attention(module: nn.Module, inputs: tuple, output: Any) -> int:
    query = _tensors(inputs[:1])
    if not query:
        return output_bytes(output)
    q = query[0]
    batch_first = getattr(module, "batch_first", False)
    if q.dim() == 3:
        batch, seq = (q.shape[0], q.shape[1]) if batch_first else (q.shape[1], q.shape[0])
    else:
        batch, seq = 1, q.shape[0]
    scores = batch * module.num_heads * seq * seq * q.element_size()
    # q, k, v projections, attention probabilities (+ dropout mask), output projection input
    return 4 * _nbytes(q) + 2 * scores + output_bytes(output)
