"""Networks as data: the ``.net`` text format (version 2) and shape inference.

A ``.net`` file is one layer per line, ``kind key=value ...``; ``#`` starts a comment. The first
line is the input::

    input channels=3 size=224 classes=1000     # an image net (size=HxW, or height=… width=…)
    input channels=4 size=128x128x128 targets=4   # a volume net (or size=S depth=D)
    input features=784 classes=10              # a flat-input net (MLP)

then the layers, each optionally named with ``name=`` and given its inputs with ``in=``:

    conv      out=64 kernel=11 [stride=1] [pad=0] [bias=1]    # kernel, stride: K, HxW, DxHxW
    maxpool   kernel=3 [stride=kernel] [pad=0]                # pad: P, B+A per axis, or same
    avgpool   kernel=3 [stride=kernel] [pad=0]   |   avgpool kernel=global
    batchnorm [eps=1e-5] [momentum=0.1]
    relu  |  leakyrelu [slope=0.01]  |  tanh  |  scale factor=1.2
    dropout   [p=0.5]
    flatten
    linear    out=4096 [bias=1]
    add       in=a,b[,…]                                     # the sum (residual connections)
    concat    in=a,b[,…]                                     # joined along channels

``in=a,b`` names the layers a layer reads, in order; by default the line before (the net's
input, called ``input``, for the first). Every layer's output must be read by some layer, but
the last line's, which feeds the loss. Each kind's keys are in its module under
:mod:`hpctrain.model.kinds`. Blocks make repeated structure one line each::

    define basic out stride=1          # parameters, with defaults or required
      conv out=$out kernel=3 stride=$stride pad=1 bias=0
      batchnorm
      relu
    end
    use basic name=stem out=32 stride=2          # layers stem.conv1, stem.batchnorm1, stem.relu1
    use basic out=64 repeat=2                    # basic1, basic2 (with name=x: x.1, x.2, and
                                                 # x stands for x.2)

Inside a block ``input`` is the block's input and ``in=`` names its own lines; an instance's name
stands for its last line's output. A block uses only blocks defined before it.

The loss follows the last line: softmax cross-entropy over ``classes``, or with ``targets=T``
instead the mean squared error against T real-valued targets; the last line's width must equal
``classes`` (or T). A *segmentation* net is one whose last line gives ``classes`` channels at
the input's own spatial size, (K, H, W) or (K, D, H, W), not (K,): its loss is the softmax
cross-entropy of every pixel against a label map (N, H, W) of classes, pixels labelled −1 not
counted, the weighted mean over every pixel of the batch with class weights when given
(``--class-weights``; :mod:`hpctrain.kernels.segmentation`). Nothing else says it::

    input channels=3 size=64 classes=5
    conv out=16 kernel=3 pad=1
    relu
    conv out=5 kernel=1                       # (5, 64, 64): a class score per pixel

A window's sizes given once hold for every spatial axis of its input, an
image's two or a volume's three. Unnamed layers are called by kind and position among their
kind in their block (or the file): conv1, conv2, … Version-1 files (a chain, square windows)
read unchanged.

Sizes are whole numbers up to 2**63 - 1; a key given twice, a second ``input`` line and a layer
name used twice are refused, as is a file that is not UTF-8 text (see :mod:`hpctrain.io.textfile`).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, replace
from functools import cached_property

from hpctrain.errors import shown, shown_path
from hpctrain.io.locations import shipped_names
from hpctrain.io.textfile import existing_file, read_text, shipped_file
from hpctrain.kernels.loss import MEAN_SQUARED_ERROR, Loss, cross_entropy, pixel_loss
from hpctrain.layout.partition import SplitError
from hpctrain.layout.statistics import groups_for
from hpctrain.model.kinds import KINDS
from hpctrain.model.kinds.base import INPUT, LayerSpec, Shape
from hpctrain.model.options import MAX_SIZE, NetError, integer, sizes

INPUT_KEYS = ("channels", "size", "depth", "height", "width", "features", "classes", "targets")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}", re.ASCII)  # a block or parameter
# a layer or instance: parts of letters, digits, '_' and '-' joined by '.', as PyTorch's module
# paths are (layer2.0.conv1, features.0): an imported net keeps the names its weights carry
LAYER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*", re.ASCII)
MAX_NAME = 255
_PARAMETER = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)", re.ASCII)
MAX_REPEAT = 10_000
MAX_LAYERS = 100_000  # nested repeats multiply: refuse a net that would expand past this
USE_KEYS = ("name", "in", "repeat", "block")  # keys of a `use` line, not block parameters

__all__ = ["INPUT", "MAX_SIZE", "LayerSpec", "NetError", "NetSpec", "StartingWeights",
           "available_nets", "check_layer_name", "load_net", "parse_net"]


@dataclass(frozen=True)
class StartingWeights:
    """A file whose tensors are a net's starting weights: an ONNX model's initializers or a
    safetensors state dict, by PyTorch's names (:mod:`hpctrain.interchange.weights` reads and
    matches it). ``fresh``: the layers that keep weights drawn from the seed instead
    (``--init-except``, the new head of a fine-tune)."""

    path: str
    fresh: tuple[str, ...] = ()


@dataclass(frozen=True)
class NetSpec:
    """A net: per-sample input shape, classes, and layers in file order (every layer reads only
    earlier ones, so file order is a topological order)."""

    name: str
    input_shape: Shape  # per sample: (C, H, W), (C, D, H, W) or (F,)
    classes: int  # the width of the output: classes, or targets under regression
    layers: tuple[LayerSpec, ...]
    regression: bool = False  # the mean squared error against targets, not cross-entropy
    # where the starting weights come from (an ONNX file's initializers, ``--init``); None:
    # drawn from the seed. Not part of what the net is: two nets of equal layers are one net.
    weights: StartingWeights | None = field(default=None, compare=False)
    # whether the loss was said (a net file's input line, --loss, an exported model's
    # metadata); an ONNX model of a PyTorch net says nothing, and a dataset's answers decide
    loss_given: bool = field(default=True, compare=False)
    # a segmentation's class weights (--class-weights; None: all 1), one per class: how the
    # loss is weighted, not what the net is
    class_weights: tuple[float, ...] | None = field(default=None, compare=False)
    # the cross-entropy's label smoothing (--label-smoothing; 0: none): how the loss is
    # made, not what the net is
    label_smoothing: float = field(default=0.0, compare=False)

    def __post_init__(self) -> None:
        # each layer made exact for its input (Kind.resolve), in file order, with its shape
        net = f"net {shown_path(self.name)}"
        shapes: list[Shape] = []
        layers = []
        for layer in self.layers:
            ins = tuple(self.input_shape if name == INPUT else shapes[self.index[name]]
                        for name in layer.inputs)
            kind = KINDS[layer.kind]
            layers.append(kind.resolve_in_net(layer, ins, layer.where or net,
                                              self.input_shape))
            shapes.append(kind.out_shape(layers[-1], ins, net))
            _check_size(f"{net}: layer {layer.name} gives shape {shapes[-1]}", shapes[-1])
        object.__setattr__(self, "layers", tuple(layers))
        object.__setattr__(self, "_shapes", tuple(shapes))

    @cached_property
    def index(self) -> dict[str, int]:
        """Layer name → position."""
        return {layer.name: k for k, layer in enumerate(self.layers)}

    @cached_property
    def _producers(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(-1 if name == INPUT else self.index[name] for name in layer.inputs)
                     for layer in self.layers)

    def producers(self, k: int) -> tuple[int, ...]:
        """Positions of the layers layer ``k`` reads; -1 is the net's input."""
        return self._producers[k]

    def reads_layers(self, k: int) -> bool:
        """Whether layer ``k`` reads some layer (not only the input batch): only then is its
        input gradient wanted, by the network and the cost model alike."""
        return any(p >= 0 for p in self._producers[k])

    @cached_property
    def consumers(self) -> dict[int, tuple[int, ...]]:
        """Position (-1 for the input) → the layers reading its output, in order."""
        found: dict[int, list[int]] = {}
        for k in range(len(self.layers)):
            for p in self.producers(k):
                found.setdefault(p, []).append(k)
        return {p: tuple(ks) for p, ks in found.items()}

    def is_chain(self) -> bool:
        """Whether every layer reads exactly the one before it."""
        return all(self.producers(k) == (k - 1,) for k in range(len(self.layers)))

    @property
    def per_pixel(self) -> bool:
        """Whether the net segments, its last layer giving ``classes`` channels at the input's
        spatial size, a class score per pixel (see the module's text)."""
        return not self.regression and self._shapes[-1] == self.pixel_shape

    @property
    def pixel_shape(self) -> Shape | None:
        """The output ``(K, *S)`` a segmentation net of this input gives (None for flat
        input)."""
        if len(self.input_shape) < 3:
            return None
        return (self.classes, *self.input_shape[1:])

    @property
    def loss(self) -> Loss:
        """The mean squared error under regression (``targets=``), the per-pixel softmax
        cross-entropy of a segmentation net, else softmax cross-entropy (both with the net's
        label smoothing)."""
        if self.regression:
            return MEAN_SQUARED_ERROR
        if self.per_pixel:
            return pixel_loss(self.class_weights, self.label_smoothing)
        return cross_entropy(self.label_smoothing)

    def with_label_smoothing(self, smoothing: float) -> NetSpec:
        """The net with its cross-entropy's targets smoothed by ``smoothing`` in [0, 1]
        (``--label-smoothing``: PyTorch's ``CrossEntropyLoss(label_smoothing=...)``); refused
        for a regression, whose loss has no classes."""
        if not smoothing:
            return self
        if not (math.isfinite(smoothing) and 0 <= smoothing <= 1):
            raise NetError(f"--label-smoothing {smoothing} must be from 0 to 1, such as 0.1")
        if self.regression:
            raise NetError(f"--label-smoothing {smoothing:g} smooths a cross-entropy's class "
                           f"labels; net {shown_path(self.name)} regresses {self.classes} "
                           f"targets with the mean squared error")
        return replace(self, label_smoothing=float(smoothing))

    def with_class_weights(self, weights: tuple[float, ...] | None) -> NetSpec:
        """The net with its per-pixel loss weighted by ``weights``, one finite non-negative
        number per class (``--class-weights``); refused for a net that does not segment."""
        if weights is None:
            return self
        if not self.per_pixel:
            raise NetError(f"--class-weights applies to a segmentation net (its last layer "
                           f"giving (classes, H, W)); net {shown_path(self.name)} gives "
                           f"{self._shapes[-1]}")
        if len(weights) != self.classes:
            raise NetError(f"--class-weights gives {len(weights)} weights but net "
                           f"{shown_path(self.name)} has {self.classes} classes; give one "
                           f"per class")
        if not all(math.isfinite(w) and w >= 0 for w in weights) or not any(weights):
            raise NetError(f"--class-weights {','.join(f'{w:g}' for w in weights)}: give "
                           f"finite weights of 0 or more, not all 0")
        return replace(self, class_weights=tuple(float(w) for w in weights))

    def with_classes(self, classes: int | None) -> NetSpec:
        """The net for a dataset of ``classes`` classes (``--classes``): its last layer's width
        (``out=``: a linear layer's features, a segmentation's class scores per pixel) and its
        classes made ``classes``, the rest as it is; ``self`` for None or the same number. A
        net with starting weights (an ONNX model's own) starts that layer from the seed.
        Refused, naming the value, for fewer than 2 classes, a regression, or a last layer
        with no ``out=`` to change."""
        if classes is None or classes == self.classes and not self.regression:
            return self
        net = f"net {shown_path(self.name)}"
        if classes < 2:
            raise NetError(f"--classes {classes} must be at least 2: a softmax over fewer "
                           f"classes has nothing to learn")
        if self.regression:
            raise NetError(f"--classes {classes} sets a classifier's classes; {net} regresses "
                           f"{self.classes} targets with the mean squared error")
        k = self.head()
        if k is None:
            last = self.layers[-1]
            raise NetError(f"--classes {classes}: the last layer of {net}, '{last.name}' "
                           f"({last.kind}), has no width (out=) to change, nor a layer before "
                           f"it whose width it keeps; give a net whose classes come from a "
                           f"linear or convolution layer")
        spec = self.layers[k]
        layers = list(self.layers)
        layers[k] = replace(spec, options=replace(spec.options, out=classes))
        weights = self.weights  # an ONNX model's own: all but the changed layer's
        if weights is not None and spec.name not in weights.fresh:
            weights = replace(weights, fresh=(*weights.fresh, spec.name))
        return replace(self, classes=classes, layers=tuple(layers), weights=weights)

    def head(self) -> int | None:
        """The layer whose width (``out=``) is the net's classes: the last layer, or the
        nearest before it through layers that keep the channels and read it alone (a
        segmentation's upsampling, a pooling and flatten to (C,)); None where there is none."""
        k = len(self.layers) - 1
        while not hasattr(self.layers[k].options, "out"):
            (p,) = self.producers(k) if len(self.producers(k)) == 1 else (-1,)
            if p < 0 or self.consumers[p] != (k,) or \
                    self._shapes[p][0] != self._shapes[k][0]:
                return None
            k = p
        return k

    def with_image_size(self, size: int) -> NetSpec:
        """The net on images (or volumes) of ``size`` along every spatial axis."""
        if len(self.input_shape) < 3:
            raise NetError(f"net {shown_path(self.name)} takes flat input; "
                           f"--image-size {size} does not apply")
        if not 1 <= size <= MAX_SIZE:
            raise NetError(f"--image-size {shown(size, 30)} must be from 1 to {MAX_SIZE}")
        shape = (self.input_shape[0],) + (size,) * (len(self.input_shape) - 1)
        resized = replace(self, input_shape=shape)
        resized.out_shapes  # noqa: B018 - the last layer's width still feeds the loss
        return resized

    def with_statistics(self, choice: str | int, procs: int) -> NetSpec:
        """The net on ``procs`` ranks with each batch norm's statistics groups made a number of
        sample groups (:func:`~hpctrain.layout.statistics.groups_for`): its own ``group=``
        where the net file gives one, else ``choice`` (``--bn-group``)."""
        layers = []
        for spec in self.layers:
            options = spec.options
            if spec.kind == "batchnorm":
                picked = choice if options.group is None else options.group
                try:
                    groups = groups_for(picked, procs, f"layer {spec.name}")
                except SplitError as err:
                    raise NetError(str(err)) from None
                spec = replace(spec, options=replace(options, groups=groups))
            layers.append(spec)
        return replace(self, layers=tuple(layers))

    @cached_property
    def out_shapes(self) -> tuple[Shape, ...]:
        """Per-sample output shape of every layer (refused, naming the layer, if unfit)."""
        shapes = self._shapes
        if shapes[-1] != (self.classes,) and not self.per_pixel:
            what = "targets" if self.regression else "classes"
            pixels = ("" if self.regression or self.pixel_shape is None else
                      f", or {self.pixel_shape} for a class score per pixel (segmentation)")
            raise NetError(f"net {shown_path(self.name)}: the last layer gives shape "
                           f"{shapes[-1]} but the loss needs ({self.classes},) "
                           f"({what}={self.classes}){pixels}")
        return shapes

    def in_shapes(self, k: int) -> tuple[Shape, ...]:
        """Per-sample shapes of the inputs of layer ``k``."""
        return tuple(self.input_shape if p < 0 else self.out_shapes[p]
                     for p in self.producers(k))

    def shapes(self) -> list[Shape]:
        """Per-sample shape entering each layer (its first input), plus the output at the
        end."""
        return [self.in_shapes(k)[0] for k in range(len(self.layers))] + [self.out_shapes[-1]]

    def _whole_shapes(self, which: str) -> dict[str, Shape]:
        found = {}
        for k, layer in enumerate(self.layers):
            kind = KINDS[layer.kind]
            shapes = (kind.param_shapes if which == "parameter" else kind.buffer_shapes)(
                layer, self.in_shapes(k))
            for suffix, shape in shapes.items():
                name = f"{layer.name}.{suffix}"
                _check_size(f"net {shown_path(self.name)}: layer {layer.name}'s "
                            f"{suffix} has shape {shape}", shape)
                found[name] = shape
        return found

    def param_shapes(self) -> dict[str, Shape]:
        """Name → whole shape of each parameter, as the layers name them (``conv1.weight``:
        (out, in, kh, kw); ``fc6.weight``: (out, in); ``*.bias``, ``*.gamma``: (out,))."""
        return self._whole_shapes("parameter")

    def buffer_shapes(self) -> dict[str, Shape]:
        """Name → whole shape of each buffer (``bn1.running_mean``: (C,))."""
        return self._whole_shapes("buffer")

    def parameter_count(self) -> int:
        return sum(math.prod(shape) for shape in self.param_shapes().values())

    def architecture(self) -> list[str]:
        """The layers as text, one ``"NAME KIND"`` each, and ``" in=A,B"`` where a layer reads
        other layers than the line before (so a chain's list is what it always was, and a
        rewired net is told apart). With the parameters' shapes, this is what checkpoints and
        run logs compare to tell one network from another, whatever its file is called or
        wherever it lies: ``--net g1.net`` and ``--net /abs/path/g1.net`` are one network."""
        found = []
        for k, layer in enumerate(self.layers):
            wiring = "" if self.producers(k) == (k - 1,) else f" in={','.join(layer.inputs)}"
            found.append(f"{layer.name} {layer.kind}{wiring}")
        # a regression's head has the shapes a classifier's might: the loss tells them apart
        return [*found, "loss mean squared error"] if self.regression else found


