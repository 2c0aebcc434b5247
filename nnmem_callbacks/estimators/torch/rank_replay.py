"""One rank's view of a traced single-device step: unit marks in the trace, and the log replayed for a rank.

:class:`TraceMarks` hooks the FSDP units while the ordinary single-device step is traced, marking in the
trace's allocation log where each unit's forward and backward begin and end, and which gradient belongs to
which unit. :func:`replay_rank` then walks that log again as one rank of a
:class:`~nnmem_callbacks.core.strategy.Strategy` sees it:

* **DDP** (``torch/nn/parallel/distributed.py``, ``reducer.cpp``): the reducer
  allocates its buckets when DDP is built, one flat copy of every trainable
  gradient (``bucket_cap_mb`` splits it, the total stays), alive for the whole
  run; the rebuild after the first iteration frees the old buckets before it
  allocates the new ones. With ``gradient_as_bucket_view`` the gradients are
  views of the buckets: autograd's gradient is copied in and freed at once.
* **FSDP2** (``torch/distributed/fsdp/_fully_shard/``): each unit's parameters
  are stored as padded dim-0 shards (``ceil(dim0 / world_size)`` rows).
  ``unshard`` allocates the all-gather output (``world_size`` padded shards),
  copies out into per-parameter unsharded tensors of the same total, and in
  forward keeps the all-gather output until the next unit's copy-out (the root
  frees the last one after its forward). ``reshard_after_forward`` frees the
  unsharded parameters after each unit's forward (never for the root). In
  backward, each unit's pre-backward prefetches the all-gather of the next
  unit in reverse forward order; post-backward frees the unsharded parameters,
  allocates the reduce-scatter input (the padded unsharded gradient size),
  frees the unit's autograd gradients, allocates the sharded gradient (the
  reduce-scatter output, a padded shard) and keeps the reduce-scatter input
  until the next unit's post-backward (the root's final callback frees the
  last). Units whose inputs need no gradient run post-backward in the root's
  final callback (root first). Optimizer state is held for the local,
  unpadded shard; the optimizer's temporaries shrink with it (only for an
  optimizer whose state has each parameter's shape: others are kept whole).
* **gloo** (CPU): its all-gather and reduce-scatter copy their buffers once
  more (one transient of the full buffer per collective). NCCL works in place.

The entry point is :func:`nnmem_callbacks.estimators.torch.distributed.estimate_per_rank`; its docstring lists
the known limitations of the replay.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten

from nnmem_callbacks.core.estimate import Category
from nnmem_callbacks.core.strategy import Strategy, shard_numel
from nnmem_callbacks.estimators.torch.tracer import StorageTracker

#: FSDP mixed precision: the ``param_dtype`` names a strategy may carry.
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

__all__ = ["RankReplay", "TraceMarks", "UnitSizes", "replay_rank", "unit_parameters", "unit_sizes"]


def unit_parameters(model: nn.Module, units: Sequence[nn.Module]) -> list[list[tuple[str, nn.Parameter]]]:
    """Parameters managed by each unit (the root, ``model``, last), as FSDP2 assigns them:
    a unit holds its subtree's parameters that no nested unit holds; shared ones go to the first."""
    owner: dict[int, int] = {}
    order = list(units) + [model]
    unit_ids = {id(u) for u in units}
    result: list[list[tuple[str, nn.Parameter]]] = [[] for _ in order]
    for index, unit in enumerate(order):
        stack = [unit]
        while stack:
            module = stack.pop()
            for name, parameter in module.named_parameters(recurse=False):
                if id(parameter) not in owner:
                    owner[id(parameter)] = index
                    result[index].append((name, parameter))
            stack.extend(child for child in module.children() if id(child) not in unit_ids or child is unit)
    return result


# ---------------------------------------------------------------------------
# marking the trace
# ---------------------------------------------------------------------------


def _active_tracker() -> StorageTracker | None:
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, StorageTracker):
            return mode
    return None


