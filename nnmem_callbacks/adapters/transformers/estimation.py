"""Estimating the step a Hugging Face ``Trainer`` runs, from its model, its ``TrainingArguments`` and one batch.

Part of the ``transformers`` ``MemoryBudgetCallback`` (see
:mod:`nnmem_callbacks.adapters.transformers.callback`) and of
:func:`~nnmem_callbacks.adapters.transformers.planning.plan_training_arguments`:

* :func:`read_facts` turns the arguments into what the estimator takes: the
  per-device batch, ``gradient_accumulation_steps``, ``bf16``/``fp16`` as a
  precision, ``max_grad_norm`` as norm clipping and the optimizer (the
  Trainer's own instance when there is one, else the class and keyword
  arguments ``Trainer.get_optimizer_cls_and_kwargs`` maps ``optim`` to: fused,
  8-bit, paged, Adafactor...);
* :func:`first_batch` collates the first ``batch_size`` samples of the
  Trainer's dataset with its own collator (columns removed as the Trainer
  removes them), on a separate path: the training dataloader, its sampler
  and every RNG (torch, CUDA, numpy, python) are left as they were;
* :func:`trainer_loss` is the Trainer's own ``compute_loss``;
* :func:`estimate_step` runs
  :func:`~nnmem_callbacks.estimators.torch.estimator.estimate_training` on
  fake tensors; the model's ``training`` flags are restored afterwards. When
  the arguments ask for activation checkpointing and the model does not
  checkpoint yet (``Trainer.train()`` turns it on later, after
  ``plan_training_arguments`` and ``on_init_end``), it is turned on as the
  Trainer does for the estimate and its direct checks, and off again.

Example:
    >>> import torch
    >>> from types import SimpleNamespace
    >>> args = SimpleNamespace(per_device_train_batch_size=8, gradient_accumulation_steps=2, bf16=True, fp16=False,
    ...                        max_grad_norm=1.0)
    >>> facts = read_facts(args, torch.nn.Linear(4, 4), optimizer=torch.optim.SGD([torch.zeros(1)], lr=0.1),
    ...                    device="cpu")
    >>> facts.batch_size, facts.accumulate, facts.precision, facts.clip
    (8, 2, 'bf16-mixed', 1.0)

Known limitations:
    * With ``gradient_accumulation_steps > 1`` the Trainer collates all
      micro-batches of an optimizer step before the first forward; the
      estimate counts one micro-batch of inputs (the rest is
      ``(accumulation - 1)`` batches of token ids, usually a few KiB).
    * ``torch_compile`` is estimated as the eager step.
    * An optimizer whose library is not installed (8-bit and paged optimizers
      without ``bitsandbytes``) is estimated as AdamW, and a note says so.
    * Dynamic padding: the first samples decide the sequence length the
      estimate is made at; a longer batch later peaks higher.
    * :func:`first_batch` mirrors how the Trainer removes unused columns
      through two of its private methods (``_remove_unused_columns``,
      ``_get_collator_with_removed_columns``); a Trainer without them
      collates with ``data_collator`` as it is.
    * A ``Trainer`` subclass that overrides ``get_train_dataloader`` to feed
      other data than ``train_dataset`` is estimated on ``train_dataset``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import warnings
from typing import Any, Callable, Iterator, Mapping

from nnmem_callbacks.adapters.transformers.ranks import read_ranks, unit_modules
from nnmem_callbacks.core.estimate import MemoryEstimate
from nnmem_callbacks.core.verification import DirectEstimator
from nnmem_callbacks.estimators.torch.distributed import estimate_per_rank
from nnmem_callbacks.estimators.torch.estimator import estimate_training
from nnmem_callbacks.estimators.torch.inputs import optimizer_class_label
from nnmem_callbacks.estimators.torch.tracer import sharing_traced_ops

__all__ = [
    "CheckpointingVerifier",
    "checkpointing_for_the_estimate",
    "checkpointing_of",
    "estimate_step",
    "first_batch",
    "is_checkpointing",
    "isolated_rng",
    "log",
    "model_loss",
    "optimizer_for",
    "precision_of",
    "read_facts",
    "sharing_traced_ops",
    "StepFacts",
    "trainer_loss",
    "unwrap_optimizer",
]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StepFacts:
    """What the ``TrainingArguments`` say about one training step, in the estimator's terms.

    Attributes:
        batch_size: The per-device batch.
        accumulate: ``gradient_accumulation_steps``.
        precision: ``"bf16-mixed"``, ``"16-mixed"``, or the dtype the parameters are in (``"32-true"``...).
        clip: ``max_grad_norm`` (``None`` when clipping is off).
        optimizer: What the estimator takes: an optimizer instance, a factory ``params -> optimizer`` or a name.
        notes: What was assumed (an optimizer that could not be built, a distributed run...).
        device: Where the step runs.
        strategy: The :class:`~nnmem_callbacks.core.strategy.Strategy` each rank is estimated under (DDP,
            FSDP, DeepSpeed ZeRO; :mod:`~nnmem_callbacks.adapters.transformers.ranks`); ``None`` on one device.
        units: FSDP: the modules ``fully_shard`` wraps besides the root (``None``: the estimator's default).
        checkpointing: The arguments' ``activation_checkpointing_kwargs`` when they ask for checkpointing and the
            model does not checkpoint yet (the Trainer turns it on in ``train()``, after
            ``plan_training_arguments`` and ``on_init_end``): :func:`estimate_step` turns it on for the estimate
            and off again. ``None`` otherwise.
    """

    batch_size: int
    accumulate: int
    precision: str
    clip: float | None
    optimizer: Any
    notes: tuple[str, ...] = ()
    device: str = "cpu"
    strategy: Any = None
    units: Any = None
    checkpointing: dict[str, Any] | None = None


def precision_of(args: Any, model: Any) -> str:
    """The estimator's precision for ``args`` (``bf16``/``fp16`` are mixed precision) and the model's dtype."""
    if getattr(args, "bf16", False):
        return "bf16-mixed"
    if getattr(args, "fp16", False):
        return "16-mixed"
    import torch

    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()} if model is not None else set()
    if dtypes == {torch.bfloat16}:
        return "bf16-true"
    if dtypes == {torch.float16}:
        return "16-true"
    return "32-true"


def is_checkpointing(model: Any) -> bool:
    """Whether ``model`` (a transformers model, or a PEFT model around one) has activation checkpointing on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renamed is_gradient_checkpointing
        for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
            try:
                value = getattr(model, name, None)
            except Exception:  # noqa: BLE001 - a property that cannot be read is not an answer
                continue
            if isinstance(value, bool):
                return value
    return False


def checkpointing_of(args: Any) -> dict[str, Any] | None:
    """The keyword arguments the Trainer turns checkpointing on with, when ``args`` ask for it (else ``None``):
    ``activation_checkpointing`` (transformers 5) or ``gradient_checkpointing``, and their ``..._kwargs``."""
    on = getattr(args, "activation_checkpointing", None)
    if on is None:
        on = getattr(args, "gradient_checkpointing", False)
    if not on:
        return None
    kwargs = getattr(args, "activation_checkpointing_kwargs", None)
    if kwargs is None:
        kwargs = getattr(args, "gradient_checkpointing_kwargs", None)
    return dict(kwargs or {})


@contextlib.contextmanager
def checkpointing_for_the_estimate(model: Any, kwargs: dict[str, Any] | None) -> Iterator[None]:
    """Turns activation checkpointing on as ``Trainer.train()`` does (``kwargs`` from :func:`checkpointing_of`)
    for the block, and puts every module attribute and hook back afterwards; nothing when ``kwargs`` is ``None``."""
    if kwargs is None:
        yield
        return
    from nnmem_callbacks.estimators.torch.guards import preserved_module_state

    options = dict(kwargs)
    layout = {key: options.pop(key) for key in ("every_n_layers", "offload") if key in options}
    config = getattr(model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    with preserved_module_state(model), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs=options or None, **layout)
        else:  # transformers 4
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options or None, **layout)
        try:
            yield
        finally:
            if config is not None and use_cache is not None:
                config.use_cache = use_cache


