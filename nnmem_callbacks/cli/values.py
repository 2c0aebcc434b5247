"""Reading option values: counts, input shapes, ``KEY=VALUE`` model arguments, argparse types."""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any, Sequence

from nnmem_callbacks.cli.errors import CliError

__all__ = [
    "count_arg",
    "dims_product_arg",
    "InputSpec",
    "parse_count",
    "parse_input_shape",
    "parse_model_args",
    "positive_int_arg",
]

_DTYPES = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "f32": "float32",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "f16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float64": "float64",
    "double": "float64",
    "fp64": "float64",
    "int64": "int64",
    "long": "int64",
    "int": "int64",
    "i64": "int64",
    "int32": "int32",
    "i32": "int32",
    "int16": "int16",
    "int8": "int8",
    "uint8": "uint8",
    "bool": "bool",
}


def positive_int_arg(text: str) -> int:
    """A whole number from 1 to :data:`~nnmem_callbacks.core.batch_search.MAX_BATCH_SEARCH_LIMIT` (batch sizes,
    ranks, widths): the largest batch the estimator searches, and far beyond any real count of these.

    Example:
        >>> positive_int_arg("32")
        32
        >>> positive_int_arg("99999999999999999999")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: must be at most 16,777,216 (larger values are not estimated), got 99999999999999999999
    """
    from nnmem_callbacks.core.batch_search import MAX_BATCH_SEARCH_LIMIT

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; e.g. 32") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    if value > MAX_BATCH_SEARCH_LIMIT:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_BATCH_SEARCH_LIMIT:,} (larger values are not estimated), got {value}"
        )
    return value


_COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(text: str) -> int:
    """Reads a count such as ``"19M"``, ``"1.5B"``, ``"532,752"`` or ``"19e6"``.

    Example:
        >>> parse_count("19M"), parse_count("1.5B"), parse_count("532,752"), parse_count("1e3")
        (19000000, 1500000000, 532752, 1000)
    """
    cleaned = str(text).strip().replace(",", "").replace("_", "").lower()
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)", cleaned)
    if match is None:
        raise ValueError(f"cannot read {text!r} as a count; write e.g. 19000000, 19M, 1.5B or 532,752")
    value = float(match.group(1)) * _COUNT_SUFFIXES[match.group(2)]
    if value != int(value) or value < 0:
        raise ValueError(f"{text!r} is not a whole, non-negative count")
    return int(value)


def count_arg(text: str) -> int:
    try:
        return parse_count(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def dims_product_arg(text: str) -> int:
    """``--input-size``: a count or per-sample dims, separated as ``--input-shape`` takes them (``3,224,224`` or
    ``3x224x224``).

    Example:
        >>> dims_product_arg("3,224,224"), dims_product_arg("3x224x224"), dims_product_arg("150K")
        (150528, 150528, 150000)
    """
    parts = re.split(r"\s*[x×]\s*", text.strip()) if _X_SEPARATED.fullmatch(text.strip()) else text.split(",")
    try:
        dims = [parse_count(part) for part in parts if part.strip()]
        if not dims:
            raise ValueError(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cannot read {text!r}; write a count (150528) or dims (3,224,224 or 3x224x224)"
        ) from None
    product = 1
    for dim in dims:
        product *= dim
    return product


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One model input per sample: ``[NAME=][DTYPE:]DIMS``."""

    name: str | None
    dtype: str
    shape: tuple[int, ...]


_X_SEPARATED = re.compile(r"\d+(?:\s*[x×]\s*\d+)+")


def _shape_error(text: str, what: str) -> str:
    return (
        f"cannot read input shape {text!r}: {what}; write the per-sample dimensions without the batch "
        f"dimension, separated by commas, e.g. 3,224,224 (or 3x224x224), int64:128 or input_ids=int64:128"
    )


def parse_input_shape(text: str) -> InputSpec:
    """Reads one ``--input-shape``.

    Raises:
        CliError: Naming the valid syntax and dtypes.

    Example:
        >>> parse_input_shape("3,224,224")
        InputSpec(name=None, dtype='float32', shape=(3, 224, 224))
        >>> parse_input_shape("input_ids=int64:128")
        InputSpec(name='input_ids', dtype='int64', shape=(128,))
        >>> parse_input_shape("labels=long:")
        InputSpec(name='labels', dtype='int64', shape=())
    """
    raw = text.strip()
    name = None
    match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", raw)
    if match:
        name, raw = match.group(1), match.group(2)
    dtype = "float32"
    if ":" in raw:
        dtype_text, raw = raw.split(":", 1)
        key = dtype_text.strip().lower()
        if key not in _DTYPES:
            raise CliError(
                f"--input-shape {text!r}: unknown dtype {dtype_text!r}; valid dtypes: "
                f"{', '.join(sorted(set(_DTYPES.values())))} (e.g. int64:128)"
            )
        dtype = _DTYPES[key]
    explicit_dtype = ":" in text
    raw = raw.strip()
    if raw[:1] in "([" and raw[-1:] in ")]":
        raw = raw[1:-1].strip()
    if not raw:
        if explicit_dtype:
            return InputSpec(name, dtype, ())  # a scalar per sample, written as DTYPE: (e.g. labels=int64:)
        raise CliError(_shape_error(text, "no dimensions given; a scalar per sample is written DTYPE:, e.g. int64:"))
    if _X_SEPARATED.fullmatch(raw):
        parts = re.split(r"\s*[x×]\s*", raw)
    else:
        parts = raw.split(",")
        if len(parts) > 1 and not parts[-1].strip():
            parts = parts[:-1]  # a tuple's trailing comma: (3,)
    dims: list[int] = []
    for part in (p.strip() for p in parts):
        if not part.isdigit() or int(part) < 1:
            what = "an empty dimension" if not part else f"{part!r} is not a positive whole number"
            raise CliError(_shape_error(text, what))
        dims.append(int(part))
    return InputSpec(name, dtype, tuple(dims))


def parse_model_args(items: Sequence[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; values are Python literals where they parse, else strings.

    Example:
        >>> parse_model_args(["num_classes=10", "name=tiny", "dims=(1, 2)"])
        {'num_classes': 10, 'name': 'tiny', 'dims': (1, 2)}
    """
    import ast

    kwargs: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise CliError(f"--model-arg {item!r}: write KEY=VALUE, e.g. --model-arg num_classes=10")
        try:
            kwargs[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key.strip()] = value
    return kwargs
