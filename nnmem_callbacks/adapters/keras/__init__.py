"""The Keras ``MemoryBudgetCallback`` and ``fit_plan`` (public face: ``nnmem_callbacks.keras``)."""
