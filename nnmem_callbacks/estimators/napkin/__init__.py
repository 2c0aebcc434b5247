"""Closed-form ("napkin") training-memory estimates from bare numbers: a parameter count, layer widths, or a
transformer's shape. Pure functions, no torch: numbers in, a :class:`~nnmem_callbacks.core.estimate.MemoryEstimate`
out, so the same tables, JSON and "which GPU fits" code serve traced and napkin estimates.

What is counted and how: ``docs/napkin.md``.

Example:
    >>> est = transformer_estimate(layers=12, hidden=768, heads=12, vocab=30522, seq_len=128,
    ...                            batch_size=32, optimizer="adamw", arch="bert")
    >>> est.method, est.extra["params"]
    ('napkin:transformer', 109514298)
    >>> est.peak_bytes == sum(est.breakdown.values())
    True

Known limitations:
    * Model-specific extras (key/value caches, attention masks, architecture quirks) are not counted.
    * The CUDA caching allocator's reserve is not modelled (``reserved_bytes`` is ``None``); on CUDA
      ``overhead_bytes`` is the measured context of a GEMM run (:func:`cuda_overhead_bytes`, the traced estimator's
      figure without a GPU) and the two cuBLAS workspaces are ``workspaces`` (:func:`cuda_workspace_bytes`), both
      for the architecture of a GPU named by ``device`` (``"cuda:a100-80gb"``), else for the default, Hopper
      (:data:`CUDA_OVERHEAD_BYTES`, :data:`CUDA_WORKSPACE_BYTES`). Only Hopper's context was measured: other
      architectures get its figure.
    * Kernel workspaces are ignored.
"""

from nnmem_callbacks.estimators.napkin.common import (
    ACTIVATIONS,
    ARCHITECTURES,
    ATTENTION,
    CUDA_OVERHEAD_BYTES,
    CUDA_WORKSPACE_BYTES,
    OPTIMIZER_STATE,
    PRECISION_ALIASES,
    PRECISIONS,
    RECOMPUTE,
    check_optimizer,
    check_precision,
    cuda_overhead_bytes,
    cuda_workspace_bytes,
)
from nnmem_callbacks.estimators.napkin.estimates import (
    korthikanti_layer_bytes,
    mlp_estimate,
    params_estimate,
    position_count,
    transformer_estimate,
    transformer_params,
)
from nnmem_callbacks.estimators.napkin.explain import dominant_terms, explain, what_if
from nnmem_callbacks.estimators.napkin.finetune import LORA_TARGETS, QUANTIZATIONS, lora_estimate

__all__ = [
    "ACTIVATIONS",
    "ARCHITECTURES",
    "ATTENTION",
    "CUDA_OVERHEAD_BYTES",
    "cuda_overhead_bytes",
    "CUDA_WORKSPACE_BYTES",
    "cuda_workspace_bytes",
    "OPTIMIZER_STATE",
    "PRECISION_ALIASES",
    "PRECISIONS",
    "RECOMPUTE",
    "check_optimizer",
    "check_precision",
    "dominant_terms",
    "explain",
    "korthikanti_layer_bytes",
    "LORA_TARGETS",
    "lora_estimate",
    "QUANTIZATIONS",
    "mlp_estimate",
    "params_estimate",
    "position_count",
    "transformer_estimate",
    "transformer_params",
    "what_if",
]
