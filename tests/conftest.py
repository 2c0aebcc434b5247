"""Shared fixtures and markers for the test-suite."""

from __future__ import annotations

import os
import tempfile

import pytest

# Kernel probes (nnmem_callbacks.probes) cache their measurements on disk: the
# test-suite never writes to the real user cache directory. Set at import so
# that doctests and child processes inherit it; tests needing their own
# directory monkeypatch NNMEM_CACHE_DIR.
os.environ["NNMEM_CACHE_DIR"] = tempfile.mkdtemp(prefix="nnmem-test-cache-")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(skip_cuda)
