"""Estimates of ``torch.compile``'d training steps (``method="trace+inductor"``).

A compiled step keeps other tensors than its eager step: AOTAutograd's
partitioner decides what the forward saves for backward and what backward
recomputes, and Inductor which buffers exist after fusion, which it reuses or
writes in place and in which order it runs them. :func:`find_compiled` finds
what the user compiled (``torch.compile(model)``, ``model.compile()``, compiled
submodules, a compiled loss function) and how; :meth:`CompiledStep.run` has
the estimator trace the step with those targets compiled again by a backend
that runs all of that and builds no kernel
(:func:`~nnmem_callbacks.estimators.torch.inductor_compat.fake_backend`: Inductor's
generated wrapper runs on fake tensors with no-op kernels). The estimator's
:class:`~nnmem_callbacks.estimators.torch.tracer.StorageTracker` then sees
the wrapper's allocations and frees, the tensors the compiled autograd
function saves, the eager code between graphs (graph breaks) and the eager
optimizer, as in the real run. Design notes and measurements:
``docs/compiled-steps.md``.

Example:
    >>> import torch
    >>> from nnmem_callbacks.estimators.torch.estimator import estimate_training
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))
    >>> est = estimate_training(torch.compile(mlp), torch.empty(8, 64), optimizer="sgd", check_scaling=False)
    >>> est.method
    'trace+inductor'

Known limitations:
    * The estimate compiles the step's graphs (Dynamo, AOTAutograd, Inductor up
      to its wrapper code), which takes far longer than an eager estimate
      (seconds to tens of seconds), though no kernel is built.
    * Each traced batch size is compiled static (as the user's first real
      compile is), so the traces at other batch sizes compile again; with
      ``dynamic=True`` one dynamic compile serves them all. ``mark_dynamic``
      on the user's own batch tensors does not reach the estimate's batch.
    * A backend other than ``inductor``, ``aot_eager`` and ``eager``, a target
      compiled twice, a compile that raises and torch versions without the
      internals used (:mod:`~nnmem_callbacks.estimators.torch.inductor_compat`)
      fall back to the eager step, with a warning.
    * A CUDA target on a machine without CUDA is lowered by Inductor's CPU
      backend (the partition is the same; fusion can differ), not yet measured
      against a GPU.
    * Autotuning (``max-autotune``) and CUDA graphs (``reduce-overhead``) are not
      modelled (notes say so).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any, Callable, Iterator

import torch
from torch import nn

from nnmem_callbacks.core.formatting import first_line
from nnmem_callbacks.estimators.torch import inductor_compat as compat
from nnmem_callbacks.estimators.torch.step import EstimationInputError, LossFn, StepConfig
from nnmem_callbacks.estimators.torch.tracer import StorageTracker
from nnmem_callbacks.probes.runner import UnsupportedKernelError

__all__ = [
    "eager_step",
    "CompiledStep",
    "CompiledStepTracker",
    "CompileTarget",
    "EAGER_DIRECTION",
    "find_compiled",
    "METHODS",
    "STATIC_BATCH",
]

#: Compile each traced batch size static when the user left ``dynamic`` unset, as
#: the user's first real compile is: Inductor plans dynamic shapes differently (a
#: bf16 GPT-2's loss materialises its fp32 logits only when the batch is dynamic).
STATIC_BATCH = True

#: ``MemoryEstimate.method`` by backend.
METHODS = {"inductor": "trace+inductor", "aot_eager": "trace+aot_eager", "eager": "trace+dynamo"}

#: Which way the eager figure errs for a compiled step (nnmem's compile benchmark, CPU, Inductor).
EAGER_DIRECTION = (
    "the eager figure is usually higher than the compiled step's (Inductor fuses and frees intermediates early: "
    "+45% on a GPT-2, +65% on a BatchNorm CNN in nnmem's benchmark), occasionally a little lower (-2% on a ViT)"
)


class CompiledStepTracker(compat.IgnoresCompileInternals, StorageTracker):
    """A :class:`StorageTracker` that lets Dynamo compile under it and sees the compiled artifacts' ops."""

    # Dynamo compiles while this mode is active: it must not trace the mode's own frames (the wrapper torch puts
    # on every mode that does not opt out, as StorageTracker does)
    __torch_dispatch__ = torch._disable_dynamo(StorageTracker.__torch_dispatch__, recursive=True)


