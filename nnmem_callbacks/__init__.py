"""nnmem_callbacks: predict the peak memory of training before it runs, and act on it.

Public face:

* :func:`estimate_training` - the PyTorch estimator (imports torch on first use).
* :func:`estimate_per_rank` - the same for one rank of DDP, FSDP2 or ZeRO, described by a :class:`Strategy`.
* :class:`MemoryEstimate` - the framework-free result of every estimator.
* ``nnmem_callbacks.lightning.MemoryBudgetCallback`` and
  ``nnmem_callbacks.keras.MemoryBudgetCallback`` - the adapters, loaded lazily.

Example:
    >>> import torch
    >>> from nnmem_callbacks import estimate_training
    >>> model = torch.nn.Sequential(torch.nn.Linear(1000, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    >>> est = estimate_training(model, torch.empty(256, 1000, device="meta"), optimizer="sgd")
    >>> est.method, est.batch_size
    ('trace', 256)
"""

from __future__ import annotations

from typing import Any

from nnmem_callbacks.core.estimate import Category, MemoryEstimate, PhaseLine
from nnmem_callbacks.core.formatting import format_summary
from nnmem_callbacks.core.plan import MemoryBudgetExceeded, Plan
from nnmem_callbacks.core.strategy import Strategy
from nnmem_callbacks.core.units import format_bytes, parse_bytes

__version__ = "0.7.0"

__all__ = [
    "Category",
    "MemoryBudgetExceeded",
    "MemoryEstimate",
    "PhaseLine",
    "Plan",
    "Strategy",
    "estimate_per_rank",
    "estimate_training",
    "format_bytes",
    "format_summary",
    "parse_bytes",
]


def __getattr__(name: str) -> Any:
    if name == "estimate_training":
        from nnmem_callbacks.estimators.torch.estimator import estimate_training

        return estimate_training
    if name == "estimate_per_rank":
        from nnmem_callbacks.estimators.torch.distributed import estimate_per_rank

        return estimate_per_rank
    raise AttributeError(f"module 'nnmem_callbacks' has no attribute {name!r}")
