"""The CUDA libraries of a training step: cuBLAS/cuDNN workspaces and the device's overhead.

What a fake-tensor trace cannot see on CUDA, modelled from how PyTorch sets the libraries up (sizes and tables:
:mod:`nnmem_callbacks.hardware.cuda_tables`): :class:`LibraryModel` logs the cuBLAS/cuBLASLt workspaces (two per
step: the user's thread and autograd's) as allocations never freed; cuDNN convolution workspaces are measured by a
bounded :class:`ConvProbe` on a device, else taken from the table; :func:`device_overhead` reads the context and
loaded libraries from the live device, or takes them from the table.

Design: docs/cuda-model.md, sections 2 to 4 and "Probes on the device".

Known limitations:
    * One stream per thread is assumed (side streams get their own workspaces).
    * Which GEMMs go through cuBLASLt (and so need a separate workspace when
      ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=0``) is approximated by the op:
      ``addmm`` (bias epilogue), ``_addmm_activation``, ``_scaled_mm``.
    * The context read from the device is device-wide: other processes on the
      same GPU count towards it. Kernels loaded lazily later in the run (other
      GEMM shapes, other cuDNN engines) are not in it.
    * cuDNN convolution workspaces depend on the GPU, cuDNN version, dtype and
      algorithm choice; without a device only the measured table entries apply.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections import Counter
from typing import Any, Callable, Iterator

import torch

from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.hardware import cuda_tables

__all__ = [
    "aten",
    "BACKWARD_THREAD",
    "BENCHMARK_NOTE",
    "blas_thread",
    "complete_closed_form",
    "CONV_BACKWARD_OPS",
    "CONV_FORWARD_OPS",
    "CONV_PROBE_BATCHES",
    "CONV_PROBE_EXACT_BYTES",
    "ConvProbe",
    "AllocatorCounters",
    "cudnn_benchmark_enabled",
    "device_index",
    "device_overhead",
    "GEMM_OPS",
    "library_model",
    "LibraryModel",
    "load_libraries",
    "LT_OPS",
    "PROBE_TENSOR_BYTES",
    "USER_THREAD",
    "uses_cudnn",
    "uses_gemm",
]

aten = torch.ops.aten


def _packets(*names: str) -> frozenset:
    """The aten overload packets of ``names`` that this torch has."""
    return frozenset(getattr(aten, name) for name in names if hasattr(aten, name))


#: Ops whose CUDA kernels call cuBLAS through ``getCurrentCUDABlasHandle`` (Blas.cpp / CUDABlas.cpp).
GEMM_OPS = _packets(
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "addbmm",
    "addmv",
    "mv",
    "dot",
    "vdot",
    "_addmm_activation",
    "_scaled_mm",
    "_int_mm",
)

#: Ops that may run through cuBLASLt (``gemm_and_bias`` / ``scaled_gemm`` in CUDABlas.cpp).
LT_OPS = _packets("addmm", "_addmm_activation", "_scaled_mm")

#: Convolution ops that cuDNN runs on CUDA.
CONV_FORWARD_OPS = _packets("convolution", "cudnn_convolution")
CONV_BACKWARD_OPS = _packets("convolution_backward")

BACKWARD_THREAD = "autograd device thread"
USER_THREAD = "user thread"


def blas_thread(phase: str) -> str:
    """The thread a phase's GEMMs run on: autograd's device thread for backward phases.

    Example:
        >>> blas_thread("step1/backward"), blas_thread("step2/forward.2"), blas_thread("step1/optimizer")
        ('autograd device thread', 'user thread', 'user thread')
    """
    return BACKWARD_THREAD if "/backward" in phase else USER_THREAD


@dataclasses.dataclass
class LibraryModel:
    """What the CUDA libraries allocate during a traced step on one device.

    Attributes:
        capability: The GPU's compute capability.
        cublas_bytes: The cuBLAS workspace per (thread, stream).
        cublaslt_bytes: A separate cuBLASLt workspace per (thread, stream), 0 when
            cuBLASLt shares the cuBLAS one (the default).
        source: Where the sizes come from ("the running torch" or the table).
        conv_probe: ``(op, args, out) -> bytes | None``: measures a convolution's
            workspace on the device (``None``: use the table).
        unmodelled: Convolution kinds seen without a workspace figure.
        probed: Convolutions measured by ``conv_probe``.
    """

    capability: tuple[int, int] = cuda_tables.DEFAULT_CAPABILITY
    cublas_bytes: int = cuda_tables.CUBLAS_LARGE_DEFAULT
    cublaslt_bytes: int = 0
    source: str = "table"
    conv_probe: Callable[[Any, tuple, Any], int | None] | None = None
    unmodelled: Counter = dataclasses.field(default_factory=Counter)
    probed: Counter = dataclasses.field(default_factory=Counter)
    table_used: Counter = dataclasses.field(default_factory=Counter)

    def persistent(self, packet: Any, phase: str, seen: set) -> list[tuple[str, int]]:
        """The workspaces ``packet`` creates in ``phase`` that ``seen`` lacks (and adds them).

        Args:
            packet: The op's overload packet.
            phase: The tracer's phase (which tells the thread).
            seen: ``(thread, library)`` pairs that already have a workspace in
                this trace; updated.

        Returns:
            ``(label, bytes)`` per new workspace.
        """
        if packet not in GEMM_OPS:
            return []
        thread = blas_thread(phase)
        new = []
        if (thread, "cublas") not in seen:
            seen.add((thread, "cublas"))
            new.append((f"cuBLAS workspace ({thread})", self.cublas_bytes))
        if self.cublaslt_bytes and packet in LT_OPS and (thread, "cublaslt") not in seen:
            seen.add((thread, "cublaslt"))
            new.append((f"cuBLASLt workspace ({thread})", self.cublaslt_bytes))
        return new

    def transient(self, packet: Any, args: tuple, out: Any) -> int:
        """The transient cuDNN workspace of a convolution (0 for other ops or when unknown)."""
        if packet in CONV_FORWARD_OPS:
            direction = "forward"
        elif packet in CONV_BACKWARD_OPS:
            direction = "backward"
        else:
            return 0
        # convolution(input, weight, ...); convolution_backward(grad_output, input, weight, ...)
        source, weight = (args[0], args[1]) if direction == "forward" else (args[1], args[2])
        # 1-D convolutions (3-D input) run through cuDNN as 2-D ones: a Keras Conv1D's backward-weight plan took
        # 520.9 MiB at batch 32 on an H200 (benchmarks/results/keras_torch_gpu_h200_cbtruth.md)
        if not isinstance(source, torch.Tensor) or source.dim() not in (3, 4, 5) or not source.dtype.is_floating_point:
            return 0
        if self.conv_probe is not None:
            measured = self.conv_probe(packet, args, out)
            if measured is not None:
                self.probed[direction] += 1
                return measured
        if source.dim() == 3:  # the table was measured on 2-D convolutions only
            self.unmodelled[f"{direction} {str(source.dtype).replace('torch.', '')} 1-D"] += 1
            return 0
        rule = cuda_tables.conv_workspace_rule(self.capability, str(source.dtype).replace("torch.", ""), direction)
        if rule is None:
            self.unmodelled[f"{direction} {str(source.dtype).replace('torch.', '')}"] += 1
            return 0
        self.table_used[direction] += 1
        return rule.bytes_for(_nbytes(source), _nbytes(weight))

    def record(self, workspace_ops: Counter) -> dict[str, Any]:
        """Plain values for ``MemoryEstimate.extra["cuda_libraries"]`` (see :func:`nnmem_callbacks.hardware.cuda_tables.for_capability`)."""
        return {
            "capability": list(self.capability),
            "source": self.source,
            "cublas_bytes": self.cublas_bytes,
            "cublas_workspaces": sum(1 for op in workspace_ops if str(op).startswith("cuBLAS workspace")),
            "cublaslt_bytes": self.cublaslt_bytes,
            "cublaslt_workspaces": sum(1 for op in workspace_ops if str(op).startswith("cuBLASLt workspace")),
        }

    def notes(self, workspace_ops: Counter | None = None) -> list[str]:
        """What the model assumed, for ``MemoryEstimate.notes``.

        Args:
            workspace_ops: The trace's workspace counter; the cuBLAS note is
                given only when a GEMM ran (default: always).
        """
        text = []
        if workspace_ops is None or any(str(op).startswith("cuBLAS") for op in workspace_ops):
            lt = (
                f" plus a separate cuBLASLt workspace of {format_bytes(self.cublaslt_bytes)}"
                if self.cublaslt_bytes
                else ""
            )
            text.append(
                f"cuBLAS workspaces from the caching allocator counted as 'workspaces': {format_bytes(self.cublas_bytes)}{lt} "
                f"at the first GEMM of the user's thread and of autograd's backward thread, kept for the process "
                f"(sizes from {self.source}); a process that already ran GEMMs on those threads holds them already"
            )
        probe = self.conv_probe
        if self.probed and isinstance(probe, ConvProbe):
            parts = []
            if probe.exact:
                parts.append(f"{len(probe.exact)} call shape(s) at the traced batch")
            if probe.fits:
                parts.append(
                    f"{len(probe.fits)} layer shape(s) whose tensors exceed {format_bytes(probe.exact_bytes)} fitted from "
                    f"batch {CONV_PROBE_BATCHES[0]} and {CONV_PROBE_BATCHES[1]} (cuDNN may choose another plan at the "
                    "training batch, with another workspace)"
                )
            text.append(
                f"cuDNN convolution workspaces measured on the device ({', '.join(sorted(self.probed))}): "
                f"{'; '.join(parts)}; {probe.runs} real call(s) with zero tensors (bounded probe; it resets the CUDA "
                "peak memory statistics)"
            )
        elif self.probed:
            text.append("cuDNN convolution workspaces measured on the device for: " + ", ".join(sorted(self.probed)))
        if isinstance(probe, ConvProbe) and probe.failed:
            text.append(
                "cuDNN convolution probes failed ("
                + ", ".join(f"{k} x{v}" for k, v in sorted(probe.failed.items()))
                + "); the table was used for those"
            )
        if cudnn_benchmark_enabled() and (self.probed or self.unmodelled or self.table_used):
            text.append(BENCHMARK_NOTE)
        if self.unmodelled:
            text.append(
                f"cuDNN convolution workspaces not modelled on sm_{self.capability[0]}{self.capability[1]} for: "
                + ", ".join(sorted(self.unmodelled))
                + " (no measured table entry and no device to probe); fp32 conv nets can need much more"
            )
        return text


#: What ``torch.backends.cudnn.benchmark = True`` adds, from pytorch ``aten/src/ATen/native/cudnn/Conv_v8.cpp``.
BENCHMARK_NOTE = (
    "torch.backends.cudnn.benchmark is on: the first step's algorithm search (Conv_v8.cpp generate_and_filter_plans) "
    "allocates, once per new convolution shape, the largest workspace among the candidate plans that fits the largest "
    "free block (free device memory or a cached block; halved on out-of-memory), so that first step can briefly take "
    "up to all free device memory; it is not in this peak. Later steps use the chosen plan's workspace. "
    "CUDNN_CONV_WSCAP_DBG (MiB) caps the workspaces cuDNN considers"
)


def cudnn_benchmark_enabled() -> bool:
    """Whether ``torch.backends.cudnn.benchmark`` is on."""
    return bool(getattr(torch.backends.cudnn, "benchmark", False))


def _nbytes(tensor: Any) -> int:
    if not isinstance(tensor, torch.Tensor):
        return 0
    return tensor.numel() * tensor.element_size()


def device_index(device: torch.device) -> int:
    """The CUDA index of ``device`` (the current device when it has none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def library_model(
    device: torch.device,
    notes: list[str],
    capability: tuple[int, int] | None = None,
    *,
    probe_convolutions: bool = True,
) -> LibraryModel:
    """The library sizes for training on ``device``.

    With a CUDA device present, the compute capability comes from it and the
    cuBLAS/cuBLASLt sizes from the running torch
    (``torch._C._cuda_getCublasWorkspaceSize``, torch >= 2.13), which honours
    ``torch.backends.cuda.cublas_workspace_size()`` as well as the environment.
    Without one, ``capability`` (default sm_90, said in ``notes``) and the
    environment give them through :mod:`nnmem_callbacks.hardware.cuda_tables`.
    With a device and ``probe_convolutions``, cuDNN convolution workspaces are
    measured by a :class:`ConvProbe`.
    """
    env = os.environ
    present = torch.cuda.is_available()
    if capability is None:
        if present:
            capability = tuple(torch.cuda.get_device_capability(device_index(device)))
        else:
            capability = cuda_tables.DEFAULT_CAPABILITY
            notes.append(
                f"no CUDA device here: compute capability {capability[0]}.{capability[1]} (Hopper) assumed for library sizes"
            )
    cublas = cuda_tables.cublas_workspace_bytes(capability, env)
    lt = 0 if cuda_tables.cublaslt_unified(env) else cuda_tables.cublaslt_workspace_bytes(capability, env)
    source = f"CublasHandlePool.cpp defaults for sm_{capability[0]}{capability[1]} and the environment"
    if present:
        getter = getattr(torch._C, "_cuda_getCublasWorkspaceSize", None)
        lt_getter = getattr(torch._C, "_cuda_getCublasLtWorkspaceSize", None)
        try:  # the current device's sizes; torch < 2.13 has no getter: keep the table
            if getter is not None:
                cublas = int(getter())
                source = "the running torch"
            if lt_getter is not None and lt:
                lt = int(lt_getter())
        except RuntimeError:
            pass
    probe = ConvProbe(torch.device("cuda", device_index(device))) if present and probe_convolutions else None
    return LibraryModel(
        capability=tuple(capability), cublas_bytes=cublas, cublaslt_bytes=lt, source=source, conv_probe=probe
    )


# ---------------------------------------------------------------------------
# cuDNN convolution workspaces measured on the device
# ---------------------------------------------------------------------------


class AllocatorCounters:
    """Reads the caching allocator's counters on one device (the probes' only side effect:
    ``reset_peak_memory_stats``, which the notes report)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> int:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device))


#: The batch sizes of the two real calls a convolution's workspace is fitted from (when the training batch's
#: tensors are above :data:`CONV_PROBE_EXACT_BYTES`).
CONV_PROBE_BATCHES = (1, 2)

#: A convolution is measured at the training batch itself when its tensors (inputs and outputs of the one call) take
#: at most this much. cuDNN's heuristics pick a different plan at a different batch, so a fit from small batches can
#: be far off: on an H200 a Keras Conv1D's backward-weight plan took 520.9 MiB at batch 32, a linear fit from batch
#: 1 and 2 gave almost none (benchmarks/results/keras_torch_gpu_h200_cbtruth.md).
CONV_PROBE_EXACT_BYTES = 256 * 2**20


@contextlib.contextmanager
def _cudnn_benchmark_off() -> Iterator[None]:
    """``torch.backends.cudnn.benchmark = False`` inside, the user's value restored after (nothing else touched)."""
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


class ConvProbe:
    """Measures a convolution's cuDNN workspace on the device, at the training batch where that is small.

    The call runs for real with zero tensors of the traced shapes, under the
    allocator's peak counter; the workspace is the peak beyond what was
    allocated before and the call's outputs. Where the call's tensors at the
    traced batch take at most ``exact_bytes``, it runs at that batch (cuDNN's
    heuristics choose the plan, and so the workspace, by shape: the same layer
    can need almost nothing at batch 2 and hundreds of MiB at batch 32).
    Larger calls run at batch 1 and 2 and the workspace is fitted as
    ``a + b * batch``: a bounded probe, reported as an extrapolation. One
    measurement per distinct layer shape, dtype, arguments (and batch). The
    probe runs with ``cudnn.benchmark`` off (the algorithm search is not
    bounded), so with benchmark on it measures the heuristics' choice.

    Args:
        device: The CUDA device the run trains on.
        meter: Reads allocator counters (default :class:`AllocatorCounters`; tests pass a fake).
        exact_bytes: The largest call (inputs and outputs) measured at the training batch.
    """

    def __init__(self, device: torch.device, meter: Any = None, exact_bytes: int = CONV_PROBE_EXACT_BYTES) -> None:
        self.device = device
        self.meter = meter or AllocatorCounters(device)
        self.exact_bytes = exact_bytes
        self.fits: dict[Any, tuple[float, float]] = {}
        self.exact: dict[Any, int] = {}
        self.runs = 0
        self.failed: Counter = Counter()

    @staticmethod
    def _batched(packet: Any) -> tuple[int, ...]:
        # convolution(input, ...): dim 0 of input; convolution_backward(grad_output, input, ...): both
        return (0,) if packet in CONV_FORWARD_OPS else (0, 1)

    def _key(self, packet: Any, args: tuple) -> Any:
        parts = []
        for index, value in enumerate(args):
            if isinstance(value, torch.Tensor):
                shape = tuple(value.shape[1:]) if index in self._batched(packet) else tuple(value.shape)
                parts.append(("T", shape, tuple(value.stride()) if value.dim() else (), value.dtype))
            else:
                parts.append(repr(value))
        return (str(packet), tuple(parts))

    def __call__(self, packet: Any, args: tuple, out: Any) -> int | None:
        if packet not in CONV_FORWARD_OPS and packet not in CONV_BACKWARD_OPS:
            return None
        key = self._key(packet, args)
        batch = int(args[0].shape[0]) if packet in CONV_FORWARD_OPS else int(args[1].shape[0])
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        call_bytes = sum(_nbytes(t) for t in args) + sum(_nbytes(t) for t in outputs)
        try:
            if call_bytes <= self.exact_bytes:
                if (key, batch) not in self.exact:
                    self.exact[(key, batch)] = self._measure_at(packet, args, batch)
                return self.exact[(key, batch)]
            if key not in self.fits:
                self.fits[key] = self._fit(packet, args)
        except (RuntimeError, ValueError) as error:  # the device refuses (OOM, unsupported): use the table
            self.failed[type(error).__name__] += 1
            return None
        fit = self.fits[key]
        return max(0, int(round(fit[0] + fit[1] * batch)))

    def _measure_at(self, packet: Any, args: tuple, batch: int) -> int:
        """One real call at ``batch``: the peak beyond what was allocated before and the call's outputs."""
        from nnmem_callbacks.probes.runner import isolated, real_tensor

        func = aten.convolution.default if packet in CONV_FORWARD_OPS else aten.convolution_backward.default
        if packet is aten.cudnn_convolution:
            func = aten.cudnn_convolution.default
        batched = self._batched(packet)
        # benchmark off: the search would try workspaces up to the free device memory (not a bounded probe);
        # the heuristics' choice is measured instead (BENCHMARK_NOTE says what the search adds)
        with (
            isolated(),
            _cudnn_benchmark_off(),
            torch.autocast("cuda", enabled=False),
            torch.utils._python_dispatch._disable_current_modes(),
        ):
            real = [
                real_tensor(value, (batch, *value.shape[1:]) if index in batched else None, device=str(self.device))
                if isinstance(value, torch.Tensor)
                else value
                for index, value in enumerate(args)
            ]
            before = self.meter.start()
            result = func(*real)
            peak = self.meter.peak()
            outputs = sum(_nbytes(t) for t in (result if isinstance(result, (tuple, list)) else (result,)))
            self.runs += 1
            del real, result
        return max(0, peak - before - outputs)

    def _fit(self, packet: Any, args: tuple) -> tuple[float, float]:
        """``(a, b)`` of ``a + b * batch`` from real calls at :data:`CONV_PROBE_BATCHES`."""
        (b1, b2) = CONV_PROBE_BATCHES
        w1, w2 = (self._measure_at(packet, args, batch) for batch in CONV_PROBE_BATCHES)
        slope = (w2 - w1) / (b2 - b1)
        return (w1 - slope * b1, slope)


# ---------------------------------------------------------------------------
# context and loaded libraries
# ---------------------------------------------------------------------------


#: Bytes of the tensors :func:`load_libraries` creates (all of them freed at its end).
PROBE_TENSOR_BYTES = 2 * 8 * 8 * 4 + 2 * 1 * 1 * 4 * 4 * 4 + 8 * 8 * 2 * 2


def load_libraries(device: torch.device, reduced_dtype: torch.dtype | None, gemm: bool, cudnn: bool) -> None:
    """Runs the tiny ops that make the run's handles and kernels exist.

    With ``gemm``: an 8x8 matmul forward and backward (cuBLAS handles and
    workspaces of this thread and of autograd's device thread), the same in
    ``reduced_dtype`` when the run uses one. With ``cudnn``: a 1x1x4x4
    convolution forward and backward. It touches no RNG and no module.
    """
    with torch.inference_mode(False), torch.enable_grad():
        if gemm:
            a = torch.ones((8, 8), device=device, requires_grad=True)
            (a @ a).sum().backward()
            del a
            if reduced_dtype is not None:
                b = torch.ones((8, 8), device=device, dtype=reduced_dtype, requires_grad=True)
                (b @ b).float().sum().backward()
                del b
        if cudnn:
            x = torch.ones((1, 1, 4, 4), device=device, requires_grad=True)
            w = torch.ones((1, 1, 1, 1), device=device, requires_grad=True)
            torch.nn.functional.conv2d(x, w).sum().backward()
            del x, w
        torch.cuda.synchronize(device)


def uses_cudnn(model: torch.nn.Module) -> bool:
    """Whether a model has layers PyTorch runs through cuDNN on CUDA (conv, batch norm, RNN)."""
    kinds = (torch.nn.modules.conv._ConvNd, torch.nn.modules.batchnorm._BatchNorm, torch.nn.RNNBase)
    return any(isinstance(module, kinds) for module in model.modules())


def device_overhead(
    device: torch.device,
    notes: list[str],
    *,
    reduced_dtype: torch.dtype | None = None,
    gemm: bool = True,
    cudnn: bool = True,
    capability: tuple[int, int] | None = None,
) -> int:
    """Device memory the run uses beyond the caching allocator: CUDA context and libraries.

    With a CUDA device present: :func:`load_libraries` runs (a bounded probe,
    reported in ``notes``), then ``total - free - memory_reserved`` is read
    from the driver. Without one: the table for the GPU family and CUDA major
    version (:data:`nnmem_callbacks.hardware.cuda_tables.CONTEXT_TABLE`), for a run
    that uses GEMMs (``gemm``) and/or cuDNN (``cudnn``).
    """
    if torch.cuda.is_available():
        index = device_index(device)
        target = torch.device("cuda", index)
        try:
            load_libraries(target, reduced_dtype, gemm, cudnn)
            free, total = torch.cuda.mem_get_info(index)
            measured = total - free - torch.cuda.memory_reserved(index)
        except RuntimeError as error:  # the probe must not end the estimate: use the table
            notes.append(
                f"the CUDA library probe failed ({type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''})"
            )
            measured = 0
        if measured > 0:
            notes.append(
                f"CUDA context and libraries read from the device: {format_bytes(measured)} "
                f"(total - free - reserved, device-wide) after a bounded probe ("
                + ", ".join(
                    (["8x8 matmul forward and backward"] if gemm else [])
                    + (
                        [f"the same in {str(reduced_dtype).replace('torch.', '')}"]
                        if gemm and reduced_dtype is not None
                        else []
                    )
                    + (["a 1x1x4x4 convolution forward and backward"] if cudnn else [])
                    or ["no op: the run uses neither cuBLAS nor cuDNN"]
                )
                + f"; under {PROBE_TENSOR_BYTES} B of tensors, plus the cuBLAS workspaces the run allocates anyway)"
            )
            return measured
    cuda_major = None
    version = getattr(torch.version, "cuda", None)
    if version:
        try:
            cuda_major = int(str(version).split(".")[0])
        except ValueError:
            cuda_major = None
    if capability is None:
        capability = cuda_tables.DEFAULT_CAPABILITY
    figures, exact = cuda_tables.context_figures(capability, cuda_major)
    figure = figures.for_run(gemm, cudnn)
    uses = " and ".join(name for name, used in (("cuBLAS", gemm), ("cuDNN", cudnn)) if used) or "no library"
    where = (
        ""
        if exact
        else (
            f" (the table has no entry for sm_{capability[0]}x with CUDA {cuda_major if cuda_major else '(unknown: a CPU build of torch)'}; "
            f"the nearest measured stack is used)"
        )
    )
    notes.append(
        f"CUDA context and libraries from the table: {format_bytes(figure)} for a run using {uses}, "
        f"measured on {figures.source}{where}"
    )
    return figure


def uses_gemm(model: torch.nn.Module) -> bool:
    """Whether a model has layers whose CUDA kernels call cuBLAS (linear and attention projections).

    Used where no trace says which ops ran (the closed-form fallback).

    Example:
        >>> uses_gemm(torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3))), uses_gemm(torch.nn.Linear(2, 2))
        (False, True)
    """
    kinds = (torch.nn.Linear, torch.nn.Bilinear, torch.nn.MultiheadAttention)
    return any(
        isinstance(module, kinds) or type(module).__name__ in ("Conv1D", "LinearLayer") for module in model.modules()
    )


def complete_closed_form(
    estimate: Any, model: torch.nn.Module, device: torch.device, precision_dtype: torch.dtype | None
) -> Any:
    """Adds what the CUDA libraries take to a closed-form (untraced) estimate for a CUDA target.

    The cuBLAS workspaces of the user's and autograd's threads when the model
    has GEMM layers (:func:`uses_gemm`), as fixed bytes of every phase, and
    the context and libraries as ``overhead_bytes``.
    """
    notes: list[str] = list(estimate.notes)
    libraries = library_model(device, notes, probe_convolutions=False)
    workspaces = 2 * (libraries.cublas_bytes + libraries.cublaslt_bytes) if uses_gemm(model) else 0
    category = "workspaces"
    breakdown = dict(estimate.breakdown)
    breakdown[category] = breakdown.get(category, 0) + workspaces
    phase_breakdowns = {
        phase: {**values, category: values.get(category, 0) + workspaces}
        for phase, values in estimate.phase_breakdowns.items()
    }
    phases = tuple(dataclasses.replace(line, fixed_bytes=line.fixed_bytes + workspaces) for line in estimate.phases)
    if workspaces:
        notes.append(
            f"closed-form estimate: the model has GEMM layers, so two cuBLAS workspaces ({format_bytes(libraries.cublas_bytes)} "
            f"each: the user's and autograd's threads) are added"
        )
    overhead = device_overhead(
        device,
        notes,
        reduced_dtype=precision_dtype,
        gemm=uses_gemm(model),
        cudnn=uses_cudnn(model),
        capability=libraries.capability,
    )
    extra = {
        **estimate.extra,
        "cuda_libraries": {
            "capability": list(libraries.capability),
            "source": libraries.source,
            "cublas_bytes": libraries.cublas_bytes,
            "cublas_workspaces": 2 if workspaces else 0,
            "cublaslt_bytes": libraries.cublaslt_bytes,
            "cublaslt_workspaces": 2 if workspaces and libraries.cublaslt_bytes else 0,
        },
    }
    return dataclasses.replace(
        estimate,
        peak_bytes=estimate.peak_bytes + workspaces,
        breakdown=breakdown,
        phases=phases,
        phase_breakdowns=phase_breakdowns,
        overhead_bytes=overhead,
        notes=tuple(notes),
        extra=extra,
    )
