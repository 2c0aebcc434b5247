"""A small built-in table of common GPUs and their memory, for "which GPU fits".

Each card has two sizes:

* ``memory_bytes``, the total that ``nvidia-smi`` reports, in MiB, not the
  round number on the box: a "16 GB" T4 shows 15,360 MiB, an "80 GB" H100
  81,559 MiB. It is shown beside the card's name, as its owner knows it.
* ``capacity_bytes``, the total that CUDA reports (``torch.cuda.mem_get_info()[1]``,
  what a CUDA out-of-memory message calls "total capacity"): ``nvidia-smi``'s
  less the driver's reserve. Every fit against a named card is checked against
  this one. It comes from one of three places (:attr:`GpuSpec.capacity_basis`,
  with :attr:`GpuSpec.capacity_source` naming where):

  - *measured* by this project (the H100 80GB and the H200);
  - *reported*: read from public PyTorch out-of-memory messages on that card
    ("GPU 0 has a total capacity of 14.56 GiB"), each source named by URL;
  - *assumed*: ``nvidia-smi``'s total less :func:`driver_reserve_bytes`.

The CUDA context and the cuBLAS workspace come out of ``capacity_bytes``;
estimates count them in ``MemoryEstimate.overhead_bytes`` and ``workspaces``,
so compare ``device_bytes_at(n)`` (``include_reserve=True``) against
``capacity_bytes``. A live device needs none of this: its capacity is read
from ``mem_get_info`` (:func:`nnmem_callbacks.hardware.devices.cuda_capacity`).

Known limitations:
    * The driver's reserve depends on the driver and the card, and newer drivers
      reserve more. Two cards were measured here, both Hopper: the H100 80GB HBM3
      (driver 580: 85,017,493,504 bytes against nvidia-smi's 81,559 MiB, 480 MiB
      less) and the H200 (139.80 GiB in an out-of-memory message against 140.40
      GiB, about 620 MiB less).
    * A reported figure is one user's message on one driver (named where the issue
      shows it), printed to 0.01 GiB; the smallest whole MiB that prints as it is
      taken (at most 10 MiB below the truth), and where several were found the
      lowest. Another driver may reserve more. The reserves recorded range from
      261 MiB (RTX 3060 12GB, 2.12%) to 885 MiB (A100 80GB, 1.08%), and from 0.43%
      (H200 141GB) to 2.96% (T4 16GB) of the card.
    * For a card with neither, the reserve is an assumption
      (:func:`driver_reserve_bytes`): the larger of the largest reserve recorded
      (885 MiB) and the largest recorded share of the total (the T4's, 2.96%),
      rounded up to a MiB. It is meant to err toward "does not fit"; on large
      cards it is likely far more than the driver takes. Where the figure matters
      (``--budget 1.0``), plan on the card itself: a live device reports its own
      total.
    * ``nvidia-smi`` totals are meant to be those of current drivers. Older drivers
      showed smaller ones (a T4 15,109 MiB, a V100 32GB 32,510 MiB, an A100 40GB
      40,536 MiB), about what CUDA then reported, so their messages say nothing of
      today's reserve and are not used (a V100 16GB's "15.78 GiB" of 2021, 6 MiB
      under the table's 16,160 MiB, which may itself be an older driver's figure).
    * The measured H100 80GB figure (79.18 GiB, driver 580) is kept, though a
      public message on an H100 shows 79.11 GiB (vllm-project/vllm#27508).

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
    >>> find_gpu("h100").capacity_basis, find_gpu("t4").capacity_basis, find_gpu("l4").capacity_basis
    ('measured', 'reported', 'assumed')
    >>> find_gpu("tesla t4").nominal_gb, find_gpu("t4").capacity_bytes // 2**20
    (16, 14905)
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
    "CAPACITY_BASES",
    "driver_reserve_rule",
    "find_arch",
    "find_gpu",
    "gpu_names",
    "GPUS",
    "GpuSpec",
    "is_gpu_name",
    "lower_edge_mib",
    "normalize_gpu_name",
    "recorded_reserves",
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
        cuda_total_bytes: The total ``torch.cuda.mem_get_info()`` reports on this card, where one was
            recorded (``None``: assumed, see :func:`driver_reserve_bytes`).
        cuda_total_source: Where :attr:`cuda_total_bytes` comes from (URLs for a reported one).
        cuda_total_basis: ``"measured"`` (by this project) or ``"reported"`` (public out-of-memory
            messages), with :attr:`cuda_total_bytes`.
        reported_gib: A reported total as the messages print it (``"14.56"``), else ``""``.
    """

    name: str
    model: str
    nominal_gb: int
    memory_bytes: int
    aliases: tuple[str, ...] = ()
    capability: tuple[int, int] = DEFAULT_ARCH_CAPABILITY
    cuda_total_bytes: int | None = None
    cuda_total_source: str = ""
    cuda_total_basis: str = ""
    reported_gib: str = ""

    def __post_init__(self) -> None:
        if (self.cuda_total_bytes is None) != (self.cuda_total_basis == ""):
            raise ValueError(f"{self.name}: a recorded CUDA total needs its basis, and only then")
        if self.cuda_total_basis not in ("", *CAPACITY_BASES[:2]):
            raise ValueError(
                f"{self.name}: unknown CUDA total basis {self.cuda_total_basis!r}; use 'measured' or 'reported'"
            )

    @property
    def capacity_bytes(self) -> int:
        """The memory CUDA reports for the card (``mem_get_info``'s total): what a fit is checked against.

        The recorded figure where one was measured or reported, else ``nvidia-smi``'s total less
        :func:`driver_reserve_bytes` (an assumption).

        Example:
            >>> l4 = find_gpu("l4")
            >>> l4.memory_bytes - l4.capacity_bytes == driver_reserve_bytes(l4.memory_bytes) == 885 * 2**20
            True
        """
        if self.cuda_total_bytes is not None:
            return self.cuda_total_bytes
        return self.memory_bytes - driver_reserve_bytes(self.memory_bytes)

    @property
    def capacity_basis(self) -> str:
        """``"measured"`` (by this project), ``"reported"`` (public out-of-memory messages) or ``"assumed"``."""
        return self.cuda_total_basis or "assumed"

    @property
    def capacity_measured(self) -> bool:
        """Whether :attr:`capacity_bytes` was measured by this project (not reported, not assumed)."""
        return self.capacity_basis == "measured"

    @property
    def capacity_reported(self) -> bool:
        """Whether :attr:`capacity_bytes` was read from public out-of-memory messages on such a card."""
        return self.capacity_basis == "reported"

    @property
    def capacity_source(self) -> str:
        """Where :attr:`capacity_bytes` comes from, in words.

        Example:
            >>> find_gpu("l4").capacity_source
            "assumed: nvidia-smi's total less 885 MiB, the driver's reserve as the larger of 885 MiB and 2.96% of it"
            >>> find_gpu("a100-80gb").capacity_source.split(" (")[0]
            "reported: 'total capacity of 79.14 GiB' in public out-of-memory messages on an A100 80GB"
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


#: Where a card's CUDA total comes from, most trusted first (:attr:`GpuSpec.capacity_basis`).
CAPACITY_BASES = ("measured", "reported", "assumed")


def lower_edge_mib(gib_text: str) -> int:
    """The smallest whole MiB that PyTorch prints as ``gib_text`` GiB (two decimals, rounded).

    Example:
        >>> lower_edge_mib("139.80"), f"{143_151 / 1024:.2f}", f"{143_150 / 1024:.2f}"
        (143151, '139.80', '139.79')
    """
    if not re.fullmatch(r"\d+\.\d\d", gib_text):
        raise ValueError(f"a reported total is printed with two decimals, e.g. '14.56'; got {gib_text!r}")
    mib = int((float(gib_text) - 0.006) * 1024)
    while f"{mib / 1024:.2f}" != gib_text:
        mib += 1
    return mib


def _gpu(
    name: str,
    model: str,
    nominal_gb: int,
    smi_mib: int,
    capability: tuple[int, int],
    *aliases: str,
    measured: tuple[int, str] | None = None,
    reported: tuple[str, str, tuple[str, ...]] | None = None,
) -> GpuSpec:
    """A table row; ``reported`` is ``(printed GiB, on what, URLs)``, taken at the figure's lower edge."""
    spec = GpuSpec(name, model, nominal_gb, smi_mib * MiB, tuple(aliases), capability)
    if measured is not None:
        return dataclasses.replace(spec, cuda_total_bytes=measured[0], cuda_total_source=measured[1],
                                   cuda_total_basis="measured")  # fmt: skip
    if reported is not None:
        gib, where, urls = reported
        source = (
            f"reported: 'total capacity of {gib} GiB' in public out-of-memory messages on {where} "
            f"({', '.join(urls)}); the smallest whole MiB that prints so"
        )
        return dataclasses.replace(spec, cuda_total_bytes=lower_edge_mib(gib) * MiB, cuda_total_source=source,
                                   cuda_total_basis="reported", reported_gib=gib)  # fmt: skip
    return spec


