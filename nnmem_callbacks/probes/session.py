"""One estimate's kernel probes: settings, the on-disk cache, counters and notes.

The tracer calls every workspace rule as ``rule(func, args, kwargs, out) -> bytes``. A probed rule asks the current
:class:`ProbeSession` (a context variable set by :func:`kernel_probes`, with the traced batch size set by
:func:`probe_batch`) for the peak of the real kernel's own allocations, outputs included; ``None`` means "not
probed, use the rule's formula". Batch-scaled ops are probed at a few small units of the batch and interpolated
(:class:`~nnmem_callbacks.probes.fit.Curve`); the points are cached (:class:`~nnmem_callbacks.probes.cache.ProbeCache`).

Design (which sizes are probed, the cache key): docs/torch-estimator.md, "Kernel probes".

Known limitations:
    * Past the largest probed point the bytes are extrapolated along the last segment of the curve.

Example:
    >>> import tempfile, torch
    >>> from nnmem_callbacks.probes.cache import ProbeCache
    >>> from nnmem_callbacks.probes.fingerprint import fingerprint
    >>> cache = ProbeCache(fingerprint("cpu"), tempfile.mkdtemp())
    >>> x, w = torch.zeros(4, 8, 6, 6), torch.zeros(8, 8, 3, 3)
    >>> op = torch.ops.aten.convolution.default
    >>> out = op(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    >>> with kernel_probes("cpu", cache=cache) as session, probe_batch(4):
    ...     nbytes = session.peak(op, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}, out)
    >>> nbytes >= out.numel() * 4, session.probed, session.from_cache
    (True, 1, 0)
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import time
from collections import Counter
from typing import Any, Iterator

import torch

from nnmem_callbacks.probes.batch_dims import BATCH_DIMS, REAL_DTYPES
from nnmem_callbacks.probes.cache import ProbeCache
from nnmem_callbacks.probes.fingerprint import fingerprint
from nnmem_callbacks.probes.fit import Curve
from nnmem_callbacks.probes.runner import (
    ProfilerBusy,
    UnsupportedKernelError,
    is_unsupported,
    isolated,
    kernel_peak,
    real_tensor,
    release_freed_memory,
)

__all__ = [
    "check_probe_kernels",
    "current_session",
    "DEFAULT_MEMORY_CAP",
    "default_memory_cap",
    "DEFAULT_KERNEL_RUN_BUDGET",
    "DEFAULT_TIME_LIMIT",
    "kernel_probes",
    "log",
    "MiB",
    "probe_batch",
    "PROBE_SHARE_OF_CAP",
    "PROBED_DEVICE_TYPES",
    "ProbeSession",
    "ProbeSettings",
    "PROFILER_BUSY",
]

MiB = 1 << 20

#: cap on what a probe makes the process hold (also at most a quarter of the free RAM)
DEFAULT_MEMORY_CAP = 256 * MiB

#: The share of the cap a probe's inputs and kernel peak may take. The rest is left for what the probe makes the
#: process hold beyond the profiler's view: oneDNN's JIT code and primitive cache, heap pages not yet returned, page
#: rounding (a cold ResNet-50 estimate at 512 x 3 x 512 x 512: 269 MiB of peak-RSS rise with the whole cap given to
#: inputs and peaks, 33 MiB over its largest probe's; benchmarks.suites.speed).
PROBE_SHARE_OF_CAP = 0.75

#: Distinct probe points per estimate (an op shape at one batch multiple, measured or served by the cache; a point
#: the walks at two batch sizes both take counts once): after that the rules' formulas apply. A count, not seconds,
#: so that the same model on the same host gets the same estimate however loaded the host is and whatever the cache
#: holds (a budget in seconds gave ResNet-50 at batch 32 3,103,732,404 bytes on a loaded 2-core host, then
#: 3,089,855,156 once the cache held more). ResNet-50 at batch 32 takes 197 (fp32) and 188 (bf16-mixed), GPT-2 small
#: 20 and 94.
DEFAULT_KERNEL_RUN_BUDGET = 400

#: Seconds of probing per estimate after which probing stops even within the run budget: a guard for slow kernels
#: (bf16 on a CPU without bf16 instructions: about 0.6 s a run); an estimate it cuts short says so in a warning.
DEFAULT_TIME_LIMIT = 120.0

#: device types whose kernels can be probed
PROBED_DEVICE_TYPES = ("cpu",)

#: Why probing stopped when the user's own profiler holds the profiler (probes need it to see the kernel's allocations).
PROFILER_BUSY = "another profiler is running"


def default_memory_cap() -> int:
    """:data:`DEFAULT_MEMORY_CAP`, or a quarter of the available RAM if less."""
    try:
        import psutil

        return int(min(DEFAULT_MEMORY_CAP, psutil.virtual_memory().available // 4))
    except Exception:  # noqa: BLE001
        return DEFAULT_MEMORY_CAP


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
    """How much probing an estimate may do.

    Attributes:
        enabled: ``False``: no probes, the rules' formulas give every workspace.
        memory_cap_bytes: What a probe may make the process hold: a probe whose
            inputs and kernel peak exceed :data:`PROBE_SHARE_OF_CAP` of this is
            refused (``None``: :func:`default_memory_cap`).
        kernel_runs: Probe points per estimate, measured or from the cache; after that, rules apply.
        time_limit_s: Probing time per estimate after which rules apply (a warning says so).
    """

    enabled: bool = True
    memory_cap_bytes: int | None = None
    kernel_runs: int = DEFAULT_KERNEL_RUN_BUDGET
    time_limit_s: float = DEFAULT_TIME_LIMIT

    def __post_init__(self) -> None:
        if isinstance(self.kernel_runs, bool) or not isinstance(self.kernel_runs, int) or self.kernel_runs < 0:
            raise ValueError(f"kernel_runs must be an int >= 0 (probe points per estimate), got {self.kernel_runs!r}")
        if not isinstance(self.time_limit_s, (int, float)) or not self.time_limit_s >= 0:
            raise ValueError(f"time_limit_s must be a number of seconds >= 0, got {self.time_limit_s!r}")


def check_probe_kernels(value: Any) -> "bool | ProbeSettings":
    """``value`` if it is a valid ``probe_kernels`` argument; otherwise a ValueError naming what is valid."""
    if not isinstance(value, (bool, ProbeSettings)):
        raise ValueError(
            f"probe_kernels must be True (measure the CPU kernels' workspaces), False (the rules' formulas only) or a "
            f"nnmem_callbacks.probes.session.ProbeSettings (run budget, time limit, memory cap), got {value!r}"
        )
    return value


log = logging.getLogger(__name__)

#: The cache files (or device types, without a cache) whose first probe of this process was announced.
_ANNOUNCED: set[str] = set()


_CURRENT: contextvars.ContextVar["ProbeSession | None"] = contextvars.ContextVar("nnmem_probe_session", default=None)


def current_session() -> "ProbeSession | None":
    """The probe session of the estimate running in this context, if any."""
    return _CURRENT.get()


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _stride_order(tensor: torch.Tensor) -> tuple[int, ...]:
    strides = tensor.stride()
    return tuple(sorted(range(tensor.dim()), key=lambda d: (strides[d], -d)))


@dataclasses.dataclass(frozen=True)
class _Plan:
    key: str
    unit: int | None  # rows per sample; None: not batch-scaled, probed at its real size
    target: int  # n at which the bytes are wanted
    scaled: tuple[tuple[int, int | None], ...]


class ProbeSession:
    """The kernel probes of one estimate.

    Args:
        device_type: The traced device type (only ``cpu`` kernels are probed).
        settings: :class:`ProbeSettings`.
        cache: A :class:`ProbeCache`; default: the cache file of this machine's
            fingerprint (``False``: no on-disk cache).
    """

    def __init__(
        self, device_type: str, settings: ProbeSettings | None = None, cache: ProbeCache | None | bool = None
    ) -> None:
        self.device_type = device_type
        self.settings = settings or ProbeSettings()
        self.disabled_reason: str | None = None
        if not self.settings.enabled:
            self.disabled_reason = "probe_kernels=False"
        elif device_type not in PROBED_DEVICE_TYPES:
            self.disabled_reason = f"{device_type} kernels are not probed yet"
        self.cap = (
            self.settings.memory_cap_bytes if self.settings.memory_cap_bytes is not None else default_memory_cap()
        )
        if cache is None and self.enabled:
            cache = ProbeCache(fingerprint(device_type))
        self.cache: ProbeCache | None = cache or None
        self._disk: dict[str, Any] | None = None
        self._new: dict[str, Any] = {}
        self._curves: dict[str, Curve] = {}
        self._values: dict[tuple[str, int], int | None] = {}
        self._entries: dict[str, Any] = {}
        self.batch_size: int | None = None
        self._probed_keys: set[str] = set()  # op shapes measured now
        self._cached_keys: set[str] = set()  # op shapes served by the cache
        self.kernel_runs = 0
        # what the run budget counts: the distinct probe points (op shape, batch multiple) this estimate's walks took,
        # measured or cached; a point a walk at another batch took already counts once
        self._points_taken: set[tuple[str, int]] = set()
        self.seconds = 0.0
        self.timed_out = False  # the time limit cut probing short: the estimate depends on the host's speed
        self.skipped: dict[str, set[str]] = {}  # reason -> op names left to the rules
        self.extrapolated: dict[str, set[str]] = {}  # reason -> op names extrapolated from smaller probes
        self.failed: dict[str, str] = {}  # op name -> error
        self.cache_error: str | None = None  # why the probes could not be saved to the cache
        self.fallbacks: Counter = Counter()  # op name -> rule-based workspaces

    def summary(self) -> dict[str, Any]:
        """The counts an estimate keeps in ``extra["kernel_probes"]``."""
        return {
            "probed": self.probed,
            "from_cache": self.from_cache,
            "kernel_runs": self.kernel_runs,
            "points": self.points_used,
            "seconds": round(self.seconds, 4),
        }

    @property
    def points_used(self) -> int:
        """Distinct probe points this estimate took, measured or from the cache: what the run budget counts."""
        return len(self._points_taken)

    @property
    def probed(self) -> int:
        """Distinct op shapes measured in this session."""
        return len(self._probed_keys)

    @property
    def from_cache(self) -> int:
        """Distinct op shapes served by the on-disk cache."""
        return len(self._cached_keys)

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None

    # -- planning ------------------------------------------------------------------
    def _plan(self, func: Any, args: tuple) -> _Plan:
        spec = BATCH_DIMS.get(func.overloadpacket)
        scaled = spec(args) if spec is not None else ()
        batch = self.batch_size
        leading = set()
        for index, dim in scaled:
            value = args[index] if index < len(args) else None
            if dim is None:
                leading.add(value if isinstance(value, int) else None)
            elif isinstance(value, torch.Tensor) and value.dim() > dim:
                leading.add(int(value.shape[dim]))
            else:
                leading.add(None)
        unit = None
        if scaled and batch and len(leading) == 1 and None not in leading:
            size = leading.pop()
            if size % batch == 0 and size > 0:
                unit = size // batch
        if unit is None:
            scaled = ()
        blank = {index: dim for index, dim in scaled}
        parts = [str(func), f"u={unit}"]
        for index, value in enumerate(args):
            if isinstance(value, torch.Tensor):
                shape = list(value.shape)
                if index in blank and blank[index] is not None:
                    shape[blank[index]] = -1
                parts.append(f"{str(value.dtype).replace('torch.', '')}{shape}{list(_stride_order(value))}")
            elif isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
                parts.append(repr([f"{v.dtype}{list(v.shape)}" if isinstance(v, torch.Tensor) else v for v in value]))
            else:
                parts.append("N" if index in blank else repr(value))
        return _Plan(";".join(parts), unit, batch if unit is not None else 1, scaled)

    def _real_args(self, func: Any, args: tuple, plan: _Plan, n: int) -> list[Any]:
        dims = {index: dim for index, dim in plan.scaled}
        fix = REAL_DTYPES.get(getattr(func, "overloadpacket", None))
        dtypes = fix(args) if fix is not None else {}
        real: list[Any] = []
        for index, value in enumerate(args):
            if isinstance(value, torch.Tensor):
                shape = list(value.shape)
                if index in dims and dims[index] is not None:
                    shape[dims[index]] = plan.unit * n
                tensor = real_tensor(value, shape, self.device_type)
                real.append(tensor.to(dtypes[index]) if index in dtypes else tensor)
            elif isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
                real.append(
                    type(value)(
                        real_tensor(v, None, self.device_type) if isinstance(v, torch.Tensor) else v for v in value
                    )
                )
            elif index in dims and dims[index] is None:
                real.append(plan.unit * n)
            else:
                real.append(value)
        return real

    def _probe_bytes(self, args: tuple, out: Any, plan: _Plan, n: int, curve: Curve | None = None) -> int:
        """What a probe at ``n`` holds at its peak: its inputs, plus the kernel's own peak (outputs included).

        The kernel's peak is unknown before the first probe of an op shape: its outputs (scaled from the traced
        ones) stand for it then. Once points of ``curve`` are measured, the peak at ``n`` is scaled in proportion
        from the largest of them, and the larger of that and the outputs counts: a kernel whose workspace is
        several times its output is stopped before it runs at a size whose workspace would pass the cap.
        """
        dims = {index: dim for index, dim in plan.scaled}
        total = 0
        factor = 1.0
        for index, value in enumerate(args):
            if isinstance(value, torch.Tensor):
                size = _nbytes(value)
                dim = dims.get(index)
                if dim is not None and value.shape[dim]:
                    factor = plan.unit * n / value.shape[dim]
                    size = int(size * factor)
                total += size
        outs = out if isinstance(out, (tuple, list)) else (out,)
        kernel = int(sum(_nbytes(t) for t in outs if isinstance(t, torch.Tensor)) * factor)
        if curve is not None and curve.points:
            # in proportion from the largest point: a kernel's bytes grow at most in proportion to the batch from any
            # point when they are a fixed part plus a per-sample part; the last segment's slope would not do, as a
            # workspace that jumps between two small sizes and then stays (oneDNN's AVX2 convolution backward: 9 MB
            # at one sample, 81 MB from two on) would be extrapolated past the cap and never probed again
            largest = max(curve.points)
            kernel = max(kernel, int(curve.points[largest] * n / largest))
        return total + kernel

    # -- probing -------------------------------------------------------------------
    def _curve(self, plan: _Plan) -> Curve:
        curve = self._curves.get(plan.key)
        if curve is None:
            if self._disk is None:
                self._disk = self.cache.load() if self.cache is not None else {}
            entry = self._disk.get(plan.key)
            curve = Curve.from_json(entry["points"]) if isinstance(entry, dict) and "points" in entry else Curve()
            if curve.points:
                self._cached_keys.add(plan.key)
            self._curves[plan.key] = curve
        return curve

    def _wanted(self, curve: Curve, plan: _Plan) -> list[int]:
        """The next ``n`` to probe, or none when the curve covers the target."""
        if plan.unit is None:
            return [] if 1 in curve.points else [1]
        missing = [n for n in (1, 2, 4) if n not in curve.points]
        if missing:
            return missing
        if curve.is_linear() or plan.target in curve.points:
            return []
        if max(curve.points) >= plan.target:
            # the kernel path changes between doublings: probe the batch itself (within the cap)
            return [plan.target]
        n = max(curve.points) * 2
        return [n]

    def _announce(self) -> None:
        """Says once per process and cache that kernels are being run: a first estimate on a machine takes longer."""
        where = str(self.cache.path) if self.cache is not None else self.device_type
        if where not in _ANNOUNCED:
            _ANNOUNCED.add(where)
            log.info(
                "running this machine's %s kernels once to measure their scratch memory (cached in %s): the first "
                "estimate on a machine takes longer",
                self.device_type,
                where,
            )

    def _measure(self, func: Any, args: tuple, kwargs: dict, plan: _Plan, n: int) -> int:
        self._announce()
        started = time.perf_counter()
        try:
            with isolated():
                real = self._real_args(func, args, plan, n)
                result, peak = kernel_peak(lambda: func(*real, **kwargs), strict=True)  # noqa: F821 - called before the del
                del result, real
        finally:
            release_freed_memory()
            self.seconds += time.perf_counter() - started
        self.kernel_runs += 1
        return peak

    def peak(self, func: Any, args: tuple, kwargs: dict, out: Any) -> int | None:
        """The peak bytes of ``func``'s real kernel, outputs included (``None``: use the rule).

        Raises:
            UnsupportedKernelError: The kernel cannot run on this device.
        """
        name = str(func.overloadpacket)
        if not self.enabled or any(isinstance(v, torch.Tensor) for v in kwargs.values()):  # out= variants: not probed
            self.fallbacks[name] += 1
            return None
        plan = self._plan(func, args)
        cached = self._values.get((plan.key, plan.target), ...)
        if cached is not ...:
            if cached is None:
                self.fallbacks[name] += 1
            return cached
        curve = self._curve(plan)  # every point known: measured in this session or cached
        # The points this op shape's plan takes, in plan order: served by the curve where it has them, measured
        # where not. The value comes from these alone, so a cache holding more points (probed for another batch)
        # gives the same bytes as an empty one, and each taken point counts against the run budget either way.
        walk = Curve()
        measured_now = False
        stopped: str | None = None
        while True:
            wanted = self._wanted(walk, plan)
            if not wanted:
                break
            n = wanted[0]
            point = (plan.key, n)
            if point not in self._points_taken and self.points_used >= self.settings.kernel_runs:
                stopped = f"the probe budget of {self.settings.kernel_runs} kernel runs per estimate was spent"
                break
            if n in curve.points:
                walk.points[n] = curve.points[n]
                self._points_taken.add(point)
                continue
            if self._probe_bytes(args, out, plan, n, walk) > PROBE_SHARE_OF_CAP * self.cap:
                stopped = f"inputs and kernel peak over the {self.cap / MiB:.0f} MiB probe cap"
                break
            if self.seconds > self.settings.time_limit_s:
                self.timed_out = True
                stopped = f"the {self.settings.time_limit_s:g} s probe time limit was reached"
                break
            try:
                walk.points[n] = curve.points[n] = self._measure(func, args, kwargs, plan, n)
            except ProfilerBusy:
                self.disabled_reason = PROFILER_BUSY
                break
            except RuntimeError as error:
                first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                if is_unsupported(error):
                    dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor)), None)
                    raise UnsupportedKernelError(name, dtype, self.device_type, first) from error
                self.failed[name] = f"{type(error).__name__}: {first}"
                break
            except Exception as error:  # noqa: BLE001 - a probe must never end the estimate
                self.failed[name] = f"{type(error).__name__}: {str(error).strip()[:200]}"
                break
            self._points_taken.add(point)
            measured_now = True
            self._new[plan.key] = {"points": curve.to_json(), "unit": plan.unit, "op": name}
        if measured_now:
            self._probed_keys.add(plan.key)
        value = None
        if plan.unit is None:
            value = walk.points.get(1)
        elif len(walk.points) >= 2 or plan.target in walk.points:
            value = walk.at(plan.target)
        if value is None:
            self.fallbacks[name] += 1
        if stopped is not None:
            # no value: the rule's formula applies; a value: extrapolated from the smaller probes
            (self.skipped if value is None else self.extrapolated).setdefault(stopped, set()).add(name)
        self._values[(plan.key, plan.target)] = value
        return value

    def lookup(self, key: str) -> Any:
        """A raw entry probed earlier in this session or (when enabled) in the cache, else ``None``.

        For probes with their own fit (oneDNN's RNN sizes), stored with :meth:`record`.
        """
        entry = self._entries.get(key)
        if entry is not None:
            return entry
        if self.enabled:
            if self._disk is None:
                self._disk = self.cache.load() if self.cache is not None else {}
            entry = self._disk.get(key)
            if entry is not None:
                self._cached_keys.add(key)
                self._entries[key] = entry
        return entry

    def record(self, key: str, entry: Any, *, runs: int, seconds: float) -> None:
        """Stores a raw probe entry (and counts the probe) for :meth:`lookup`."""
        self._entries[key] = entry
        self._probed_keys.add(key)
        self.kernel_runs += runs
        self.seconds += seconds
        if self.enabled:
            self._new[key] = entry

    # -- results -------------------------------------------------------------------
    def flush(self) -> None:
        """Writes the points probed in this session to the cache."""
        if self.cache is not None and self._new:
            try:
                self.cache.save(self._new)
            except OSError as error:  # a read-only cache dir must not end the estimate
                self.cache_error = f"could not write {self.cache.path}: {error}"
            self._new = {}

    def notes(self) -> list[str]:
        """Lines for ``MemoryEstimate.notes``."""
        notes: list[str] = []
        if self.disabled_reason is not None and self.fallbacks:
            # the user's choice and an unprobed device type (its own tables apply) are notes; a profiler that
            # blocked the probes is a measurement that went missing
            prefix = "warning: " if self.disabled_reason == PROFILER_BUSY else ""
            notes.append(f"{prefix}kernel workspaces from rules, not probed: {self.disabled_reason}")
            return notes
        if self.probed or self.from_cache:
            where = f" ({self.cache.path})" if self.cache is not None else ""
            notes.append(
                f"kernel workspaces probed on this {self.device_type}: {self.probed} op shape(s) measured "
                f"({self.kernel_runs} kernel runs, {self.seconds:.2f} s), {self.from_cache} from the cache{where}"
            )
        if self.timed_out:
            notes.append(
                f"warning: kernel probing stopped at its {self.settings.time_limit_s:g} s time limit (slow kernels or a "
                "loaded host), so the ops after it use the rules' formulas and this estimate may differ from one on a "
                "faster or quieter host; the next estimate continues from the probe cache"
            )
        for reason, names in sorted(self.skipped.items()):
            notes.append(f"kernel workspaces from rules, not probed: {reason} ({', '.join(sorted(names))})")
        for reason, names in sorted(self.extrapolated.items()):
            notes.append(
                f"kernel workspaces interpolated or extrapolated from other probed sizes ({reason}): {', '.join(sorted(names))}"
            )
        for name, error in sorted(self.failed.items()):
            notes.append(f"warning: kernel workspaces from rules, not probed: the probe of {name} failed ({error})")
        if self.cache_error is not None:
            notes.append(
                f"warning: the kernel probe cache was not updated ({self.cache_error}); the next estimate probes again"
            )
        return notes


@contextlib.contextmanager
def kernel_probes(
    device_type: str,
    enabled: bool = True,
    *,
    settings: ProbeSettings | None = None,
    cache: ProbeCache | None | bool = None,
) -> Iterator[ProbeSession]:
    """Makes a :class:`ProbeSession` current for the traces inside; saves its probes to the cache after."""
    if settings is None:
        settings = ProbeSettings(enabled=enabled)
    elif not enabled:
        settings = dataclasses.replace(settings, enabled=False)
    session = ProbeSession(device_type, settings, cache)
    token = _CURRENT.set(session)
    try:
        yield session
    finally:
        _CURRENT.reset(token)
        session.flush()


@contextlib.contextmanager
def probe_batch(batch_size: int) -> Iterator[None]:
    """Sets the traced batch size of the current session (a no-op without one)."""
    session = _CURRENT.get()
    if session is None:
        yield
        return
    previous = session.batch_size
    session.batch_size = batch_size
    try:
        yield
    finally:
        session.batch_size = previous