def _check_size(what: str, shape: Shape) -> None:
    """Refuse a shape of more than :data:`MAX_SIZE` elements; ``what`` starts the message."""
    if math.prod(shape) > MAX_SIZE:
        raise NetError(f"{what}, {math.prod(shape):.3g} elements, more than any array can hold "
                       f"({MAX_SIZE}); use smaller sizes")


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


@dataclass
class _Block:
    """A ``define``: its parameters (name → default text, None when required) and lines."""

    name: str
    number: int  # the line of its ``define``
    params: dict[str, str | None]
    lines: list[tuple[int, list[str]]] = field(default_factory=list)


@dataclass
class _Scope:
    """Names visible inside one block instance (or the file): local name → full layer name."""

    prefix: str
    input: str  # full name of what ``input`` means here
    local: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def auto_name(self, kind: str) -> str:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return f"{kind}{self.counts[kind]}"


class _Builder:
    """Expands a file's lines, blocks and all, into layers with full names and inputs."""

    def __init__(self, file: str, blocks: dict[str, _Block]) -> None:
        self.file, self.blocks = file, blocks
        self.layers: list[LayerSpec] = []
        self.names: set[str] = set()
        self.outputs: dict[str, str] = {}  # full name of an instance or layer → its output layer

    def emit(self, lines: list[tuple[int, list[str]]], scope: _Scope, args: dict[str, str],
             block: _Block | None) -> str:
        """Add the layers of ``lines``; returns the full name of the last one's output."""
        previous = scope.input
        for number, words in lines:
            where = f"{self.file}, line {number}"
            words = [words[0], *(_substitute(w, args, where, block) for w in words[1:])]
            texts = _pairs(words[1:], where)
            if words[0] == "use":
                previous = self._use(texts, scope, previous, where, block or number)
            elif words[0] == "input":
                raise NetError(f"{where}: a second 'input' line; a net has one input, on its "
                               f"first line")
            else:
                previous = self._layer(words[0], texts, scope, previous, where)
        return previous

    def _register(self, local: str, full: str, output: str, scope: _Scope, where: str) -> None:
        if len(full) > MAX_NAME:  # a block instance's name and the names inside it together
            raise NetError(f"{where}: name {shown(full)} is {len(full)} characters; a layer's "
                           f"full name (block instances joined by '.') is at most {MAX_NAME}")
        if full in self.names or full == INPUT or local in scope.local:
            raise NetError(f"{where}: name {shown(full)} is used twice; name each layer and "
                           f"block once (name=…)")
        self.names.add(full)
        scope.local[local] = full
        self.outputs[full] = output

    def _resolve(self, text: str | None, scope: _Scope, previous: str, where: str
                 ) -> tuple[str, ...]:
        if text is None:
            return (previous,)
        found = []
        for ref in text.split(","):
            if ref == INPUT:
                found.append(scope.input)
            elif ref in scope.local:
                found.append(self.outputs[scope.local[ref]])
            elif scope.prefix + ref in self.outputs:
                found.append(self.outputs[scope.prefix + ref])
            else:
                raise NetError(f"{where}: in={shown(text)} names {shown(ref)}, which is no "
                               f"earlier layer or block here; name an earlier line or 'input'")
        return tuple(found)

    def _layer(self, kind_name: str, texts: dict[str, str], scope: _Scope, previous: str,
               where: str) -> str:
        kind = KINDS.get(kind_name)
        if kind is None:
            raise NetError(f"{where}: unknown layer kind {shown(kind_name)}; known: "
                           f"{', '.join(KINDS)}, and 'use' for a block")
        given = texts.pop("name", None)
        local = scope.auto_name(kind_name)  # a named layer counts in the numbering too
        if given is not None:
            check_layer_name(given, where)
            local = given
        inputs = self._resolve(texts.pop("in", None), scope, previous, where)
        if kind.many_inputs and len(inputs) < 2:
            raise NetError(f"{where}: {kind_name} needs two or more inputs, e.g. in=a,b")
        if not kind.many_inputs and len(inputs) != 1:
            raise NetError(f"{where}: {kind_name} reads one input; in= names "
                           f"{len(inputs)}")
        options = kind.parse(texts, where)
        full = scope.prefix + local
        self._register(local, full, full, scope, where)
        if len(self.layers) >= MAX_LAYERS:
            raise NetError(f"{where}: the net expands to more than {MAX_LAYERS} layers (nested "
                           f"repeat= multiply); use fewer or smaller repeats")
        self.layers.append(LayerSpec(full, kind_name, options, inputs, where))
        return full

    def _use(self, texts: dict[str, str], scope: _Scope, previous: str, where: str,
             within: _Block | int) -> str:
        """Expand a ``use`` line: inside block ``within``, or at the file's line ``within``."""
        name = texts.pop("block")
        block = self.blocks.get(name)
        line = within if isinstance(within, int) else within.number
        if block is None or block.number >= line:
            known = [b.name for b in self.blocks.values() if b.number < line]
            raise NetError(f"{where}: no block {shown(name)} defined before this line; define "
                           f"it first (known: {', '.join(known) or 'none'})")
        given = texts.pop("name", None)
        repeat = integer("repeat", texts.pop("repeat", "1"), where, 1)
        if repeat > MAX_REPEAT:
            raise NetError(f"{where}: repeat={repeat} is more than {MAX_REPEAT} blocks")
        inputs = self._resolve(texts.pop("in", None), scope, previous, where)
        if len(inputs) != 1:
            raise NetError(f"{where}: a block reads one input; in= names {len(inputs)}")
        args = {}
        for key, value in texts.items():
            if key not in block.params:
                raise NetError(f"{where}: block {name} takes no {shown(key)}; it takes "
                               f"{', '.join(['name', 'in', 'repeat', *block.params])}")
            args[key] = value
        for key, default in block.params.items():
            if key not in args:
                if default is None:
                    raise NetError(f"{where}: block {name} needs {key}=…")
                args[key] = default
        if given is not None:
            check_layer_name(given, where)
        output = inputs[0]
        for r in range(1, repeat + 1):
            if given is None:
                local = scope.auto_name(name)
            else:
                local = given if repeat == 1 else f"{given}.{r}"
            full = scope.prefix + local
            output = self.emit(block.lines, _Scope(full + ".", output), args, block)
            self._register(local, full, output, scope, where)
        if given is not None and repeat > 1:  # the name stands for the last instance's output
            self._register(given, scope.prefix + given, output, scope, where)
        return output