_ISSUES = "https://github.com/"

#: The built-in table, smallest CUDA total (:attr:`GpuSpec.capacity_bytes`) first. ``smi_mib`` is nvidia-smi's total; the capability is NVIDIA's;
#: ``measured`` is ``mem_get_info``'s total in bytes and its source; ``reported`` the lowest credible "total
#: capacity" of public PyTorch out-of-memory messages that name the card (see the module's Known limitations).
GPUS: tuple[GpuSpec, ...] = (
    _gpu("RTX 3060 12GB", "rtx3060", 12, 12_288, (8, 6), "3060",
         reported=("11.75", "an RTX 3060 12GB, Linux (11.76 in TencentARC/PhotoMaker#47)",
                   (_ISSUES + "Kunhao-Liu/StyleGaussian/issues/12", _ISSUES + "smy20011/dreambooth-gui/issues/78"))),
    _gpu("T4 16GB", "t4", 16, 15_360, (7, 5),
         reported=("14.56", "a Tesla T4 (drivers before R510 showed 14.75-14.76)",
                   (_ISSUES + "Zheng-Chong/CatVTON/issues/133", _ISSUES + "AlphaGPU/leetgpu-challenges/issues/52"))),
    _gpu("V100 16GB", "v100", 16, 16_160, (7, 0)),
    _gpu("P100 16GB", "p100", 16, 16_280, (6, 0), "p100"),
    _gpu("RTX 4080 16GB", "rtx4080", 16, 16_376, (8, 9), "rtx4080", "4080"),
    _gpu("L4 24GB", "l4", 24, 23_034, (8, 9), "l4"),
    _gpu("A10 24GB", "a10", 24, 23_028, (8, 6), "a10", "a10g", "a10g24gb",
         reported=("21.99", "an A10 (Lambda Labs, PyTorch 2.0.1)", (_ISSUES + "zai-org/CogVLM/issues/236",))),
    _gpu("RTX 4090 24GB", "rtx4090", 24, 24_564, (8, 9), "rtx4090", "4090",
         reported=("23.52", "an RTX 4090 (others print 23.61-23.68)",
                   (_ISSUES + "Soul-AILab/SoulX-FlashTalk/issues/5", _ISSUES + "pinokiofactory/flux-webui/issues/11",
                    _ISSUES + "zai-org/CogVideo/issues/36"))),
    _gpu("RTX 3090 24GB", "rtx3090", 24, 24_576, (8, 6), "rtx3090", "3090",
         reported=("23.70", "an RTX 3090",
                   (_ISSUES + "Lightning-AI/lit-llama/issues/137", _ISSUES + "xiaoxiangAQ/GAS-Net/issues/7"))),
    _gpu("V100 32GB", "v100", 32, 32_768, (7, 0),
         reported=("31.74", "a V100 32GB",
                   (_ISSUES + "liucongg/ChatGLM-Finetuning/issues/73", _ISSUES + "haotian-liu/LLaVA/issues/812"))),
    _gpu("A100 40GB", "a100", 40, 40_960, (8, 0),
         reported=("39.50", "an A100 40GB (39.56 on an A100-SXM4-40GB, driver 535.104.05)",
                   (_ISSUES + "TianheWu/CoSeR/issues/10", _ISSUES + "threestudio-project/threestudio/issues/402"))),
    _gpu("A40 48GB", "a40", 48, 46_068, (8, 6), "a40"),
    _gpu("L40S 48GB", "l40s", 48, 46_068, (8, 9), "l40s",
         reported=("44.53", "an L40S 48GB", (_ISSUES + "Wan-Video/Wan2.1/issues/205",))),
    _gpu("RTX A6000 48GB", "a6000", 48, 49_140, (8, 6), "a6000", "rtxa6000", "rtxa600048gb"),
    _gpu("A100 80GB", "a100", 80, 81_920, (8, 0),
         reported=("79.14", "an A100 80GB (others print 79.25)",
                   (_ISSUES + "lianqi1008/Control-GIC/issues/6", _ISSUES + "levihsu/OOTDiffusion/issues/235",
                    _ISSUES + "HiDream-ai/VAREdit/issues/6"))),
    _gpu(
        "H100 80GB",
        "h100",
        80,
        81_559,
        (9, 0),
        "h100",
        measured=(
            85_017_493_504,
            "measured: mem_get_info's total on an H100 80GB HBM3 (SXM), driver 580 "
            "(gpu-runs/2026-11-23-h100/cuda_facts.json, key total)",
        ),
    ),
    # "NVL" is a form factor of the H200 (same memory), but the H100 NVL is another card: 94 GB, 95,830 MiB
    _gpu("H100 NVL 94GB", "h100nvl", 94, 95_830, (9, 0), "h100nvl", "h10094gb", "h10094",
         reported=("93.00", "an H100 NVL 94GB (RunPod)", (_ISSUES + "ali-vilab/VACE/issues/56",))),
    _gpu(
        "H200 141GB",
        "h200",
        141,
        143_771,
        (9, 0),
        "h200",
        measured=(
            143_151 * MiB,  # the smallest whole MiB that prints as 139.80 GiB
            "measured: an out-of-memory message's 'total capacity of 139.80 GiB' on an NVIDIA H200 "
            "(benchmarks/results/largest_batch/h200.json), rounded to 0.01 GiB; the smallest whole MiB within it",
        ),
    ),
)  # fmt: skip


