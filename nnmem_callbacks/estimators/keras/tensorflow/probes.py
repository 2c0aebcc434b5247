"""TensorFlow kernel probes: the scratch memory of this host's kernels, measured, not assumed.

A kernel's scratch depends on the build and the host (with oneDNN off, ``Conv2DBackpropFilter`` takes a 16 MiB work
buffer at every size; oneDNN's takes none), which the graph cannot show. So every distinct op of a kernel family
known to take scratch (:data:`PROBED_OPS`) is run for real, small, in a child process on this host's TensorFlow,
within :data:`DEFAULT_MEMORY_CAP` and :data:`DEFAULT_POINT_BUDGET`, and its points are cached per host fingerprint.

Design: docs/keras-tensorflow-replay.md, "Kernel probes".

Known limitations:
    * Only top-level ops of the traced step are probed; ops inside ``While``/``If``
      bodies (recurrent layers) keep the graph's rules.
    * Grappler's fusions (``_FusedConv2D`` and the like) are not reproduced: each
      op is probed as the graph names it.
    * The child process costs a TensorFlow import (a few seconds) the first time a
      host fingerprint meets new ops.
    * Only the probe process's time limit (:data:`DEFAULT_TIME_LIMIT`, a guard for hung or very slow kernels)
      depends on the host's speed and load; when it cuts probing short, a ``warning:`` note says so and the next
      estimate continues from the cache. The budget itself counts points, as the PyTorch probes do
      (:mod:`nnmem_callbacks.probes.session`).

Example:
    >>> probe = OpProbe("Conv2DBackpropFilter", b"", (ProbeInput(1, ("b1", 1, 200, 64)),))
    >>> probe.inputs[0].at(4)
    ((4, 1, 200, 64), None)
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

__all__ = [
    "child_environment",
    "child_failure",
    "collect",
    "DEFAULT_MEMORY_CAP",
    "DEFAULT_POINT_BUDGET",
    "DEFAULT_TIME_LIMIT",
    "FIRST_SAMPLES",
    "host_fingerprint",
    "MAX_CONSTANT_ELEMENTS",
    "measure",
    "ONEDNN_PAIRED_OPS",
    "OpProbe",
    "PROBED_OPS",
    "ProbeInput",
    "ProbeReport",
]

#: Op types whose kernels take scratch memory in some TensorFlow build (convolutions, pooling,
#: normalization, matrix products, losses). Other ops are sized from the graph alone.
PROBED_OPS = frozenset(
    {
        "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter",
        "Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
        "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
        "MaxPool", "MaxPoolGrad", "AvgPool", "AvgPoolGrad", "MaxPool3D", "MaxPool3DGrad", "AvgPool3D",
        "AvgPool3DGrad", "FusedBatchNormV3", "FusedBatchNormGradV3",
        "MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
        "SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits",
    }
)  # fmt: skip

#: With oneDNN on, these gradients use a workspace their forward op kept: run alone they take another
#: kernel, so they are not probed (the replay's companion rules model the pair).
ONEDNN_PAIRED_OPS = frozenset({"MaxPoolGrad", "MaxPool3DGrad"})

#: Bytes of inputs and outputs above which a probe is not run.
DEFAULT_MEMORY_CAP = 256 << 20
#: Probe points per estimate (an op at one number of samples, measured or served by the cache), counted in the
#: graph's order: an op whose points would pass it keeps the graph's rules. A count, not seconds, so that the same
#: model on the same host gets the same estimate however loaded the host is and whatever the cache holds. The
#: 50 developed and judged Keras models take 15 to 836 (DenseNet121) points (AVX2 host, 2026-11-29).
DEFAULT_POINT_BUDGET = 2000
#: Seconds the probe process may run: a guard for hung or very slow kernels, not a budget (a ``warning:`` note says
#: when it cut probing short; the next estimate continues from the cache). Cold, those 50 models probe in 15 s at
#: most, most of it the child's TensorFlow import.
DEFAULT_TIME_LIMIT = 300.0
#: Small per-sample multiples always probed (they extrapolate past the memory cap).
FIRST_SAMPLES = (1, 2, 4)
#: Integer constants at most this long are carried into the probe (shape vectors, axes).
MAX_CONSTANT_ELEMENTS = 16


@dataclasses.dataclass(frozen=True)
class ProbeInput:
    """One input of a probed op, per sample.

    Attributes:
        dtype: The TensorFlow ``DataType`` enum.
        shape: Dims; a batch-scaled dim is ``"b<u>"`` (``u`` per sample).
        value: For small integer constants, the values (batch-scaled entries
            as ``"b<u>"``); ``None`` means zeros are fed.
    """

    dtype: int
    shape: tuple
    value: tuple | None = None

    def at(self, samples: int) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        """The concrete shape and value at ``samples`` samples."""

        def concrete(item: Any) -> int:
            return samples * int(item[1:]) if isinstance(item, str) else int(item)

        value = None if self.value is None else tuple(concrete(v) for v in self.value)
        return tuple(concrete(d) for d in self.shape), value


@dataclasses.dataclass(frozen=True)
class OpProbe:
    """A distinct op to probe: its type, attributes (a serialized ``NodeDef``) and inputs per sample."""

    op_type: str
    node_def: bytes
    inputs: tuple[ProbeInput, ...]

    def key(self) -> str:
        """A stable cache key."""
        text = json.dumps(
            [self.op_type, base64.b64encode(self.node_def).decode(), [dataclasses.astuple(i) for i in self.inputs]]
        )
        return self.op_type + ":" + hashlib.sha1(text.encode()).hexdigest()[:20]

    def request(self, samples: list[int]) -> dict[str, Any]:
        """What the child process needs to run this op at ``samples``."""
        return {
            "key": self.key(),
            "op": self.op_type,
            "node_def": base64.b64encode(self.node_def).decode(),
            "inputs": [dataclasses.astuple(i) for i in self.inputs],
            "samples": list(samples),
        }

    def tensor_bytes(self, samples: int) -> int:
        """The bytes of the probe's inputs at ``samples`` (a bound for the memory cap)."""
        import numpy as np
        import tensorflow as tf

        total = 0
        for item in self.inputs:
            shape, _ = item.at(samples)
            total += int(np.prod(shape, dtype=np.int64)) * tf.as_dtype(item.dtype).size
        return total


