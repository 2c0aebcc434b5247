"""The sequence length as a second axis: the curve through traces at shorter lengths against direct traces."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nnmem_callbacks.estimators.torch.estimator import estimate_training
from nnmem_callbacks.estimators.torch.sequence_lines import position_limit

transformers = pytest.importorskip("transformers")


def _gpt2(attention: str, positions: int = 1024):
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        n_layer=2, n_embd=128, n_head=4, vocab_size=2048, n_positions=positions, bos_token_id=0, eos_token_id=0,
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
    long = 1 << 14  # positions enough that the budget, not the model, sets the longest length
    flash = estimate_training(_gpt2("sdpa", long), _batch(128), "adamw", loss_fn=_loss, sequence_dim="auto")
    math = estimate_training(_gpt2("eager", long), _batch(128), "adamw", loss_fn=_loss, sequence_dim="auto")
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


def test_the_cli_says_which_gpu_fits_at_a_length(capsys, tmp_path):
    import json

    from nnmem_callbacks import cli

    factory = tmp_path / "llama.py"  # rotary positions: no limit of the model's own on the length
    factory.write_text(
        "import transformers\n"
        "def llama():\n"
        "    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,\n"
        "        num_attention_heads=2, num_key_value_heads=1, vocab_size=512)\n"
        "    return transformers.LlamaForCausalLM(config)\n"
    )
    inputs = ["-i", "input_ids=int64:64", "-i", "labels=int64:64"]
    assert cli.main(["estimate", f"{factory}:llama", *inputs, "-b", "2", "--seq-len", "100000", "--json"]) in (0, 3)
    answer = json.loads(capsys.readouterr().out)["sequence"]
    assert answer["max_positions"] is None
    from nnmem_callbacks.hardware.gpus import find_gpu

    by_memory = sorted(answer["gpus"], key=lambda row: row["capacity_bytes"])  # what a run can have, not nvidia-smi's
    lengths = [row["max_sequence_length"] for row in by_memory]
    assert max(lengths) > min(lengths) > 64
    for major in {find_gpu(row["name"]).capability[0] for row in by_memory}:
        # more memory, longer sequences, among cards of one architecture (each architecture has its own cuBLAS
        # workspaces: an A100 80GB holds a little less than an H100 yet leaves more for the step)
        same = [row["max_sequence_length"] for row in by_memory if find_gpu(row["name"]).capability[0] == major]
        assert same == sorted(same), (major, same)
    assert all(row["fits"] == (row["max_sequence_length"] >= 100000) for row in by_memory)


def test_a_table_of_learned_positions_caps_the_length():
    model = _gpt2("sdpa")  # GPT-2's wpe: 1024 positions; a real step at 1025 fails
    estimate = estimate_training(model, _batch(128), "adamw", loss_fn=_loss, sequence_dim="auto")
    assert estimate.sequence.max_positions == 1024
    assert any("at most 1024 positions, from the position embedding 'transformer.wpe'" in n for n in estimate.notes)
    assert estimate.peak_bytes_at(2, seq_len=1024) > estimate.peak_bytes
    with pytest.raises(ValueError, match=r"seq_len 1025 is longer than the model takes: at most 1024 positions"):
        estimate.peak_bytes_at(2, seq_len=1025)
    assert estimate.max_sequence_length(2**50) == 1024  # any budget: no longer than the model takes
    small = 2 * estimate.peak_bytes
    uncapped = dataclasses.replace(estimate.sequence, max_positions=None)
    assert estimate.max_sequence_length(small) == uncapped.max_sequence_length(small, 2) < 1024  # under it: the same
    assert estimate.to_dict()["sequence"]["max_positions"] == 1024
    with pytest.raises(IndexError):  # what the cap stands for: the real model refuses a longer sequence
        model(**_batch(1025, 1))


def test_the_position_table_is_found_under_the_names_transformers_gives_it():
    small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    models = {  # model: the longest sequence a real forward takes
        transformers.BertModel(transformers.BertConfig(**small, max_position_embeddings=40)): 40,
        transformers.RobertaModel(transformers.RobertaConfig(**small, max_position_embeddings=42, pad_token_id=1)): 40,
        transformers.OPTModel(
            transformers.OPTConfig(
                hidden_size=32, num_hidden_layers=1, num_attention_heads=2, ffn_dim=64, vocab_size=100,
                max_position_embeddings=40, word_embed_proj_dim=32,
            )
        ): 40,
    }  # fmt: skip
    for model, longest in models.items():
        limit, source = position_limit(model)
        assert limit == longest, source
        model(input_ids=torch.full((1, longest), 5))
        with pytest.raises((IndexError, RuntimeError)):  # BERT's token type buffer refuses it before the table
            model(input_ids=torch.full((1, longest + 1), 5))
    assert position_limit(transformers.LlamaModel(transformers.LlamaConfig(**small))) is None  # rotary: no table


def test_a_batch_longer_than_the_model_takes_is_warned_of():
    model = _gpt2("sdpa")
    model.transformer.wpe = torch.nn.Embedding(48, 128)
    estimate = estimate_training(model, _batch(64), "adamw", loss_fn=_loss, sequence_dim="auto")
    assert any(
        n.startswith("warning: the batch's length 64 is longer than the model takes (48") for n in estimate.notes
    )


def test_the_cli_refuses_a_length_the_model_does_not_take(capsys):
    import os

    from nnmem_callbacks import cli

    factory = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "models.py") + ":gpt2"
    small = ["-a", "n_layer=1", "-a", "n_embd=64", "-a", "n_head=2", "-a", "vocab_size=512"]
    inputs = ["-i", "input_ids=int64:64", "-i", "labels=int64:64"]
    assert cli.main(["estimate", factory, *small, *inputs, "-b", "2", "--seq-len", "2048", "--no-probes"]) == 2
    error = capsys.readouterr().err
    assert "--seq-len: seq_len 2048 is longer than the model takes: at most 1024 positions" in error


@pytest.mark.parametrize("adapter", ["PromptTuningConfig", "PrefixTuningConfig"])
def test_virtual_tokens_of_a_prompt_learning_adapter_come_off_the_longest_length(adapter):
    """Prompt tuning puts its virtual tokens before the batch's, prefix tuning its prefix in the cache: both take
    positions, so a GPT-2 of 64 positions with 16 virtual tokens takes 48 tokens, not the 64 the cap said."""
    peft = pytest.importorskip("peft")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    config.bos_token_id = config.eos_token_id = 0
    model = transformers.GPT2LMHeadModel(config)
    model = peft.get_peft_model(model, getattr(peft, adapter)(num_virtual_tokens=16, task_type="CAUSAL_LM"))
    limit, source = position_limit(model)
    assert limit == 48 and "less 16 virtual tokens" in source
    model(input_ids=torch.full((1, 48), 5))
    with pytest.raises(IndexError):
        model(input_ids=torch.full((1, 49), 5))
    assert position_limit(model.get_base_model()) == (64, "the position embedding 'transformer.wpe', 64 rows")