def check_layer_name(name: str, where: str) -> None:
    """Refuse a layer or instance name that is not parts of letters, digits, '_' and '-'
    joined by '.', or that is 'input' or longer than ``MAX_NAME`` (255) characters."""
    if not LAYER_NAME.fullmatch(name) or name == INPUT or len(name) > MAX_NAME:
        raise NetError(f"{where}: name {shown(name)} must be letters, digits, '_' and '-', in "
                       f"parts joined by '.' (layer2.0.conv1), at most {MAX_NAME} characters, "
                       f"and not 'input'")


def _substitute(word: str, args: dict[str, str], where: str, block: _Block | None) -> str:
    """``word`` with each ``$param`` replaced by the block argument."""
    def value(match: re.Match) -> str:
        key = match.group(1)
        if block is None or key not in args:
            known = ", ".join(f"${k}" for k in (block.params if block else {})) or "none here"
            raise NetError(f"{where}: {shown(match.group(0))} is not a parameter of this block "
                           f"({known})")
        return args[key]

    return _PARAMETER.sub(value, word) if "$" in word else word


def _define(words: list[str], number: int, where: str) -> _Block:
    if len(words) < 2 or not _NAME.fullmatch(words[1]) or words[1] in KINDS:
        raise NetError(f"{where}: expected 'define NAME [param[=default] …]' with a NAME that "
                       f"is no layer kind, got {shown(' '.join(words))}")
    params: dict[str, str | None] = {}
    for word in words[2:]:
        key, sep, default = word.partition("=")
        if not _PARAMETER.fullmatch("$" + key) or key in params or (sep and not default):
            raise NetError(f"{where}: block parameter {shown(word)} must be NAME or "
                           f"NAME=DEFAULT, each once")
        if key in USE_KEYS:
            raise NetError(f"{where}: block parameter {shown(key)} is a key of every 'use' "
                           f"line ({', '.join(USE_KEYS)}); call it something else")
        params[key] = default if sep else None
    return _Block(words[1], number, params)


