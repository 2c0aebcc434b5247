"""Ground truth for the accuracy benchmark: measured peak memory of real training steps.

CPU (``measure_cpu_peak``): two real training steps run under
``torch.profiler.profile(profile_memory=True)``. Every allocation and free the
c10 CPU allocator reports becomes an ``Allocation`` node of the profiler's event
tree; sorted by time, their running sum is the change of live tensor bytes, and
its maximum plus the bytes already live before profiling (parameters, buffers,
the batch, eagerly created optimizer state; unique storages) is the peak. This
does not depend on dispatch-level tracking, so it sees allocations that happen
inside kernels (oneDNN/MKL workspaces, im2col buffers, temporary clones).

Not seen: memory that bypasses the c10 allocator (oneDNN primitive caches and
scratchpads it mallocs itself, OpenMP thread stacks, the Python heap).

CUDA (``measure_cuda_peak``): ``max_memory_allocated`` / ``max_memory_reserved``
after ``reset_peak_memory_stats`` with the model and the batch already on the
device, plus ``mem_get_info`` for what the device shows beyond the allocator.

The fair CUDA truth is a fresh process per case: PyTorch allocates a cuBLAS
workspace from the caching allocator at the first GEMM of each thread (the
user's, and autograd's backward thread) and keeps it for the process, and
cuDNN loads its kernels on first use. A real training run starts fresh and
pays them inside its ``max_memory_allocated``; a case measured after another
one in the same process would not (the workspaces are then "leftover"). So the
accuracy benchmark runs every CUDA combination in its own child process and
measures the ground truth before the estimate (whose bounded device probe
creates the same handles), and the prediction includes the workspaces
(``breakdown["workspaces"]``). ``leftover_bytes`` reports what was allocated
before the steps; in a fresh process it is 0.

Evidence (gpu-runs/2026-11-23-h100/zoo_cuda.json, first combination of each
worker, where the estimate still ran first): the traced cases hold two 32 MiB
workspaces from step 1 on (mlp: 34.97 MiB at step1/forward over a 1.48 MiB
baseline, 67.49 MiB at step1/optimizer), but data_dependent and lstm, whose
closed-form fallback ran real layers on the device before the truth, hold only
the backward thread's one (data_dependent: 11.03 MiB at step1/forward, 40.18
MiB at step1/optimizer over 3.39 MiB).

Phases are named ``step{1,2}/{forward,backward,optimizer,zero_grad}``, the same
convention as :class:`nnmem_callbacks.core.estimate.PhaseLine`.
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.nn as nn

__all__ = [
    "measure_cpu_peak",
    "measure_cuda_peak",
    "live_bytes",
    "iter_tensors",
    "allocation_events",
    "autocast_for",
    "to_device",
    "PHASES",
]

PHASES = ("forward", "backward", "optimizer", "zero_grad")
_MARK = "nnmem_gt/"


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Yields every tensor in a (nested) tensor / tuple / list / dict."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from iter_tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from iter_tensors(value)


def _optimizer_state_tensors(optimizer: torch.optim.Optimizer | None) -> Iterator[torch.Tensor]:
    if optimizer is None:
        return
    for state in optimizer.state.values():
        yield from iter_tensors(dict(state))


def live_bytes(tensors: Iterable[torch.Tensor], device_type: str | None = None) -> int:
    """Bytes of the unique storages behind ``tensors`` (tied weights and views count once).

    Args:
        tensors: Any tensors; grads of parameters are not followed.
        device_type: Only count storages on this device type (``"cpu"``, ``"cuda"``).
    """
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    seen: dict[tuple[str, int], int] = {}
    tensors = list(tensors)
    while any(is_traceable_wrapper_subclass(t) for t in tensors):  # torchao's quantized weights: their inner tensors
        tensors = [inner for t in tensors for inner in _flattened(t)]
    for t in tensors:
        if t.device.type == "meta" or (device_type is not None and t.device.type != device_type):
            continue
        st = t.untyped_storage()
        key = (str(t.device), st.data_ptr())
        if st.data_ptr() == 0:  # empty storage
            continue
        seen[key] = max(seen.get(key, 0), st.nbytes())
    return sum(seen.values())


def _flattened(tensor: torch.Tensor) -> list[torch.Tensor]:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(tensor):
        return [tensor]
    return [getattr(tensor, name) for name in tensor.__tensor_flatten__()[0]]


def _state_tensors(model: nn.Module, batch: Any, optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    tensors = list(model.parameters()) + list(model.buffers()) + list(iter_tensors(batch))
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    tensors += list(_optimizer_state_tensors(optimizer))
    return tensors


def autocast_for(precision: str, device_type: str) -> contextlib.AbstractContextManager:
    """The autocast context of a Lightning precision name on ``device_type`` (none for ``32-true``)."""
    if precision == "bf16-mixed":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if precision == "16-mixed":
        return torch.autocast(device_type, dtype=torch.float16)
    if precision in ("32-true", "32", 32):
        return contextlib.nullcontext()
    raise ValueError(f"unknown precision {precision!r}; valid: '32-true', 'bf16-mixed', '16-mixed'")


def _fresh(model: nn.Module, batch: Any, device: Any, seed: int) -> tuple[nn.Module, Any]:
    torch.manual_seed(seed)
    model = copy.deepcopy(model).to(device)
    model.train()
    batch = to_device(batch, device)
    return model, batch


def to_device(batch: Any, device: Any) -> Any:
    """``batch`` (a tensor, or a dict, list or tuple of them) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def _steps(
    model: nn.Module,
    batch: Any,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    precision: str,
    device_type: str,
    phase: Callable[[str], contextlib.AbstractContextManager],
    n_steps: int = 2,
) -> list[float]:
    losses = []
    for step in range(1, n_steps + 1):
        with phase(f"step{step}/forward"):
            with autocast_for(precision, device_type):
                loss = loss_fn(model, batch)
        with phase(f"step{step}/backward"):
            loss.backward()
        with phase(f"step{step}/optimizer"):
            optimizer.step()
        with phase(f"step{step}/zero_grad"):
            optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        del loss
    return losses