def _batch_scaled(first: Any, second: Any, batch_size: int) -> Any:
    """``first`` unchanged when equal, ``"b<u>"`` when it doubles by a multiple of the batch, else ``None``."""
    if first == second:
        return int(first)
    if second == 2 * first and first % batch_size == 0 and first > 0:
        return f"b{first // batch_size}"
    return None


def _static_value(tensor: Any) -> Any:
    """The value of a small integer tensor known before running: a constant, or the shape a ``Shape`` op reads."""
    import numpy as np

    from nnmem_callbacks.estimators.keras.tensorflow.trace import constant_array

    value = constant_array(tensor)
    if value is not None:
        return np.asarray(value)
    op = tensor.op
    if op.type in ("Shape", "ShapeN"):
        source = op.inputs[tensor.value_index if op.type == "ShapeN" else 0]
        if source.shape.is_fully_defined():
            return np.asarray(source.shape.as_list())
    return None


def collect(graph: Any, double_graph: Any, batch_size: int, *, onednn: bool = False) -> tuple[dict[str, OpProbe], int]:
    """The probes of a step traced at ``batch_size`` (``graph``) and twice it (``double_graph``).

    With ``onednn``, the gradients of :data:`ONEDNN_PAIRED_OPS` are left out.

    Returns:
        ``({op name: probe}, ops of probed types that could not be described)``.
    """
    from tensorflow.core.framework import node_def_pb2

    from nnmem_callbacks.estimators.keras.tensorflow.schedule import pruned

    others = {op.name: op for op in double_graph.get_operations()}
    probes: dict[str, OpProbe] = {}
    skipped = 0
    # ops TensorFlow prunes never run: nothing to probe
    for op in pruned(graph.get_operations(), {t.ref() for t in graph.outputs}, tuple(graph.control_outputs)):
        if op.type not in PROBED_OPS or (onednn and op.type in ONEDNN_PAIRED_OPS):
            continue
        other = others.get(op.name)
        inputs = []
        for tensor, twin in zip(op.inputs, other.inputs if other is not None else ()):
            if not tensor.shape.is_fully_defined() or not twin.shape.is_fully_defined():
                break
            dims = tuple(_batch_scaled(a, b, batch_size) for a, b in zip(tensor.shape.as_list(), twin.shape.as_list()))
            if None in dims or len(tensor.shape) != len(twin.shape):
                break
            value = None
            if tensor.dtype.is_integer and tensor.shape.num_elements() <= MAX_CONSTANT_ELEMENTS:
                first, second = _static_value(tensor), _static_value(twin)
                if first is not None and second is not None:
                    value = tuple(_batch_scaled(int(a), int(b), batch_size) for a, b in zip(first.flat, second.flat))
                    if None in value:
                        break
            inputs.append(ProbeInput(int(tensor.dtype.as_datatype_enum), dims, value))
        else:
            if other is not None and other.type == op.type:
                node = node_def_pb2.NodeDef(op=op.type)
                for name, attr in op.node_def.attr.items():
                    if not name.startswith("_"):
                        node.attr[name].CopyFrom(attr)
                probes[op.name] = OpProbe(op.type, node.SerializeToString(deterministic=True), tuple(inputs))
                continue
        skipped += 1
    return probes, skipped


