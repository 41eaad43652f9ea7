"""A ConvNeXt block in plain PyTorch (no torchvision, no hpctrain code), in float64, written
as torchvision's CNBlock is, and the same block as an hpctrain net, to compare step by step with
:mod:`tests.torch_reference`'s helpers (``hpctrain_steps``, ``torch_steps``, ``compare``).

Import this module only after ``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.torch_reference import NameMap

BLOCK_NET = """input channels=3 height=13 width=11 classes=5
conv name=stem out=8 kernel=3 pad=1
layernorm name=stem_norm eps=1e-6
conv name=block.0 out=8 kernel=7 pad=3 groups=8
layernorm name=block.2 eps=1e-6
conv name=block.3 out=32 kernel=1
gelu name=block.4
conv name=block.5 out=8 kernel=1
layerscale name=layer_scale init=0.5
add in=layer_scale,stem_norm
avgpool kernel=global
layernorm name=head_norm eps=1e-6
flatten
linear name=fc out=5
"""


class ChannelsLastLinear(nn.Module):
    """``nn.Linear`` applied to the channels-last tensor, as torchvision's CNBlock applies
    ``block.3`` and ``block.5``, its weight held (out, in, 1, 1) as hpctrain holds it."""

    def __init__(self, inputs: int, outputs: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(outputs, inputs, 1, 1))
        self.bias = nn.Parameter(torch.zeros(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.flatten(1), self.bias)


class ConvNeXtBlock(nn.Module):
    """A stem conv and its LayerNorm2d, then torchvision's CNBlock written out: depthwise 7×7,
    permute to NHWC, LayerNorm, Linear, GELU, Linear, permute back, times ``layer_scale``
    (C, 1, 1), plus the input; a global average pool, a LayerNorm2d and the classifier."""

    def __init__(self, channels: int = 8, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.stem_norm = nn.LayerNorm(channels, eps=1e-6)
        self.block = nn.ModuleDict({
            "0": nn.Conv2d(channels, channels, 7, padding=3, groups=channels),
            "2": nn.LayerNorm(channels, eps=1e-6),
            "3": ChannelsLastLinear(channels, 4 * channels),
            "5": ChannelsLastLinear(4 * channels, channels)})
        self.layer_scale = nn.Parameter(torch.zeros(channels, 1, 1))
        self.head_norm = nn.LayerNorm(channels, eps=1e-6)
        self.fc = nn.Linear(channels, classes)

    @staticmethod
    def norm2d(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
        return norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm2d(self.stem_norm, self.stem(x))
        b = self.block
        y = b["2"](b["0"](x).permute(0, 2, 3, 1))
        y = b["5"](F.gelu(b["3"](y))).permute(0, 3, 1, 2)
        x = self.layer_scale * y + x
        x = self.norm2d(self.head_norm, F.adaptive_avg_pool2d(x, 1))
        return self.fc(torch.flatten(x, 1))


def block_names() -> NameMap:
    """The block's layers carry PyTorch's module names; a norm's γ, β are ``weight``, ``bias``,
    and the layer scale is a parameter of the model itself."""
    names = NameMap({}, {})
    for conv in ("stem", "block.0", "block.3", "block.5", "fc"):
        names.conv(conv, conv, bias=True)
    for norm in ("stem_norm", "block.2", "head_norm"):
        names.params[f"{norm}.gamma"], names.params[f"{norm}.beta"] = (f"{norm}.weight",
                                                                       f"{norm}.bias")
    names.params["layer_scale.layer_scale"] = "layer_scale"
    return names
