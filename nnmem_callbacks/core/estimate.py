"""The framework-free result of every estimator: :class:`MemoryEstimate`.

An estimator (PyTorch, Keras, napkin formulas) collects facts about one training
step; this module turns them into a single immutable object that answers the
questions users ask: what is the peak, what is it made of, how does it grow with
the batch, and what is the largest batch that fits a budget.

Nothing here imports torch, keras or lightning.

Example:
    >>> est = MemoryEstimate(
    ...     peak_bytes=1_300,
    ...     breakdown={"parameters": 400, "gradients": 400, "activations": 500},
    ...     batch_size=10,
    ...     phases=(PhaseLine("step1/backward", fixed_bytes=800, per_sample_bytes=50),
    ...             PhaseLine("step2/optimizer", fixed_bytes=1_200, per_sample_bytes=0)),
    ...     peak_phase="step1/backward",
    ... )
    >>> est.peak_bytes_at(20)
    1800
    >>> est.max_batch_size(1_500)
    14
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from typing import Any, Callable, Mapping

from nnmem_callbacks.core.allocation_log import AllocationLog
from nnmem_callbacks.core.batch_search import MAX_BATCH_SEARCH_LIMIT, gallop_largest, search_largest
from nnmem_callbacks.core.sequence import SequenceCurve
from nnmem_callbacks.core.units import BARE_NUMBER, format_bytes, parse_bytes
from nnmem_callbacks.core.verification import Verification, verify_batch_size

__all__ = ["budget_in_bytes", "Category", "MemoryEstimate", "PhaseLine", "STATIC_CATEGORIES", "upper_envelope"]


class Category(str, enum.Enum):
    """What a byte of training memory is used for.

    Members compare and hash equal to their string value, so
    ``breakdown["activations"]`` and ``breakdown[Category.ACTIVATIONS]`` are the
    same lookup.
    """

    PARAMETERS = "parameters"
    BUFFERS = "buffers"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    INPUTS = "inputs"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    #: Library workspaces the allocator holds for the rest of the process once
    #: created (cuBLAS/cuBLASLt: one per thread and stream, at the first GEMM).
    WORKSPACES = "workspaces"

    def __hash__(self) -> int:  # pragma: no cover - trivial
        return str.__hash__(self.value)

    def __str__(self) -> str:
        return self.value


#: Categories that do not depend on the batch size in an ordinary training step.
STATIC_CATEGORIES = (
    Category.PARAMETERS,
    Category.BUFFERS,
    Category.GRADIENTS,
    Category.OPTIMIZER_STATE,
    Category.WORKSPACES,
)


@dataclasses.dataclass(frozen=True)
class PhaseLine:
    """The peak of one phase of the training step as a line in the batch size.

    ``peak(n) = fixed_bytes + per_sample_bytes * n``. A phase is for example
    ``"step1/forward"`` or ``"step2/optimizer"``. The estimate's overall peak at
    batch ``n`` is the largest line valid at ``n``, so the model stays right when
    the peak moves from the optimizer step (small batches) to backward (large
    batches). A line may hold only for a range of batch sizes
    (``min_batch``..``max_batch``), which makes growth piecewise linear where a
    kernel changes its behaviour with the batch.
    """

    phase: str
    fixed_bytes: int
    per_sample_bytes: int
    min_batch: int = 1
    max_batch: int | None = None

    def at(self, batch_size: int) -> int:
        """Returns this phase's peak in bytes at ``batch_size``."""
        return self.fixed_bytes + self.per_sample_bytes * batch_size

    def covers(self, batch_size: int) -> bool:
        """Whether the line holds at ``batch_size``."""
        return batch_size >= self.min_batch and (self.max_batch is None or batch_size <= self.max_batch)


