"""What cuDNN's RNN kernels allocate, as a rule with its sources (framework-free).

``aten._cudnn_rnn`` (``nn.LSTM``/``nn.GRU``/``nn.RNN`` on CUDA) allocates, besides its outputs, a reserve saved for
backward, a workspace around the forward and each backward kernel, and a weight buffer (with its gradient) when the
weights are not views of one flat buffer. Their sizes come from cuDNN and cannot be asked for without a GPU: the
reserve follows from the cells' math (``elements = D * (L * (k + 1) - 1) * H * N * T``, exact against an H100 and a
P100 measurement), the workspace is fitted per cuDNN major version as ``alpha * reserve + fixed``. Where a GPU is
present :mod:`nnmem_callbacks.estimators.torch.cuda.cudnn_rnn` measures the real sizes instead (a bounded probe).

Design and evidence: docs/cuda-model.md, "cuDNN RNNs".

Known limitations:
    * RNN_TANH/RNN_RELU (``k = 1``) and LSTM with ``proj_size`` follow the same
      pattern but were not measured.
    * Packed sequences are sized for ``max_len x batch`` steps (cuDNN is given
      the padded extent in its data descriptor); the real reserve may be
      smaller.
    * Inter-layer dropout may keep masks in the reserve; not modelled.

Example:
    >>> shape = RnnShape("LSTM", input_size=512, hidden_size=1024, num_layers=2)
    >>> reserve_bytes(shape, steps=256, batch=64, element_size=4)
    738197504
    >>> workspace_bytes(shape, steps=256, batch=64, element_size=4)
    484442112
    >>> weight_count(shape) * 4
    58785792
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

#: hidden-sized vectors per layer, direction and step that the reserve keeps
#: besides the layer output (see the module docstring for the derivation).
STORED_PER_STEP = {"LSTM": 5, "GRU": 6, "RNN_TANH": 1, "RNN_RELU": 1}

#: gates per cell: rows of W_ih / W_hh in units of the hidden size
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}

#: cudnnRNNMode_t values torch passes as ``mode`` (cudnn_frontend / cudnn.h)
CUDNN_MODE = {"RNN_RELU": 0, "RNN_TANH": 1, "LSTM": 2, "GRU": 3}

#: workspace = alpha * reserve + fixed bytes, per cuDNN major version: (alpha, fixed, source).
#: cuDNN 9: fitted through the two H100 measurements of the module docstring
#: (workspaces 484,442,112 B and 33,688,616 B for reserves 738,197,504 B and
#: 23,068,672 B). cuDNN 7 (v7 API, pytorch/pytorch#2895: workspace 17,730,560 B
#: printed for the 736,000,000 B reserve there): one point, taken as a ratio.
WORKSPACE_FIT = {
    9: (
        Fraction(484_442_112 - 33_688_616, 738_197_504 - 23_068_672),
        19_148_181,
        "H100, cuDNN 9.19, torch 2.11: gpu-runs/2026-11-23-h100 cuda_facts.json and zoo_cuda.json (lstm, adam, 32-true)",
    ),
    7: (Fraction(17_730_560, 736_000_000), 0, "P100, cuDNN 7: pytorch/pytorch#2895 (cudnnGetRNNWorkspaceSize printed)"),
}

#: the table row used when the cuDNN version is unknown (no GPU here)
DEFAULT_CUDNN_MAJOR = 9

#: bytes of cuDNN's dropout state, allocated once per device on the first
#: training forward with inter-layer dropout and cached for the process
#: (RNN.cpp ``get_dropout_state``: "Each state is slightly over 2MB").
DROPOUT_STATE_BYTES = 2 * 2**20 + 2**16


@dataclasses.dataclass(frozen=True)
class RnnShape:
    """The hyper-parameters that decide cuDNN's sizes.

    Attributes:
        mode: ``"LSTM"``, ``"GRU"``, ``"RNN_TANH"`` or ``"RNN_RELU"``.
        input_size: Features of the input.
        hidden_size: ``H``.
        num_layers: ``L``.
        bidirectional: Two directions.
        proj_size: LSTM projection size (0: none).
    """

    mode: str
    input_size: int
    hidden_size: int
    num_layers: int = 1
    bidirectional: bool = False
    proj_size: int = 0

    def __post_init__(self) -> None:
        if self.mode not in STORED_PER_STEP:
            raise ValueError(f"unknown RNN mode {self.mode!r}; valid: {', '.join(STORED_PER_STEP)}")
        if self.proj_size and self.mode != "LSTM":
            raise ValueError(f"proj_size is only valid for LSTM, got mode {self.mode!r}")

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def output_size(self) -> int:
        """Features per direction of each layer's output."""
        return self.proj_size or self.hidden_size


def weight_count(shape: RnnShape) -> int:
    """Elements of cuDNN's weight space (``cudnnGetRNNWeightSpaceSize``).

    torch builds the descriptor with ``CUDNN_RNN_DOUBLE_BIAS`` whatever the
    module's ``bias``, so both bias vectors are counted; for modules with
    biases this equals the parameter count (58,785,792 B measured for the H100
    case, exactly the parameters).
    """
    rows = GATES[shape.mode] * shape.hidden_size
    out = shape.output_size
    total = 0
    for layer in range(shape.num_layers):
        inputs = shape.input_size if layer == 0 else out * shape.directions
        per_direction = rows * inputs + rows * out + 2 * rows
        if shape.proj_size:
            per_direction += shape.proj_size * shape.hidden_size
        total += per_direction * shape.directions
    return total


def reserve_elements_per_step(shape: RnnShape) -> int:
    """Elements the reserve keeps per (sample, time step)."""
    stored = STORED_PER_STEP[shape.mode] * shape.hidden_size
    if shape.proj_size:
        # the pre-projection h is kept too (it is not the layer output any more)
        stored += shape.hidden_size
    per_direction = shape.num_layers * (stored + shape.output_size) - shape.output_size
    return shape.directions * per_direction


def reserve_bytes(shape: RnnShape, steps: int, batch: int, element_size: int) -> int:
    """Bytes of the training reserve for ``steps`` x ``batch``."""
    return reserve_elements_per_step(shape) * int(steps) * int(batch) * int(element_size)


def workspace_bytes(shape: RnnShape, steps: int, batch: int, element_size: int, cudnn_major: int | None = None) -> int:
    """Bytes of the workspace (forward training, and each backward call).

    Args:
        cudnn_major: The cuDNN major version (``None``: :data:`DEFAULT_CUDNN_MAJOR`);
            versions without a row use the nearest lower one (or the lowest).
    """
    alpha, fixed, _ = workspace_fit(cudnn_major)
    return int(reserve_bytes(shape, steps, batch, element_size) * alpha) + fixed


def workspace_fit(cudnn_major: int | None = None) -> tuple[Fraction, int, str]:
    """The (alpha, fixed, source) row of :data:`WORKSPACE_FIT` for a cuDNN major version."""
    major = DEFAULT_CUDNN_MAJOR if cudnn_major is None else int(cudnn_major)
    known = sorted(WORKSPACE_FIT)
    lower = [m for m in known if m <= major]
    return WORKSPACE_FIT[lower[-1] if lower else known[0]]


__all__ = [
    "CUDNN_MODE",
    "DROPOUT_STATE_BYTES",
    "RnnShape",
    "reserve_bytes",
    "reserve_elements_per_step",
    "weight_count",
    "workspace_bytes",
    "workspace_fit",
]
