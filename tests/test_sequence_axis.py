"""The sequence length as a second axis: the curve through traces at shorter lengths against direct traces."""

from __future__ import annotations

import pytest
import torch

from nnmem_callbacks.estimators.torch.estimator import estimate_training

transformers = pytest.importorskip("transformers")


def _gpt2(attention: str):
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        n_layer=2, n_embd=128, n_head=4, vocab_size=2048, n_positions=1024, bos_token_id=0, eos_token_id=0,
        attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel._from_config(config, attn_implementation=attention)


def _loss(model, batch):
    return model(**batch).loss


def _batch(length: int, size: int = 2):
    ids = torch.zeros(size, length, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])  # flash attention on CPU (linear) and the math path
def test_the_peak_at_two_and_four_times_the_length_matches_a_direct_trace(attention):
    model = _gpt2(attention)
    estimate = estimate_training(model, _batch(128), "adamw", loss_fn=_loss, sequence_dim="auto")
    assert estimate.sequence.traced_lengths == (64, 128, 256)
    assert estimate.peak_bytes_at(2, seq_len=128) == estimate.peak_bytes
    # issue 18's target: 3% at two and four times the traced length; elsewhere (other batches, between the short
    # traces, eight times the length) within 2%; batch 1, where some ops specialise, 3%
    cases = ((256, 2, 0.03), (512, 2, 0.03), (256, 4, 0.02), (512, 1, 0.03), (48, 2, 0.02), (1024, 2, 0.02))
    for length, size, within in cases:
        direct = estimate_training(model, _batch(length, size), "adamw", loss_fn=_loss, check_scaling=False)
        predicted = estimate.peak_bytes_at(size, seq_len=length)
        error = (predicted - direct.peak_bytes) / direct.peak_bytes
        assert abs(error) < within, (length, size, predicted, direct.peak_bytes)


def test_the_math_path_grows_faster_than_flash_attention_and_the_longest_length_fits_exactly():
    flash = estimate_training(_gpt2("sdpa"), _batch(128), "adamw", loss_fn=_loss, sequence_dim="auto")
    math = estimate_training(_gpt2("eager"), _batch(128), "adamw", loss_fn=_loss, sequence_dim="auto")
    assert math.peak_bytes_at(2, seq_len=1024) - flash.peak_bytes_at(2, seq_len=1024) > 2 * (
        math.peak_bytes - flash.peak_bytes
    )
    budget = 256 * 2**20
    longest = math.max_sequence_length(budget)
    assert math.peak_bytes_at(2, seq_len=longest) <= budget < math.peak_bytes_at(2, seq_len=longest + 1)
    assert flash.max_sequence_length(budget) > longest
    assert math.max_sequence_length(1024) == 0  # not even a length of 1 fits a kilobyte
    assert math.to_dict()["sequence"]["traced_lengths"] == [64, 128, 256]


def test_bad_sequence_requests_say_what_is_valid():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    plain = estimate_training(model, torch.empty(2, 3, 8, 8), "sgd")
    with pytest.raises(ValueError, match="no sequence axis: estimate with sequence_dim='auto'"):
        plain.peak_bytes_at(2, seq_len=64)
    with pytest.raises(ValueError, match="found no token ids"):
        estimate_training(model, torch.empty(2, 3, 8, 8), "sgd", sequence_dim="auto")
    with pytest.raises(ValueError, match="not a dimension of the batch's first tensor"):
        estimate_training(model, torch.empty(2, 3, 8, 8), "sgd", sequence_dim=4)
    with pytest.raises(ValueError, match="'auto', a dimension >= 1"):
        estimate_training(model, torch.empty(2, 3, 8, 8), "sgd", sequence_dim="rows")


def test_the_cli_answers_at_another_length_and_gives_the_longest_that_fits(capsys):
    import json
    import os

    from nnmem_callbacks import cli

    factory = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "models.py") + ":gpt2"
    small = ["-a", "n_layer=1", "-a", "n_embd=64", "-a", "n_head=2", "-a", "vocab_size=512"]

    def run(length, *more):
        inputs = ["-i", f"input_ids=int64:{length}", "-i", f"labels=int64:{length}"]
        code = cli.main(["estimate", factory, *small, *inputs, "-b", "2", "--device", "cpu", "--json", *more])
        assert code in (0, 3)
        return json.loads(capsys.readouterr().out)

    answer = run(64, "--budget", "64MiB", "--seq-len", "256")["sequence"]
    direct = run(256)
    assert answer["traced_seq_len"] == 64 and answer["seq_len"] == 256
    assert abs(answer["peak_bytes"] - direct["peak_bytes"]) / direct["peak_bytes"] < 0.01
    longest = answer["max_sequence_length"]
    assert longest > 64
    assert run(longest)["peak_bytes"] <= answer["usable_peak_bytes"] * 1.01  # the longest that fits, checked directly


def test_the_cli_says_which_gpu_fits_at_a_length(capsys):
    import json
    import os

    from nnmem_callbacks import cli

    factory = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "models.py") + ":gpt2"
    small = ["-a", "n_layer=1", "-a", "n_embd=64", "-a", "n_head=2", "-a", "vocab_size=512"]
    inputs = ["-i", "input_ids=int64:64", "-i", "labels=int64:64"]
    assert cli.main(["estimate", factory, *small, *inputs, "-b", "2", "--seq-len", "100000", "--json"]) in (0, 3)
    rows = json.loads(capsys.readouterr().out)["sequence"]["gpus"]
    by_memory = sorted(rows, key=lambda row: row["memory_bytes"])
    lengths = [row["max_sequence_length"] for row in by_memory]
    assert lengths == sorted(lengths) and lengths[-1] > lengths[0] > 64  # more memory, longer sequences
    assert all(row["fits"] == (row["max_sequence_length"] >= 100000) for row in rows)