class CheckpointingVerifier(DirectEstimator):
    """An estimate's direct estimator with the arguments' checkpointing turned on around each trace, as
    :func:`estimate_step` traced the estimate itself (the plan's checks of the largest batch run later)."""

    def __init__(self, inner: Any, model: Any, facts: StepFacts) -> None:
        self._inner, self._model, self._facts = inner, model, facts

    def estimate_at(self, batch_size: int) -> Any:
        with isolated_rng(), checkpointing_for_the_estimate(self._model, self._facts.checkpointing):
            return self._inner(batch_size)

    def accumulating(self, accumulate_grad_batches: int) -> Any:
        inner = self._inner.accumulating(accumulate_grad_batches)
        return None if inner is None else CheckpointingVerifier(inner, self._model, self._facts)


def unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` wrappers."""
    seen = 0
    while optimizer is not None and type(optimizer).__name__ == "AcceleratedOptimizer" and seen < 4:
        optimizer, seen = getattr(optimizer, "optimizer", None), seen + 1
    return optimizer


def optimizer_for(args: Any, model: Any, optimizer: Any = None) -> tuple[Any, str | None]:
    """What the estimator steps: the Trainer's optimizer, else the one ``args.optim`` maps to, and a note.

    Returns:
        ``(optimizer, note)``: an instance, a factory ``params -> optimizer`` or a name; the note (else ``None``)
        says what was assumed when the optimizer of ``args.optim`` cannot be built here.
    """
    optimizer = unwrap_optimizer(optimizer)
    if optimizer is not None:
        return optimizer, None
    if not hasattr(args, "optim"):
        return "adamw", "no optimizer and no `optim` in the arguments: AdamW assumed"
    try:
        from transformers import Trainer

        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    except Exception as error:  # noqa: BLE001 - e.g. bitsandbytes not installed
        name = getattr(args.optim, "value", args.optim)
        return "adamw", f"the optimizer {name!r} cannot be built here ({type(error).__name__}: {error}): AdamW assumed"
    kwargs = dict(kwargs)

    def factory(params: Any) -> Any:
        return cls(params, **kwargs)

    factory.__name__ = optimizer_class_label(cls, kwargs.get("optim_bits"))  # est.optimizer names it
    return factory, None


def read_facts(
    args: Any,
    model: Any,
    *,
    optimizer: Any = None,
    device: Any = None,
    batch_size: int | None = None,
    trainer: Any = None,
) -> StepFacts:
    """The :class:`StepFacts` of ``args`` for ``model`` (``optimizer``: the Trainer's, when it exists)."""
    spec, note = optimizer_for(args, model, optimizer)
    clip = float(getattr(args, "max_grad_norm", 0) or 0)
    notes = [note] if note else []
    ranks = read_ranks(args, trainer, model)
    if ranks.note:
        notes.append(ranks.note)
    if device is None:
        device = getattr(args, "device", None)
    checkpointing = checkpointing_of(args)
    return StepFacts(
        batch_size=int(batch_size or args.per_device_train_batch_size),
        accumulate=max(int(getattr(args, "gradient_accumulation_steps", 1) or 1), 1),
        precision=precision_of(args, model),
        clip=clip if clip > 0 else None,
        optimizer=spec,
        notes=tuple(notes),
        device=str(device or "cpu"),
        strategy=ranks.strategy,
        units=unit_modules(model, ranks) if ranks.strategy is not None and ranks.strategy.kind == "fsdp" else None,
        checkpointing=None if is_checkpointing(model) else checkpointing,
    )


@contextlib.contextmanager
def isolated_rng() -> Iterator[None]:
    """Saves the torch, CUDA, numpy and python RNG states, and restores them on exit."""
    import torch

    python_state = random.getstate()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        import numpy

        numpy_state: Any = numpy.random.get_state()
    except ImportError:  # pragma: no cover - numpy comes with torch
        numpy = None  # type: ignore[assignment]
        numpy_state = None
    try:
        yield
    finally:
        random.setstate(python_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        if numpy is not None and numpy_state is not None:
            numpy.random.set_state(numpy_state)


def first_batch(trainer: Any, batch_size: int) -> Any:
    """The first ``batch_size`` samples of the Trainer's train dataset, collated as the Trainer collates them.

    Nothing the training loop uses is touched: no dataloader is built or iterated, no sampler drawn from, and
    the RNG states are restored.

    Raises:
        RuntimeError: Without a train dataset, or when it yields no sample.
    """
    dataset = getattr(trainer, "train_dataset", None)
    if dataset is None:
        raise RuntimeError("the Trainer has no train_dataset")
    collator = trainer.data_collator
    with isolated_rng():
        try:
            import datasets

            is_hf_dataset = isinstance(dataset, datasets.Dataset)
        except ImportError:
            is_hf_dataset = False
        if is_hf_dataset and hasattr(trainer, "_remove_unused_columns"):
            dataset = trainer._remove_unused_columns(dataset, description="training")
        elif hasattr(trainer, "_get_collator_with_removed_columns"):
            collator = trainer._get_collator_with_removed_columns(collator, description="training")
        samples = take(dataset, batch_size)
        if not samples:
            raise RuntimeError("the train dataset yielded no sample")
        return collator(samples)


def take(dataset: Any, count: int) -> list[Any]:
    """The first ``count`` samples of a map-style or iterable dataset."""
    import torch

    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__"):
        samples = []
        for sample in dataset:
            samples.append(sample)
            if len(samples) >= count:
                break
        return samples
    size = len(dataset) if hasattr(dataset, "__len__") else count
    return [dataset[i] for i in range(min(count, size))]


def trainer_loss(trainer: Any) -> Callable[[Any, Any], Any]:
    """The loss the estimator traces: the Trainer's own ``compute_loss`` (custom losses and label smoothing too)."""

    def loss_fn(model: Any, batch: Any) -> Any:
        inputs = dict(batch) if isinstance(batch, Mapping) else batch
        return trainer.compute_loss(model, inputs)

    return loss_fn


def model_loss(model: Any, batch: Any) -> Any:
    """The loss without a Trainer: the model's own (``labels`` in the batch), as ``Trainer.compute_loss`` takes it."""
    out = model(**batch) if isinstance(batch, Mapping) else model(batch)
    if isinstance(out, Mapping):
        return out["loss"] if "loss" in out else out[next(iter(out))]
    return out[0] if isinstance(out, (tuple, list)) else out


def estimate_step(
    model: Any,
    batch: Any,
    facts: StepFacts,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    *,
    precision: str | None = None,
    batch_lines: bool = True,
    probe_kernels: Any = True,
) -> MemoryEstimate:
    """The estimate of one training step of ``model`` on ``batch`` (raises what the estimator raises).

    Args:
        model: The model as the Trainer trains it (PEFT, quantized, gradient checkpointing as set).
        batch: One collated batch.
        facts: The step's facts (:func:`read_facts`).
        loss_fn: ``loss_fn(model, batch) -> loss`` (default :func:`model_loss`).
        precision: Another precision (the ``bf16-mixed`` offer); default: ``facts.precision``.
        batch_lines: Trace the two other batch sizes the batch lines come from; ``False`` for an estimate
            read only at this batch (the ``bf16-mixed`` offer's peak: the same figure, in about half the time).
        probe_kernels: The estimator's ``probe_kernels``.
    """
    training = {name: module.training for name, module in model.named_modules()}
    model.train()
    kwargs = dict(
        optimizer=facts.optimizer,
        loss_fn=loss_fn or model_loss,
        precision=precision or facts.precision,
        device=facts.device,
        accumulate_grad_batches=facts.accumulate,
        gradient_clip_val=facts.clip,
        gradient_clip_algorithm="norm",
        check_scaling=batch_lines,
        probe_kernels=probe_kernels,
    )
    try:
        with isolated_rng(), checkpointing_for_the_estimate(model, facts.checkpointing):
            if facts.strategy is not None:
                estimate = estimate_per_rank(model, batch, strategy=facts.strategy, units=facts.units, **kwargs)
            else:
                estimate = estimate_training(model, batch, **kwargs)
        if facts.checkpointing is not None and estimate.verifier is not None:  # its direct traces checkpoint too
            estimate = dataclasses.replace(estimate, verifier=CheckpointingVerifier(estimate.verifier, model, facts))
        return dataclasses.replace(estimate, notes=(*estimate.notes, *facts.notes))  # what was assumed stays on it
    finally:
        for name, module in model.named_modules():
            if name in training:
                module.training = training[name]
