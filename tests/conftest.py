"""Shared fixtures and markers for the test-suite."""

from __future__ import annotations

import os
import sys

import pytest

if "tensorflow" not in sys.modules:
    # TensorFlow's CPU allocator keeps the statistics the Keras tests compare with only when it is a BFC
    # allocator: oneDNN on (the default on AVX-512-class CPUs only) or this variable, read when TensorFlow
    # starts. The path without statistics is tested in fresh processes (tests/test_keras_every_host.py).
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("cuda") is not None and not has_cuda:
            item.add_marker(skip_cuda)
