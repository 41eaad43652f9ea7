"""An independent reference: ResNet-18, one InceptionA module, CosmoFlow, an MLP, a small CNN and
a mobile block (depthwise, grouped and dilated convolutions, a squeeze-excitation gate and the
mobile activations) and a decoder (a dilated ASPP module, transposed convolutions) written in
plain PyTorch (no torchvision, no hpctrain code), in float64,
trained from hpctrain's initial weights on the same batches, to compare with hpctrain step by
step. The classifiers are trained on softmax cross-entropy, CosmoFlow (a regression) on the
mean squared error.

Import this module only after ``pytest.importorskip("torch")``: PyTorch is the reference extra,
which `make test` (and so CI) installs; elsewhere the tests that need it skip.

Each model comes with an explicit name map, hpctrain name → PyTorch name, for its parameters
(batch norm's γ, β are PyTorch's ``weight``, ``bias``) and for its buffers (running mean and
variance). :func:`hpctrain_steps` runs hpctrain on any communicator and gathers every tensor
whole on rank 0; :func:`torch_steps` runs the PyTorch model from those initial values;
:func:`compare` gives the relative error of every tensor of every step.

The whole loop too: :func:`train_command_epoch` runs the ``train`` command on a small dataset
under ``--augment standard`` for an epoch and three steps and reads back its log and a
checkpoint per step; :func:`torch_epoch` trains a PyTorch twin (:class:`BatchNormCNN`) on batches
rebuilt from the draws docs/data.md describes, with the update docs/running.md describes;
:func:`compare_epochs` gives the relative error of every logged loss and every tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn

from hpctrain.comm.gather import gather_to_root
from hpctrain.comm.grid import GridSet
from hpctrain.data.source import MicroBatches
from hpctrain.data.synthetic import SyntheticData
from hpctrain.device.backend import Backend
from hpctrain.model.net import NetSpec, load_net, parse_net
from hpctrain.plan.plans import LayerPlan
from hpctrain.run.network import Network
from hpctrain.run.optimizer import SGD
from tests.test_input_splits import MLP

# hyper-parameters of the compared update: momentum and weight decay both matter
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-2
SEED = 3


# -- ResNet-18, as torchvision builds it --------------------------------------------------------

class BasicBlock(nn.Module):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); the shortcut is a strided 1x1 conv
    and batch norm when the block changes the size or the width."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes, eps=1e-5, momentum=0.1)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes, eps=1e-5, momentum=0.1)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes, eps=1e-5, momentum=0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class ResNet18(nn.Module):
    WIDTHS = (64, 128, 256, 512)

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64, eps=1e-5, momentum=0.1)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = 64
        for stage, planes in enumerate(self.WIDTHS, start=1):
            stride = 1 if stage == 1 else 2
            setattr(self, f"layer{stage}", nn.Sequential(BasicBlock(inplanes, planes, stride),
                                                         BasicBlock(planes, planes)))
            inplanes = planes
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        for stage in range(1, 5):
            x = getattr(self, f"layer{stage}")(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@dataclass
class NameMap:
    """hpctrain name → PyTorch name, for parameters and for buffers."""

    params: dict[str, str]
    buffers: dict[str, str]

    def conv(self, ours: str, theirs: str, bias: bool = False) -> None:
        self.params[f"{ours}.weight"] = f"{theirs}.weight"
        if bias:
            self.params[f"{ours}.bias"] = f"{theirs}.bias"

    def batchnorm(self, ours: str, theirs: str) -> None:
        self.params[f"{ours}.gamma"] = f"{theirs}.weight"
        self.params[f"{ours}.beta"] = f"{theirs}.bias"
        self.buffers[f"{ours}.running_mean"] = f"{theirs}.running_mean"
        self.buffers[f"{ours}.running_var"] = f"{theirs}.running_var"


def resnet18_names() -> NameMap:
    """hpctrain's ``layer2_0.downsample_bn.gamma`` is torchvision's
    ``layer2.0.downsample.1.weight``, and so on: written out block by block."""
    names = NameMap({}, {})
    names.conv("conv1", "conv1")
    names.batchnorm("bn1", "bn1")
    for stage in range(1, 5):
        for block in range(2):
            ours, theirs = f"layer{stage}_{block}", f"layer{stage}.{block}"
            names.conv(f"{ours}.conv1", f"{theirs}.conv1")
            names.batchnorm(f"{ours}.bn1", f"{theirs}.bn1")
            names.conv(f"{ours}.conv2", f"{theirs}.conv2")
            names.batchnorm(f"{ours}.bn2", f"{theirs}.bn2")
            if stage > 1 and block == 0:
                names.conv(f"{ours}.downsample", f"{theirs}.downsample.0")
                names.batchnorm(f"{ours}.downsample_bn", f"{theirs}.downsample.1")
    names.params["fc.weight"], names.params["fc.bias"] = "fc.weight", "fc.bias"
    return names


def resnet18_net() -> NetSpec:
    return load_net("resnet18", 32)


# -- one InceptionA module (torchvision's inception_v3 Mixed_5b) --------------------------------

class BasicConv2d(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, **kwargs) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001, momentum=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class InceptionA(nn.Module):
    BRANCHES = ("branch1x1", "branch5x5_1", "branch5x5_2", "branch3x3dbl_1", "branch3x3dbl_2",
                "branch3x3dbl_3", "branch_pool")

    def __init__(self, in_channels: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(in_channels, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(in_channels, pool_features, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch1x1 = self.branch1x1(x)
        branch5x5 = self.branch5x5_2(self.branch5x5_1(x))
        branch3x3dbl = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        branch_pool = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([branch1x1, branch5x5, branch3x3dbl, branch_pool], 1)


INCEPTION_STEM, INCEPTION_POOL_FEATURES, INCEPTION_CLASSES = 16, 32, 10


class InceptionNet(nn.Module):
    """A 3x3 stem conv (with bias), Mixed_5b, global average pooling and one FC."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, INCEPTION_STEM, 3, padding=1, bias=True)
        self.Mixed_5b = InceptionA(INCEPTION_STEM, INCEPTION_POOL_FEATURES)
        self.fc = nn.Linear(224 + INCEPTION_POOL_FEATURES, INCEPTION_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.Mixed_5b(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def inception_names() -> NameMap:
    names = NameMap({}, {})
    names.conv("stem", "stem", bias=True)
    for branch in InceptionA.BRANCHES:
        ours = theirs = f"Mixed_5b.{branch}"
        names.conv(f"{ours}.conv", f"{theirs}.conv")
        names.batchnorm(f"{ours}.bn", f"{theirs}.bn")
    names.params["fc.weight"], names.params["fc.bias"] = "fc.weight", "fc.bias"
    return names


def shipped_define(text: str, block: str) -> str:
    """The lines of ``define BLOCK …`` through its ``end`` in a .net text."""
    lines = text.splitlines()
    start = next((k for k, line in enumerate(lines) if line.split()[:2] == ["define", block]),
                 None)
    if start is None:
        raise LookupError(f"no 'define {block}' in inception_v3.net")
    stop = next(k for k in range(start, len(lines)) if lines[k].split() == ["end"])
    return "\n".join(lines[start:stop + 1])


def inception_net() -> NetSpec:
    """The shipped inception_v3.net's ``basic`` and ``inception_a`` blocks, used once after a
    stem conv; so this checks the shipped definition itself."""
    shipped = (files("hpctrain") / "inputs" / "nets" / "inception_v3.net").read_text("utf-8")
    text = "\n".join([
        f"input channels=3 size=8 classes={INCEPTION_CLASSES}",
        shipped_define(shipped, "basic"),
        shipped_define(shipped, "inception_a"),
        f"conv name=stem out={INCEPTION_STEM} kernel=3 pad=1",
        f"use inception_a name=Mixed_5b pool_features={INCEPTION_POOL_FEATURES}",
        "avgpool name=avgpool kernel=global",
        "flatten",
        f"linear name=fc out={INCEPTION_CLASSES}",
    ])
    return parse_net(text, "inception_a-test")


# -- CosmoFlow, as the MLPerf HPC reference builds it (mlcommons/hpc, cosmoflow/models) -------

COSMOFLOW_WIDTHS = (16, 32, 64, 128, 256)
COSMOFLOW_SIZE = 32  # --image-size 32: 32^3 volumes, 1^3 after the five pools


class CosmoFlow(nn.Module):
    """Five blocks of a 2x2x2 conv with TensorFlow's ``same`` padding, LeakyReLU and a 2x2x2
    max-pool; flatten (NCDHW, channel-major); dense 128 → 64 → T with LeakyReLU; 1.2·tanh.

    ``pad`` is the (before, after) zeros on each spatial axis: TensorFlow's ``same`` for an even
    kernel puts the one zero after. ``keras_flatten`` flattens channels-last, as the Keras
    original does. ``pad``, ``slope``, ``scale`` and ``keras_flatten`` are arguments only so
    that a test can check that getting one of them wrong is caught.
    """

    def __init__(self, channels: int, spatial: tuple[int, int, int], targets: int,
                 pad: tuple[int, int] = (0, 1), slope: float = 0.3, scale: float = 1.2,
                 keras_flatten: bool = False) -> None:
        super().__init__()
        self.pad, self.scale, self.keras_flatten = pad, scale, keras_flatten
        widths = (channels, *COSMOFLOW_WIDTHS)
        for k in range(1, len(widths)):
            setattr(self, f"conv{k}", nn.Conv3d(widths[k - 1], widths[k], 2, bias=True))
        self.act = nn.LeakyReLU(slope)
        self.pool = nn.MaxPool3d(2)
        left = math.prod(n // 2 ** len(COSMOFLOW_WIDTHS) for n in spatial)  # after the pools
        self.fc1 = nn.Linear(COSMOFLOW_WIDTHS[-1] * left, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(64, targets)
        self.tanh = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k in range(1, len(COSMOFLOW_WIDTHS) + 1):
            # F.pad lists (before, after) from the last axis back: W, H, then D
            x = self.pool(self.act(getattr(self, f"conv{k}")(F.pad(x, self.pad * 3))))
        x = torch.flatten(x.movedim(1, -1) if self.keras_flatten else x, 1)
        x = self.act(self.fc2(self.act(self.fc1(x))))
        return self.scale * self.tanh(self.fc3(x))


def cosmoflow_names() -> NameMap:
    """hpctrain's ``block3.conv1.weight`` is ``conv3.weight``, ``linear2.bias`` is
    ``fc2.bias``."""
    names = NameMap({}, {})
    for k in range(1, len(COSMOFLOW_WIDTHS) + 1):
        names.conv(f"block{k}.conv1", f"conv{k}", bias=True)
    for k in range(1, 4):
        names.params[f"linear{k}.weight"] = f"fc{k}.weight"
        names.params[f"linear{k}.bias"] = f"fc{k}.bias"
    return names


def cosmoflow_net(size: int = COSMOFLOW_SIZE) -> NetSpec:
    """The shipped cosmoflow.net itself, on ``size``^3 volumes."""
    return load_net("cosmoflow", size)


def cosmoflow_volume_net(depth: int, size: int) -> NetSpec:
    """The shipped cosmoflow.net on ``depth``×``size``×``size`` volumes: its own lines after a
    new ``input`` line. Unequal sides tell the depth from the other axes, and more than one
    plane left after the pools makes the flatten order matter."""
    shipped = (files("hpctrain") / "inputs" / "nets" / "cosmoflow.net").read_text("utf-8")
    lines = shipped.splitlines()
    at = next(k for k, line in enumerate(lines) if line.split()[:1] == ["input"])
    targets = next(word for word in lines[at].split() if word.startswith("targets="))
    lines[at] = f"input channels=4 depth={depth} size={size} {targets}"
    return parse_net("\n".join(lines), f"cosmoflow-{depth}x{size}x{size}")


def cosmoflow_model(net: NetSpec, **changes) -> CosmoFlow:
    """The PyTorch CosmoFlow for ``net``'s input and targets; ``changes``: see
    :class:`CosmoFlow`."""
    channels, *spatial = net.input_shape
    return CosmoFlow(channels, tuple(spatial), net.classes, **changes)


# -- an MLP and a small CNN, for plans that split the reduction (input features, channels) --

SMALL_CNN_NET = """input channels=4 size=7 classes=5
conv out=6 kernel=3 pad=1
relu
conv out=10 kernel=3 pad=1
relu
maxpool kernel=2
flatten
linear out=14
relu
linear out=5
"""


class TorchMLP(nn.Module):
    """The net ``MLP`` of tests/test_input_splits.py: 12 → 20 → 9 → 6, with ReLUs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(12, 20), nn.Linear(20, 9), nn.Linear(9, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(4, 6, 3, padding=1), nn.Conv2d(6, 10, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(10 * 3 * 3, 14), nn.Linear(14, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def layer_names(convs: int, linears: int) -> NameMap:
    """hpctrain's ``conv2.bias`` is ``conv2.bias``, its ``linear1.weight`` is ``fc1.weight``."""
    names = NameMap({}, {})
    for k in range(1, convs + 1):
        names.conv(f"conv{k}", f"conv{k}", bias=True)
    for k in range(1, linears + 1):
        names.conv(f"linear{k}", f"fc{k}", bias=True)
    return names


# -- a mobile block: depthwise, grouped and dilated convolutions, a gate, mobile activations ----

MOBILE_NET = """input channels=3 size=10 classes=5
conv name=stem out=12 kernel=3 pad=1 bias=0
batchnorm name=bn1
relu6
conv name=dw out=12 kernel=3 pad=2 dilation=2 groups=12 bias=0
batchnorm name=bn2
hardswish name=act
avgpool name=squeeze kernel=global
conv name=fc1 out=4 kernel=1
silu
conv name=fc2 out=12 kernel=1
hardsigmoid name=gate
mul name=excite in=act,gate
conv name=expand out=24 kernel=3 pad=1 groups=12
sigmoid
layernorm name=ln eps=1e-6
gelu
conv name=grouped out=24 kernel=3 pad=2x1 dilation=2x1 groups=12
clip min=-0.5 max=0.75
upsample scale=2 mode=bilinear
conv name=head out=8 kernel=3 stride=2 pad=1 groups=4
upsample size=7x9 mode=bilinear align=1
avgpool kernel=global
flatten
linear name=fc out=5
"""


class MobileBlock(nn.Module):
    """MobileNet v3's inverted residual without its residual: a depthwise dilated convolution
    between batch norms, a squeeze-excitation gate, then a grouped convolution (two outputs
    per input), ConvNeXt's layer norm over the channels and GELU, and a grouped convolution
    dilated along the height alone; then a decoder's resizing:
    bilinear ×2, a strided grouped convolution, and a bilinear resize with aligned corners to a
    size of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn1 = nn.Conv2d(3, 12, 3, padding=1, bias=False), nn.BatchNorm2d(12)
        self.dw = nn.Conv2d(12, 12, 3, padding=2, dilation=2, groups=12, bias=False)
        self.bn2 = nn.BatchNorm2d(12)
        self.fc1, self.fc2 = nn.Conv2d(12, 4, 1), nn.Conv2d(4, 12, 1)
        self.expand = nn.Conv2d(12, 24, 3, padding=1, groups=12)
        self.ln = nn.LayerNorm(24, eps=1e-6)
        self.grouped = nn.Conv2d(24, 24, 3, padding=(2, 1), dilation=(2, 1), groups=12)
        self.head = nn.Conv2d(24, 8, 3, stride=2, padding=1, groups=4)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self.bn1(self.stem(x)))
        x = F.hardswish(self.bn2(self.dw(x)))
        # hard sigmoid as ReLU6(x + 3)/6: F.hardsigmoid's backward scales by a float32 1/6
        # even in float64, 3e-8 off the derivative
        gate = F.relu6(self.fc2(F.silu(self.fc1(x.mean((2, 3), keepdim=True)))) + 3) / 6
        x = torch.sigmoid(self.expand(x * gate))
        x = F.gelu(self.ln(x.movedim(1, -1)).movedim(-1, 1))  # ConvNeXt's LayerNorm2d
        x = F.hardtanh(self.grouped(x), -0.5, 0.75)
        x = self.head(F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False))
        x = F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=True)
        return self.fc(x.mean((2, 3)))


def mobile_names() -> NameMap:
    """The block's layers carry PyTorch's module names: only batch norm's γ and β differ."""
    names = NameMap({}, {})
    names.conv("stem", "stem")
    names.conv("dw", "dw")
    for conv in ("fc1", "fc2", "expand", "grouped", "head", "fc"):
        names.conv(conv, conv, bias=True)
    names.batchnorm("bn1", "bn1")
    names.batchnorm("bn2", "bn2")
    names.params["ln.gamma"], names.params["ln.beta"] = "ln.weight", "ln.bias"
    return names


# -- a decoder: a dilated ASPP module, bilinear upsampling, transposed convolutions --------------

DECODER_NET = """input channels=3 size=12 classes=5
conv name=stem out=8 kernel=3 stride=2 pad=1 bias=0
batchnorm name=bn1
relu name=enc
conv name=a1 in=enc out=6 kernel=1
conv name=a2 in=enc out=6 kernel=3 pad=2 dilation=2
conv name=a3 in=enc out=6 kernel=3 pad=3 dilation=3
avgpool name=pool in=enc kernel=global
conv name=gpc out=6 kernel=1
upsample name=broadcast size=6x6 mode=bilinear
concat name=aspp in=a1,a2,a3,broadcast
conv name=proj out=8 kernel=1
relu
deconv name=up out=8 kernel=3 stride=2 pad=1 outpad=1
concat name=skip in=up,input
conv name=fuse out=12 kernel=3 pad=1
relu
deconv name=grouped out=8 kernel=4 stride=2 pad=1 groups=4
avgpool kernel=global
flatten
linear name=fc out=5
"""


class Decoder(nn.Module):
    """DeepLab's parts at a small size: an encoder (a strided convolution), an ASPP module
    (a 1×1, convolutions dilated by 2 and 3, and the global pool's branch resized back),
    then a decoder: a transposed convolution doubling the size (kernel 3, padding 1, output
    padding 1, DeepCAM's), a skip connection from the input, and a grouped transposed
    convolution (kernel 4, stride 2, padding 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn1 = nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8)
        self.a1, self.gpc = nn.Conv2d(8, 6, 1), nn.Conv2d(8, 6, 1)
        self.a2 = nn.Conv2d(8, 6, 3, padding=2, dilation=2)
        self.a3 = nn.Conv2d(8, 6, 3, padding=3, dilation=3)
        self.proj = nn.Conv2d(24, 8, 1)
        self.up = nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1)
        self.fuse = nn.Conv2d(11, 12, 3, padding=1)
        self.grouped = nn.ConvTranspose2d(12, 8, 4, stride=2, padding=1, groups=4)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = F.relu(self.bn1(self.stem(x)))
        pooled = self.gpc(e.mean((2, 3), keepdim=True))
        broadcast = F.interpolate(pooled, size=e.shape[-2:], mode="bilinear",
                                  align_corners=False)
        aspp = torch.cat([self.a1(e), self.a2(e), self.a3(e), broadcast], 1)
        y = self.up(F.relu(self.proj(aspp)))
        y = self.grouped(F.relu(self.fuse(torch.cat([y, x], 1))))
        return self.fc(y.mean((2, 3)))


def decoder_names() -> NameMap:
    names = NameMap({}, {})
    names.conv("stem", "stem")
    for conv in ("a1", "a2", "a3", "gpc", "proj", "up", "fuse", "grouped", "fc"):
        names.conv(conv, conv, bias=True)
    names.batchnorm("bn1", "bn1")
    return names


# -- the compared models ---------------------------------------------------------------------

TOLERANCE = 1e-9  # relative error of every tensor of every step
BATCH, STEPS = 4, 2  # two steps, so momentum is used

# name → (hpctrain net, the PyTorch model for that net, the name map)
MODELS = {
    "resnet18": (resnet18_net, lambda net: ResNet18(net.classes), resnet18_names),
    "inception_a": (inception_net, lambda net: InceptionNet(), inception_names),
    "cosmoflow": (cosmoflow_net, cosmoflow_model, cosmoflow_names),
    "mlp": (lambda: parse_net(MLP, "mlp"), lambda net: TorchMLP(),
            lambda: layer_names(0, 3)),
    "small_cnn": (lambda: parse_net(SMALL_CNN_NET, "small_cnn"), lambda net: SmallCNN(),
                  lambda: layer_names(2, 2)),
    "mobile": (lambda: parse_net(MOBILE_NET, "mobile"), lambda net: MobileBlock(),
               mobile_names),
    "decoder": (lambda: parse_net(DECODER_NET, "decoder"), lambda net: Decoder(),
                decoder_names),
}


# -- running both ---------------------------------------------------------------------------

@dataclass
class StepResult:
    """One step, whole: logits (a regression's outputs) and loss of the batch, the gradients of
    the parameters, and the parameters and buffers after the update. Keyed by hpctrain
    names."""

    logits: np.ndarray
    loss: float
    grads: dict[str, np.ndarray]
    params: dict[str, np.ndarray]
    buffers: dict[str, np.ndarray]


@dataclass
class Run:
    initial_params: dict[str, np.ndarray]
    initial_buffers: dict[str, np.ndarray]
    steps: list[StepResult]
    batches: list[tuple[np.ndarray, np.ndarray]]  # (images, labels or targets) of each step
    regression: bool = False  # the loss is the mean squared error, not cross-entropy


def hpctrain_steps(net: NetSpec, plan: list[LayerPlan], comm: MPI.Comm, batch: int,
                   steps: int, accumulate: int = 1,
                   wrap: Callable[[SyntheticData], Any] | None = None) -> Run | None:
    """``steps`` training steps of hpctrain in float64 on ``comm`` under ``plan``, each of
    ``accumulate`` micro-batches of ``batch / accumulate`` samples (what ``plan`` is for) and
    one SGD update; everything gathered whole on rank 0 (None elsewhere). ``wrap``: what the
    synthetic source is read through (e.g. one that leaves pixels unlabelled). Collective."""
    backend = Backend(np, np.float64)
    root = comm.Get_rank() == 0
    micro = batch // accumulate

    def whole(tensors: list, value: str) -> dict[str, np.ndarray]:
        return {t.name: gather_to_root(backend, comm, getattr(t, value), t.shape, t.box, "copy")
                for t in tensors}

    source = SyntheticData(backend, net.input_shape, net.classes, batch, SEED,
                           regression=net.regression, maps=net.per_pixel)
    if wrap is not None:
        source = wrap(source)
    with GridSet(comm) as grids:
        network = Network(net, plan, micro, grids, backend, SEED)
        data = MicroBatches(source, accumulate, micro) if accumulate > 1 else source
        optimizer = SGD(network.params, LR, MOMENTUM, WEIGHT_DECAY)
        initial_params = whole(network.params, "value")
        initial_buffers = whole(network.buffers, "value")
        results, batches = [], []
        last = network.layers[-1]
        for step in range(steps):
            outputs: list = []
            loss, _ = network.train_step(data, step, outputs, accumulate=accumulate)
            logits = gather_to_root(backend, comm, outputs[-1], last.out_layout.shape,
                                    last.out_layout.box, "copy")
            grads = whole(network.params, "grad")  # before the step, which reuses the buffers
            optimizer.step()
            results.append(StepResult(logits, loss, grads, whole(network.params, "value"),
                                      whole(network.buffers, "value")))
            if root:  # the whole step's batch, as the source draws it
                everything = tuple((0, n) for n in (batch, *net.input_shape))
                answers = everything[:1] + everything[2:] if net.per_pixel else (0, batch)
                batches.append((source.images(step, everything),
                                source.labels(step, answers)))
    return (Run(initial_params, initial_buffers, results, batches, net.regression) if root
            else None)


def started_as(model: nn.Module, names: NameMap, start: Run) -> nn.Module:
    """``model`` in float64 and training mode, its parameters and buffers set to ``start``'s
    initial values through ``names`` (each named once on both sides)."""
    model = model.double().train()
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    check_bijection("parameter", names.params, start.initial_params, params)
    check_bijection("buffer", names.buffers, start.initial_buffers,
                    {k: v for k, v in buffers.items() if not k.endswith("num_batches_tracked")})
    with torch.no_grad():
        for ours, theirs in names.params.items():
            params[theirs].copy_(torch.from_numpy(start.initial_params[ours]))
        for ours, theirs in names.buffers.items():
            buffers[theirs].copy_(torch.from_numpy(start.initial_buffers[ours]))
    return model


def torch_steps(model: nn.Module, names: NameMap, start: Run) -> list[StepResult]:
    """The PyTorch model, float64, from ``start``'s initial parameters and buffers, trained on
    ``start``'s batches (on ``start``'s loss) with torch.optim.SGD set to hpctrain's update
    (g = ∇ + λw; v = μv + g, v = g at the first step; w −= lr·v: no dampening, no Nesterov)."""
    model = started_as(model, names, start)
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, dampening=0.0,
                                weight_decay=WEIGHT_DECAY, nesterov=False)
    results = []
    for images, labels in start.batches:
        optimizer.zero_grad(set_to_none=True)
        logits = model(torch.from_numpy(images))
        if start.regression:  # per sample the mean over the targets, then over the batch
            loss = F.mse_loss(logits, torch.from_numpy(labels), reduction="mean")
        else:
            loss = F.cross_entropy(logits, torch.from_numpy(labels), reduction="mean")
        loss.backward()
        grads = {ours: params[theirs].grad.numpy().copy() for ours, theirs in names.params.items()}
        optimizer.step()
        results.append(StepResult(
            logits.detach().numpy().copy(), float(loss.detach()), grads,
            {ours: params[theirs].detach().numpy().copy()
             for ours, theirs in names.params.items()},
            {ours: buffers[theirs].numpy().copy() for ours, theirs in names.buffers.items()}))
    return results


def check_bijection(what: str, names: dict[str, str], ours: dict, theirs: dict) -> None:
    """The map pairs every hpctrain tensor with every PyTorch tensor of the same shape."""
    if set(names) != set(ours):
        raise AssertionError(f"{what} names: hpctrain has {sorted(set(ours) - set(names))} "
                             f"unmapped, the map has {sorted(set(names) - set(ours))} unknown")
    if sorted(names.values()) != sorted(theirs):
        raise AssertionError(f"{what} names: PyTorch has "
                             f"{sorted(set(theirs) - set(names.values()))} unmapped, the map "
                             f"has {sorted(set(names.values()) - set(theirs))} unknown")
    for name, value in ours.items():
        if tuple(value.shape) != tuple(theirs[names[name]].shape):
            raise AssertionError(f"{what} {name}: hpctrain shape {value.shape}, PyTorch "
                                 f"{names[name]} shape {tuple(theirs[names[name]].shape)}")


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got − want| / max |want| (the absolute error where ``want`` is all zeros)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = float(np.abs(want).max()) if want.size else 0.0
    diff = float(np.abs(got - want).max()) if want.size else 0.0
    return diff / scale if scale > 0 else diff


def compare(got: list[StepResult], want: list[StepResult]) -> dict[str, float]:
    """Relative error of every tensor of every step: ``step 0 grad conv1.weight`` → error."""
    errors: dict[str, float] = {}
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        errors[f"step {step} logits"] = relative_error(g.logits, w.logits)
        errors[f"step {step} loss"] = relative_error(np.array(g.loss), np.array(w.loss))
        for kind in ("grads", "params", "buffers"):
            ours, theirs = getattr(g, kind), getattr(w, kind)
            for name in theirs:
                errors[f"step {step} {kind} {name}"] = relative_error(ours[name], theirs[name])
    return errors


def failures(errors: dict[str, float], tolerance: float) -> str:
    """'' when every error is within ``tolerance``; else the worst few, one per line.

    NaN counts as a failure."""
    bad = {k: e for k, e in errors.items() if not e <= tolerance}
    worst = sorted(bad.items(), key=lambda item: -item[1] if item[1] == item[1] else -np.inf)
    shown = "\n".join(f"  {name}: {e:.2e}" for name, e in worst[:12])
    more = f"\n  … and {len(bad) - 12} more" if len(bad) > 12 else ""
    return f"{len(bad)} of {len(errors)} tensors above {tolerance:.0e}:\n{shown}{more}" if bad \
        else ""


# -- a whole epoch of an augmented dataset, rebuilt from what the docs say -------------------
#
# hpctrain runs as the ``train`` command (its dataset reader, --augment standard, the schedule,
# the loop); PyTorch trains the same net from the same initial weights on batches rebuilt here
# from the documented draws (docs/data.md: the epoch permutation, the crop offsets and flips)
# with the documented update (docs/running.md: SGD, the warm-up and the step schedule). None of
# hpctrain's data, augmentation or optimizer code is used on this side.

BN_CNN_NET = """input channels=3 size=10 classes=4
conv out=6 kernel=3 pad=1 bias=0
batchnorm
relu
conv out=8 kernel=3 pad=1
relu
batchnorm
maxpool kernel=2
flatten
linear out=4
"""


class BatchNormCNN(nn.Module):
    """BN_CNN_NET on ``size``² images: conv (no bias), batch norm, ReLU, conv, ReLU (so the
    bias matters), batch norm, a 2x2 max-pool, flatten (channel-major) and one linear layer."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(6, eps=1e-5, momentum=0.1)
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8, eps=1e-5, momentum=0.1)
        self.fc1 = nn.Linear(8 * (size // 2) ** 2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(self.bn2(F.relu(self.conv2(x))), 2)
        return self.fc1(torch.flatten(x, 1))


def batchnorm_cnn_names() -> NameMap:
    """hpctrain's ``batchnorm2.gamma`` is ``bn2.weight``, ``linear1.bias`` is ``fc1.bias``."""
    names = NameMap({}, {})
    names.conv("conv1", "conv1")
    names.conv("conv2", "conv2", bias=True)
    names.batchnorm("batchnorm1", "bn1")
    names.batchnorm("batchnorm2", "bn2")
    names.conv("linear1", "fc1", bias=True)
    return names


@dataclass(frozen=True)
class EpochConfig:
    """One run of the ``train`` command, as its flags say it."""

    samples: int = 44  # training samples; 44 // 8 = 5 steps an epoch, 4 samples left out
    held_out: int = 6
    image: int = 10  # the dataset's images are 3 x image x image
    size: int | None = None  # --image-size: the net's input, a window of the image
    batch: int = 8
    steps: int = 8  # one epoch and three steps of the next
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-2
    warmup: int = 2
    every: int = 3  # --lr-schedule step:EVERY:FACTOR
    factor: float = 0.5
    seed: int = 11
    pad: int = 4  # the crop's zero padding (docs/data.md)

    @property
    def input_size(self) -> int:
        return self.size or self.image

    def flags(self) -> list[str]:
        size = [] if self.size is None else ["--image-size", str(self.size)]
        return [*size, "--augment", "standard", "--precision", "fp64", "--batch",
                str(self.batch), "--steps", str(self.steps), "--lr", str(self.lr),
                "--momentum", str(self.momentum), "--weight-decay", str(self.weight_decay),
                "--warmup-steps", str(self.warmup), "--lr-schedule",
                f"step:{self.every}:{self.factor}", "--seed", str(self.seed)]


def epoch_dataset(config: EpochConfig) -> dict[str, np.ndarray]:
    """Random images whose class shows in their left half's mean (so a flip matters) and in
    a corner's (so a crop does), and held-out images alike."""
    rng = np.random.default_rng(23)
    total = config.samples + config.held_out
    labels = rng.integers(0, 4, total)
    images = rng.standard_normal((total, 3, config.image, config.image))
    images[:, :, :, : config.image // 2] += 0.8 * labels[:, None, None, None]
    images[:, 0, :3, :3] -= 0.5 * labels[:, None, None]
    n = config.samples
    return {"images": images[:n], "labels": labels[:n], "val_images": images[n:],
            "val_labels": labels[n:]}


# docs/data.md, "The draws, exactly": SplitMix64's finaliser on 64-bit words
MASK64_WORDS, GOLDEN_RATIO_WORD, AUGMENT_PURPOSE = 2**64 - 1, 0x9E3779B97F4A7C15, 21


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64_WORDS
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64_WORDS
    return z ^ (z >> 31)


def _key(*words: int) -> int:
    k = 0
    for word in words:
        k = _mix((k + GOLDEN_RATIO_WORD + word) & MASK64_WORDS)
    return k


def _uniform(key: int, counter: int) -> float:
    return (_mix((counter * GOLDEN_RATIO_WORD + key) & MASK64_WORDS) >> 11) / 2**53


def batch_samples(config: EpochConfig, step: int) -> tuple[int, np.ndarray]:
    """(epoch, the dataset indices of batch ``step``): docs/data.md's epochs of ⌊N / B⌋ batches
    of ``default_rng([seed, e]).permutation(N)``."""
    per_epoch = config.samples // config.batch
    epoch, k = divmod(step, per_epoch)
    order = np.random.default_rng([config.seed, epoch]).permutation(config.samples)
    return epoch, order[k * config.batch:(k + 1) * config.batch]


def crop_and_flip(config: EpochConfig, epoch: int, index: int) -> tuple[int, int, bool]:
    """(dy, dx, flipped) of sample ``index`` in ``epoch`` under --augment standard."""
    u = [_uniform(_key(config.seed, AUGMENT_PURPOSE, epoch), 3 * index + k) for k in range(3)]
    span = config.image + 2 * config.pad - config.input_size  # the largest offset
    dy, dx = (min(int(draw * (span + 1)), span) for draw in u[1:])
    return dy, dx, u[0] < 0.5


def augmented(config: EpochConfig, image: np.ndarray, dy: int, dx: int,
              flipped: bool) -> np.ndarray:
    """The h x w window at (dy, dx) of ``image`` zero-padded by ``pad``, reversed along its
    width when ``flipped``."""
    pad, h = config.pad, config.input_size
    window = np.pad(image, ((0, 0), (pad, pad), (pad, pad)))[:, dy:dy + h, dx:dx + h]
    return window[:, :, ::-1] if flipped else window


def centre(config: EpochConfig, images: np.ndarray) -> np.ndarray:
    """The held-out images' centre windows (never augmented)."""
    top, h = (config.image - config.input_size) // 2, config.input_size
    return images[:, :, top:top + h, top:top + h]


def learning_rate(config: EpochConfig, step: int) -> float:
    """docs/running.md: η·(t + 1)/W over the warm-up, then η·F^⌊(t − W)/E⌋."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    return config.lr * config.factor ** ((step - config.warmup) // config.every)


@dataclass
class EpochStep:
    """One step, whole, keyed by hpctrain names: its loss, its rate, and the parameters,
    velocities and running statistics after its update."""

    loss: float
    lr: float
    params: dict[str, np.ndarray]
    momentum: dict[str, np.ndarray]
    buffers: dict[str, np.ndarray]


@dataclass
class EpochRun:
    steps: list[EpochStep]
    held_out: list[tuple[int, float]]  # (after step, held-out loss), as the log has them
    modes: dict[str, str] = field(default_factory=dict)  # hpctrain's: layer → mode it ran


def torch_epoch(config: EpochConfig, data: dict[str, np.ndarray],
                initial_params: dict[str, np.ndarray],
                initial_buffers: dict[str, np.ndarray], flip_wrong: bool = False,
                weight_decay: float | None = None) -> EpochRun:
    """PyTorch, float64, from hpctrain's initial values, on the batches docs/data.md describes
    and with the update docs/running.md describes; held-out loss after each epoch and at the
    end (in evaluation mode, the running statistics). ``flip_wrong`` and ``weight_decay``
    break it, so a test can see that the comparison catches it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tensors of a few hundred entries: more threads only wait
    try:
        return _torch_epoch(config, data, initial_params, initial_buffers, flip_wrong,
                            weight_decay)
    finally:
        torch.set_num_threads(threads)


def _torch_epoch(config: EpochConfig, data: dict[str, np.ndarray],
                 initial_params: dict[str, np.ndarray], initial_buffers: dict[str, np.ndarray],
                 flip_wrong: bool, weight_decay: float | None) -> EpochRun:
    model, names = BatchNormCNN(config.input_size).double().train(), batchnorm_cnn_names()
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    check_bijection("parameter", names.params, initial_params, params)
    check_bijection("buffer", names.buffers, initial_buffers,
                    {k: v for k, v in buffers.items() if not k.endswith("num_batches_tracked")})
    with torch.no_grad():
        for ours, theirs in names.params.items():
            params[theirs].copy_(torch.from_numpy(initial_params[ours]))
        for ours, theirs in names.buffers.items():
            buffers[theirs].copy_(torch.from_numpy(initial_buffers[ours]))
    decay = config.weight_decay if weight_decay is None else weight_decay
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                dampening=0.0, weight_decay=decay, nesterov=False)
    images, labels = data["images"].astype(np.float64), data["labels"]
    per_epoch = config.samples // config.batch
    steps, held_out = [], []
    for step in range(config.steps):
        epoch, samples = batch_samples(config, step)
        batch = []
        for index in samples:
            dy, dx, flipped = crop_and_flip(config, epoch, int(index))
            batch.append(augmented(config, images[index], dy, dx, flipped != flip_wrong))
        lr = learning_rate(config, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(torch.from_numpy(np.stack(batch))),
                               torch.from_numpy(labels[samples]), reduction="mean")
        loss.backward()
        optimizer.step()
        steps.append(EpochStep(
            float(loss.detach()), lr,
            {ours: params[theirs].detach().numpy().copy()
             for ours, theirs in names.params.items()},
            {ours: optimizer.state[params[theirs]]["momentum_buffer"].numpy().copy()
             for ours, theirs in names.params.items()},
            {ours: buffers[theirs].numpy().copy() for ours, theirs in names.buffers.items()}))
        if (step + 1) % per_epoch == 0 or step + 1 == config.steps:
            model.eval()
            with torch.no_grad():
                val = torch.from_numpy(centre(config, data["val_images"].astype(np.float64)))
                held_out.append((step + 1, float(F.cross_entropy(
                    model(val.contiguous()), torch.from_numpy(data["val_labels"])))))
            model.train()
    return EpochRun(steps, held_out)


def read_dataset(path) -> dict[str, np.ndarray]:
    """The dataset file as docs/data.md lays it out, read with plain h5py."""
    import h5py

    with h5py.File(path, "r") as h5:
        return {"images": h5["train/images"][...], "labels": h5["train/labels"][...],
                "val_images": h5["val/images"][...], "val_labels": h5["val/labels"][...]}


def initial_values(net: NetSpec, seed: int, batch: int) -> tuple[dict, dict]:
    """The initial parameters and buffers a run of ``net`` with ``seed`` starts from (the same
    on every grid: one process builds them)."""
    plan = [LayerPlan("batch", (1, 1)) if layer.kind in ("conv", "linear")
            else LayerPlan("follow") for layer in net.layers]
    with GridSet(MPI.COMM_SELF) as grids:
        network = Network(net, plan, batch, grids, Backend(np, np.float64), seed)
        return ({p.name: np.array(p.value) for p in network.params},
                {b.name: np.array(b.value) for b in network.buffers})


def train_command_epoch(comm: MPI.Comm, folder, config: EpochConfig,
                        grid: str) -> tuple[EpochRun, dict, dict, dict] | None:
    """Write the dataset of ``config`` and BN_CNN_NET into ``folder`` (which every rank sees),
    run ``python -m hpctrain train`` with ``config``'s flags under ``--grid grid`` on ``comm``
    (in this process: ``cli.main``), with a run log and a checkpoint after every step.
    Collective. On rank 0: (the run, as its log and checkpoints have it; the dataset read back;
    the initial parameters and buffers); None elsewhere."""
    import h5py

    from hpctrain import cli
    from hpctrain.data.dataset_writer import write_dataset
    from hpctrain.model.net import load_net

    root = comm.Get_rank() == 0
    data_path, net_path = folder / "epoch.h5", folder / "bn_cnn.net"
    log_path, checkpoints = folder / "run.h5", folder / "checkpoints"
    if root:
        data = epoch_dataset(config)
        write_dataset(data_path, data["images"], data["labels"], 4, data["val_images"],
                      data["val_labels"], description="a whole epoch against PyTorch")
        net_path.write_text(BN_CNN_NET)
    comm.Barrier()
    code = cli.main(["train", "--net", str(net_path), "--data", str(data_path), "--grid", grid,
                     *config.flags(), "--log", str(log_path), "--checkpoint-dir",
                     str(checkpoints), "--checkpoint-every", "1", "--keep-checkpoints",
                     str(config.steps), "--print-every", str(config.steps), "--compute",
                     "flops", "--machine", "default"])
    codes = comm.allgather(code)
    if codes != [0] * comm.Get_size():
        raise AssertionError(f"train --grid {grid} exited with {codes}")
    if not root:
        return None
    steps = []
    with h5py.File(log_path, "r") as log:
        losses, rates = log["steps/loss"][...], log["steps/lr"][...]
        held_out = list(zip(log["validation/step"][...].tolist(),
                            log["validation/loss"][...].tolist(), strict=True))
        modes = {layer.decode(): mode.decode() for layer, mode in
                 zip(log["plan/layer"][...], log["plan/mode"][...], strict=True)}
    if len(losses) != config.steps:
        raise AssertionError(f"the log has {len(losses)} steps, not {config.steps}")
    for step in range(config.steps):
        with h5py.File(checkpoints / f"step-{step + 1:08d}.h5", "r") as h5:
            steps.append(EpochStep(
                float(losses[step]), float(rates[step]),
                *({name: tensor[...] for name, tensor in h5[group].items()}
                  for group in ("params", "momentum", "buffers"))))
    net = load_net(str(net_path), config.input_size)
    return (EpochRun(steps, held_out, modes), read_dataset(data_path),
            *initial_values(net, config.seed, config.batch))


def compare_epochs(got: EpochRun, want: EpochRun) -> dict[str, float]:
    """Relative error of every logged loss and rate, and of every parameter, velocity and
    running statistic after every step: ``step 3 momentum conv1.weight`` → error."""
    errors: dict[str, float] = {}
    for step, (g, w) in enumerate(zip(got.steps, want.steps, strict=True), start=1):
        errors[f"step {step} loss"] = relative_error(np.array(g.loss), np.array(w.loss))
        errors[f"step {step} lr"] = relative_error(np.array(g.lr), np.array(w.lr))
        for kind in ("params", "momentum", "buffers"):
            ours, theirs = getattr(g, kind), getattr(w, kind)
            if set(ours) != set(theirs):
                raise AssertionError(f"step {step} {kind}: hpctrain has {sorted(ours)}, "
                                     f"PyTorch {sorted(theirs)}")
            for name in theirs:
                errors[f"step {step} {kind} {name}"] = relative_error(ours[name], theirs[name])
    if [s for s, _ in got.held_out] != [s for s, _ in want.held_out]:
        raise AssertionError(f"held-out evaluations after steps {got.held_out}, PyTorch "
                             f"{want.held_out}")
    for (step, g), (_, w) in zip(got.held_out, want.held_out, strict=True):
        errors[f"held-out loss after step {step}"] = relative_error(np.array(g), np.array(w))
    return errors
