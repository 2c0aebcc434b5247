"""Small Lightning modules and datamodules shared by the Lightning tests (CPU, synthetic data)."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_dataset(n: int = 256, features: int = 32, classes: int = 4, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = torch.randint(0, classes, (n,), generator=generator)
    return TensorDataset(x, y)


class MLP(pl.LightningModule):
    """An MLP with dropout and batch norm (both touch RNG / running stats)."""

    def __init__(
        self, features: int = 32, hidden: int = 64, classes: int = 4, lr: float = 0.01, optimizer: str = "adam"
    ):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(features, hidden),
            torch.nn.BatchNorm1d(hidden),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.1),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, classes),
        )
        self.example_input_array = torch.zeros(2, features)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        if self.hparams.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class MLPWithLoader(MLP):
    """An MLP whose own ``train_dataloader`` reads ``self.hparams.batch_size``."""

    def __init__(self, batch_size: int = 64, n: int = 256, **kwargs):
        super().__init__(**kwargs)
        self.save_hyperparameters()

    def train_dataloader(self):
        return DataLoader(
            make_dataset(self.hparams.n, self.hparams.features), batch_size=self.hparams.batch_size, shuffle=True
        )


class DataModule(pl.LightningDataModule):
    def __init__(self, batch_size: int = 64, n: int = 256, features: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(make_dataset(self.hparams.n, self.hparams.features), batch_size=self.batch_size, shuffle=True)


class GAN(pl.LightningModule):
    """Two optimizers under manual optimization."""

    def __init__(self, features: int = 32):
        super().__init__()
        self.automatic_optimization = False
        self.generator = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, features))
        self.discriminator = torch.nn.Sequential(torch.nn.Linear(features, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, _ = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(x.shape[0], 8, device=x.device)
        fake = self.generator(z)
        g_loss = -self.discriminator(fake).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        d_loss = self.discriminator(fake.detach()).mean() - self.discriminator(x).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.log("d_loss", d_loss)

    def configure_optimizers(self):
        return torch.optim.Adam(self.generator.parameters()), torch.optim.Adam(self.discriminator.parameters())


def trainer_kwargs(tmp_path, **overrides):
    kwargs = dict(
        default_root_dir=str(tmp_path),
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    kwargs.update(overrides)
    return kwargs


def end_process_groups() -> None:
    """Destroy the process groups before a distributed worker script exits.

    gloo's threads still running at interpreter exit abort the process ("terminate called without an active
    exception", exit -6) after a run that passed.
    """
    import torch.distributed

    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
