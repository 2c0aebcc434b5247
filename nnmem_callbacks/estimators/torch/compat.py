"""Makes libraries take the path of the real (eager) run while the step is traced.

``transformers`` skips building an attention mask when the mask has no padding
(``padding_mask.all()``), unless its ``is_tracing(tensor)`` check says the mask
is being traced, which it does for every ``FakeTensor``. The trace would then
build a float mask that the real run never builds; in eager attention under
``bf16-mixed`` it promotes the scores, softmax and dropout to fp32 (+46% on a
small BERT with an all-ones mask). :func:`eager_library_checks` makes the
mask-building modules' ``is_tracing`` ignore fake tensors during the trace
(dynamo, ``torch.jit`` and ``torch.fx`` tracing are still reported), so their
value checks run as in eager.

Those value checks then read a traced value (``.all()``), which gets the
tracer's placeholder: ``True``, "no padding". That is only right when the
user's mask has no padding, so the patch applies only when every
``*attention_mask`` tensor of the example batch holds real values without a
zero. A mask with padding, or on the meta device (values unknown), keeps the
library's tracing path, which builds the mask as a padded batch does in the
real run. Nothing happens when ``transformers`` has not been imported.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from typing import Any, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor

__all__ = ["eager_library_checks", "MASK_MODULES", "masks_without_padding"]

#: The transformers modules whose ``is_tracing`` decides whether a mask is built.
MASK_MODULES = ("transformers.masking_utils", "transformers.modeling_attn_mask_utils")


def _mask_tensors(batch: Any) -> list[Any]:
    """The values of the batch's ``*attention_mask`` entries (mappings, such as
    a tokenizer's ``BatchEncoding``, at any depth)."""
    found = []
    if isinstance(batch, Mapping):
        for key, value in batch.items():
            if isinstance(key, str) and key.endswith("attention_mask"):
                found.append(value)
            else:
                found.extend(_mask_tensors(value))
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            found.extend(_mask_tensors(value))
    return found


def masks_without_padding(batch: Any) -> bool:
    """Whether the real run would skip the attention mask of ``batch``: it has
    no ``*attention_mask`` tensor, or only real ones without a zero.

    Example:
        >>> masks_without_padding({"input_ids": torch.zeros(2, 3), "attention_mask": torch.ones(2, 3)})
        True
        >>> masks_without_padding({"attention_mask": torch.tensor([[1, 1, 0]])})
        False
        >>> from collections import UserDict  # as transformers' BatchEncoding
        >>> masks_without_padding([UserDict(attention_mask=torch.tensor([[1, 0]]))])
        False
        >>> masks_without_padding({"attention_mask": torch.ones(2, 3, device="meta")})
        False
    """
    for mask in _mask_tensors(batch):
        if not isinstance(mask, torch.Tensor):
            continue
        if mask.device.type == "meta" or isinstance(mask, FakeTensor):
            return False
        if not bool(torch.all(mask != 0)):
            return False
    return True


@contextlib.contextmanager
def eager_library_checks(example_batch: Any) -> Iterator[None]:
    """While active, transformers' mask builders do not treat fake tensors as traced.

    Only the ``is_tracing`` names that :data:`MASK_MODULES` imported are
    replaced (and restored on exit), and only when
    :func:`masks_without_padding` holds for ``example_batch``.
    """
    modules = [sys.modules.get(name) for name in MASK_MODULES]
    modules = [m for m in modules if m is not None and callable(getattr(m, "is_tracing", None))]
    if not modules or not masks_without_padding(example_batch):
        yield
        return
    originals = [(module, module.is_tracing) for module in modules]

    def patched(original):
        def is_tracing(tensor=None, *args, **kwargs):
            if isinstance(tensor, FakeTensor):
                tensor = None  # still reports dynamo / jit / stream capture
            return original(tensor, *args, **kwargs)

        return is_tracing

    for module, original in originals:
        module.is_tracing = patched(original)
    try:
        yield
    finally:
        for module, original in originals:
            module.is_tracing = original
