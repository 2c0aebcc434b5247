"""Context managers that keep a user's run untouched while it is simulated.

* :func:`swapped_tensors` puts fake parameters and buffers into the user's
  module for the duration of a trace and restores the originals after, even on
  error.
* :func:`preserved_module_state` restores plain attributes a ``forward`` or
  ``training_step`` may set or append to (``self.last_output = ...``), and the
  ``training`` flags.
* :func:`preserved_rng` restores every random number generator state.
"""

from __future__ import annotations

import contextlib
import random
from typing import Callable, Iterator

import torch
from torch import nn

__all__ = ["preserved_module_state", "preserved_rng", "swapped_tensors"]


@contextlib.contextmanager
def swapped_tensors(
    model: nn.Module, replace: Callable[[torch.Tensor, bool], torch.Tensor]
) -> Iterator[dict[int, torch.Tensor]]:
    """Temporarily replaces every parameter and buffer slot of ``model``.

    Args:
        model: The user's module.
        replace: ``replace(tensor, is_parameter) -> substitute``; called once per
            distinct tensor, so tied weights stay tied.

    Yields:
        ``id(original) -> substitute`` for every replaced tensor.
    """
    substitutes: dict[int, torch.Tensor] = {}
    saved: list[tuple[dict, str, torch.Tensor]] = []
    try:
        for module in model.modules():
            for slots, is_parameter in ((module._parameters, True), (module._buffers, False)):
                for name, tensor in list(slots.items()):
                    if tensor is None:
                        continue
                    substitute = substitutes.get(id(tensor))
                    if substitute is None:
                        substitute = substitutes[id(tensor)] = replace(tensor, is_parameter)
                    saved.append((slots, name, tensor))
                    slots[name] = substitute
        yield substitutes
    finally:
        for slots, name, tensor in reversed(saved):
            slots[name] = tensor


_SKIPPED_ATTRIBUTES = frozenset({"_parameters", "_buffers", "_modules", "training"})


@contextlib.contextmanager
def preserved_module_state(model: nn.Module) -> Iterator[None]:
    """Restores the modules' plain attributes and training flags afterwards.

    Attributes re-assigned or added during the block are put back or removed;
    lists, dicts and sets that were mutated in place get their old contents
    back. This keeps fake tensors from leaking into the user's objects, e.g.
    through ``self.outputs.append(loss)`` in a ``training_step``.
    """
    snapshots = []
    for module in model.modules():
        attributes = {}
        for name, value in vars(module).items():
            if name in _SKIPPED_ATTRIBUTES:
                continue
            if isinstance(value, (list, dict, set)):
                attributes[name] = (value, type(value)(value) if not isinstance(value, dict) else dict(value))
            else:
                attributes[name] = (value, None)
        snapshots.append((module, module.training, attributes))
    try:
        yield
    finally:
        for module, training, attributes in snapshots:
            module.training = training
            current = vars(module)
            for name in [n for n in current if n not in attributes and n not in _SKIPPED_ATTRIBUTES]:
                del current[name]
            for name, (value, contents) in attributes.items():
                if contents is not None:
                    if isinstance(value, list):
                        value[:] = contents
                    elif isinstance(value, dict):
                        value.clear()
                        value.update(contents)
                    else:
                        value.clear()
                        value.update(contents)
                current[name] = value


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restores torch (CPU and initialised CUDA), Python and NumPy RNG states."""
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    python_state = random.getstate()
    try:
        import numpy

        numpy_state = numpy.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency
        numpy = None
        numpy_state = None
    try:
        yield
    finally:
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)