# ---------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------
def allocation_events(prof: Any, device_type: str = "cpu") -> list[Any]:
    """Allocation nodes (``tag == Allocation``) of a finished profile, sorted by time."""
    from torch._C._profiler import _EventType

    out = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            dev = node.extra_fields.device
            if device_type is None or dev.type == device_type:
                out.append(node)
        stack.extend(node.children)
    out.sort(key=lambda n: n.start_time_ns)
    return out


def _phase_intervals(prof: Any) -> list[tuple[int, int, str]]:
    from torch._C._profiler import _EventType

    intervals = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.TorchOp and node.name.startswith(_MARK):
            intervals.append((node.start_time_ns, node.end_time_ns, node.name[len(_MARK) :]))
            continue  # phases do not nest
        stack.extend(node.children)
    intervals.sort()
    return intervals


def measure_cpu_peak(
    model: nn.Module,
    batch: Any,
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    precision: str = "32-true",
    *,
    seed: int = 0,
    n_steps: int = 2,
    copy_model: bool = True,
) -> dict[str, Any]:
    """Measures the peak of live CPU tensor bytes during ``n_steps`` real training steps.

    Args:
        model: The model; a deep copy is trained (unless ``copy_model=False``).
        batch: Tensor, tuple or dict of tensors (moved to CPU).
        make_optimizer: ``params -> optimizer``; called before profiling.
        loss_fn: ``(model, batch) -> scalar loss``; forward + loss.
        precision: ``"32-true"`` or ``"bf16-mixed"`` (forward and loss under CPU autocast).
        seed: ``torch.manual_seed`` before building the copy and running.

    Returns:
        A dict with ``peak_bytes`` (baseline + max running delta), ``baseline_bytes``,
        ``delta_peak_bytes``, ``peak_phase``, ``phase_peaks`` (absolute peak per
        phase), ``end_bytes`` (live after the run), ``wall_s`` (the steps
        under the profiler), ``n_alloc_events`` and ``losses``.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    if copy_model:
        model, batch = _fresh(model, batch, "cpu", seed)
    else:
        torch.manual_seed(seed)
    optimizer = make_optimizer(model.parameters())
    baseline = live_bytes(_state_tensors(model, batch, optimizer), "cpu")

    def phase(name: str) -> contextlib.AbstractContextManager:
        return record_function(_MARK + name)

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        losses = _steps(model, batch, optimizer, loss_fn, precision, "cpu", phase, n_steps)
    wall = time.perf_counter() - t0

    events = allocation_events(prof, "cpu")
    intervals = _phase_intervals(prof)
    phase_peaks: dict[str, int] = {name: 0 for _, _, name in intervals}
    running, peak = 0, 0
    peak_phase_name = "setup"
    idx = 0
    current_phase = "setup"
    for ev in events:
        running += ev.extra_fields.alloc_size
        t = ev.start_time_ns
        while idx < len(intervals) and intervals[idx][1] < t:
            idx += 1
        if idx < len(intervals) and intervals[idx][0] <= t <= intervals[idx][1]:
            current_phase = intervals[idx][2]
        else:
            current_phase = "between"
        if running > peak:
            peak = running
            peak_phase_name = current_phase
        if current_phase in phase_peaks:
            phase_peaks[current_phase] = max(phase_peaks[current_phase], baseline + running)
    # a phase without allocations peaks at the level it was entered with: fill from running sums
    _fill_quiet_phases(events, intervals, phase_peaks, baseline)

    return {
        "peak_bytes": baseline + peak,
        "baseline_bytes": baseline,
        "delta_peak_bytes": peak,
        "peak_phase": peak_phase_name,
        "phase_peaks": phase_peaks,
        "end_bytes": baseline + running,
        "wall_s": wall,
        "n_alloc_events": len(events),
        "losses": losses,
    }


def _fill_quiet_phases(
    events: list[Any], intervals: list[tuple[int, int, str]], phase_peaks: dict[str, int], baseline: int
) -> None:
    """A phase's peak is at least the live bytes when it starts."""
    running, i = 0, 0
    for start, _end, name in intervals:
        while i < len(events) and events[i].start_time_ns < start:
            running += events[i].extra_fields.alloc_size
            i += 1
        phase_peaks[name] = max(phase_peaks.get(name, 0), baseline + running)


