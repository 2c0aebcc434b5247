"""CUDA autocast on a CPU trace: the op lists and cast policy read from the running torch.

A CUDA target traced without a CUDA device runs under ``torch.autocast("cpu")``, whose op lists differ from CUDA's
(CPU keeps ``softmax``, ``layer_norm``, ``pow``... in the lower precision; CUDA computes and saves them in fp32). This
module makes CPU autocast behave like CUDA autocast for the duration of a trace (:func:`cuda_autocast_on_cpu`),
without copying any op list by hand: the running torch's ``AutocastCUDA`` kernels are probed on stand-in tensors
and their casts replayed as Python kernels for the ``AutocastCPU`` key.

Design: docs/cuda-model.md, "Autocast".

Known limitations:
    * While the context is active, every ``torch.autocast("cpu")`` region of
      the process (other threads included) follows CUDA's op lists.
    * The plan is keyed on argument dtypes and non-tensor values, not shapes:
      an autocast kernel whose casts depend on shapes (none in torch 2.13)
      would be replayed wrongly.
    * Ops whose AutocastCUDA kernel is a banned op (``binary_cross_entropy``)
      raise the same error as on CUDA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import warnings
import weakref
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = [
    "CastPlan",
    "cpu_autocast_ops",
    "cuda_autocast_on_cpu",
    "cuda_autocast_ops",
    "CudaAutocastEmulation",
    "probe_cuda_autocast",
]

_DispatchKey = torch._C.DispatchKey
_DispatchKeySet = torch._C.DispatchKeySet
_AUTOCAST_CPU = _DispatchKeySet(_DispatchKey.AutocastCPU)
_AUTOCAST_CUDA = _DispatchKeySet(_DispatchKey.AutocastCUDA)


class _StopKernel(Exception):
    """Raised by a probe at the autocast kernel's inner call, carrying that call."""


class _Probe(torch.Tensor):
    """A data-less tensor that reports device cuda; records casts and the first other op."""

    source: "_Probe | None"
    index: int
    cast_to: torch.dtype | None

    @staticmethod
    def __new__(cls, shape, dtype, index=-1, source=None, cast_to=None):
        probe = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device="cuda")
        probe.index, probe.source, probe.cast_to = index, source, cast_to
        return probe

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _CAST_OPS and isinstance(args[0], _Probe):
            dtype = kwargs.get("dtype")
            if dtype is None and len(args) > 1 and isinstance(args[1], torch.dtype):
                dtype = args[1]
            if dtype is None:  # a device-only .to(): not a cast
                raise _StopKernel(func, args, kwargs)
            return _Probe(args[0].shape, dtype, source=args[0], cast_to=dtype)
        raise _StopKernel(func, args, kwargs)


_CAST_OPS = {torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout, torch.ops.aten._to_copy.default}


@dataclasses.dataclass(frozen=True)
class CastPlan:
    """What CUDA autocast does with one call: the inner op and each argument's cast.

    Attributes:
        func: The op the autocast kernel calls (``None``: it raised ``error``).
        template: Flattened arguments of that call: ``("input", i, dtypes)``
            for the i-th flattened input tensor cast through ``dtypes`` in
            order, or ``("const", value)``.
        spec: The pytree spec of ``(args, kwargs)`` of the inner call.
        error: The error the CUDA kernel raises (banned ops), else ``None``.
    """

    func: Any
    template: tuple
    spec: Any
    error: BaseException | None = None

    def casts(self) -> dict[int, torch.dtype]:
        """Flattened input index -> final dtype, for the inputs the kernel casts."""
        return {entry[1]: entry[2][-1] for entry in self.template if entry[0] == "input" and entry[2]}


def cuda_autocast_ops() -> list[str]:
    """Operator names (``"aten::softmax.int"``) with an AutocastCUDA kernel in this torch.

    Example:
        >>> ops = cuda_autocast_ops()
        >>> "aten::softmax.int" in ops and "aten::mm" in ops
        True
    """
    return _ops_with_kernel("AutocastCUDA")


def cpu_autocast_ops() -> list[str]:
    """Operator names with an AutocastCPU kernel in this torch."""
    return _ops_with_kernel("AutocastCPU")


