"""Batch description: which batch containers the estimator accepts and how it rebuilds them."""

from collections import UserDict

import pytest

torch = pytest.importorskip("torch")

from nnmem_callbacks.estimators.torch.estimator import estimate_training  # noqa: E402
from nnmem_callbacks.estimators.torch.inputs import describe_batch  # noqa: E402


class Encoding(UserDict):
    """A mapping that torch's pytree does not know, like transformers' BatchEncoding."""


class TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 4)
        self.b = torch.nn.Linear(3, 4)

    def forward(self, x, y):
        return (self.a(x) * self.b(y)).sum()


def test_user_mapping_is_read_as_its_tensors_and_rebuilt_as_its_type():
    batch = Encoding(x=torch.empty(8, 6), y=torch.empty(8, 3))
    spec = describe_batch(batch)
    assert spec.batch_size == 8
    assert [s.shape for s in spec.tensor_specs()] == [(8, 6), (8, 3)]
    rebuilt, tensors = spec.build(16, torch.device("meta"), lambda dtype: dtype)
    assert type(rebuilt) is Encoding
    assert sorted(rebuilt) == ["x", "y"] and rebuilt["x"].shape == (16, 6)
    assert len(tensors) == 2


def test_user_mapping_estimates_like_the_same_dict():
    model = TwoInputs()
    seen = []

    def loss(module, batch):
        seen.append(type(batch))
        return module(**batch)

    as_mapping = estimate_training(
        model, Encoding(x=torch.empty(8, 6), y=torch.empty(8, 3)), loss_fn=loss, optimizer="adam", probe_kernels=False
    )
    as_dict = estimate_training(
        model, {"x": torch.empty(8, 6), "y": torch.empty(8, 3)}, loss_fn=loss, optimizer="adam", probe_kernels=False
    )
    assert as_mapping.method == as_dict.method == "trace"
    assert as_mapping.peak_bytes == as_dict.peak_bytes
    assert Encoding in seen


def test_mapping_without_tensors_is_still_refused():
    with pytest.raises(ValueError, match="holds no tensor"):
        describe_batch(Encoding(x=[1, 2, 3]))