@dataclasses.dataclass
class CompileTarget:
    """One compiled piece of the step.

    Attributes:
        label: What it is, for notes (``"the model"``, ``"submodule blocks.0"``, ``"the loss function"``).
        settings: How the user compiled it.
        kind: ``"model"`` (the model is an ``OptimizedModule``), ``"call_impl"`` (a module
            compiled with ``module.compile()``), ``"slot"`` (an ``OptimizedModule`` held by
            a parent module), ``"attribute"`` (a compiled function set on a module, such as
            ``self.forward = torch.compile(self.forward)`` or the ``training_step`` of a
            LightningModule given to Lightning compiled) or ``"loss"`` (a compiled loss function).
        module: The module (``call_impl``, ``attribute``) or the parent (``slot``).
        name: The parent's attribute (``slot``, ``attribute``).
        original: The uncompiled module or function (``model``, ``slot``, ``attribute``, ``loss``).
    """

    label: str
    settings: compat.CompileSettings
    kind: str
    module: nn.Module | None = None
    name: str | None = None
    original: Any = None

    def install(self, backend: Callable, settings: compat.CompileSettings) -> Callable[[], None]:
        """Puts the target, compiled with ``backend``, where the step calls it (the
        ``call_impl``, ``attribute`` and ``slot`` kinds); returns the undo."""
        if self.kind == "call_impl":
            slots = vars(self.module)
            had = "_compiled_call_impl" in slots
            before = slots.get("_compiled_call_impl")
            slots["_compiled_call_impl"] = compat.compile_with(self.module._call_impl, backend, settings)

            def undo() -> None:
                if had:
                    slots["_compiled_call_impl"] = before
                else:
                    slots.pop("_compiled_call_impl", None)

            return undo
        if self.kind == "attribute":
            slots = vars(self.module)
            before = slots[self.name]
            slots[self.name] = compat.compile_with(self.original, backend, settings)

            def undo_attribute() -> None:
                slots[self.name] = before

            return undo_attribute
        if self.kind == "slot":
            modules = self.module._modules
            before = modules[self.name]
            modules[self.name] = compat.compile_with(self.original, backend, settings)

            def undo_slot() -> None:
                modules[self.name] = before

            return undo_slot
        return lambda: None


def _own_step_settings(optimizer: Any) -> compat.CompileSettings | None:
    """How a ``step`` set on the optimizer instance (``opt.step = torch.compile(opt.step)``) was compiled, or ``None``."""
    own = vars(optimizer).get("step") if hasattr(optimizer, "__dict__") else None
    return compat.compile_settings(own) if own is not None else None


def eager_step(optimizer: Any) -> Callable[[], Any]:
    """``optimizer.step`` without a ``torch.compile`` set on the instance (an estimate never runs a real compile).

    Example:
        >>> import torch
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        >>> opt.step = torch.compile(opt.step)
        >>> eager_step(opt).__func__ is type(opt).step
        True
    """
    if _own_step_settings(optimizer) is not None:
        return type(optimizer).step.__get__(optimizer)
    return optimizer.step


def _optimizer_step_settings(optimizer: Any) -> compat.CompileSettings | None:
    """How the ``step`` of an optimizer instance (or of one in a list) was ``torch.compile``'d, or ``None``."""
    optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
    return next((s for s in map(_own_step_settings, optimizers) if s is not None), None)


