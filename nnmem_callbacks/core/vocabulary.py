"""The one vocabulary of precision and optimizer names, shared by every entry point.

``estimate_training`` (PyTorch), the napkin formulas, ``nnmem estimate`` and
``nnmem calc`` all read ``precision=`` and ``optimizer=`` through
:func:`canonical_precision` and :func:`canonical_optimizer`, so a name is
accepted, normalised or rejected the same way everywhere, with the same
message. This module is framework-free (no torch, no keras).

Precisions are Lightning's spellings. Lightning's short aliases (``"16"``,
``"bf16"``...) mean what they mean in Lightning (the ``-mixed`` forms); dtype
names that say one thing (``"fp32"``, ``"float64"``) are accepted; dtype names
that could mean two things (``"fp16"``: AMP or everything in fp16?) are
rejected with both readings. ``None`` is the default full precision
(``"32-true"``), as Lightning's ``Trainer(precision=None)`` reads it.

Example:
    >>> canonical_precision("bf16"), canonical_precision("fp32"), canonical_precision(16)
    ('bf16-mixed', '32-true', '16-mixed')
    >>> canonical_optimizer("AdamW"), canonical_optimizer("momentum")
    ('adamw', 'sgd_momentum')
"""

from __future__ import annotations

import difflib
from typing import Any

__all__ = [
    "AMBIGUOUS_PRECISIONS",
    "canonical_optimizer",
    "canonical_precision",
    "OPTIMIZER_ALIASES",
    "optimizer_help",
    "OPTIMIZERS",
    "PRECISION_ALIASES",
    "precision_help",
    "PRECISIONS",
]

#: Precisions in Lightning's spelling.
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true")

#: Other accepted spellings: Lightning's aliases (as Lightning reads them) and unambiguous dtype names.
PRECISION_ALIASES = {
    "32": "32-true",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
    "64": "64-true",
    "transformer-engine": "bf16-mixed",
    "fp32": "32-true",
    "float32": "32-true",
    "fp64": "64-true",
    "float64": "64-true",
}

_FP16_READINGS = "16-mixed (AMP: fp32 parameters, fp16 compute) or 16-true (everything fp16)"
_BF16_READINGS = "bf16-mixed (AMP: fp32 parameters, bf16 compute) or bf16-true (everything bf16)"

#: dtype names that could mean a mixed or a true precision: rejected with both readings.
AMBIGUOUS_PRECISIONS = {
    "fp16": _FP16_READINGS,
    "float16": _FP16_READINGS,
    "half": _FP16_READINGS,
    "bfloat16": _BF16_READINGS,
}

#: Optimizer names (``torch.optim`` classes with default settings; Keras equivalents where they exist).
OPTIMIZERS = (
    "sgd",
    "sgd_momentum",
    "adam",
    "adamw",
    "adamax",
    "nadam",
    "radam",
    "adagrad",
    "adadelta",
    "rmsprop",
    "rprop",
)

#: Other accepted optimizer spellings.
OPTIMIZER_ALIASES = {"momentum": "sgd_momentum"}


def precision_help() -> str:
    """The precision vocabulary in one line, for ``--help`` and error messages.

    Example:
        >>> "16 = 16-mixed" in precision_help()
        True
    """
    aliases = ", ".join(f"{alias} = {name}" for alias, name in PRECISION_ALIASES.items())
    return f"{', '.join(PRECISIONS)} (aliases: {aliases})"


def optimizer_help() -> str:
    """The optimizer vocabulary in one line, for ``--help`` and error messages."""
    aliases = ", ".join(f"{alias} = {name}" for alias, name in OPTIMIZER_ALIASES.items())
    return f"{', '.join(OPTIMIZERS)} (aliases: {aliases})"


def canonical_precision(precision: Any) -> str:
    """Returns the Lightning spelling of a precision (``None``: ``"32-true"``, Lightning's default).

    Raises:
        ValueError: For an ambiguous dtype name (naming both readings) or an
            unknown name (naming the vocabulary, and the closest name).

    Example:
        >>> canonical_precision("fp16")
        Traceback (most recent call last):
        ...
        ValueError: precision 'fp16' is ambiguous; write 16-mixed (AMP: fp32 parameters, fp16 compute) or 16-true (everything fp16)
        >>> canonical_precision(None)
        '32-true'
    """
    if precision is None:  # Lightning's Trainer(precision=None) is its default, 32-true
        return "32-true"
    key = str(precision).strip().lower()
    key = PRECISION_ALIASES.get(key, key)
    if key in PRECISIONS:
        return key
    if key in AMBIGUOUS_PRECISIONS:
        raise ValueError(f"precision {precision!r} is ambiguous; write {AMBIGUOUS_PRECISIONS[key]}")
    raise ValueError(
        f"unknown precision {precision!r}{_did_you_mean(key, [*PRECISIONS, *PRECISION_ALIASES])}; "
        f"valid precisions are {precision_help()}"
    )


def canonical_optimizer(optimizer: Any) -> str:
    """Returns the canonical name of an optimizer name.

    Raises:
        ValueError: Naming the vocabulary, and the closest name.

    Example:
        >>> canonical_optimizer("adamm")
        Traceback (most recent call last):
        ...
        ValueError: unknown optimizer 'adamm' (did you mean 'adam'?); valid optimizers are sgd, sgd_momentum, adam, adamw, adamax, nadam, radam, adagrad, adadelta, rmsprop, rprop (aliases: momentum = sgd_momentum)
    """
    key = str(optimizer).lower()
    key = OPTIMIZER_ALIASES.get(key, key)
    if key in OPTIMIZERS:
        return key
    raise ValueError(
        f"unknown optimizer {optimizer!r}{_did_you_mean(key, [*OPTIMIZERS, *OPTIMIZER_ALIASES])}; "
        f"valid optimizers are {optimizer_help()}"
    )


def _did_you_mean(key: str, names: list[str]) -> str:
    close = difflib.get_close_matches(key, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
