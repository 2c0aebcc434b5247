"""The closed-form, layer-by-layer estimate used when the step cannot be traced.

Parameters, buffers, gradients and optimizer state are exact: the optimizer
alone is simulated on fake parameters with fake gradients (this works even when
the model's forward cannot be traced). Activations are measured on the real
forward at batch sizes 1 and 2 (the first samples of the user's batch): the
tensors autograd saves for backward are caught by
``torch.autograd.graph.saved_tensors_hooks`` and extrapolated linearly to the
batch size. When the model cannot run with autograd, forward hooks on every
leaf module and the per-layer rules of
:data:`nnmem_callbacks.estimators.torch.rules.LAYER_RULES` estimate them instead.

Known limitations:
    * The real probe allocates the activations of at most two samples, on the
      CPU whatever the target (for CUDA targets with dropout and attention
      kernels that save what CUDA's do; other CPU and CUDA kernels may save
      different tensors). With a meta batch it runs on zeros, so
      data-dependent shapes may differ from real data.
    * The backward peak is approximated as all saved activations plus twice the
      largest saved tensor as transient gradient buffers; forward temporaries
      and kernel workspaces are not counted.
    * With layer rules, functional ops called between modules are not seen and
      layers without a rule are charged their output size (named in ``notes``).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from nnmem_callbacks.core.estimate import Category, MemoryEstimate, PhaseLine
from nnmem_callbacks.estimators.torch import rules
from nnmem_callbacks.estimators.torch.cuda.emulation import cuda_kernel_emulation
from nnmem_callbacks.estimators.torch.guards import preserved_module_state, preserved_rng, swapped_tensors
from nnmem_callbacks.estimators.torch.step import (
    build_optimizers,
    call_loss_fn,
    input_dtype,
    optimizer_state_tensors,
    parameter_dtype,
)
from nnmem_callbacks.estimators.torch.tracer import StorageTracker

PROBE_BATCH = 2

#: Where the small real probe runs: always the CPU, never the target GPU (an
#: estimate must not allocate on the device it plans for).
PROBE_DEVICE = torch.device("cpu")


def estimate_closed_form(config, reason: str, notes: list[str]) -> MemoryEstimate:
    """Estimates without tracing the forward; never raises.

    Args:
        config: The :class:`~nnmem_callbacks.estimators.torch.step.StepConfig`.
        reason: Why tracing failed (recorded in ``notes``).
        notes: Notes collected so far (extended in place).
    """
    notes.append(f"tracing failed ({reason}); closed-form layer-by-layer estimate")
    static = _static_bytes(config, notes)
    method = "closed-form"
    try:
        activations, transient, unknown = _activation_bytes(config)
        if unknown:
            notes.append(
                "no layer rule for "
                + ", ".join(f"{name} x{n}" for name, n in sorted(unknown.items()))
                + " (charged their output size)"
            )
    except Exception as error:  # noqa: BLE001 - the fallback never crashes
        activations, transient = 0, 0
        method = "static-only"
        notes.append(
            f"the forward could not run either ({type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}); "
            f"only parameters, gradients and optimizer state are counted"
        )
    batch_size = config.batch.batch_size
    inputs = sum(
        _numel(spec.shape) * _element_size(input_dtype(spec.dtype, config.precision))
        for spec in config.batch.tensor_specs()
    )
    backward = {
        str(Category.PARAMETERS): static["parameters"],
        str(Category.BUFFERS): static["buffers"],
        str(Category.GRADIENTS): static["gradients"],
        str(Category.OPTIMIZER_STATE): static["optimizer_state"],
        str(Category.INPUTS): inputs,
        str(Category.ACTIVATIONS): activations,
        str(Category.TEMPORARIES): transient,
    }
    optimizer_phase = {
        str(Category.PARAMETERS): static["parameters"],
        str(Category.BUFFERS): static["buffers"],
        str(Category.GRADIENTS): static["gradients"],
        str(Category.OPTIMIZER_STATE): static["optimizer_state"],
        str(Category.INPUTS): inputs,
        str(Category.TEMPORARIES): static["optimizer_temporaries"],
    }
    per_sample_backward = (inputs + activations + transient) // max(batch_size, 1)
    per_sample_inputs = inputs // max(batch_size, 1)
    backward_peak = sum(backward.values())
    optimizer_peak = sum(optimizer_phase.values())
    phases = (
        PhaseLine("step2/backward", backward_peak - per_sample_backward * batch_size, per_sample_backward),
        PhaseLine("step2/optimizer", optimizer_peak - per_sample_inputs * batch_size, per_sample_inputs),
    )
    if backward_peak >= optimizer_peak:
        peak_phase, peak, breakdown = "step2/backward", backward_peak, backward
    else:
        peak_phase, peak, breakdown = "step2/optimizer", optimizer_peak, optimizer_phase
    return MemoryEstimate(
        peak_bytes=int(peak),
        breakdown=breakdown,
        batch_size=batch_size,
        phases=phases,
        peak_phase=peak_phase,
        device=str(config.target_device),
        precision=config.precision.name,
        method=method,
        notes=tuple(notes),
        phase_breakdowns={"step2/backward": backward, "step2/optimizer": optimizer_phase},
        extra={"fallback_reason": reason},
    )


def _numel(shape) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype, device="meta").element_size()


def _static_bytes(config, notes: list[str]) -> dict[str, int]:
    """Parameters, buffers, gradients and optimizer state, by simulating the optimizer alone."""
    model = config.model
    device = config.trace_device
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    tracker = StorageTracker(config.target_device.type)
    totals = {"parameters": 0, "buffers": 0, "gradients": 0, "optimizer_state": 0, "optimizer_temporaries": 0}
    with preserved_rng(), preserved_module_state(model), fake_mode, tracker:

        def make_fake(tensor: torch.Tensor, is_parameter: bool) -> torch.Tensor:
            fake = torch.empty_strided(
                tuple(tensor.shape),
                tensor.stride(),
                dtype=parameter_dtype(tensor.dtype, config.precision),
                device=device,
            )
            if is_parameter and tensor.requires_grad and fake.is_floating_point():
                fake.requires_grad_(True)
            key = "parameters" if is_parameter else "buffers"
            totals[key] += fake.untyped_storage().nbytes()
            return fake

        originals = list(model.parameters())
        with swapped_tensors(model, make_fake) as fake_of:
            trainable = [fake_of[id(p)] for p in originals if fake_of[id(p)].requires_grad]
            try:
                optimizers = build_optimizers(config.optimizer, trainable, fake_of, make_fake, config.target_device)
                for parameter in trainable:
                    parameter.grad = torch.empty_like(parameter)
                totals["gradients"] = sum(p.grad.untyped_storage().nbytes() for p in trainable)
                tracker.set_phase("optimizer")
                for optimizer in optimizers:
                    optimizer.step()
                state = optimizer_state_tensors(optimizers)
                totals["optimizer_state"] = sum(
                    t.untyped_storage().nbytes() for t in {id(t): t for t in state}.values()
                )
                result = tracker.result()
                peak = result.phase_peaks.get("optimizer", 0)
                before = totals["gradients"]
                totals["optimizer_temporaries"] = max(0, peak - before - totals["optimizer_state"])
            except Exception as error:  # noqa: BLE001
                totals["gradients"] = sum(p.numel() * p.element_size() for p in trainable)
                notes.append(
                    f"the optimizer could not be simulated ({type(error).__name__}); optimizer state not counted"
                )
            for parameter in trainable:
                parameter.grad = None
    return totals


def _activation_bytes(config) -> tuple[int, int, Counter]:
    """Saved activations and the largest transient, scaled to the batch size.

    Primary route: a real forward with autograd on, at batch sizes 1 and 2,
    whose saved tensors are caught by ``torch.autograd.graph.saved_tensors_hooks``
    (exact, including functional ops and data-dependent shapes); a line through
    the two sizes gives the bytes at the real batch size. Secondary route, when
    the forward cannot run with autograd: forward hooks and :data:`rules.LAYER_RULES`.
    """
    batch_size = config.batch.batch_size
    probes = sorted({1, min(PROBE_BATCH, batch_size)})
    unknown: Counter = Counter()
    try:
        measured = [_probe_saved_bytes(config, size) for size in probes]
    except Exception:  # noqa: BLE001 - fall through to the layer rules
        measured = []
    if measured:
        if len(measured) == 2:
            (s1, t1), (s2, t2) = measured
            slope_saved = (s2 - s1) / (probes[1] - probes[0])
            slope_transient = (t2 - t1) / (probes[1] - probes[0])
            saved = s1 + slope_saved * (batch_size - probes[0])
            transient = t1 + slope_transient * (batch_size - probes[0])
        else:
            saved, transient = measured[0]
        return int(max(saved, 0)), int(max(transient, 0)), unknown
    saved, largest, unknown = _layer_rule_bytes(config, probes[-1])
    scale = batch_size / probes[-1]
    return int(saved * scale), int(largest * scale), unknown


def _real_copy(config, device: torch.device):
    def copy(tensor: torch.Tensor, is_parameter: bool) -> torch.Tensor:
        dtype = parameter_dtype(tensor.dtype, config.precision)
        if tensor.device.type == "meta":
            real = torch.zeros(tensor.shape, dtype=dtype, device=device)
        elif is_parameter and dtype == tensor.dtype and tensor.device == device:
            real = tensor.detach()  # shares memory; a separate autograd leaf
        else:
            real = tensor.detach().to(device=device, dtype=dtype, copy=True)
        if is_parameter and tensor.requires_grad and real.is_floating_point():
            real.requires_grad_(True)
        return real

    return copy


def _probe_kernels(config):
    """For a CUDA target, the CPU probe runs dropout and attention with kernels
    that save for backward what the CUDA kernels save."""
    return cuda_kernel_emulation() if config.target_device.type == "cuda" else contextlib.nullcontext()


def _probe_saved_bytes(config, probe_size: int) -> tuple[int, int]:
    """Bytes autograd saves for backward, and the largest saved tensor, at ``probe_size``."""
    model = config.model
    device = PROBE_DEVICE
    probe = _probe_batch(config, probe_size, device)
    saved: dict[int, int] = {}
    keep: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        keep.append(tensor)
        return tensor

    with (
        preserved_rng(),
        preserved_module_state(model),
        _probe_kernels(config),
        swapped_tensors(model, _real_copy(config, device)) as copies,
    ):
        model.train()
        excluded = {t.untyped_storage().data_ptr() for t in copies.values()}
        excluded |= {t.untyped_storage().data_ptr() for t in _leaves(probe)}
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = call_loss_fn(config, probe, device.type)
        del loss
    activations = {ptr: size for ptr, size in saved.items() if ptr not in excluded and ptr != 0}
    total = sum(activations.values())
    largest = max(activations.values(), default=0)
    keep.clear()
    return total, 2 * largest


def _leaves(batch: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    return [leaf for leaf in tree_flatten(batch)[0] if isinstance(leaf, torch.Tensor)]


def _layer_rule_bytes(config, probe_size: int) -> tuple[int, int, Counter]:
    """Saved bytes from forward hooks and layer rules during a no-grad forward at ``probe_size``."""
    model = config.model
    device = PROBE_DEVICE
    probe = _probe_batch(config, probe_size, device)
    saved = 0
    largest = 0
    unknown: Counter = Counter()

    def hook(module: nn.Module, inputs: tuple, output: Any) -> None:
        nonlocal saved, largest
        if isinstance(module, rules.IGNORED_LAYERS):
            return
        rule = rules.LAYER_RULES.get(type(module))
        if rule is None:
            unknown[type(module).__name__] += 1
            amount = rules.output_bytes(output)
        else:
            amount = rule(module, inputs, output)
        saved += amount
        largest = max(largest, rules.input_bytes(inputs) + rules.output_bytes(output))

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    handles = []
    with (
        preserved_rng(),
        preserved_module_state(model),
        _probe_kernels(config),
        swapped_tensors(model, _real_copy(config, device)),
        torch.no_grad(),
    ):
        model.train()
        for leaf in leaves:
            handles.append(leaf.register_forward_hook(hook))
        try:
            call_loss_fn(config, probe, device.type)
        finally:
            for handle in handles:
                handle.remove()
    return saved, largest, unknown


def _probe_batch(config, probe_size: int, device: torch.device) -> Any:
    """A real batch of ``probe_size`` samples: the first samples of the user's
    batch when it holds real data, else zeros shaped like it."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from nnmem_callbacks.estimators.torch.inputs import TensorSpec

    example = config.example_batch
    if example is not None:
        real_leaves = tree_flatten(example)[0] if not isinstance(example, torch.Tensor) else [example]
        if all(leaf.device.type != "meta" for leaf in real_leaves if isinstance(leaf, torch.Tensor)):
            sliced = []
            for leaf, spec in zip(real_leaves, config.batch.leaves):
                if isinstance(spec, TensorSpec):
                    tensor = leaf[:probe_size] if spec.scales else leaf
                    sliced.append(tensor.to(device=device, dtype=input_dtype(tensor.dtype, config.precision)))
                else:
                    sliced.append(leaf)
            return tree_unflatten(sliced, config.batch.treespec)
    leaves = []
    for leaf in config.batch.leaves:
        if isinstance(leaf, TensorSpec):
            shape = (probe_size,) + leaf.shape[1:] if leaf.scales else leaf.shape
            leaves.append(torch.zeros(shape, dtype=input_dtype(leaf.dtype, config.precision), device=device))
        else:
            leaves.append(leaf)
    return tree_unflatten(leaves, config.batch.treespec)


__all__ = ["estimate_closed_form", "trace_failure_hint"]


def trace_failure_hint(model: nn.Module, error: Exception) -> str:
    """What the user can do about a known cause of a failed trace, to append to the reason ("" when none is known)."""
    if type(error).__name__ == "DynamicOutputShapeException":
        if any(type(module).__name__.endswith(("Experts", "SparseMoeBlock", "MoE")) for module in model.modules()):
            return (
                "; a mixture-of-experts layer that loops over experts picks each expert's tokens by value. "
                "transformers' default experts_implementation='grouped_mm' (and 'batched_mm') traces, and its "
                "memory does not depend on the routing"
            )
    return ""