def driver_reserve_bytes(smi_bytes: int) -> int:
    """The driver's reserve assumed for a card whose CUDA total was neither measured nor reported.

    Rule (an assumption, see the module's Known limitations): the largest of the
    reserves recorded in :data:`GPUS` (``nvidia-smi``'s total less the CUDA total,
    measured or reported), each taken both as bytes and as a share of the card's
    total applied to ``smi_bytes``; rounded up to a whole MiB. With the A100 80GB's
    885 MiB and the T4's 2.96% the largest recorded, that is 885 MiB up to about
    29 GiB of ``nvidia-smi`` total and 2.96% above.

    Example:
        >>> driver_reserve_bytes(16_160 * 2**20) // 2**20, driver_reserve_bytes(46_068 * 2**20) // 2**20
        (885, 1365)
    """
    recorded = recorded_reserves()
    by_bytes = max(reserve for _, reserve in recorded)
    by_share = max(-(-smi_bytes * reserve // total) for total, reserve in recorded)
    return -(-max(by_bytes, by_share) // MiB) * MiB


def driver_reserve_rule() -> str:
    """:func:`driver_reserve_bytes`'s rule in words, with the recorded figures.

    Example:
        >>> driver_reserve_rule()
        'the larger of 885 MiB and 2.96% of it'
    """
    recorded = recorded_reserves()
    by_bytes = -(-max(reserve for _, reserve in recorded) // MiB)
    share = max(reserve / total for total, reserve in recorded)
    return f"the larger of {by_bytes} MiB and {share:.2%} of it"


def recorded_reserves() -> list[tuple[int, int]]:
    """``(nvidia-smi total, reserve)`` bytes of each card whose CUDA total was measured or reported."""
    return [(gpu.memory_bytes, gpu.memory_bytes - gpu.cuda_total_bytes) for gpu in GPUS if gpu.cuda_total_bytes]


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
    """Display names of every card in the table, smallest CUDA total first."""
    return [gpu.name for gpu in GPUS]
