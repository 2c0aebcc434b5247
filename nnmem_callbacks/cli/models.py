"""Gathering the model: factories from modules or files, the batch, the forward check."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from nnmem_callbacks.cli.errors import CliError, first_line
from nnmem_callbacks.cli.values import InputSpec

__all__ = [
    "build_model",
    "check_forward",
    "check_forward_inputs",
    "load_factory",
    "looks_like_a_shape_error",
    "make_batch",
]

_MODEL_SPEC_HELP = (
    "MODEL must be 'package.module:factory', 'path/to/file.py:factory' (a callable returning a "
    "torch.nn.Module) or a saved Keras model 'model.keras'"
)


def load_factory(spec: str) -> Any:
    """Imports the callable (or module instance) a ``MODEL`` spec names.

    Raises:
        CliError: For a malformed spec, a missing file or module, or a
            missing attribute; the message names the fix.
    """
    location, sep, attribute = spec.rpartition(":")
    if not sep or not location or not attribute:
        hint = ""
        if spec.endswith(".py") and os.path.isfile(spec):
            hint = f"; name the factory in it: {spec}:FACTORY (callables there: {_callables_in_file(spec)})"
        raise CliError(f"{_MODEL_SPEC_HELP}; got {spec!r}{hint}")
    if not attribute.isidentifier():
        raise CliError(f"{_MODEL_SPEC_HELP}; {attribute!r} is not a Python name (in {spec!r})")
    is_path = location.endswith(".py") or "/" in location or os.sep in location
    if is_path:
        path = Path(location)
        if not path.is_file():
            raise CliError(f"model file {location!r} not found (from {spec!r}); give a path to a .py file")
        module = _import_file(path, spec)
    else:
        try:
            module = importlib.import_module(location)
        except ModuleNotFoundError as error:
            raise CliError(
                f"cannot import module {location!r} ({error}); is it installed or on PYTHONPATH? "
                f"For a file, write path/to/{location.replace('.', '/')}.py:{attribute}"
            ) from None
        except Exception as error:  # noqa: BLE001 - user code
            raise CliError(f"importing {location!r} raised {type(error).__name__}: {first_line(error)}") from None
    if not hasattr(module, attribute):
        names = _public_callables(module)
        raise CliError(
            f"{location!r} has no attribute {attribute!r}; callables defined there: {', '.join(names) or 'none'}"
        )
    return getattr(module, attribute)


def _import_file(path: Path, spec: str) -> Any:
    name = "_nnmem_model_" + re.sub(r"\W", "_", str(path.resolve().with_suffix("")))
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise CliError(f"cannot load {str(path)!r} as a Python file (from {spec!r})")
    module = importlib.util.module_from_spec(module_spec)
    directory = str(path.resolve().parent)
    sys.path.insert(0, directory)
    try:
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - user code
        sys.modules.pop(name, None)
        raise CliError(f"running {str(path)!r} raised {type(error).__name__}: {first_line(error)}") from None
    finally:
        if directory in sys.path:
            sys.path.remove(directory)
    return module


def _public_callables(module: Any) -> list[str]:
    return sorted(
        name
        for name, value in vars(module).items()
        if callable(value) and not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
    )


def _callables_in_file(path: str) -> str:
    import ast

    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError):
        return "unknown"
    names = [
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")
    ]
    return ", ".join(names) or "none"


def build_model(spec: str, model_args: dict[str, Any] | None = None, *, factory: Any = None) -> Any:
    """Loads ``spec`` (unless ``factory`` is given) and calls the factory; returns the ``torch.nn.Module``.

    Raises:
        CliError: If the factory raises or returns something else than a module.
    """
    if factory is None:
        factory = load_factory(spec)
    import torch

    if isinstance(factory, torch.nn.Module):
        if model_args:
            raise CliError(f"{spec!r} is a module instance, not a factory; --model-arg cannot be applied")
        return factory
    if not callable(factory):
        raise CliError(f"{spec!r} is {_an_object(factory)}, not a callable; point MODEL at a function or class")
    try:
        model = factory(**(model_args or {}))
    except Exception as error:  # noqa: BLE001 - user code
        raise CliError(
            f"the factory {spec!r} raised {type(error).__name__}: {first_line(error)}; "
            f"check that it runs on its own (and its --model-arg values)"
        ) from None
    if not isinstance(model, torch.nn.Module):
        keras = type(model).__module__.split(".")[0] in ("keras", "tf_keras", "tensorflow")
        hint = "; for a Keras model, save it (model.save('model.keras')) and give the file as MODEL" if keras else ""
        raise CliError(f"the factory {spec!r} returned {_an_object(model)}; it must return a torch.nn.Module{hint}")
    return model


def make_batch(inputs: Sequence[InputSpec], batch_size: int) -> Any:
    """Meta tensors of the given per-sample shapes (no memory is allocated).

    One unnamed input gives a tensor, several give a tuple (``model(*batch)``),
    named inputs give a dict (``model(**batch)``).
    """
    import torch

    if not inputs:
        raise CliError("give the model's input shape, e.g. --input-shape 3,224,224 (per sample, no batch dimension)")
    named = [spec.name is not None for spec in inputs]
    if any(named) and not all(named):
        raise CliError("name all inputs or none: e.g. -i input_ids=int64:128 -i labels=int64:128")
    tensors = [
        torch.empty((batch_size, *spec.shape), dtype=getattr(torch, spec.dtype), device="meta") for spec in inputs
    ]
    if all(named):
        return {spec.name: tensor for spec, tensor in zip(inputs, tensors)}
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def _real_batch(inputs: Sequence[InputSpec], batch_size: int) -> Any:
    import torch

    tensors = [torch.zeros((batch_size, *spec.shape), dtype=getattr(torch, spec.dtype)) for spec in inputs]
    if inputs and inputs[0].name is not None:
        return {spec.name: tensor for spec, tensor in zip(inputs, tensors)}
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def check_forward_inputs(model: Any, inputs: Sequence[InputSpec]) -> None:
    """Checks the ``-i`` inputs against the parameters of ``model.forward``, where its signature can be read.

    Several unnamed inputs are passed positionally (``model(*batch)``), named ones as keywords
    (``model(**batch)``). Nothing is said when the signature cannot be read or takes ``*args``/``**kwargs``
    that could absorb the difference.

    Raises:
        CliError: Naming forward's inputs, how many were given and the ``-i`` to add or drop.
    """
    import inspect

    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError, AttributeError):
        return
    kinds = inspect.Parameter
    positional = [p for p in parameters if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    required_keywords = [p for p in parameters if p.kind == kinds.KEYWORD_ONLY and p.default is p.empty]
    star_args = any(p.kind == kinds.VAR_POSITIONAL for p in parameters)
    star_kwargs = any(p.kind == kinds.VAR_KEYWORD for p in parameters)
    shown = f"({', '.join(p.name for p in positional)})"
    if inputs and inputs[0].name is not None:  # keywords
        if any(p.kind == kinds.POSITIONAL_ONLY for p in parameters):
            return
        names = {spec.name for spec in inputs}
        missing = [p.name for p in (*required, *required_keywords) if p.name not in names]
        if missing:
            add = " ".join(f"-i {name}=DTYPE:DIMS" for name in missing)
            raise CliError(
                f"forward{shown} also needs {', '.join(missing)}, and the named inputs give "
                f"{', '.join(sorted(names))}; add {add}"
            )
        known = {p.name for p in parameters}
        unknown = sorted(names - known)
        if unknown and not star_kwargs:
            raise CliError(
                f"forward{shown} has no input named {', '.join(unknown)}; name the inputs after forward's "
                f"parameters: {', '.join(p.name for p in parameters if p.kind != kinds.VAR_POSITIONAL)}"
            )
        return
    given = len(inputs)
    if required_keywords:
        return  # keyword-only inputs cannot be given unnamed; the forward check says what went wrong
    plural = "input" if len(required) == 1 else "inputs"
    if given < len(required):
        more = "another -i" if len(required) - given == 1 else f"{len(required) - given} more -i"
        raise CliError(
            f"forward takes {len(required)} {plural} {shown}, {given} given; add {more} "
            f"(one per input, in forward's order)"
        )
    if given > len(positional) and not star_args:
        takes = f"{len(positional)} {'input' if len(positional) == 1 else 'inputs'} {shown}"
        raise CliError(f"forward takes {takes}, {given} given; drop {given - len(positional)} -i")


def check_forward(model: Any, inputs: Sequence[InputSpec]) -> None:
    """Runs the model once on a real batch of 2; a failure is a shape mistake."""
    import torch

    if any(t.is_meta for t in list(model.parameters())[:1]):
        return
    batch = _real_batch(inputs, 2)
    try:
        with torch.no_grad():
            if isinstance(batch, dict):
                model(**batch)
            elif isinstance(batch, tuple):
                model(*batch)
            else:
                model(batch)
    except Exception as error:  # noqa: BLE001 - user code
        if isinstance(error, TypeError):
            check_forward_inputs(model, inputs)  # a wrong number of inputs, named as such where forward tells
        shapes = ", ".join(_describe_input(spec) for spec in inputs)
        if looks_like_a_shape_error(error):
            raise CliError(
                f"the model cannot run on inputs of per-sample shape {shapes}: {type(error).__name__}: "
                f"{first_line(error)}; fix --input-shape (per-sample dimensions, without the batch dimension)"
            ) from None
        raise CliError(
            f"the model's forward raised {type(error).__name__}: {first_line(error)} (on a batch of 2 of per-sample "
            f"shape {shapes}); this looks like an error in the model code, not in the options: run the model once "
            f"on a real batch to see the traceback"
        ) from None


#: Words in the errors torch raises for inputs of the wrong shape or dtype (mat1 and mat2, size mismatch,
#: "Expected 4D input", "Given groups=1, weight of size ...", an embedding index out of range).
_SHAPE_WORDS = re.compile(
    r"shape|size|dimension|\bdims?\b|mat1|mat2|expected (?:\d|input|.*(?:dtype|type))|index out of range|"
    r"must match|cannot be multiplied|unpack|channels",
    re.IGNORECASE,
)


def looks_like_a_shape_error(error: BaseException) -> bool:
    """Whether ``error`` reads like torch's complaint about an input's shape or dtype.

    Example:
        >>> looks_like_a_shape_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x4 and 5x3)"))
        True
        >>> looks_like_a_shape_error(ValueError("my model is broken"))
        False
    """
    return isinstance(error, (RuntimeError, IndexError, TypeError, ValueError)) and bool(
        _SHAPE_WORDS.search(str(error))
    )


def _an_object(value: Any) -> str:
    """``value`` named by its type, and shown (shortened).

    Example:
        >>> _an_object(3), _an_object(None), _an_object([1])
        ("an object of type 'int' (3)", "an object of type 'NoneType' (None)", "an object of type 'list' ([1])")
    """
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"an object of type {type(value).__name__!r} ({shown})"


def _describe_input(spec: InputSpec) -> str:
    text = f"{spec.dtype}{list(spec.shape)}"
    return f"{spec.name}={text}" if spec.name else text