def parse_net(text: str, name: str) -> NetSpec:
    """Read a ``.net`` text; errors name the file (``name``) and the line.

    Refused, each in one line naming the value: a line that is not ``kind key=value …``, an
    unknown kind or key, a key given twice, a missing key, a value that is not a number of the
    right kind or not in range, a second ``input`` line, a layer name used twice, an ``in=``
    that names no earlier line, a block used before it is defined or without ``end``, and a net
    whose shapes do not fit (see :attr:`NetSpec.out_shapes`).
    """
    file = shown_path(name)
    blocks: dict[str, _Block] = {}
    top: list[tuple[int, list[str]]] = []
    open_block: _Block | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{file}, line {number}"
        if words[0] == "define":
            if open_block is not None:
                raise NetError(f"{where}: a define inside block {open_block.name} (line "
                               f"{open_block.number}); close it with 'end' first")
            open_block = _define(words, number, where)
            if open_block.name in blocks:
                raise NetError(f"{where}: block {open_block.name} is defined twice")
        elif words[0] == "end":
            if open_block is None or len(words) > 1:
                raise NetError(f"{where}: 'end' alone closes a 'define'; none is open")
            if not open_block.lines:
                raise NetError(f"{where}: block {open_block.name} has no lines")
            blocks[open_block.name] = open_block
            open_block = None
        else:
            if words[0] == "use":
                if len(words) < 2 or "=" in words[1]:
                    raise NetError(f"{where}: 'use' needs the block first: use NAME key=value …")
                words = ["use", f"block={words[1]}", *words[2:]]
            (top if open_block is None else open_block.lines).append((number, words))
    if open_block is not None:
        raise NetError(f"{file}: block {open_block.name} (line {open_block.number}) has no "
                       f"'end'")
    if not top or top[0][1][0] != "input":
        where = f"{file}, line {top[0][0]}" if top else file
        got = f", got {shown(top[0][1][0])}" if top else ""
        raise NetError(f"{where}: the first line must be 'input channels=C size=S classes=K' "
                       f"or 'input features=F classes=K' (targets=T for regression){got}")
    number, words = top[0]
    input_shape, classes, regression = _parse_input(_pairs(words[1:], f"{file}, line {number}"),
                                                    f"{file}, line {number}")
    builder = _Builder(file, blocks)
    builder.emit(top[1:], _Scope("", INPUT), {}, None)
    if not builder.layers:
        raise NetError(f"{file}: no layers after the 'input' line")
    spec = NetSpec(name, input_shape, classes, tuple(builder.layers), regression)
    _check_read(spec)
    spec.out_shapes  # noqa: B018 - every activation fits its layer, within bounds
    spec.param_shapes()  # every weight's size within bounds
    return spec


