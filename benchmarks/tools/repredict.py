"""Re-runs only the estimates of a committed result's cases and says, per case, whether they predict the same bytes.

    python -m benchmarks.tools.repredict benchmarks/results/accuracy/zen4-avx512.json
    TF_ENABLE_ONEDNN_OPTS=0 python -m benchmarks.tools.repredict benchmarks/results/keras_tensorflow_cpu/zen4-avx512_onednn0.json
    python -m benchmarks.tools.repredict benchmarks/results/keras_tensorflow_cpu/zen4-avx512_onednn1.json --cases mlp,lstm

Nothing is measured: no ground truth, no baselines. The check that a change to the code (a refactoring, a
move) leaves every estimate as it was, to the byte, against the results the README quotes:

* **PyTorch accuracy** (:mod:`benchmarks.suites.accuracy`, CPU results): each case runs in a fresh
  process through the suite's own worker with its ground-truth stage skipped, every optimizer and
  precision of the committed rows, kernel probes measured afresh into one empty cache (as the committed
  runs started). Compared: ``predicted`` (the tensor peak) and the estimator's ``method``.
* **Keras on TensorFlow** (:mod:`benchmarks.suites.keras_accuracy`, ``--backend tensorflow``): each case
  is estimated in a fresh process in the result's oneDNN mode with an empty probe cache, the step
  check's real runs replaced by the committed row's (:func:`benchmarks.tools.tf_repredict.worker`, the
  screen's worker). Compared: ``predicted_bytes`` and ``predicted_upper_bytes``.

Predictions depend on the host's kernels (probes measure them), so a result is compared only on a host
of its kind: the PyTorch result's kernel fingerprint must equal this host's, and a TensorFlow result's
CPU, instruction set and ``ONEDNN_MAX_CPU_ISA``/``ATEN_CPU_CAPABILITY`` caps must equal this host's
(``--any-host`` compares anyway, for a look, not a verdict). A row that failed when it was committed
is skipped. Prints one JSON line per case as it goes and a table at the end.

Exit status: 0 when every compared case predicts the committed bytes, 1 when any differs or fails,
2 for a usage error or a result of another host.

The kernel probes measure the host's kernels afresh in every run, and on TensorFlow a few of them move by
one allocator unit (256 bytes) from one run to the next with the same code (seen on EfficientNet-B0,
ResNet-50 and the Conv1D + BiLSTM text model). ``--retries N`` estimates a case that differs up to N more
times and counts it as matching when one of them gives the committed bytes (the table says on which try): a
change to the code moves every try; probe noise does not. The default, 0, is strict.

Known limitations:
    * A TensorFlow row whose step check now asks for another batch, or for copies that start otherwise
      than the committed ones, cannot be re-estimated with the committed runs: it fails (exit 1) with the
      reason.
    * The PyTorch data-dependent case falls back to a closed form whose activation probe runs real layers;
      it is compared like the others.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.common.paths import ROOT

__all__ = ["result_kind", "host_mismatch", "compare_torch", "compare_tensorflow", "to_markdown", "main"]


def result_kind(result: dict[str, Any]) -> str | None:
    """``"torch"`` for a PyTorch CPU accuracy result, ``"tensorflow"`` for a Keras/TensorFlow one, else ``None``.

    Example:
        >>> result_kind({"meta": {"device": "cpu"}, "rows": [{"case": "mlp", "optimizer": "adam", "precision": "32-true"}]})
        'torch'
        >>> result_kind({"meta": {}, "rows": [{"case": "mlp", "backend": "tensorflow"}]})
        'tensorflow'
        >>> result_kind({"meta": {"device": "cuda"}, "rows": [{"case": "mlp", "optimizer": "adam", "precision": "32-true"}]})
    """
    rows = result.get("rows") or []
    meta = result.get("meta") or {}
    if rows and all("optimizer" in r and "precision" in r for r in rows) and meta.get("device") == "cpu":
        return "torch"
    if rows and any(r.get("backend") == "tensorflow" for r in rows):
        return "tensorflow"
    return None


def host_mismatch(kind: str, meta: dict[str, Any], here: dict[str, Any]) -> str | None:
    """Why a result of ``kind`` was not made on a host like this one (``None`` when it was).

    ``here`` holds this host's ``kernel_fingerprint`` (PyTorch) or its :func:`host_fingerprint` fields
    (TensorFlow).

    Example:
        >>> host_mismatch("torch", {"kernel_fingerprint": "abc (...)"}, {"kernel_fingerprint": "abc (...)"})
        >>> host_mismatch("tensorflow", {"cpu": "AMD EPYC", "isa": "avx2"}, {"cpu": "AMD EPYC", "isa": "avx2,avx512f"})
        "isa: the result's 'avx2', this host's 'avx2,avx512f'"
    """
    if kind == "torch":
        theirs = str(meta.get("kernel_fingerprint", "")).split(" ")[0]
        ours = str(here.get("kernel_fingerprint", "")).split(" ")[0]
        if theirs != ours:
            return f"kernel fingerprint: the result's {meta.get('kernel_fingerprint')}, this host's {here.get('kernel_fingerprint')}"
        return None
    from nnmem_callbacks.probes.fingerprint import CPU_ENV_VARS

    for field in ("cpu", "isa", *CPU_ENV_VARS):
        if meta.get(field) != here.get(field):
            return f"{field}: the result's {meta.get(field)!r}, this host's {here.get(field)!r}"
    return None


def compare_torch(committed: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """One PyTorch row: the committed and the new predicted peak (and method), and whether they match.

    Example:
        >>> compare_torch({"case": "mlp", "optimizer": "adam", "precision": "32-true", "predicted": 10, "method": "trace"},
        ...               {"predicted": 12, "method": "trace"})["match"]
        False
    """
    line = {
        "case": f"{committed['case']} {committed['optimizer']} {committed['precision']}",
        "committed_bytes": committed.get("predicted"),
        "now_bytes": now.get("predicted"),
        "committed_method": committed.get("method"),
        "now_method": now.get("method"),
    }
    line["match"] = line["committed_bytes"] == line["now_bytes"] and line["committed_method"] == line["now_method"]
    if now.get("estimate_error"):
        line["error"] = now["estimate_error"]
    return line


def compare_tensorflow(committed: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """One TensorFlow row: the committed and the new prediction and upper bound, and whether both match.

    Example:
        >>> compare_tensorflow({"case": "mlp", "predicted_bytes": 5, "predicted_upper_bytes": 9},
        ...                    {"predicted_bytes": 5, "predicted_upper_bytes": 9})["match"]
        True
    """
    line = {
        "case": committed["case"],
        "committed_bytes": committed.get("predicted_bytes"),
        "now_bytes": now.get("predicted_bytes"),
        "committed_upper_bytes": committed.get("predicted_upper_bytes"),
        "now_upper_bytes": now.get("predicted_upper_bytes"),
    }
    line["match"] = (
        line["committed_bytes"] == line["now_bytes"] and line["committed_upper_bytes"] == line["now_upper_bytes"]
    )
    if now.get("error_text"):
        line["error"] = now["error_text"]
    return line


def _torch_case(case: str, rows: list[dict[str, Any]], cache: str, timeout: float) -> list[dict[str, Any]]:
    """Runs the accuracy suite's worker for one case, the ground truth skipped; the rows it wrote."""
    combos = ",".join(f"{r['optimizer']}:{r['precision']}:groundtruth" for r in rows)
    with tempfile.TemporaryDirectory(prefix="nnmem-repredict-") as tmp:
        records = os.path.join(tmp, "records.jsonl")
        command = [
            sys.executable,
            "-m",
            "benchmarks.suites.accuracy",
            "--worker",
            case,
            "--records",
            records,
            "--device",
            "cpu",
            "--no-memtracker",
            "--combos",
            combos,
        ]
        env = dict(os.environ, NNMEM_CACHE_DIR=cache)
        try:
            subprocess.run(
                command,
                env=env,
                cwd=str(ROOT),
                timeout=timeout,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pass
        new = {}
        if os.path.exists(records):
            with open(records, encoding="utf-8") as handle:
                for text in handle:
                    record = json.loads(text)
                    if "_row" in record:
                        row = record["_row"]
                        new[(row["optimizer"], row["precision"])] = row
    return [
        compare_torch(r, new.get((r["optimizer"], r["precision"]), {"estimate_error": "the worker wrote no row"}))
        for r in rows
    ]


def _tensorflow_case(row: dict[str, Any], onednn: str, timeout: float) -> dict[str, Any]:
    """Re-estimates one TensorFlow row in a fresh process (empty probe cache, the committed check runs)."""
    from benchmarks.common.isolated import run_worker
    from benchmarks.common.keras_env import mode_environment

    keep = {
        k: row[k]
        for k in ("step_check_runs", "step_check_batch_size", "allocator", "step_check_optimizer_built")
        if k in row
    }
    env = dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONWARNINGS="ignore",
        NNMEM_CACHE_DIR=tempfile.mkdtemp(prefix="nnmem-repredict-cache-"),
        **mode_environment(onednn),
    )
    new = run_worker(
        "benchmarks.tools.tf_repredict", ["--worker", row["case"], "--row", json.dumps(keep)], env=env, timeout=timeout
    )
    return compare_tensorflow(row, new)