def host_fingerprint() -> dict[str, Any]:
    """What decides TensorFlow's CPU kernels and allocator here (the probe cache's key).

    Besides the CPU and TensorFlow's oneDNN mode, the variables that cap oneDNN's
    ISA (``ONEDNN_MAX_CPU_ISA``...) and choose the allocator
    (``TF_CPU_ALLOCATOR_USE_BFC``): a process started with another value runs
    other kernels, and must not read this one's probes.
    """
    import tensorflow as tf

    from nnmem_callbacks.allocators.tensorflow_cpu import onednn_enabled, tf_cpu_allocator
    from nnmem_callbacks.probes.fingerprint import CPU_ENV_VARS, cpu_isa_extensions, cpu_model_name

    return {
        "device_type": "cpu",
        "framework": "tensorflow",
        "tensorflow": tf.__version__,
        "onednn": onednn_enabled(),
        "cpu": cpu_model_name(),
        "isa": list(cpu_isa_extensions()),
        "intra_op_threads": int(tf.config.threading.get_intra_op_parallelism_threads()),
        "inter_op_threads": int(tf.config.threading.get_inter_op_parallelism_threads()),
        "allocator": tf_cpu_allocator(),
        "env": {name: os.environ.get(name) for name in CPU_ENV_VARS},
    }


@dataclasses.dataclass
class ProbeReport:
    """What one estimate's probes did (for ``notes``)."""

    probed: int = 0
    cached: int = 0
    skipped: int = 0
    failed: int = 0
    over_cap: int = 0
    over_budget: int = 0
    out_of_time: int = 0
    points: int = 0  # the points the estimate used, measured or cached (at most the point budget)
    seconds: float = 0.0
    point_budget: int = DEFAULT_POINT_BUDGET  # the budget the probes ran under
    time_limit: float = DEFAULT_TIME_LIMIT
    errors: list[str] = dataclasses.field(default_factory=list)

    def note(self) -> str:
        """One line for ``notes``."""
        text = (
            f"TensorFlow kernel scratch measured on this host for {self.probed + self.cached} op(s) "
            f"({self.cached} from the probe cache, {self.probed} probed in {self.seconds:.1f} s)"
        )
        left = self.skipped + self.failed + self.over_cap + self.over_budget + self.out_of_time
        if left:
            parts = [
                f"{count} {why}"
                for count, why in (
                    (self.skipped, "not describable"),
                    (self.failed, "failed"),
                    (self.over_cap, "over the memory cap"),
                    (self.over_budget, f"past the probe budget of {self.point_budget} points"),
                    (self.out_of_time, "past the time limit"),
                )
                if count
            ]
            text += "; graph rules for " + ", ".join(parts)
        if self.errors:
            text += "; first failure: " + self.errors[0]
        return text

    def time_warning(self) -> str | None:
        """A ``warning:`` line when the time limit cut probing short (the estimate then depends on the host's speed)."""
        if not self.out_of_time:
            return None
        return (
            f"warning: TensorFlow kernel probing stopped at its {self.time_limit:g} s limit (slow kernels or a loaded "
            f"host), so {self.out_of_time} op(s) use the graph rules and this estimate may differ from one on a faster "
            "or quieter host; the next estimate continues from the probe cache"
        )


