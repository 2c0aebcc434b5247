"""The PyTorch estimator: a training step traced on fake tensors, per-op rules, the CUDA model (``cuda/``),
per-rank estimates and the closed-form fallback. The public names are in :mod:`nnmem_callbacks.torch`."""
