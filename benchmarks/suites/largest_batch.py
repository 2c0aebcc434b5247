"""Largest-batch benchmark: is the predicted largest batch safe and tight on a capped GPU, and how fast is it found?

Usage::

    python -m benchmarks.suites.largest_batch [--models resnet50_224,hf_bert,gpt2,unet] [--batch-size 256] [--cap-gib 12]
                                       [--optimizer sgd_momentum] [--precision 32-true] [--no-finder] [--dry-run]

For each zoo model, on a card capped to ``--cap-gib`` with
``torch.cuda.set_per_process_memory_fraction`` (the allocator then refuses to
reserve more, exactly as on a smaller card):

1. **nnmem**: ``estimate_training`` at the requested batch, then
   ``MemoryEstimate.verify_max_batch_size(include_reserve=True)`` (what
   ``make_plan(policy="shrink", include_reserve=True, margin=0)`` runs when the
   requested batch does not fit): the largest batch whose predicted allocator
   reserve fits, checked by a direct estimate at that batch (stepping down when
   it does not fit). Timed, estimation included.
2. **Safe**: two training steps at that batch, in a fresh process under the
   cap, must run without an out-of-memory error; ``max_memory_reserved`` is
   reported as a share of the cap.
3. **Tight**: two steps at 1.10x that batch should not fit (for most models).
4. **BatchSizeFinder**: Lightning's ``Tuner.scale_batch_size(mode="binsearch")``
   on the same capped card, in a fresh process, timed; its choice is then run
   like the others.

Every GPU run is a fresh process (``--worker``), so that the allocator cache,
the cuBLAS workspaces and the CUDA context start as in a real run.

Without a CUDA GPU the benchmark refuses, unless ``--dry-run``: then it runs
everything but the GPU parts (estimation on CPU kernels for a CUDA target,
verification, the table), and marks the GPU columns ``dry run``.

Writes ``benchmarks/results/largest_batch/<stem>.md`` and ``.json`` (``--stem``, the GPU's
name such as ``h200``, default ``gpu``; ``--out-dir`` to write elsewhere).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from benchmarks.common import zoo
from benchmarks.common.paths import result_dir

__all__ = [
    "RESULTS_DIR",
    "CASES",
    "DEFAULT_MODELS",
    "TIGHT_FACTOR",
    "NoGPUError",
    "get_case",
    "case_names",
    "estimate_largest",
    "train_steps",
    "batch_size_finder",
    "run_model",
    "to_markdown",
    "build_parser",
    "main",
]

RESULTS_DIR = result_dir("largest_batch")
#: Cases of this benchmark beside the zoo's: the zoo keeps images small for CPU runs; a card-sized
#: question needs the usual 224x224 ImageNet input (the issue's reference figures are for it).
CASES = {
    "resnet50_224": zoo.ZooCase("resnet50_224", zoo.make_resnet50, zoo.image_batch(3, 224, 1000), 256, zoo.xent_loss),
}
DEFAULT_MODELS = ("resnet50_224", "hf_bert", "gpt2", "unet")
#: The batch above the predicted largest that should no longer fit (a tight answer).
TIGHT_FACTOR = 1.10
GiB = 2**30
MiB = 2**20


class NoGPUError(RuntimeError):
    """The benchmark's GPU part was asked for on a machine without CUDA."""


def get_case(name: str) -> zoo.ZooCase:
    """A case of :data:`CASES` or of the zoo."""
    return CASES[name] if name in CASES else zoo.get_case(name)


def case_names() -> list[str]:
    return [*CASES, *zoo.case_names()]


# ---------------------------------------------------------------------------------------------------------------
# estimation (this process; CPU kernels for a CUDA target when there is no GPU)
# ---------------------------------------------------------------------------------------------------------------


