"""``MemoryBudgetCallback`` for the unified ``lightning`` package (``lightning.pytorch``).

Use this module when your Trainer comes from ``lightning.pytorch`` (``import
lightning as L; L.Trainer``). With the standalone ``pytorch_lightning`` package
use :mod:`nnmem_callbacks.lightning`. Both classes share one implementation and
behave identically; their checkpoint state is interchangeable.

Example::

    import lightning.pytorch as pl
    from nnmem_callbacks.lightning_pytorch import MemoryBudgetCallback

    trainer = pl.Trainer(callbacks=[MemoryBudgetCallback(budget="10GiB", policy="shrink")])
"""

from __future__ import annotations

from nnmem_callbacks.adapters.lightning.callback import MemoryBudgetCallbackMixin
from nnmem_callbacks.adapters.lightning.namespace import Namespace
from nnmem_callbacks.core.plan import MemoryBudgetExceeded

_NAMESPACE = Namespace("lightning.pytorch")

__all__ = ["MemoryBudgetCallback", "MemoryBudgetExceeded"]


class MemoryBudgetCallback(MemoryBudgetCallbackMixin, _NAMESPACE.Callback):
    __doc__ = MemoryBudgetCallbackMixin.__doc__
    _ns = _NAMESPACE
