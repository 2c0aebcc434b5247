"""What Keras' ``fit`` holds on TensorFlow beyond the train step: the batches its input pipeline has ready.

``fit`` on arrays feeds the step from a ``tf.data`` pipeline (``ArrayDataAdapter``: a parallel ``map`` gathering
each batch from the whole data, then the distribution's prefetch), so batches beyond the one being trained on are
alive while a step runs. The estimate counts :data:`INPUT_PIPELINE_BATCHES` of them, in proportion to the batch;
what the pipeline holds beyond that, and the data's own copy, is not a function of the batch (the step check's
``fit`` measures the first, ``step_check.dataset_beyond_one_batch`` leaves the second out).

Known limitations:
    * A ``tf.data.Dataset`` of the user's own (deeper prefetch, ``cache()``, interleaved files) holds what its
      author built; the estimate counts the batches of ``fit`` on arrays.
    * The whole data's copy that ``fit`` makes of arrays is not in the estimate (it depends on the data's length,
      not the model); the Keras callback's fit-start level includes it.

Example:
    >>> from nnmem_callbacks.estimators.keras.common import Spec
    >>> specs = Spec((None, 1024), "float32")
    >>> pipeline_bytes(specs, None, 64, counted=False) == INPUT_PIPELINE_BATCHES * 64 * 4096
    True
"""

from __future__ import annotations

from typing import Any

from nnmem_callbacks.allocators.tensorflow_cpu import tf_allocator_bytes
from nnmem_callbacks.estimators.keras.common import tree_leaves

__all__ = ["INPUT_PIPELINE_BATCHES", "pipeline_bytes"]

#: Batches that fit's ``tf.data`` pipeline holds beyond the one being trained on (the prefetch buffer and the batch
#: being assembled), as measured on CPU.
INPUT_PIPELINE_BATCHES = 2


def pipeline_bytes(x_specs: Any, y_specs: Any, batch_size: int, counted: bool = True) -> int:
    """Bytes of the pipeline's :data:`INPUT_PIPELINE_BATCHES` batches at ``batch_size`` (``counted``: as the allocator counts them)."""
    leaves = tree_leaves(x_specs) + tree_leaves(y_specs)
    sizes = [spec.nbytes(batch_size) for spec in leaves]
    return INPUT_PIPELINE_BATCHES * sum(tf_allocator_bytes(size) if counted else size for size in sizes)
