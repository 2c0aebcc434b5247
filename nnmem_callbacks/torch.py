"""The PyTorch estimator's public face: ``estimate_training`` on fake tensors, per-rank estimates, their errors.

Example:
    >>> import torch
    >>> from nnmem_callbacks.torch import estimate_training
    >>> model = torch.nn.Linear(8, 2)
    >>> estimate_training(model, torch.empty(4, 8, device="meta"), optimizer="sgd").method
    'trace'
"""

from nnmem_callbacks.estimators.torch.distributed import estimate_per_rank
from nnmem_callbacks.estimators.torch.estimator import estimate_training
from nnmem_callbacks.estimators.torch.step import EstimationInputError
from nnmem_callbacks.probes.runner import UnsupportedKernelError

__all__ = ["EstimationInputError", "UnsupportedKernelError", "estimate_per_rank", "estimate_training"]
