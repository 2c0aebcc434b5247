"""Keras 3 support: ``estimate_training``, ``MemoryBudgetCallback`` and ``fit_plan``.

Example (any backend)::

    from nnmem_callbacks.keras import MemoryBudgetCallback, estimate_training, fit_plan

    est = estimate_training(model, batch_size=256)          # a MemoryEstimate
    plan = fit_plan(model, budget="2GiB", batch_size=256)   # batch size and accumulation that fit
    model.fit(x, y, batch_size=256, callbacks=[MemoryBudgetCallback(batch_size=256)])

Importing this package imports keras (which imports its backend) but never
torch or tensorflow on its own; each backend estimator is imported on use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on use by __getattr__ below
    from nnmem_callbacks.adapters.keras.callback import MemoryBudgetCallback
    from nnmem_callbacks.adapters.keras.planning import FitPlan, fit_plan
    from nnmem_callbacks.estimators.keras.common import KerasEstimationError
    from nnmem_callbacks.estimators.keras.estimator import estimate_training

__all__ = ["FitPlan", "KerasEstimationError", "MemoryBudgetCallback", "estimate_training", "fit_plan"]


def __getattr__(name: str) -> Any:
    if name == "estimate_training":
        from nnmem_callbacks.estimators.keras.estimator import estimate_training

        return estimate_training
    if name == "KerasEstimationError":
        from nnmem_callbacks.estimators.keras.common import KerasEstimationError

        return KerasEstimationError
    if name in ("MemoryBudgetCallback",):
        from nnmem_callbacks.adapters.keras.callback import MemoryBudgetCallback

        return MemoryBudgetCallback
    if name in ("fit_plan", "FitPlan"):
        from nnmem_callbacks.adapters.keras import planning

        return getattr(planning, name)
    raise AttributeError(f"module 'nnmem_callbacks.keras' has no attribute {name!r}")
