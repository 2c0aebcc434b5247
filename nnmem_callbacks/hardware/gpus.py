"""A small built-in table of common GPUs and their memory, for "which GPU fits".

Each card has two sizes:

* ``memory_bytes``, the total that ``nvidia-smi`` reports, in MiB, not the
  round number on the box: a "16 GB" T4 shows 15,360 MiB, an "80 GB" H100
  81,559 MiB. It is shown beside the card's name, as its owner knows it.
* ``capacity_bytes``, the total that CUDA reports (``torch.cuda.mem_get_info()[1]``,
  what a CUDA out-of-memory message calls "total capacity"): ``nvidia-smi``'s
  less the driver's reserve. Every fit against a named card is checked against
  this one. Where it was measured, the table holds the measured figure and names
  its source (:attr:`GpuSpec.capacity_source`); elsewhere it is assumed, by
  :func:`driver_reserve_bytes`.

The CUDA context and the cuBLAS workspace come out of ``capacity_bytes``;
estimates count them in ``MemoryEstimate.overhead_bytes`` and ``workspaces``,
so compare ``device_bytes_at(n)`` (``include_reserve=True``) against
``capacity_bytes``. A live device needs none of this: its capacity is read
from ``mem_get_info`` (:func:`nnmem_callbacks.hardware.devices.cuda_capacity`).

Known limitations:
    * The driver's reserve was measured on two cards only, both Hopper: the H100
      80GB HBM3 (driver 580: 85,017,493,504 bytes against nvidia-smi's 81,559
      MiB, 480 MiB less) and the H200 (139.80 GiB in an out-of-memory message
      against 140.40 GiB, about 620 MiB less). For every other card the reserve
      is an assumption: the larger of the largest reserve recorded (620 MiB) and
      the largest recorded share of the total (the H100's, 0.59%), rounded up to a
      MiB (:func:`driver_reserve_bytes`). It depends on the driver and the card;
      on small cards it is likely more than the driver takes (an error toward
      "does not fit"), on untested large ones it may be less. Where the figure
      matters (``--budget 1.0``), plan on the card itself: a live device reports
      its own total.
    * The H200's figure is read from a message rounded to 0.01 GiB; the smallest
      whole MiB that rounds to 139.80 GiB is taken (at most 10 MiB below the truth).
    * Older drivers also report smaller ``nvidia-smi`` totals (a V100 32GB
      32,510 MiB, an A100 40GB 40,536 MiB) than the table's.

Names are read forgivingly: case, spaces, dashes and vendor words
("NVIDIA", "Tesla", "GeForce") do not matter, and the memory may be written
"80GB", "80G" or "80". A name that matches several cards (``"a100"``) is an
error naming them.

Nothing here imports torch.

Example:
    >>> find_gpu("a100-80gb").name
    'A100 80GB'
    >>> find_gpu("NVIDIA H100").memory_bytes // 2**20, find_gpu("NVIDIA H100").capacity_bytes
    (81559, 85017493504)
    >>> find_gpu("h100").capacity_measured, find_gpu("t4").capacity_measured
    (True, False)
    >>> find_gpu("tesla t4").nominal_gb, find_gpu("t4").capacity_bytes // 2**20
    (16, 14740)
    >>> find_gpu("h100").arch.capability
    (9, 0)
"""

from __future__ import annotations

import dataclasses
import re

from nnmem_callbacks.core.units import MiB

__all__ = [
    "ARCHITECTURES",
    "cuda_arch",
    "CudaArch",
    "DEFAULT_ARCH_CAPABILITY",
    "driver_reserve_bytes",
    "driver_reserve_rule",
    "find_arch",
    "find_gpu",
    "gpu_names",
    "GPUS",
    "GpuSpec",
    "is_gpu_name",
    "normalize_gpu_name",
]


