"""Every use of torch's private compile internals (Dynamo, AOTAutograd, Inductor), in one place.

:mod:`nnmem_callbacks.estimators.torch.compiled` estimates ``torch.compile``'d
training steps with these pieces; ``tests/test_inductor_compat.py`` runs each
of them against the installed torch. What they rely on:

* reading what the user compiled and how (:func:`compile_settings`): the
  ``OptimizeContext`` of an ``OptimizedModule``, of ``nn.Module.compile()``'s
  ``_compiled_call_impl`` or of a compiled function, and the backend wrapper it
  holds (``_TorchCompileInductorWrapper``: Inductor options with the mode folded
  in; ``_TorchCompileWrapper``: a backend by name);
* :func:`fake_backend`: Inductor (``compile_fx``: AOTAutograd, the
  min-cut partitioner, lowering, the scheduler and its Python wrapper code
  generation) with ``GraphLowering._compile_to_module_lines`` replaced, so
  the generated wrapper runs with every kernel a no-op, its buffers allocated as
  fake tensors and no C++ or Triton source compiled (CPU ISA checks included,
  see :func:`_isa_list_without_builds`); caches off, the backward compiled
  with the forward (``force_non_lazy_backward_lowering``); C++ kernels written
  without vectorization outside outer-loop fusion (:func:`_scalar_cpp_kernels`:
  ``cpu_vec_isa.pick_vec_isa``, ``CppScheduling.codegen_outer_loop_node``);
* :class:`IgnoresCompileInternals`: a dispatch mode flag (``ignore_compile_internals``)
  that lets Dynamo compile while the mode is active and hands it only the
  compiled artifacts' ops at run time;
* :class:`DynamoScope`: takes the cache entries, backend registrations and
  automatic-dynamic records the estimate's compiles leave in Dynamo's
  process-wide state out again, so the user's own compile is not changed.

Example:
    >>> import torch
    >>> compile_settings(torch.compile(torch.nn.Linear(2, 2), mode="max-autotune-no-cudagraphs")).backend
    'inductor'
    >>> compile_settings(torch.nn.Linear(2, 2)) is None
    True

Known limitations:
    * Tested against torch 2.13 (:data:`TESTED_TORCH`); where an internal is
      missing, :func:`check_supported` says which and the caller falls back to
      the eager step.
    * The patches are process-wide while a fake compile runs: a real
      ``torch.compile`` in another thread at the same moment would see them.
    * Autotuning (``max-autotune``) would benchmark real kernels: it is turned
      off for the estimate, so the extern GEMM/convolution kernels are assumed.
    * CUDA graphs (``reduce-overhead``) are turned off: their memory pool is not
      modelled.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import sys
import types
from typing import Any, Callable, Iterator, Mapping

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "check_supported",
    "compile_settings",
    "compile_with",
    "CompileSettings",
    "CompileUnsupported",
    "compiled_call_impl",
    "DynamoScope",
    "FAKE_BACKENDS",
    "fake_backend",
    "FakeCompileStats",
    "force_eager",
    "IgnoresCompileInternals",
    "OVERRIDDEN_OPTIONS",
    "overridden_options",
    "RECOMPILE_LIMIT",
    "SCALAR_CPP_KERNELS",
    "TESTED_TORCH",
    "uncompiled",
    "WRAPPER_FILENAME",
]

#: The torch releases these internals were written and tested against.
TESTED_TORCH = ("2.13",)

#: The file name the generated wrapper code runs under (it shows in tracebacks).
WRAPPER_FILENAME = "<nnmem inductor wrapper: kernels are no-ops>"

#: Inductor options the estimate forces, and why (the user's values are not modelled).
OVERRIDDEN_OPTIONS: dict[str, tuple[Any, str]] = {
    "max_autotune": (False, "max-autotune benchmarks real kernels; the extern kernels are assumed"),
    "max_autotune_gemm": (False, "max-autotune benchmarks real kernels; the extern kernels are assumed"),
    "max_autotune_pointwise": (False, "max-autotune benchmarks real kernels; the default kernels are assumed"),
    "coordinate_descent_tuning": (False, "tuning runs real kernels"),
    "triton.cudagraphs": (False, "CUDA graphs' memory pool is not modelled (the figure errs low)"),
    "cpp_wrapper": (False, "the Python wrapper is run instead of the C++ one (same memory plan)"),
    "fx_graph_cache": (False, None),
    "fx_graph_remote_cache": (False, None),
    "compile_threads": (1, None),
}

#: Recompiles allowed per compiled frame during an estimate (one per traced batch size, and some to spare).
RECOMPILE_LIMIT = 64


class CompileUnsupported(RuntimeError):
    """The installed torch lacks an internal the compiled-step estimate needs."""


def check_supported() -> None:
    """Raises :class:`CompileUnsupported` naming the first missing internal.

    Example:
        >>> check_supported()  # torch 2.13
    """
    if not hasattr(TorchDispatchMode, "ignore_compile_internals"):
        raise CompileUnsupported("TorchDispatchMode.ignore_compile_internals (torch >= 2.9) is missing")
    from torch._inductor.graph import GraphLowering

    if not hasattr(GraphLowering, "_compile_to_module_lines"):
        raise CompileUnsupported("torch._inductor.graph.GraphLowering._compile_to_module_lines is missing")
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        raise CompileUnsupported("torch._functorch.config.force_non_lazy_backward_lowering is missing")
    from torch._dynamo import convert_frame

    if not hasattr(convert_frame, "input_codes"):
        raise CompileUnsupported("torch._dynamo.convert_frame.input_codes is missing")


# ---------------------------------------------------------------------------
# what the user compiled
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CompileSettings:
    """How something was ``torch.compile``'d.

    Attributes:
        backend: ``"inductor"``, ``"aot_eager"``, ``"eager"`` or the name of
            another backend (a custom one).
        options: Inductor's options with the mode folded in (``mode="max-autotune"``
            becomes ``max_autotune=True``...); for other backends their
            ``mode``/``options`` arguments.
        dynamic: ``torch.compile``'s ``dynamic`` argument.
        fullgraph: ``torch.compile``'s ``fullgraph`` argument.
    """

    backend: str
    options: Mapping[str, Any]
    dynamic: bool | None
    fullgraph: bool

    def describe(self) -> str:
        """``backend=inductor, dynamic=None, fullgraph=False, options {...}``."""
        text = f"backend={self.backend}, dynamic={self.dynamic}, fullgraph={self.fullgraph}"
        if self.options:
            text += ", options " + ", ".join(f"{k}={v!r}" for k, v in sorted(self.options.items()))
        return text


def _optimize_context(obj: Any) -> Any:
    """The ``OptimizeContext`` behind a compiled module or function, or ``None``."""
    if "torch._dynamo" not in sys.modules:  # nothing was compiled in this process; do not load Dynamo to find out
        return None
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(obj, OptimizedModule):
        return obj.dynamo_ctx
    if callable(obj) and getattr(obj, "_torchdynamo_orig_callable", None) is not None:
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if type(value).__name__ == "OptimizeContext":
                return value
    return None


def _backend_of(context: Any) -> tuple[str, dict[str, Any]]:
    """The backend's name and options, from the convert-frame callback's chain of wrappers."""
    backend = getattr(context, "callback", None)
    seen = 0
    while getattr(backend, "_torchdynamo_orig_backend", None) is not None and seen < 16:
        backend = backend._torchdynamo_orig_backend
        seen += 1
    kind = type(backend).__name__
    if kind == "_TorchCompileInductorWrapper":
        return "inductor", dict(backend.config)
    if kind == "_TorchCompileWrapper":
        options = dict(backend.kwargs.get("options") or {})
        if backend.kwargs.get("mode"):
            options["mode"] = backend.kwargs["mode"]
        return str(backend.compiler_name), options
    name = getattr(backend, "__name__", None) or kind
    return str(name), {}


def compile_settings(obj: Any) -> CompileSettings | None:
    """How ``obj`` (an ``OptimizedModule`` or a compiled function) was compiled; ``None`` if it was not."""
    context = _optimize_context(obj)
    if context is None:
        return None
    backend, options = _backend_of(context)
    return CompileSettings(
        backend, options, getattr(context, "_dynamic", None), bool(getattr(context, "fullgraph", False))
    )


def uncompiled(obj: Any) -> Any:
    """What ``torch.compile`` wrapped: the module of an ``OptimizedModule``, the function of a compiled one."""
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(obj, OptimizedModule):
        return obj._orig_mod
    return getattr(obj, "_torchdynamo_orig_callable", obj)


def compiled_call_impl(module: nn.Module) -> Any:
    """The compiled ``_call_impl`` that ``module.compile()`` set, or ``None``."""
    return vars(module).get("_compiled_call_impl")


def compile_with(target: Any, backend: Callable, settings: CompileSettings) -> Any:
    """``torch.compile(target)`` with ``backend`` and the user's ``dynamic`` and ``fullgraph``.

    The compile gets its own recompile budget (``isolate_recompiles``, where
    this torch has it): the estimate's compiles never count against the
    user's.
    """
    kwargs: dict[str, Any] = {"backend": backend, "dynamic": settings.dynamic, "fullgraph": settings.fullgraph}
    parameters = inspect.signature(torch.compile).parameters
    if "isolate_recompiles" in parameters:
        kwargs["isolate_recompiles"] = True
    if "recompile_limit" in parameters:
        kwargs["recompile_limit"] = RECOMPILE_LIMIT
    return torch.compile(target, **kwargs)


@contextlib.contextmanager
def force_eager() -> Iterator[None]:
    """Every ``torch.compile``'d function runs its original code, and Dynamo sees none of them.

    An eager trace runs under a dispatch mode, where Dynamo would skip a
    compiled function's frames and mark their code to be skipped for good
    (the user's own compile would then run eagerly), or run a compiled
    artifact cached by the user's real run (real kernels) on fake tensors.

    Example:
        >>> with force_eager():
        ...     torch.compile(lambda x: x + 1)(torch.ones(1)).item()
        2.0
    """
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None or "torch._dynamo" not in sys.modules:  # torch < 2.6, or nothing compiled in this process
        yield
        return
    with set_stance("force_eager"):
        yield


class IgnoresCompileInternals:
    """Mixin for a ``TorchDispatchMode``: Dynamo compiles while the mode is
    active (it turns the mode off for the compile) and the mode sees the ops
    the compiled artifacts run. Without it Dynamo skips every frame under the
    mode and the step would run eagerly."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


# ---------------------------------------------------------------------------
# a backend that builds no kernels
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class FakeCompileStats:
    """What the fake backend did (for the estimate's notes).

    Attributes:
        frames: Dynamo graphs handed to the backend (one per compiled frame and
            batch-size specialisation; graph breaks add frames).
        wrappers: Inductor wrapper modules generated (forward and backward graphs).
        kernels: Kernels that became no-ops.
    """

    frames: int = 0
    wrappers: int = 0
    kernels: int = 0


def _no_kernel(*args: Any, **kwargs: Any) -> None:
    return None


class _NoKernel:
    """Stands for a compiled kernel: calling it (or ``.run`` for Triton) does nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def run(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return _no_kernel


def _no_compile_class(stats: FakeCompileStats) -> type:
    """An ``AsyncCompile`` stand-in whose every kernel is a no-op (no source is compiled)."""

    class NoCompile:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __getattr__(self, name: str) -> Any:
            def kernel(*args: Any, **kwargs: Any) -> _NoKernel:
                stats.kernels += 1
                return _NoKernel()

            return kernel

        def wait(self, scope: Any) -> None:
            pass

    return NoCompile


def _empty_strided_on(device: str) -> Callable:
    def empty_strided(size: Any, stride: Any, dtype: torch.dtype, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.empty_strided(size, stride, dtype=dtype, device=device)

    return empty_strided


def _reinterpret_tensor(tensor: torch.Tensor, size: Any, stride: Any, offset: int) -> torch.Tensor:
    return torch.as_strided(tensor, size, stride, offset)


#: The wrapper's allocation helpers (C++ functions that bypass the dispatcher) and their fake-tensor stand-ins.
_FAKE_HELPERS: dict[str, Callable] = {
    "empty_strided_cpu": _empty_strided_on("cpu"),
    "empty_strided_cpu_pinned": _empty_strided_on("cpu"),
    "empty_strided_cuda": _empty_strided_on("cuda"),
    "empty_strided_xpu": _empty_strided_on("xpu"),
    "empty_strided_mtia": _empty_strided_on("mtia"),
    "reinterpret_tensor": _reinterpret_tensor,
}


def _wrapper_module(source: str, stats: FakeCompileStats) -> types.ModuleType:
    """Runs Inductor's generated wrapper source as a module whose kernels are no-ops.

    The module is private to the estimate: nothing goes into Inductor's code
    caches, so a later real compile of the same graph builds real kernels.
    """
    import torch._inductor.async_compile as async_compile

    namespace: dict[str, Any] = {"__name__": "nnmem_inductor_wrapper", "__file__": WRAPPER_FILENAME}
    real = async_compile.AsyncCompile
    async_compile.AsyncCompile = _no_compile_class(stats)
    try:
        exec(compile(source, WRAPPER_FILENAME, "exec"), namespace)  # noqa: S102 - Inductor's own generated code
    finally:
        async_compile.AsyncCompile = real
    namespace.update(_FAKE_HELPERS)
    module = types.ModuleType("nnmem_inductor_wrapper")
    module.__dict__.update(namespace)
    stats.wrappers += 1
    return module


def _isa_list_without_builds() -> list:
    """Inductor's CPU vector ISAs without its dry-run C++ builds: the list it
    computed already in this process, else the ISAs the CPU reports."""
    from torch._inductor import cpu_vec_isa

    real = _REAL_VALID_ISA_LIST[0]
    cache_info = getattr(real, "cache_info", None)
    if cache_info is not None and cache_info().currsize:
        return real()
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return real()
    flags = cpu_vec_isa.x86_isa_checker()
    return [isa for isa in cpu_vec_isa.supported_vec_isa_list if all(flag in flags for flag in str(isa).split())]


_REAL_VALID_ISA_LIST: list[Any] = [None]

#: Write Inductor's C++ kernels without vectorization where that cannot change the wrapper's buffers (see
#: :func:`_scalar_cpp_kernels`); ``False`` writes them as a real compile does (the tests compare the two).
SCALAR_CPP_KERNELS = True


@contextlib.contextmanager
def _scalar_cpp_kernels() -> Iterator[None]:
    """Inductor's C++ backend writes scalar kernels only, except in outer-loop fusion.

    The kernels' source is never compiled, yet choosing the vectorized kernels' tiling and writing them was half of
    a CPU estimate's compile (a BatchNorm CNN: 29 of 58 s under cProfile). What the wrapper allocates does not depend
    on them: for each fused node Inductor first writes the scalar kernel, and only that kernel's removed and in-place
    buffers reach the graph (``CppKernelProxy.codegen_functions``); the vectorized variants are written afterwards
    with ``inplace_buffers`` off. The exception is outer-loop fusion, where a buffer becomes kernel-local only when
    every fused kernel has the same loop tiling (``check_outer_fusion_loop_level_attr``): those nodes keep
    vectorization. Where an internal used here is missing, kernels are written as a real compile writes them.
    """
    try:
        from torch._inductor import cpu_vec_isa
        from torch._inductor.codegen.cpp import CppScheduling
    except ImportError:
        yield
        return
    real_pick = getattr(cpu_vec_isa, "pick_vec_isa", None)
    real_outer = getattr(CppScheduling, "codegen_outer_loop_node", None)
    no_isa = getattr(cpu_vec_isa, "invalid_vec_isa", None)
    if real_pick is None or real_outer is None or no_isa is None:
        yield
        return
    in_outer_loop_fusion = [0]

    def pick_vec_isa() -> Any:
        return real_pick() if in_outer_loop_fusion[0] else no_isa

    def codegen_outer_loop_node(self: Any, node: Any) -> Any:
        in_outer_loop_fusion[0] += 1
        try:
            return real_outer(self, node)
        finally:
            in_outer_loop_fusion[0] -= 1

    with (
        _patched(cpu_vec_isa, "pick_vec_isa", pick_vec_isa),
        _patched(CppScheduling, "codegen_outer_loop_node", codegen_outer_loop_node),
    ):
        yield


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


def _inductor_patches(options: Mapping[str, Any]) -> dict[str, Any]:
    """The user's Inductor options with :data:`OVERRIDDEN_OPTIONS` forced, for this torch's config."""
    from torch._inductor import config as inductor_config

    known = set(inductor_config.get_config_copy())
    patches = {key: value for key, value in options.items() if key.replace("-", "_") in known}
    for key, (value, _reason) in OVERRIDDEN_OPTIONS.items():
        if key in known:
            patches[key] = value
    return patches


class _FakeInductor:
    """A Dynamo backend: Inductor up to its wrapper code, whose kernels are no-ops."""

    nnmem_fake_backend = True

    def __init__(self, options: Mapping[str, Any], stats: FakeCompileStats) -> None:
        self.patches = _inductor_patches(options)
        self.stats = stats
        self.__name__ = "nnmem_fake_inductor"

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs: Any) -> Any:
        import torch._functorch.config as functorch_config
        from torch._inductor import cpu_vec_isa
        from torch._inductor.compile_fx import compile_fx
        from torch._inductor.graph import GraphLowering

        stats = self.stats
        stats.frames += 1

        def module_lines(graph: Any, wrapper_code: Any) -> types.ModuleType:
            return _wrapper_module(wrapper_code.value, stats)

        if _REAL_VALID_ISA_LIST[0] is None:
            _REAL_VALID_ISA_LIST[0] = cpu_vec_isa.valid_vec_isa_list
        functorch_patches = {"force_non_lazy_backward_lowering": True}
        if hasattr(functorch_config, "enable_autograd_cache"):
            functorch_patches["enable_autograd_cache"] = False
        with (
            _patched(GraphLowering, "_compile_to_module_lines", module_lines),
            _patched(cpu_vec_isa, "valid_vec_isa_list", _isa_list_without_builds),
            _scalar_cpp_kernels() if SCALAR_CPP_KERNELS else contextlib.nullcontext(),
            functorch_config.patch(functorch_patches),
        ):
            return compile_fx(graph_module, example_inputs, config_patches=dict(self.patches))


class _CountingBackend:
    """A registered backend that needs no patching (``aot_eager``, ``eager``), counting its graphs."""

    nnmem_fake_backend = True

    def __init__(self, name: str, stats: FakeCompileStats) -> None:
        from torch._dynamo.backends.registry import lookup_backend

        self.backend = lookup_backend(name)
        self.stats = stats
        self.__name__ = f"nnmem_{name}"

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.stats.frames += 1
        return self.backend(graph_module, example_inputs)


#: Backends the estimate can run without building kernels, by ``CompileSettings.backend``.
FAKE_BACKENDS = ("inductor", "aot_eager", "eager")


def fake_backend(settings: CompileSettings, stats: FakeCompileStats) -> Callable:
    """The backend that stands in for the user's: the same graphs, buffers and
    schedule, no kernel built.

    Raises:
        CompileUnsupported: For a backend that is not in :data:`FAKE_BACKENDS`.
    """
    if settings.backend == "inductor":
        return _FakeInductor(settings.options, stats)
    if settings.backend in ("aot_eager", "eager"):
        return _CountingBackend(settings.backend, stats)
    raise CompileUnsupported(f"the backend {settings.backend!r} cannot be run without building its kernels")


def overridden_options(settings: CompileSettings) -> list[str]:
    """The user's Inductor options the estimate does not follow, with why."""
    out = []
    for key, (value, reason) in OVERRIDDEN_OPTIONS.items():
        if reason is not None and key in settings.options and settings.options[key] != value:
            out.append(f"{key}={settings.options[key]!r} ({reason})")
    return out


# ---------------------------------------------------------------------------
# Dynamo's process-wide state
# ---------------------------------------------------------------------------


def _is_ours(backend: Any) -> bool:
    seen = 0
    while backend is not None and seen < 16:
        if getattr(backend, "nnmem_fake_backend", False):
            return True
        backend = getattr(backend, "_torchdynamo_orig_backend", None) or getattr(backend, "__wrapped__", None)
        seen += 1
    return False


class DynamoScope:
    """Keeps the estimate's compiles out of the user's: on :meth:`close`, the
    cache entries made with the estimate's backends are invalidated (code
    objects Dynamo first saw during the estimate are reset altogether, which
    also drops their automatic-dynamic sizes), the backends are unregistered
    and Dynamo's automatic-dynamic records (``pgo``) are put back.
    """

    def __init__(self) -> None:
        from torch._dynamo import convert_frame, pgo

        self._known_codes = set(convert_frame.input_codes.seen_ids)
        self._code_state = (
            copy.deepcopy(getattr(pgo, "_CODE_STATE", None)),
            copy.deepcopy(getattr(pgo, "_INIT_CODE_STATE", None)),
        )
        self._backends: list[Any] = []

    def add_backend(self, backend: Any) -> None:
        self._backends.append(backend)

    def close(self) -> None:
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list, reset_code
        from torch._dynamo import convert_frame, eval_frame, pgo

        for weak in list(convert_frame.input_codes.seen):
            code = weak()
            if code is None:
                continue
            entries = _debug_get_cache_entry_list(code)
            ours = [entry for entry in entries if _is_ours(getattr(entry, "backend", None))]
            if not ours:
                continue
            if id(code) not in self._known_codes and len(ours) == len(entries):
                reset_code(code)
                continue
            for entry in ours:
                _invalidate(entry)
        for backend in self._backends:
            for key, value in list(eval_frame.cached_backends.items()):
                if value is backend or _is_ours(value):
                    eval_frame.cached_backends.pop(key, None)
        self._backends.clear()
        if hasattr(pgo, "_CODE_STATE"):
            pgo._CODE_STATE, pgo._INIT_CODE_STATE = self._code_state


def _invalidate(entry: Any) -> None:
    """Removes one cache entry the way Dynamo does when a guarded object dies."""
    from torch._dynamo.guards import DeletedGuardManagerWrapper

    manager = getattr(entry, "guard_manager", None)
    extra_state = getattr(manager, "extra_state", None)
    if extra_state is None or isinstance(manager, DeletedGuardManagerWrapper):
        return
    extra_state.invalidate(entry, DeletedGuardManagerWrapper("nnmem_callbacks estimate finished"))
