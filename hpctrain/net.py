"""Networks as data: the ``.net`` text format and shape inference.

A ``.net`` file is one layer per line, ``kind key=value ...``; ``#`` starts a comment. The first
line is the input::

    input channels=3 size=224 classes=1000     # an image net (or height=… width=…)
    input features=784 classes=10              # a flat-input net (MLP)

then the layers, in order, each optionally named with ``name=``:

    conv     out=64 kernel=11 [stride=1] [pad=0] [bias=1]
    maxpool  kernel=3 [stride=kernel] [pad=0]
    relu
    dropout  [p=0.5]
    flatten
    linear   out=4096 [bias=1]

The loss (softmax cross-entropy over ``classes``) follows the last layer, whose width must equal
``classes``. Unnamed layers are called by kind and position among their kind: conv1, conv2, …
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.locations import shipped, shipped_names
from hpctrain.partition import Window

LAYER_KEYS: dict[str, dict[str, object]] = {
    # kind: {key: default, or None when required}
    "conv": {"out": None, "kernel": None, "stride": 1, "pad": 0, "bias": 1},
    "maxpool": {"kernel": None, "stride": 0, "pad": 0},
    "relu": {},
    "dropout": {"p": 0.5},
    "flatten": {},
    "linear": {"out": None, "bias": 1},
}
WEIGHTED = ("conv", "linear")


class NetError(UserError):
    """A network file that cannot be read, or a network that does not fit its input."""


@dataclass(frozen=True)
class LayerSpec:
    name: str
    kind: str
    args: dict[str, float | int] = field(default_factory=dict)

    def window(self) -> Window:
        stride = int(self.args["stride"]) or int(self.args["kernel"])
        return Window(int(self.args["kernel"]), stride, int(self.args["pad"]))


@dataclass(frozen=True)
class NetSpec:
    name: str
    input_shape: tuple[int, ...]  # per sample: (C, H, W) or (F,)
    classes: int
    layers: tuple[LayerSpec, ...]

    def with_image_size(self, size: int) -> NetSpec:
        if len(self.input_shape) != 3:
            raise NetError(f"net {self.name} takes flat input; --image-size {size} does not apply")
        if size < 1:
            raise NetError(f"--image-size {size} must be positive")
        resized = NetSpec(self.name, (self.input_shape[0], size, size), self.classes, self.layers)
        resized.shapes()  # refuse a size some layer cannot take, naming the layer
        return resized

    def shapes(self) -> list[tuple[int, ...]]:
        """Per-sample shape entering each layer, plus the output shape at the end."""
        shapes = [self.input_shape]
        for layer in self.layers:
            shapes.append(_out_shape(layer, shapes[-1], self.name))
        if shapes[-1] != (self.classes,):
            raise NetError(f"net {self.name}: the last layer gives shape {shapes[-1]} but the loss "
                           f"needs ({self.classes},) (classes={self.classes})")
        return shapes

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name → whole shape of each parameter, as the layers name them (``conv1.weight``:
        (out, in, k, k); ``fc6.weight``: (out, in); ``*.bias``: (out,))."""
        shapes = {}
        for layer, shape in zip(self.layers, self.shapes(), strict=False):
            if layer.kind not in WEIGHTED:
                continue
            out = int(layer.args["out"])
            kernel = (int(layer.args["kernel"]),) * 2 if layer.kind == "conv" else ()
            shapes[f"{layer.name}.weight"] = (out, shape[0], *kernel)
            if layer.args["bias"]:
                shapes[f"{layer.name}.bias"] = (out,)
        return shapes

    def parameter_count(self) -> int:
        return sum(math.prod(shape) for shape in self.param_shapes().values())


def _out_shape(layer: LayerSpec, shape: tuple[int, ...], net: str) -> tuple[int, ...]:
    kind = layer.kind
    if kind in ("conv", "maxpool"):
        if len(shape) != 3:
            raise NetError(f"net {net}: layer {layer.name} ({kind}) needs an image input, "
                           f"got shape {shape}")
        window = layer.window()
        h, w = window.out_size(shape[1]), window.out_size(shape[2])
        if h < 1 or w < 1:
            raise NetError(f"net {net}: layer {layer.name} receives {shape[1]}x{shape[2]}, "
                           f"too small for its window (kernel {window.kernel}, stride "
                           f"{window.stride}, pad {window.pad}); use a larger --image-size")
        return (int(layer.args["out"]) if kind == "conv" else shape[0], h, w)
    if kind == "flatten":
        n = 1
        for d in shape:
            n *= d
        return (n,)
    if kind == "linear":
        if len(shape) != 1:
            raise NetError(f"net {net}: layer {layer.name} (linear) needs a flat input, got "
                           f"shape {shape}; add a 'flatten' line before it")
        return (int(layer.args["out"]),)
    return shape