@dataclasses.dataclass(frozen=True)
class CudaArch:
    """A CUDA architecture: what the kernels a CUDA estimate emulates depend on.

    Attributes:
        capability: Compute capability ``(major, minor)``, e.g. ``(9, 0)``.
        name: Architecture name, e.g. ``"Hopper"``.
        cudnn_version: cuDNN of the target install as an integer (``91900`` for
            9.19), or ``None`` when unknown: a current PyTorch wheel is then
            assumed (cuDNN newer than 9.15, CUDA 13).
        cuda_major: CUDA major version of the target's PyTorch build (``None``: 13).

    Example:
        >>> find_arch("sm86").name, find_arch("8.6").capability
        ('Ampere', (8, 6))
        >>> find_arch("h100").prefers_cudnn_attention, find_arch("a100").prefers_cudnn_attention
        (True, False)
    """

    capability: tuple[int, int]
    name: str
    cudnn_version: int | None = None
    cuda_major: int | None = None

    @property
    def major(self) -> int:
        return self.capability[0]

    @property
    def minor(self) -> int:
        return self.capability[1]

    @property
    def label(self) -> str:
        """``"sm90 (Hopper)"``."""
        return f"sm{self.major}{self.minor} ({self.name})"

    @property
    def versions_assumed(self) -> bool:
        """Whether the cuDNN/CUDA versions are assumed rather than given."""
        return self.cudnn_version is None or self.cuda_major is None

    @property
    def prefers_cudnn_attention(self) -> bool:
        """PyTorch tries cuDNN attention first here (``check_prefer_cudnn_attention``, sdp_utils.cpp).

        True on sm90/sm10x with cuDNN newer than 9.15; CUDA 12 builds also need
        minor 0 or 3.
        """
        cudnn = 91900 if self.cudnn_version is None else self.cudnn_version
        cuda = 13 if self.cuda_major is None else self.cuda_major
        if self.major not in (9, 10) or cudnn <= 91500:
            return False
        return cuda >= 13 or self.minor in (0, 3)


#: Architectures by compute capability (NVIDIA's CUDA GPUs table).
ARCHITECTURES: dict[tuple[int, int], str] = {
    (6, 0): "Pascal",
    (6, 1): "Pascal",
    (7, 0): "Volta",
    (7, 5): "Turing",
    (8, 0): "Ampere",
    (8, 6): "Ampere",
    (8, 7): "Ampere",
    (8, 9): "Ada",
    (9, 0): "Hopper",
    (10, 0): "Blackwell",
    (10, 3): "Blackwell",
    (12, 0): "Blackwell",
    (12, 1): "Blackwell",
}

#: The architecture assumed for a CUDA target that names no GPU and has none here.
DEFAULT_ARCH_CAPABILITY = (9, 0)


def cuda_arch(capability: tuple[int, int], cudnn_version: int | None = None, cuda_major: int | None = None) -> CudaArch:
    """The :class:`CudaArch` of a compute capability.

    Raises:
        ValueError: For a capability not in :data:`ARCHITECTURES`, naming the known ones.
    """
    capability = (int(capability[0]), int(capability[1]))
    if capability not in ARCHITECTURES:
        known = ", ".join(f"{a}.{b}" for a, b in ARCHITECTURES)
        raise ValueError(f"unknown compute capability {capability[0]}.{capability[1]}; known: {known}")
    return CudaArch(capability, ARCHITECTURES[capability], cudnn_version, cuda_major)


