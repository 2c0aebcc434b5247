"""Accuracy benchmark: predicted vs measured peak memory for every zoo case.

Usage::

    python -m benchmarks.suites.accuracy                      # the zoo x 3 optimizers x 2 precisions, CPU
    python -m benchmarks.suites.accuracy --cases hf_bert,hf_llama,hf_t5,hf_vit,hf_convnext   # outside cases
    python -m benchmarks.suites.accuracy --quick              # 4 cases x adam x 2 precisions
    python -m benchmarks.suites.accuracy --cases mlp,lstm --optimizers adam --precisions 32-true
    python -m benchmarks.suites.accuracy --device cuda        # ground truth from the CUDA allocator

For each case x optimizer x precision it runs our estimate
(``nnmem_callbacks.estimate_training``, timed), the ground truth
(:mod:`benchmarks.common.groundtruth`) and both baselines (:mod:`benchmarks.common.baselines`),
prints a table and writes ``benchmarks/results/accuracy/<stem>.md`` and ``.json``
(``<stem>`` is ``--stem``, the host such as ``zen4-avx512``; by default the device, or
``<device>_quick`` with ``--quick``).
Errors are signed: ``(predicted - measured) / measured``. Every combination is
isolated: a Python exception becomes an error row, and each case runs in its
own child process (unless ``--in-process``), so a native crash or a hang of
one case is recorded with the stage it happened in (estimate, groundtruth,
memtracker) instead of ending the run.
On CUDA every combination gets its own fresh child process and its ground
truth is measured before the estimate: a real training run pays the cuBLAS
workspaces of its first GEMMs, so the truth must too (``benchmarks.common.groundtruth``).

The default run is the hand-written zoo plus gpt2 (``zoo.DEFAULT_CASES``); the
outside cases (``zoo.OUTSIDE_CASES``, models built from ``transformers``
configs that the estimator was never tuned on) run when named in ``--cases``
and are marked "(outside)" in the tables and ``"outside": true`` in the JSON.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import inspect
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # silence kineto's per-profile log lines

import torch  # noqa: E402

from benchmarks.common import zoo  # noqa: E402
from benchmarks.common.baselines import activation_elements_per_sample, memtracker_peak, rule_of_thumb_bytes
from benchmarks.common.groundtruth import measure_cpu_peak, measure_cuda_peak, to_device
from benchmarks.common.paths import ROOT, result_dir

__all__ = [
    "RESULTS_DIR",
    "QUICK_CASES",
    "QUICK_OPTIMIZERS",
    "STAGES",
    "run_combo",
    "run_case",
    "run_case_isolated",
    "HEADER",
    "summarize",
    "to_markdown",
    "build_parser",
    "main",
]

RESULTS_DIR = result_dir("accuracy")
QUICK_CASES = ("mlp", "resnet18", "gpt2", "data_dependent")
QUICK_OPTIMIZERS = ("adam",)
MiB = 1 << 20


def _err(pred: int | None, meas: int | None) -> float | None:
    if pred is None or meas is None or meas == 0:
        return None
    return 100.0 * (pred - meas) / meas


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def _estimate(
    model: torch.nn.Module, batch: Any, make_optimizer: Any, loss_fn: Any, precision: str, device: str
) -> tuple[Any, float]:
    from nnmem_callbacks import estimate_training

    kwargs: dict[str, Any] = dict(optimizer=make_optimizer, loss_fn=loss_fn, precision=precision)
    try:
        if "device" in inspect.signature(estimate_training).parameters:
            kwargs["device"] = device
    except (TypeError, ValueError):
        pass
    t0 = time.perf_counter()
    est = estimate_training(model, batch, **kwargs)
    return est, time.perf_counter() - t0


def _no_progress(stage: str) -> None:
    pass


STAGES = ("estimate", "groundtruth", "memtracker")


def run_combo(
    case: zoo.ZooCase,
    model: torch.nn.Module,
    batch: Any,
    opt_name: str,
    precision: str,
    device: str,
    rot: dict[str, Any],
    with_memtracker: bool = True,
    progress: Any = _no_progress,
    skip: Sequence[str] = (),
) -> dict[str, Any]:
    """One case x optimizer x precision; every stage caught separately.

    ``progress(stage)`` is called before each stage (``estimate``,
    ``groundtruth``, ``memtracker``) so that a parent process can tell in
    which stage a worker died of a native crash; stages in ``skip`` are not
    run (they crashed a worker before).
    """
    make_opt = zoo.OPTIMIZERS[opt_name]
    row: dict[str, Any] = {
        "case": case.name,
        "optimizer": opt_name,
        "precision": precision,
        "batch_size": case.batch_size,
        "data_dependent": case.data_dependent,
        "outside": case.outside,
        "errors": [],
    }

    def ours() -> None:
        _estimate_stage(row, model, batch, make_opt, case, precision, device, progress, skip)

    def truth() -> None:
        _truth_stage(row, model, batch, make_opt, case, precision, device, progress, skip)

    # On CUDA the truth runs first in its fresh process: the estimate's bounded
    # device probe creates the cuBLAS handles and workspaces a real run pays
    # for (see benchmarks.common.groundtruth), and would hide them from the truth.
    for stage in (truth, ours) if device == "cuda" else (ours, truth):
        stage()
    _baselines(row, model, batch, make_opt, case, precision, device, rot, with_memtracker, progress, skip)
    gc.collect()
    return row


def _estimate_stage(
    row: dict[str, Any],
    model: torch.nn.Module,
    batch: Any,
    make_opt: Any,
    case: zoo.ZooCase,
    precision: str,
    device: str,
    progress: Any,
    skip: Sequence[str],
) -> None:
    if "estimate" in skip:
        row.update(predicted=None, method="crash", estimate_error="skipped: crashed a worker before")
    else:
        progress("estimate")
        try:
            dev_model = copy.deepcopy(model)
            dev_batch = batch
            if device == "cuda":
                dev_model, dev_batch = dev_model.to("cuda"), to_device(batch, "cuda")
            est, secs = _estimate(dev_model, dev_batch, make_opt, case.loss_fn, precision, device)
            del dev_model, dev_batch
            row.update(
                predicted=int(est.peak_bytes),
                estimate_s=secs,
                method=est.method,
                predicted_phase=est.peak_phase,
                predicted_reserved=est.reserved_bytes,
                predicted_overhead=est.overhead_bytes,
                predicted_device=est.device_bytes,
                predicted_breakdown=dict(est.breakdown),
                notes=list(est.notes),
                kernel_probes=dict(est.extra.get("kernel_probes") or {}),
            )
        except Exception as exc:  # noqa: BLE001
            # a kernel the device cannot run is a deliberate refusal, not a crash (see summarize)
            method = "unsupported" if type(exc).__name__ == "UnsupportedKernelError" else "crash"
            row.update(
                predicted=None,
                method=method,
                estimate_error=_short(exc),
                estimate_traceback=traceback.format_exc(limit=8),
            )
        gc.collect()


def _truth_stage(
    row: dict[str, Any],
    model: torch.nn.Module,
    batch: Any,
    make_opt: Any,
    case: zoo.ZooCase,
    precision: str,
    device: str,
    progress: Any,
    skip: Sequence[str],
) -> None:
    if "groundtruth" in skip:
        row.update(measured=None)
    else:
        progress("groundtruth")
        try:
            if device == "cuda":
                gt = measure_cuda_peak(model, batch, make_opt, case.loss_fn, precision)
                row.update(
                    measured_reserved=gt["reserved_bytes"],
                    measured_overhead=gt["overhead_bytes"],
                    measured_device=gt["device_peak_bytes"],
                )
            else:
                gt = measure_cpu_peak(model, batch, make_opt, case.loss_fn, precision)
            row.update(
                measured=int(gt["peak_bytes"]),
                measured_phase=gt["peak_phase"],
                measured_baseline=gt["baseline_bytes"],
                phase_peaks=gt["phase_peaks"],
                groundtruth_s=gt["wall_s"],
            )
        except Exception as exc:  # noqa: BLE001
            row.update(measured=None)
            row["errors"].append("groundtruth: " + _short(exc))
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()


def _baselines(
    row: dict[str, Any],
    model: torch.nn.Module,
    batch: Any,
    make_opt: Any,
    case: zoo.ZooCase,
    precision: str,
    device: str,
    rot: dict[str, Any],
    with_memtracker: bool,
    progress: Any,
    skip: Sequence[str],
) -> None:
    row["error_pct"] = _err(row.get("predicted"), row.get("measured"))
    row["rule_of_thumb"] = rot.get("bytes")
    row["rule_of_thumb_error_pct"] = _err(rot.get("bytes"), row.get("measured"))
    if rot.get("error"):
        row["errors"].append("rule_of_thumb: " + rot["error"])
    if with_memtracker and "memtracker" in skip:
        row.update(memtracker=None, memtracker_error="skipped: crashed a worker before")
    elif with_memtracker:
        progress("memtracker")
        mt_model = model.to("cuda") if device == "cuda" else model
        mt_batch = to_device(batch, "cuda") if device == "cuda" else batch
        mt = memtracker_peak(mt_model, mt_batch, make_opt, case.loss_fn, precision)
        if device == "cuda":
            model.to("cpu")
        row.update(
            memtracker=mt["peak_bytes"],
            memtracker_s=mt["seconds"],
            memtracker_error=mt["error"],
            memtracker_error_pct=_err(mt["peak_bytes"], row.get("measured")),
        )
    if device == "cuda" and row.get("predicted_reserved") is not None and row.get("measured_reserved"):
        row["reserved_error_pct"] = _err(row["predicted_reserved"], row["measured_reserved"])
        row["device_error_pct"] = _err(row.get("predicted_device"), row.get("measured_device"))


Combo = tuple  # (optimizer, precision, tuple of stages to skip)


def run_case(
    name: str,
    optimizers: Sequence[str],
    precisions: Sequence[str],
    device: str,
    with_memtracker: bool = True,
    log: Any = print,
    sink: Any = None,
    combos: Sequence[Combo] | None = None,
) -> list[dict[str, Any]]:
    """All optimizer x precision combinations of one case (or ``combos``), in this process.

    ``sink(record)`` (optional) receives progress markers and finished rows as
    they happen (the worker protocol of :func:`run_case_isolated`).
    """
    rows = []
    sink = sink or (lambda record: None)
    if combos is None:
        combos = [(o, p, ()) for o in optimizers for p in precisions]
    try:
        case = zoo.get_case(name)
        torch.manual_seed(0)
        model = case.make_model()
        batch = case.make_batch(case.batch_size, "cpu")
    except Exception as exc:  # noqa: BLE001
        return [
            {
                "case": name,
                "optimizer": "-",
                "precision": "-",
                "predicted": None,
                "measured": None,
                "method": "crash",
                "errors": ["build: " + _short(exc)],
                "data_dependent": False,
            }
        ]
    rot: dict[str, Any] = {}
    try:
        acts = activation_elements_per_sample(model, case.make_batch(2, "cpu"), case.loss_fn, 2)
        rot = {"bytes": rule_of_thumb_bytes(model, case.batch_size, acts), "activations_per_sample": acts}
    except Exception as exc:  # noqa: BLE001
        rot = {"bytes": None, "error": _short(exc)}
    for opt_name, precision, skip in combos:

        def progress(stage: str, _o: str = opt_name, _p: str = precision) -> None:
            sink({"_stage": stage, "optimizer": _o, "precision": _p})

        try:
            row = run_combo(case, model, batch, opt_name, precision, device, rot, with_memtracker, progress, skip)
        except Exception as exc:  # noqa: BLE001
            row = {
                "case": name,
                "optimizer": opt_name,
                "precision": precision,
                "predicted": None,
                "measured": None,
                "method": "crash",
                "errors": ["runner: " + _short(exc)],
                "data_dependent": case.data_dependent,
            }
        rows.append(row)
        sink({"_row": row})
        log(_format_row(row))
    del model, batch
    gc.collect()
    return rows


def run_case_isolated(
    name: str,
    optimizers: Sequence[str],
    precisions: Sequence[str],
    device: str,
    with_memtracker: bool = True,
    timeout_s: float = 600.0,
) -> list[dict[str, Any]]:
    """Runs :func:`run_case` in child processes, so that a native crash (abort,
    segfault) or a hang of one stage becomes an error in its row instead of
    ending the benchmark.

    The child prints its rows (stdout is shared) and streams JSON records to a
    file. When it dies, the stage it died in is recorded as crashed for that
    combination, and a new child resumes: it reruns that combination without
    the crashed stage(s), then the combinations not yet run.
    """
    import signal
    import subprocess
    import tempfile

    if device == "cuda" and len(optimizers) * len(precisions) > 1:
        # the fair CUDA truth: every combination in a fresh process (benchmarks.common.groundtruth)
        return [
            row
            for o in optimizers
            for p in precisions
            for row in run_case_isolated(name, [o], [p], device, with_memtracker, timeout_s)
        ]

    data_dependent = zoo.ZOO[name].data_dependent if name in zoo.ZOO else False
    pending: list[list[Any]] = [[o, p, []] for o in optimizers for p in precisions]
    crashes: dict[tuple[str, str], dict[str, str]] = {}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    root = str(ROOT)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for _attempt in range(len(pending) * len(STAGES) + 1):
        if not pending:
            break
        with tempfile.TemporaryDirectory(prefix="nnmem_bench_") as tmp:
            records_path = Path(tmp) / "records.jsonl"
            stderr_path = Path(tmp) / "stderr.txt"
            spec = ",".join(f"{o}:{p}:{'+'.join(skip)}" for o, p, skip in pending)
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.suites.accuracy",
                "--worker",
                name,
                "--records",
                str(records_path),
                "--device",
                device,
                "--combos",
                spec,
            ]
            if not with_memtracker:
                cmd.append("--no-memtracker")
            with open(stderr_path, "w") as err:
                try:
                    rc: Any = subprocess.run(
                        cmd, stdout=None, stderr=err, env=env, cwd=root, timeout=timeout_s
                    ).returncode
                except subprocess.TimeoutExpired:
                    rc = f"timeout after {timeout_s:.0f} s"
            last_stage: tuple[str, str, str] | None = None
            if records_path.exists():
                for line in records_path.read_text().splitlines():
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if "_row" in rec:
                        r = rec["_row"]
                        rows[(r["optimizer"], r["precision"])] = r
                        last_stage = None
                    elif "_stage" in rec:
                        last_stage = (rec["optimizer"], rec["precision"], rec["_stage"])
            err_lines = [
                ln for ln in stderr_path.read_text(errors="replace").splitlines() if ln.strip() and "USDT" not in ln
            ]
        pending = [c for c in pending if (c[0], c[1]) not in rows]
        if rc == 0 or last_stage is None:
            if pending:  # died outside any stage (e.g. while building the model): give up on the rest
                for o, p, _skip in pending:
                    rows[(o, p)] = {
                        "case": name,
                        "optimizer": o,
                        "precision": p,
                        "predicted": None,
                        "measured": None,
                        "method": "crash",
                        "data_dependent": data_dependent,
                        "errors": [
                            f"worker ended (exit {rc}) before this combination: "
                            f"{err_lines[-1][:200] if err_lines else ''}"
                        ],
                    }
                pending = []
            break
        signal_name = f" {signal.Signals(-rc).name}" if isinstance(rc, int) and rc < 0 else ""
        o, p, stage = last_stage
        cause = err_lines[-1][:200] if err_lines else ""
        crashes.setdefault((o, p), {})[stage] = f"worker died (exit {rc}{signal_name}) during {stage}: {cause}"
        for c in pending:
            if (c[0], c[1]) == (o, p):
                c[2].append(stage)
    for (o, p), stage_msgs in crashes.items():
        row = rows.get((o, p))
        if row is None:
            continue
        for stage, msg in stage_msgs.items():
            row.setdefault("errors", []).append(msg)
            if stage == "estimate":
                row.update(method="crash", estimate_error=msg)
            elif stage == "memtracker":
                row.update(memtracker=None, memtracker_error=msg)
        print("  (rerun after a worker crash) " + _format_row(row), flush=True)
    return [rows[(o, p)] for o in optimizers for p in precisions if (o, p) in rows]


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------
def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


HEADER = (
    "case",
    "optimizer",
    "precision",
    "pred MiB",
    "meas MiB",
    "error",
    "est s",
    "method",
    "pred phase",
    "meas phase",
    "rule MiB",
    "rule err",
    "memtracker MiB",
    "mt err",
    "mt s",
)


def _format_cells(row: dict[str, Any]) -> list[str]:
    mt = row.get("memtracker_error")
    mt_cell = ("crash: " + mt[:60]) if mt else _mib(row.get("memtracker"))
    method = row.get("method", "-")
    if method in ("crash", "unsupported"):
        method = method + ": " + (row.get("estimate_error") or "")[:80]
    return [
        row["case"] + (" (dd)" if row.get("data_dependent") else "") + (" (outside)" if row.get("outside") else ""),
        row["optimizer"],
        row["precision"],
        _mib(row.get("predicted")),
        _mib(row.get("measured")),
        _pct(row.get("error_pct")),
        _secs(row.get("estimate_s")),
        method,
        row.get("predicted_phase", "-") or "-",
        row.get("measured_phase", "-") or "-",
        _mib(row.get("rule_of_thumb")),
        _pct(row.get("rule_of_thumb_error_pct")),
        mt_cell,
        _pct(row.get("memtracker_error_pct")),
        _secs(row.get("memtracker_s")),
    ]


def _format_row(row: dict[str, Any]) -> str:
    return " | ".join(_format_cells(row)) + (f"  !! {'; '.join(row['errors'])}" if row.get("errors") else "")


def _stats(errors: list[float | None], total: int) -> dict[str, Any]:
    vals = [abs(e) for e in errors if e is not None]
    return {
        "n": total,
        "ok": len(vals),
        "crashes_or_missing": total - len(vals),
        "median_abs_error_pct": statistics.median(vals) if vals else None,
        "worst_abs_error_pct": max(vals) if vals else None,
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    measured = [r for r in rows if r.get("measured") is not None]
    out: dict[str, Any] = {}
    for label, pred in (
        ("ours", "error_pct"),
        ("rule_of_thumb", "rule_of_thumb_error_pct"),
        ("memtracker", "memtracker_error_pct"),
    ):
        out[label] = {}
        for group, sel in (("static_shapes", False), ("data_dependent", True)):
            sub = [r for r in measured if bool(r.get("data_dependent")) == sel]
            out[label][group] = _stats([r.get(pred) for r in sub], len(sub))
    # UnsupportedKernelError where the real step fails too is the right answer;
    # where the real step runs, it is a false refusal and counts as a crash
    refused = [r for r in rows if r.get("method") == "unsupported"]
    out["ours"]["unsupported_agreed"] = sum(1 for r in refused if r.get("measured") is None)
    out["ours"]["crashes"] = sum(1 for r in rows if r.get("method") == "crash") + sum(
        1 for r in refused if r.get("measured") is not None
    )
    out["memtracker"]["crashes"] = sum(1 for r in rows if r.get("memtracker_error"))
    out["ours"]["median_estimate_s"] = (
        statistics.median([r["estimate_s"] for r in rows if r.get("estimate_s") is not None])
        if any(r.get("estimate_s") is not None for r in rows)
        else None
    )
    out["memtracker"]["median_s"] = (
        statistics.median([r["memtracker_s"] for r in rows if r.get("memtracker_s") is not None])
        if any(r.get("memtracker_s") is not None for r in rows)
        else None
    )
    out["groundtruth_failures"] = len(rows) - len(measured)
    if any("reserved_error_pct" in r for r in rows):
        out["cuda_reserved"] = _stats([r.get("reserved_error_pct") for r in measured], len(measured))
        out["cuda_device"] = _stats([r.get("device_error_pct") for r in measured], len(measured))
    return out


def to_markdown(rows: list[dict[str, Any]], summary: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [f"# Accuracy benchmark ({meta['device']})", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += [
        "",
        "Error = (predicted - measured) / measured. Measured = peak of live tensor bytes "
        "over two real training steps (CPU: profiler allocation events + bytes live before; "
        "CUDA: max_memory_allocated). (dd) = data-dependent case; (outside) = built from a "
        "transformers config, not tuned on.",
        "",
    ]
    lines.append("| " + " | ".join(HEADER) + " |")
    lines.append("|" + "---|" * len(HEADER))
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in _format_cells(r)) + " |")
    errs = [r for r in rows if r.get("errors")]
    if errs:
        lines += ["", "## Errors", ""]
        lines += [f"- {r['case']}/{r['optimizer']}/{r['precision']}: {'; '.join(r['errors'])}" for r in errs]
    crashes = [r for r in rows if r.get("method") == "crash"]
    if crashes:
        lines += ["", "## Estimator crashes", ""]
        lines += [f"- {r['case']}/{r['optimizer']}/{r['precision']}: {r.get('estimate_error', '')}" for r in crashes]
    if any("reserved_error_pct" in r for r in rows):
        lines += [
            "",
            "## CUDA reserve and device use",
            "",
            "| case | optimizer | precision | pred reserved | max_memory_reserved | err | "
            "pred device | measured device | err |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['case']} | {r['optimizer']} | {r['precision']} | "
                f"{_mib(r.get('predicted_reserved'))} | {_mib(r.get('measured_reserved'))} | "
                f"{_pct(r.get('reserved_error_pct'))} | {_mib(r.get('predicted_device'))} | "
                f"{_mib(r.get('measured_device'))} | {_pct(r.get('device_error_pct'))} |"
            )
    lines += [
        "",
        "## Summary",
        "",
        "| estimator | group | n | ok | crashes/missing | median abs error | worst abs error |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in ("ours", "rule_of_thumb", "memtracker"):
        for group in ("static_shapes", "data_dependent"):
            s = summary[label][group]
            med = "-" if s["median_abs_error_pct"] is None else f"{s['median_abs_error_pct']:.1f}%"
            worst = "-" if s["worst_abs_error_pct"] is None else f"{s['worst_abs_error_pct']:.1f}%"
            lines.append(f"| {label} | {group} | {s['n']} | {s['ok']} | {s['crashes_or_missing']} | {med} | {worst} |")
    lines += [
        "",
        f"- estimator crashes: {summary['ours']['crashes']}; "
        f"refused with UnsupportedKernelError where the real step fails too: "
        f"{summary['ours'].get('unsupported_agreed', 0)}; "
        f"median estimate time: {_secs(summary['ours']['median_estimate_s'])} s",
        f"- MemTracker crashes: {summary['memtracker']['crashes']}; "
        f"median time: {_secs(summary['memtracker']['median_s'])} s",
        f"- ground-truth failures: {summary['groundtruth_failures']}",
    ]
    for key in ("cuda_reserved", "cuda_device"):
        if key in summary:
            s = summary[key]
            lines.append(f"- {key}: median abs error {s['median_abs_error_pct']}, worst {s['worst_abs_error_pct']}")
    return "\n".join(lines) + "\n"


def _meta(device: str, args: argparse.Namespace, elapsed: float) -> dict[str, Any]:
    meta = {
        "device": device,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "cases": args.cases or "all",
        "optimizers": ",".join(args.optimizers),
        "precisions": ",".join(args.precisions),
        "elapsed_s": round(elapsed, 1),
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
    }
    try:
        from nnmem_callbacks.probes.fingerprint import describe, fingerprint, fingerprint_hash

        kernels = fingerprint("cuda" if device == "cuda" else "cpu")
        meta["kernel_fingerprint"] = f"{fingerprint_hash(kernels)} ({describe(kernels)})"
    except ImportError:
        pass
    if args.note:
        meta["note"] = args.note
    if device == "cuda" and torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
    try:
        import transformers

        meta["transformers"] = transformers.__version__
        meta["gpt2_attn_implementation"] = zoo.GPT2_ATTN_IMPLEMENTATION
    except ImportError:
        pass
    return meta


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="python -m benchmarks.suites.accuracy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--cases",
        default=None,
        help=f"comma-separated subset of: {','.join(zoo.ZOO)} (default: all but the outside "
        f"cases {','.join(zoo.OUTSIDE_CASES)})",
    )
    parser.add_argument("--optimizers", default=None, help=f"comma-separated subset of: {','.join(zoo.OPTIMIZERS)}")
    parser.add_argument("--precisions", default=None, help=f"comma-separated subset of: {','.join(zoo.PRECISIONS)}")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"cases {','.join(QUICK_CASES)} x {','.join(QUICK_OPTIMIZERS)} x both precisions",
    )
    parser.add_argument("--no-memtracker", action="store_true", help="skip the MemTracker baseline")
    parser.add_argument(
        "--stem",
        default=None,
        help="the result's file name under benchmarks/results/accuracy/: the host "
        "(zen4-avx512, zen4-avx512_outside, ...)",
    )
    parser.add_argument("--note", default=None, help="a line for the results header (e.g. what the run is a subset of)")
    parser.add_argument(
        "--in-process", action="store_true", help="run every case in this process (faster; a native crash ends the run)"
    )
    parser.add_argument("--case-timeout", type=float, default=600.0, help="seconds per case in its child process")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--records", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--combos", default=None, help=argparse.SUPPRESS)
    return parser


def _split(value: str | None, default: Sequence[str], valid: Sequence[str], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()] if value else list(default)
    bad = [v for v in items if v not in valid]
    if bad:
        raise SystemExit(f"unknown {what}: {', '.join(bad)}; valid: {', '.join(valid)}")
    return items


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_flush_denormal(True)  # denormal gradients make fp32 CPU steps 10x slower; memory is unaffected
    if args.worker:
        return _worker(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available")
    cases = _split(args.cases, QUICK_CASES if args.quick else list(zoo.DEFAULT_CASES), list(zoo.ZOO), "cases")
    args.optimizers = _split(
        args.optimizers, QUICK_OPTIMIZERS if args.quick else list(zoo.OPTIMIZERS), list(zoo.OPTIMIZERS), "optimizers"
    )
    args.precisions = _split(args.precisions, zoo.PRECISIONS, zoo.PRECISIONS, "precisions")
    args.cases = ",".join(cases)
    stem = args.stem or (f"{args.device}_quick" if args.quick else args.device)

    print(" | ".join(HEADER), flush=True)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    if args.in_process and args.device == "cuda":
        print(
            "note: --in-process on cuda measures only the first combination in a fresh process; the later ones "
            "find the cuBLAS workspaces already allocated (see benchmarks.common.groundtruth)",
            flush=True,
        )
    for name in cases:
        if args.in_process:
            rows += run_case(
                name,
                args.optimizers,
                args.precisions,
                args.device,
                with_memtracker=not args.no_memtracker,
                log=lambda s: print(s, flush=True),
            )
        else:
            rows += run_case_isolated(
                name,
                args.optimizers,
                args.precisions,
                args.device,
                with_memtracker=not args.no_memtracker,
                timeout_s=args.case_timeout,
            )
        gc.collect()
    summary = summarize(rows)
    meta = _meta(args.device, args, time.perf_counter() - t0)
    md = to_markdown(rows, summary, meta)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{stem}.md").write_text(md)
    (RESULTS_DIR / f"{stem}.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1, default=str)
    )
    print()
    print(md[md.index("## Summary") :])
    print(f"wrote {RESULTS_DIR / (stem + '.md')} and .json", flush=True)
    return 0


def _worker(args: argparse.Namespace) -> int:
    combos = []
    for item in args.combos.split(","):
        opt_name, precision, skip = item.split(":")
        combos.append((opt_name, precision, tuple(x for x in skip.split("+") if x)))
    with open(args.records, "a") as fh:

        def sink(record: dict[str, Any]) -> None:
            fh.write(json.dumps(record, default=str) + "\n")
            fh.flush()

        run_case(
            args.worker,
            [],
            [],
            args.device,
            with_memtracker=not args.no_memtracker,
            log=lambda s: print(s, flush=True),
            sink=sink,
            combos=combos,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