def measure(
    probes: dict[str, OpProbe],
    batch_sizes: tuple[int, ...],
    *,
    memory_cap: int = DEFAULT_MEMORY_CAP,
    point_budget: int = DEFAULT_POINT_BUDGET,
    time_limit: float = DEFAULT_TIME_LIMIT,
    cache: Any = None,
) -> tuple[dict[str, Any], ProbeReport]:
    """Scratch curves for ``probes``: ``{op name: Curve over samples}`` and a report.

    Args:
        probes: From :func:`collect`.
        batch_sizes: The batch sizes the replay will evaluate (probed too,
            where the memory cap allows).
        memory_cap: Bytes of probe tensors above which an op is not probed.
        point_budget: Points per estimate (:data:`DEFAULT_POINT_BUDGET`); the ops past it, in the graph's order,
            keep the graph's rules.
        time_limit: Seconds the probe process may run (a guard, :data:`DEFAULT_TIME_LIMIT`).
        cache: A :class:`~nnmem_callbacks.probes.cache.ProbeCache` (default:
            the one of this host's fingerprint).
    """
    from nnmem_callbacks.probes.cache import ProbeCache
    from nnmem_callbacks.probes.fit import Curve

    report = ProbeReport(point_budget=point_budget, time_limit=time_limit)
    if cache is None:
        cache = ProbeCache(host_fingerprint())
    stored = cache.load()
    curves: dict[str, Any] = {}
    by_key: dict[str, OpProbe] = {}
    names_of: dict[str, list[str]] = {}
    stored_points: dict[str, dict[int, int]] = {}  # what the cache held for each op probed now
    for name, probe in probes.items():
        names_of.setdefault(probe.key(), []).append(name)
        by_key[probe.key()] = probe
    pending: dict[str, list[int]] = {}
    for key, probe in by_key.items():
        entry = stored.get(key)
        # the sizes the replay evaluates are probed too, where the cap allows: a kernel's path can change at large
        # sizes (Eigen's contraction shards a large inner dimension into per-thread partial results); the small
        # sizes extrapolate past the cap
        wanted = set(FIRST_SAMPLES) | {b for b in batch_sizes if probe.tensor_bytes(b) <= memory_cap}
        if probe.tensor_bytes(min(wanted)) > memory_cap:
            report.over_cap += len(names_of[key])
            continue
        # every op counts its points whatever the cache holds and whether it fails, so that the ops the budget
        # reaches depend on the graph alone
        if report.points + len(wanted) > point_budget:
            report.over_budget += len(names_of[key])
            continue
        report.points += len(wanted)
        if entry is not None and entry.get("failed"):
            report.failed += len(names_of[key])
            if len(report.errors) < 1:
                report.errors.append(f"{probe.op_type}: {entry['failed']} (cached)")
            continue
        known = dict(Curve.from_json(entry["points"]).points) if entry is not None and entry.get("points") else {}
        # the curve is made of this estimate's own points only: other estimates' points in the cache change nothing
        points = {n: known[n] for n in wanted if n in known}
        missing = sorted(wanted - set(points))
        if not missing:
            curves[key] = Curve(points)
            report.cached += len(names_of[key])
            continue
        if points:
            curves[key] = Curve(points)  # what is known already, should probing run out of time
        stored_points[key] = known
        pending[key] = missing
    started = time.perf_counter()
    new_entries: dict[str, Any] = {}
    if pending:
        results, errors, timed_out = _run_child([by_key[k].request(s) for k, s in pending.items()], time_limit)
        report.errors.extend(message for _, message in errors)
        for key, message in errors:
            if key is not None and key not in results:
                new_entries[key] = {"failed": message}  # the same op on the same host fails again: not retried
        for key in pending:
            measured = results.get(key)
            if measured is None:
                if key in new_entries:
                    report.failed += len(names_of[key])
                elif timed_out:
                    report.out_of_time += len(names_of[key])
                else:
                    report.failed += len(names_of[key])
                continue
            merged = dict(curves[key].points) if key in curves else {}
            merged.update(measured)
            curves[key] = Curve(merged)
            new_entries[key] = {"points": Curve({**stored_points[key], **merged}).to_json()}  # the cache keeps all
            report.probed += len(names_of[key])
    report.seconds = time.perf_counter() - started
    if new_entries:
        try:
            cache.save(new_entries)
        except OSError as error:  # a read-only cache directory: the probes still count for this estimate
            report.errors.append(f"cache not written: {error}")
    return {name: curves[key] for key, names in names_of.items() if key in curves for name in names}, report


