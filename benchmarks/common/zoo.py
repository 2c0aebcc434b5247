"""The benchmark model zoo: small, hand-written models covering the layer kinds
the estimator must handle (linear, conv + BatchNorm, residual nets, LSTM,
attention through ``nn.TransformerEncoder`` / HF GPT-2 / hand-written eager
attention, UNet skips, a large embedding, activation checkpointing and a
data-dependent op).

Every case is a :class:`ZooCase`. Sizes are chosen so that one real fp32
training step on a 2-core CPU takes well under 2 s and peak RAM stays below
about 3 GiB. Nothing here downloads weights.

Example:
    >>> case = get_case("mlp")
    >>> model = case.make_model()
    >>> batch = case.make_batch(4, "cpu")
    >>> float(case.loss_fn(model, batch)) > 0
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = [
    "ZooCase",
    "ZOO",
    "OUTSIDE_CASES",
    "DEFAULT_CASES",
    "OPTIMIZERS",
    "PRECISIONS",
    "get_case",
    "case_names",
    "image_batch",
    "xent_loss",
    "make_resnet50",
]


@dataclasses.dataclass
class ZooCase:
    """One benchmark case.

    Attributes:
        name: Short identifier.
        make_model: Builds a fresh model (random init, CPU, fp32).
        make_batch: ``(batch_size, device) -> batch``; a tensor, tuple or dict of tensors.
        batch_size: The batch size the benchmark uses.
        loss_fn: ``(model, batch) -> scalar loss``; runs the forward pass and the loss.
        data_dependent: The forward contains data-dependent shapes (``nonzero``, masks).
        outside: Built from a ``transformers`` config this repo did not write, and never
            tuned on (see :data:`OUTSIDE_CASES`); not in the default full run.
    """

    name: str
    make_model: Callable[[], nn.Module]
    make_batch: Callable[[int, Any], Any]
    batch_size: int
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]
    data_dependent: bool = False
    outside: bool = False


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------
# Generic losses
# ---------------------------------------------------------------------------
def xent_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of ``model(x)`` against the labels ``y`` of an ``(x, y)`` batch."""
    x, y = batch
    return F.cross_entropy(model(x), y)


def image_batch(channels: int, size: int, classes: int) -> Callable[[int, Any], Any]:
    """A batch maker ``(batch_size, device) -> (images, labels)`` with a fixed seed."""

    def make(batch_size: int, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator()
        x = torch.randn(batch_size, channels, size, size, generator=g)
        y = torch.randint(0, classes, (batch_size,), generator=g)
        return x.to(device), y.to(device)

    return make


# ---------------------------------------------------------------------------
# mlp: the seed question's MLP
# ---------------------------------------------------------------------------
def make_mlp() -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(1000, 100), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(100, 100), nn.ReLU()]
    layers.append(nn.Linear(100, 10))  # 4 hidden layers of 100
    return nn.Sequential(*layers)


def mlp_batch(batch_size: int, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = _generator()
    x = torch.randn(batch_size, 1000, generator=g)
    y = torch.randint(0, 10, (batch_size,), generator=g)
    return x.to(device), y.to(device)


# ---------------------------------------------------------------------------
# bn_cnn: small conv net with BatchNorm on 3x32x32
# ---------------------------------------------------------------------------
def make_bn_cnn() -> nn.Module:
    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )

    return nn.Sequential(
        block(3, 32),
        block(32, 64),
        block(64, 128),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


# ---------------------------------------------------------------------------
# ResNet-18 / ResNet-50, torchvision layout, written by hand
# ---------------------------------------------------------------------------
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # stride on the 3x3 (torchvision v1.5)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block: type, layers: list[int], num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, block: type, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def make_resnet18(num_classes: int = 100) -> nn.Module:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes)


def make_resnet50(num_classes: int = 1000) -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes)


