"""The commands: each gathers, computes and formats (see the package docstring)."""

from __future__ import annotations

import argparse
import json

from nnmem_callbacks.cli.compute import (
    FitSummary,
    calc_mode,
    fit_summary,
    gathered_unit_bytes,
    is_keras_file,
    keras_target,
    napkin_from_args,
    run_estimate,
    sequence_summary,
    strategy_from_args,
)
from nnmem_callbacks.cli.errors import EXIT_DOES_NOT_FIT, EXIT_OK, CliError, checked_value
from nnmem_callbacks.cli.plots import check_plot_path
from nnmem_callbacks.cli.render import USABLE_NOTE, emit_estimate, make_console, sequence_text, usable_text
from nnmem_callbacks.cli.targets import resolve_budget_bytes, resolve_target
from nnmem_callbacks.core import vocabulary
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.estimators import napkin
from nnmem_callbacks.hardware import gpus as gpu_table

__all__ = ["calc_command", "estimate_command", "gpus_command"]


def _check_vocabulary(args: argparse.Namespace) -> None:
    """``--precision`` and ``--optimizer`` in canonical spelling (:mod:`nnmem_callbacks.core.vocabulary`)."""
    args.precision = checked_value(vocabulary.canonical_precision, args.precision, "--precision")
    args.optimizer = checked_value(vocabulary.canonical_optimizer, args.optimizer, "--optimizer")


def _exit_status(args: argparse.Namespace, fit: FitSummary) -> int:
    """:data:`EXIT_DOES_NOT_FIT` when a budget or a device was named and the batch does not fit."""
    named = args.budget is not None or args.device is not None
    return EXIT_DOES_NOT_FIT if named and fit.fits is False else EXIT_OK


def estimate_command(args: argparse.Namespace) -> int:
    """``nnmem estimate``: trace a model's training step."""
    _check_vocabulary(args)
    if args.plot:
        check_plot_path(args.plot)
    target = keras_target(args.device) if is_keras_file(args.model) else resolve_target(args.device)
    budget = resolve_budget_bytes(args.budget, target)
    estimate = run_estimate(args, target)
    optimizer = estimate.extra.get("keras_optimizer", args.optimizer)
    fit = fit_summary(estimate, target, budget, budget_named=args.budget is not None)
    title = (
        f"nnmem estimate {args.model}: batch {estimate.batch_size}, {estimate.precision}, "
        f"{optimizer}, target {target.label}{_per_rank(args)}"
    )
    extra: dict = {}
    if getattr(args, "seq_len", None) and estimate.sequence is not None:
        extra["sequence"] = sequence_summary(estimate, args.seq_len, fit)
    emit_estimate(
        estimate,
        fit,
        args,
        title=title,
        model=args.model,
        inputs=list(args.input_shape or []),
        optimizer=optimizer,
        **extra,
    )
    if extra and not args.json:
        print(sequence_text(extra["sequence"]))
    return _exit_status(args, fit)


def calc_command(args: argparse.Namespace) -> int:
    """``nnmem calc``: napkin estimate from numbers."""
    _check_vocabulary(args)
    if args.plot:
        check_plot_path(args.plot)
    target = resolve_target(args.device)
    budget = resolve_budget_bytes(args.budget, target)
    # a named GPU: the napkin sizes the cuBLAS workspaces and the context for its architecture
    device = "cpu" if target.device == "cpu" else f"cuda:{target.gpu.name}" if target.gpu is not None else "cuda"
    _check_positions(args)
    single = napkin_from_args(args, device=device)
    strategy = strategy_from_args(args)
    estimate = single
    if strategy.kind != "single":
        from nnmem_callbacks.core.strategy import shard_estimate

        params = int(single.extra.get("params") or single.extra.get("napkin", {}).get("params") or 0)
        gathered = gathered_unit_bytes(single)
        estimate = shard_estimate(single, strategy, parameters=params, gathered_bytes=gathered)
    fit = fit_summary(estimate, target, budget, budget_named=args.budget is not None)
    if fit.gpus and strategy.kind != "single":
        fit = _with_gpu_counts(fit, single, strategy, args.margin if hasattr(args, "margin") else fit.margin)
    why = napkin.explain(estimate) if strategy.kind == "single" else _explain_per_rank(estimate, single, strategy)
    title = (
        f"nnmem calc ({estimate.method}): batch {estimate.batch_size}, {estimate.precision}, "
        f"{estimate.extra['napkin']['optimizer']}, target {target.label}{_per_rank(args)}"
    )
    emit_estimate(estimate, fit, args, title=title, why=why)
    return _exit_status(args, fit)