def upper_envelope(lines: "list[PhaseLine] | tuple[PhaseLine, ...]", start: int = 1) -> list[PhaseLine]:
    """The lines that are the maximum somewhere on ``[start, inf)``.

    The peak of a training step at batch ``n`` is the largest of many lines
    (one per moment of the step); only the few lines on their upper envelope
    matter. Returned in order of increasing slope.

    Lines with different batch ranges are kept apart: the envelope is taken
    within each range.

    Example:
        >>> lines = [PhaseLine("a", 100, 1), PhaseLine("b", 50, 2), PhaseLine("c", 10, 2), PhaseLine("d", 0, 1)]
        >>> [line.phase for line in upper_envelope(lines)]
        ['a', 'b']
    """
    ranges: dict[tuple[int, int | None], list[PhaseLine]] = {}
    for line in lines:
        ranges.setdefault((line.min_batch, line.max_batch), []).append(line)
    if len(ranges) > 1:
        return [
            kept
            for (low, _), group in sorted(ranges.items(), key=lambda item: item[0][0])
            for kept in upper_envelope(group, max(start, low))
        ]
    best: dict[int, PhaseLine] = {}
    for line in lines:
        kept = best.get(line.per_sample_bytes)
        if kept is None or line.fixed_bytes > kept.fixed_bytes:
            best[line.per_sample_bytes] = line
    ordered = sorted(best.values(), key=lambda line: line.per_sample_bytes)
    hull: list[PhaseLine] = []

    def crossing(left: PhaseLine, right: PhaseLine) -> float:
        # n where right (steeper) overtakes left
        return (left.fixed_bytes - right.fixed_bytes) / (right.per_sample_bytes - left.per_sample_bytes)

    for line in ordered:
        while hull and line.at(start) >= hull[-1].at(start) and line.per_sample_bytes >= hull[-1].per_sample_bytes:
            hull.pop()
        while len(hull) >= 2 and crossing(hull[-2], line) <= crossing(hull[-2], hull[-1]):
            hull.pop()
        hull.append(line)
    return hull


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak memory of training, with its breakdown and batch scaling.

    Attributes:
        peak_bytes: Predicted peak bytes of live tensors on the training device
            during the first two optimizer steps (on CUDA: what
            ``torch.cuda.max_memory_allocated()`` reports).
        breakdown: Bytes per :class:`Category` live at the moment of the peak.
            The values sum to ``peak_bytes``.
        batch_size: The batch size the estimate was made for.
        phases: One :class:`PhaseLine` per phase of the step.
        peak_phase: The phase in which the peak occurs at ``batch_size``.
        reserved_bytes: Predicted allocator reserve (CUDA caching allocator:
            ``max_memory_reserved``). ``None`` where no caching allocator applies.
        overhead_bytes: Bytes the device shows beyond the allocator: the CUDA
            context and the loaded libraries (cuBLAS, cuDNN kernels). 0 on CPU.
            The cuBLAS workspaces come from the allocator and are in
            ``breakdown["workspaces"]`` instead.
        device: Where training runs, e.g. ``"cpu"`` or ``"cuda:0"``.
        precision: The precision the step was estimated under.
        method: ``"trace"`` when the real step was simulated, otherwise the
            name of the fallback that produced the numbers.
        notes: Human-readable remarks: fallbacks and why, non-linear growth,
            approximations that apply.
        phase_breakdowns: Bytes per category at the peak of each phase.
        extra: Estimator-specific details (plain values only).
        variability: Bytes the runtime's own run-to-run variation may add to
            the peak, as a line in the batch size (TensorFlow: ops and loop
            iterations that the executor's threads overlap in an unlucky run).
            ``None`` where the runtime does not vary (every PyTorch estimate).
            Planning budgets with :meth:`upper_bytes_at`.
        allocation_log: The step's allocations as functions of the batch
            (:class:`~nnmem_callbacks.core.allocation_log.AllocationLog`), replayed
            through the allocator model by :meth:`reserved_bytes_at` at other
            batch sizes. ``None`` where no allocator model applies or the
            traces at other batch sizes could not be paired (then the reserve
            scales as a ratio of the peak, and ``notes`` says so).
        verifier: ``batch_size -> MemoryEstimate``: a direct estimate of the
            same step at another batch, which :meth:`max_batch_size` and
            :func:`nnmem_callbacks.core.plan.make_plan` use to check their answer
            (:mod:`nnmem_callbacks.core.verification`). ``None`` where the
            estimator offers none. Not compared, not in :meth:`to_dict`, and
            dropped when the estimate is pickled or deep-copied (it holds the
            model and the step's configuration).
        sequence: The peak against the sequence length as well
            (:class:`~nnmem_callbacks.core.sequence.SequenceCurve`), for
            :meth:`peak_bytes_at` with ``seq_len`` and :meth:`max_sequence_length`;
            ``None`` unless the estimator traced other lengths.
    """

    peak_bytes: int
    breakdown: Mapping[str, int]
    batch_size: int
    phases: tuple[PhaseLine, ...] = ()
    peak_phase: str = ""
    reserved_bytes: int | None = None
    overhead_bytes: int = 0
    device: str = "cpu"
    precision: str = "32-true"
    method: str = "trace"
    notes: tuple[str, ...] = ()
    phase_breakdowns: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    variability: PhaseLine | None = None
    allocation_log: AllocationLog | None = dataclasses.field(default=None, compare=False, repr=False)
    verifier: Callable[[int], "MemoryEstimate"] | None = dataclasses.field(default=None, compare=False, repr=False)
    sequence: SequenceCurve | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        full = {str(category): 0 for category in Category}
        for key, value in dict(self.breakdown).items():
            name = str(Category(key))
            full[name] = int(value)
        object.__setattr__(self, "breakdown", full)
        object.__setattr__(self, "notes", tuple(self.notes))
        if not self.phases:
            object.__setattr__(self, "phases", (PhaseLine("peak", int(self.peak_bytes), 0),))
            object.__setattr__(self, "peak_phase", self.peak_phase or "peak")

    @property
    def warnings(self) -> tuple[str, ...]:
        """The notes that say a measurement is missing or cut short (they begin with ``"warning: "``).

        Adapters show these as warnings, so a missing measurement is never silent.

        Example:
            >>> est = MemoryEstimate(peak_bytes=10, breakdown={}, batch_size=1,
            ...                      notes=("checked by real steps", "warning: only 1 of 3 runs finished"))
            >>> est.warnings
            ('warning: only 1 of 3 runs finished',)
        """
        return tuple(note for note in self.notes if note.startswith("warning: "))

    # -- batch scaling -----------------------------------------------------
    @property
    def _peak_line(self) -> PhaseLine:
        return max(
            (line for line in self.phases if line.covers(self.batch_size)),
            key=lambda line: (
                line.at(self.batch_size),
                line.phase == self.peak_phase,
                line.min_batch,
                line.per_sample_bytes,
            ),
        )

    @property
    def fixed_bytes(self) -> int:
        """Bytes of the peak phase that do not grow with the batch size."""
        return self._peak_line.fixed_bytes

    @property
    def per_sample_bytes(self) -> int:
        """Bytes the peak phase grows by per additional sample."""
        return self._peak_line.per_sample_bytes

    def peak_bytes_at(self, batch_size: int, seq_len: int | None = None) -> int:
        """Predicted peak bytes at another batch size (and sequence length).

        Args:
            batch_size: A positive batch size.
            seq_len: Another sequence length (needs :attr:`sequence`); ``None``:
                the traced one.

        Returns:
            The largest phase peak there. Equals ``peak_bytes`` at
            ``self.batch_size`` and the traced length.

        Raises:
            ValueError: If ``batch_size`` or ``seq_len`` is not a positive
                integer, or ``seq_len`` is given to an estimate without a
                sequence axis.
        """
        _check_batch_size(batch_size)
        if seq_len is not None and (self.sequence is None or seq_len != self.sequence.seq_len):
            return self._sequence_curve().peak_bytes_at(batch_size, seq_len)
        if batch_size == self.batch_size:
            return self.peak_bytes
        return max(line.at(batch_size) for line in self.phases if line.covers(batch_size))

    def reserved_bytes_at(self, batch_size: int) -> int:
        """Predicted allocator reserve at another batch size (CUDA).

        With an :attr:`allocation_log`, the step's allocations at
        ``batch_size`` are replayed through the allocator model, so that the
        reserve follows the allocator's rounding, segment sizes and splitting
        at that batch (fragmentation does not grow in proportion to the peak).
        Without one, the reserve is scaled as a ratio of the peak. Never below
        :meth:`peak_bytes_at`; where no allocator model applies this equals
        :meth:`peak_bytes_at`.

        Example:
            >>> est = MemoryEstimate(peak_bytes=1_000, breakdown={"parameters": 1_000}, batch_size=10,
            ...                      phases=(PhaseLine("step", 500, 50),), reserved_bytes=1_100)
            >>> est.reserved_bytes_at(10), est.reserved_bytes_at(20)  # no log: the ratio 1.1
            (1100, 1650)
        """
        peak = self.peak_bytes_at(batch_size)
        if self.reserved_bytes is None or self.peak_bytes <= 0:
            return peak
        if batch_size == self.batch_size:
            return self.reserved_bytes
        log = self.allocation_log
        if log is not None:
            # what the estimator added to the replayed reserve (if anything) is kept as it is
            offset = self.reserved_bytes - log.replay_at(self.batch_size).peak_reserved
            return max(peak, log.replay_at(batch_size).peak_reserved + offset)
        return int(round(peak * self.reserved_bytes / self.peak_bytes))

    def upper_bytes_at(self, batch_size: int) -> int:
        """The peak an unlucky run may reach at ``batch_size``: :meth:`peak_bytes_at` plus :attr:`variability`.

        Example:
            >>> est = MemoryEstimate(peak_bytes=100, breakdown={"parameters": 100}, batch_size=1,
            ...                      variability=PhaseLine("scheduling", 10, 5))
            >>> est.peak_bytes_at(1), est.upper_bytes_at(1), est.upper_bytes_at(3) - est.peak_bytes_at(3)
            (100, 115, 25)
        """
        extra = max(self.variability.at(batch_size), 0) if self.variability is not None else 0
        return self.peak_bytes_at(batch_size) + extra

    @property
    def upper_bytes(self) -> int:
        """:meth:`upper_bytes_at` the estimate's batch size."""
        return self.upper_bytes_at(self.batch_size)

    def device_bytes_at(self, batch_size: int) -> int:
        """What the device will show at ``batch_size``: reserve plus overhead."""
        return self.reserved_bytes_at(batch_size) + self.overhead_bytes

    @property
    def device_bytes(self) -> int:
        """What the device will show at ``batch_size``: reserve plus overhead."""
        return self.device_bytes_at(self.batch_size)

    def max_batch_size(
        self,
        budget_bytes: int | str,
        *,
        include_reserve: bool = False,
        limit: int = MAX_BATCH_SEARCH_LIMIT,
        verify: bool = True,
    ) -> int:
        """The largest batch size whose predicted peak fits ``budget_bytes``.

        The peak compared is :meth:`upper_bytes_at`: where the runtime varies
        from run to run (:attr:`variability`), a batch that fits only in a lucky
        run does not fit.

        Args:
            budget_bytes: Bytes available: an ``int``, or a size such as ``"8GiB"`` (as the callbacks' and the
                CLI's ``budget`` read it; a fraction of the device is not known to an estimate).
            include_reserve: Compare :meth:`device_bytes_at` (allocator reserve
                plus context overhead) instead of the tensor peak.
            limit: Upper bound of the search (for models whose peak does not
                grow with the batch).
            verify: Where the estimate has a :attr:`verifier`, check the answer
                with a direct estimate at that batch and step down until one
                fits (:meth:`verify_max_batch_size` returns the record).

        Returns:
            The batch size, or 0 when not even one sample fits.

        Raises:
            ValueError: For a budget that is neither bytes nor a size with a unit.

        Example:
            >>> MemoryEstimate(peak_bytes=100, breakdown={"parameters": 100},
            ...                batch_size=1).max_batch_size(50)
            0
        """
        budget_bytes = budget_in_bytes(budget_bytes)
        if verify and self.verifier is not None:
            return self.verify_max_batch_size(budget_bytes, include_reserve=include_reserve, limit=limit).batch_size
        return self._predicted_max_batch_size(budget_bytes, include_reserve, limit)

    def verify_max_batch_size(
        self, budget_bytes: int | str, *, include_reserve: bool = False, limit: int = MAX_BATCH_SEARCH_LIMIT
    ) -> Verification:
        """:meth:`max_batch_size` with the record of its checks by direct estimate.

        Raises:
            ValueError: If the estimate has no :attr:`verifier`, or for a budget :meth:`max_batch_size` refuses.
        """
        budget_bytes = budget_in_bytes(budget_bytes)
        if self.verifier is None:
            raise ValueError("this estimate has no verifier (the estimator that made it offers no direct estimate)")
        candidate = self._predicted_max_batch_size(budget_bytes, include_reserve, limit)
        return verify_batch_size(
            self, budget_bytes, verifier=self.verifier, candidate=candidate, include_reserve=include_reserve
        )

    def _predicted_max_batch_size(self, budget_bytes: int, include_reserve: bool, limit: int) -> int:
        measure = self.device_bytes_at if include_reserve else self.upper_bytes_at
        if measure(1) > budget_bytes:
            return 0
        if include_reserve and self.allocation_log is not None:
            # replaying the allocator log costs a pass over the step's events: bound the answer by the
            # tensor peak (the reserve is never below it; at large batches it is often within a segment of
            # it), else start from the answer of the reserve scaled as a ratio of the peak (cheap, usually
            # within a few percent) and gallop from there
            bound = search_largest(lambda n: self.peak_bytes_at(n) + self.overhead_bytes, budget_bytes, limit)
            if bound <= 1 or measure(bound) <= budget_bytes:
                return bound
            peak, reserve = max(self.peak_bytes, 1), self.reserved_bytes or self.peak_bytes
            ratio = lambda n: self.peak_bytes_at(n) * reserve // peak + self.overhead_bytes  # noqa: E731
            guess = search_largest(ratio, budget_bytes, bound - 1) if ratio(1) <= budget_bytes else 1
            return gallop_largest(measure, budget_bytes, min(max(guess, 1), bound - 1), bound - 1)
        return search_largest(measure, budget_bytes, limit)

    # -- sequence length -------------------------------------------------
    def _sequence_curve(self) -> SequenceCurve:
        if self.sequence is None:
            raise ValueError(
                "this estimate has no sequence axis: estimate with sequence_dim='auto' (token ids of shape "
                "(batch, length) are found) or sequence_dim=<the input dimension that holds the length>"
            )
        return self.sequence

    def max_sequence_length(self, budget_bytes: int | str, batch_size: int | None = None) -> int:
        """The longest sequence whose predicted peak at ``batch_size`` (default: the estimate's) fits ``budget_bytes``.

        ``budget_bytes`` is read as :meth:`max_batch_size` reads it (bytes, or a size such as ``"8GiB"``).
        Returns 0 when not even a length of 1 fits.

        Raises:
            ValueError: For an estimate without a sequence axis (:attr:`sequence`), or an invalid budget.

        Example:
            >>> from nnmem_callbacks.core.sequence import SequenceCurve, SequencePhase
            >>> curve = SequenceCurve(128, 4, (SequencePhase("step1/forward", ((1_000.0, 10.0, 0.5, 1_000),)),))
            >>> est = MemoryEstimate(peak_bytes=10_472, breakdown={}, batch_size=4, sequence=curve)
            >>> est.peak_bytes_at(4, seq_len=256), est.max_sequence_length(40_000)
            (36328, 269)
        """
        batch = self.batch_size if batch_size is None else batch_size
        _check_batch_size(batch)
        budget = budget_in_bytes(budget_bytes)
        return self._sequence_curve().max_sequence_length(budget, batch)

    def tensor_share_of_device(self, device_bytes: int) -> int:
        """The tensor peak allowed when the device total must stay within ``device_bytes``: less the context, shrunk
        by the estimate's reserve ratio at its own batch (other lengths keep the traced length's ratio).

        Example:
            >>> est = MemoryEstimate(peak_bytes=100, breakdown={}, batch_size=1, reserved_bytes=125, overhead_bytes=50)
            >>> est.tensor_share_of_device(300)
            200
        """
        ratio = 1.0
        if self.peak_bytes > 0 and self.reserved_bytes:
            ratio = self.reserved_bytes_at(self.batch_size) / self.peak_bytes
        return int((device_bytes - self.overhead_bytes) / ratio)

    # -- views -------------------------------------------------------------
    @property
    def static_bytes(self) -> int:
        """Bytes at the peak that do not depend on the batch (params, grads, state)."""
        return sum(self.breakdown[str(c)] for c in STATIC_CATEGORIES)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary of every number in the estimate."""
        return {
            "peak_bytes": self.peak_bytes,
            "breakdown": dict(self.breakdown),
            "batch_size": self.batch_size,
            "fixed_bytes": self.fixed_bytes,
            "per_sample_bytes": self.per_sample_bytes,
            "peak_phase": self.peak_phase,
            "phases": self._phase_dicts(),
            "reserved_bytes": self.reserved_bytes,
            "upper_bytes": self.upper_bytes,
            "variability": dataclasses.asdict(self.variability) if self.variability is not None else None,
            "overhead_bytes": self.overhead_bytes,
            "device_bytes": self.device_bytes,
            "device": self.device,
            "precision": self.precision,
            "method": self.method,
            "notes": list(self.notes),
            "phase_breakdowns": {k: dict(v) for k, v in self.phase_breakdowns.items()},
            "extra": dict(self.extra),
            "allocation_log": self.allocation_log.summary() if self.allocation_log is not None else None,
            "sequence": self.sequence.to_dict() if self.sequence is not None else None,
        }

    def __getstate__(self) -> dict[str, Any]:
        # the verifier holds the model and the step's configuration: never pickled
        state = dict(self.__dict__)
        state["verifier"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _phase_dicts(self) -> list[dict[str, Any]]:
        """The phase lines for :meth:`to_dict`, each with the batch sizes where it is the peak.

        A phase can hold several lines (one per moment of the phase that is the
        peak for some batch sizes); their ``phase`` labels are numbered
        (``"step1/backward (moment 2 of 2)"``) so that no two read the same.
        """
        totals: dict[str, int] = {}
        for line in self.phases:
            totals[line.phase] = totals.get(line.phase, 0) + 1
        seen: dict[str, int] = {}
        documents = []
        for line in self.phases:
            document = dataclasses.asdict(line)
            if totals[line.phase] > 1:
                seen[line.phase] = seen.get(line.phase, 0) + 1
                document["phase"] = f"{line.phase} (moment {seen[line.phase]} of {totals[line.phase]})"
            document["peak_at_batches"] = self._peak_range(line)
            documents.append(document)
        return documents

    def _peak_range(self, line: PhaseLine) -> list[int | None] | None:
        """``[low, high]`` (``high`` ``None``: no end) where ``line`` is the largest line; ``None`` if nowhere."""
        low, high = line.min_batch, line.max_batch
        for other in self.phases:
            if other is line or (other.min_batch, other.max_batch) != (line.min_batch, line.max_batch):
                continue
            if other.per_sample_bytes == line.per_sample_bytes:
                if other.fixed_bytes > line.fixed_bytes:
                    return None
            elif other.per_sample_bytes > line.per_sample_bytes:  # other overtakes line after the crossing
                crossing = (line.fixed_bytes - other.fixed_bytes) // (other.per_sample_bytes - line.per_sample_bytes)
                high = crossing if high is None else min(high, crossing)
            else:  # line overtakes other from the crossing on
                gap = other.fixed_bytes - line.fixed_bytes
                slope = line.per_sample_bytes - other.per_sample_bytes
                low = max(low, -(-gap // slope))
        if high is not None and low > high:
            return None
        return [low, high]

    def __str__(self) -> str:
        parts = ", ".join(f"{name}={format_bytes(value)}" for name, value in self.breakdown.items() if value)
        return (
            f"MemoryEstimate(peak={format_bytes(self.peak_bytes)} at batch {self.batch_size} "
            f"[{self.peak_phase}], method={self.method}, {parts})"
        )


def budget_in_bytes(budget: Any) -> int:
    """A budget in bytes, for :meth:`MemoryEstimate.max_batch_size` and its siblings.

    Takes an ``int`` (or integral number) of bytes, or a size with a unit as the callbacks' and the CLI's
    ``budget`` reads it (``"8GiB"``, ``"512MiB"``, ``"16GB"``). A fraction of the device (a ``float`` in
    (0, 1], or a bare number such as ``"0.9"``, which :func:`~nnmem_callbacks.core.plan.parse_budget_text` reads as
    a fraction) needs the device's capacity, which an estimate does not know: it is refused, as is a bare number
    above 1 (no unit).

    Raises:
        ValueError: Naming what was given and the valid spellings.

    Example:
        >>> budget_in_bytes("1.5KiB"), budget_in_bytes(4096)
        (1536, 4096)
        >>> budget_in_bytes(0.9)
        Traceback (most recent call last):
        ...
        ValueError: budget 0.9 is a fraction of the device, which an estimate cannot resolve (it does not know the device's capacity); pass bytes, e.g. 8 * 2**30, or a size with a unit, e.g. '8GiB', '512MiB' or '16GB'
    """
    valid = "pass bytes, e.g. 8 * 2**30, or a size with a unit, e.g. '8GiB', '512MiB' or '16GB'"
    fraction = "a fraction of the device, which an estimate cannot resolve (it does not know the device's capacity)"
    if isinstance(budget, str):
        if BARE_NUMBER.fullmatch(budget):  # as plan.parse_budget_text reads it: a fraction, never bytes
            what = fraction if 0 < float(budget) <= 1 else "a number without a unit"
            raise ValueError(f"budget {budget!r} is {what}; {valid}")
        try:
            return parse_bytes(budget)
        except ValueError:
            raise ValueError(f"cannot read budget {budget!r} as a size in bytes; {valid}") from None
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise ValueError(f"budget {budget!r} is not a size in bytes; {valid}")
    if isinstance(budget, numbers.Integral):
        return int(budget)
    if not math.isfinite(budget):
        raise ValueError(f"budget {budget!r} is not a finite size; {valid}")
    if 0 < budget <= 1:
        raise ValueError(f"budget {budget!r} is {fraction}; {valid}")
    return int(budget)  # a float count of bytes


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
