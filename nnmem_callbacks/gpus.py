"""A small built-in table of common GPUs and their memory, for "which GPU fits".

The capacities are the totals that ``nvidia-smi`` (and
``torch.cuda.mem_get_info()``) report for each card, in MiB, not the round
number on the box: a "16 GB" T4 shows 15,360 MiB, an "80 GB" H100 81,559 MiB.
The CUDA context and the cuBLAS workspace come out of that total; estimates
count them in ``MemoryEstimate.overhead_bytes``, so compare
``device_bytes_at(n)`` (``include_reserve=True``) against ``memory_bytes``.

Names are read forgivingly: case, spaces, dashes and vendor words
("NVIDIA", "Tesla", "GeForce") do not matter, and the memory may be written
"80GB", "80G" or "80". A name that matches several cards (``"a100"``) is an
error naming them.

Nothing here imports torch.

Example:
    >>> find_gpu("a100-80gb").name
    'A100 80GB'
    >>> find_gpu("NVIDIA H100").memory_bytes // 2**20
    81559
    >>> find_gpu("tesla t4").nominal_gb
    16
"""

from __future__ import annotations

import dataclasses
import re

from nnmem_callbacks.units import MiB


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """One GPU model.

    Attributes:
        name: Display name, e.g. ``"A100 80GB"``.
        model: Normalised model name without memory, e.g. ``"a100"``.
        nominal_gb: The memory printed on the box, in GB.
        memory_bytes: Total device memory as ``nvidia-smi`` reports it.
        aliases: Extra normalised spellings that select this card.
    """

    name: str
    model: str
    nominal_gb: int
    memory_bytes: int
    aliases: tuple[str, ...] = ()

    def keys(self) -> set[str]:
        """Every normalised spelling that selects this card unambiguously."""
        keys = {f"{self.model}{self.nominal_gb}gb", f"{self.model}{self.nominal_gb}"}
        keys.update(self.aliases)
        return keys


def _gpu(name: str, model: str, nominal_gb: int, smi_mib: int, *aliases: str) -> GpuSpec:
    return GpuSpec(name, model, nominal_gb, smi_mib * MiB, tuple(aliases))


#: The built-in table, smallest memory first. ``smi_mib`` is nvidia-smi's total.
GPUS: tuple[GpuSpec, ...] = (
    _gpu("RTX 3060 12GB", "rtx3060", 12, 12_288, "3060"),
    _gpu("T4 16GB", "t4", 16, 15_360),
    _gpu("V100 16GB", "v100", 16, 16_160),
    _gpu("P100 16GB", "p100", 16, 16_280, "p100"),
    _gpu("RTX 4080 16GB", "rtx4080", 16, 16_376, "rtx4080", "4080"),
    _gpu("A10 24GB", "a10", 24, 23_028, "a10", "a10g", "a10g24gb"),
    _gpu("L4 24GB", "l4", 24, 23_034, "l4"),
    _gpu("RTX 4090 24GB", "rtx4090", 24, 24_564, "rtx4090", "4090"),
    _gpu("RTX 3090 24GB", "rtx3090", 24, 24_576, "rtx3090", "3090"),
    _gpu("V100 32GB", "v100", 32, 32_768),
    _gpu("A100 40GB", "a100", 40, 40_960),
    _gpu("A40 48GB", "a40", 48, 46_068, "a40"),
    _gpu("L40S 48GB", "l40s", 48, 46_068, "l40s"),
    _gpu("RTX A6000 48GB", "a6000", 48, 49_140, "a6000", "rtxa6000", "rtxa600048gb"),
    _gpu("A100 80GB", "a100", 80, 81_920),
    _gpu("H100 80GB", "h100", 80, 81_559, "h100"),
    _gpu("H200 141GB", "h200", 141, 143_771, "h200"),
)

_VENDOR_WORDS = ("nvidia", "tesla", "geforce", "quadro")
_FORM_FACTORS = re.compile(r"(sxm\d?|pcie|hbm3e?|nvl)")


def normalize_gpu_name(name: str) -> str:
    """Lower-cases a GPU name and drops vendor words, form factors and punctuation.

    Example:
        >>> normalize_gpu_name("NVIDIA A100-SXM4-80GB")
        'a10080gb'
        >>> normalize_gpu_name("a100 80g")
        'a10080gb'
    """
    text = _strip_vendor(name.lower())
    text = _FORM_FACTORS.sub("", text)
    text = re.sub(r"[^a-z0-9]", "", text)
    text = re.sub(r"(\d)g$", r"\1gb", text)
    return text


def _strip_vendor(text: str) -> str:
    for word in _VENDOR_WORDS:
        text = text.replace(word, "")
    return text


def find_gpu(name: str) -> GpuSpec:
    """Looks a GPU up in :data:`GPUS` by a forgiving name.

    Args:
        name: E.g. ``"h100"``, ``"A100 80GB"``, ``"a100-40gb"``, ``"RTX 4090"``.

    Returns:
        The matching :class:`GpuSpec`.

    Raises:
        ValueError: If the name matches no card (naming the valid ones) or
            several (naming them and how to pick one).

    Example:
        >>> find_gpu("A100")
        Traceback (most recent call last):
        ...
        ValueError: GPU name 'A100' is ambiguous: A100 40GB, A100 80GB; add the memory, e.g. 'A100 80GB'
    """
    key = normalize_gpu_name(name)
    if not key:
        raise ValueError(f"empty GPU name; valid GPUs: {', '.join(gpu_names())}")
    raw = re.sub(r"[^a-z0-9]", "", _FORM_FACTORS.sub("", _strip_vendor(name.lower())))
    exact = [gpu for gpu in GPUS if raw in gpu.keys()] or [gpu for gpu in GPUS if key in gpu.keys()]
    if len(exact) == 1:
        return exact[0]
    by_model = [gpu for gpu in GPUS if gpu.model == key or gpu.model == "rtx" + key]
    if len(by_model) == 1:
        return by_model[0]
    if len(by_model) > 1 or len(exact) > 1:
        options = by_model or exact
        raise ValueError(
            f"GPU name {name!r} is ambiguous: {', '.join(g.name for g in options)}; "
            f"add the memory, e.g. {options[-1].name!r}"
        )
    raise ValueError(f"unknown GPU {name!r}; valid GPUs: {', '.join(gpu_names())} (or 'cuda' for the local one)")


def is_gpu_name(name: str) -> bool:
    """Whether ``name`` selects exactly one card of the table.

    Example:
        >>> is_gpu_name("L4"), is_gpu_name("cpu"), is_gpu_name("a100")
        (True, False, False)
    """
    try:
        find_gpu(name)
    except ValueError:
        return False
    return True


def gpu_names() -> list[str]:
    """Display names of every card in the table, smallest memory first."""
    return [gpu.name for gpu in GPUS]
