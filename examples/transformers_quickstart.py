"""Quickstart: predict and check the training memory of a tiny GPT-2 with the Hugging Face ``Trainer``.

Builds a GPT-2 from a config (no download), plans the per-device batch under a
budget with ``plan_training_arguments`` (keeping the effective batch), then
trains a few steps on CPU with ``MemoryBudgetCallback``. Before the first step
the callback predicts the peak of the Trainer's own step; every epoch it puts
the measured peak beside the prediction into the Trainer's logs, so TensorBoard
gets them under ``train/memory/...``. On CPU the measured figure is the tensor
peak of a sampled optimizer step (the PyTorch profiler's allocation events);
the rise of process RSS is logged beside it. Runs in about a minute on 2 CPU cores.

    python examples/transformers_quickstart.py --output-dir runs/hf-quickstart
    tensorboard --logdir runs/hf-quickstart
"""

from __future__ import annotations

import argparse

import torch
import transformers

from nnmem_callbacks import format_bytes
from nnmem_callbacks.transformers import MemoryBudgetCallback, plan_training_arguments

VOCAB, LENGTH = 512, 64


class RandomTokens(torch.utils.data.Dataset):
    """Synthetic language-modelling samples of a fixed length."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/hf-quickstart")
    parser.add_argument("--budget", default="48MiB", help="memory budget for the training step (e.g. 48MiB, 8GiB)")
    parser.add_argument("--batch-size", type=int, default=16, help="the per-device batch you would like")
    parser.add_argument("--epochs", type=int, default=2)
    options = parser.parse_args(argv)

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_embd=128, n_layer=4, n_head=4, vocab_size=VOCAB, n_positions=LENGTH, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)
    dataset = RandomTokens(samples=4 * options.batch_size)
    args = transformers.TrainingArguments(
        options.output_dir,
        per_device_train_batch_size=options.batch_size,
        num_train_epochs=options.epochs,
        logging_steps=1,
        report_to=["tensorboard"],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )

    sample = torch.utils.data.default_collate([dataset[i] for i in range(2)])
    planned = plan_training_arguments(model, args, budget=options.budget, sample=sample)
    print(
        f"configured: batch {args.per_device_train_batch_size} x accumulation {args.gradient_accumulation_steps}, "
        f"predicted peak {format_bytes(planned.estimate.peak_bytes)}; planned under {options.budget}: batch "
        f"{planned.batch_size} x accumulation {planned.accumulate}, predicted {format_bytes(planned.predicted_peak_bytes)}"
    )

    callback = MemoryBudgetCallback(budget=options.budget)
    trainer = transformers.Trainer(model=model, args=planned.args, train_dataset=dataset, callbacks=[callback])
    trainer.train()

    print(callback.summary)
    for row in callback.measurements:
        print(
            f"epoch {row['epoch']}: predicted {format_bytes(row['predicted_bytes'])}, measured tensor peak "
            f"{format_bytes(row['measured_bytes'])} (relative error {row['relative_error']:+.2%}); "
            f"process RSS rose {format_bytes(row.get('rss_rise_bytes') or 0)}"
        )
    print(f"TensorBoard: tensorboard --logdir {options.output_dir}")


if __name__ == "__main__":
    main()