@functools.lru_cache(maxsize=None)
def _ops_with_kernel_cached(key: str, version: str) -> tuple[str, ...]:
    names = []
    for name in torch._C._dispatch_get_all_op_names():
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
                names.append(name)
        except RuntimeError:
            continue
    return tuple(sorted(names))


def _ops_with_kernel(key: str) -> list[str]:
    return list(_ops_with_kernel_cached(key, torch.__version__))


def _resolve(name: str):
    """``"aten::softmax.int"`` -> ``torch.ops.aten.softmax.int`` (``None`` if absent)."""
    namespace, _, rest = name.partition("::")
    op_name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), op_name)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        return None


def _signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("T", value.dtype, value.is_floating_point())
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def probe_cuda_autocast(op, args: tuple, kwargs: dict, lower_dtype: torch.dtype) -> CastPlan:
    """Runs ``op``'s AutocastCUDA kernel on data-less cuda stand-ins of ``args``.

    Args:
        op: An ``OpOverload`` with an AutocastCUDA kernel.
        args: Its positional arguments (tensors are only read for shape and dtype).
        kwargs: Its keyword arguments.
        lower_dtype: The autocast dtype (``torch.bfloat16`` or ``torch.float16``).

    Returns:
        The :class:`CastPlan` the kernel follows.

    Example:
        >>> import torch
        >>> x = torch.empty(4, 4, dtype=torch.bfloat16)
        >>> plan = probe_cuda_autocast(torch.ops.aten.softmax.int, (x, -1), {}, torch.bfloat16)
        >>> plan.func, plan.template[-1]   # softmax(x, -1, dtype=float32): an fp32 output
        (<OpOverload(op='aten.softmax', overload='int')>, ('const', torch.float32))
    """
    flat, _ = tree_flatten((args, kwargs))
    counter = iter(range(len(flat)))

    def stand_in(value):
        index = next(counter)
        if isinstance(value, torch.Tensor):
            return _Probe(value.shape, value.dtype, index=index)
        return value

    flat_probes = [stand_in(v) for v in flat]
    p_args, p_kwargs = tree_unflatten(flat_probes, tree_flatten((args, kwargs))[1])
    previous_dtype = torch.get_autocast_dtype("cuda")
    previous_cache = torch.is_autocast_cache_enabled()
    torch.set_autocast_dtype("cuda", lower_dtype)
    torch.set_autocast_cache_enabled(False)
    try:
        # no dispatch mode (the estimator's tracker, FakeTensorMode) may see the stand-ins
        with _disable_current_modes(), torch._C._AutoDispatchBelowAutograd(), _quiet():
            op.redispatch(_AUTOCAST_CUDA, *p_args, **p_kwargs)
    except _StopKernel as stop:
        func, inner_args, inner_kwargs = stop.args
    except Exception as error:  # noqa: BLE001 - a banned op: replayed as the same error
        return CastPlan(None, (), None, error)
    else:  # the kernel made no call on the stand-ins (cannot happen for a wrapper)
        return CastPlan(
            op,
            tuple(("input", i, ()) if isinstance(v, torch.Tensor) else ("const", v) for i, v in enumerate(flat)),
            tree_flatten((args, kwargs))[1],
        )
    finally:
        torch.set_autocast_dtype("cuda", previous_dtype)
        torch.set_autocast_cache_enabled(previous_cache)
    if func in _CAST_OPS:  # a device-only .to() as the inner call: no cast plan to follow
        raise RuntimeError(f"unexpected inner call {func} in the AutocastCUDA kernel of {op}")
    inner_flat, spec = tree_flatten((tuple(inner_args), dict(inner_kwargs)))
    template = []
    for value in inner_flat:
        if isinstance(value, _Probe):
            dtypes = []
            while value.source is not None:
                dtypes.append(value.cast_to)
                value = value.source
            template.append(("input", value.index, tuple(reversed(dtypes))))
        else:
            template.append(("const", value))
    return CastPlan(func, tuple(template), spec)


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class _CastCache:
    """``cached_cast`` for the trace: leaf fp32 weights cast once per autocast region."""

    def __init__(self) -> None:
        self.entries: dict[int, tuple[weakref.ref, torch.Tensor]] = {}

    def cast(self, tensor: torch.Tensor, dtype: torch.dtype, lower_dtype: torch.dtype) -> torch.Tensor:
        if tensor.dtype == dtype or not tensor.is_floating_point() or tensor.dtype == torch.float64:
            return tensor  # cached_cast leaves doubles and non-float tensors alone
        cacheable = (
            dtype == lower_dtype
            and tensor.dtype == torch.float32
            and tensor.requires_grad
            and tensor.is_leaf
            and not tensor._is_view()
            and torch.is_autocast_cache_enabled()
        )
        if not cacheable:
            return tensor.to(dtype)
        entry = self.entries.get(id(tensor))
        if entry is not None and entry[0]() is tensor and entry[1].dtype == dtype:
            return entry[1]
        result = tensor.to(dtype)
        self.entries[id(tensor)] = (weakref.ref(tensor), result)
        return result

    def clear(self) -> None:
        self.entries.clear()


