"""The CUDA side of the PyTorch estimator: kernel emulation without a GPU, autocast, SDPA choice, library
workspaces, cuDNN RNN.

Design: docs/cuda-model.md.
"""
