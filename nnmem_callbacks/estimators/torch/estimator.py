"""``estimate_training`` for PyTorch: simulate the real training step on fake tensors.

The model's parameters, buffers and batch are swapped for fake tensors; the user's own forward, loss, ``backward()``
and optimizer run for two steps while a :class:`~nnmem_callbacks.estimators.torch.tracer.StorageTracker` logs every
storage's allocation and free. Two more traces at other batch sizes give each phase's growth per sample; for CUDA
targets the log is replayed through a model of the caching allocator. When the step cannot be traced, a closed-form
estimate takes over (:mod:`nnmem_callbacks.estimators.torch.fallback`), recorded in ``MemoryEstimate.method`` /
``notes`` with a warning emitted once.

Design: docs/torch-estimator.md (the CUDA side: docs/cuda-model.md).

Known limitations:
    * ``.item()`` on a traced value returns a placeholder (1): control flow on tensor values may take another
      branch than the real run (the count is in ``notes``).
    * Gradient accumulation is simulated with two micro-batches per step (the third and later are as the second).
    * Memory held by reference cycles until the garbage collector runs, and kernel scratch without a registered
      workspace rule, are not seen.
    * For CUDA on a machine without CUDA, CPU kernels are made to behave like CUDA's
      (:mod:`nnmem_callbacks.estimators.torch.cuda.emulation`) for the named GPU's architecture (sm90 otherwise);
      ``notes`` lists the tables used and every way the result may differ from an estimate made on the device.
    * A ``torch.compile``'d step is estimated from its compiled graphs
      (:mod:`nnmem_callbacks.estimators.torch.compiled`).
    * cuBLAS workspaces follow PyTorch's defaults for the target GPU, cuDNN convolution workspaces only the measured
      table (:mod:`nnmem_callbacks.hardware.cuda_tables`); notes say so.
    * Lazy modules must be materialised before estimation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
import warnings
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from nnmem_callbacks.allocators import cuda_caching as allocator
from nnmem_callbacks.core.estimate import Category, MemoryEstimate, PhaseLine, upper_envelope
from nnmem_callbacks.core.formatting import first_line
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.core.verification import DirectEstimator
from nnmem_callbacks.estimators.torch import inductor_compat, quantized
from nnmem_callbacks.estimators.torch.batch_lines import category_line, paired_lines, scaling_sizes
from nnmem_callbacks.estimators.torch.compat import eager_library_checks
from nnmem_callbacks.estimators.torch.compiled import eager_step, find_compiled
from nnmem_callbacks.estimators.torch.cuda import libraries as cuda_libraries
from nnmem_callbacks.estimators.torch.cuda.cudnn_rnn import cudnn_rnn_emulation
from nnmem_callbacks.estimators.torch.cuda.emulation import EmulationReport, cuda_kernel_emulation
from nnmem_callbacks.estimators.torch.fallback import estimate_closed_form, trace_failure_hint
from nnmem_callbacks.estimators.torch.guards import preserved_module_state, preserved_rng, swapped_tensors
from nnmem_callbacks.estimators.torch.inputs import optimizer_label
from nnmem_callbacks.estimators.torch.scaled_log import build_allocation_log
from nnmem_callbacks.estimators.torch.sequence_lines import sequence_curve
from nnmem_callbacks.estimators.torch.step import (
    EstimationInputError,
    LossFn,
    StepConfig,
    build_optimizers,
    check_zero_grad,
    checkpoints_activations,
    forward_loss,
    input_dtype_map,
    make_config,
    optimizer_state_tensors,
    parameter_dtype,
)
from nnmem_callbacks.estimators.torch.tracer import OpMemo, StorageTracker, TraceResult
from nnmem_callbacks.hardware import cuda_tables
from nnmem_callbacks.hardware.gpus import DEFAULT_ARCH_CAPABILITY, cuda_arch
from nnmem_callbacks.probes.runner import UnsupportedKernelError
from nnmem_callbacks.probes.session import (
    ProbeSettings,
    check_probe_kernels,
    current_session,
    kernel_probes,
    probe_batch,
)

__all__ = [
    "cublas_workspace_bytes",
    "cuda_overhead_bytes",
    "DEFAULT_CUDA_CONTEXT_BYTES",
    "estimate_training",
    "FAST_DISPATCH",
    "LINEARITY_TOLERANCE",
    "run_trace",
    "TraceSession",
    "TraceVerifier",
]

#: CUDA context and library bytes assumed when no CUDA device can be asked and
#: the table has nothing closer (:data:`nnmem_callbacks.hardware.cuda_tables.CONTEXT_TABLE`, H100 / CUDA 13).
DEFAULT_CUDA_CONTEXT_BYTES = cuda_tables.CONTEXT_TABLE[(9, 13)].gemm_and_cudnn

#: Replay fake ops from a cheap metadata key instead of FakeTensorMode's own
#: cache (same outputs, about a third less time); off only for debugging.
FAST_DISPATCH = True

#: Relative error above which batch growth is reported as non-linear.
LINEARITY_TOLERANCE = 0.01

_warned: set[str] = set()


def estimate_training(
    model: nn.Module,
    batch: Any,
    optimizer: Any = "adam",
    loss_fn: LossFn | None = None,
    precision: str | int = "32-true",
    device: str | torch.device | None = None,
    *,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: str = "norm",
    check_scaling: bool = True,
    probe_kernels: "bool | ProbeSettings" = True,
    sequence_dim: int | str | None = None,
    zero_grad: str = "after_step",
) -> MemoryEstimate:
    """Predicts the peak memory of training ``model`` on batches like ``batch``.

    Args:
        model: The ``torch.nn.Module`` (on cpu, cuda or meta). It is not changed.
        batch: An example batch: a tensor, or a tuple/list/dict of tensors, real
            or on the meta device. Dim 0 of the first tensor is the batch size.
        optimizer: An optimizer instance (its class and hyper-parameters are
            reused on fake copies; it is never stepped), a list of instances, a
            callable ``params -> optimizer``, a name (see
            :data:`~nnmem_callbacks.estimators.torch.inputs.OPTIMIZER_NAMES`) or ``None``
            for forward and backward only.
        loss_fn: ``loss_fn(model, batch) -> scalar loss`` (forward and loss
            only). It may also return a dict with ``"loss"`` or an object with
            ``.loss``. Default: call the model on the batch (``model(x)``,
            ``model(*batch)`` or ``model(**batch)``) and sum its output.
        precision: A Lightning precision: ``32-true``, ``16-mixed``,
            ``bf16-mixed``, ``16-true``, ``bf16-true``, ``64-true`` (or an alias).
        device: Where training runs; default: the model's device.
        accumulate_grad_batches: Micro-batches per optimizer step.
        gradient_clip_val: Clip gradients at this value (``None``: no clipping).
        gradient_clip_algorithm: ``"norm"`` or ``"value"``.
        check_scaling: Trace at two more batch sizes to derive and check the
            growth per sample (set ``False`` for a single, faster trace).
        probe_kernels: Measure the CPU kernels' workspaces by running each
            distinct op for real at small batch multiples (cached on disk per
            machine fingerprint, see :mod:`nnmem_callbacks.probes`); ``False``
            uses the per-op formulas instead (and ``notes`` says so); a
            :class:`~nnmem_callbacks.probes.session.ProbeSettings` sets the run budget, time limit and memory cap.
        sequence_dim: Give the estimate a sequence-length axis
            (``est.peak_bytes_at(batch, seq_len=...)``, ``est.max_sequence_length``):
            ``"auto"`` finds token ids of shape ``(batch, length)``, an int names
            the dimension of the batch's first tensor that holds the length.
            Two more traces, at half and twice the length. ``None``: no axis.
        zero_grad: When the loop frees the gradients: ``"after_step"`` (``optimizer.step(); optimizer.zero_grad()``,
            as a plain loop or the Hugging Face Trainer) or ``"before_backward"`` (Lightning's automatic
            optimization: after ``training_step``, so the next forward runs beside the last step's gradients).

    Returns:
        A :class:`~nnmem_callbacks.core.estimate.MemoryEstimate`.

    Raises:
        ValueError: For an unknown precision or optimizer name, a batch without
            tensors, a loss that is not a scalar, or another invalid argument;
            the message names what is valid.
        UnsupportedKernelError: A kernel of the step cannot run on this
            device (such as a bf16 LSTM on a CPU without bf16 support).

    Example:
        >>> import torch
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(1000, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
        >>> est = estimate_training(mlp, torch.empty(256, 1000), optimizer="sgd_momentum")
        >>> est.breakdown["parameters"] == sum(p.numel() * 4 for p in mlp.parameters())
        True
        >>> est.peak_bytes_at(512) > est.peak_bytes
        True
    """
    check_probe_kernels(probe_kernels)
    compiled = find_compiled(model, loss_fn, optimizer)
    if compiled is not None:
        model, loss_fn = compiled.model, compiled.loss_fn
    config = make_config(
        model,
        batch,
        optimizer,
        loss_fn,
        precision,
        device,
        accumulate_grad_batches,
        gradient_clip_val,
        gradient_clip_algorithm,
        sequence_dim,
    )
    config.compiled, config.zero_grad = compiled, check_zero_grad(zero_grad)
    estimate = _estimate_config(config, check_scaling, probe_kernels)
    return dataclasses.replace(estimate, verifier=TraceVerifier(config, probe_kernels))


def _estimate_config(config: StepConfig, check_scaling: bool, probe_kernels: "bool | ProbeSettings") -> MemoryEstimate:
    """:func:`estimate_training` for a checked step configuration (without a verifier)."""
    model = config.model
    started = time.perf_counter()
    notes: list[str] = []
    if config.target_device.type != config.trace_device.type:
        notes.append(
            f"traced on {config.trace_device.type} kernels for a {config.target_device.type} target "
            f"(no {config.target_device.type} device here)"
        )
    settings = probe_kernels if isinstance(probe_kernels, ProbeSettings) else ProbeSettings(enabled=bool(probe_kernels))
    with kernel_probes(config.target_device.type, settings=settings) as probes:
        try:
            estimate = None
            if config.compiled is not None:
                estimate = config.compiled.run(
                    config, lambda compiled: _estimate_by_trace(compiled, notes, check_scaling), notes
                )
            if estimate is None:
                with inductor_compat.force_eager():
                    estimate = _estimate_by_trace(dataclasses.replace(config, compiled=None), notes, check_scaling)
        except (EstimationInputError, UnsupportedKernelError):
            raise
        except Exception as error:  # noqa: BLE001 - any trace failure goes to the fallback
            reason = f"{type(error).__name__}: {first_line(error)}{trace_failure_hint(model, error)}"
            _warn_once(
                f"nnmem_callbacks could not trace the training step of {type(model).__name__} ({reason}); "
                f"using the closed-form layer-by-layer estimate instead"
            )
            with inductor_compat.force_eager():
                estimate = estimate_closed_form(config, reason, notes)
            if config.target_device.type == "cuda":
                estimate = cuda_libraries.complete_closed_form(
                    estimate, config.model, config.target_device, _reduced_dtype(config)
                )
    all_notes = (*estimate.notes, *quantized.unchecked_notes(model), *probes.notes())
    checkpointed = checkpoints_activations(model)  # (the plans then suggest no checkpointing)
    extra = {**estimate.extra, "kernel_probes": probes.summary(), "activation_checkpointing": checkpointed}
    extra["seconds"] = round(time.perf_counter() - started, 4)
    return dataclasses.replace(estimate, notes=all_notes, extra=extra)


class TraceVerifier(DirectEstimator):
    """A direct estimate of the same step at another batch size (``MemoryEstimate.verifier``).

    Calling it with a batch size traces the step once at that batch (no traces
    at other sizes), with the model, optimizer, loss, precision and device of
    the original estimate; nothing real is allocated and the model is not
    changed. It holds the step's configuration (the model, the example batch),
    so it is dropped when an estimate is pickled or deep-copied.

    Example:
        >>> import torch
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(100, 10))
        >>> est = estimate_training(mlp, torch.empty(8, 100), optimizer="sgd")
        >>> est.verifier(32).batch_size, est.verifier(32).peak_bytes == est.peak_bytes_at(32)
        (32, True)
    """

    def __init__(self, config: StepConfig, probe_kernels: "bool | ProbeSettings") -> None:
        self._config = config
        self._probe_kernels = probe_kernels

    def accumulating(self, accumulate_grad_batches: int) -> "TraceVerifier":
        config = dataclasses.replace(self._config, accumulate_grad_batches=int(accumulate_grad_batches))
        return TraceVerifier(config, self._probe_kernels)

    def estimate_at(self, batch_size: int) -> MemoryEstimate:
        config = dataclasses.replace(self._config, batch=dataclasses.replace(self._config.batch, batch_size=batch_size))
        estimate = _estimate_config(config, False, self._probe_kernels)
        return dataclasses.replace(estimate, verifier=self)


# ---------------------------------------------------------------------------
# input handling
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# tracing
# ---------------------------------------------------------------------------


def run_trace(
    config: StepConfig,
    batch_size: int,
    *,
    steps: int = 2,
    optimizer_steps: bool = True,
    session: "TraceSession | None" = None,
    seq_len: int | None = None,
) -> TraceResult:
    """Simulates ``steps`` training steps at ``batch_size`` and returns the log.

    The cyclic garbage collector is paused during the trace: tensors of a
    training step are freed by reference counting, and collector pauses only
    cost time (a fake-tensor trace creates many short-lived Python objects).
    """
    session = session or TraceSession()
    with _gc_paused():
        if config.compiled is not None and (batch_size, seq_len) not in session.compiled_batch_sizes:
            # A real run compiles in its first step; what the compile keeps of that step's tensors stays out of the
            # traced steps, as it stays out of a measured warm step.
            _run_trace(config, batch_size, steps=1, optimizer_steps=False, session=session, seq_len=seq_len)
            session.compiled_batch_sizes.add((batch_size, seq_len))
        return _run_trace(
            config, batch_size, steps=steps, optimizer_steps=optimizer_steps, session=session, seq_len=seq_len
        )


@contextlib.contextmanager
def _gc_paused():
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class TraceSession:
    """One fake-tensor mode and op memo shared by the traces of one estimate.

    The traces at other batch sizes then replay the ops whose inputs do not
    depend on the batch (weight casts, the optimizer) from the first trace
    (and, inside ``tracer.sharing_traced_ops``, from earlier estimates).
    """

    def __init__(self, libraries: "cuda_libraries.LibraryModel | None" = None, memo_context: Any = None) -> None:
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.memo = OpMemo(self.fake_mode, memo_context) if FAST_DISPATCH else None
        self.libraries = libraries
        self.cuda_emulation: EmulationReport | None = None  # filled by the traces of a CUDA target without CUDA
        #: The traces at other batch sizes, by role (``"fit"``, ``"check"``): ``(batch_size, trace)``.
        self.scaling_traces: dict[str, tuple[int, TraceResult]] = {}
        #: Class names of bitsandbytes paged optimizers met by the traces (traced unpaged; see ``_run_trace``).
        self.paged_optimizers: set[str] = set()
        #: ``(batch size, sequence length)`` at which a compiled step has been run once (compiled) before its traces.
        self.compiled_batch_sizes: set[tuple[int, int | None]] = set()

    def emulation(self, config: StepConfig) -> EmulationReport:
        if self.cuda_emulation is None:
            arch = config.cuda_arch or cuda_arch(DEFAULT_ARCH_CAPABILITY)
            self.cuda_emulation = EmulationReport(arch, arch_named=config.cuda_arch is not None)
        return self.cuda_emulation


def _run_trace(
    config: StepConfig,
    batch_size: int,
    *,
    steps: int,
    optimizer_steps: bool,
    session: TraceSession,
    seq_len: int | None = None,
) -> TraceResult:
    model = config.model
    precision = config.precision
    device = config.trace_device
    fake_mode = session.fake_mode
    tracker_class = config.compiled.tracker_class if config.compiled is not None else StorageTracker
    tracker = tracker_class(config.target_device.type, memo=session.memo, libraries=session.libraries)
    emulate_cuda = config.target_device.type == "cuda" and device.type == "cpu"
    with (
        preserved_rng(),
        preserved_module_state(model),
        cuda_kernel_emulation(report=session.emulation(config)) if emulate_cuda else contextlib.nullcontext(),
        eager_library_checks(config.example_batch),
        probe_batch(batch_size),
        cudnn_rnn_emulation(model, enabled=config.target_device.type == "cuda"),
    ):
        model.train()
        with fake_mode, tracker:
            quantized_shared: dict = {}
            int8_scales: dict[int, torch.Tensor] = {}
            state_scales = {  # the scales of an 8-bit layer that has run live in its state
                id(module.weight): module.state.SCB
                for module in model.modules()
                if quantized.is_int8_params(getattr(module, "weight", None)) and hasattr(module, "state")
            }

            def make_fake(tensor: torch.Tensor, is_parameter: bool) -> torch.Tensor:
                if quantized.is_params4bit(tensor):
                    return quantized.fake_params4bit(tensor, device, tracker.register, quantized_shared)
                if quantized.is_wrapper_subclass(tensor):  # torchao's quantized tensors and the like
                    return quantized.fake_wrapper_subclass(tensor, fake_mode, tracker.register)
                if quantized.is_int8_params(tensor):
                    return quantized.fake_int8_params(
                        tensor, device, tracker.register, int8_scales, state_scales.get(id(tensor))
                    )
                dtype = parameter_dtype(tensor.dtype, precision)
                fake = torch.empty_strided(tuple(tensor.shape), tensor.stride(), dtype=dtype, device=device)
                if is_parameter and tensor.requires_grad and (dtype.is_floating_point or dtype.is_complex):
                    fake.requires_grad_(True)
                tracker.register(fake, Category.PARAMETERS if is_parameter else Category.BUFFERS)
                return fake

            originals = list(model.parameters())  # unique, in registration order
            with swapped_tensors(model, make_fake) as fake_of:
                if int8_scales:
                    quantized.traced_8bit_states(model, int8_scales)
                unique_params = [fake_of[id(parameter)] for parameter in originals]
                trainable = [p for p in unique_params if p.requires_grad]
                fake_batch, batch_tensors = config.batch.build(
                    batch_size, device, input_dtype_map(precision), seq_len=seq_len
                )
                for tensor in batch_tensors:
                    tracker.register(tensor, Category.INPUTS)
                optimizers = (
                    build_optimizers(config.optimizer, trainable, fake_of, make_fake, config.target_device)
                    if optimizer_steps
                    else []
                )
                for optimizer in optimizers:
                    if getattr(optimizer, "is_paged", False):  # bitsandbytes: never cudaMallocManaged in a trace
                        optimizer.is_paged = False
                        session.paged_optimizers.add(type(optimizer).__name__)
                tracker.mark(optimizer_state_tensors(optimizers), Category.OPTIMIZER_STATE)
                all_params = [p for p in fake_of.values() if p.requires_grad]
                scaler_state = None
                if precision.grad_scaler and optimizer_steps:
                    scaler_state = (
                        torch.full((), 65536.0, dtype=torch.float32, device=device),
                        torch.full((), 0, dtype=torch.int32, device=device),
                    )
                    tracker.mark(scaler_state, Category.OPTIMIZER_STATE)
                micro_batches = min(config.accumulate_grad_batches, 2)
                for step in range(1, steps + 1):
                    for micro in range(1, micro_batches + 1):
                        suffix = "" if micro == 1 else f".{micro}"
                        tracker.set_phase(f"step{step}/forward{suffix}")
                        loss = forward_loss(config, fake_batch)
                        if micro == 1 and config.zero_grad == "before_backward":  # Lightning, after training_step
                            _zero_grad(optimizers, all_params)
                        tracker.set_phase(f"step{step}/backward{suffix}")
                        if config.accumulate_grad_batches > 1:
                            loss = loss / config.accumulate_grad_batches
                        if scaler_state is not None:
                            loss = loss * scaler_state[0]
                        loss.backward()
                        del loss
                        tracker.mark([p.grad for p in all_params if p.grad is not None], Category.GRADIENTS)
                    if not optimizer_steps:
                        continue
                    tracker.set_phase(f"step{step}/optimizer")
                    _optimizer_step(config, optimizers, all_params, scaler_state, device)
                    if config.compiled is not None:  # a compiled step's state is made while Dynamo traces it, unseen
                        for state in optimizer_state_tensors(optimizers):
                            tracker.register(state, Category.OPTIMIZER_STATE)
                    tracker.mark(optimizer_state_tensors(optimizers), Category.OPTIMIZER_STATE)
                    if config.zero_grad == "after_step":
                        _zero_grad(optimizers, all_params)
                tracker.end()
                del fake_batch, batch_tensors, optimizers, trainable, unique_params, all_params, scaler_state, originals
        result = tracker.result()
    return result


def _zero_grad(optimizers, params) -> None:
    """``optimizer.zero_grad(set_to_none=True)`` of each optimizer; without one, every parameter's gradient."""
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    if not optimizers:
        for parameter in params:
            parameter.grad = None


def _optimizer_step(config: StepConfig, optimizers, params, scaler_state, device) -> None:
    grads = [p.grad for p in params if p.grad is not None]
    if scaler_state is not None and grads:
        scale, growth_tracker = scaler_state
        inv_scale = scale.double().reciprocal().float()
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=device)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for grad in grads:
            by_dtype.setdefault(grad.dtype, []).append(grad)
        for group in by_dtype.values():
            torch._amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv_scale)
    if config.gradient_clip_val is not None and grads:
        with_grads = [p for p in params if p.grad is not None]
        if config.gradient_clip_algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(with_grads, config.gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_value_(with_grads, config.gradient_clip_val)
    for optimizer in optimizers:
        step = config.compiled.optimizer_step(optimizer) if config.compiled is not None else eager_step(optimizer)
        step()
    if scaler_state is not None and grads:
        torch._amp_update_scale_(scale, growth_tracker, found_inf, 2.0, 0.5, 2000)


# ---------------------------------------------------------------------------
# from traces to an estimate
# ---------------------------------------------------------------------------


def _estimate_by_trace(config: StepConfig, notes: list[str], check_scaling: bool) -> MemoryEstimate:
    batch_size = config.batch.batch_size
    libraries = None
    if config.target_device.type == "cuda":
        session_probes = current_session()
        libraries = cuda_libraries.library_model(
            config.target_device,
            notes,
            config.cuda_arch.capability if config.cuda_arch is not None else None,
            probe_convolutions=session_probes is None or session_probes.settings.enabled,
        )
    session = TraceSession(libraries, memo_context=config.op_context)
    main = run_trace(config, batch_size, session=session)
    if session.paged_optimizers and config.target_device.type == "cuda":
        notes.append(
            f"{', '.join(sorted(session.paged_optimizers))}: the paged optimizer's state is counted as optimizer "
            "state; on CUDA bitsandbytes keeps the state of tensors of 1e5 elements or more in unified memory, "
            "outside the caching allocator, so max_memory_allocated does not show it (the GPU holds it while paged in)"
        )
    if main.placeholders:
        notes.append(
            f"{main.placeholders} .item()/bool() call(s) on traced values got placeholder values; "
            f"value-dependent control flow may differ from the real run"
        )
    if main.workspace_ops:
        notes.append(
            "kernel workspaces modelled for: " + ", ".join(f"{op} x{n}" for op, n in sorted(main.workspace_ops.items()))
        )
    lines: list[PhaseLine] = []
    if check_scaling:
        lines = _scaling_lines(config, main, notes, session)
    else:
        notes.append(
            "batch scaling not traced (check_scaling=False); per-sample bytes assumed from the batch-dependent categories"
        )
    if not lines:
        lines = [category_line(main, phase, batch_size) for phase in main.phase_peaks]
    sequence = None
    if config.batch.seq_len is not None:

        def trace_at(length: int) -> TraceResult:
            return run_trace(config, batch_size, steps=1, optimizer_steps=False, session=session, seq_len=length)

        sequence = sequence_curve(
            config.batch, main, lines, notes, trace_at, session.scaling_traces.get("fit"), config.model
        )
    phases = upper_envelope(lines)
    peak_phase = max(main.phase_peaks, key=lambda p: main.phase_peaks[p])
    peak_bytes = main.phase_peaks[peak_phase]
    breakdown = dict(main.phase_breakdowns[peak_phase])
    reserved = None
    overhead = 0
    allocation_log = None
    extra: dict[str, Any] = {"ops": main.op_count, "optimizer": optimizer_label(config.optimizer)}
    if session.cuda_emulation is not None:
        notes.extend(session.cuda_emulation.notes(torch.__version__))
        extra["cuda_emulation"] = session.cuda_emulation.summary()
    if config.target_device.type == "cuda":
        prediction = allocator.replay(main.events)
        rounding = prediction.peak_allocated - peak_bytes
        if rounding > 0:
            breakdown[str(Category.TEMPORARIES)] += rounding
            phases = [
                dataclasses.replace(p, fixed_bytes=p.fixed_bytes + rounding) for p in phases
            ]  # keeps batch ranges
            notes.append(
                f"CUDA allocator rounding and unsplit blocks add {format_bytes(rounding)} to the tensor peak (counted as temporaries)"
            )
        peak_bytes = max(prediction.peak_allocated, peak_bytes)
        reserved = prediction.peak_reserved
        notes.extend(libraries.notes(main.workspace_ops))
        extra["cuda_libraries"] = libraries.record(main.workspace_ops)
        overhead = cuda_libraries.device_overhead(
            config.target_device,
            notes,
            reduced_dtype=_reduced_dtype(config),
            gemm=any(str(op).startswith("cuBLAS") for op in main.workspace_ops),
            cudnn=cuda_libraries.uses_cudnn(config.model),
            capability=libraries.capability,
        )
        allocation_log = _allocation_log(main, batch_size, session.scaling_traces, notes)
    return MemoryEstimate(
        peak_bytes=int(peak_bytes),
        breakdown=breakdown,
        batch_size=batch_size,
        phases=tuple(phases),
        peak_phase=peak_phase,
        reserved_bytes=reserved,
        overhead_bytes=overhead,
        device=str(config.target_device),
        precision=config.precision.name,
        method="trace",
        notes=tuple(notes),
        phase_breakdowns=main.phase_breakdowns,
        extra=extra,
        allocation_log=allocation_log,
        sequence=sequence,
    )


def _allocation_log(main: TraceResult, batch_size: int, traces: dict[str, tuple[int, TraceResult]], notes: list[str]):
    """The main trace's allocations as functions of the batch (see :mod:`nnmem_callbacks.estimators.torch.scaled_log`)."""
    if "fit" not in traces:
        notes.append(
            "allocator reserve at other batch sizes scaled as a ratio of the peak (no traces at other batch sizes)"
        )
        return None
    fit_size, fit = traces["fit"]
    check_size, check = traces.get("check", (None, None))
    log, unpaired = build_allocation_log(main, batch_size, fit, fit_size, check, check_size)
    if log is None:
        notes.append(
            "allocator reserve at other batch sizes scaled as a ratio of the peak: the allocations of "
            + ", ".join(unpaired)
            + f" do not pair one to one with the trace at batch {fit_size}, so the log "
            "cannot be replayed at other batch sizes"
        )
    return log


def _scaling_lines(config: StepConfig, main: TraceResult, notes: list[str], session: TraceSession) -> list[PhaseLine]:
    """Lines of live bytes against the batch size, from traces at two more sizes.

    Every moment of the step holds ``a + b * n`` bytes at batch ``n`` as long as
    the kernels behave the same at every batch size. The trace at twice the
    batch gives each moment's ``b``; the trace at a quarter of it checks the
    resulting prediction. Where that check finds growth that is not linear
    (kernels whose workspace saturates or switches layout with the batch), the
    lines through the quarter-batch trace are used below the batch and the
    lines through the double-batch trace above it, and a note says so.
    """
    batch_size = config.batch.batch_size
    fit_size, check_size = scaling_sizes(batch_size)
    if not any(spec.scales for spec in config.batch.tensor_specs()):
        notes.append("no batch tensor has the batch dimension first; per-sample bytes assumed 0")
        return []
    try:
        fit = run_trace(config, fit_size, steps=1, optimizer_steps=False, session=session)
        check = run_trace(config, check_size, steps=1, optimizer_steps=False, session=session)
    except (EstimationInputError, UnsupportedKernelError):
        raise
    except Exception as error:  # noqa: BLE001
        notes.append(
            f"could not trace at batch sizes {fit_size}/{check_size} ({type(error).__name__}: {first_line(error)}); "
            f"per-sample bytes assumed from the batch-dependent categories at the peak"
        )
        return []
    # kept for the allocator log (nnmem_callbacks.estimators.torch.scaled_log)
    session.scaling_traces.update(fit=(fit_size, fit), check=(check_size, check))
    above, unaligned = paired_lines(main, fit, batch_size, fit_size, 1, None)
    if unaligned:
        notes.append(
            "the step runs different ops at other batch sizes in "
            + ", ".join(unaligned)
            + "; those phases scale by their peaks only"
        )
    worst = (0.0, "", 0, 0)
    for phase, measured in check.phase_peaks.items():
        predicted = max((line.at(check_size) for line in above if line.phase == phase), default=None)
        if predicted is None:
            continue
        error = abs(predicted - measured) / max(measured, 1)
        if error > worst[0]:
            worst = (error, phase, predicted, measured)
    if worst[0] <= LINEARITY_TOLERANCE:
        return above
    message = (
        f"growth with the batch is not linear: the lines through batch {batch_size} and {fit_size} predict "
        f"{format_bytes(worst[2])} in {worst[1]} at batch {check_size}, the trace gives {format_bytes(worst[3])} ({worst[0]:.1%} off)"
    )
    if check_size > batch_size:
        notes.append(message)
        return above
    below, _ = paired_lines(main, check, batch_size, check_size, 1, batch_size)
    notes.append(message + f"; below batch {batch_size} the lines through batch {check_size} are used instead")
    return below + [dataclasses.replace(line, min_batch=batch_size) for line in above]


def _reduced_dtype(config: StepConfig) -> torch.dtype | None:
    dtype = config.precision.autocast_dtype or config.precision.param_dtype
    return dtype if dtype in (torch.float16, torch.bfloat16) else None


def cuda_overhead_bytes(device: torch.device, notes: list[str] | None = None) -> int:
    """CUDA context and loaded libraries for ``device`` (no cuBLAS workspace: that is an allocation).

    See :func:`nnmem_callbacks.estimators.torch.cuda.libraries.device_overhead`.
    """
    return cuda_libraries.device_overhead(device, [] if notes is None else notes)


#: The cuBLAS workspace per thread and stream (see :func:`nnmem_callbacks.hardware.cuda_tables.cublas_workspace_bytes`).
cublas_workspace_bytes = cuda_tables.cublas_workspace_bytes


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        # _warn_once <- _estimate_config <- estimate_training (or TraceVerifier.__call__) <- the caller
        warnings.warn(message, RuntimeWarning, stacklevel=4)
