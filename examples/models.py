"""Model factories for ``nnmem estimate`` (no weights are downloaded).

Each function returns a freshly initialised ``torch.nn.Module``; point the CLI
at it as ``examples/models.py:NAME`` and pass keyword arguments with
``--model-arg KEY=VALUE``::

    nnmem estimate examples/models.py:mlp -i 1000 -b 256 --optimizer sgd
    nnmem estimate examples/models.py:resnet50 -i 3,224,224 -b 64 --precision 16-mixed
    nnmem estimate examples/models.py:bert_base_mlm -i input_ids=int64:128 -i labels=int64:128 \\
        -b 32 --optimizer adamw

The ResNet-50 is written by hand (torchvision's layout: Bottleneck blocks
3-4-6-3, 25,557,032 parameters) so that torchvision is not needed.

Example:
    >>> sum(p.numel() for p in resnet50().parameters())
    25557032
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def mlp(widths: Sequence[int] = (1000, 100, 100, 100, 100, 10)) -> nn.Module:
    """Linear layers with ReLU between them (the seed's 1000-100x4-10 MLP by default)."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def bert_base_mlm(attn_implementation: str = "sdpa", **config: object) -> nn.Module:
    """BERT-base (12 layers, hidden 768, 12 heads, vocab 30522) with the masked-LM head.

    Feed ``input_ids`` and ``labels`` (both ``int64``, one row of tokens per
    sample) so that the model computes its cross-entropy loss.
    """
    from transformers import BertConfig, BertForMaskedLM

    bert_config = BertConfig(**config)
    bert_config._attn_implementation = attn_implementation
    return BertForMaskedLM(bert_config)


def gpt2(
    n_layer: int = 12, n_embd: int = 768, n_head: int = 12, vocab_size: int = 50257, attn_implementation: str = "sdpa"
) -> nn.Module:
    """GPT-2 (small by default) with its LM head; feed ``input_ids`` and ``labels``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size, use_cache=False)
    config._attn_implementation = attn_implementation
    return GPT2LMHeadModel(config)


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 reduce, 3x3 (stride here), 1x1 expand x4."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """ResNet-50 as in torchvision (``resnet50(weights=None)``)."""

    def __init__(self, num_classes: int = 1000, layers: Sequence[int] = (3, 4, 6, 3)):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * Bottleneck.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(num_classes: int = 1000) -> nn.Module:
    """A hand-made ResNet-50 (no torchvision needed); input ``3,224,224``."""
    return ResNet50(num_classes=num_classes)
