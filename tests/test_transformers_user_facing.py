"""What a Hugging Face user sees: warnings, printed plans and logged figures (tiny GPT-2 on CPU).

* ``plan_training_arguments`` warns when nothing fits (the budget, the smallest peak, what to try) and returns the
  arguments unchanged, never silently;
* ``print(plan)`` is one line with the decision;
* the callback's logs never carry a NaN measured figure (before the first measurement only the prediction);
* the warnings point at the user's line (``trainer.train()``, ``plan_training_arguments(...)``), not at
  ``transformers/trainer_callback.py``.
"""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from nnmem_callbacks.adapters.transformers import warning_site  # noqa: E402
from nnmem_callbacks.core.units import format_bytes  # noqa: E402
from nnmem_callbacks.transformers import MemoryBudgetCallback, plan_training_arguments  # noqa: E402

VOCAB, LENGTH = 256, 32


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        ids = torch.randint(1, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def arguments(tmp_path, **overrides):
    settings = dict(
        per_device_train_batch_size=8,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        max_steps=2,
    )
    settings.update(overrides)
    return transformers.TrainingArguments(str(tmp_path / "out"), **settings)


def sample(rows: int = 2):
    return torch.utils.data.default_collate([Tokens()[i] for i in range(rows)])


def ours(said) -> list[warnings.WarningMessage]:
    return [w for w in said if "plan_training_arguments" in str(w.message) or "MemoryBudget" in str(w.message)]


def test_nothing_fits_warns_with_the_budget_the_smallest_peak_and_what_to_try(tmp_path):
    model, args = tiny_gpt2(), arguments(tmp_path)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        planned = plan_training_arguments(model, args, budget="1MiB", sample=sample(), probe_kernels=False)
    told = ours(said)
    assert len(told) == 1, [str(w.message) for w in said]
    message = str(told[0].message)
    print(message)
    assert told[0].filename == __file__  # the user's call, not this package
    smallest = planned.estimate.upper_bytes_at(1)
    assert planned.estimate.upper_bytes_at(1) > 2**20 * 0.95  # not even batch 1 fits
    assert "nothing fits the budget of 1.00 MiB" in message
    assert f"the smallest predicted peak, at per-device batch 1, is {format_bytes(smallest)}" in message
    from nnmem_callbacks.adapters.transformers.planning import checkpointing_argument

    # the argument the installed transformers takes without a deprecation warning
    assert f"{checkpointing_argument()}=True" in message and "a larger budget" in message
    assert not planned.changed and not planned.fits and planned.checked is None
    assert (planned.batch_size, planned.accumulate) == (8, 1)
    assert planned.args.per_device_train_batch_size == 8 and planned.args.gradient_accumulation_steps == 1


def test_batch_one_fits_but_not_at_the_accumulation_warns_and_leaves_the_arguments(tmp_path):
    model, args = tiny_gpt2(), arguments(tmp_path)
    estimate = plan_training_arguments(model, args, budget="4GiB", sample=sample(), probe_kernels=False).estimate
    budget = int(estimate.upper_bytes_at(1) / 0.95) + 1  # batch 1 fits, batch 1 with 8 accumulated steps does not
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        planned = plan_training_arguments(model, args, budget=budget, sample=sample(), probe_kernels=False)
    assert planned.plan.max_fitting_batch_size >= 1
    told = ours(said)
    assert len(told) == 1 and told[0].filename == __file__
    message = str(told[0].message)
    assert "keeps the effective batch of 8" in message and "without accumulation" in message
    assert not planned.changed and not planned.fits  # before: batch 1 x 8 that does not fit either, silently
    assert planned.args.per_device_train_batch_size == 8 and planned.args.gradient_accumulation_steps == 1


def test_a_plan_prints_as_one_line_with_its_decision(tmp_path):
    model, args = tiny_gpt2(), arguments(tmp_path)
    estimate = plan_training_arguments(model, args, budget="4GiB", sample=sample(), probe_kernels=False).estimate
    budget = int(estimate.upper_bytes_at(4) / 0.95) + 1
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        planned = plan_training_arguments(model, args, budget=budget, sample=sample(), probe_kernels=False)
    assert not ours(said)  # a plan that fits is not a warning
    text = str(planned)
    print(text)
    assert text == repr(planned) and "\n" not in text and len(text) < 250
    assert text.startswith("TrainingPlan(")
    b, a = planned.batch_size, planned.accumulate
    assert planned.changed and planned.fits and b * a == 8
    for part in (
        f"batch_size={b}",
        f"accumulate={a}",
        f"effective_batch={b * a}",
        f"predicted_peak={format_bytes(planned.predicted_peak_bytes)}",
        f"budget={format_bytes(budget)}",
        "fits=True",
        "changed=True",
    ):
        assert part in text, (part, text)
    assert "TrainingArguments" not in text and "MemoryEstimate" not in text


def test_logs_carry_no_nan_and_the_warning_points_at_trainer_train(tmp_path):
    model, args = tiny_gpt2(), arguments(tmp_path)
    estimate = plan_training_arguments(model, args, budget="4GiB", sample=sample(), probe_kernels=False).estimate
    budget = int(estimate.upper_bytes_at(4) / 0.95) + 1  # batch 8 does not fit: the callback warns
    callback = MemoryBudgetCallback(budget=budget, policy="warn", probe_kernels=False)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        trainer.train()
    told = [w for w in said if "MemoryBudgetCallback: the predicted peak exceeds the budget" in str(w.message)]
    assert len(told) == 1
    assert told[0].filename == __file__, (told[0].filename, told[0].lineno)  # trainer.train(), above
    assert not [w for w in ours(said) if w.filename.endswith("trainer_callback.py")]

    logged = [entry for entry in trainer.state.log_history if "memory/predicted_peak_mib" in entry]
    assert len(logged) >= 2
    for entry in logged:
        for key, value in entry.items():
            assert not (isinstance(value, float) and math.isnan(value)), (key, entry)
    first = logged[0]  # step 1: no measurement yet (the sampled step finishes at step 2)
    assert first["step"] == 1
    assert "memory/measured_peak_mib" not in first and "memory/relative_error" not in first
    assert first["memory/predicted_peak_mib"] == pytest.approx(estimate.peak_bytes_at(8) / 2**20)
    assert any("memory/measured_peak_mib" in entry for entry in logged)  # once measured, it is logged


def test_the_warning_site_skips_this_package_and_the_trainers_frames():
    assert warning_site._internal("transformers.trainer_callback")
    assert warning_site._internal("accelerate.utils.memory")
    assert warning_site._internal("nnmem_callbacks.adapters.transformers.callback")
    assert not warning_site._internal("transformers_user_script") and not warning_site._internal("__main__")