def find_arch(name: str) -> CudaArch:
    """A :class:`CudaArch` from ``"sm90"``, ``"9.0"``, ``"hopper"`` or a GPU name (``"a100-80gb"``).

    Raises:
        ValueError: If nothing matches, naming what is valid.
    """
    text = name.strip().lower()
    match = re.fullmatch(r"(?:sm_?|compute_?)?(\d{1,2})\.?(\d)", text)
    if match:
        return cuda_arch((int(match.group(1)), int(match.group(2))))
    by_name = sorted({cap for cap, arch in ARCHITECTURES.items() if arch.lower() == text})
    if by_name:
        return cuda_arch(by_name[0])
    try:
        return find_gpu(name).arch
    except ValueError:
        pass
    models = [gpu for gpu in GPUS if gpu.model == normalize_gpu_name(name)]
    if models and len({gpu.capability for gpu in models}) == 1:
        return models[0].arch
    raise ValueError(
        f"unknown CUDA architecture {name!r}; use a compute capability (sm80, 8.6), an architecture name "
        f"({', '.join(sorted(set(ARCHITECTURES.values())))}) or a GPU name ({', '.join(gpu_names())})"
    )


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """One GPU model.

    Attributes:
        name: Display name, e.g. ``"A100 80GB"``.
        model: Normalised model name without memory, e.g. ``"a100"``.
        nominal_gb: The memory printed on the box, in GB.
        memory_bytes: Total device memory as ``nvidia-smi`` reports it (for display: fits use
            :attr:`capacity_bytes`).
        aliases: Extra normalised spellings that select this card.
        capability: Compute capability ``(major, minor)``.
        cuda_total_bytes: The total ``torch.cuda.mem_get_info()`` reported on this card, where one was
            recorded (``None``: not measured).
        cuda_total_source: Where :attr:`cuda_total_bytes` comes from.
    """

    name: str
    model: str
    nominal_gb: int
    memory_bytes: int
    aliases: tuple[str, ...] = ()
    capability: tuple[int, int] = DEFAULT_ARCH_CAPABILITY
    cuda_total_bytes: int | None = None
    cuda_total_source: str = ""

    @property
    def capacity_bytes(self) -> int:
        """The memory CUDA reports for the card (``mem_get_info``'s total): what a fit is checked against.

        The recorded figure where one was measured, else ``nvidia-smi``'s total less
        :func:`driver_reserve_bytes` (an assumption).

        Example:
            >>> t4 = find_gpu("t4")
            >>> t4.memory_bytes - t4.capacity_bytes == driver_reserve_bytes(t4.memory_bytes) == 620 * 2**20
            True
        """
        if self.cuda_total_bytes is not None:
            return self.cuda_total_bytes
        return self.memory_bytes - driver_reserve_bytes(self.memory_bytes)

    @property
    def capacity_measured(self) -> bool:
        """Whether :attr:`capacity_bytes` was measured on such a card (else it is assumed)."""
        return self.cuda_total_bytes is not None

    @property
    def capacity_source(self) -> str:
        """Where :attr:`capacity_bytes` comes from, in words.

        Example:
            >>> find_gpu("a100-80gb").capacity_source
            "assumed: nvidia-smi's total less 620 MiB, the driver's reserve as the larger of 620 MiB and 0.59% of it"
        """
        if self.cuda_total_bytes is not None:
            return self.cuda_total_source
        reserve = driver_reserve_bytes(self.memory_bytes)
        return f"assumed: nvidia-smi's total less {reserve // MiB} MiB, the driver's reserve as {driver_reserve_rule()}"

    @property
    def arch(self) -> CudaArch:
        """The card's :class:`CudaArch` (cuDNN/CUDA versions assumed)."""
        return cuda_arch(self.capability)

    def keys(self) -> set[str]:
        """Every normalised spelling that selects this card unambiguously."""
        keys = {f"{self.model}{self.nominal_gb}gb", f"{self.model}{self.nominal_gb}"}
        keys.update(self.aliases)
        return keys


def _gpu(
    name: str,
    model: str,
    nominal_gb: int,
    smi_mib: int,
    capability: tuple[int, int],
    *aliases: str,
    cuda_total: tuple[int, str] | None = None,
) -> GpuSpec:
    total, source = cuda_total if cuda_total is not None else (None, "")
    return GpuSpec(name, model, nominal_gb, smi_mib * MiB, tuple(aliases), capability, total, source)


#: The built-in table, smallest memory first. ``smi_mib`` is nvidia-smi's total; the capability is NVIDIA's;
#: ``cuda_total`` is ``mem_get_info``'s total in bytes and its source, where one was recorded.
GPUS: tuple[GpuSpec, ...] = (
    _gpu("RTX 3060 12GB", "rtx3060", 12, 12_288, (8, 6), "3060"),
    _gpu("T4 16GB", "t4", 16, 15_360, (7, 5)),
    _gpu("V100 16GB", "v100", 16, 16_160, (7, 0)),
    _gpu("P100 16GB", "p100", 16, 16_280, (6, 0), "p100"),
    _gpu("RTX 4080 16GB", "rtx4080", 16, 16_376, (8, 9), "rtx4080", "4080"),
    _gpu("A10 24GB", "a10", 24, 23_028, (8, 6), "a10", "a10g", "a10g24gb"),
    _gpu("L4 24GB", "l4", 24, 23_034, (8, 9), "l4"),
    _gpu("RTX 4090 24GB", "rtx4090", 24, 24_564, (8, 9), "rtx4090", "4090"),
    _gpu("RTX 3090 24GB", "rtx3090", 24, 24_576, (8, 6), "rtx3090", "3090"),
    _gpu("V100 32GB", "v100", 32, 32_768, (7, 0)),
    _gpu("A100 40GB", "a100", 40, 40_960, (8, 0)),
    _gpu("A40 48GB", "a40", 48, 46_068, (8, 6), "a40"),
    _gpu("L40S 48GB", "l40s", 48, 46_068, (8, 9), "l40s"),
    _gpu("RTX A6000 48GB", "a6000", 48, 49_140, (8, 6), "a6000", "rtxa6000", "rtxa600048gb"),
    _gpu(
        "H100 80GB",
        "h100",
        80,
        81_559,
        (9, 0),
        "h100",
        cuda_total=(
            85_017_493_504,
            "measured: mem_get_info's total on an H100 80GB HBM3 (SXM), driver 580 "
            "(gpu-runs/2026-11-23-h100/cuda_facts.json, key total)",
        ),
    ),
    _gpu("A100 80GB", "a100", 80, 81_920, (8, 0)),
    # "NVL" is a form factor of the H200 (same memory), but the H100 NVL is another card: 94 GB, 95,830 MiB
    _gpu("H100 NVL 94GB", "h100nvl", 94, 95_830, (9, 0), "h100nvl", "h10094gb", "h10094"),
    _gpu(
        "H200 141GB",
        "h200",
        141,
        143_771,
        (9, 0),
        "h200",
        cuda_total=(
            143_151 * MiB,  # the smallest whole MiB that prints as 139.80 GiB
            "measured: an out-of-memory message's 'total capacity of 139.80 GiB' on an NVIDIA H200 "
            "(benchmarks/results/largest_batch/h200.json), rounded to 0.01 GiB; the smallest whole MiB within it",
        ),
    ),
)


