"""Gathering the target: ``--device`` to a device and its memory, ``--budget`` to bytes."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys

from nnmem_callbacks.cli.errors import CliError
from nnmem_callbacks.core.plan import DEFAULT_MARGIN, parse_budget_text, resolve_budget
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.hardware import gpus as gpu_table

__all__ = ["resolve_budget_bytes", "resolve_target", "Target"]


@dataclasses.dataclass(frozen=True)
class Target:
    """Where training runs and how much memory it has.

    Attributes:
        device: What the estimator gets: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        gpu: The GPU picked by name, if any.
        capacity_bytes: Memory of the device, when known: for a GPU the total CUDA reports
            (``mem_get_info``; for a named card :attr:`~nnmem_callbacks.hardware.gpus.GpuSpec.capacity_bytes`,
            not ``nvidia-smi``'s larger total).
        free_bytes: Memory free now (local devices only).
        label: Human description, e.g. ``"cuda (A100 80GB)"``.
    """

    device: str
    gpu: gpu_table.GpuSpec | None
    capacity_bytes: int | None
    free_bytes: int | None
    label: str

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def capacity_source(self) -> str | None:
        """Where :attr:`capacity_bytes` comes from, in words (``None`` when it is unknown).

        Example:
            >>> resolve_target("h100").capacity_source.startswith("measured: mem_get_info's total")
            True
        """
        if self.capacity_bytes is None:
            return None
        if self.gpu is not None:
            return self.gpu.capacity_source
        return "host RAM (psutil)" if self.device == "cpu" else "torch.cuda.mem_get_info() of the local device"

    @property
    def memory_word(self) -> str:
        """What a budget from no ``--budget`` is a share of: ``"free memory"`` (a local device),
        ``"CUDA-reported memory"`` (a named GPU: the total CUDA reports, not nvidia-smi's), else ``"memory"``.

        Example:
            >>> resolve_target("t4").memory_word
            'CUDA-reported memory'
        """
        if self.free_bytes is not None:
            return "free memory"
        return "CUDA-reported memory" if self.gpu is not None else "memory"

    @property
    def where(self) -> str:
        """Whose memory a budget is, in a sentence: ``"A100 80GB"``, ``"host RAM"``, ``"cuda (NVIDIA H100, local)"``."""
        return self.gpu.name if self.gpu is not None else "host RAM" if self.device == "cpu" else self.label


def resolve_target(device: str | None) -> Target:
    """Turns ``--device`` into a :class:`Target`.

    ``None`` means a CUDA target of unknown size (a "which GPU fits" table is
    shown). ``"cuda"`` uses the local GPU when there is one.

    Raises:
        CliError: For a device that is neither cpu/cuda nor a known GPU name.

    Example:
        >>> resolve_target("H100").capacity_bytes // 2**20  # CUDA's total, not nvidia-smi's 81,559 MiB
        81079
        >>> resolve_target(None).device
        'cuda'
    """
    if device is None:
        return Target("cuda", None, None, None, "cuda (no GPU chosen: see the table of GPUs)")
    text = device.strip()
    lowered = text.lower()
    if lowered == "cpu":
        from nnmem_callbacks.hardware.devices import cpu_capacity

        total, available = cpu_capacity()
        return Target("cpu", None, total, available, "cpu (host RAM)")
    if re.fullmatch(r"cuda(:\d+)?", lowered):
        local = _local_cuda(lowered)
        if local is None:
            return Target(lowered, None, None, None, f"{lowered} (no local GPU: see the table of GPUs)")
        name, total, free = local
        return Target(lowered, None, total, free, f"{lowered} ({name}, local)")
    try:
        gpu = gpu_table.find_gpu(text)
    except ValueError as error:
        raise CliError(f"--device: {error}") from None
    return Target("cuda", gpu, gpu.capacity_bytes, None, f"cuda ({gpu.name})")


def _local_cuda(device: str) -> tuple[str, int, int] | None:
    """``(name, total, free)`` of a local CUDA device, ``None`` without CUDA here.

    Raises:
        CliError: For ``cuda:N`` when this machine has no GPU ``N``.
    """
    index = int(device.split(":")[1]) if ":" in device else None
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        count = 0
    else:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index is not None and index >= count:
        have = "no CUDA GPU" if count == 0 else f"{count} GPU(s): " + ", ".join(f"cuda:{i}" for i in range(count))
        raise CliError(
            f"--device {device}: this machine has {have}; to plan for a GPU that is not here name its model "
            f"(e.g. --device a100-80gb, see `nnmem gpus`), or write --device cuda for the table of GPUs"
        )
    if count == 0:
        return None
    from nnmem_callbacks.hardware.devices import cuda_capacity

    total, free = cuda_capacity(device)
    return torch.cuda.get_device_name(index if index is not None else torch.cuda.current_device()), total, free


def resolve_budget_bytes(budget: str | None, target: Target) -> int | None:
    """``--budget`` in bytes, by :func:`nnmem_callbacks.core.plan.resolve_budget`'s rule (the API's).

    A size with a unit (``"6GiB"``) is bytes; a bare number is a fraction of
    the device in (0, 1] (``"0.9"``); ``"1.5"`` is an error. Without
    ``--budget``: the free memory of a local device (the capacity of a named
    GPU) minus :data:`~nnmem_callbacks.core.plan.DEFAULT_MARGIN`, or ``None`` when
    the device's memory is unknown.

    Raises:
        CliError: For an unreadable budget, a fraction without a known device, or a size above the device's
            memory.

    Example:
        >>> resolve_budget_bytes("0.5", resolve_target("T4")) == resolve_target("T4").gpu.capacity_bytes // 2
        True
        >>> resolve_budget_bytes("6GiB", resolve_target(None))
        6442450944
        >>> resolve_budget_bytes(None, resolve_target("T4")) == int(14905 * 2**20 * (1 - DEFAULT_MARGIN))
        True
    """
    try:
        parsed = None if budget is None else parse_budget_text(budget)
    except ValueError as error:
        raise CliError(f"--budget: {error}") from None
    if target.capacity_bytes is None:
        if parsed is None:
            return None
        if isinstance(parsed, float):
            raise CliError(
                f"--budget {budget} is a fraction of the device, but the device's memory is unknown; "
                f"name a GPU (--device a100-80gb) or give a size with a unit (--budget 10GiB)"
            )
        return parsed
    if isinstance(parsed, int) and parsed > target.capacity_bytes:
        # a budget the device cannot hold would let a batch "fit" that cannot run there (exit status 0)
        where = (
            f"the {target.gpu.name}'s usable memory (the total CUDA reports)"
            if target.gpu is not None
            else "this machine's RAM"
            if target.device == "cpu"
            else f"the memory of {target.label}"
        )
        raise CliError(
            f"--budget {budget} ({format_bytes(parsed)}) is more than {where} "
            f"({format_bytes(target.capacity_bytes)}); give at most that, a fraction of it (--budget 0.9), or "
            f"leave --budget out for its {'free ' if target.free_bytes is not None else ''}memory less 5%"
        )
    return resolve_budget(
        parsed, capacity_bytes=target.capacity_bytes, free_bytes=target.free_bytes, margin=DEFAULT_MARGIN
    )