def find_compiled(model: nn.Module, loss_fn: LossFn | None, optimizer: Any = None) -> "CompiledStep | None":
    """What of the step is ``torch.compile``'d, or ``None`` when nothing is.

    Never raises for what it finds: a target that cannot be modelled (an
    unknown backend, compiled twice) is recorded in ``CompiledStep.problem``.

    Example:
        >>> import torch
        >>> find_compiled(torch.nn.Linear(2, 2), None) is None
        True
        >>> step = find_compiled(torch.compile(torch.nn.Linear(2, 2), backend="aot_eager"), None)
        >>> step.method, [target.label for target in step.targets]
        ('trace+aot_eager', ['the model'])
    """
    targets: list[CompileTarget] = []
    problems: list[str] = []
    root = model
    root_settings = compat.compile_settings(model) if isinstance(model, nn.Module) else None
    if root_settings is not None:
        root = compat.uncompiled(model)
        if compat.compile_settings(root) is not None or compat.compiled_call_impl(root) is not None:
            problems.append("the model is compiled twice (torch.compile of a compiled module)")
        targets.append(CompileTarget("the model", root_settings, "model", original=root))
    if isinstance(root, nn.Module):
        for name, module in root.named_modules():
            impl = compat.compiled_call_impl(module)
            if impl is not None:
                settings = compat.compile_settings(impl)
                if settings is not None:
                    label = "the model" if module is root else f"submodule {name}"
                    targets.append(CompileTarget(f"{label} (.compile())", settings, "call_impl", module=module))
            for attribute, value in list(vars(module).items()):
                if attribute.startswith("_") or isinstance(value, nn.Module) or not callable(value):
                    continue
                settings = compat.compile_settings(value)
                if settings is not None:  # self.forward = torch.compile(self.forward); Lightning's from_compiled
                    prefix = f"{name}." if name else ""
                    targets.append(
                        CompileTarget(
                            f"{prefix}{attribute}",
                            settings,
                            "attribute",
                            module=module,
                            name=attribute,
                            original=compat.uncompiled(value),
                        )
                    )
            for child_name, child in module._modules.items():
                settings = compat.compile_settings(child) if child is not None else None
                if settings is not None:
                    inner = compat.uncompiled(child)
                    if compat.compile_settings(inner) is not None or compat.compiled_call_impl(inner) is not None:
                        problems.append(f"submodule {child_name} is compiled twice")
                    prefix = f"{name}." if name else ""
                    targets.append(
                        CompileTarget(
                            f"submodule {prefix}{child_name}",
                            settings,
                            "slot",
                            module=module,
                            name=child_name,
                            original=inner,
                        )
                    )
    loss = loss_fn
    if loss_fn is not None and compat.compile_settings(loss_fn) is not None:
        settings = compat.compile_settings(loss_fn)
        loss = compat.uncompiled(loss_fn)
        targets.append(CompileTarget("the loss function", settings, "loss", original=loss))
    optimizer_settings = _optimizer_step_settings(optimizer)
    if optimizer_settings is not None:
        targets.append(CompileTarget("the optimizer step", optimizer_settings, "optimizer"))
    if not targets:
        return None
    for target in targets:
        if target.settings.backend not in compat.FAKE_BACKENDS:
            problems.append(
                f"{target.label} uses the backend {target.settings.backend!r}, which nnmem_callbacks cannot run without building its kernels"
            )
    return CompiledStep(root, loss, tuple(targets), "; ".join(problems) or None)


