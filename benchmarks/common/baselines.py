"""Baselines the estimator is compared with.

* :func:`rule_of_thumb_bytes`: the napkin formula
  ``4 bytes x (3 x params + 2 x activations x batch)`` (weights, grads and one
  optimizer slot; activations counted once for forward and once for backward),
  with ``activations`` = the summed numel of every leaf module's output for one
  sample (:func:`activation_elements_per_sample`).
* :func:`memtracker_peak`: PyTorch's own
  ``torch.distributed._tools.mem_tracker.MemTracker`` run under
  ``FakeTensorMode`` for two training steps. Known to crash on data-dependent
  ops (``nonzero``, boolean masks): the crash is returned as an error string.
"""

from __future__ import annotations

import copy
import time
import traceback
from typing import Any, Callable

import torch
import torch.nn as nn

from benchmarks.common.groundtruth import autocast_for, iter_tensors

__all__ = ["rule_of_thumb_bytes", "activation_elements_per_sample", "memtracker_peak"]


# ---------------------------------------------------------------------------
# Rule of thumb
# ---------------------------------------------------------------------------
def activation_elements_per_sample(
    model: nn.Module, batch: Any, loss_fn: Callable[[nn.Module, Any], torch.Tensor], batch_size: int | None = None
) -> float:
    """Summed numel of every leaf module's output, per sample.

    Runs one real forward (``loss_fn``) on a deep copy in eval mode without
    grad, with forward hooks on the leaf modules, and divides by the batch size.

    Args:
        batch: A small real batch (2 samples is enough).
        batch_size: Its batch size; inferred from the first tensor's dim 0 if omitted.
    """
    model = copy.deepcopy(model).eval()
    total = 0
    handles = []

    def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
        nonlocal total
        total += sum(t.numel() for t in iter_tensors(output))

    for module in model.modules():
        if not list(module.children()):
            handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            loss_fn(model, batch)
    finally:
        for h in handles:
            h.remove()
    if batch_size is None:
        batch_size = next(iter_tensors(batch)).shape[0]
    return total / batch_size


def rule_of_thumb_bytes(model: nn.Module, batch_size: int, activation_elements_per_sample: float) -> int:
    """``4 x (3 x params + 2 x activations x batch)`` bytes.

    Example:
        >>> rule_of_thumb_bytes(nn.Linear(10, 10), 4, 10.0)
        1640
    """
    params = sum(p.numel() for p in model.parameters())
    return int(4 * (3 * params + 2 * activation_elements_per_sample * batch_size))


# ---------------------------------------------------------------------------
# MemTracker under FakeTensorMode
# ---------------------------------------------------------------------------
def _fake_copy(model: nn.Module, fake_mode: Any) -> nn.Module:
    """Deep copy of ``model`` whose parameters and buffers are fake tensors (tied weights stay tied)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        if id(p) not in memo:
            memo[id(p)] = nn.Parameter(fake_mode.from_tensor(p.detach()), requires_grad=p.requires_grad)
    for b in model.buffers():
        if id(b) not in memo:
            memo[id(b)] = fake_mode.from_tensor(b)
    return copy.deepcopy(model, memo)


def _fake_batch(batch: Any, fake_mode: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return fake_mode.from_tensor(batch)
    if isinstance(batch, dict):
        return {k: _fake_batch(v, fake_mode) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_fake_batch(v, fake_mode) for v in batch)
    return batch


def memtracker_peak(
    model: nn.Module | Callable[[], nn.Module],
    batch: Any,
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    precision: str = "32-true",
    n_steps: int = 2,
) -> dict[str, Any]:
    """Peak bytes according to ``MemTracker`` over ``n_steps`` fake training steps.

    Args:
        model: A real model (its parameters/buffers are converted to fake
            tensors on a copy) or a zero-argument factory (called inside
            ``FakeTensorMode``, as MemTracker's docs do).

    Returns:
        ``{"peak_bytes": int | None, "seconds": float, "error": str | None,
        "snapshot": {category: bytes}}``. A crash is reported in ``error``
        (``"ExceptionType: message"``), never raised.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    t0 = time.perf_counter()
    try:
        fake_mode = FakeTensorMode()
        if isinstance(model, nn.Module):
            fmodel = _fake_copy(model, fake_mode)
            fbatch = _fake_batch(batch, fake_mode)
        with fake_mode:
            if not isinstance(model, nn.Module):
                fmodel = model()
                fbatch = _fake_batch(batch, fake_mode)
            fmodel.train()
            optimizer = make_optimizer(fmodel.parameters())
            tracker = MemTracker()
            tensors = [t for t in iter_tensors(fbatch)]
            tracker.track_external(fmodel, optimizer, *tensors)
            with tracker as mt:
                for step in range(n_steps):
                    with autocast_for(precision, "cpu"):
                        loss = loss_fn(fmodel, fbatch)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    del loss
                    if step == 0:
                        mt.reset_mod_stats()
            snap = mt.get_tracker_snapshot("peak")
        peak = 0
        flat: dict[str, int] = {}
        for dev_snap in snap.values():
            for key, value in dev_snap.items():
                name = getattr(key, "name", None) or getattr(key, "value", None) or str(key)
                flat[str(name)] = flat.get(str(name), 0) + int(value)
            peak += int(dev_snap.get("Total", 0))
        return {"peak_bytes": peak, "seconds": time.perf_counter() - t0, "error": None, "snapshot": flat}
    except Exception as exc:  # noqa: BLE001 - the crash is the measurement
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return {
            "peak_bytes": None,
            "seconds": time.perf_counter() - t0,
            "error": msg,
            "traceback": traceback.format_exc(limit=6),
        }
