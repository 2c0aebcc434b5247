"""The TensorFlow estimator's notes write sizes adaptively: a small model's figures are not "0.0 MiB"."""

from __future__ import annotations

from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.estimators.keras.tensorflow.graph import allocator_terms_note


def test_small_figures_keep_their_digits():
    note = allocator_terms_note("bfc", 64, 120_000, 100_000)
    assert f"predicted at {format_bytes(120_000)}" in note and f"({format_bytes(100_000)})" in note
    assert "KiB" in note and "0.1 MiB" not in note