def estimate_largest(
    case: zoo.ZooCase, batch_size: int, cap_bytes: int, optimizer: str, precision: str
) -> dict[str, Any]:
    """nnmem's largest batch under ``cap_bytes`` of allocator reserve, verified by a direct estimate, timed."""
    from nnmem_callbacks import estimate_training

    model = case.make_model()
    batch = case.make_batch(batch_size, "cpu")
    started = time.perf_counter()
    estimate = estimate_training(
        model, batch, optimizer=zoo.OPTIMIZERS[optimizer], loss_fn=case.loss_fn, precision=precision, device="cuda"
    )
    estimated = time.perf_counter() - started
    # the cap limits what the allocator reserves; the estimate's overhead (CUDA context and libraries) is outside
    # it, the cuBLAS/cuDNN workspaces are inside (allocations of the trace, in the replayed reserve)
    context = estimate.overhead_bytes
    # what make_plan(policy="shrink", include_reserve=True, margin=0) checks when the requested batch does not fit,
    # without capping the answer at the requested batch
    verification = estimate.verify_max_batch_size(cap_bytes + context, include_reserve=True)
    seconds = time.perf_counter() - started
    chosen = verification.batch_size
    return {
        "model": case.name,
        "requested": batch_size,
        "fits_as_requested": estimate.device_bytes <= cap_bytes + context,
        "lines_batch": verification.predicted_batch_size,
        "chosen": chosen,
        "verified": verification.verified,
        "verification": verification.to_dict(),
        "predicted_reserved": estimate.reserved_bytes_at(chosen) if chosen else None,
        "reserve_model": "replay" if estimate.allocation_log is not None else "ratio",
        "estimate_seconds": round(estimated, 2),
        "seconds": round(seconds, 2),
        "notes": list(estimate.notes),
    }


# ---------------------------------------------------------------------------------------------------------------
# GPU runs, each in a fresh process
# ---------------------------------------------------------------------------------------------------------------


def _cap(cap_bytes: int) -> int:
    """Caps this process's CUDA allocator at ``cap_bytes``; returns the device's total memory."""
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if cap_bytes > total:
        raise ValueError(f"the cap ({cap_bytes / GiB:.1f} GiB) is above the GPU's memory ({total / GiB:.1f} GiB)")
    torch.cuda.set_per_process_memory_fraction(cap_bytes / total)
    return total


