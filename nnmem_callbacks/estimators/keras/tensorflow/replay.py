"""The TensorFlow graph replay: reference-counted buffers over the ops of a ``FuncGraph``.

:class:`GraphReplayer` orders the graph's ops (:mod:`~nnmem_callbacks.estimators.keras.tensorflow.schedule`)
and runs each through its handler (:mod:`~nnmem_callbacks.estimators.keras.tensorflow.ops`); a
:class:`ReplayRun` holds the state of one replay: the live buffers by category,
the allocator model (:class:`~nnmem_callbacks.allocators.tensorflow_cpu.BFCSimulator`),
the ``TensorList`` sizes, the ops of the running wave, and the peaks.

Design: docs/keras-tensorflow-replay.md, "The replay".

Known limitations:
    See :mod:`nnmem_callbacks.estimators.keras.tensorflow.graph` (the replay's model of the
    executor) and :mod:`nnmem_callbacks.estimators.keras.tensorflow.ops` (the per-op rules).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Callable

from nnmem_callbacks.allocators.bfc import BFCSimulator
from nnmem_callbacks.allocators.tensorflow_cpu import Buffer, VariablePlacement, list_counted_bytes, tf_allocator_bytes
from nnmem_callbacks.core.estimate import Category
from nnmem_callbacks.estimators.keras.tensorflow.ops import METADATA_OPS, handler_for
from nnmem_callbacks.estimators.keras.tensorflow.probes import PROBED_OPS as SCRATCH_KERNELS
from nnmem_callbacks.estimators.keras.tensorflow.schedule import (
    EAGER_PHASES,
    inverse_transposes,
    op_phases,
    pruned,
    schedule_ops,
    sibling_waves,
    wave_holds,
)
from nnmem_callbacks.estimators.keras.tensorflow.trace import dtype_size, shape_size

__all__ = ["as_pieces", "consumer_counts", "GraphReplayer", "GraphReplayResult", "ReplayRun", "Schedule"]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The order of one graph's ops at one batch size and luck, with what the replay reads beside it (never changed)."""

    phases: dict[str, str]
    ops: list
    inputs_of: dict[str, list]
    shapes: dict[Any, Any]  # output shapes a replayed Grappler rewrite changed
    holds: list[bool]  # for each op: whether its successor runs in the same wave
    consumers: dict[Any, int]  # :func:`consumer_counts` of the ops in this order


def consumer_counts(ops: list, inputs_of: dict[str, list], graph_outputs: set) -> dict[Any, int]:
    """How many of ``ops`` read each tensor (a graph output once more: the caller holds it); shape reads do not count."""
    counts: dict[Any, int] = {}
    for op in ops:
        for t in op.outputs:
            counts[t.ref()] = 1 if t.ref() in graph_outputs else 0
    for op in ops:
        if op.type in METADATA_OPS:
            continue  # reads only the shape; runs as soon as its input exists (or is folded away)
        for t in inputs_of[op.name]:
            counts[t.ref()] = counts.get(t.ref(), 0) + 1
    return counts


@dataclasses.dataclass
class GraphReplayResult:
    """The outcome of replaying one graph at one batch size."""

    peak: int = 0
    peak_counted: int = 0
    #: The separate allocations that make up ``peak_counted`` (kept where no allocator is simulated: a
    #: function body's, charged by its caller's allocator model one allocation at a time).
    peak_pieces: list[int] = dataclasses.field(default_factory=list)
    peak_phase: str = ""
    peak_breakdown: dict[str, int] = dataclasses.field(default_factory=dict)
    phase_peaks: dict[str, int] = dataclasses.field(default_factory=dict)
    phase_breakdowns: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    unknown_shapes: Counter = dataclasses.field(default_factory=Counter)
    ops: int = 0
    approximations: Counter = dataclasses.field(default_factory=Counter)
    #: The allocator-counted peak of each replayed step, where several ran on one allocator model.
    step_peaks_counted: list[int] = dataclasses.field(default_factory=list)


def as_pieces(counted: int | list[int]) -> list[int]:
    """Counted bytes as a list of separate allocations (an ``int`` is one allocation).

    Example:
        >>> as_pieces(512), as_pieces([256, 1024])
        ([512], [256, 1024])
    """
    return [counted] if isinstance(counted, int) else list(counted)


