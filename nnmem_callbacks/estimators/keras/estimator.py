"""``estimate_training`` for Keras 3: one estimator per backend, one result type.

* **tensorflow**: the traced graph of ``model.train_step`` is replayed with
  reference-counted buffers (:mod:`nnmem_callbacks.estimators.keras.tensorflow.graph`).
* **jax**: the jitted stateless train step is lowered and compiled for the
  batch shape and XLA's ``memory_analysis()`` is read
  (:mod:`nnmem_callbacks.estimators.keras.jax_xla`).
* **torch**: the Keras-on-torch step is traced by the PyTorch estimator on fake
  tensors, with the Keras optimizer's slot variables counted exactly
  (:mod:`nnmem_callbacks.estimators.keras.torch_backend`).

When the backend estimator fails, the per-layer rules of
:mod:`nnmem_callbacks.estimators.keras.layer_rules` take over; ``MemoryEstimate.method``
and ``notes`` say which method ran and why, and one warning is emitted.

Mixed precision (dtype policies), ``gradient_accumulation_steps`` on the
optimizer and ``keras.RematScope`` are reflected because the real step is
traced or compiled with them.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.estimators.keras.common import (
    INTERNAL_PACKAGES,
    KerasEstimationError,
    backend_name,
    input_specs,
    is_compiled,
)

__all__ = ["build_like_fit", "estimate_training", "METHODS", "optimizer_built_by_user", "snapshot_build_state"]

#: ``method=`` values accepted by :func:`estimate_training`.
METHODS = ("auto", "backend", "layer-rules")

_warned: set[str] = set()


def estimate_training(
    model: Any,
    batch_size: int | None = None,
    x: Any = None,
    y: Any = None,
    *,
    method: str = "auto",
    check_scaling: bool = True,
    probe_kernels: bool = True,
    check_steps: bool = True,
    optimizer_built: bool | None = None,
    step_check_seconds: float | None = None,
) -> MemoryEstimate:
    """Predicts the peak memory of ``model.fit`` at ``batch_size``, before it runs.

    Args:
        model: A compiled Keras 3 model (Sequential, Functional or subclassed);
            its optimizer, loss and dtype policy are used. Nothing about it
            changes, except that an unbuilt optimizer is left built on the
            TensorFlow backend (as Keras does at the first ``fit`` step) and
            an unbuilt subclassed model is built: the compiled loss and
            metrics (and, on JAX and torch, the optimizer) that the estimate
            builds are put back unbuilt (:func:`snapshot_build_state`), so a
            seeded ``fit`` afterwards trains exactly as without the estimate.
        batch_size: The batch size; default: the first dimension of ``x``.
        x: Example inputs (arrays, or lists/dicts of arrays). Only shapes and
            dtypes are used. Required for subclassed models.
        y: Example targets. Default: shaped like the model's output (without
            the last axis, as integers, for sparse losses).
        method: ``"auto"`` (the backend's estimator, layer rules if it fails),
            ``"backend"`` (raise instead of falling back) or ``"layer-rules"``.
        check_scaling: JAX compiles (torch traces) the step again at other
            batch sizes for the growth per sample; ``False`` does it once
            (faster for large models; the growth is then assumed from the
            batch-dependent categories). TensorFlow always replays twice (cheap).
        probe_kernels: TensorFlow: measure the scratch memory of the step's
            kernels on this host, in a child process, cached per host
            (:mod:`nnmem_callbacks.estimators.keras.tensorflow.probes`); ``False`` uses the
            graph's rules, and ``notes`` says so.
        check_steps: TensorFlow: run ``fit`` for two epochs of 8 batches on
            fresh copies of the model (its configuration, not its weights) at
            the batch (smaller over the check's memory cap), one child process
            per copy, and add what the replay misses
            (:mod:`nnmem_callbacks.estimators.keras.tensorflow.step_check`); ``notes`` gives the
            runs and the correction. ``False`` keeps the replay alone.
        optimizer_built: Whether the ``fit`` predicted finds the optimizer's
            slot variables made. Default: as a fresh ``fit`` of the model as it
            stands would (:func:`optimizer_built_by_user`; an optimizer only
            this or an earlier estimate built counts as unbuilt). Keras's
            TensorFlow ``fit`` builds an unbuilt one in its first step, and the
            step check's copies then do too. Pass ``True`` for a ``fit`` in this
            process after the estimate (which, on TensorFlow, leaves it
            built): the Keras callback does. Only the TensorFlow estimate
            reads it. With TensorFlow the two can differ: the benchmark's GRU text
            model with oneDNN on peaked at 16.8 MiB after an estimate and at
            18.9-21.9 MiB in fresh processes
            (``benchmarks/results/tf_optimizer_build_gru_text_avx2*_onednn1.md``).
        step_check_seconds: TensorFlow: seconds the step check's child may
            take (default
            :data:`~nnmem_callbacks.estimators.keras.tensorflow.step_check.DEFAULT_TIME_BUDGET`).
            Runs finished by then count; ``notes`` warns when fewer than asked
            finished. Raise it for a large graph on a slow host (NASNetMobile
            finished one of three copies in 300 s on a 2-core AVX2 EPYC).

    Returns:
        A :class:`~nnmem_callbacks.MemoryEstimate`; ``method`` is
        ``"tf-graph"``, ``"xla-memory-analysis"``, ``"torch-trace"`` or
        ``"layer-rules"``.

    Raises:
        KerasEstimationError: For an uncompiled model, a missing batch size, a
            subclassed model without ``x``, an unknown ``method`` or a
            ``step_check_seconds`` that is not a positive number.
    """
    if method not in METHODS:
        raise KerasEstimationError(f"unknown method {method!r}; valid methods are {', '.join(map(repr, METHODS))}")
    if step_check_seconds is not None and (
        isinstance(step_check_seconds, bool)
        or not isinstance(step_check_seconds, (int, float))
        or not step_check_seconds > 0
    ):
        raise KerasEstimationError(
            f"step_check_seconds must be a positive number of seconds (or None for the default), got {step_check_seconds!r}"
        )
    if not is_compiled(model):
        raise KerasEstimationError(
            "compile the model first (model.compile(optimizer=..., loss=...)): its optimizer and loss are estimated"
        )
    x_specs, y_specs, example_batch = input_specs(model, x, y)
    if batch_size is None:
        batch_size = example_batch
    if batch_size is None or isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise KerasEstimationError(f"batch_size must be a positive integer (or pass x=...), got {batch_size!r}")
    built_by_user = optimizer_built_by_user(model.optimizer)
    if optimizer_built is None:
        optimizer_built = built_by_user
    backend = backend_name()
    # what build_like_fit builds is put back afterwards, so that fit takes the path it takes without the estimate
    # (on JAX and torch, fit peeks at a batch only while the compiled loss is unbuilt, which draws a shuffle)
    restore = snapshot_build_state(model, optimizer=backend != "tensorflow")
    try:
        build_like_fit(model, batch_size, x_specs, y_specs)
        if not built_by_user and backend == "tensorflow":
            _BUILT_BY_AN_ESTIMATE.add(model.optimizer)
        return _estimate_built(
            model,
            backend,
            batch_size,
            x_specs,
            y_specs,
            method,
            check_scaling,
            probe_kernels,
            check_steps,
            optimizer_built,
            step_check_seconds,
        )
    finally:
        restore()


def _estimate_built(
    model: Any,
    backend: str,
    batch_size: int,
    x_specs: Any,
    y_specs: Any,
    method: str,
    check_scaling: bool,
    probe_kernels: bool,
    check_steps: bool,
    optimizer_built: bool,
    step_check_seconds: float | None,
) -> MemoryEstimate:
    notes: list[str] = []
    if method == "layer-rules":
        from nnmem_callbacks.estimators.keras.layer_rules import estimate_layer_rules

        notes.append("layer rules requested (method='layer-rules')")
        return estimate_layer_rules(model, batch_size, x_specs, y_specs, notes)
    try:
        return _backend_estimate(
            backend,
            model,
            batch_size,
            x_specs,
            y_specs,
            notes,
            check_scaling,
            probe_kernels,
            check_steps,
            optimizer_built,
            step_check_seconds,
        )
    except KerasEstimationError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure of the backend estimator
        if method == "backend":
            raise
        from nnmem_callbacks.estimators.keras.layer_rules import estimate_layer_rules

        reason = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
        notes.append(f"the {backend} estimator failed ({reason}); layer-rules estimate")
        _warn_once(f"nnmem_callbacks: the Keras {backend} estimator failed ({reason}); using per-layer rules instead")
        return estimate_layer_rules(model, batch_size, x_specs, y_specs, notes)


def _backend_estimate(
    backend: str,
    model: Any,
    batch_size: int,
    x_specs: Any,
    y_specs: Any,
    notes: list[str],
    check_scaling: bool = True,
    probe_kernels: bool = True,
    check_steps: bool = True,
    optimizer_built: bool = True,
    step_check_seconds: float | None = None,
) -> MemoryEstimate:
    if backend == "tensorflow":
        from nnmem_callbacks.estimators.keras.tensorflow.graph import estimate_tensorflow

        return estimate_tensorflow(
            model,
            batch_size,
            x_specs,
            y_specs,
            notes,
            probe_kernels=probe_kernels,
            check_steps=check_steps,
            optimizer_built=optimizer_built,
            step_check_seconds=step_check_seconds,
        )
    if backend == "jax":
        from nnmem_callbacks.estimators.keras.jax_xla import estimate_jax

        return estimate_jax(model, batch_size, x_specs, y_specs, notes, check_scaling)
    if backend == "torch":
        from nnmem_callbacks.estimators.keras.torch_backend import estimate_torch

        return estimate_torch(model, batch_size, x_specs, y_specs, notes, check_scaling)
    raise NotImplementedError(f"no estimator for the Keras backend {backend!r}")


#: Optimizers that an estimate built (Keras builds an unbuilt one at the first train step, the estimate before it).
_BUILT_BY_AN_ESTIMATE: weakref.WeakSet = weakref.WeakSet()


def optimizer_built_by_user(optimizer: Any) -> bool:
    """Whether a fresh ``fit`` of the model would find ``optimizer`` built (its slot variables made).

    Keras's TensorFlow ``fit`` builds an unbuilt optimizer when it traces its
    first step, after the model's variables and the batch, and with TensorFlow
    that order moves the peak (:func:`~nnmem_callbacks.estimators.keras.tensorflow.step_check.compiled_copy`).
    The estimate builds the optimizer itself, so an optimizer it built counts
    as unbuilt until a train step has run: a second estimate predicts the
    same run as the first.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> model.compile(optimizer="adam", loss="mse")
        >>> optimizer_built_by_user(model.optimizer)
        False
    """
    if not bool(getattr(optimizer, "built", True)):
        return False
    if optimizer in _BUILT_BY_AN_ESTIMATE:
        iterations = getattr(optimizer, "iterations", None)
        try:
            return int(iterations.numpy()) > 0 if iterations is not None else True
        except Exception:  # noqa: BLE001 - a backend without .numpy(): treat it as trained
            return True
    return True


def build_like_fit(model: Any, batch_size: int, x_specs: Any, y_specs: Any) -> None:
    """Builds the model, the compiled loss and metrics, and the optimizer, as ``fit`` does before its first step.

    Keras' own ``_symbolic_build`` runs on symbolic tensors: variables are
    created (if they do not exist yet) but none changes its value. (On the
    TensorFlow backend without a distribution strategy, ``fit`` itself defers
    this to its first step's trace; the estimate records whether the
    optimizer was built before, for the step check.)
    """
    import keras

    from nnmem_callbacks.estimators.keras.common import tree_map

    def symbolic(spec: Any) -> Any:
        return keras.KerasTensor(spec.at(batch_size), dtype=spec.dtype)

    build = getattr(model, "_symbolic_build", None)
    if build is None:  # pragma: no cover - very old or very new Keras
        if getattr(model.optimizer, "built", True) is False:
            model.optimizer.build(model.trainable_variables)
        return
    build(data_batch=(tree_map(symbolic, x_specs), tree_map(symbolic, y_specs)))


def snapshot_build_state(model: Any, optimizer: bool = True) -> Callable[[], None]:
    """Records what :func:`build_like_fit` builds; the function returned puts it back.

    Covers the compiled loss and metrics and (with ``optimizer``) the optimizer
    (and a wrapped ``inner_optimizer``): their attributes, and the contents of
    their lists and dicts (Keras's trackers append to those in place). What
    was built stays reachable only from the estimate; ``fit`` builds it again,
    as it would have. Layers a model builds are not undone (their weights
    exist, as after ``fit``'s own build).

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> model.compile(optimizer="adam", loss="mse")
        >>> restore = snapshot_build_state(model)
        >>> model.optimizer.build(model.trainable_variables)
        >>> restore()
        >>> model.optimizer.built
        False
    """
    objects = [getattr(model, "_compile_loss", None), getattr(model, "_compile_metrics", None)]
    if optimizer:
        outer = getattr(model, "optimizer", None)
        objects += [outer, getattr(outer, "inner_optimizer", None)]
    saved = []
    for obj in objects:
        if obj is None or not hasattr(obj, "__dict__"):
            continue
        attributes = dict(vars(obj))
        contents = {
            key: list(value) if isinstance(value, list) else dict(value)
            for key, value in attributes.items()
            if isinstance(value, (list, dict))
        }
        saved.append((obj, attributes, contents))

    def restore() -> None:
        for obj, attributes, contents in saved:
            current = vars(obj)
            for key in [key for key in current if key not in attributes]:
                del current[key]
            for key, value in attributes.items():
                if current.get(key) is not value:
                    current[key] = value
                if key in contents and not _same_items(value, contents[key]):
                    value.clear()
                    value.extend(contents[key]) if isinstance(value, list) else value.update(contents[key])

    return restore


def _same_items(now: Any, then: Any) -> bool:
    """Whether a list or dict holds the same objects as before (by identity: tensors compare elementwise)."""
    if isinstance(now, list):
        return len(now) == len(then) and all(a is b for a, b in zip(now, then))
    return now.keys() == then.keys() and all(now[k] is then[k] for k in now)


def _warn_once(message: str) -> None:
    if message in _warned:
        return
    _warned.add(message)
    from nnmem_callbacks.core import warning_site

    # at the user's line: estimate_training(...), fit_plan(...) or model.fit(...) with the callback
    warning_site.warn(message, INTERNAL_PACKAGES, RuntimeWarning)