def child_environment(*, bfc: bool) -> dict[str, str]:
    """The environment of a child process that runs TensorFlow as this process does.

    Same oneDNN mode and thread counts, no GPU, quiet logs; with ``bfc`` the
    BFC CPU allocator (``TF_CPU_ALLOCATOR_USE_BFC=true``), which keeps
    statistics on every host.
    """
    import tensorflow as tf

    from nnmem_callbacks.allocators.tensorflow_cpu import onednn_enabled

    env = dict(os.environ)
    env.update(
        TF_ENABLE_ONEDNN_OPTS="1" if onednn_enabled() else "0", TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""
    )
    if bfc:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    for name, value in (
        ("TF_NUM_INTRAOP_THREADS", tf.config.threading.get_intra_op_parallelism_threads()),
        ("TF_NUM_INTEROP_THREADS", tf.config.threading.get_inter_op_parallelism_threads()),
    ):
        if value:
            env[name] = str(value)
    return env


#: TensorFlow's and absl's info and warning log lines (``I0000 00:00:...``, ``2026-... I tensorflow/...``), which a
#: child writes to stderr before any error of its own.
_LOG_LINE = re.compile(
    r"^(?:[IW]\d{4} \d\d:\d\d:\d\d|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] |WARNING: All log messages)"
)
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b")


def child_failure(returncode: int, stderr: str) -> str:
    """Why a child process failed, in one line: the signal that stopped it, or its error, never a log line.

    Example:
        >>> child_failure(-9, "I0000 00:00:1732 1 port.cc:153] oneDNN custom operations are on.")
        'the child process was killed by SIGKILL (often the out-of-memory killer)'
        >>> child_failure(1, "Traceback (most recent call last):\\nValueError: bad shape\\nW0000 00:00:17 1 x.cc:1] late")
        'ValueError: bad shape'
        >>> child_failure(2, "")
        'the child process exited with status 2'
    """
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        why = " (often the out-of-memory killer)" if name == "SIGKILL" else ""
        return f"the child process was killed by {name}{why}"
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    errors = [line for line in lines if _EXCEPTION_LINE.match(line)]
    if errors:
        return errors[-1]
    others = [line for line in lines if not _LOG_LINE.match(line)]
    return others[-1] if others else f"the child process exited with status {returncode}"


def _run_child(
    requests: list[dict[str, Any]], timeout: float
) -> tuple[dict[str, dict[int, int]], list[tuple[str | None, str]], bool]:
    """Runs the probes in a fresh process with this process's TensorFlow mode; returns points and errors."""
    env = child_environment(bfc=True)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "nnmem_callbacks.estimators.keras.tensorflow.probes"],
            input=json.dumps(requests),
            env=env,
            capture_output=True,
            text=True,
            timeout=max(timeout, 1.0),
        )
    except subprocess.TimeoutExpired as expired:
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        return _parse_child(stdout)[0], [(None, "the probe process ran out of its time limit")], True
    results, errors = _parse_child(done.stdout)
    if done.returncode != 0 and not results:
        errors.append((None, f"the probe process failed: {child_failure(done.returncode, done.stderr)}"))
    return results, errors, False