# ---------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------
def measure_cuda_peak(
    model: nn.Module,
    batch: Any,
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    precision: str = "32-true",
    *,
    device: Any = "cuda",
    seed: int = 0,
    n_steps: int = 2,
) -> dict[str, Any]:
    """Measures the CUDA peak of ``n_steps`` real training steps.

    The model copy, the batch and the optimizer exist on the device before the
    peak statistics are reset. Per-phase peaks come from resetting the peak
    statistics at every phase start (which changes nothing in the allocator);
    the overall peaks are their maximum.

    Returns:
        ``peak_bytes`` (``max_memory_allocated`` minus tensors left over from
        earlier work in the process, ``leftover_bytes``), ``reserved_bytes``
        (``max_memory_reserved``), ``baseline_bytes`` (allocated before the
        steps), ``overhead_bytes`` (device use per ``mem_get_info`` minus the
        allocator's current reserve: CUDA context, cuBLAS workspace, other
        libraries), ``device_peak_bytes`` (reserved + overhead),
        ``device_used_before`` / ``device_used_after``, ``phase_peaks``,
        ``phase_reserved``, ``peak_phase``, ``wall_s``, ``losses``.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"measure_cuda_peak needs a cuda device, got {device}")
    if (
        device.index is None
    ):  # torch >= 2.11: set_device needs an index ("Expected a torch.device with a specified index")
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    leftover = torch.cuda.memory_allocated(device)  # tensors of earlier work in this process
    free0, total = torch.cuda.mem_get_info(device)
    model, batch = _fresh(model, batch, device, seed)
    optimizer = make_optimizer(model.parameters())
    torch.cuda.synchronize(device)
    baseline = torch.cuda.memory_allocated(device) - leftover

    phase_peaks: dict[str, int] = {}
    phase_reserved: dict[str, int] = {}

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield
        torch.cuda.synchronize(device)
        phase_peaks[name] = torch.cuda.max_memory_allocated(device)
        phase_reserved[name] = torch.cuda.max_memory_reserved(device)

    torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    losses = _steps(model, batch, optimizer, loss_fn, precision, "cuda", phase, n_steps)
    torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    free1, _ = torch.cuda.mem_get_info(device)
    used_after = total - free1
    overhead = used_after - torch.cuda.memory_reserved(device)
    phase_peaks = {k: v - leftover for k, v in phase_peaks.items()}
    peak = max(phase_peaks.values())
    reserved = max(phase_reserved.values())
    return {
        "peak_bytes": peak,
        "reserved_bytes": reserved,
        "baseline_bytes": baseline,
        "leftover_bytes": leftover,
        "overhead_bytes": overhead,
        "device_peak_bytes": reserved + overhead,
        "device_used_before": total - free0,
        "device_used_after": used_after,
        "device_total": total,
        "phase_peaks": phase_peaks,
        "phase_reserved": phase_reserved,
        "peak_phase": max(phase_peaks, key=phase_peaks.get),
        "wall_s": wall,
        "losses": losses,
    }