class TraceMarks:
    """Marks in the first traced step's log: unit boundaries and gradient owners.

    Attributes:
        tracker: The main trace's tracker (its ``events``, ``sizes``,
            ``fixed_category`` and ``phase_ranges`` are read after the trace).
        marks: ``(event_index, kind, unit)``: kind is ``fwd_pre``, ``fwd_post``,
            ``bwd_pre`` or ``bwd_post``; ``event_index`` counts the events before it.
        grad_unit: Storage key of a gradient -> the unit it belongs to.
    """

    def __init__(self, model: nn.Module, units: Sequence[nn.Module]) -> None:
        self.model = model
        self.units = list(units) + [model]
        self.root = len(self.units) - 1
        self.tracker: StorageTracker | None = None
        self.marks: list[tuple[int, str, int]] = []
        self.grad_unit: dict[int, int] = {}
        self._handles: list[Any] = []
        self._hooked: set[int] = set()
        self._pre_done: set[int] = set()

    def _current(self) -> StorageTracker | None:
        tracker = _active_tracker()
        if tracker is None:
            return None
        if self.tracker is None:
            self.tracker = tracker
        return tracker if tracker is self.tracker else None

    def _mark(self, kind: str, unit: int) -> None:
        tracker = self._current()
        if tracker is not None:
            self.marks.append((len(tracker.events), kind, unit))

    def __enter__(self) -> "TraceMarks":
        for index, unit in enumerate(self.units):
            self._handles.append(unit.register_forward_pre_hook(self._make_pre(index), with_kwargs=True))
            self._handles.append(unit.register_forward_hook(self._make_post(index), with_kwargs=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _make_pre(self, index: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            tracker = self._current()
            if tracker is None:
                return
            if index == self.root:
                self._pre_done.clear()
                self._hook_gradients()
            self.marks.append((len(tracker.events), "fwd_pre", index))
            inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            if inputs:
                fired: list[bool] = []

                def on_input_grad(grad: torch.Tensor) -> None:
                    if not fired:
                        fired.append(True)
                        self._mark("bwd_post", index)

                for tensor in inputs:
                    tensor.register_hook(on_input_grad)

        return hook

    def _hook_gradients(self) -> None:
        """Learns which unit each gradient storage belongs to (the model holds the trace's fake parameters now)."""
        for unit_index, params in enumerate(unit_parameters(self.model, self.units[:-1])):
            for _, parameter in params:
                if id(parameter) in self._hooked or not parameter.requires_grad:
                    continue
                self._hooked.add(id(parameter))
                self._handles.append(parameter.register_post_accumulate_grad_hook(self._make_grad_hook(unit_index)))

    def _make_grad_hook(self, unit: int) -> Callable:
        def hook(parameter: torch.Tensor) -> None:
            tracker = self._current()
            if tracker is None or parameter.grad is None:
                return
            key = tracker._key_of.get(id(parameter.grad.untyped_storage()))
            if key is not None:
                self.grad_unit[key] = unit

        return hook

    def _make_post(self, index: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            tracker = self._current()
            if tracker is None:
                return
            self.marks.append((len(tracker.events), "fwd_post", index))
            outputs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.requires_grad]

            def on_output_grad(grad: torch.Tensor) -> None:
                if index not in self._pre_done:
                    self._pre_done.add(index)
                    self._mark("bwd_pre", index)

            for tensor in outputs:
                tensor.register_hook(on_output_grad)

        return hook


# ---------------------------------------------------------------------------
# replaying the log for one rank
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class UnitSizes:
    """Bytes of one FSDP unit on one rank."""

    shard: int  # padded sharded parameters (stored)
    gathered: int  # all-gather output = unsharded parameters (padded)
    gathered_grad: int  # reduce-scatter input (padded unsharded gradients)
    grad_shard: int  # reduce-scatter output (padded sharded gradients)
    local_numel: int  # unpadded local elements (optimizer state)
    numel: int
    mp_copy_in: int  # mixed precision: the cast copy of the shard before all-gather


def unit_sizes(
    params: Iterable[torch.Tensor],
    world_size: int,
    rank: int,
    param_dtype: torch.dtype | None,
    stored_itemsize: Callable[[torch.Tensor], int],
) -> UnitSizes:
    shard = gathered = gathered_grad = grad_shard = local = numel = copy_in = 0
    for parameter in params:
        shape = tuple(parameter.shape)
        padded = shard_numel(shape, world_size, padded=True)
        itemsize = stored_itemsize(parameter)
        gather_itemsize = torch.empty((), dtype=param_dtype).element_size() if param_dtype is not None else itemsize
        shard += padded * itemsize
        gathered += padded * world_size * gather_itemsize
        if parameter.requires_grad:
            gathered_grad += padded * world_size * gather_itemsize
            grad_shard += padded * itemsize
            local += shard_numel(shape, world_size, rank)
            numel += parameter.numel()
        if param_dtype is not None and gather_itemsize != itemsize:
            copy_in += padded * gather_itemsize
    return UnitSizes(shard, gathered, gathered_grad, grad_shard, local, numel, copy_in)


@dataclasses.dataclass
class RankReplay:
    """What :func:`replay_rank` found for one rank."""

    rank: int
    phase_peaks: dict[str, int]
    peak_phase: str
    peak_bytes: int
    breakdown: dict[str, int]


def replay_rank(
    marks: TraceMarks,
    strategy: Strategy,
    rank: int,
    unit_params: list[list[tuple[str, torch.Tensor]]],
    stored_itemsize: Callable[[torch.Tensor], int],
    *,
    elementwise_optimizer: bool = True,
) -> RankReplay:
    """Walks the main trace's log as rank ``rank`` of ``strategy`` sees it.

    ``elementwise_optimizer=False``: the optimizer's state or update is not of each parameter's shape, so under FSDP
    its state and its step's temporaries are kept as traced (whole) instead of shrinking with the local shard.

    Returns each phase's peak and the bytes per category at the overall peak.
    """
    tracker = marks.tracker
    assert tracker is not None
    events = tracker.events
    categories = {key: tracker.category_of(key) for key in tracker.sizes}
    sizes = tracker.sizes
    P, G, S = str(Category.PARAMETERS), str(Category.GRADIENTS), str(Category.OPTIMIZER_STATE)
    ws = strategy.world_size
    fsdp = strategy.kind == "fsdp"
    gloo = (strategy.backend or "gloo") == "gloo"
    param_dtype = _DTYPES.get(strategy.param_dtype) if strategy.param_dtype else None
    units = [unit_sizes([p for _, p in params], ws, rank, param_dtype, stored_itemsize) for params in unit_params]
    root = len(units) - 1
    total_numel = sum(u.numel for u in units) or 1
    opt_ratio = sum(u.local_numel for u in units) / total_numel if fsdp and elementwise_optimizer else 1.0

    # phase of each event index
    phase_at: list[str] = ["setup"] * (len(events) + 1)
    for phase, (start, end) in tracker.phase_ranges.items():
        for index in range(start, min(end, len(events)) + 1):
            phase_at[index] = phase
    backward_ends = sorted(end for phase, (start, end) in tracker.phase_ranges.items() if "/backward" in phase)
    optimizer_starts = {start for phase, (start, end) in tracker.phase_ranges.items() if phase.endswith("/optimizer")}

    state = {"param_full": 0, "grad_trace": 0, "opt_trace": 0, "other": 0}
    comm = {"gathered": 0, "deferred": 0, "prefetched": 0, "rs_held": 0}
    gathered: set[int] = set()
    deferred_unit: list[int] = []
    prefetched: dict[int, int] = {}
    rs_held: list[int] = []
    unsharded_grads: dict[int, int] = {}  # grad key -> unit, alive full size
    converted: dict[int, set[int]] = {}  # unit -> grad keys whose sharded grad is alive
    sharded_grad_bytes = 0
    reduced: set[int] = set()
    forward_order: list[int] = []
    opt_base = [0]
    in_optimizer = [False]
    live: dict[int, int] = {}
    phase_peaks: dict[str, int] = {}
    best: list[Any] = [-1, "", {}, 0]

    p_rank = sum(u.shard for u in units) if fsdp else None
    ddp = strategy.kind == "ddp"
    buckets = 0
    if ddp:
        # reducer.cpp initialize_buckets: one flat tensor per bucket, all trainable gradients in all
        # (with gradient_as_bucket_view too: the gradients then become views of them)
        buckets = sum(p.numel() * stored_itemsize(p) for params in unit_params for _, p in params if p.requires_grad)

    def breakdown_now(extra: int) -> dict[str, int]:
        other = state["other"]
        if in_optimizer[0] and fsdp:
            other = opt_base[0] + int((other - opt_base[0]) * opt_ratio)
        params = state["param_full"] if not fsdp else (0 if strategy.offload_params else p_rank)
        grads = state["grad_trace"]
        if fsdp:
            grads = sum(sizes[k] for k in unsharded_grads) + (0 if strategy.offload_optimizer else sharded_grad_bytes)
        elif ddp and strategy.gradient_as_bucket_view:
            grads = 0
        opt = state["opt_trace"]
        if fsdp:
            opt = 0 if strategy.offload_optimizer else int(opt * opt_ratio)
        temporaries = comm["gathered"] + comm["deferred"] + comm["prefetched"] + comm["rs_held"] + buckets + extra
        # "other" holds buffers, inputs, activations and temporaries of the trace, kept as the trace split them
        return {"_other": other, P: params, G: grads, S: opt, "_comm": temporaries}

    def observe(index: int, extra: int = 0) -> None:
        parts = breakdown_now(extra)
        total = sum(parts.values())
        phase = phase_at[min(index, len(phase_at) - 1)]
        if phase not in ("setup", "done") and total > phase_peaks.get(phase, -1):
            phase_peaks[phase] = total
        if total > best[0]:
            best[0], best[1], best[2], best[3] = total, phase, parts, index

    def free_unsharded(unit: int) -> None:
        if unit in gathered:
            gathered.discard(unit)
            comm["gathered"] -= units[unit].gathered

    def all_gather(unit: int, index: int) -> None:
        """The all-gather output, with the cast copy-in and gloo's copy of it, before the copy-out."""
        size = units[unit].gathered
        observe(index, size + units[unit].mp_copy_in + (size if gloo else 0))

    def unshard(unit: int, index: int, forward: bool) -> None:
        if unit in gathered or units[unit].gathered == 0:
            return
        size = units[unit].gathered
        if unit in prefetched:
            comm["prefetched"] -= prefetched.pop(unit)
            output = size
        else:
            all_gather(unit, index)
            output = size
        # the all-gather output is alive while copying out
        if forward and deferred_unit:
            comm["deferred"] -= units[deferred_unit.pop()].gathered
        observe(index, output + size)
        gathered.add(unit)
        comm["gathered"] += size
        if forward:
            deferred_unit.append(unit)
            comm["deferred"] += output

    def post_backward(unit: int, index: int) -> None:
        nonlocal sharded_grad_bytes
        if unit in reduced:
            return
        reduced.add(unit)
        free_unsharded(unit)
        if rs_held:
            comm["rs_held"] -= rs_held.pop()
        keys = [k for k, u in unsharded_grads.items() if u == unit]
        if not keys:
            return
        sizes_u = units[unit]
        comm["rs_held"] += sizes_u.gathered_grad
        observe(index)
        for key in keys:
            del unsharded_grads[key]
        existing = unit in converted and converted[unit]
        observe(index, sizes_u.grad_shard + (sizes_u.gathered_grad if gloo else 0))
        if not existing:
            sharded_grad_bytes += sizes_u.grad_shard
        converted.setdefault(unit, set()).update(keys)
        rs_held.append(sizes_u.gathered_grad)

    def end_backward(index: int) -> None:
        pending = [root] + [u for u in forward_order if u != root]
        for unit in pending:
            post_backward(unit, index)
        comm["rs_held"] -= sum(rs_held)
        rs_held.clear()

    marks_at: dict[int, list[tuple[str, int]]] = {}
    for index, kind, unit in marks.marks:
        marks_at.setdefault(index, []).append((kind, unit))
    for entries in marks_at.values():
        # a unit's input is the previous unit's output: at the same moment FSDP runs the post-backward of
        # the later unit (RegisterPostBackwardFunction, inside it) before the pre-backward of the earlier
        # one (a hook on its output, outside): hooks on one tensor fire in the order they were registered
        entries.sort(key=lambda entry: entry[0] != "bwd_post")
    backward_end_set = set(backward_ends)

    def handle_marks(index: int) -> None:
        if index in optimizer_starts:
            in_optimizer[0] = True
            opt_base[0] = state["other"]
        if not fsdp:
            return
        for kind, unit in marks_at.get(index, ()):
            if kind == "fwd_pre":
                if unit == root:
                    forward_order.clear()
                    reduced.clear()
                    in_optimizer[0] = False
                if unit not in forward_order:
                    forward_order.append(unit)
                unshard(unit, index, forward=True)
            elif kind == "fwd_post":
                if unit != root and strategy.reshard_after_forward:
                    free_unsharded(unit)
                if unit == root and deferred_unit:
                    comm["deferred"] -= units[deferred_unit.pop()].gathered
            elif kind == "bwd_pre":
                unshard(unit, index, forward=False)
                order = [root] + list(reversed([u for u in forward_order if u != root]))
                if unit in order:
                    position = order.index(unit)
                    if position + 1 < len(order):
                        target = order[position + 1]
                        if target not in gathered and target not in prefetched and units[target].gathered:
                            size = units[target].gathered
                            observe(index, size + units[target].mp_copy_in + (size if gloo else 0))
                            prefetched[target] = size
                            comm["prefetched"] += size
            elif kind == "bwd_post":
                post_backward(unit, index)
        if index in backward_end_set:
            end_backward(index)

    # storages alive before the step (parameters, buffers, the batch) were registered as events too
    for index, (key, size) in enumerate(events):
        handle_marks(index)
        if size >= 0:
            live[key] = size
            category = categories.get(key)
            if category == P:
                state["param_full"] += size
            elif category == G:
                state["grad_trace"] += size
                if fsdp:
                    unsharded_grads[key] = marks.grad_unit.get(key, root)
            elif category == S:
                state["opt_trace"] += size
            else:
                state["other"] += size
            if ddp and strategy.gradient_as_bucket_view and category == G:
                observe(index + 1, size)  # autograd's gradient, copied into the bucket and freed
                continue
        else:
            size = live.pop(key, 0)
            category = categories.get(key)
            if category == P:
                state["param_full"] -= size
            elif category == G:
                state["grad_trace"] -= size
                if fsdp:
                    if key in unsharded_grads:
                        del unsharded_grads[key]
                    else:
                        for unit, keys in converted.items():
                            if key in keys:
                                keys.discard(key)
                                if not keys:
                                    sharded_grad_bytes -= units[unit].grad_shard
                                break
            elif category == S:
                state["opt_trace"] -= size
            else:
                state["other"] -= size
        observe(index + 1)
    handle_marks(len(events))
    peak_total, peak_phase, parts, peak_index = best
    return RankReplay(
        rank, phase_peaks, peak_phase, int(peak_total), _breakdown(parts, events[:peak_index], categories)
    )


def _breakdown(parts: dict[str, int], events: list[tuple[int, int]], categories: dict[int, str]) -> dict[str, int]:
    """Bytes per category at the peak: the replayed states, the trace's own split of the rest
    (scaled to the replayed total), and the communication buffers as temporaries."""
    live: dict[int, int] = {}
    for key, size in events:
        if size >= 0:
            live[key] = size
        else:
            live.pop(key, None)
    states = (str(Category.PARAMETERS), str(Category.GRADIENTS), str(Category.OPTIMIZER_STATE))
    split = {str(c): 0 for c in Category}
    for key, size in live.items():
        category = categories.get(key, str(Category.TEMPORARIES))
        if category not in states:
            split[category] += size
    other = sum(split.values())
    result = {name: parts[name] for name in states}
    assigned = 0
    names = [n for n in split if n not in states]
    for name in names:
        share = int(parts["_other"] * split[name] / other) if other else 0
        result[name] = share
        assigned += share
    result[str(Category.TEMPORARIES)] += parts["_other"] - assigned + parts["_comm"]
    return result