def _parse_child(stdout: str) -> tuple[dict[str, dict[int, int]], list[tuple[str | None, str]]]:
    results: dict[str, dict[int, int]] = {}
    errors: list[tuple[str | None, str]] = []
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if "error" in record:
            errors.append((record["key"], f"{record['key'].split(':')[0]}: {record['error']}"))
        else:
            results.setdefault(record["key"], {})[int(record["samples"])] = int(record["scratch"])
    return results, errors


# -- the child process -------------------------------------------------------------------------
def _attr_value(value: Any) -> Any:  # pragma: no cover - runs in the child process
    """An ``AttrValue`` proto as eager execution takes it."""
    which = value.WhichOneof("value")
    if which == "list":
        items = value.list
        for field in ("s", "i", "f", "b", "type", "shape", "tensor", "func"):
            if len(getattr(items, field)):
                return list(getattr(items, field))
        return []
    if which == "type":
        return int(value.type)
    if which is None:
        return None
    return getattr(value, which)


def _output_count(op_def: Any, attrs: dict[str, Any]) -> int:  # pragma: no cover - runs in the child process
    count = 0
    for arg in op_def.output_arg:
        if arg.number_attr:
            count += int(attrs[arg.number_attr].i)
        elif arg.type_list_attr:
            count += len(attrs[arg.type_list_attr].list.type)
        else:
            count += 1
    return count


def _probe_in_child(request: dict[str, Any]) -> None:  # pragma: no cover - runs in the child process
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.framework import node_def_pb2
    from tensorflow.python.eager import context, execute
    from tensorflow.python.framework import op_def_registry

    from nnmem_callbacks.allocators.tensorflow_cpu import tf_allocator_bytes

    node = node_def_pb2.NodeDef.FromString(base64.b64decode(request["node_def"]))
    attrs = tuple(item for name, value in node.attr.items() for item in (name, _attr_value(value)))
    outputs_count = _output_count(op_def_registry.get(node.op), dict(node.attr))
    inputs = [
        ProbeInput(dtype, tuple(shape), tuple(value) if value is not None else None)
        for dtype, shape, value in request["inputs"]
    ]
    info = tf.config.experimental.get_memory_info
    for samples in request["samples"]:
        operands = []
        for item in inputs:
            shape, value = item.at(samples)
            dtype = tf.as_dtype(item.dtype)
            if value is not None:
                operands.append(tf.constant(np.array(value, dtype=dtype.as_numpy_dtype).reshape(shape)))
            else:
                operands.append(tf.zeros(shape, dtype))

        def run() -> Any:
            return execute.execute(node.op, outputs_count, operands, attrs, context.context())  # noqa: B023, F821 - run in this iteration, before the del

        run()  # the first call may initialise the kernel's caches (oneDNN primitives); its outputs are dropped
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = info("CPU:0")["current"]
        outputs = run()
        peak = info("CPU:0")["peak"]
        counted = sum(tf_allocator_bytes(int(np.prod(o.shape, dtype=np.int64)) * o.dtype.size) for o in outputs)
        del outputs, operands
        print(
            json.dumps({"key": request["key"], "samples": samples, "scratch": max(int(peak - before - counted), 0)}),
            flush=True,
        )


def _child_main() -> int:  # pragma: no cover - runs in the child process
    requests = json.loads(sys.stdin.read())
    import numpy as np
    import tensorflow as tf

    # one large free chunk first: every probe allocation then splits from it, so the allocator charges each
    # request its own rounded size, not whatever free chunk happened to be there
    largest = max(
        (
            sum(
                int(np.prod(ProbeInput(d, tuple(s), None).at(max(r["samples"]))[0], dtype=np.int64))
                * tf.as_dtype(d).size
                for d, s, _ in r["inputs"]
            )
            for r in requests
        ),
        default=0,
    )
    block = tf.zeros([max(64 << 20, min(8 * largest, 1 << 30)) // 4], tf.float32)
    del block
    for request in requests:
        try:
            _probe_in_child(request)
        except Exception as error:  # noqa: BLE001 - one op's failure does not stop the others
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            print(json.dumps({"key": request["key"], "error": f"{type(error).__name__}: {first[:200]}"}), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_child_main())