def _check_read(net: NetSpec) -> None:
    """Refuse a layer whose output no layer reads (but the last, which feeds the loss): it
    would be computed for nothing and its parameters never trained."""
    read = net.consumers
    for k, layer in enumerate(net.layers[:-1]):
        if k not in read:
            raise NetError(f"net {shown_path(net.name)}: the output of layer "
                           f"{layer.name} is read by no layer; read it (in=…) or remove it "
                           f"(the last line feeds the loss)")


def _parse_input(texts: dict[str, str], where: str) -> tuple[Shape, int, bool]:
    """(per-sample shape, output width, regression) of the ``input`` line."""
    for key in texts:
        if key not in INPUT_KEYS:
            raise NetError(f"{where}: input takes no {shown(key)}; it takes "
                           f"{', '.join(INPUT_KEYS)}")
    size = texts.pop("size", None)
    args = {key: integer(key, value, where, low=-MAX_SIZE) for key, value in texts.items()}
    if ("classes" in args) == ("targets" in args):
        raise NetError(f"{where}: input needs classes=… (cross-entropy) or targets=… (mean "
                       f"squared error), one of them")
    regression = "targets" in args
    outputs = args.pop("targets" if regression else "classes")
    if "features" in args:
        if len(args) > 1 or size is not None:
            others = ", ".join([*(["size"] if size is not None else []),
                                *(key for key in args if key != "features")])
            raise NetError(f"{where}: input features=… takes no {others}; give features= "
                           f"for flat input or channels= and size= for images")
        shape: Shape = (args["features"],)
    else:
        if "channels" not in args:
            raise NetError(f"{where}: input needs features=… or channels=… size=…")
        if size is not None and ("height" in args or "width" in args):
            raise NetError(f"{where}: input takes size=… or height=… width=…, not both")
        spatial = (sizes(-MAX_SIZE)("size", size, where) if size is not None
                   else (args.get("height"), args.get("width")))
        if len(spatial) == 1:
            spatial = spatial * 2
        if None in spatial:
            raise NetError(f"{where}: input needs size=… (or height=… and width=…)")
        if "depth" in args:
            if len(spatial) == 3:
                raise NetError(f"{where}: input takes size=DxHxW or depth=…, not both")
            spatial = (args["depth"], *spatial)
        shape = (args["channels"], *spatial)
    if min(*shape, outputs) < 1:
        raise NetError(f"{where}: input sizes must be positive, got "
                       f"{' '.join(f'{k}={v}' for k, v in texts.items())}"
                       f"{'' if size is None else f' size={size}'}")
    return shape, outputs, regression


