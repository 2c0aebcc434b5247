"""``MemoryBudgetCallback`` for ``pytorch_lightning``.

Use this module with the standalone ``pytorch_lightning`` package. With the
unified ``lightning`` package (``import lightning.pytorch as pl``) use
:mod:`nnmem_callbacks.lightning_pytorch` instead: Lightning rejects callbacks
from the other namespace.

=====================================  ================================================
your Trainer comes from                import the callback from
=====================================  ================================================
``pytorch_lightning``                  ``nnmem_callbacks.lightning``
``lightning.pytorch`` / ``lightning``  ``nnmem_callbacks.lightning_pytorch``
=====================================  ================================================

Example:
    >>> import pytorch_lightning as pl
    >>> from nnmem_callbacks.lightning import MemoryBudgetCallback
    >>> trainer = pl.Trainer(callbacks=[MemoryBudgetCallback(policy="shrink")], logger=False,
    ...                      enable_checkpointing=False, enable_progress_bar=False)
    >>> isinstance(trainer.callbacks[0], pl.Callback)
    True
"""

from __future__ import annotations

from nnmem_callbacks.adapters.lightning.callback import MemoryBudgetCallbackMixin
from nnmem_callbacks.adapters.lightning.namespace import Namespace
from nnmem_callbacks.core.plan import MemoryBudgetExceeded

_NAMESPACE = Namespace("pytorch_lightning")

__all__ = ["MemoryBudgetCallback", "MemoryBudgetExceeded"]


class MemoryBudgetCallback(MemoryBudgetCallbackMixin, _NAMESPACE.Callback):
    __doc__ = MemoryBudgetCallbackMixin.__doc__
    _ns = _NAMESPACE
