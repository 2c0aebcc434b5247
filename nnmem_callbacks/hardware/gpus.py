"""A small built-in table of common GPUs and their memory, for "which GPU fits".

The capacities are the totals that ``nvidia-smi`` reports for each card, in
MiB, not the round number on the box: a "16 GB" T4 shows 15,360 MiB, an
"80 GB" H100 81,559 MiB. The CUDA context and the cuBLAS workspace come out of
that total; estimates count them in ``MemoryEstimate.overhead_bytes``, so
compare ``device_bytes_at(n)`` (``include_reserve=True``) against
``memory_bytes``.

Known limitations: the total that ``torch.cuda.mem_get_info()`` reports (and a
CUDA out-of-memory message calls "total capacity") is lower than
``nvidia-smi``'s by the driver's reserve, which depends on the driver: the H200
of ``benchmarks/results/largest_batch/h200.json`` reported 139.80 GiB against
the 140.40 GiB here. The default 5% margin covers it; a ``--budget`` of the whole
card (``1.0``) does not. Older drivers also report smaller ``nvidia-smi``
totals (a V100 32GB 32,510 MiB, an A100 40GB 40,536 MiB).

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
        memory_bytes: Total device memory as ``nvidia-smi`` reports it.
        aliases: Extra normalised spellings that select this card.
        capability: Compute capability ``(major, minor)``.
    """

    name: str
    model: str
    nominal_gb: int
    memory_bytes: int
    aliases: tuple[str, ...] = ()
    capability: tuple[int, int] = DEFAULT_ARCH_CAPABILITY

    @property
    def arch(self) -> CudaArch:
        """The card's :class:`CudaArch` (cuDNN/CUDA versions assumed)."""
        return cuda_arch(self.capability)

    def keys(self) -> set[str]:
        """Every normalised spelling that selects this card unambiguously."""
        keys = {f"{self.model}{self.nominal_gb}gb", f"{self.model}{self.nominal_gb}"}
        keys.update(self.aliases)
        return keys


def _gpu(name: str, model: str, nominal_gb: int, smi_mib: int, capability: tuple[int, int], *aliases: str) -> GpuSpec:
    return GpuSpec(name, model, nominal_gb, smi_mib * MiB, tuple(aliases), capability)


#: The built-in table, smallest memory first. ``smi_mib`` is nvidia-smi's total; the capability is NVIDIA's.
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
    _gpu("H100 80GB", "h100", 80, 81_559, (9, 0), "h100"),
    _gpu("A100 80GB", "a100", 80, 81_920, (8, 0)),
    # "NVL" is a form factor of the H200 (same memory), but the H100 NVL is another card: 94 GB, 95,830 MiB
    _gpu("H100 NVL 94GB", "h100nvl", 94, 95_830, (9, 0), "h100nvl", "h10094gb", "h10094"),
    _gpu("H200 141GB", "h200", 141, 143_771, (9, 0), "h200"),
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