def to_markdown(lines: list[dict[str, Any]], header: dict[str, Any]) -> str:
    """The comparison as a table, with the count of cases that match to the byte.

    Example:
        >>> print(to_markdown([{"case": "a", "committed_bytes": 3, "now_bytes": 3, "match": True}], {"result": "r.json"}))
        # Re-predicted: r.json
        <BLANKLINE>
        | case | committed bytes | now bytes | difference | match |
        |---|---:|---:|---:|---|
        | a | 3 | 3 | 0 | yes |
        <BLANKLINE>
        1 of 1 cases predict the committed bytes.
    """
    out = [f"# Re-predicted: {header.get('result', '?')}", ""]
    out += [f"- {key}: {value}" for key, value in header.items() if key != "result"]
    if len(out) > 2:
        out.append("")
    upper = any("committed_upper_bytes" in line for line in lines)
    columns = ["case", "committed bytes", "now bytes", "difference"]
    columns += ["committed upper", "now upper"] if upper else []
    out += ["| " + " | ".join(columns + ["match"]) + " |", "|---|" + "---:|" * (len(columns) - 1) + "---|"]

    def cell(value: Any) -> str:
        return "-" if value is None else f"{value}"

    for line in lines:
        a, b = line.get("committed_bytes"), line.get("now_bytes")
        cells = [line["case"], cell(a), cell(b), cell(b - a if isinstance(a, int) and isinstance(b, int) else None)]
        if upper:
            cells += [cell(line.get("committed_upper_bytes")), cell(line.get("now_upper_bytes"))]
        verdict = "yes" if line["match"] else "NO" + (f": {line['error'][:120]}" if line.get("error") else "")
        if line.get("matched_on_try"):
            verdict += f" (try {line['matched_on_try']}; the first gave {line.get('first_try_bytes', '?')})"
        out.append("| " + " | ".join(cells + [verdict]) + " |")
    matched = sum(bool(line["match"]) for line in lines)
    out += ["", f"{matched} of {len(lines)} cases predict the committed bytes."]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tools.repredict", description=__doc__.splitlines()[0])
    parser.add_argument(
        "result",
        help="a committed result: benchmarks/results/accuracy/<host>.json or "
        "benchmarks/results/keras_tensorflow_cpu/<host>_onednn<0|1>.json",
    )
    parser.add_argument("--cases", default="", help="comma-separated cases (default: every row)")
    parser.add_argument("--any-host", action="store_true", help="compare even if the result was made on another host")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per case's process")
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    parser.add_argument(
        "--retries",
        type=int,
        default=0,
        help="estimate a case that differs up to N more times; it matches if one try gives the "
        "committed bytes (probe noise), default 0",
    )
    args = parser.parse_args(argv)
    with open(args.result, encoding="utf-8") as handle:
        result = json.load(handle)
    kind = result_kind(result)
    if kind is None:
        parser.error(f"{args.result} is neither a PyTorch CPU accuracy result nor a Keras/TensorFlow one")
    meta = result.get("meta", {})
    rows = [r for r in result["rows"] if not r.get("error_text")]
    if kind == "tensorflow":
        rows = [r for r in rows if r.get("backend") == "tensorflow" and "predicted_bytes" in r]
    wanted = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(wanted) - {r["case"] for r in rows})
    if unknown:
        parser.error(
            f"case(s) not in {args.result}: {', '.join(unknown)}; valid: {', '.join(sorted({r['case'] for r in rows}))}"
        )
    rows = [r for r in rows if not wanted or r["case"] in wanted]

    if kind == "torch":
        from nnmem_callbacks.probes.fingerprint import describe, fingerprint, fingerprint_hash

        kernels = fingerprint("cpu")
        here: dict[str, Any] = {"kernel_fingerprint": f"{fingerprint_hash(kernels)} ({describe(kernels)})"}
    else:
        from benchmarks.common.keras_env import host_fingerprint

        here = host_fingerprint()
    mismatch = host_mismatch(kind, meta, here)
    if mismatch and not args.any_host:
        print(
            f"{args.result} was made on another kind of host ({mismatch}); its predictions depend on that host's "
            "kernels. Compare it on its own host, or pass --any-host for a look.",
            file=sys.stderr,
        )
        return 2
    onednn = str(meta.get("TF_ENABLE_ONEDNN_OPTS", "0"))
    if kind == "tensorflow" and os.environ.get("TF_ENABLE_ONEDNN_OPTS", onednn) != onednn:
        print(
            f"note: the result was made with TF_ENABLE_ONEDNN_OPTS={onednn}; its workers run in that mode",
            file=sys.stderr,
        )
    started = time.perf_counter()
    lines: list[dict[str, Any]] = []
    if args.retries < 0:
        parser.error(f"--retries must be 0 or more, got {args.retries}")
    if kind == "torch":
        cache = tempfile.mkdtemp(prefix="nnmem-repredict-cache-")  # cold, as the committed runs started
        for case in dict.fromkeys(r["case"] for r in rows):
            case_rows = [r for r in rows if r["case"] == case]
            case_lines = _torch_case(case, case_rows, cache, args.timeout)
            for attempt in range(2, args.retries + 2):
                if all(line["match"] for line in case_lines):
                    break
                again = _torch_case(case, case_rows, tempfile.mkdtemp(prefix="nnmem-repredict-cache-"), args.timeout)
                for index, (old, new) in enumerate(zip(case_lines, again)):
                    if new["match"] and not old["match"]:
                        case_lines[index] = {**new, "matched_on_try": attempt, "first_try_bytes": old["now_bytes"]}
            for line in case_lines:
                lines.append(line)
                print(json.dumps(line), flush=True)
    else:
        for row in rows:
            line = _tensorflow_case(row, onednn, args.timeout)
            for attempt in range(1, args.retries + 1):
                if line["match"]:
                    break
                again = _tensorflow_case(row, onednn, args.timeout)
                if again["match"]:
                    line = {
                        **again,
                        "matched_on_try": attempt + 1,
                        "first_try_bytes": line["now_bytes"],
                        "first_try_upper_bytes": line.get("now_upper_bytes"),
                    }
            lines.append(line)
            print(json.dumps(line), flush=True)
    header = {"result": args.result, "kind": kind, "elapsed_s": round(time.perf_counter() - started, 1)}
    if args.retries:
        header["retries"] = args.retries
    if mismatch:
        header["another host"] = mismatch
    if kind == "tensorflow":
        header["TF_ENABLE_ONEDNN_OPTS"] = onednn
    text = to_markdown(lines, header)
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    return 0 if lines and all(line["match"] for line in lines) else 1


if __name__ == "__main__":
    raise SystemExit(main())
