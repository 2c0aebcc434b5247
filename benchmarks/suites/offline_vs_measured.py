"""Offline CUDA predictions against a recorded GPU accuracy run (no GPU needed).

Reads the JSON that ``python -m benchmarks.suites.accuracy --device cuda`` wrote on a
GPU machine, re-estimates each case on this host for a CUDA target (CPU
kernels, the GPU's libraries from :mod:`nnmem_callbacks.hardware.cuda_tables`), and
prints predicted against measured tensor peak and device total.

Only the rows measured in a fresh process are fair truths (see
:mod:`benchmarks.common.groundtruth`): by default, the first combination of each case
in the file, which is what a run before the one-process-per-combination
change measured fresh. Rows whose recorded estimate fell back to the
closed-form method ran real layers on the device before the truth, which
created the user thread's cuBLAS workspace early; they are marked.

Its sibling :mod:`benchmarks.suites.offline_cuda` compares the offline estimate with
the estimate made on the GPU (issue 14); this one compares it with what the GPU
measured.

Usage::

    python -m benchmarks.suites.offline_vs_measured /path/to/zoo_cuda.json
    python -m benchmarks.suites.offline_vs_measured /path/to/zoo_cuda.json --cases mlp,gpt2 --all-rows
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any, Sequence

import torch

from benchmarks.common import zoo
from nnmem_callbacks.estimators.torch.estimator import estimate_training

__all__ = ["fresh_rows", "main"]

MiB = 2**20


def fresh_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first row of each case, in file order (the one its worker measured fresh).

    Example:
        >>> [r["optimizer"] for r in fresh_rows([{"case": "a", "optimizer": "x"}, {"case": "a", "optimizer": "y"},
        ...                                      {"case": "b", "optimizer": "z"}])]
        ['x', 'z']
    """
    seen: set[str] = set()
    first = []
    for row in rows:
        if row["case"] not in seen:
            seen.add(row["case"])
            first.append(row)
    return first


def _pct(predicted: float | None, measured: float | None) -> str:
    if not predicted or not measured:
        return "-"
    return f"{100 * (predicted - measured) / measured:+.1f}%"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.suites.offline_vs_measured",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("results", help="the JSON of a CUDA accuracy run")
    parser.add_argument("--cases", default=None, help="comma-separated subset of the cases in the file")
    parser.add_argument("--all-rows", action="store_true", help="every row, not only the fresh-process ones")
    parser.add_argument(
        "--device",
        default="cuda:h100",
        help="the CUDA target named to the estimator (default: cuda:h100, the recorded GPU)",
    )
    args = parser.parse_args(argv)
    with open(args.results) as handle:
        document = json.load(handle)
    rows = document["rows"] if args.all_rows else fresh_rows(document["rows"])
    if args.cases:
        wanted = {c.strip() for c in args.cases.split(",") if c.strip()}
        rows = [r for r in rows if r["case"] in wanted]
    meta = document.get("meta", {})
    from nnmem_callbacks.probes.fingerprint import cpu_isa_extensions, cpu_model_name

    print(
        f"recorded on {meta.get('gpu', '?')}, torch {meta.get('torch', '?')}; predicted here (no GPU) for {args.device} "
        f"with torch {torch.__version__} on {cpu_model_name()} ({', '.join(cpu_isa_extensions()) or 'baseline ISA'})"
    )
    print()
    print(
        "| case | optimizer | precision | pred MiB | workspaces MiB | meas MiB | err | pred device MiB | meas device MiB | err | note |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    warnings.simplefilter("ignore")
    for row in rows:
        case = zoo.get_case(row["case"])
        torch.manual_seed(0)
        model = case.make_model()
        batch = case.make_batch(case.batch_size, "cpu")
        try:
            est = estimate_training(
                model,
                batch,
                optimizer=zoo.OPTIMIZERS[row["optimizer"]],
                loss_fn=case.loss_fn,
                precision=row["precision"],
                device=args.device,
            )
        except Exception as error:  # noqa: BLE001 - one case failing does not end the table
            print(f"| {row['case']} | {row['optimizer']} | {row['precision']} | error: {type(error).__name__} |")
            continue
        note = "truth after a fallback ran real layers" if row.get("method") == "closed-form" else ""
        measured, device = row.get("measured"), row.get("measured_device")
        print(
            f"| {row['case']} | {row['optimizer']} | {row['precision']} | {est.peak_bytes / MiB:.1f} | "
            f"{est.breakdown['workspaces'] / MiB:.1f} | {(measured or 0) / MiB:.1f} | {_pct(est.peak_bytes, measured)} | "
            f"{est.device_bytes / MiB:.1f} | {(device or 0) / MiB:.1f} | {_pct(est.device_bytes, device)} | {note} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