@dataclasses.dataclass
class CompiledStep:
    """A training step with ``torch.compile``'d parts, and how to estimate it.

    Attributes:
        model: The uncompiled model (the estimate swaps its tensors for fake ones).
        loss_fn: The user's loss, uncompiled when it was compiled (``None``: the default).
        targets: The compiled pieces.
        problem: Why the step cannot be modelled (``None`` when it can).
    """

    model: nn.Module
    loss_fn: LossFn | None
    targets: tuple[CompileTarget, ...]
    problem: str | None = None
    tracker_class: type = CompiledStepTracker
    _scope: Any = None
    _stats: Any = None
    _optimizer_backend: Any = None
    _optimizer_steps: dict = dataclasses.field(default_factory=dict)

    @property
    def method(self) -> str:
        """``trace+inductor``, ``trace+aot_eager``, ``trace+dynamo`` (or several joined by ``+``)."""
        backends = sorted({target.settings.backend for target in self.targets})
        parts = [METHODS.get(backend, "trace").split("+", 1)[1] for backend in backends if backend in METHODS]
        return "trace+" + "+".join(parts) if parts else "trace"

    def run(self, config: StepConfig, trace: Callable[[StepConfig], Any], notes: list[str]) -> Any:
        """``trace(config)`` with the compiled targets installed; ``None`` (after a
        warning, and a note appended to ``notes``) when the step cannot be modelled.

        Raises:
            EstimationInputError, UnsupportedKernelError: As the eager trace would.
        """
        if self.problem is not None:
            self._fall_back(self.problem, notes, config)
            return None
        stats = compat.FakeCompileStats()
        try:
            compat.check_supported()
            with self._installed(config, stats) as compiled_config:
                estimate = trace(compiled_config)
        except (EstimationInputError, UnsupportedKernelError):
            raise
        except Exception as error:  # noqa: BLE001 - any failure of the compiled path falls back to the eager step
            self._fall_back(f"{type(error).__name__}: {first_line(error)}", notes, config)
            return None
        if (
            stats.frames == 0
        ):  # Dynamo skipped every frame (torch.nn code called through module.compile()): eager, as in the real run
            notes = (
                *estimate.notes,
                "Dynamo compiled no graph of the step (it skips every frame of it, as it will in the real run): the eager step was traced",
            )
            return dataclasses.replace(estimate, method="trace", notes=notes)
        return dataclasses.replace(estimate, method=self.method, notes=(*estimate.notes, *self._notes(stats, config)))

    # -- internals ---------------------------------------------------------------
    @contextlib.contextmanager
    def _installed(self, config: StepConfig, stats: compat.FakeCompileStats) -> Iterator[StepConfig]:
        scope = compat.DynamoScope()
        undo: list[Callable[[], None]] = []
        self._scope, self._stats, self._optimizer_steps = scope, stats, {}
        try:
            model, loss_fn = config.model, config.loss_fn
            for target in self.targets:
                settings = target.settings
                if STATIC_BATCH and settings.dynamic is None:
                    settings = dataclasses.replace(settings, dynamic=False)
                backend = compat.fake_backend(settings, stats)
                scope.add_backend(backend)
                if target.kind == "optimizer":
                    self._optimizer_backend = (backend, settings)
                elif target.kind == "model":
                    model = compat.compile_with(target.original, backend, settings)
                elif target.kind == "loss":
                    loss_fn = compat.compile_with(target.original, backend, settings)
                else:
                    undo.append(target.install(backend, settings))
            yield dataclasses.replace(config, model=model, loss_fn=loss_fn)
        finally:
            for step in reversed(undo):
                step()
            scope.close()
            self._scope, self._stats, self._optimizer_backend, self._optimizer_steps = None, None, None, {}

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> Callable[[], Any]:
        """The step the trace calls for ``optimizer``: compiled by the stand-in backend when the user
        compiled theirs (found on the user's optimizer, or set on one a factory made), else ``optimizer.step``."""
        if self._scope is None:
            return optimizer.step
        if id(optimizer) in self._optimizer_steps:
            return self._optimizer_steps[id(optimizer)]
        backend_and_settings = self._optimizer_backend
        own_settings = _own_step_settings(optimizer)
        if own_settings is not None and own_settings.backend in compat.FAKE_BACKENDS:
            backend = compat.fake_backend(own_settings, self._stats)
            self._scope.add_backend(backend)
            backend_and_settings = (backend, own_settings)
        if backend_and_settings is None:
            return optimizer.step
        backend, settings = backend_and_settings
        step = compat.compile_with(type(optimizer).step.__get__(optimizer), backend, settings)
        self._optimizer_steps[id(optimizer)] = step
        return step

    def _notes(self, stats: compat.FakeCompileStats, config: StepConfig) -> list[str]:
        targets = ", ".join(f"{target.label} ({target.settings.describe()})" for target in self.targets)
        backends = {target.settings.backend for target in self.targets}
        done = (
            f"torch.compile'd step estimated from its compiled graphs: {targets}; Dynamo handed {stats.frames} "
            f"graph(s) to the backend (graph breaks and batch-size recompiles add graphs)"
        )
        if "inductor" in backends:
            done += (
                f"; AOTAutograd's partition and Inductor's fusion, buffer reuse and schedule were run up to its "
                f"wrapper code ({stats.wrappers} forward/backward wrapper(s)), which ran on fake tensors with "
                f"{stats.kernels} kernel(s) as no-ops: no kernel was compiled"
            )
        elif "aot_eager" in backends:
            done += "; AOTAutograd's partitioned forward and backward graphs ran on fake tensors"
        notes = [done]
        if config.target_device.type == "cuda" and config.trace_device.type != "cuda":
            notes.append(
                "no CUDA device here: Inductor's CPU lowering stood in for its CUDA (Triton) lowering; the partition "
                "and what is saved for backward are the same, but fusion choices, and so the buffers, can differ on "
                "the GPU (not measured against a GPU)"
            )
        for target in self.targets:
            for option in compat.overridden_options(target.settings):
                notes.append(f"{target.label}: not modelled: {option}")
        return notes

    def _fall_back(self, reason: str, notes: list[str], config: StepConfig) -> None:
        what = ", ".join(target.label for target in self.targets)
        message = (
            f"nnmem_callbacks cannot model the torch.compile'd step of {type(config.model).__name__} ({what}): {reason}; "
            f"the eager step is estimated instead: {EAGER_DIRECTION}"
        )
        notes.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=5)
