"""Quickstart: predict and check the training memory of two small models with Lightning.

Trains the MLP from the seed question (1000 -> 4 x 100 -> 10, batch 256) and a
small CNN on synthetic data, on CPU, with ``MemoryBudgetCallback``. Before the
first step the callback predicts the peak memory of the real ``training_step``
(on fake tensors); after every epoch it measures the real peak and logs both to
TensorBoard. Runs in about a minute (87 s on two busy CPU cores).

On CPU the measurement is the tensor peak of a sampled optimizer step (the
PyTorch profiler's allocation events in the first two steps of each epoch),
which is what the callback predicts. Each epoch line also prints how far the
process RSS rose above its fit-start level; that rise also holds allocator
caches and freed memory kept resident, so it is no measure of the estimate.

    python examples/lightning_quickstart.py --log-dir runs/quickstart
    tensorboard --logdir runs/quickstart   # CUSTOM SCALARS tab: predicted vs measured

With the unified ``lightning`` package, import the callback from
``nnmem_callbacks.lightning_pytorch`` and the Trainer from ``lightning.pytorch``.
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nnmem_callbacks import format_bytes
from nnmem_callbacks.lightning import MemoryBudgetCallback


class Classifier(pl.LightningModule):
    """A classifier around any network; the batch size lives in ``hparams`` so the callback can change it."""

    def __init__(
        self,
        net: nn.Module,
        input_shape: tuple[int, ...],
        classes: int = 10,
        batch_size: int = 256,
        samples: int = 4096,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["net"])
        self.net = net

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(self.hparams.samples, *self.hparams.input_shape, generator=generator)
        y = torch.randint(0, self.hparams.classes, (self.hparams.samples,), generator=generator)
        return DataLoader(TensorDataset(x, y), batch_size=self.hparams.batch_size, shuffle=True)


def mlp() -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(1000, 100), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(100, 100), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(100, 10))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    )


def train(
    name: str, model: Classifier, log_dir: str, epochs: int, budget: str | None, policy: str
) -> MemoryBudgetCallback:
    callback = MemoryBudgetCallback(budget=budget, policy=policy)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        callbacks=[callback],
        logger=pl.loggers.TensorBoardLogger(log_dir, name=name),
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        log_every_n_steps=5,
    )
    trainer.fit(model)
    print(f"\n== {name} ==")
    if callback.estimate is None:
        print(f"no prediction: {callback.failure}")
    else:
        est = callback.estimate
        print(
            f"predicted tensor peak: {format_bytes(est.peak_bytes)} at batch {est.batch_size} ({est.method}, phase {est.peak_phase})"
        )
        print(f"decision: {callback.plan.decision}")
    for row in callback.measurements:
        batch = callback.plan.batch_size if callback.plan is not None else None
        print(measurement_line(row, callback.estimate, batch))
    return callback


def measurement_line(row: dict, estimate, batch_size: int | None = None) -> str:
    """One epoch's check, saying what is compared with what.

    The measured figure is the tensor peak: on CUDA ``max_memory_allocated``; on
    CPU that of a sampled optimizer step, from the PyTorch profiler's allocation
    events. The error is (predicted - measured) / measured. On CPU the rise of
    the process RSS above fit start is shown beside it for what it is: it holds
    allocator caches and memory freed but kept resident, so it says little about
    tensors.
    """
    if row.get("kind") == "rss":  # CPU and the step could not be sampled (another profiler runs)
        return (
            f"epoch {row['epoch']}: process RSS rose {format_bytes(row['measured_bytes'])} above fit start "
            "(the step's tensor peak could not be sampled)"
        )
    what = "max_memory_allocated" if row.get("kind") == "cuda" else "a sampled step, profiler allocation events"
    line = f"epoch {row['epoch']}: measured tensor peak ({what}) {format_bytes(row['measured_bytes'])}"
    if "predicted_bytes" in row:
        line += f" vs predicted {format_bytes(row['predicted_bytes'])} (error {row['relative_error']:+.1%})"
    if row.get("rss_rise_bytes") is not None:
        line += f"; beside it, the process RSS rose {format_bytes(row['rss_rise_bytes'])} above fit start"
    return line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--log-dir", default="./runs/quickstart", help="TensorBoard log directory (default: %(default)s)"
    )
    parser.add_argument("--epochs", type=int, default=2, help="epochs per model (default: %(default)s)")
    parser.add_argument("--budget", default=None, help="e.g. '10GiB', 0.5; default: free memory minus 5%%")
    parser.add_argument("--policy", default="warn", choices=MemoryBudgetCallback.POLICIES)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    pl.seed_everything(0, workers=True)
    budget = args.budget  # a size ('10GiB') or a fraction ('0.5'), read by nnmem_callbacks.core.plan.parse_budget_text
    train("mlp", Classifier(mlp(), (1000,)), args.log_dir, args.epochs, budget, args.policy)
    train(
        "cnn",
        Classifier(cnn(), (3, 32, 32), batch_size=128, samples=2048),
        args.log_dir,
        args.epochs,
        budget,
        args.policy,
    )
    print(f"\nTensorBoard logs: {args.log_dir}  (tensorboard --logdir {args.log_dir})")


if __name__ == "__main__":
    main()
