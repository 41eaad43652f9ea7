"""PyTorch's names for a net's tensors, the names its state dict (and an ONNX export's
initializers) give them.

A tensor of hpctrain is ``LAYER.SUFFIX``: ``layer2_0.conv1.weight``, ``bn1.gamma``,
``bn1.running_mean``. PyTorch names it ``MODULE.SUFFIX``, batch norm's scale and shift being
``weight`` and ``bias``, and each batch norm has a ``num_batches_tracked`` beside
(:func:`tracked_counts`). The module is the layer's name (a net imported from ONNX is named so,
``layer2.0.conv1``), except for the shipped nets that are torchvision's models layer for layer,
whose files could not spell torchvision's names (:data:`TORCHVISION`):

- ``alexnet``, ``vgg16``: the layers before ``flatten`` are ``features.i`` and those after it
  ``classifier.i``, ``i`` counting every layer of the part as torchvision's ``Sequential``
  does (``fc6`` is ``classifier.1`` in AlexNet, ``classifier.0`` in VGG-16);
- ``resnet18``, ``resnet50``: ``layer2_0`` is ``layer2.0``, a block's ``downsample`` and
  ``downsample_bn`` are ``downsample.0`` and ``downsample.1``;
- ``inception_v3``: its names are torchvision's already;
- ``convnext_tiny``: a block's ``layer_scale`` layer is the block itself, whose parameter
  ``layer_scale`` it is (``features.1.0.layer_scale``), and the 1x1 convolutions ``block.3`` and
  ``block.5`` are ``Linear`` layers, whose weights PyTorch shapes (out, in), not
  (out, in, 1, 1) (:func:`torch_shapes`).

So ``export`` writes a state dict that ``torchvision.models.resnet18()`` loads with
``strict=True``, and ``--init`` reads one.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from hpctrain.model.kinds.base import Shape
from hpctrain.model.net import NetSpec, load_net

SUFFIXES = {"gamma": "weight", "beta": "bias"}  # batch norm's, as PyTorch calls them
TRACKED = "num_batches_tracked"


def _sequential(net: NetSpec) -> dict[str, str]:
    """torchvision's ``features`` and ``classifier`` Sequentials (AlexNet, VGG)."""
    found, part, index = {}, "features", 0
    for layer in net.layers:
        if layer.kind == "flatten":
            part, index = "classifier", 0
            continue
        found[layer.name] = f"{part}.{index}"
        index += 1
    return found


def _resnet(net: NetSpec) -> dict[str, str]:
    """torchvision's ResNets: ``layerN.I`` blocks, each shortcut a Sequential of conv and bn."""
    found = {}
    for layer in net.layers:
        name = re.sub(r"^(layer\d+)_(\d+)\.", r"\1.\2.", layer.name)
        name = re.sub(r"\.downsample_bn$", ".downsample.1", name)
        found[layer.name] = re.sub(r"\.downsample$", ".downsample.0", name)
    return found


def _convnext(net: NetSpec) -> dict[str, str]:
    """torchvision's ConvNeXt: a block's layer scale is a parameter of the block module."""
    return {layer.name: re.sub(r"\.layer_scale$", "", layer.name) for layer in net.layers}


TORCHVISION: dict[str, Callable[[NetSpec], dict[str, str]]] = {
    "alexnet": _sequential,
    "vgg16": _sequential,
    "resnet18": _resnet,
    "resnet50": _resnet,
    "inception_v3": lambda net: {layer.name: layer.name for layer in net.layers},
    "convnext_tiny": _convnext,
}
"""The shipped nets that are torchvision's models, and how their layers are named there."""

LINEAR_LAYERS: dict[str, re.Pattern[str]] = {"convnext_tiny": re.compile(r"\.block\.[35]$")}
"""The shipped nets whose 1x1 convolutions of these names are torchvision's ``Linear`` layers
over the channels, the same weights shaped (out, in) in PyTorch."""


def _torchvision(net: NetSpec) -> bool:
    """Whether ``net`` is a shipped torchvision net as shipped (its name and its layers)."""
    return net.name in TORCHVISION and net.architecture() == load_net(net.name).architecture()


def module_names(net: NetSpec) -> dict[str, str]:
    """Layer name → the PyTorch module that holds its tensors."""
    if _torchvision(net):
        return TORCHVISION[net.name](net)
    return {layer.name: layer.name for layer in net.layers}


def torch_shapes(net: NetSpec) -> dict[str, Shape]:
    """hpctrain's tensor name → the shape PyTorch gives it, for the tensors whose shapes
    differ (the same entries in the same order): the weights of a shipped net's 1x1
    convolutions that torchvision writes as ``Linear`` layers (:data:`LINEAR_LAYERS`)."""
    linear = LINEAR_LAYERS.get(net.name)
    if linear is None or not _torchvision(net):
        return {}
    return {name: shape[:2] for name, shape in net.param_shapes().items()
            if name.endswith(".weight") and linear.search(name.removesuffix(".weight"))}


def torch_names(net: NetSpec) -> dict[str, str]:
    """hpctrain's tensor name → PyTorch's, for every parameter and buffer of ``net``:
    ``layer2_0.bn1.gamma`` → ``layer2.0.bn1.weight`` on the shipped ResNets."""
    modules = module_names(net)
    found = {}
    for name in (*net.param_shapes(), *net.buffer_shapes()):
        layer, _, suffix = name.rpartition(".")
        found[name] = f"{modules[layer]}.{SUFFIXES.get(suffix, suffix)}"
    return found


def tracked_counts(net: NetSpec) -> list[str]:
    """PyTorch's ``MODULE.num_batches_tracked`` of each batch norm of ``net``: a buffer
    PyTorch keeps and hpctrain does not (it counts the training forwards; its momentum is
    set, so nothing reads it)."""
    modules = module_names(net)
    return [f"{modules[layer.name]}.{TRACKED}" for layer in net.layers
            if layer.kind == "batchnorm"]