# ---------------------------------------------------------------------------
# lstm: embedding + 2-layer LSTM + classifier
# ---------------------------------------------------------------------------
class LSTMClassifier(nn.Module):
    def __init__(self, vocab: int = 5000, embed: int = 128, hidden: int = 256, classes: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


def _token_batch(vocab: int, seq: int, classes: int) -> Callable[[int, Any], Any]:
    def make(batch_size: int, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator()
        x = torch.randint(0, vocab, (batch_size, seq), generator=g)
        y = torch.randint(0, classes, (batch_size,), generator=g)
        return x.to(device), y.to(device)

    return make


# ---------------------------------------------------------------------------
# transformer_encoder: nn.TransformerEncoder (batch_first) + head
# ---------------------------------------------------------------------------
class EncoderClassifier(nn.Module):
    def __init__(
        self, vocab: int = 8000, d_model: int = 256, nhead: int = 4, layers: int = 4, seq: int = 128, classes: int = 10
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=4 * d_model, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        return self.head(self.encoder(h).mean(dim=1))


# ---------------------------------------------------------------------------
# gpt2: HF GPT2LMHeadModel from a config (no download), attn_implementation="sdpa"
# ---------------------------------------------------------------------------
GPT2_ATTN_IMPLEMENTATION = "sdpa"  # the transformers default; "eager" attention is covered by `vit`


def make_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=8000, n_positions=128, n_embd=256, n_layer=4, n_head=4, attn_implementation=GPT2_ATTN_IMPLEMENTATION
    )
    config._attn_implementation = GPT2_ATTN_IMPLEMENTATION
    model = GPT2LMHeadModel(config)
    model.config.use_cache = False
    return model


def gpt2_batch(batch_size: int, device: Any = "cpu") -> dict[str, torch.Tensor]:
    g = _generator()
    return {"input_ids": torch.randint(0, 8000, (batch_size, 128), generator=g).to(device)}


def gpt2_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    ids = batch["input_ids"]
    return model(input_ids=ids, labels=ids, use_cache=False).loss


# ---------------------------------------------------------------------------
# vit: patch-embedding conv + cls token + hand-written eager-attention blocks
# ---------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)  # eager attention
        attn = attn.softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, d)
        return self.proj(out)


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * mlp_ratio), nn.GELU(), nn.Linear(dim * mlp_ratio, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(
        self, image: int = 64, patch: int = 8, dim: int = 192, depth: int = 6, heads: int = 3, classes: int = 100
    ):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[ViTBlock(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


# ---------------------------------------------------------------------------
# unet: down/up convs with skip concatenation, per-pixel segmentation loss
# ---------------------------------------------------------------------------
def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    def __init__(self, cin: int = 3, classes: int = 4, base: int = 16):
        super().__init__()
        c1, c2, c3 = base, base * 2, base * 4
        self.down1 = _double_conv(cin, c1)
        self.down2 = _double_conv(c1, c2)
        self.bottom = _double_conv(c2, c3)
        self.up2 = nn.ConvTranspose2d(c3, c2, 2, 2)
        self.dec2 = _double_conv(c3, c2)
        self.up1 = nn.ConvTranspose2d(c2, c1, 2, 2)
        self.dec1 = _double_conv(c2, c1)
        self.out = nn.Conv2d(c1, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        b = self.bottom(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return self.out(u1)


def unet_batch(batch_size: int, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = _generator()
    x = torch.randn(batch_size, 3, 64, 64, generator=g)
    y = torch.randint(0, 4, (batch_size, 64, 64), generator=g)
    return x.to(device), y.to(device)


# ---------------------------------------------------------------------------
# embedding_heavy: 200k x 64 embedding + EmbeddingBag(mean) + small MLP
# ---------------------------------------------------------------------------
class EmbeddingBagModel(nn.Module):
    def __init__(self, vocab: int = 200_000, dim: int = 64, classes: int = 10):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim, 128), nn.ReLU(), nn.Linear(128, classes))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.bag(tokens))


# ---------------------------------------------------------------------------
# checkpointed: MLP residual stack, each block under non-reentrant checkpoint
# ---------------------------------------------------------------------------
class CheckpointedMLP(nn.Module):
    def __init__(self, dim: int = 512, depth: int = 8, hidden: int = 2048, classes: int = 10):
        super().__init__()
        self.inp = nn.Linear(256, dim)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
            for _ in range(depth)
        )
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + checkpoint(block, h, use_reentrant=False)
        return self.head(h)


def checkpointed_batch(batch_size: int, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = _generator()
    x = torch.randn(batch_size, 256, generator=g)
    y = torch.randint(0, 10, (batch_size,), generator=g)
    return x.to(device), y.to(device)


# ---------------------------------------------------------------------------
# data_dependent: routing by a data-dependent boolean mask / nonzero
# ---------------------------------------------------------------------------
class MaskedRouting(nn.Module):
    """Tokens whose gate is positive go through an expensive expert; the rest through a cheap one.

    The number of routed rows depends on the data (``torch.nonzero``), so the
    activation sizes cannot be known from shapes alone.
    """

    def __init__(self, dim: int = 256, hidden: int = 1024, classes: int = 10):
        super().__init__()
        self.inp = nn.Linear(128, dim)
        self.gate = nn.Linear(dim, 1)
        self.expert = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))
        self.cheap = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))  # (B, T, dim)
        flat = h.reshape(-1, h.shape[-1])
        score = self.gate(flat).squeeze(-1)
        idx = torch.nonzero(score > 0).squeeze(-1)  # data-dependent count
        out = self.cheap(flat)
        routed = self.expert(flat[idx]) * torch.sigmoid(score[idx]).unsqueeze(-1)
        out = out.index_add(0, idx, routed)
        out = out.reshape(h.shape)
        kept = out[out.abs().sum(-1) > 0]  # boolean-mask indexing, data-dependent
        return self.head(out.mean(dim=1)) + 0.0 * kept.sum()


