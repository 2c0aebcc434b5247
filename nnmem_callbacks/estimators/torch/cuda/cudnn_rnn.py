"""cuDNN RNNs on fake tensors: allocate what ``aten._cudnn_rnn`` allocates.

``aten._cudnn_rnn``'s fake kernel cannot trace a training step, and CPU kernels keep other tensors for backward than
cuDNN does. For a CUDA target, :func:`cudnn_rnn_emulation` intercepts the RNN entry points (``torch._VF.lstm``,
``gru``, ``rnn_tanh``, ``rnn_relu``, padded and packed) and runs an autograd function that allocates, on the fake
device, what ``aten/src/ATen/native/cudnn/RNN.cpp`` allocates, in the same order. The sizes come from a bounded real
probe on a machine with the target GPU, else from :mod:`nnmem_callbacks.hardware.cudnn_rnn_sizes`.

Design: docs/cuda-model.md, "cuDNN RNNs".

Known limitations:
    * Inter-layer dropout masks and bf16 RNNs (not cuDNN-eligible: torch runs
      its native CUDA cells) are not modelled; bf16 traces keep the CPU kernels.
    * Packed sequences are sized for the padded extent (see
      :mod:`nnmem_callbacks.hardware.cudnn_rnn_sizes`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Any, Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from nnmem_callbacks.hardware import cudnn_rnn_sizes as sizes
from nnmem_callbacks.hardware.cudnn_rnn_sizes import RnnShape

_VARIABLE_FUNCTIONS = torch._C._VariableFunctions
_ENTRY_POINTS = {
    _VARIABLE_FUNCTIONS.lstm: "LSTM",
    _VARIABLE_FUNCTIONS.gru: "GRU",
    _VARIABLE_FUNCTIONS.rnn_tanh: "RNN_TANH",
    _VARIABLE_FUNCTIONS.rnn_relu: "RNN_RELU",
}

#: dtypes cuDNN runs RNNs in (``cudnn_is_acceptable``); others take torch's native cells
_CUDNN_DTYPES = (torch.float32, torch.float16, torch.float64)

#: (steps, batch) of the real probes on a GPU: small (the probe costs about
#: twice the layer's weights: the weights and cuDNN's flat copy of them), with
#: batches that are multiples of 8 so that any padding of the batch by cuDNN
#: behaves as at typical batch sizes
PROBE_POINTS = ((2, 8), (4, 8), (4, 16))

#: name under which probes and fallbacks are reported in the probe session's notes
OP_NAME = "aten._cudnn_rnn"

_PROBE_MEMO: dict[tuple, dict[str, list[int]]] = {}


@dataclasses.dataclass(frozen=True)
class _Spec:
    """One call's configuration, fixed before the autograd function runs."""

    shape: RnnShape
    steps: int
    batch: int
    packed: bool
    batch_first: bool
    train: bool
    compute_dtype: torch.dtype
    flattened: bool  # the weights are views of one flat buffer of the compute dtype
    has_biases: bool
    reserve_bytes: int
    workspace_bytes: int


# ---------------------------------------------------------------------------
# sizes
# ---------------------------------------------------------------------------


def cudnn_major() -> int | None:
    """The major version of the cuDNN torch was built with (``None`` without one)."""
    try:
        version = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001 - CPU builds
        return None
    if not version:
        return None
    return version // 10000 if version >= 90000 else version // 1000


def table_sizes(shape: RnnShape, steps: int, batch: int, element_size: int) -> tuple[int, int]:
    """(reserve, workspace) bytes from the committed rule."""
    return (
        sizes.reserve_bytes(shape, steps, batch, element_size),
        sizes.workspace_bytes(shape, steps, batch, element_size, cudnn_major()),
    )


