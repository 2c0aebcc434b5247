"""What cuDNN's RNN kernels allocate, as a rule with its sources (framework-free).

PyTorch runs ``nn.LSTM``/``nn.GRU``/``nn.RNN`` on CUDA through
``aten._cudnn_rnn`` (``aten/src/ATen/native/cudnn/RNN.cpp``). Besides the
output, ``hy`` and ``cy``, it allocates:

* a **reserve** (``cudnnGetRNNTempSpaceSizes(..., CUDNN_FWD_MODE_TRAINING)``),
  returned as the op's fourth output and saved for backward, so it lives from
  the forward to the end of the backward;
* a **workspace** from the same query, allocated for the forward kernel and
  again, with the *same* query, for ``cudnnRNNBackwardData_v8`` and for
  ``cudnnRNNBackwardWeights_v8``; freed when each returns;
* a **weight buffer** of ``cudnnGetRNNWeightSpaceSize`` elements when the
  weights are not views of one flat buffer (``nn.LSTM`` on CUDA flattens its
  parameters, functional calls such as Keras' do not; under autocast the
  weights are always copied into a new fp16 buffer); it is saved for backward,
  and its gradient ``dw`` (same size) is allocated in backward.

The sizes come from cuDNN and cannot be asked for without a GPU. What cuDNN
keeps follows from the math of the cells, and two independent measurements
fix the rule:

* per layer, direction and time step, the reserve holds ``k`` hidden-sized
  vectors the backward needs (LSTM: the 4 gate activations and the cell state,
  ``k = 5``; GRU: ``k = 6``) plus the layer's output ``h``; the last layer's
  output is the op's output ``y`` (passed to the backward), so it is not kept
  twice: ``elements = D * (L * (k + 1) - 1) * H * N * T``.
* **H100, cuDNN 9.19, torch 2.11** (``gpu-runs/2026-11-23-h100/cuda_facts.json``):
  LSTM, L=2, input 512, H=1024, N=64, T=256, fp32. After the forward,
  740,295,168 B stayed allocated beyond the output: ``h0``/``c0`` (created by
  ``nn.LSTM``, saved) and ``hy``/``cy`` are 4 x 524,288 B, leaving
  738,198,016 B = 11 x H x N x T x 4 B + 512 (``L * 6 - 1 = 11``). After the
  backward the reserve and ``h0``/``c0`` were gone and exactly the output,
  ``hy``/``cy`` and the 58,785,792 B of weight gradients (= the parameters:
  no padding in the weight space) remained.
* **P100, cuDNN 7, pytorch/pytorch#2895** (cudnnGetRNNTrainingReserveSize
  printed): LSTM 736,000,000 B and GRU 864,000,000 B for the same network. The
  parameter counts in the issue (LSTM 3,038,090, GRU 2,279,370, RNN 761,930)
  solve to 4 layers, H=320, input 123, a 320->10 classifier; with N*T=25,000
  the rule gives 23 x 320 x 25,000 x 4 = 736,000,000 (LSTM) and
  27 x 320 x 25,000 x 4 = 864,000,000 (GRU), both exact.

The workspace has no such derivation; it is fitted, per cuDNN major version,
as ``alpha * reserve + fixed`` through two measurements on the H100 (cuDNN
9.19), which differ in every size but the layer count:

* the LSTM above: the forward peak rose 1,291,846,144 B, i.e. the live tensors
  plus a 484,442,112 B workspace; the backward peak (1,394,607,616 B) is then
  matched to within 2 KiB by the backward's own allocations plus a workspace
  of the same size (the backward asks ``cudnnGetRNNTempSpaceSizes`` the same
  question, as RNN.cpp shows);
* the ``lstm`` zoo case (``zoo_cuda.json``: 2 layers 128 -> 256, batch 32 x 64
  steps, adam, fp32): forward and backward peaks both 18.55 MB above the live
  tensors plus ``alpha * reserve``, which gives
  ``alpha = 0.6303`` and ``fixed = 19,148,181`` B.

The zoo case under ``bf16-mixed`` (cuDNN runs it in fp16: half the reserve,
same fixed part) is the check: the fit is within 0.2 MB (0.4% of the peak) of
the measured forward peak. Where a GPU is present
:mod:`nnmem_callbacks.estimators.torch.cuda.cudnn_rnn` measures the real sizes instead (a
bounded probe).

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
