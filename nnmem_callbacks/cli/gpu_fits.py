"""Which GPU fits: an estimate against every card of the built-in table, each at its own usable memory.

Each card is checked against the total CUDA reports for it
(:attr:`~nnmem_callbacks.hardware.gpus.GpuSpec.capacity_bytes`: measured or reported where recorded, else
``nvidia-smi``'s total less an assumed driver reserve), not ``nvidia-smi``'s larger total, which is kept for
display. The estimate's cuBLAS workspaces (and a context taken from the tables) are re-sized for each card's
architecture (:func:`nnmem_callbacks.hardware.cuda_tables.for_capability`); the tensors stay as estimated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.plan import make_plan, planning_margin, resolve_budget
from nnmem_callbacks.hardware import cuda_tables
from nnmem_callbacks.hardware import gpus as gpu_table

__all__ = ["GpuFit", "gpu_rows", "on_card", "sequence_rows"]


@dataclasses.dataclass(frozen=True)
class GpuFit:
    """How an estimate fits one GPU (its usable memory minus the margin, as with no ``--budget``).

    ``memory_bytes`` is ``nvidia-smi``'s total (shown beside the name); ``capacity_bytes`` the total CUDA reports,
    which the fit is checked against; ``capacity_basis`` says where that comes from: ``"measured"`` by this project,
    ``"reported"`` by public out-of-memory messages, or ``"assumed"``
    (:func:`nnmem_callbacks.hardware.gpus.driver_reserve_bytes`).
    """

    name: str
    memory_bytes: int
    max_batch_size: int | None  # None: not known (the step could not run)
    fits: bool
    covered: bool = True  # False: the CUDA kernels the estimate emulated differ on this card's architecture
    gpus_needed: int | None = None  # with a strategy: the fewest ranks whose per-rank share fits
    _: dataclasses.KW_ONLY
    capacity_bytes: int  # the total CUDA reports for the card (GpuSpec.capacity_bytes)
    capacity_basis: str  # GpuSpec.capacity_basis

    @property
    def capacity_measured(self) -> bool:
        """Whether :attr:`capacity_bytes` was measured by this project (not reported, not assumed)."""
        return self.capacity_basis == "measured"

    def to_dict(self) -> dict[str, Any]:
        """The row for ``--json``: its fields and :attr:`capacity_measured`."""
        return {**dataclasses.asdict(self), "capacity_measured": self.capacity_measured}


def on_card(estimate: MemoryEstimate, gpu: gpu_table.GpuSpec) -> MemoryEstimate:
    """``estimate`` with its cuBLAS workspaces and table context sized for ``gpu``'s architecture.

    Example:
        >>> from nnmem_callbacks.estimators import napkin
        >>> est = napkin.params_estimate(1_000_000, 100_000, 32, optimizer="sgd")
        >>> est.breakdown["workspaces"] // 2**20, on_card(est, gpu_table.find_gpu("t4")).breakdown["workspaces"]
        (64, 17039360)
    """
    return cuda_tables.for_capability(estimate, gpu.capability)


def gpu_rows(estimate: MemoryEstimate, margin: float, *, known: bool = True) -> tuple[GpuFit, ...]:
    """One :class:`GpuFit` per card of :data:`~nnmem_callbacks.hardware.gpus.GPUS`, smallest usable memory first.

    Each row is :func:`~nnmem_callbacks.core.plan.make_plan` of :func:`on_card` against the card's
    :attr:`~nnmem_callbacks.hardware.gpus.GpuSpec.capacity_bytes` less ``margin`` (the device total compared).
    ``known=False`` (no forward ran): the largest batch is not known (``None``).

    Example:
        >>> from nnmem_callbacks.estimators import napkin
        >>> rows = gpu_rows(napkin.params_estimate(1_000_000, 100_000, 32, optimizer="sgd"), 0.05)
        >>> h100 = next(row for row in rows if row.name == "H100 80GB")
        >>> h100.memory_bytes // 2**20, h100.capacity_bytes, h100.capacity_measured
        (81559, 85017493504, True)
    """
    uncovered = set(estimate.extra.get("cuda_emulation", {}).get("uncovered_capabilities", ()))
    rows = []
    for gpu in sorted(gpu_table.GPUS, key=lambda g: g.capacity_bytes):
        budget = resolve_budget(None, capacity_bytes=gpu.capacity_bytes, margin=margin)
        plan = make_plan(on_card(estimate, gpu), budget, "warn", planning_margin(None, margin), include_reserve=True)
        rows.append(
            GpuFit(
                gpu.name,
                gpu.memory_bytes,
                plan.max_fitting_batch_size if known else None,
                plan.fits,
                f"{gpu.capability[0]}.{gpu.capability[1]}" not in uncovered,
                capacity_bytes=gpu.capacity_bytes,
                capacity_basis=gpu.capacity_basis,
            )
        )
    return tuple(rows)


def sequence_rows(estimate: MemoryEstimate, rows: tuple[GpuFit, ...], peak: int, margin: float) -> list[dict]:
    """``--seq-len``'s "which GPU fits": per card, whether the tensor ``peak`` at that length (and the estimate's
    batch) fits, and the longest length that does.

    The card's workspaces and context differ from the estimate's by fixed bytes at every length, so they come off
    the card's budget; the allocator reserve and the context are added as at the traced length.
    """
    batch = estimate.batch_size
    out: list[dict[str, Any]] = []
    for row in rows:
        budget = resolve_budget(None, capacity_bytes=row.capacity_bytes, margin=margin)
        card = on_card(estimate, gpu_table.find_gpu(row.name))
        fixed = card.device_bytes - estimate.device_bytes  # the card's workspaces and context: the same at any length
        allowed = estimate.tensor_share_of_device(int(budget * (1 - planning_margin(None, margin))) - fixed)
        out.append(
            {
                "name": row.name,
                "memory_bytes": row.memory_bytes,
                "capacity_bytes": row.capacity_bytes,
                "capacity_measured": row.capacity_measured,
                "capacity_basis": row.capacity_basis,
                "fits": peak <= allowed,
                "max_sequence_length": estimate.max_sequence_length(allowed, batch) if allowed > 0 else 0,
            }
        )
    return out