#: The breakdown category of an op's outputs by phase (a backward output the optimizer reads is a gradient).
_PHASE_CATEGORY = {
    "forward": Category.ACTIVATIONS.value,
    "backward": Category.TEMPORARIES.value,
    "optimizer": Category.TEMPORARIES.value,
    "body": Category.TEMPORARIES.value,
}


def _category(op: Any, phase: str, phases: dict[str, str]) -> str:
    category = _PHASE_CATEGORY[phase]
    if phase == "backward" and any(phases.get(c.name) == "optimizer" for t in op.outputs for c in t.consumers()):
        return Category.GRADIENTS.value
    return category


class ReplayRun:
    """The state of replaying one graph: buffers, reference counts, the allocator, the peaks.

    Handlers (:mod:`~nnmem_callbacks.estimators.keras.tensorflow.ops`) change it through
    :meth:`allocate`, :meth:`alias`, :meth:`forward`, :meth:`variable_value`,
    :meth:`take_ownership` and :meth:`resize_list`; the replayer calls
    :meth:`record` and :meth:`op_done` after each op.
    """

    def __init__(
        self,
        replayer: "GraphReplayer",
        graph: Any,
        ops: list,
        inputs_of: dict[str, list],
        graph_outputs: set,
        *,
        inputs_category: str | None,
        input_list_bytes: dict[int, int] | None,
        track_phases: bool,
        consumers: dict[Any, int] | None = None,
    ) -> None:
        self.replayer = replayer
        self.inputs_of = inputs_of
        self.inputs_category = inputs_category
        self.input_list_bytes = input_list_bytes
        self.track_phases = track_phases
        self.result = GraphReplayResult(ops=len(ops))
        self.outputs = list(graph.outputs)
        # consumers still to run, per tensor (a graph output is held by the caller)
        self.remaining = dict(consumers if consumers is not None else consumer_counts(ops, inputs_of, graph_outputs))
        self.buffer_of: dict[Any, Buffer] = {}
        self.list_bytes: dict[Any, int] = {}
        self.placeholder_index = {t.ref(): i for i, t in enumerate(graph.inputs)}
        self.live = {str(c): 0 for c in Category}
        self.live_counted = 0
        self.bfc = replayer.bfc
        self.base_counted = self.bfc.in_use if self.bfc is not None else 0
        self.companions: dict[Any, Any] = {}  # tensor -> a hidden buffer that dies with it
        self.values: dict[Any, Buffer] = {}  # resource -> the buffer its reads alias (the variable's value)
        self.racing_reads: set[int] = set()  # ids of variable values read by a kernel of a sibling wave
        self.deferred: list = []  # ops of the running wave, whose inputs are released when it is done
        # scratch of the earlier ops of the running wave: bytes, and the counted bytes of each op's own allocation
        self.wave_scratch: tuple[int, list[int]] = (0, [])
        # unlucky runs: the scratch of the last wave of kernels, still running while the next ops run
        self.lingering: tuple[int, list[int]] = (0, [])
        # the kernel a wave handed to the pool, still running when the next kernel starts: the op (it still reads
        # its inputs), its scratch bytes and the counted bytes of its scratch
        self.outliving: tuple[Any, int, list[int]] | None = None
        # counted bytes of live buffers the allocator model does not place in chunks (TensorList elements)
        self.unchunked_counted = 0

    # -- buffers -----------------------------------------------------------------------------------
    def allocate(self, tensor: Any, nbytes: int, category: str, owned: bool = True) -> None:
        """Gives ``tensor`` a fresh buffer of ``nbytes`` (charged to the allocator when ``owned``)."""
        variant = tensor.dtype.name == "variant"
        counted = tf_allocator_bytes(nbytes) if owned and not variant else 0  # a list is charged below, once live
        element = self.replayer.list_elements.get(tensor.ref(), 0) if variant else 0
        buffer = Buffer(nbytes, counted, category, 1, owned, element=element)
        bfc = self.bfc
        if counted and bfc is not None:
            buffer.chunk = bfc.alloc(nbytes)
            buffer.counted = bfc.chunks[buffer.chunk][1]
            if self.replayer.trace is not None:
                self.replayer.trace.append(("+", tensor.name, nbytes, buffer.counted, bfc.in_use))
        self.buffer_of[tensor.ref()] = buffer
        if owned:
            self.live[category] += nbytes
            self.live_counted += buffer.counted
            if variant:
                self._charge_list(buffer)

    def alias(self, tensor: Any, source: Any) -> bool:
        """Makes ``tensor`` share the buffer of ``source``; ``False`` when ``source`` has none."""
        buffer = self.buffer_of.get(source.ref())
        if buffer is None:
            return False
        buffer.refs += 1
        self.buffer_of[tensor.ref()] = buffer
        return True

    def forward(self, source: Any, tensor: Any, category: str) -> None:
        """``tensor`` takes over the buffer of ``source`` (an element-wise kernel writing into its input)."""
        buffer = self.buffer_of[source.ref()]
        buffer.refs += 1
        self.buffer_of[tensor.ref()] = buffer
        if buffer.category != category:
            self.live[buffer.category] -= buffer.nbytes
            self.live[category] += buffer.nbytes
            buffer.category = category

    def variable_value(self, resource: Any, nbytes: int, category: str) -> Buffer:
        """The buffer that reads of the variable behind ``resource`` share (not owned by the step)."""
        value = self.values.get(resource)
        if value is None:
            value = self.values[resource] = Buffer(nbytes, 0, category, 0, owned=False)
        return value

    def take_ownership(self, value: Buffer, resource: Any = None) -> None:
        """A variable's old value becomes a buffer of the step (copy-on-write: the variable got a new one).

        Where the replayer knows the variable's chunk (:class:`~nnmem_callbacks.allocators.tensorflow_cpu.VariablePlacement`),
        the new value gets a new chunk, which the variable keeps after the step, and the old value keeps the old
        chunk until its last read is done; otherwise the old value is charged a chunk of its own.
        """
        value.owned = True
        value.counted = tf_allocator_bytes(value.nbytes)
        self.live[value.category] += value.nbytes
        if value.counted and self.bfc is not None:
            placement = self.replayer.placement
            old = placement.relocate(resource, value.nbytes) if placement is not None else None
            value.chunk = old if old is not None else self.bfc.alloc(value.nbytes)
            value.counted = self.bfc.chunks[value.chunk][1]
        self.live_counted += value.counted

    def copy_racing(self, value: Buffer, resource: Any) -> bool:
        """An update that ran while a sibling kernel still read the variable: the variable moves to a new chunk.

        The two gradients of a convolution run as one wave (:func:`~nnmem_callbacks.estimators.keras.tensorflow.schedule.sibling_waves`)
        but do not finish together: the optimizer's update of the kernel waits only for the filter gradient, and
        runs while the input gradient still reads the kernel, so the update copies it (copy-on-write) and the
        variable keeps the copy. Measured on MobileNetV3-Small with oneDNN off: Adam's update copied the 2.25 MiB
        kernel of its last 1x1 convolution in both steps of all ten profiled processes; the copy's place decides
        whether the second step's 20.9 MiB scratch is handed a 40.9 MiB chunk whole (``python -m
        benchmarks.tf_memory_events mobilenetv3small --regions --large 8``). The replay makes the copy every
        time, where the placement knows the variable, and frees the old value at once (the sibling finishes
        soon after). Returns whether it copied.
        """
        if id(value) not in self.racing_reads or self.bfc is None or self.replayer.placement is None:
            return False
        self.racing_reads.discard(id(value))
        old = self.replayer.placement.relocate(resource, value.nbytes)
        if old is None:
            return False
        self.bfc.free(old)  # the sibling finishes soon after: the old value goes
        return True

    def _charge_list(self, buffer: Buffer) -> None:
        """Brings an owned ``TensorList``'s counted bytes up to its current size.

        Element by element where the element size is known (:meth:`_fit_elements`);
        otherwise by its total, outside the allocator model
        (:func:`~nnmem_callbacks.allocators.tensorflow_cpu.list_counted_bytes`).
        """
        if buffer.element > 0:
            self._fit_elements(buffer)
        elif buffer.chunk is None:
            counted = list_counted_bytes(max(buffer.nbytes, 0))
            self.live_counted += counted - buffer.counted
            self.unchunked_counted += counted - buffer.counted
            buffer.counted = counted

    @staticmethod
    def _element_sizes(buffer: Buffer) -> list[int]:
        """The bytes of each element of a list of known element size (the last one may be partial)."""
        count, rest = divmod(max(buffer.nbytes, 0), buffer.element)
        return [buffer.element] * count + ([rest] if rest else [])

    def _fit_elements(self, buffer: Buffer) -> None:
        """Charges a ``TensorList`` of known element size as its elements: one allocation each.

        Under a simulated allocator each element takes its own chunk (a list's
        elements fill small free chunks, and grow the allocator's regions as
        the real ones do); otherwise each counts as one allocation of its size.
        """
        sizes = self._element_sizes(buffer)
        before = buffer.counted
        bfc = self.bfc
        if bfc is None:
            buffer.counted = sum(tf_allocator_bytes(size) for size in sizes)
        else:
            chunks = buffer.element_chunks
            kept = 0
            while kept < min(len(chunks), len(sizes)) and bfc.chunks[chunks[kept]][1] >= BFCSimulator.rounded(
                sizes[kept]
            ):
                kept += 1
            for cid in reversed(chunks[kept:]):
                bfc.free(cid)
            del chunks[kept:]
            chunks.extend(bfc.alloc(size) for size in sizes[kept:] if tf_allocator_bytes(size))
            buffer.counted = sum(bfc.chunks[cid][1] for cid in chunks)
        self.live_counted += buffer.counted - before

    def resize_list(self, source: Any, out: Any, delta: int, category: str) -> None:
        """``out`` is the ``TensorList`` ``source`` changed in place by ``delta`` bytes."""
        buffer = self.buffer_of[source.ref()]
        buffer.refs += 1
        self.buffer_of[out.ref()] = buffer
        if buffer.owned:
            buffer.nbytes += delta
            self.live[buffer.category] += delta
            self._charge_list(buffer)
        elif delta > 0:
            grown = Buffer(delta, 0, category, 1, True, element=self.replayer.list_elements.get(out.ref(), 0))
            self.live[category] += delta
            self._charge_list(grown)
            self.buffer_of[out.ref()] = grown
            buffer.refs -= 1

    def release(self, tensor: Any) -> None:
        """Drops ``tensor``'s reference; frees its buffer (and a hidden companion) when nothing else holds it."""
        companion = self.companions.pop(tensor.ref(), None)
        if companion is not None:
            self.release(companion)
        buffer = self.buffer_of.pop(tensor.ref(), None)
        if buffer is None:
            return
        buffer.refs -= 1
        if buffer.refs <= 0 and buffer.owned:
            self.live[buffer.category] -= buffer.nbytes
            self.live_counted -= buffer.counted
            bfc = self.bfc
            if buffer.element > 0:
                for cid in reversed(buffer.element_chunks):
                    bfc.free(cid)  # type: ignore[union-attr] - element chunks exist only with an allocator
                buffer.element_chunks.clear()
            elif buffer.chunk is None:
                self.unchunked_counted -= buffer.counted
            if buffer.chunk is not None and bfc is not None:
                bfc.free(buffer.chunk)
                buffer.chunk = None
                if self.replayer.trace is not None:
                    self.replayer.trace.append(("-", tensor.name, buffer.nbytes, buffer.counted, bfc.in_use))

    # -- peaks and waves ---------------------------------------------------------------------------
    def record(self, phase: str, extra: int = 0, extra_counted: int | list[int] = 0) -> None:
        """Updates the peaks with what is live now plus ``extra`` scratch bytes.

        ``extra_counted`` is what the allocator counts of that scratch: one
        allocation's bytes, or a list of separate allocations (the scratch of
        the several ops of one wave, each its own chunk: one chunk of their sum
        could be charged a whole free chunk the separate ones would split).
        """
        result, live, bfc = self.result, self.live, self.bfc
        total = sum(live.values()) + extra
        pieces = [p for p in as_pieces(extra_counted) if p > 0]
        if bfc is not None:
            scratch = [bfc.alloc(p) for p in pieces]
            counted = bfc.in_use - self.base_counted + self.unchunked_counted
            for chunk in reversed(scratch):
                bfc.free(chunk)
        else:
            counted = self.live_counted + sum(pieces)
        if counted > result.peak_counted:
            result.peak_counted = counted
            if bfc is None:
                result.peak_pieces = self._live_pieces() + pieces
        if self.track_phases and total > result.phase_peaks.get(phase, -1):
            result.phase_peaks[phase] = total
            snapshot = dict(live)
            snapshot[str(Category.TEMPORARIES)] += extra
            result.phase_breakdowns[phase] = snapshot
        if total > result.peak:
            result.peak = total
            result.peak_phase = phase
            snapshot = dict(live)
            snapshot[str(Category.TEMPORARIES)] += extra
            result.peak_breakdown = snapshot

    def _live_pieces(self) -> list[int]:
        """The counted allocations of the live owned buffers: one per buffer, one per element of a list."""
        pieces, seen = [], set()
        for buffer in self.buffer_of.values():
            if id(buffer) in seen or not buffer.owned or buffer.counted <= 0:
                continue
            seen.add(id(buffer))
            if buffer.element > 0:
                pieces += [tf_allocator_bytes(size) for size in self._element_sizes(buffer)]
            else:
                pieces.append(buffer.counted)
        return [p for p in pieces if p > 0]

    def op_done(self, op: Any, phase: str, transient: int, transient_counted: int, held: bool) -> None:
        """Records the peak while ``op`` runs and frees what it read last, unless its wave is still running (``held``).

        Ops of one wave run at the same time: their scratch is alive together until the wave is done.
        The wave's last kernel was handed to the inter-op pool and started
        after the others, so it is still running when the thread that ran the
        first starts the next kernel (:data:`SCRATCH_KERNELS`): if it takes
        scratch, its scratch and its inputs stay alive until that kernel has
        run. (Kernels without scratch are left out: keeping their inputs alive
        moved oneDNN-on estimates both ways, -11.5% to +0.5% for Conv1D, +2.3%
        to +18.6% for the U-Net, screened against the committed runs.) The profiler's op
        timeline of the U-Net with oneDNN off (2 inter-op threads,
        ``benchmarks/results/tf_kernel_timeline_unet_small_zen4_avx512_onednn0.txt``)
        shows it at each of its seven convolutions: the filter gradient ends
        0.3-8.3 ms after the input gradient, while the other thread runs the
        next kernels of the chain (beside the largest, 13 ms, five of them
        ran), and the step peaks there. Kernel durations are not modelled, so
        one that outlasts several kernels is kept for one only.
        In an unlucky replay a kernel that takes scratch may also still run
        when the ops after it do (a convolution's filter gradient, slow, beside
        the next layer's gradients): the scratch of the last wave of kernels
        (:data:`SCRATCH_KERNELS`) stays alive until the next such wave is done.
        The kernel handed to the pool is recorded there too: its scratch is
        already counted by that rule, and its inputs stay alive until the next
        kernel has run, as in the expected replay (a running kernel still reads
        them), which keeps the upper bound at or above the expected peak.
        """
        outliving = self.outliving if op.type in SCRATCH_KERNELS else None
        if self.replayer.unlucky:
            lingering = self.lingering
        elif outliving is not None:
            lingering = (outliving[1], outliving[2])
        else:
            lingering = (0, [])
        wave_bytes, wave_counted = self.wave_scratch
        transient_counted = as_pieces(transient_counted)
        self.record(phase, transient + wave_bytes + lingering[0], [*transient_counted, *wave_counted, *lingering[1]])
        if outliving is not None:
            # the kernel that outlived its wave is done now
            self._release_inputs(outliving[0])
            self.outliving = None
        self.deferred.append(op)
        if held:
            self.wave_scratch = (wave_bytes + transient, [*wave_counted, *transient_counted])
            return
        kernels = [done for done in self.deferred if done.type in SCRATCH_KERNELS]
        if kernels:
            self.lingering = (transient + wave_bytes, [*transient_counted, *wave_counted])
        if len(kernels) > 1 and op.type in SCRATCH_KERNELS and transient > 0:
            # the wave's last kernel was handed to the inter-op pool and started after the others: it is still
            # running, with its work buffer, when the thread that ran the first starts the next kernel
            self.outliving = (op, transient, transient_counted)
        self.wave_scratch = (0, [])
        if len(kernels) > 1:
            # siblings finish one after the other: an update waiting for one of them may run while another still
            # reads the variable (a convolution's input gradient reads its kernel while the filter gradient's
            # update runs), and then copies it
            for done in kernels:
                for t in self.inputs_of[done.name]:
                    buffer = self.buffer_of.get(t.ref())
                    if buffer is not None and not buffer.owned:
                        self.racing_reads.add(id(buffer))
        for done_op in self.deferred:
            # free what this op consumed last, and outputs nobody reads
            if self.outliving is None or done_op is not self.outliving[0]:
                self._release_inputs(done_op)
            for t in done_op.outputs:
                if self.remaining.get(t.ref(), 0) <= 0:
                    self.release(t)
        self.deferred.clear()

    def _release_inputs(self, done_op: Any) -> None:
        """Drops ``done_op``'s reads of its inputs; frees those it read last."""
        for t in self.inputs_of[done_op.name] if done_op.type not in METADATA_OPS else ():
            key = t.ref()
            if key in self.remaining:
                self.remaining[key] -= 1
                if self.remaining[key] <= 0:
                    self.release(t)

    def finish(self) -> tuple[GraphReplayResult, dict[Any, int]]:
        """The result, and the sizes of the graph's ``TensorList`` outputs."""
        if self.outliving is not None:  # no kernel ran after it: it is done by the end of the graph
            self._release_inputs(self.outliving[0])
            self.outliving = None
        self.result.unknown_shapes = Counter(self.replayer.unknown)
        self.result.approximations = Counter(self.replayer.approx)
        lists = {t.ref(): self.list_bytes.get(t.ref(), 0) for t in self.outputs if t.dtype.name == "variant"}
        return self.result, lists