def _per_rank(args: argparse.Namespace) -> str:
    """The title's word for ``--world-size``, ``--fsdp`` and ``--zero-stage``: the figures below are one rank's."""
    strategy = strategy_from_args(args)
    return "" if strategy.kind == "single" else f", per rank of {strategy.describe()}"


def _check_positions(args: argparse.Namespace) -> None:
    """Transformer mode: ``--seq-len`` within the model's learned positions (``--max-positions``, else napkin's
    default: 1024 for gpt, 512 for bert), as ``nnmem estimate --seq-len`` is within the model's table."""
    if calc_mode(args) != "transformer" or args.seq_len is None:
        return
    positions = napkin.position_count(args.arch, args.max_positions)
    if args.seq_len > positions:
        whose = "--max-positions" if args.max_positions else f"--arch {args.arch}'s default"
        raise CliError(
            f"--seq-len {args.seq_len} is more than the model's {positions} learned positions ({whose}), "
            f"so such a model cannot take it; give --seq-len {positions} or less, or --max-positions "
            f"{args.seq_len} for a model with that many"
        )


def _explain_per_rank(estimate, single, strategy) -> list[str]:
    """:func:`napkin.explain` of a per-rank estimate: each "what would shrink it" is the single-device variant
    sharded as ``estimate`` was (``napkin.what_if`` alone rebuilds one device's step)."""
    from nnmem_callbacks.core.strategy import shard_estimate

    options = []
    for label, other in napkin.what_if(single):
        params = int(other.extra.get("params") or other.extra.get("napkin", {}).get("params") or 0)
        rank = shard_estimate(other, strategy, parameters=params, gathered_bytes=gathered_unit_bytes(other))
        if rank.peak_bytes < estimate.peak_bytes:
            options.append((label, rank))
    options.sort(key=lambda item: item[1].peak_bytes)
    return napkin.explain(estimate, options, heading="What would shrink it (per rank):")


def _with_gpu_counts(fit: FitSummary, single, strategy, margin: float) -> FitSummary:
    """Each GPU row with the fewest ranks of that GPU whose per-rank share of ``single`` (with that card's
    workspaces and context) fits its usable memory."""
    import dataclasses

    from nnmem_callbacks.cli.gpu_fits import on_card
    from nnmem_callbacks.core.strategy import gpus_needed

    params = int(single.extra.get("params") or single.extra.get("napkin", {}).get("params") or 0)
    gathered = gathered_unit_bytes(single)
    rows = tuple(
        dataclasses.replace(
            row,
            gpus_needed=gpus_needed(
                on_card(single, gpu_table.find_gpu(row.name)),
                strategy,
                row.capacity_bytes,
                parameters=params,
                gathered_bytes=gathered,
                margin=margin,
            ),
        )
        for row in fit.gpus
    )
    return dataclasses.replace(fit, gpus=rows)


def gpus_command(args: argparse.Namespace) -> int:
    """``nnmem gpus``: print the built-in GPU table: nvidia-smi's memory and the CUDA total (what fits use)."""
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": g.name,
                        "nominal_gb": g.nominal_gb,
                        "memory_bytes": g.memory_bytes,
                        "capacity_bytes": g.capacity_bytes,
                        "capacity_measured": g.capacity_measured,
                        "capacity_basis": g.capacity_basis,
                        "capacity_source": g.capacity_source,
                        "capability": f"{g.capability[0]}.{g.capability[1]}",
                        "architecture": g.arch.name,
                    }
                    for g in gpu_table.GPUS
                ],
                indent=2,
            )
        )
        return 0
    from rich.table import Table

    table = Table(
        title="Built-in GPUs (--device NAME): memory as nvidia-smi reports it, and the CUDA total fits use",
        title_justify="left",
    )
    table.add_column("GPU")
    table.add_column("on the box", justify="right")
    table.add_column("nvidia-smi", justify="right")
    table.add_column("CUDA total", justify="right")
    table.add_column("CUDA total, bytes", justify="right")
    table.add_column("from")
    table.add_column("architecture")
    for gpu in gpu_table.GPUS:
        table.add_row(
            gpu.name,
            f"{gpu.nominal_gb} GB",
            format_bytes(gpu.memory_bytes),
            usable_text(gpu.capacity_bytes, gpu.capacity_basis),
            f"{gpu.capacity_bytes:,}",
            gpu.capacity_basis,
            gpu.arch.label,
        )
    console = make_console()
    console.print(table)
    console.print(USABLE_NOTE, markup=False)
    return 0
