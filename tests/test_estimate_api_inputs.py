"""What the estimate API takes from a user: budgets spelled as the callbacks take them, and ``precision=None``.

* ``MemoryEstimate.max_batch_size``, ``verify_max_batch_size`` and ``max_sequence_length`` read ``"8GiB"`` as the
  callbacks' ``budget=`` does, and refuse what is not bytes (a fraction of the device, ``None``, junk) with a
  ``ValueError`` naming the valid spellings, never a ``TypeError`` from inside the search;
* ``precision=None`` is Lightning's default, ``32-true``, in the vocabulary and in ``estimate_training``.
"""

from __future__ import annotations

import pytest

from nnmem_callbacks.core import vocabulary
from nnmem_callbacks.core.estimate import MemoryEstimate, PhaseLine
from nnmem_callbacks.core.sequence import SequenceCurve, SequencePhase
from nnmem_callbacks.core.units import parse_bytes


def _estimate(**overrides) -> MemoryEstimate:
    fields = dict(
        peak_bytes=1_300,
        breakdown={"parameters": 300, "activations": 1_000},
        batch_size=10,
        phases=(PhaseLine("step1/backward", 300, 100), PhaseLine("step2/optimizer", 900, 5)),
        peak_phase="step1/backward",
    )
    fields.update(overrides)
    return MemoryEstimate(**fields)


@pytest.mark.parametrize("spelling", ["2KiB", "2 KiB", "3MB", "1.5KiB", "4096B"])
def test_max_batch_size_reads_a_size_with_a_unit_as_the_callbacks_do(spelling):
    est = _estimate()
    assert est.max_batch_size(spelling) == est.max_batch_size(parse_bytes(spelling))
    phases = est.phases

    def direct(n: int) -> MemoryEstimate:
        return MemoryEstimate(peak_bytes=est.peak_bytes_at(n), breakdown={}, batch_size=n, phases=phases)

    checked = _estimate(verifier=direct)
    record = checked.verify_max_batch_size(spelling)
    assert record.budget_bytes == parse_bytes(spelling)
    assert record.batch_size == checked.max_batch_size(spelling) == est.max_batch_size(parse_bytes(spelling))


def test_a_gigabyte_budget_string_on_a_real_sized_estimate():
    est = _estimate(phases=(PhaseLine("step1/backward", 300, 2**20),), peak_bytes=300 + 10 * 2**20)
    assert est.max_batch_size("8GiB") == est.max_batch_size(8 * 2**30) == (8 * 2**30 - 300) // 2**20


@pytest.mark.parametrize(
    "budget, says",
    [
        (0.5, "fraction of the device"),
        ("0.9", "fraction of the device"),
        ("16", "'16' is a number without a unit"),
        ("0", "'0' is a number without a unit"),
        ("lots", "cannot read budget 'lots'"),
        (None, "not a size in bytes"),
        (True, "not a size in bytes"),
        (float("inf"), "not a finite size"),
    ],
)
def test_a_budget_that_is_not_bytes_is_a_value_error_naming_the_valid_spellings(budget, says):
    est = _estimate()
    with pytest.raises(ValueError, match=says) as raised:
        est.max_batch_size(budget)
    assert "'8GiB'" in str(raised.value)


def test_ints_and_float_byte_counts_keep_their_old_answers():
    est = _estimate()
    assert est.max_batch_size(1_500) == 12
    assert est.max_batch_size(1_500.0) == 12
    assert est.max_batch_size(0) == 0


def test_max_sequence_length_takes_the_same_budget_spellings():
    curve = SequenceCurve(128, 4, (SequencePhase("step1/forward", ((1_000.0, 10.0, 0.5, 1_000),)),))
    est = MemoryEstimate(peak_bytes=10_472, breakdown={}, batch_size=4, sequence=curve)
    assert est.max_sequence_length("40000B") == est.max_sequence_length(40_000) == 269
    assert est.max_sequence_length("1MiB") == est.max_sequence_length(2**20)
    with pytest.raises(ValueError, match="fraction of the device"):
        est.max_sequence_length(0.5)


def test_precision_none_is_lightnings_default_full_precision():
    assert vocabulary.canonical_precision(None) == "32-true"
    with pytest.raises(ValueError, match="unknown precision 'None'"):  # the text "None" is still no precision
        vocabulary.canonical_precision("None")


def test_estimate_training_takes_precision_none_as_32_true():
    torch = pytest.importorskip("torch")
    from nnmem_callbacks import estimate_training

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))

    def loss(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])

    made = estimate_training(model, batch, optimizer="adam", loss_fn=loss, precision=None, probe_kernels=False)
    full = estimate_training(model, batch, optimizer="adam", loss_fn=loss, precision="32-true", probe_kernels=False)
    assert made.precision == "32-true"
    assert made.peak_bytes == full.peak_bytes and dict(made.breakdown) == dict(full.breakdown)
