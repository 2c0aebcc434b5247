"""The Lightning callback plans a sequence length when told which attribute holds it (``seq_len_attr``)."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

sys.path.insert(0, os.path.dirname(__file__))
from _lightning_models import trainer_kwargs  # noqa: E402

from nnmem_callbacks.lightning import MemoryBudgetCallback  # noqa: E402

pytestmark = pytest.mark.lightning

VOCAB, WIDTH = 256, 32


class TinyLM(pl.LightningModule):
    """Embedding -> math attention (scores s x s) -> head; the loss over every token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.embed(ids)).chunk(3, dim=-1)
        scores = torch.softmax(q @ k.transpose(1, 2) / WIDTH**0.5, dim=-1)
        return self.head(scores @ v)

    def training_step(self, batch, batch_idx):
        ids = batch["input_ids"]
        logits = self(ids)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class Tokens(pl.LightningDataModule):
    def __init__(self, batch_size: int = 4, max_length: int = 256) -> None:
        super().__init__()
        self.batch_size, self.max_length = batch_size, max_length
        self.lengths: list[int] = []

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, VOCAB, (16, self.max_length), generator=generator)
        data = [{"input_ids": row, "labels": row} for row in ids]
        return torch.utils.data.DataLoader(data, batch_size=self.batch_size)


class LengthRecorder(pl.Callback):
    def __init__(self) -> None:
        self.shapes: list[tuple[int, int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.shapes.append(tuple(batch["input_ids"].shape))


def _fit(tmp_path, callback, datamodule, **overrides):
    recorder = LengthRecorder()
    trainer = pl.Trainer(**trainer_kwargs(tmp_path, **overrides), callbacks=[callback, recorder])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TinyLM(), datamodule=datamodule)
    return recorder, [str(w.message) for w in caught if "MemoryBudgetCallback" in str(w.message)]


def _estimate(tmp_path, length):
    probe = MemoryBudgetCallback(budget="1TiB", seq_len_attr="max_length")
    _fit(tmp_path / f"probe{length}", probe, Tokens(max_length=length), limit_train_batches=1)
    assert probe.estimate is not None and probe.estimate.sequence is not None
    return probe.estimate


def test_shrink_shortens_the_sequence_and_keeps_the_batch(tmp_path):
    estimate = _estimate(tmp_path, 256)
    budget = int(estimate.peak_bytes_at(4, seq_len=128) / 0.95) + 1  # 128 fits with the margin, 256 does not
    callback = MemoryBudgetCallback(budget=budget, policy="shrink", seq_len_attr="max_length")
    datamodule = Tokens(max_length=256)
    recorder, messages = _fit(tmp_path, callback, datamodule, limit_train_batches=2)
    length = datamodule.max_length
    assert 128 <= length < 256
    assert recorder.shapes and set(recorder.shapes) == {(4, length)}  # the batch kept, the loaders rebuilt
    assert callback.estimate.sequence.seq_len == length and callback.plan.fits  # estimated again at that length
    assert any("`max_length` 256 -> " in message and "batch size 4 kept" in message for message in messages)
    assert callback.state_dict()["seq_len"] == [256, length]


def test_warn_gives_the_longest_sequence_and_changes_nothing(tmp_path):
    estimate = _estimate(tmp_path, 256)
    budget = int(estimate.peak_bytes_at(4, seq_len=128) / 0.95) + 1
    callback = MemoryBudgetCallback(budget=budget, policy="warn", seq_len_attr="max_length")
    datamodule = Tokens(max_length=256)
    recorder, messages = _fit(tmp_path, callback, datamodule, limit_train_batches=1)
    assert datamodule.max_length == 256 and set(recorder.shapes) == {(4, 256)}
    assert any("Longest sequence that fits at batch size 4:" in message for message in messages)


def test_a_wrong_attribute_falls_back_to_the_batch(tmp_path):
    estimate = _estimate(tmp_path, 256)
    budget = int(estimate.peak_bytes_at(2) / 0.95) + 1
    callback = MemoryBudgetCallback(budget=budget, policy="shrink", seq_len_attr="no_such_length")
    datamodule = Tokens(max_length=256)
    recorder, messages = _fit(tmp_path, callback, datamodule, limit_train_batches=1)
    assert any("cannot shorten the sequence" in message for message in messages)
    assert datamodule.max_length == 256 and datamodule.batch_size < 4  # the batch plan acted instead


def test_resume_keeps_the_shortened_sequence(tmp_path):
    estimate = _estimate(tmp_path, 256)
    budget = int(estimate.peak_bytes_at(4, seq_len=128) / 0.95) + 1
    callback = MemoryBudgetCallback(budget=budget, policy="shrink", seq_len_attr="max_length")
    datamodule = Tokens(max_length=256)
    recorder = LengthRecorder()
    trainer = pl.Trainer(**trainer_kwargs(tmp_path, limit_train_batches=2), callbacks=[callback, recorder])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TinyLM(), datamodule=datamodule)
    shortened = datamodule.max_length
    assert shortened < 256
    checkpoint = str(tmp_path / "run.ckpt")
    trainer.save_checkpoint(checkpoint)

    # a resumed run with a budget that fits everything: the checkpoint's decision is kept, not planned again
    resumed = MemoryBudgetCallback(budget="1TiB", policy="shrink", seq_len_attr="max_length")
    datamodule = Tokens(max_length=256)
    recorder = LengthRecorder()
    trainer = pl.Trainer(**trainer_kwargs(tmp_path, max_epochs=2, limit_train_batches=2), callbacks=[resumed, recorder])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TinyLM(), datamodule=datamodule, ckpt_path=checkpoint)
    assert datamodule.max_length == shortened
    assert recorder.shapes and set(recorder.shapes) == {(4, shortened)}
    assert resumed.state_dict()["seq_len"] == [256, shortened]
    # estimated at the length it trains with, not the configured 256: the prediction is the shortened run's
    assert resumed.estimate.sequence.seq_len == shortened
    predicted = resumed.state_dict()["predicted_peak_bytes"]
    assert predicted == pytest.approx(callback.estimate.peak_bytes, rel=0.01) and predicted < estimate.peak_bytes