def train_steps(
    case_name: str,
    batch_size: int,
    cap_bytes: int | None,
    optimizer: str,
    precision: str,
    steps: int = 2,
    device: str = "cuda",
) -> dict[str, Any]:
    """``steps`` real training steps at ``batch_size`` (under the cap on CUDA): OOM or the allocator's peaks."""
    case = get_case(case_name)
    if device == "cuda" and cap_bytes is not None:
        _cap(cap_bytes)
    torch.manual_seed(0)
    model = case.make_model().to(device)
    opt = zoo.OPTIMIZERS[optimizer](model.parameters())
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    record: dict[str, Any] = {"batch": batch_size, "oom": False}
    try:
        batch = case.make_batch(batch_size, device)
        for _ in range(steps):
            with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
                loss = case.loss_fn(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError as error:
        record.update(oom=True, error=str(error).splitlines()[0][:200])
    if device == "cuda":
        record.update(max_allocated=torch.cuda.max_memory_allocated(), max_reserved=torch.cuda.max_memory_reserved())
        if cap_bytes:
            record["reserved_share_of_cap"] = round(record["max_reserved"] / cap_bytes, 4)
    return record


def batch_size_finder(
    case_name: str, cap_bytes: int | None, optimizer: str, precision: str, device: str = "cuda", max_val: int = 8192
) -> dict[str, Any]:
    """Lightning's BatchSizeFinder (``Tuner.scale_batch_size``, binsearch) on the capped card, timed.

    ``device="cpu"`` (no cap, nothing runs out of memory: the search ends at
    ``max_val``) only checks the wiring.
    """
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner
    from torch.utils._pytree import tree_map
    from torch.utils.data import DataLoader, Dataset

    case = get_case(case_name)
    if device == "cuda" and cap_bytes is not None:
        _cap(cap_bytes)
    sample = tree_map(lambda t: t[0], case.make_batch(1, "cpu"))

    class Repeated(Dataset):
        """One sample, many times: the finder needs a dataset longer than any batch it tries."""

        def __len__(self) -> int:
            return 1 << 20

        def __getitem__(self, index: int) -> Any:
            return sample

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = case.make_model()
            self.batch_size = 2

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return case.loss_fn(self.model, batch)

        def configure_optimizers(self) -> Any:
            return zoo.OPTIMIZERS[optimizer](self.parameters())

        def train_dataloader(self) -> DataLoader:
            return DataLoader(Repeated(), batch_size=self.batch_size, num_workers=0)

    torch.manual_seed(0)
    module = Module()
    with tempfile.TemporaryDirectory() as root:  # the finder saves and restores a checkpoint there
        trainer = pl.Trainer(
            accelerator="gpu" if device == "cuda" else "cpu",
            devices=1,
            max_epochs=1,
            precision=precision,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        started = time.perf_counter()
        # Lightning's defaults otherwise: steps_per_trial=3, init_val=2, margin=0.05 (binsearch), max_val=8192
        chosen = Tuner(trainer).scale_batch_size(module, mode="binsearch", max_val=max_val)
        seconds = time.perf_counter() - started
    return {"chosen": int(chosen) if chosen else 0, "seconds": round(seconds, 2), "lightning": pl.__version__}


def _run_worker(kind: str, payload: dict[str, Any], timeout: int = 900) -> dict[str, Any]:
    """Runs ``kind`` in a fresh Python process and returns its JSON record."""
    from benchmarks.common.isolated import run_worker

    record = run_worker(
        "benchmarks.suites.largest_batch", ["--worker", kind, "--payload", json.dumps(payload)], timeout=timeout
    )
    if "error_text" in record:
        return {"failed": True, "error": record["error_text"]}
    return record


def _worker(kind: str, payload: dict[str, Any]) -> int:
    if kind == "train":
        record = train_steps(**payload)
    elif kind == "finder":
        record = batch_size_finder(**payload)
    else:
        raise ValueError(f"unknown worker {kind!r}; valid: 'train', 'finder'")
    print(json.dumps(record))
    return 0


# ---------------------------------------------------------------------------------------------------------------
# one model, the table
# ---------------------------------------------------------------------------------------------------------------


def run_model(name: str, args: argparse.Namespace, cap_bytes: int) -> dict[str, Any]:
    """Estimation, verification and (unless a dry run) the GPU runs of one model."""
    row = estimate_largest(get_case(name), args.batch_size, cap_bytes, args.optimizer, args.precision)
    if args.dry_run:
        row["gpu"] = "dry run"
        return row
    common = {"case_name": name, "cap_bytes": cap_bytes, "optimizer": args.optimizer, "precision": args.precision}
    if row["chosen"]:
        row["run"] = _run_worker("train", dict(common, batch_size=row["chosen"]))
        above = max(math.ceil(row["chosen"] * TIGHT_FACTOR), row["chosen"] + 1)
        row["run_above"] = _run_worker("train", dict(common, batch_size=above))
    if not args.no_finder:
        finder = _run_worker("finder", common)
        row["finder"] = finder
        if finder.get("chosen"):
            finder["run"] = _run_worker("train", dict(common, batch_size=finder["chosen"]))
    return row


def _share(record: dict[str, Any] | None) -> str:
    if not record:
        return "-"
    if record.get("failed"):
        return f"failed ({record.get('error', '')[:60]})"
    if record.get("oom"):
        return "OOM"
    share = record.get("reserved_share_of_cap")
    return f"ok, {share:.1%} of cap" if share is not None else "ok"


def to_markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The results table."""
    lines = [
        "# Largest batch under a capped GPU: nnmem (verified) vs Lightning's BatchSizeFinder",
        "",
        f"{meta['device']}; cap {meta['cap_gib']} GiB (`torch.cuda.set_per_process_memory_fraction`); requested batch "
        f"{meta['batch_size']}, {meta['optimizer']}, {meta['precision']}; torch {meta['torch']}; generated by "
        f"`{meta['command']}` on {meta['date']}.",
        "",
        "nnmem: `estimate_training` + `verify_max_batch_size(include_reserve=True)`, the largest batch whose "
        "replayed allocator reserve fits, checked by a direct estimate at that batch. `safe`: two steps at that batch "
        f"in a fresh capped process; `tight`: {TIGHT_FACTOR:.2f}x that batch should not fit.",
        "",
        "| model | lines | verified | nnmem s | run at nnmem's batch | run at x1.10 | finder batch | finder s | run at finder's batch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        finder = row.get("finder") or {}
        dry = row.get("gpu") == "dry run"
        cells = [
            row["model"],
            str(row["lines_batch"]),
            f"{row['chosen']}" + ("" if row["verified"] else " (unverified)"),
            f"{row['seconds']:.1f}",
            "dry run" if dry else _share(row.get("run")),
            "dry run" if dry else _share(row.get("run_above")),
            "dry run" if dry else (str(finder.get("chosen", "-")) if not finder.get("failed") else "failed"),
            "dry run" if dry else (f"{finder['seconds']:.1f}" if "seconds" in finder else "-"),
            "dry run" if dry else _share(finder.get("run")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    runs = [row for row in rows if row.get("run")]
    if runs:
        safe = sum(1 for row in runs if not row["run"].get("oom") and not row["run"].get("failed"))
        tight = sum(1 for row in runs if row.get("run_above", {}).get("oom"))
        lines += [
            "",
            f"Safe: {safe} of {len(runs)} models trained at nnmem's batch without OOM; tight: "
            f"{TIGHT_FACTOR:.2f}x that batch ran out of memory for {tight} of {len(runs)}.",
        ]
    return "\n".join(lines) + "\n"


def _meta(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    device = (
        torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"no GPU ({platform.processor() or platform.machine()})"
    )
    return {
        "device": device,
        "cap_gib": args.cap_gib,
        "batch_size": args.batch_size,
        "optimizer": args.optimizer,
        "precision": args.precision,
        "torch": torch.__version__,
        "command": "python -m benchmarks.suites.largest_batch " + " ".join(argv),
        "date": datetime.date.today().isoformat(),
        "dry_run": args.dry_run,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.suites.largest_batch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo cases")
    parser.add_argument("--batch-size", type=int, default=256, help="the requested batch (default 256)")
    parser.add_argument("--cap-gib", type=float, default=12.0, help="the emulated card's memory in GiB (default 12)")
    parser.add_argument("--optimizer", default="sgd_momentum", choices=sorted(zoo.OPTIMIZERS))
    parser.add_argument("--precision", default="32-true", choices=zoo.PRECISIONS)
    parser.add_argument("--no-finder", action="store_true", help="skip Lightning's BatchSizeFinder")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU part: estimation (CPU kernels, CUDA target), verification and the table only",
    )
    parser.add_argument("--stem", default="gpu", help="the result's file name: the GPU (h200, ...)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--payload", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.worker:
        return _worker(args.worker, json.loads(args.payload))
    names = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in names if name not in case_names()]
    if unknown or not names:
        print(f"unknown model(s) {unknown}; valid: {', '.join(case_names())}", file=sys.stderr)
        return 2
    if args.batch_size < 1 or args.cap_gib <= 0:
        print("--batch-size must be a positive integer and --cap-gib a positive number", file=sys.stderr)
        return 2
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "benchmarks.suites.largest_batch needs a CUDA GPU for its training runs and the BatchSizeFinder comparison; "
            "none is available here. Pass --dry-run to run the estimation, the verification and the table without one.",
            file=sys.stderr,
        )
        return 2
    cap_bytes = int(args.cap_gib * GiB)
    rows = []
    for name in names:
        rows.append(run_model(name, args, cap_bytes))
        print(
            f"{name}: lines {rows[-1]['lines_batch']}, chosen {rows[-1]['chosen']} in {rows[-1]['seconds']} s",
            file=sys.stderr,
        )
    meta = _meta(args, argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (args.out_dir / f"{args.stem}.md").write_text(to_markdown(rows, meta))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    sys.exit(main())