def driver_reserve_bytes(smi_bytes: int) -> int:
    """The driver's reserve assumed for a card whose CUDA total was not measured.

    Rule (an assumption, see the module's Known limitations): the largest of the
    reserves recorded in :data:`GPUS` (``nvidia-smi``'s total less ``mem_get_info``'s),
    each taken both as bytes and as a share of the card's total applied to
    ``smi_bytes``; rounded up to a whole MiB. With the H100 80GB (480 MiB, 0.59%)
    and the H200 (620 MiB, 0.43%) recorded, that is 620 MiB up to 102.9 GiB of
    ``nvidia-smi`` total and 0.59% above.

    Example:
        >>> driver_reserve_bytes(15_360 * 2**20) // 2**20, driver_reserve_bytes(192 * 2**30) // 2**20
        (620, 1158)
    """
    recorded = _recorded_reserves()
    by_bytes = max(reserve for _, reserve in recorded)
    by_share = max(-(-smi_bytes * reserve // total) for total, reserve in recorded)
    return -(-max(by_bytes, by_share) // MiB) * MiB


def driver_reserve_rule() -> str:
    """:func:`driver_reserve_bytes`'s rule in words, with the recorded figures.

    Example:
        >>> driver_reserve_rule()
        'the larger of 620 MiB and 0.59% of it'
    """
    recorded = _recorded_reserves()
    by_bytes = -(-max(reserve for _, reserve in recorded) // MiB)
    share = max(reserve / total for total, reserve in recorded)
    return f"the larger of {by_bytes} MiB and {share:.2%} of it"


def _recorded_reserves() -> list[tuple[int, int]]:
    """``(nvidia-smi total, reserve)`` bytes of each card whose CUDA total was measured."""
    return [(gpu.memory_bytes, gpu.memory_bytes - gpu.cuda_total_bytes) for gpu in GPUS if gpu.capacity_measured]


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
        >>> find_gpu("NVIDIA H100 NVL").name, find_gpu("H100 PCIe").name, find_gpu("NVIDIA H200 NVL").name
        ('H100 NVL 94GB', 'H100 80GB', 'H200 141GB')
        >>> find_gpu("A100")
        Traceback (most recent call last):
        ...
        ValueError: GPU name 'A100' is ambiguous: A100 40GB, A100 80GB; add the memory, e.g. 'A100 80GB'
    """
    key = normalize_gpu_name(name)
    if not key:
        raise ValueError(f"empty GPU name; valid GPUs: {', '.join(gpu_names())}")
    raw = re.sub(r"[^a-z0-9]", "", _FORM_FACTORS.sub("", _strip_vendor(name.lower())))
    whole = re.sub(r"(\d)g$", r"\1gb", re.sub(r"[^a-z0-9]", "", _strip_vendor(name.lower())))  # form factor kept
    exact = (
        [gpu for gpu in GPUS if whole in gpu.keys()]
        or [gpu for gpu in GPUS if raw in gpu.keys()]
        or [gpu for gpu in GPUS if key in gpu.keys()]
    )
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
