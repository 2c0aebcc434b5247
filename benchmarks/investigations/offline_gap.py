"""Question (2026-11-23): why did an offline CUDA estimate of GPT-2 in bf16-mixed miss 1.8 GB of saved activations?

(Issue #14; the answer, ``benchmarks/results/investigations/offline_gap/gpt2_bf16_mixed.md``: CUDA autocast keeps
``pow`` in fp32, so ``gelu_new``'s chain is saved in fp32; the emulation now applies CUDA's autocast lists.)

Two views of the same model (transformers' GPT-2 small by default, batch 8 x
1024, bf16-mixed, AdamW), all on fake tensors, no GPU:

1. **Estimates** with parts of the CUDA emulation switched off
   (:func:`nnmem_callbacks.estimators.torch.cuda.emulation.emulation_parts`): CPU semantics,
   attention and dropout only (what the emulation did before), autocast only,
   everything. The activations column shows which part closes the gap.
2. **Saved tensors per op**: one forward under CPU autocast and one under CUDA
   autocast (:func:`nnmem_callbacks.estimators.torch.cuda.autocast.cuda_autocast_on_cpu`),
   both with CUDA's attention; every tensor autograd saves for backward is
   attributed to the aten op that produced it (``saved_tensors_hooks``). Ops
   whose saved bytes differ are listed.

Run::

    python -m benchmarks.investigations.offline_gap            # GPT-2 small, 8 x 1024
    python -m benchmarks.investigations.offline_gap --layers 2 --seq 256   # quicker
"""

from __future__ import annotations

import argparse
import contextlib
import warnings
from collections import defaultdict

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from nnmem_callbacks import estimate_training
from nnmem_callbacks.core.units import format_bytes
from nnmem_callbacks.estimators.torch.cuda.autocast import cuda_autocast_on_cpu
from nnmem_callbacks.estimators.torch.cuda.emulation import cuda_kernel_emulation, emulation_parts

__all__ = ["VARIANTS", "make_gpt2", "estimates", "saved_by_op", "main"]

VARIANTS = {
    "cpu semantics (no emulation)": (),
    "attention + dropout only (before #14)": ("dropout", "sdpa"),
    "autocast only": ("autocast",),
    "all (autocast + attention + dropout)": ("dropout", "autocast", "sdpa"),
}


def make_gpt2(layers: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        return GPT2LMHeadModel(GPT2Config(n_layer=layers))


def estimates(layers: int, batch: int, seq: int) -> list[tuple[str, int, int]]:
    """``(variant, activations bytes, peak bytes)`` per variant of the emulation."""
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    rows = []
    for label, parts in VARIANTS.items():
        with emulation_parts(*parts):
            est = estimate_training(
                make_gpt2(layers),
                {"input_ids": ids, "labels": ids},
                optimizer="adamw",
                precision="bf16-mixed",
                device="cuda",
                check_scaling=False,
            )
        rows.append((label, est.breakdown["activations"], est.peak_bytes))
    return rows


class _Producers(TorchDispatchMode):
    """Remembers which aten op produced each storage."""

    def __init__(self) -> None:
        super().__init__()
        self.producer: dict[int, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(r.alias_info is not None for r in func._schema.returns):
            return out  # a view or in-place op: the storage keeps its producer
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.producer[_storage_key(tensor)] = func.__name__  # a freed address reused: new producer
        return out


def _storage_key(tensor: torch.Tensor) -> int:
    """The StorageImpl's address: stable while the storage lives (saved tensors live until backward)."""
    return tensor.untyped_storage()._cdata


def saved_by_op(layers: int, batch: int, seq: int, cuda_autocast: bool) -> dict[str, int]:
    """Bytes autograd saves for backward in one forward, by producing op (each storage once)."""
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(n_layer=layers)).train()
        ids = torch.zeros(batch, seq, dtype=torch.long)
    producers = _Producers()
    seen: set[int] = set()
    saved: dict[str, int] = defaultdict(int)

    def pack(tensor):
        key = _storage_key(tensor)
        if key not in seen:
            seen.add(key)
            saved[producers.producer.get(key, "parameter/input")] += tensor.untyped_storage().nbytes()
        return tensor

    autocast = cuda_autocast_on_cpu() if cuda_autocast else contextlib.nullcontext()
    with (
        mode,
        emulation_parts("dropout", "sdpa"),
        cuda_kernel_emulation(),
        autocast,
        producers,
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        loss = model(input_ids=ids, labels=ids).loss
    del loss
    return dict(saved)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    print(
        f"GPT-2 ({args.layers} layers), batch {args.batch} x {args.seq}, bf16-mixed, AdamW, target cuda (sm90), no GPU\n"
    )
    print("| emulation | saved activations | tensor peak |\n|---|---|---|")
    for label, activations, peak in estimates(args.layers, args.batch, args.seq):
        print(f"| {label} | {format_bytes(activations)} | {format_bytes(peak)} |")
    cpu = saved_by_op(args.layers, args.batch, args.seq, cuda_autocast=False)
    cuda = saved_by_op(args.layers, args.batch, args.seq, cuda_autocast=True)
    print("\nSaved for backward in one forward, by the op that produced the tensor (ops that differ):\n")
    print("| op | CPU autocast | CUDA autocast | difference |\n|---|---|---|---|")
    ops = sorted(set(cpu) | set(cuda), key=lambda op: -(cuda.get(op, 0) - cpu.get(op, 0)))
    for op in ops:
        a, b = cpu.get(op, 0), cuda.get(op, 0)
        if a != b:
            print(f"| {op} | {format_bytes(a)} | {format_bytes(b)} | {format_bytes(b - a)} |")
    print(
        f"| **total** | {format_bytes(sum(cpu.values()))} | {format_bytes(sum(cuda.values()))} | "
        f"{format_bytes(sum(cuda.values()) - sum(cpu.values()))} |"
    )


if __name__ == "__main__":
    main()