def _number(text: str, where: str) -> float | int:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise NetError(f"{where}: '{text}' is not a number") from None


def parse_net(text: str, name: str) -> NetSpec:
    """Read a ``.net`` text; errors name the file (``name``) and the line."""
    input_shape: tuple[int, ...] | None = None
    classes = 0
    layers: list[LayerSpec] = []
    counts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].split()
        if not line:
            continue
        where = f"{name}, line {number}"
        kind, pairs = line[0], line[1:]
        texts: dict[str, str] = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or not value:
                raise NetError(f"{where}: expected key=value, got '{pair}'")
            texts[key] = value
        layer_name = texts.pop("name", None)
        if kind == "input":
            args = {key: _number(value, where) for key, value in texts.items()}
            input_shape, classes = _parse_input(args, where)
            continue
        if input_shape is None:
            raise NetError(f"{where}: the first line must be 'input …', got '{kind}'")
        if kind not in LAYER_KEYS:
            raise NetError(f"{where}: unknown layer kind '{kind}'; known: "
                           f"{', '.join(LAYER_KEYS)}")
        allowed = LAYER_KEYS[kind]
        for key in texts:
            if key not in allowed:
                raise NetError(f"{where}: {kind} takes no '{key}'; it takes "
                               f"{', '.join(allowed) or 'no arguments'}")
        args = {key: _number(value, where) for key, value in texts.items()}
        for key, default in allowed.items():
            if key not in args:
                if default is None:
                    raise NetError(f"{where}: {kind} needs {key}=…")
                args[key] = default
        for key in ("stride", "pad"):
            if key in args and (not isinstance(args[key], int) or args[key] < 0):
                raise NetError(f"{where}: {key}={args[key]} must be a non-negative integer")
        if kind == "conv" and args["stride"] < 1:
            raise NetError(f"{where}: stride={args['stride']} must be at least 1")
        if kind == "maxpool" and args["pad"] > args["kernel"] // 2:
            raise NetError(f"{where}: maxpool pad={args['pad']} must be at most kernel // 2 = "
                           f"{args['kernel'] // 2}, or some windows would hold only padding")
        if kind == "dropout" and not 0 <= args["p"] < 1:
            raise NetError(f"{where}: dropout p={args['p']} must be in [0, 1)")
        for key in ("out", "kernel"):
            if key in args and (not isinstance(args[key], int) or args[key] < 1):
                raise NetError(f"{where}: {key}={args[key]} must be a positive integer")
        counts[kind] = counts.get(kind, 0) + 1
        layer_name = layer_name or f"{kind}{counts[kind]}"
        if any(existing.name == layer_name for existing in layers):
            raise NetError(f"{where}: layer name '{layer_name}' is used twice")
        layers.append(LayerSpec(layer_name, kind, args))
    if input_shape is None:
        raise NetError(f"{name}: no 'input' line")
    if not layers:
        raise NetError(f"{name}: no layers")
    spec = NetSpec(name, input_shape, classes, tuple(layers))
    spec.shapes()
    return spec


def _parse_input(args: dict[str, float | int], where: str) -> tuple[tuple[int, ...], int]:
    if "classes" not in args:
        raise NetError(f"{where}: input needs classes=…")
    classes = int(args["classes"])
    if "features" in args:
        return (int(args["features"]),), classes
    try:
        channels = int(args["channels"])
        height = int(args.get("height", args.get("size", 0)))
        width = int(args.get("width", args.get("size", 0)))
    except KeyError:
        raise NetError(f"{where}: input needs features=… or channels=… size=…") from None
    if min(channels, height, width, classes) < 1:
        raise NetError(f"{where}: input sizes must be positive")
    return (channels, height, width), classes


def available_nets() -> list[str]:
    """Names of the shipped nets (``hpctrain/inputs/nets/*.net``)."""
    return shipped_names("nets", ".net")


def load_net(name_or_path: str, image_size: int | None = None) -> NetSpec:
    """A shipped net by name (``alexnet``) or any ``.net`` file by path, at ``image_size``
    (height and width) when given. An existing file wins over a shipped net of that name."""
    path = Path(name_or_path)
    if path.is_file():
        net = parse_net(path.read_text(), str(path))
    else:
        resource = shipped("nets") / f"{name_or_path}.net"
        if "/" in name_or_path or not resource.is_file():
            raise NetError(f"unknown net '{name_or_path}': not a file, and not one of "
                           f"{', '.join(available_nets())}")
        net = parse_net(resource.read_text(), name_or_path)
    return net if image_size is None else net.with_image_size(image_size)
