"""The Lightning ``MemoryBudgetCallback`` (public faces: ``nnmem_callbacks.lightning`` and ``.lightning_pytorch``)."""