def available_nets() -> list[str]:
    """Names of the shipped nets (``hpctrain/inputs/nets/*.net``)."""
    return shipped_names("nets", ".net")


def _nets_like(name: str) -> str:
    """The shipped nets a mistyped ``name`` may have meant, or all of them while they are few
    enough to list in one line (``--help`` lists them all under ``--net``)."""
    nets = available_nets()
    close = difflib.get_close_matches(name[:100], nets, n=3)
    if close:
        return f"; did you mean {' or '.join(close)}?"
    listed = ", ".join(nets)
    return f" ({listed})" if len(listed) <= 160 else f"; --help lists the {len(nets)} shipped nets"


def load_net(name_or_path: str, image_size: int | None = None) -> NetSpec:
    """A shipped net by name (``alexnet``) or any ``.net`` file by path, at ``image_size``
    (height and width) when given. An existing file wins over a shipped net of that name."""
    path = existing_file(name_or_path)
    if path is not None:
        net = parse_net(read_text(path, NetError, "net file"), str(path))
    else:
        resource = shipped_file("nets", name_or_path, ".net")
        if resource is None:
            raise NetError(f"unknown net {shown(name_or_path, 40)}: no such file or shipped "
                           f"net{_nets_like(name_or_path)}")
        net = parse_net(read_text(resource, NetError, "net file"), name_or_path)
    return net if image_size is None else net.with_image_size(image_size)