class CudaAutocastEmulation:
    """Installs the CUDA plans as AutocastCPU kernels (see the module docstring)."""

    def __init__(self) -> None:
        self.plans = _PLANS  # plans depend only on this torch build: shared by every trace
        self.cache = _CastCache()
        self.library: torch.library.Library | None = None
        self.overridden: list[str] = []
        self.fallthrough: list[str] = []
        self.unresolved: list[str] = []
        self.used = False

    def kernel_for(self, op) -> Callable:
        def kernel(*args, **kwargs):
            return self.call(op, args, kwargs)

        return kernel

    def call(self, op, args: tuple, kwargs: dict) -> Any:
        self.used = True
        lower = torch.get_autocast_dtype("cpu")
        flat, _ = tree_flatten((args, kwargs))
        key = (op, lower, tuple(_signature(v) for v in flat))
        plan = self.plans.get(key)
        if plan is None:
            plan = probe_cuda_autocast(op, args, kwargs, lower)
            self.plans[key] = plan
        if plan.error is not None:
            raise type(plan.error)(*plan.error.args)
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            values = []
            for entry in plan.template:
                if entry[0] == "const":
                    values.append(entry[1])
                    continue
                value = flat[entry[1]]
                for dtype in entry[2]:
                    value = self.cache.cast(value, dtype, lower)
                values.append(value)
            inner_args, inner_kwargs = tree_unflatten(values, plan.spec)
            return plan.func(*inner_args, **inner_kwargs)

    def install(self) -> None:
        cuda_ops = set(cuda_autocast_ops())
        library = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - removed in uninstall()
        with _quiet():
            for name in sorted(cuda_ops):
                op = _resolve(name)
                if op is None or not name.startswith("aten::"):
                    self.unresolved.append(name)
                    continue
                library.impl(name.split("::", 1)[1], self.kernel_for(op), "AutocastCPU")
                self.overridden.append(name)
            for name in cpu_autocast_ops():
                if name in cuda_ops or not name.startswith("aten::"):
                    continue
                library.impl(name.split("::", 1)[1], torch.library.fallthrough_kernel, "AutocastCPU")
                self.fallthrough.append(name)
        self.library = library

    def uninstall(self) -> None:
        if self.library is not None:
            self.library._destroy()
            self.library = None
        self.cache.clear()


_install_lock = threading.RLock()  # re-entrant: a nested emulation stacks its kernels on the outer ones
_PLANS: dict[tuple, CastPlan] = {}


@contextlib.contextmanager
def cuda_autocast_on_cpu() -> Iterator[CudaAutocastEmulation]:
    """Within the block, ``torch.autocast("cpu")`` follows CUDA autocast's lists and casts.

    Example:
        >>> import torch
        >>> x = torch.randn(4, 8)
        >>> with cuda_autocast_on_cpu(), torch.autocast("cpu", dtype=torch.bfloat16):
        ...     y = torch.softmax(x.to(torch.bfloat16), -1)
        >>> y.dtype   # CPU autocast alone would give bfloat16
        torch.float32
    """
    emulation = CudaAutocastEmulation()
    original_clear = torch.clear_autocast_cache

    def clear_autocast_cache() -> None:
        emulation.cache.clear()
        original_clear()

    with _install_lock:
        emulation.install()
        torch.clear_autocast_cache = clear_autocast_cache
        try:
            yield emulation
        finally:
            torch.clear_autocast_cache = original_clear
            emulation.uninstall()
