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

Sizes are whole numbers up to 2**63 - 1; a key given twice, a second ``input`` line and a layer
name used twice are refused, as is a file that is not UTF-8 text (see :mod:`hpctrain.textfile`).
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field

from hpctrain.errors import UserError, shown
from hpctrain.locations import shipped_names
from hpctrain.partition import Window
from hpctrain.textfile import existing_file, read_text, shipped_file

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
FRACTIONS = ("p",)  # keys whose value is a decimal number; every other value is an integer
INPUT_KEYS = ("channels", "size", "height", "width", "features", "classes")
MAX_SIZE = sys.maxsize
"""The largest number of elements in any activation (per sample) or parameter, and so the
largest value a net file takes: 2**63 - 1 on a 64-bit machine, the most elements an array can
be indexed by. Larger is refused while parsing; sizes that are possible but do not fit in memory
are for the memory check."""
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}", re.ASCII)


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
            raise NetError(f"net {shown(self.name, quoted=False)} takes flat input; "
                           f"--image-size {size} does not apply")
        if not 1 <= size <= MAX_SIZE:
            raise NetError(f"--image-size {shown(size, 30)} must be from 1 to {MAX_SIZE}")
        resized = NetSpec(self.name, (self.input_shape[0], size, size), self.classes, self.layers)
        resized.shapes()  # refuse a size some layer cannot take, naming the layer
        return resized

    def shapes(self) -> list[tuple[int, ...]]:
        """Per-sample shape entering each layer, plus the output shape at the end."""
        net = shown(self.name, quoted=False)
        shapes = [self.input_shape]
        for layer in self.layers:
            shapes.append(_out_shape(layer, shapes[-1], net))
            _check_size(f"net {net}: layer {layer.name} gives shape {shapes[-1]}", shapes[-1])
        if shapes[-1] != (self.classes,):
            raise NetError(f"net {net}: the last layer gives shape {shapes[-1]} but the loss "
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
            _check_size(f"net {shown(self.name, quoted=False)}: layer {layer.name}'s weight has "
                        f"shape {shapes[f'{layer.name}.weight']}", shapes[f"{layer.name}.weight"])
            if layer.args["bias"]:
                shapes[f"{layer.name}.bias"] = (out,)
        return shapes

    def parameter_count(self) -> int:
        return sum(math.prod(shape) for shape in self.param_shapes().values())


def _check_size(what: str, shape: tuple[int, ...]) -> None:
    """Refuse a shape of more than :data:`MAX_SIZE` elements; ``what`` starts the message."""
    if math.prod(shape) > MAX_SIZE:
        raise NetError(f"{what}, {math.prod(shape):.3g} elements, more than any array can hold "
                       f"({MAX_SIZE}); use smaller sizes")


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


def _number(key: str, text: str, where: str) -> float | int:
    """The value of ``key=text``: an integer of magnitude at most :data:`MAX_SIZE` (its sign is
    checked by the caller, which names the range), or for a fraction key (``p``) a finite
    decimal number."""
    if key in FRACTIONS:
        try:
            value = float(text)
        except ValueError:
            raise NetError(f"{where}: {key}={shown(text)} is not a number") from None
        if not math.isfinite(value):
            raise NetError(f"{where}: {key}={shown(text)} must be a finite number")
        return value
    if not _INTEGER.fullmatch(text):
        try:
            float(text)
        except ValueError:
            raise NetError(f"{where}: {key}={shown(text)} is not a number") from None
        raise NetError(f"{where}: {key}={shown(text)} must be a whole number written with "
                       f"digits 0-9")
    if len(text) > 20 or abs(int(text)) > MAX_SIZE:
        raise NetError(f"{where}: {key}={shown(text)} is larger than any size can be "
                       f"(at most {MAX_SIZE}, the most elements an array can hold)")
    return int(text)


def _pairs(words: list[str], where: str) -> dict[str, str]:
    """``key=value`` words as a dict, refusing a malformed word or a key given twice."""
    texts: dict[str, str] = {}
    for pair in words:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise NetError(f"{where}: expected key=value, got {shown(pair)}")
        if key in texts:
            raise NetError(f"{where}: {shown(key)} is given twice ({shown(texts[key], 30)} and "
                           f"{shown(value, 30)}); keep one")
        texts[key] = value
    return texts


def _check_layer(kind: str, args: dict[str, float | int], where: str) -> None:
    """Refuse values ``kind`` cannot take (the numbers are already at most MAX_SIZE)."""
    for key in ("stride", "pad"):
        if key in args and args[key] < 0:
            raise NetError(f"{where}: {key}={args[key]} must be a non-negative integer")
    for key in ("out", "kernel"):
        if key in args and args[key] < 1:
            raise NetError(f"{where}: {key}={args[key]} must be a positive integer")
    if kind == "conv" and args["stride"] < 1:
        raise NetError(f"{where}: stride={args['stride']} must be at least 1")
    if kind == "maxpool" and args["pad"] > args["kernel"] // 2:
        raise NetError(f"{where}: maxpool pad={args['pad']} must be at most kernel // 2 = "
                       f"{args['kernel'] // 2}, or some windows would hold only padding")
    if kind == "dropout" and not 0 <= args["p"] < 1:
        raise NetError(f"{where}: dropout p={args['p']} must be in [0, 1)")
    if "bias" in args and args["bias"] not in (0, 1):
        raise NetError(f"{where}: bias={args['bias']} must be 0 or 1")


def parse_net(text: str, name: str) -> NetSpec:
    """Read a ``.net`` text; errors name the file (``name``) and the line.

    Refused, each in one line naming the value: a line that is not ``kind key=value …``, an
    unknown kind or key, a key given twice, a missing key, a value that is not a number of the
    right kind or not in range, a second ``input`` line, a layer name used twice, and a net
    whose shapes do not fit (see :meth:`NetSpec.shapes`).
    """
    input_shape: tuple[int, ...] | None = None
    classes = 0
    layers: list[LayerSpec] = []
    names: set[str] = set()
    counts: dict[str, int] = {}
    shown_name = shown(name, quoted=False)
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].split()
        if not line:
            continue
        where = f"{shown_name}, line {number}"
        kind = line[0]
        texts = _pairs(line[1:], where)
        if kind == "input":
            if input_shape is not None:
                raise NetError(f"{where}: a second 'input' line; a net has one input, on its "
                               f"first line")
            input_shape, classes = _parse_input(texts, where)
            continue
        if input_shape is None:
            raise NetError(f"{where}: the first line must be 'input …', got {shown(kind)}")
        if kind not in LAYER_KEYS:
            raise NetError(f"{where}: unknown layer kind {shown(kind)}; known: "
                           f"{', '.join(LAYER_KEYS)}")
        layer_name = texts.pop("name", None)
        allowed = LAYER_KEYS[kind]
        for key in texts:
            if key not in allowed:
                raise NetError(f"{where}: {kind} takes no {shown(key)}; it takes "
                               f"{', '.join(['name', *allowed])}")
        args = {key: _number(key, value, where) for key, value in texts.items()}
        for key, default in allowed.items():
            if key not in args:
                if default is None:
                    raise NetError(f"{where}: {kind} needs {key}=…")
                args[key] = default
        _check_layer(kind, args, where)
        counts[kind] = counts.get(kind, 0) + 1
        if layer_name is not None and not _NAME.fullmatch(layer_name):
            raise NetError(f"{where}: layer name {shown(layer_name)} must be a letter or '_' "
                           f"then up to 63 letters, digits, '_' or '-'")
        layer_name = layer_name or f"{kind}{counts[kind]}"
        if layer_name in names:
            raise NetError(f"{where}: layer name {shown(layer_name)} is used twice; name each "
                           f"layer once (name=…)")
        names.add(layer_name)
        layers.append(LayerSpec(layer_name, kind, args))
    if input_shape is None:
        raise NetError(f"{shown_name}: no 'input' line; a net file starts with 'input "
                       f"channels=C size=S classes=K' or 'input features=F classes=K'")
    if not layers:
        raise NetError(f"{shown_name}: no layers after the 'input' line")
    spec = NetSpec(name, input_shape, classes, tuple(layers))
    spec.param_shapes()  # every activation's and weight's size within bounds
    return spec