class GraphReplayer:
    """Replays the ops of a TensorFlow ``FuncGraph`` with reference-counted buffers.

    Args:
        lookup: Finds a function graph by name (for calls, branches, loop bodies).
        batch_size: The batch size substituted for unknown dimensions.
        bfc: The allocator model charged for each counted buffer, if any.
        parallel_ops: How many ready optimizer ops, or kernels with scratch
            that become ready together, run at once (TensorFlow's inter-op
            threads, :func:`~nnmem_callbacks.estimators.keras.tensorflow.trace.inter_op_threads`).
        scratch: Kernel scratch measured on this host (allocator-counted bytes at
            this batch size) by op name; it replaces the op's rule
            (:mod:`nnmem_callbacks.estimators.keras.tensorflow.probes`).
        onednn: Whether TensorFlow runs its oneDNN kernels (companion rules
            such as oneDNN's max-pooling workspace apply only then).
        unlucky: Replay an unlucky run of the executor instead of the expected
            one: the ready ops of every phase run ``parallel_ops`` at a time
            (not only the optimizer's), a kernel's scratch stays alive until
            the next kernel with scratch is done (it may still be running), and
            a ``While`` loop has ``min(parallel_iterations, trips)`` iterations
            in flight. Its peak bounds what run-to-run scheduling adds.
        newest_first: Among ready ops, run the one that became ready last
            first (the order of Eigen's work-stealing queues), instead of the
            one created first.
        forwarding: Let element-wise kernels take over an input buffer that
            dies with them (``forward_input_or_allocate_output``). ``False``
            replays runs where they cannot: the kernel needs the only
            reference to the buffer, and an op still reading it on another
            thread holds one more.
        placement: Where the variables lie in ``bfc`` (by the graph's resource
            placeholders): a copy-on-write update moves a variable there, and
            the next step replayed with the same placement finds it moved.
        schedules: The orders already made (:class:`Schedule` by graph, batch
            size, parallel ops, luck, queue order and phase tracking), shared by
            the replayers of one estimate: the steps of a replay and the
            replayers of its function bodies run the same graphs in the same order.
    """

    def __init__(
        self,
        lookup: Callable[[str], Any],
        batch_size: int,
        bfc: BFCSimulator | None = None,
        parallel_ops: int = 1,
        scratch: dict[str, int] | None = None,
        onednn: bool = True,
        unlucky: bool = False,
        newest_first: bool = False,
        forwarding: bool = True,
        placement: VariablePlacement | None = None,
        schedules: dict | None = None,
    ) -> None:
        self.lookup = lookup
        self.placement = placement
        self.schedules: dict = schedules if schedules is not None else {}
        self.n = batch_size
        self.bfc = bfc
        self.parallel_ops = max(1, int(parallel_ops))
        self.scratch = dict(scratch or {})
        self.onednn = bool(onednn)
        self.unlucky = bool(unlucky)
        self.newest_first = bool(newest_first)
        self.forwarding = bool(forwarding)
        self.trace: list | None = None  # (+/-, tensor, bytes, charged bytes, in use) when debugging
        self.trips: dict[str, int] = {}
        self.unknown = Counter()
        self.approx = Counter()
        self.shapes: dict[Any, Any] = {}  # output shapes changed by a replayed Grappler rewrite
        self.list_elements: dict[Any, int] = {}  # TensorList -> its element bytes, where the list ops tell
        self.order: list[str] = []  # the op names of the last replay, in the order they ran

    def shape_of(self, tensor: Any) -> Any:
        """The static shape of ``tensor``, as a replayed Grappler rewrite left it."""
        return self.shapes.get(tensor.ref(), tensor.shape)

    def elements(self, tensor: Any) -> int:
        """Number of elements of ``tensor`` at the replayed batch size (0 when unknown)."""
        size = shape_size(self.shape_of(tensor), 1)
        return size.at(self.n) if size is not None else 0

    # -- sizes ---------------------------------------------------------------
    def size_of(self, tensor: Any, list_bytes: dict[Any, int] | None = None) -> int:
        if list_bytes is not None and tensor.dtype.name == "variant":
            return int(list_bytes.get(tensor.ref(), 0))
        size = shape_size(self.shape_of(tensor), dtype_size(tensor.dtype))
        if size is None:
            if dtype_size(tensor.dtype):
                self.unknown[tensor.op.type] += 1
            return 0
        return size.at(self.n)

    def child(self) -> "GraphReplayer":
        """A replayer for a function body, branch or loop body called from this graph (same batch, kernels, luck, order)."""
        return GraphReplayer(
            self.lookup,
            self.n,
            onednn=self.onednn,
            unlucky=self.unlucky,
            newest_first=self.newest_first,
            forwarding=self.forwarding,
            schedules=self.schedules,
        )

    # -- the replay ----------------------------------------------------------
    def _schedule(self, graph: Any, graph_outputs: set, track_phases: bool) -> "Schedule":
        every_op = graph.get_operations()
        bypass = inverse_transposes(every_op, graph_outputs)
        created = pruned(every_op, graph_outputs, tuple(getattr(graph, "control_outputs", ())), bypass)
        phases = op_phases(created) if track_phases else {op.name: "body" for op in created}
        ops, inputs_of, shapes, waves = schedule_ops(
            created,
            phases,
            graph_outputs,
            self.elements,
            self.parallel_ops,
            eager_phases=tuple(set(phases.values())) if self.unlucky else EAGER_PHASES,
            bypass=bypass,
            newest_first=self.newest_first,
        )
        if not self.unlucky:  # the unlucky replay already runs every phase in waves
            ops, waves = sibling_waves(ops, inputs_of, waves, self.parallel_ops, SCRATCH_KERNELS)
        holds, consumers = wave_holds(ops, waves), consumer_counts(ops, inputs_of, graph_outputs)
        return Schedule(phases, ops, inputs_of, shapes, holds, consumers)

    def replay(
        self,
        graph: Any,
        *,
        inputs_category: str | None = Category.INPUTS.value,
        input_list_bytes: dict[int, int] | None = None,
        track_phases: bool = True,
    ) -> tuple[GraphReplayResult, dict[Any, int]]:
        """Replays ``graph``; returns the result and the sizes of its variant outputs.

        Args:
            graph: A ``FuncGraph``.
            inputs_category: The category of non-resource placeholders (the
                batch) when they are allocated here; ``None`` when they belong
                to a caller (function bodies).
            input_list_bytes: Sizes of incoming ``TensorList`` arguments, by
                input position.
            track_phases: Split the peak by forward/backward/optimizer phase.
        """
        graph_outputs = {t.ref() for t in graph.outputs}
        # the order depends on the graph, the batch, the luck and the queue order alone (and on the shapes a
        # rewrite changed, of which a replayer that has not replayed yet has none): the same in every step of a
        # replay and every call of a body, so it is made once per estimate
        key = (graph, self.n, self.parallel_ops, self.unlucky, self.newest_first, track_phases)
        fresh = not self.shapes
        made = self.schedules.get(key) if fresh else None
        if made is None:
            made = self._schedule(graph, graph_outputs, track_phases)
            if fresh:
                self.schedules[key] = made
        phases, ops, inputs_of, holds = made.phases, made.ops, made.inputs_of, made.holds
        self.shapes = made.shapes
        self.order = [op.name for op in ops]
        run = ReplayRun(
            self,
            graph,
            ops,
            inputs_of,
            graph_outputs,
            inputs_category=inputs_category,
            input_list_bytes=input_list_bytes,
            track_phases=track_phases,
            consumers=made.consumers,
        )
        for index, op in enumerate(ops):
            phase = phases[op.name]
            entry = handler_for(op.type)
            category = _category(op, phase, phases)
            if not entry.in_schedule:
                entry.function(run, op, category)
                run.record(phase)
                continue
            transient, transient_counted = entry.function(run, op, category)
            run.op_done(op, phase, transient, transient_counted, holds[index])
        return run.finish()