def _line(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Least-squares ``a * n + b`` through ``(n, bytes)`` points."""
    count = len(points)
    mean_n = sum(n for n, _ in points) / count
    mean_v = sum(v for _, v in points) / count
    spread = sum((n - mean_n) ** 2 for n, _ in points)
    slope = sum((n - mean_n) * (v - mean_v) for n, v in points) / spread if spread else 0.0
    return slope, mean_v - slope * mean_n


def probe_entry(
    shape: RnnShape, dtype: torch.dtype, device: torch.device, has_biases: bool = True
) -> dict[str, list[int]]:
    """Runs ``torch._cudnn_rnn`` for real at :data:`PROBE_POINTS` on ``device``.

    Returns:
        ``{"n": [steps x batch...], "reserve": [bytes...], "workspace": [bytes...], "weights": [elements]}``:
        the reserve is the op's fourth output; the workspace is the peak of the
        call's own allocations (profiler events) less everything it returns.
    """
    from nnmem_callbacks.probes.runner import kernel_peak

    entry: dict[str, list[int]] = {"n": [], "reserve": [], "workspace": [], "weights": []}
    layers = shape.num_layers * shape.directions
    stride0 = (4 if has_biases else 2) + (1 if shape.proj_size else 0)
    with _outside_the_trace(device):
        weights = _probe_weights(shape, dtype, device, has_biases)
        for steps, batch in PROBE_POINTS:
            x = torch.zeros((steps, batch, shape.input_size), dtype=dtype, device=device)
            hx = torch.zeros((layers, batch, shape.output_size), dtype=dtype, device=device)
            cx = (
                torch.zeros((layers, batch, shape.hidden_size), dtype=dtype, device=device)
                if shape.mode == "LSTM"
                else None
            )
            out, peak = kernel_peak(
                functools.partial(
                    torch._cudnn_rnn,
                    x,
                    weights,
                    stride0,
                    None,
                    hx,
                    cx,
                    sizes.CUDNN_MODE[shape.mode],
                    shape.hidden_size,
                    shape.proj_size,
                    shape.num_layers,
                    False,
                    0.0,
                    True,
                    shape.bidirectional,
                    [],
                    None,
                ),
                strict=True,
            )
            returned = sum(t.numel() * t.element_size() for t in out if isinstance(t, torch.Tensor))
            if peak < returned:
                raise RuntimeError(
                    f"the profiler saw {peak} B of {device.type} allocations, less than the {returned} B returned"
                )
            entry["n"].append(steps * batch)
            entry["reserve"].append(int(out[3].numel() * out[3].element_size()))
            entry["workspace"].append(max(0, int(peak) - returned))
            entry["weights"].append(int(out[4].numel()))
            del out
    return entry


@contextlib.contextmanager
def _outside_the_trace(device: torch.device) -> Iterator[None]:
    """Real tensors, seen by no dispatch mode (fake mode, storage tracker) and no autocast."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.autocast(device.type, enabled=False), torch.no_grad():
        yield


def _probe_weights(shape: RnnShape, dtype: torch.dtype, device: torch.device, has_biases: bool) -> list[torch.Tensor]:
    rows = sizes.GATES[shape.mode] * shape.hidden_size
    weights = []
    for layer in range(shape.num_layers):
        inputs = shape.input_size if layer == 0 else shape.output_size * shape.directions
        for _ in range(shape.directions):
            layer_weights = [(rows, inputs), (rows, shape.output_size)]
            if has_biases:
                layer_weights += [(rows,), (rows,)]
            if shape.proj_size:
                layer_weights.append((shape.proj_size, shape.hidden_size))
            weights += [torch.zeros(s, dtype=dtype, device=device) for s in layer_weights]
    return weights


def probed_sizes(
    shape: RnnShape, dtype: torch.dtype, device: torch.device, steps: int, batch: int, has_biases: bool
) -> tuple[int, int] | None:
    """(reserve, workspace) bytes from a real probe on ``device``, or ``None``.

    ``None`` when no GPU of that kind is present, probing is off, the probe
    would exceed the probe session's memory cap, or it failed; the reason is
    recorded in the session's notes and the table applies.
    """
    from nnmem_callbacks.probes.runner import ProfilerBusy
    from nnmem_callbacks.probes.session import current_session

    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    session = current_session()
    if session is None or not session.settings.enabled:
        return None
    element = torch.empty((), dtype=dtype, device="meta").element_size()
    weight_bytes = sizes.weight_count(shape) * element
    if 2 * weight_bytes > session.cap:
        session.skipped.setdefault(f"the probe needs {2 * weight_bytes} B of weights, above the cap", set()).add(
            OP_NAME
        )
        return None
    key = f"cudnn_rnn:{shape!r}:{dtype}:{has_biases}"
    entry = session.lookup(key) or _PROBE_MEMO.get((key, str(device)))
    if entry is None:
        started = time.perf_counter()
        try:
            entry = probe_entry(shape, dtype, device, has_biases)
        except ProfilerBusy:
            session.skipped.setdefault("another profiler is running", set()).add(OP_NAME)
            return None
        except Exception as error:  # noqa: BLE001 - the table applies
            session.failed[OP_NAME] = (
                f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
            )
            return None
        _PROBE_MEMO[(key, str(device))] = entry
        session.record(key, entry, runs=len(PROBE_POINTS), seconds=time.perf_counter() - started)
    n = steps * batch
    values = []
    for name in ("reserve", "workspace"):
        slope, intercept = _line(list(zip(entry["n"], entry[name])))
        values.append(max(0, int(round(slope * n + intercept))))
    return values[0], values[1]


# ---------------------------------------------------------------------------
# the autograd function
# ---------------------------------------------------------------------------


def _transient(nbytes: int, device: torch.device) -> None:
    """Allocates and frees ``nbytes`` on ``device`` (a kernel workspace)."""
    if nbytes > 0:
        torch.empty((int(nbytes),), dtype=torch.uint8, device=device)  # dropped at once: allocated, then freed


def _time_major(tensor: torch.Tensor, spec: _Spec) -> torch.Tensor:
    """``input.contiguous()`` after RNN.cpp's transpose of a batch-first input."""
    if spec.batch_first and not spec.packed:
        tensor = tensor.transpose(0, 1)
    return tensor.contiguous()


class _CudnnRNN(torch.autograd.Function):
    """``aten._cudnn_rnn`` and its backward, allocating as cuDNN does."""

    @staticmethod
    def forward(
        ctx, spec: _Spec, input: torch.Tensor, hx: torch.Tensor, cx: torch.Tensor | None, *weights: torch.Tensor
    ):  # noqa: A002
        device = input.device
        dtype = spec.compute_dtype
        shape = spec.shape
        # autocast: cached_cast(kHalf, input/hx/cx); these casts are what _cudnn_rnn saves
        x_in = input.to(dtype) if input.dtype != dtype else input
        hx_in = hx.to(dtype) if hx.dtype != dtype else hx
        cx_in = cx.to(dtype) if cx is not None and cx.dtype != dtype else cx
        weight_buf = None
        if not spec.flattened:
            # RNN.cpp: weight_buf = at::empty(num_weights); zero_(); _copyParams (or AutocastRNN's fp16 copy)
            weight_buf = torch.zeros((sizes.weight_count(shape),), dtype=dtype, device=device)
        x = _time_major(x_in, spec)
        out_features = shape.output_size * shape.directions
        if spec.packed:
            output = torch.empty((x.shape[0], out_features), dtype=dtype, device=device)
        else:
            output = torch.empty((spec.steps, spec.batch, out_features), dtype=dtype, device=device)
        layers = shape.num_layers * shape.directions
        hy = torch.empty((layers, spec.batch, shape.output_size), dtype=dtype, device=device)
        cy = torch.empty(
            (layers, spec.batch, shape.hidden_size) if cx is not None else (0,), dtype=dtype, device=device
        )
        # the workspace and the reserve are both allocated before the kernel runs; the workspace (and the
        # contiguous input) are freed when it returns
        held = [x, torch.empty((spec.workspace_bytes,), dtype=torch.uint8, device=device)]
        reserve = torch.empty((spec.reserve_bytes if spec.train else 0,), dtype=torch.uint8, device=device)
        del x
        held.clear()
        ctx.spec = spec
        ctx.weight_meta = [(tuple(w.shape), w.dtype) for w in weights]
        ctx.input_dtypes = (input.dtype, hx.dtype, cx.dtype if cx is not None else None)
        ctx.has_cx = cx is not None
        saved = [x_in, hx_in, output, reserve]
        if cx_in is not None:
            saved.append(cx_in)
        if weight_buf is not None:
            saved.append(weight_buf)
        ctx.save_for_backward(*saved)
        if cx is None:
            ctx.mark_non_differentiable(cy)
        if spec.batch_first and not spec.packed:
            output = output.transpose(0, 1)
        return output, hy, cy

    @staticmethod
    def backward(ctx, grad_output, grad_hy, grad_cy):
        spec: _Spec = ctx.spec
        shape = spec.shape
        saved = ctx.saved_tensors
        x_in, hx_in, output, reserve = saved[:4]
        device = x_in.device
        dtype = spec.compute_dtype
        if not spec.train:
            raise RuntimeError("cudnn RNN backward can only be called in training mode")
        # _cudnn_rnn_backward_input
        x = _time_major(x_in, spec)
        dy = _time_major(grad_output, spec)
        dhy = grad_hy.contiguous()
        dcy = grad_cy.contiguous() if ctx.has_cx else None
        dx = torch.empty(x.shape, dtype=dtype, device=device)
        dhx = torch.empty(hx_in.shape, dtype=dtype, device=device)
        dcx = (
            torch.empty(
                (shape.num_layers * shape.directions, spec.batch, shape.hidden_size), dtype=dtype, device=device
            )
            if ctx.has_cx
            else None
        )
        _transient(spec.workspace_bytes, device)
        del x, dy, dhy, dcy
        if spec.batch_first and not spec.packed:
            dx = dx.transpose(0, 1)
        # _cudnn_rnn_backward_weight (only when a weight needs its gradient)
        weight_grads: list[torch.Tensor | None] = [None] * len(ctx.weight_meta)
        if any(ctx.needs_input_grad[4:]):
            held = [_time_major(x_in, spec)]  # x.contiguous(), alive during the kernel
            dw = torch.zeros((sizes.weight_count(shape),), dtype=dtype, device=device)
            _transient(spec.workspace_bytes, device)
            held.clear()
            same_layout = spec.has_biases and all(d == dtype for _, d in ctx.weight_meta)
            offset = 0
            for index, (weight_shape, weight_dtype) in enumerate(ctx.weight_meta):
                numel = 1
                for dim in weight_shape:
                    numel *= dim
                if same_layout:
                    # _viewParams: the gradients are views of dw
                    grad = dw.narrow(0, offset, numel).view(weight_shape)
                else:
                    # _copyParams into fresh tensors (autocast: fp16 dw -> each parameter's dtype)
                    grad = torch.empty(weight_shape, dtype=weight_dtype, device=device)
                offset += numel
                if ctx.needs_input_grad[4 + index]:
                    weight_grads[index] = grad
            del dw
        input_dtype, hx_dtype, cx_dtype = ctx.input_dtypes
        dx = dx.to(input_dtype) if ctx.needs_input_grad[1] else None
        dhx = dhx.to(hx_dtype) if ctx.needs_input_grad[2] else None
        dcx = dcx.to(cx_dtype) if dcx is not None and ctx.needs_input_grad[3] else None
        return (None, dx, dhx, dcx, *weight_grads)


# ---------------------------------------------------------------------------
# interception
# ---------------------------------------------------------------------------


_GETITEM = torch.Tensor.__getitem__


def _is_real_sizes(tensor: Any) -> bool:
    """A real (not fake) 1-D integer CPU tensor, such as ``PackedSequence.batch_sizes``."""
    from torch._subclasses.fake_tensor import FakeTensor

    return (
        isinstance(tensor, torch.Tensor)
        and not isinstance(tensor, FakeTensor)
        and tensor.device.type == "cpu"
        and tensor.dim() == 1
        and not tensor.is_floating_point()
    )


def _int_list_on_cpu(args: tuple, kwargs: dict) -> bool:
    """``torch.as_tensor(<list of Python ints>, dtype=torch.int64, device="cpu")``."""
    data = args[0] if args else kwargs.get("data")
    device = kwargs.get("device")
    return (
        isinstance(data, (list, tuple))
        and all(type(v) is int for v in data)
        and kwargs.get("dtype") == torch.int64
        and device is not None
        and torch.device(device).type == "cpu"
    )


def _int_values(tensor: Any) -> list[int] | None:
    """The values of a real integer tensor or of a fake one that carries its constant."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes

    if isinstance(tensor, FakeTensor):
        tensor = tensor.constant
        if tensor is None:
            return None
    if not isinstance(tensor, torch.Tensor) or tensor.is_floating_point():
        return None
    with _disable_current_modes():
        return [int(v) for v in tensor.reshape(-1).tolist()]


def _real_sizes(values: list[int]) -> torch.Tensor:
    """A real CPU int64 tensor, made outside every dispatch mode (not a device allocation)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return torch.tensor(values, dtype=torch.int64)


def _packed_rows(batch_sizes: list[int], batch: int) -> list[int]:
    """Rows of the time-major ``(steps * batch)`` layout that a packed batch keeps, in order."""
    return [step * batch + row for step, count in enumerate(batch_sizes) for row in range(count)]


def _pack_padded(input: torch.Tensor, lengths: Any, batch_first: bool) -> Any:  # noqa: A002 - torch's names
    """``aten._pack_padded_sequence`` for lengths known to the trace (its fake kernel has none).

    Lengths from a real tensor or a Python list are known; lengths computed
    from the batch are data, and the op stays untraceable.
    """
    values = _int_values(lengths)
    if values is None or not values or any(a < b for a, b in zip(values, values[1:])):
        return None
    batch_sizes = [sum(1 for length in values if length > step) for step in range(values[0])]
    time_major = input.transpose(0, 1) if batch_first else input
    steps, batch = int(time_major.shape[0]), int(time_major.shape[1])
    flat = time_major.reshape(steps * batch, *time_major.shape[2:])
    rows = torch.tensor(_packed_rows(batch_sizes, batch), dtype=torch.int64, device=input.device)
    return flat.index_select(0, rows), _real_sizes(batch_sizes)


def _pad_packed(
    data: torch.Tensor, batch_sizes: Any, batch_first: bool, padding_value: float, total_length: int
) -> Any:
    """``aten._pad_packed_sequence`` for real ``batch_sizes``: the padded output and the lengths."""
    sizes_list = _int_values(batch_sizes)
    if sizes_list is None or not sizes_list:
        return None
    batch = sizes_list[0]
    steps = max(len(sizes_list), int(total_length))
    rows = torch.tensor(_packed_rows(sizes_list, batch), dtype=torch.int64, device=data.device)
    padded = data.new_full((steps * batch, *data.shape[1:]), padding_value).index_copy(0, rows, data)
    padded = padded.view(steps, batch, *data.shape[1:])
    if batch_first:
        padded = padded.transpose(0, 1)
    lengths = [sum(1 for count in sizes_list if count > row) for row in range(batch)]
    return padded, _real_sizes(lengths)


def _would_be_flat(module: nn.RNNBase) -> bool:
    """Whether ``module``'s weights are (or will be, once on CUDA) views of one buffer.

    ``RNNBase._apply`` (``.cuda()``, ``.to()``) calls ``flatten_parameters``,
    which flattens weights of one floating dtype that do not alias. Weights
    already on CUDA are flat if they share one storage.
    """
    weights = [w for w in getattr(module, "_flat_weights", []) if isinstance(w, torch.Tensor)]
    if not weights or len(weights) != len(module._flat_weights_names):
        return False
    dtype = weights[0].dtype
    if any(w.dtype != dtype for w in weights) or dtype not in _CUDNN_DTYPES:
        return False
    if weights[0].is_cuda:
        try:
            return len({w.untyped_storage().data_ptr() for w in weights}) == 1
        except Exception:  # noqa: BLE001
            return False
    return len({id(w) for w in weights}) == len(weights)


class _RnnCalls(TorchFunctionMode):
    """Sends the RNN entry points to :class:`_CudnnRNN` (see :func:`cudnn_rnn_emulation`)."""

    def __init__(self, modules: list[nn.RNNBase]) -> None:
        super().__init__()
        self.modules = modules
        self.flat = {id(m): _would_be_flat(m) for m in modules}
        self.calls = 0
        self.sources: dict[str, int] = {}
        self.dropout_state: torch.Tensor | None = None

    def _flat_ids(self) -> set[int]:
        ids: set[int] = set()
        for module in self.modules:
            if self.flat[id(module)]:
                ids.update(id(p) for p in module._parameters.values() if p is not None)
        return ids

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        mode = _ENTRY_POINTS.get(func)
        if mode is not None and not kwargs:
            result = self._rnn(mode, args)
            if result is not None:
                return result
        elif func is _GETITEM and len(args) == 2 and type(args[1]) is int and _is_real_sizes(args[0]):
            # PackedSequence.batch_sizes is a real CPU tensor: nn.RNNBase reads
            # batch_sizes[0] for the hidden state's batch; it is given as a
            # Python int (.item() inside the trace would give a placeholder)
            return args[0].tolist()[args[1]]
        elif func is _VARIABLE_FUNCTIONS.as_tensor and _int_list_on_cpu(args, kwargs):
            # pack_padded_sequence's torch.as_tensor(lengths, dtype=int64, device="cpu"):
            # Python ints, known to the trace, so keep them real
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():
                return func(*args, **kwargs)
        elif func is _VARIABLE_FUNCTIONS._pack_padded_sequence:
            result = _pack_padded(*args, **kwargs)
            if result is not None:
                return result
        elif func is _VARIABLE_FUNCTIONS._pad_packed_sequence:
            result = _pad_packed(*args, **kwargs)
            if result is not None:
                return result
        return func(*args, **kwargs)

    def _rnn(self, mode: str, args: tuple) -> Any:
        packed = isinstance(args[1], torch.Tensor) if mode == "LSTM" else isinstance(args[2], torch.Tensor)
        if packed:
            data, batch_sizes, hidden, weights, has_biases, num_layers, dropout, train, bidirectional = args
            batch_first = False
        else:
            data, hidden, weights, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
            batch_sizes = None
        if not torch.backends.cudnn.enabled or not isinstance(data, torch.Tensor):
            return None
        if mode == "LSTM":
            hx, cx = hidden
        else:
            hx, cx = hidden, None
        weights = list(weights)
        device = data.device
        autocast = torch.is_autocast_enabled(device.type) and weights[0].dtype in (torch.float32, torch.float64)
        compute_dtype = torch.float16 if autocast else data.dtype
        if compute_dtype not in _CUDNN_DTYPES or any(w.dtype != weights[0].dtype for w in weights):
            return None
        hidden_size = int(cx.shape[2]) if cx is not None else int(hx.shape[2])
        proj_size = int(hx.shape[2]) if cx is not None and int(hx.shape[2]) != hidden_size else 0
        shape = RnnShape(mode, int(data.shape[-1]), hidden_size, int(num_layers), bool(bidirectional), proj_size)
        batch = int(hx.shape[1])
        if packed:
            steps = int(batch_sizes.shape[0])
        else:
            steps = int(data.shape[1] if batch_first else data.shape[0])
        element = torch.empty((), dtype=compute_dtype, device="meta").element_size()
        measured = probed_sizes(shape, compute_dtype, device, steps, batch, bool(has_biases)) if train else None
        if measured is None:
            reserve, workspace = table_sizes(shape, steps, batch, element)
            self._count("table")
        else:
            reserve, workspace = measured
            self._count("probe")
        flat_ids = self._flat_ids()
        flattened = not autocast and all(id(w) in flat_ids for w in weights)
        spec = _Spec(
            shape,
            steps,
            batch,
            packed,
            bool(batch_first),
            bool(train),
            compute_dtype,
            flattened,
            bool(has_biases),
            reserve,
            workspace,
        )
        if train and dropout > 0 and self.dropout_state is None:
            # get_dropout_state: allocated on the first training call with dropout, cached for the process
            self.dropout_state = torch.empty((sizes.DROPOUT_STATE_BYTES,), dtype=torch.uint8, device=device)
        self.calls += 1
        output, hy, cy = _CudnnRNN.apply(spec, data, hx, cx, *weights)
        if mode == "LSTM":
            return output, hy, cy
        return output, hy

    def _count(self, source: str) -> None:
        self.sources[source] = self.sources.get(source, 0) + 1
        if source == "table":
            from nnmem_callbacks.probes.session import current_session

            session = current_session()
            if session is not None:
                major = cudnn_major()
                row = sizes.workspace_fit(major)[2]
                reason = (
                    f"cuDNN RNN reserve and workspace from the rule in nnmem_callbacks.hardware.cudnn_rnn_sizes "
                    f"(cuDNN {major or sizes.DEFAULT_CUDNN_MAJOR} row: {row})"
                )
                session.skipped.setdefault(reason, set()).add(OP_NAME)


@contextlib.contextmanager
def cudnn_rnn_emulation(model: nn.Module | None = None, enabled: bool = True) -> Iterator[_RnnCalls | None]:
    """Runs the RNNs called in the block as cuDNN would allocate them.

    Enter it before the model's parameters are swapped for fakes: whether each
    ``nn.RNNBase``'s weights are flat (one buffer, no per-call copy) is read
    from the real parameters. ``flatten_parameters`` is a no-op inside (on
    fake tensors it can only fail or do nothing).

    Args:
        model: The user's model (``None``: functional calls only; their weights
            count as not flat).
        enabled: ``False`` makes this a no-op (for CPU targets).

    Example:
        >>> import torch
        >>> from torch._subclasses.fake_tensor import FakeTensorMode
        >>> lstm = torch.nn.LSTM(8, 16, num_layers=2)
        >>> with cudnn_rnn_emulation(lstm) as calls, FakeTensorMode(allow_non_fake_inputs=True):
        ...     out, (h, c) = lstm(torch.empty(5, 3, 8))
        >>> calls.calls, tuple(out.shape), tuple(c.shape)
        (1, (5, 3, 16), (2, 3, 16))
    """
    if not enabled:
        yield None
        return
    modules = [m for m in model.modules() if isinstance(m, nn.RNNBase)] if model is not None else []
    calls = _RnnCalls(modules)
    patched = []
    for module in modules:
        if "flatten_parameters" not in vars(module):
            module.flatten_parameters = _no_flatten
            patched.append(module)
    try:
        with calls:
            yield calls
    finally:
        for module in patched:
            vars(module).pop("flatten_parameters", None)
        calls.dropout_state = None


def _no_flatten() -> None:
    return None


__all__ = ["cudnn_rnn_emulation", "probe_entry", "probed_sizes", "table_sizes"]
