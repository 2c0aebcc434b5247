"""The Keras callback on a real device: what it logs each epoch for models fitted one after another in one process.

    KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false \\
        python -m benchmarks.suites.keras_callback_device --cases conv1d,unet_small,transformer --epochs 3 --host-tag h100_growth

Each case is fitted with :class:`nnmem_callbacks.keras.MemoryBudgetCallback` in the
same process, in the order given, as a user would train several models in a notebook.
Every epoch's logged figures are kept: the measured peak, the prediction it is compared
with, the relative error, and whether the meter's reading is the training step's own
peak or a floor (JAX's ``peak_bytes_in_use`` cannot be reset: XLA's autotuning at
compile time and earlier models can hold it above anything a later step reaches).

What it checks, per epoch: the logs keys are present, and no epoch reports a peak
below what it measured as in use (a reading kept from an earlier model or a compilation
shows as a peak far above the prediction with ``exact`` true; the JSON keeps the raw
numbers to look for that).

Writes ``benchmarks/results/keras_callback_<backend>_<device>/<host-tag>.{json,md}`` (``<host-tag>`` defaults
to the device, ``cpu`` or ``gpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from benchmarks.common.paths import RESULTS
from benchmarks.tools.provenance import commit_stamp, write_result

__all__ = ["fit_case", "device_description", "to_markdown", "main"]


def fit_case(name: str, epochs: int, steps: int) -> list[dict[str, Any]]:
    """Fits one benchmark case for ``epochs`` epochs of ``steps`` batches; the callback's rows with the logs keys."""
    import numpy as np

    from benchmarks.common.keras_cases import build_case
    from nnmem_callbacks.keras import MemoryBudgetCallback

    model, x, y, batch = build_case(name)
    repeat = (steps,) + (1,) * (np.ndim(x) - 1)
    xs, ys = np.tile(x, repeat), np.tile(y, (steps,) + (1,) * (np.ndim(y) - 1))
    callback = MemoryBudgetCallback(batch_size=batch)
    started = time.perf_counter()
    history = model.fit(xs, ys, batch_size=batch, epochs=epochs, verbose=0, callbacks=[callback])
    seconds = time.perf_counter() - started
    names = callback.metric_names
    rows = []
    for epoch, row in enumerate(callback.measurements):
        keys = [names.measured, names.predicted, names.relative_error] if names else []
        rows.append(
            {
                "case": name,
                "batch_size": batch,
                "epoch": epoch,
                "kind": row.get("kind"),
                "measured_bytes": row.get("measured_bytes"),
                "predicted_bytes": row.get("predicted_bytes"),
                "relative_error": row.get("relative_error"),
                "exact": row.get("exact"),
                "logs_keys_present": all(k in history.history and len(history.history[k]) == epochs for k in keys),
                "failure": callback.failure,
                "meter_samples": getattr(callback._meter, "samples", None),  # noqa: SLF001 - the JAX sampler's count
                "fit_s": round(seconds, 1),
            }
        )
    return rows


def device_description() -> str:
    from benchmarks.common.keras_truth import device_name

    return device_name()


def to_markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# The Keras callback on {meta['device']} ({meta['backend']})", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "truth_rows"]
    lines += [
        "",
        "Models fitted one after another in one process. Relative error = (measured - predicted) / predicted, as "
        "the callback logs it. `exact` = the reading is the training step's own peak (else a floor: the largest "
        "bytes in use sampled, at batch ends and, for JAX, by the meter's background sampler).",
        "",
    ]
    truth = meta.get("truth_rows") or {}
    header = ["case", "batch", "epoch", "meter", "measured MiB", "predicted MiB", "logged error", "exact"]
    if truth:
        lines += [
            f"`truth` = the same case's peak measured in fresh processes by `{meta.get('truth_file')}` (median); "
            "`reading vs truth` = (measured - truth) / truth. The truth is two `train_on_batch` steps in a fresh "
            "process; a fit also holds the batches its iterator has put on the device, and each process compiles "
            "(JAX: autotunes) its own program, which the callback's own prediction follows and the truth's need not.",
            "",
        ]
        header += ["samples", "truth MiB", "reading vs truth"]
    header.append("logs keys every epoch")
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [
            r["case"],
            r["batch_size"],
            r["epoch"],
            r["kind"],
            "-" if r["measured_bytes"] is None else f"{r['measured_bytes'] / 2**20:.1f}",
            "-" if r["predicted_bytes"] is None else f"{r['predicted_bytes'] / 2**20:.1f}",
            "-" if r["relative_error"] is None else f"{r['relative_error'] * 100:+.1f}%",
            "yes" if r["exact"] else "no (floor)",
        ]
        if truth:
            true = truth.get(r["case"])
            cells += [
                "-" if r.get("meter_samples") is None else r["meter_samples"],
                "-" if true is None else f"{true / 2**20:.1f}",
                "-"
                if true is None or r["measured_bytes"] is None
                else f"{(r['measured_bytes'] - true) / true * 100:+.1f}%",
            ]
        cells.append("yes" if r["logs_keys_present"] else "NO")
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="conv1d,unet_small,transformer")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="batches per epoch")
    parser.add_argument(
        "--out",
        default=str(RESULTS),
        help="the results folder (the run goes to OUT/keras_callback_<backend>_<device>/)",
    )
    parser.add_argument("--host-tag", default="", help="the result's file name: the host and mode (h200_growth, ...)")
    parser.add_argument("--render", metavar="JSON", help="rewrite the Markdown beside a committed JSON result")
    parser.add_argument(
        "--truth",
        metavar="JSON",
        help="with --render: a keras_accuracy result on the same device, to compare readings with",
    )
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as handle:
            saved = json.load(handle)
        if args.truth:
            with open(args.truth, encoding="utf-8") as handle:
                measured = json.load(handle)
            saved["meta"]["truth_file"] = os.path.basename(args.truth)
            saved["meta"]["truth_rows"] = {
                r["case"]: r["measured_bytes"] for r in measured["rows"] if r.get("measured_bytes") is not None
            }
        with open(os.path.splitext(args.render)[0] + ".md", "w", encoding="utf-8") as handle:
            handle.write(to_markdown(saved["rows"], saved["meta"]))
        return 0
    import keras

    from benchmarks.common.keras_cases import CASES

    names = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; valid cases: {', '.join(CASES)}")
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for name in names:
        for row in fit_case(name, args.epochs, args.steps):
            rows.append(row)
            print(json.dumps(row), flush=True)
    device = device_description()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": device,
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "python": sys.version.split()[0],
        "cases": args.cases,
        "epochs": args.epochs,
        "steps per epoch": args.steps,
        "XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "(default)"),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "commit": commit_stamp(),
    }
    where = "cpu" if device == "cpu" else "gpu"
    out_dir = os.path.join(args.out, f"keras_callback_{meta['backend']}_{where}")
    write_result(out_dir, args.host_tag or where, {"meta": meta, "rows": rows}, to_markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
