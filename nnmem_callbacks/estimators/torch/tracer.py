"""Follows the lifetime of every storage of a simulated training step.

The step runs on fake tensors (``torch._subclasses.FakeTensorMode``): every op
computes shapes, dtypes and aliasing but allocates nothing. A
:class:`StorageTracker` dispatch mode sits above the fake mode and sees every
op. Each output storage it has not seen before is an allocation; a weak
reference on the storage tells when the last tensor using it dies (views and
in-place ops share the storage, so they cost nothing). The result is an exact
event log of allocations and frees, in program order, which is turned into
per-phase peaks and per-category breakdowns afterwards.

Per-op rules (:mod:`nnmem_callbacks.estimators.torch.rules`) add the transient kernel
workspaces that fake tensors cannot see (oneDNN, cuDNN, cuBLAS).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import weakref
from collections import Counter
from typing import Any, Callable, Hashable, Iterable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
from torch.utils._pytree import tree_flatten

from nnmem_callbacks.core.estimate import Category
from nnmem_callbacks.estimators.torch import rules as _rules

__all__ = ["OpMemo", "StorageTracker", "TraceResult", "sharing_traced_ops"]

_LOCAL_SCALAR_DENSE = torch.ops.aten._local_scalar_dense.default

#: ``torch.tensor(0.0)``: what an optimizer's step count starts as. The fake mode turns the real scalar into a fake
#: constant through its tensor converter (3 ms a call, more than the rest of an optimizer's first step); a scalar is
#: made directly here, as the converter would make it.
_LIFT_FRESH = torch.ops.aten.lift_fresh.default

_WORKSPACE = object()  # category marker for per-op workspaces

_UNCACHEABLE = object()

#: ``step_t += 1``: an optimizer's step count, a one-element constant the fake mode keeps the value of (for
#: ``.item()``); it is added to once per parameter and step, and the fake mode's constant path is slow.
_ADD_ = torch.ops.aten.add_.Tensor
_FLOAT = ("float",)  # a float argument of a pointwise op, in a memo key: its value cannot change the output's metadata

#: Metadata queries: no tensor out, no workspace, answered by the fake mode at once. C++ asks ``prim.device`` of a
#: fake tensor every time it reads its device (the autograd engine, for every gradient): most of the ops a trace
#: dispatches (62% of a 7B-shaped LoRA trace's, counted once), so they skip the memo and the rules.
_METADATA_OPS = frozenset(
    {
        torch.ops.prim.device.default,
        torch.ops.aten.size.default,
        torch.ops.aten.stride.default,
        torch.ops.aten.storage_offset.default,
    }
)
try:  # what FakeTensorMode answers a metadata query with, before anything else (torch >= 2.5)
    from torch._subclasses.fake_tensor import _DISPATCH_META_HANDLERS as _FAKE_METADATA_ANSWERS
except ImportError:  # pragma: no cover - older torch: every query is dispatched
    _FAKE_METADATA_ANSWERS = {}
_SKIP_OPS = frozenset(
    {
        torch.ops.aten.resize_.default,
        torch.ops.aten.set_.source_Storage_storage_offset,
        torch.ops.aten.set_.source_Tensor,
        torch.ops.aten.set_.source_Storage,
        torch.ops.aten.set_.default,
    }
)


#: The memo entries shared by the estimates inside :func:`sharing_traced_ops`, by the traces' context.
_SHARED_ENTRIES: contextvars.ContextVar["dict[Hashable, dict] | None"] = contextvars.ContextVar(
    "nnmem_shared_op_memo", default=None
)


@contextlib.contextmanager
def sharing_traced_ops() -> Iterator[None]:
    """Estimates made inside share what their traces learned of each op.

    A callback estimates several times at one fit start (the estimate, the ``bf16-mixed`` offer, a direct check of
    the planned batch); each estimate's first pass of an op through the fake mode is its costliest. Inside this
    context the op memo of every trace with the same context (``StepConfig.op_context``: target device, the device
    traced on, the emulated CUDA architecture, compiled or eager) is one, so a later estimate replays what an earlier
    one saw: the optimizer's step, the weights' casts. The entries depend only on the op and its inputs' metadata,
    not on the fake mode that made them, so the bytes are the same. Nested uses share the outer one; the entries go
    when the outermost context ends.
    """
    if _SHARED_ENTRIES.get() is not None:
        yield
        return
    token = _SHARED_ENTRIES.set({})
    try:
        yield
    finally:
        _SHARED_ENTRIES.reset(token)


class OpMemo:
    """Remembers the outputs of fake ops by their inputs' metadata.

    FakeTensorMode's own dispatch cache hashes every argument's full metadata
    on every call, which dominates the cost of a trace. Ops whose outputs are
    fresh tensors, in-place results or views of an input are replayed from a
    cheaper key (op, shapes, strides, offsets, dtypes, devices and the
    non-tensor arguments). Anything unusual (constants, symbolic sizes,
    non-tensor outputs, outputs sharing a fresh storage) takes the normal path,
    and so do in-place ops that change their input's metadata rather than its
    data (``transpose_``, ``squeeze_``, ``as_strided_``...): a replay returns
    the input as it is and could not repeat the change.
    """

    def __init__(self, fake_mode: FakeTensorMode, context: Hashable | None = None) -> None:
        """``context``: what the outputs may depend on besides the op and its inputs (see :func:`sharing_traced_ops`);
        ``None`` keeps the entries to this memo."""
        self.fake_mode = fake_mode
        shared = _SHARED_ENTRIES.get() if context is not None else None
        self.entries: dict[Any, Any] = shared.setdefault(context, {}) if shared is not None else {}
        self._pointwise: dict[Any, bool] = {}

    @staticmethod
    def _arg_key(value: Any) -> Any:
        if isinstance(value, FakeTensor):
            if value.constant is not None:
                raise KeyError
            return ("T", tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device)
        if isinstance(value, torch.Tensor):
            raise KeyError
        if isinstance(value, (list, tuple)):
            if all(type(v) is int for v in value):  # sizes, dims: most lists an op gets
                return (type(value).__name__, tuple(value))
            return (type(value).__name__, tuple(OpMemo._arg_key(v) for v in value))
        if (
            value is None
            or value is _FLOAT
            or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format))
        ):
            return value
        raise KeyError

    def key(self, func: Any, args: tuple, kwargs: dict) -> Any:
        try:
            pointwise = self._pointwise.get(func)
            if pointwise is None:
                pointwise = self._pointwise[func] = torch.Tag.pointwise in func.tags
            if pointwise:
                # an element-wise op's output has its tensors' broadcast shape and a dtype from their dtypes and
                # the scalars' types: a float's value (an optimizer's bias correction, different in every step)
                # does not change the output's metadata, and the replay makes nothing else
                args = tuple(_FLOAT if type(v) is float else v for v in args)
                if kwargs:
                    kwargs = {k: _FLOAT if type(v) is float else v for k, v in kwargs.items()}
            if not kwargs:
                return (func, self._arg_key(args), ())
            return (func, self._arg_key(args), tuple((k, self._arg_key(v)) for k, v in sorted(kwargs.items())))
        except (KeyError, TypeError):
            return None

    @staticmethod
    def _flat_args(args: tuple, kwargs: dict) -> list[Any]:
        flat = []
        for value in (*args, *(kwargs[k] for k in sorted(kwargs))):
            if isinstance(value, (list, tuple)):
                flat.extend(value)
            else:
                flat.append(value)
        return flat

    @staticmethod
    def _flat_keys(key: Any) -> list[Any]:
        """The argument keys of ``key`` in the order of :meth:`_flat_args`."""
        flat = []
        for value in (*key[1][1], *(v for _, v in key[2])):
            if isinstance(value, tuple) and value and value[0] in ("list", "tuple"):
                flat.extend(value[1])
            else:
                flat.append(value)
        return flat

    def record(self, key: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if key is None or func in _SKIP_OPS:
            return
        if torch.Tag.inplace_view in func.tags:
            # transpose_, t_, squeeze_, unsqueeze_, as_strided_, swapdims_ (via
            # transpose_), resize_as_, detach_...: they change the input's
            # shape, strides or autograd metadata, which returning the input
            # as it is cannot repeat; they always run for real.
            self.entries[key] = _UNCACHEABLE
            return
        if isinstance(out, FakeTensor):
            outputs, container = [out], None
        elif (
            isinstance(out, (tuple, list))
            and any(isinstance(o, FakeTensor) for o in out)
            and all(isinstance(o, FakeTensor) or o is None for o in out)
        ):
            # None: an output the op was asked not to compute (convolution_backward's output_mask, in the key)
            outputs, container = list(out), type(out)
        else:
            self.entries[key] = _UNCACHEABLE
            return
        flat = self._flat_args(args, kwargs)
        plans = []
        fresh_storages = set()
        for output in outputs:
            if output is None:
                plans.append(("none",))
                continue
            if output.constant is not None:
                self.entries[key] = _UNCACHEABLE
                return
            same = next((i for i, a in enumerate(flat) if a is output), None)
            if same is not None:
                if self._flat_keys(key)[same] != self._arg_key(output):
                    # an in-place op that changed the metadata of its input
                    # without the inplace_view tag: never replay it
                    self.entries[key] = _UNCACHEABLE
                    return
                plans.append(("inplace", same))
                continue
            storage = output.untyped_storage()
            view = next(
                (i for i, a in enumerate(flat) if isinstance(a, FakeTensor) and a.untyped_storage() is storage),
                None,
            )
            if view is not None:
                plans.append(
                    (
                        "view",
                        view,
                        tuple(output.shape),
                        output.stride(),
                        output.storage_offset(),
                        output.dtype,
                        output.device,
                    )
                )
                continue
            if id(storage) in fresh_storages or output.storage_offset() != 0 or func._schema.is_mutable:
                self.entries[key] = _UNCACHEABLE
                return
            fresh_storages.add(id(storage))
            plans.append(
                ("fresh", tuple(output.shape), output.stride(), output.dtype, output.device, output.requires_grad)
            )
        self.entries[key] = (container, plans)

    def replay(self, entry: Any, args: tuple, kwargs: dict) -> Any:
        container, plans = entry
        flat = self._flat_args(args, kwargs)
        mode = self.fake_mode
        outputs = []
        for plan in plans:
            if plan[0] == "inplace":
                outputs.append(flat[plan[1]])
            elif plan[0] == "none":
                outputs.append(None)
            elif plan[0] == "view":
                _, index, shape, stride, offset, dtype, device = plan
                source = flat[index]
                with in_kernel_invocation_manager(mode):
                    empty = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
                    empty.set_(source.untyped_storage(), offset, shape, stride)
                outputs.append(FakeTensor(mode, empty, device))
            else:
                _, shape, stride, dtype, device, requires_grad = plan
                with in_kernel_invocation_manager(mode):
                    empty = torch.empty_strided(shape, stride, dtype=dtype, device="meta", requires_grad=requires_grad)
                outputs.append(FakeTensor(mode, empty, device))
        if container is None:
            return outputs[0]
        return container(outputs)


def _fake_scalar_constant(real: Any) -> Any:
    """``real`` (a plain one-element CPU tensor) as the fake constant the current fake mode makes of it.

    What ``FakeTensorMode`` returns for ``lift_fresh`` of such a tensor: a fake tensor of the same shape, strides
    and dtype on the same device, keeping a copy of the value for ``.item()``. Anything else: ``_UNCACHEABLE`` (the
    fake mode's own path).
    """
    mode = _get_current_dispatch_mode()
    if (
        type(real) is not torch.Tensor
        or not isinstance(mode, FakeTensorMode)
        or mode.shape_env is not None
        or real.numel() > 1
        or real.layout is not torch.strided
        or real.device.type != "cpu"
        or real.requires_grad
        or real.is_quantized
        or real.storage_offset() != 0
    ):
        return _UNCACHEABLE
    with no_dispatch():
        constant = real.clone()
    with in_kernel_invocation_manager(mode):
        meta = torch.empty_strided(tuple(real.shape), real.stride(), dtype=real.dtype, device="meta")
    return FakeTensor(mode, meta, real.device, constant=constant)


@dataclasses.dataclass
class TraceResult:
    """What one traced step sequence produced.

    Attributes:
        phase_peaks: Peak bytes per phase, in phase order.
        phase_breakdowns: Bytes per category at each phase's peak.
        events: ``(key, size)`` in program order (size ``-1`` frees ``key``).
        trajectory: Live bytes after each event (``trajectory[0]`` is before the
            first event), so ``trajectory[i]`` follows ``events[i - 1]``.
        phase_ranges: Phase -> ``(start, end)`` indices into ``trajectory``
            covering the phase (both inclusive).
        initial_sizes: Sizes of the storages live before the first event.
        placeholders: How many ``.item()`` calls got a placeholder value.
        workspace_ops: Op name -> count of per-op workspace rules applied.
        op_count: Ops seen.
    """

    phase_peaks: dict[str, int]
    phase_breakdowns: dict[str, dict[str, int]]
    events: list[tuple[int, int]]
    trajectory: list[int]
    phase_ranges: dict[str, tuple[int, int]]
    placeholders: int
    workspace_ops: Counter
    op_count: int


class StorageTracker(TorchDispatchMode):
    """A dispatch mode that logs storage allocations and frees by phase.

    Args:
        device_type: The device type whose kernels' workspaces are modelled
            (``"cpu"`` or ``"cuda"``).
        size_fn: Maps a storage's ``nbytes`` to the bytes it really occupies
            (identity on CPU; 512-byte rounding on CUDA is done by the
            allocator model instead, so this stays identity there too).
        libraries: A :class:`~nnmem_callbacks.estimators.torch.cuda.libraries.LibraryModel`
            for CUDA targets: the cuBLAS workspaces each thread's first GEMM
            allocates for good (logged by :meth:`_persistent`) and the cuDNN
            convolution workspaces (logged as transient workspaces).
    """

    def __init__(
        self,
        device_type: str = "cpu",
        size_fn: Callable[[int], int] | None = None,
        fake_mode: FakeTensorMode | None = None,
        memo: "OpMemo | None" = None,
        libraries: Any = None,
    ) -> None:
        super().__init__()
        self._memo = memo if memo is not None else (OpMemo(fake_mode) if fake_mode is not None else None)
        self.device_type = device_type
        self._size_fn = size_fn or (lambda n: n)
        self._next_key = 1
        self._key_of: dict[int, int] = {}  # id(storage) -> key
        self._refs: dict[int, weakref.ref] = {}  # key -> weakref to storage
        self.sizes: dict[int, int] = {}
        self.alloc_phase: dict[int, str] = {}
        self.fixed_category: dict[int, Any] = {}
        self.activation_keys: set[int] = set()
        self.events: list[tuple[int, int]] = []
        self.trajectory: list[int] = [0]
        self.phase_ranges: dict[str, tuple[int, int]] = {}
        self.current = 0
        self.phase = "setup"
        self.phase_order: list[str] = []
        self.phase_peaks: dict[str, int] = {}
        self.phase_peak_event: dict[str, int] = {}
        self._peak = 0
        self._peak_event = 0
        self._phase_start = 0
        self.placeholders = 0
        self.op_count = 0
        self.workspace_ops: Counter = Counter()
        self._rules = _rules.workspace_rules(device_type)
        self._output_rules = _rules.output_rules(device_type)
        self._decompositions = _rules.decompositions(device_type)
        self._libraries = libraries
        self._library_seen: set = set()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """``False``: torch then leaves ``__torch_dispatch__`` unwrapped by ``torch._disable_dynamo``.

        The wrapper switches Dynamo's frame callback on every op (about 5% of a trace). Dynamo never compiles
        under this mode: it skips every frame while a mode that does not ignore compile internals is active.
        :class:`~nnmem_callbacks.estimators.torch.compiled.CompiledStepTracker`, under which it compiles, keeps
        the wrapper.
        """
        return False

    # -- phases ----------------------------------------------------------------
    def set_phase(self, phase: str) -> None:
        """Closes the current phase and starts ``phase``."""
        self._close_phase()
        if self.phase.endswith("forward") or "/forward" in self.phase:
            ended = self.phase
            self.activation_keys.update(k for k, p in self.alloc_phase.items() if p == ended and k in self._refs)
        self.phase = phase
        self._phase_start = len(self.events)
        self._peak = self.current
        self._peak_event = len(self.events)

    def end(self) -> None:
        """Closes the last phase; what happens after (teardown) is not recorded in any phase."""
        self.set_phase("done")

    def _close_phase(self) -> None:
        if self.phase in ("setup", "done"):
            return
        if self.phase not in self.phase_peaks:
            self.phase_order.append(self.phase)
            self.phase_ranges[self.phase] = (self._phase_start, len(self.events))
        if self._peak >= self.phase_peaks.get(self.phase, -1):
            self.phase_peaks[self.phase] = self._peak
            self.phase_peak_event[self.phase] = self._peak_event

    # -- storages ----------------------------------------------------------------
    def _storage_key(self, tensor: torch.Tensor) -> int | None:
        try:
            storage = tensor.untyped_storage()
        except (NotImplementedError, RuntimeError):  # sparse, nested, ...
            return None
        key = self._key_of.get(id(storage))
        if key is not None:
            return key
        key = self._next_key
        self._next_key += 1
        size = self._size_fn(storage.nbytes())
        self._key_of[id(storage)] = key
        self.sizes[key] = size
        self.alloc_phase[key] = self.phase
        storage_id = id(storage)
        self._refs[key] = weakref.ref(storage, lambda _ref, k=key, s=storage_id: self._on_free(k, s))
        self.events.append((key, size))
        self.current += size
        self.trajectory.append(self.current)
        if self.current > self._peak:
            self._peak = self.current
            self._peak_event = len(self.events)
        return key

    def _on_free(self, key: int, storage_id: int) -> None:
        if self._refs.pop(key, None) is None:
            return
        if self._key_of.get(storage_id) == key:
            del self._key_of[storage_id]
        self.current -= self.sizes[key]
        self.events.append((key, -1))
        self.trajectory.append(self.current)

    def register(self, tensor: torch.Tensor, category: Category) -> None:
        """Counts a tensor that exists before the step (parameter, batch...)."""
        key = self._storage_key(tensor)
        if key is not None and key not in self.fixed_category:
            self.fixed_category[key] = category

    def mark(self, tensors: Iterable[torch.Tensor], category: Category) -> None:
        """Gives live tensors a fixed category (gradients, optimizer state)."""
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                key = self._key_of.get(id(tensor.untyped_storage()))
                if key is not None:
                    self.fixed_category.setdefault(key, category)

    def _workspace(self, nbytes: int, op_name: str) -> None:
        key = self._next_key
        self._next_key += 1
        self.sizes[key] = nbytes
        self.alloc_phase[key] = self.phase
        self.fixed_category[key] = _WORKSPACE
        self.events.append((key, nbytes))
        self.trajectory.append(self.current + nbytes)
        if self.current + nbytes > self._peak:
            self._peak = self.current + nbytes
            self._peak_event = len(self.events)
        self.events.append((key, -1))
        self.trajectory.append(self.current)
        self.workspace_ops[op_name] += 1

    def _persistent(self, nbytes: int, label: str) -> None:
        """Logs a library allocation that stays for the rest of the process (never freed)."""
        key = self._next_key
        self._next_key += 1
        self.sizes[key] = nbytes
        self.alloc_phase[key] = self.phase
        self.fixed_category[key] = Category.WORKSPACES
        self.events.append((key, nbytes))
        self.current += nbytes
        self.trajectory.append(self.current)
        if self.current > self._peak:
            self._peak = self.current
            self._peak_event = len(self.events)
        self.workspace_ops[label] += 1

    # -- dispatch ------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.op_count += 1
        if func in _METADATA_OPS:
            answer = _FAKE_METADATA_ANSWERS.get(func)
            if (
                answer is not None
                and isinstance(args[0], FakeTensor)
                and isinstance(_get_current_dispatch_mode(), FakeTensorMode)
            ):
                # the fake mode would answer from its handler table at once; skipping the dispatch to it halves
                # the cost of the autograd engine's device queries
                return answer(args)
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        if func is _LOCAL_SCALAR_DENSE:
            constant = getattr(args[0], "constant", None)
            if constant is not None:
                with no_dispatch():  # the real constant's value; the fake mode below would convert it first
                    return constant.item()
            self.placeholders += 1
            return True if args[0].dtype == torch.bool else 1
        out = _UNCACHEABLE
        if func is _ADD_ and type(args[1]) in (int, float) and not kwargs:
            constant = getattr(args[0], "constant", None)
            if constant is not None and constant.numel() == 1 and isinstance(args[0], FakeTensor):
                # what the fake mode's constant path does (the real op on the constant; the fake tensor stays),
                # without its argument normalisation
                with no_dispatch():
                    constant.add_(args[1])
                out = args[0]
        elif func is _LIFT_FRESH and not kwargs:
            out = _fake_scalar_constant(args[0])
        packet = func.overloadpacket
        if out is _UNCACHEABLE:
            decomposition = self._decompositions.get(packet)
            if decomposition is not None:
                with self:  # the ops inside allocate, and are tracked, one by one
                    return decomposition(*args, **kwargs)
            memo = self._memo
            if memo is not None:
                key = memo.key(func, args, kwargs)
                entry = memo.entries.get(key) if key is not None else _UNCACHEABLE
                if entry is None:
                    out = func(*args, **kwargs)
                    memo.record(key, func, args, kwargs, out)
                elif entry is _UNCACHEABLE:
                    out = func(*args, **kwargs)
                else:
                    out = memo.replay(entry, args, kwargs)
            else:
                out = func(*args, **kwargs)
        output_rule = self._output_rules.get(packet)
        if output_rule is not None:
            out = output_rule(func, args, kwargs, out)
            self.workspace_ops[str(packet)] += 1
        rule = self._rules.get(packet)
        if rule is not None:
            nbytes = rule(func, args, kwargs, out)
            if nbytes:
                self._workspace(int(nbytes), str(packet))
        libraries = self._libraries
        if isinstance(out, torch.Tensor):
            self._storage_key(out)
        elif isinstance(out, (tuple, list)):
            for item in tree_flatten(out)[0]:
                if isinstance(item, torch.Tensor):
                    self._storage_key(item)
        if libraries is not None:
            # cuDNN's workspace lives while the kernel writes its outputs
            nbytes = libraries.transient(packet, args, out)
            if nbytes:
                self._workspace(int(nbytes), f"cuDNN {packet}")
            for label, nbytes in libraries.persistent(packet, self.phase, self._library_seen):
                self._persistent(int(nbytes), label)
        return out

    # -- results --------------------------------------------------------------------
    def category_of(self, key: int) -> str:
        category = self.fixed_category.get(key)
        if category is _WORKSPACE:
            return str(Category.TEMPORARIES)
        if category is not None:
            return str(category)
        if key in self.activation_keys:
            return str(Category.ACTIVATIONS)
        return str(Category.TEMPORARIES)

    def result(self) -> TraceResult:
        """Closes the last phase and computes per-phase breakdowns."""
        if self.phase != "done":
            self.end()
        wanted: dict[int, list[str]] = {}
        for phase, index in self.phase_peak_event.items():
            wanted.setdefault(index, []).append(phase)
        breakdowns: dict[str, dict[str, int]] = {}
        live: dict[int, int] = {}
        category_cache: dict[int, str] = {}

        def snapshot() -> dict[str, int]:
            totals = {str(c): 0 for c in Category}
            for key, size in live.items():
                name = category_cache.get(key)
                if name is None:
                    name = category_cache[key] = self.category_of(key)
                totals[name] += size
            return totals

        for phase in wanted.get(0, ()):
            breakdowns[phase] = snapshot()
        for index, (key, size) in enumerate(self.events, start=1):
            if size >= 0:
                live[key] = size
            else:
                live.pop(key, None)
            if index in wanted:
                shot = snapshot()
                for phase in wanted[index]:
                    breakdowns[phase] = shot
        return TraceResult(
            phase_peaks={p: self.phase_peaks[p] for p in self.phase_order},
            phase_breakdowns={p: breakdowns[p] for p in self.phase_order},
            events=list(self.events),
            trajectory=list(self.trajectory),
            phase_ranges=dict(self.phase_ranges),
            placeholders=self.placeholders,
            workspace_ops=self.workspace_ops,
            op_count=self.op_count,
        )
