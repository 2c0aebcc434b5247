"""The PyTorch estimator: ``estimate_training`` on fake tensors, the CUDA
allocator model, and the closed-form fallback."""

from nnmem_callbacks.probes.runner import UnsupportedKernelError
from nnmem_callbacks.torch.estimator import estimate_training
from nnmem_callbacks.torch.step import EstimationInputError

__all__ = ["EstimationInputError", "UnsupportedKernelError", "estimate_training"]
