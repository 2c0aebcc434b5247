"""One byte-formatting and byte-parsing convention for the whole package.

Bytes are integers everywhere in nnmem_callbacks; units appear only here, when a
number is shown to a person or read from one. Binary units are used and labelled
as such (KiB, MiB, GiB, TiB). Decimal spellings ("GB") are accepted on input and
mean powers of 1000, because that is what GPU vendors print on the box.

Example:
    >>> format_bytes(1536)
    '1.50 KiB'
    >>> parse_bytes("10GiB")
    10737418240
    >>> parse_bytes("16 GB")
    16000000000
"""

from __future__ import annotations

import re

__all__ = ["BARE_NUMBER", "format_bytes", "GiB", "KiB", "MiB", "parse_bytes", "TiB", "to_mib", "UNIT_NAMES"]

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_BINARY_UNITS = (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB))

_UNIT_FACTORS = {
    "b": 1,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "k": KiB,
    "m": MiB,
    "g": GiB,
    "t": TiB,
}

_SIZE_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
#: A number without a unit: what a budget reads as a fraction of the device (``core.plan.parse_budget_text``), never
#: as bytes.
BARE_NUMBER = re.compile(r"\s*[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?\s*")


def format_bytes(num_bytes: int | float, precision: int = 2) -> str:
    """Formats a byte count with a binary unit.

    Args:
        num_bytes: The number of bytes (may be negative, for differences).
        precision: Digits after the decimal point for non-byte units.

    Returns:
        A string such as ``"3.00 GiB"`` or ``"512 B"``.

    Example:
        >>> format_bytes(3 * GiB)
        '3.00 GiB'
        >>> format_bytes(-2 * MiB)
        '-2.00 MiB'
    """
    sign = "-" if num_bytes < 0 else ""
    magnitude = abs(num_bytes)
    for label, factor in _BINARY_UNITS:
        if magnitude >= factor:
            return f"{sign}{magnitude / factor:.{precision}f} {label}"
    return f"{sign}{int(magnitude)} B"


def to_mib(num_bytes: int | float) -> float:
    """Converts bytes to MiB as a float (for logging metrics).

    Example:
        >>> to_mib(3 * MiB)
        3.0
    """
    return num_bytes / MiB


def parse_bytes(text: str) -> int:
    """Parses a human byte size such as ``"10GiB"``, ``"512 MiB"`` or ``"16GB"``.

    A bare number means bytes. ``KiB/MiB/GiB/TiB`` (and the short ``K/M/G/T``)
    are powers of 1024; ``KB/MB/GB/TB`` are powers of 1000.

    Args:
        text: The size to parse.

    Returns:
        The size in bytes, as an integer.

    Raises:
        ValueError: If the text is not a number followed by a known unit.

    Example:
        >>> parse_bytes("1.5 KiB")
        1536
    """
    match = _SIZE_PATTERN.match(str(text))
    if match is None:
        raise ValueError(
            f"cannot read {text!r} as a byte size; write a number with an optional unit, "
            f"e.g. '10GiB', '512MiB', '16GB' or '1048576' (units: {', '.join(_valid_units())})"
        )
    number, unit = match.groups()
    factor = _UNIT_FACTORS.get(unit.lower() if unit else "b")
    if factor is None:
        raise ValueError(f"unknown byte unit {unit!r} in {text!r}; valid units are {', '.join(_valid_units())}")
    return int(round(float(number) * factor))


#: The units a byte size may be written in (:func:`parse_bytes`).
UNIT_NAMES = ("B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB")


def _valid_units() -> list[str]:
    return list(UNIT_NAMES)