def data_dependent_batch(batch_size: int, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = _generator()
    x = torch.randn(batch_size, 64, 128, generator=g)
    y = torch.randint(0, 10, (batch_size,), generator=g)
    return x.to(device), y.to(device)


# ---------------------------------------------------------------------------
# Outside cases: models built from transformers configs (no weights, no network).
# The estimator was developed on the hand-written zoo above; these judge it on
# models nobody here wrote. Every config keeps transformers' defaults (the
# attention implementation included, "sdpa" in transformers 5) apart from sizes.
# ---------------------------------------------------------------------------
def _hf_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


def _no_cache(model: nn.Module) -> nn.Module:
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return model


HF_VOCAB, HF_SEQ = 8000, 128


def make_hf_bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=HF_VOCAB,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=HF_SEQ,
        num_labels=5,
    )
    return BertForSequenceClassification(config)


def hf_bert_batch(batch_size: int, device: Any = "cpu") -> dict[str, torch.Tensor]:
    """Token ids padded to 128 with a padded attention mask: sequence i keeps 128 - 16*(i % 4) tokens."""
    g = _generator()
    ids = torch.randint(1, HF_VOCAB, (batch_size, HF_SEQ), generator=g)
    lengths = torch.tensor([HF_SEQ - 16 * (i % 4) for i in range(batch_size)])
    mask = (torch.arange(HF_SEQ)[None, :] < lengths[:, None]).long()
    ids = ids * mask  # pad id 0
    labels = torch.randint(0, 5, (batch_size,), generator=g)
    return {k: v.to(device) for k, v in {"input_ids": ids, "attention_mask": mask, "labels": labels}.items()}


def make_hf_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=HF_VOCAB,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    return _no_cache(LlamaForCausalLM(config))


def hf_llama_batch(batch_size: int, device: Any = "cpu") -> dict[str, torch.Tensor]:
    g = _generator()
    ids = torch.randint(0, HF_VOCAB, (batch_size, HF_SEQ), generator=g)
    return {"input_ids": ids.to(device), "labels": ids.to(device)}


def make_hf_t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=HF_VOCAB,
        d_model=256,
        d_kv=32,
        d_ff=1024,
        num_layers=4,
        num_decoder_layers=4,
        num_heads=8,
        relative_attention_num_buckets=32,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return _no_cache(T5ForConditionalGeneration(config))


