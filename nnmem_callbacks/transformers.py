"""``MemoryBudgetCallback`` and ``plan_training_arguments`` for the Hugging Face ``Trainer`` (and TRL's trainers).

Example:
    >>> from nnmem_callbacks.transformers import MemoryBudgetCallback, plan_training_arguments
    >>> callback = MemoryBudgetCallback(budget="8GiB", policy="warn")
    >>> # trainer = transformers.Trainer(model, args, train_dataset=..., callbacks=[callback])
    >>> callback.policy
    'warn'
"""

from __future__ import annotations

from nnmem_callbacks.adapters.transformers.callback import MemoryBudgetCallback
from nnmem_callbacks.adapters.transformers.planning import TrainingPlan, plan_training_arguments
from nnmem_callbacks.core.plan import MemoryBudgetExceeded

__all__ = ["MemoryBudgetCallback", "MemoryBudgetExceeded", "plan_training_arguments", "TrainingPlan"]