def _parse_input(texts: dict[str, str], where: str) -> tuple[tuple[int, ...], int]:
    for key in texts:
        if key not in INPUT_KEYS:
            raise NetError(f"{where}: input takes no {shown(key)}; it takes "
                           f"{', '.join(INPUT_KEYS)}")
    args = {key: int(_number(key, value, where)) for key, value in texts.items()}
    if "classes" not in args:
        raise NetError(f"{where}: input needs classes=…")
    if "features" in args:
        if len(args) > 2:
            others = ", ".join(key for key in args if key not in ("features", "classes"))
            raise NetError(f"{where}: input features=… takes no {others}; give features= "
                           f"for flat input or channels= and size= for images")
        shape: tuple[int, ...] = (args["features"],)
    else:
        if "channels" not in args:
            raise NetError(f"{where}: input needs features=… or channels=… size=…")
        if "size" in args and ("height" in args or "width" in args):
            raise NetError(f"{where}: input takes size=… or height=… width=…, not both")
        height = args.get("height", args.get("size"))
        width = args.get("width", args.get("size"))
        if height is None or width is None:
            raise NetError(f"{where}: input needs size=… (or height=… and width=…)")
        shape = (args["channels"], height, width)
    if min(*shape, args["classes"]) < 1:
        raise NetError(f"{where}: input sizes must be positive, got "
                       f"{' '.join(f'{k}={v}' for k, v in args.items())}")
    return shape, args["classes"]


def available_nets() -> list[str]:
    """Names of the shipped nets (``hpctrain/inputs/nets/*.net``)."""
    return shipped_names("nets", ".net")


def load_net(name_or_path: str, image_size: int | None = None) -> NetSpec:
    """A shipped net by name (``alexnet``) or any ``.net`` file by path, at ``image_size``
    (height and width) when given. An existing file wins over a shipped net of that name."""
    path = existing_file(name_or_path)
    if path is not None:
        net = parse_net(read_text(path, NetError, "net file"), str(path))
    else:
        resource = shipped_file("nets", name_or_path, ".net")
        if resource is None:
            raise NetError(f"unknown net {shown(name_or_path)}: not a file, and not one of "
                           f"{', '.join(available_nets())}")
        net = parse_net(read_text(resource, NetError, "net file"), name_or_path)
    return net if image_size is None else net.with_image_size(image_size)