def hf_t5_batch(batch_size: int, device: Any = "cpu") -> dict[str, torch.Tensor]:
    """128 source tokens, 64 target tokens; the decoder input is the labels shifted right by the model."""
    g = _generator()
    ids = torch.randint(1, HF_VOCAB, (batch_size, HF_SEQ), generator=g)
    labels = torch.randint(1, HF_VOCAB, (batch_size, HF_SEQ // 2), generator=g)
    return {"input_ids": ids.to(device), "labels": labels.to(device)}


def make_hf_vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=64,
        patch_size=8,
        hidden_size=192,
        num_hidden_layers=6,
        num_attention_heads=3,
        intermediate_size=768,
        num_labels=100,
    )
    return ViTForImageClassification(config)


def make_hf_convnext() -> nn.Module:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(hidden_sizes=[32, 64, 128, 256], depths=[2, 2, 4, 2], num_labels=100, image_size=64)
    return ConvNextForImageClassification(config)


def _hf_image_batch(size: int, classes: int) -> Callable[[int, Any], Any]:
    def make(batch_size: int, device: Any = "cpu") -> dict[str, torch.Tensor]:
        x, y = image_batch(3, size, classes)(batch_size, device)
        return {"pixel_values": x, "labels": y}

    return make


# ---------------------------------------------------------------------------
# The zoo
# ---------------------------------------------------------------------------
ZOO: dict[str, ZooCase] = {
    case.name: case
    for case in [
        ZooCase("mlp", make_mlp, mlp_batch, 256, xent_loss),
        ZooCase("bn_cnn", make_bn_cnn, image_batch(3, 32, 10), 64, xent_loss),
        ZooCase("resnet18", make_resnet18, image_batch(3, 64, 100), 16, xent_loss),
        ZooCase("resnet50", make_resnet50, image_batch(3, 64, 1000), 8, xent_loss),
        ZooCase("lstm", LSTMClassifier, _token_batch(5000, 64, 5), 32, xent_loss),
        ZooCase("transformer_encoder", EncoderClassifier, _token_batch(8000, 128, 10), 16, xent_loss),
        ZooCase("gpt2", make_gpt2, gpt2_batch, 8, gpt2_loss),
        ZooCase("vit", ViT, image_batch(3, 64, 100), 32, xent_loss),
        ZooCase("unet", UNet, unet_batch, 8, xent_loss),
        ZooCase("embedding_heavy", EmbeddingBagModel, _token_batch(200_000, 32, 10), 256, xent_loss),
        ZooCase("checkpointed", CheckpointedMLP, checkpointed_batch, 256, xent_loss),
        ZooCase("data_dependent", MaskedRouting, data_dependent_batch, 32, xent_loss, data_dependent=True),
        # outside cases (transformers configs, not tuned on)
        ZooCase("hf_bert", make_hf_bert, hf_bert_batch, 8, _hf_loss, outside=True),
        ZooCase("hf_llama", make_hf_llama, hf_llama_batch, 4, _hf_loss, outside=True),
        ZooCase("hf_t5", make_hf_t5, hf_t5_batch, 4, _hf_loss, outside=True),
        ZooCase("hf_vit", make_hf_vit, _hf_image_batch(64, 100), 16, _hf_loss, outside=True),
        ZooCase("hf_convnext", make_hf_convnext, _hf_image_batch(64, 100), 16, _hf_loss, outside=True),
    ]
}

#: Cases built from transformers configs this repo did not write; the estimator was never tuned on them.
OUTSIDE_CASES: tuple[str, ...] = tuple(name for name, case in ZOO.items() if case.outside)
#: The default full run: the hand-written zoo (plus gpt2), as before the outside cases were added.
DEFAULT_CASES: tuple[str, ...] = tuple(name for name, case in ZOO.items() if not case.outside)


def case_names() -> list[str]:
    """Names of every zoo case (outside cases included), in benchmark order."""
    return list(ZOO)


def get_case(name: str) -> ZooCase:
    """Returns the zoo case called ``name``.

    Raises:
        KeyError: naming the valid cases.
    """
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"unknown zoo case {name!r}; valid: {', '.join(ZOO)}") from None


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
}

PRECISIONS = ("32-true", "bf16-mixed")
