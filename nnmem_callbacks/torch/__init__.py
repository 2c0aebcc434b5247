"""The PyTorch estimator: ``estimate_training`` on fake tensors, the CUDA
allocator model, and the closed-form fallback."""

from nnmem_callbacks.probes.runner import UnsupportedKernelError
from nnmem_callbacks.torch.estimator import EstimationInputError, estimate_training

__all__ = ["EstimationInputError", "UnsupportedKernelError", "estimate_training"]
