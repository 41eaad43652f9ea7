"""ONNX models in: the graph mapped onto the layer kinds, its initializers the starting weights.

A model as ``torch.onnx.export`` writes it (opset 13 to 21; inference or training-preserving
mode, constant folding on or off, a dynamic batch axis or not) becomes a
:class:`~hpctrain.model.net.NetSpec` whose layers are hpctrain's kinds, named as PyTorch named
the modules (``layer2.0.conv1``), and a dict of whole tensors under hpctrain's names
(``layer2.0.conv1.weight``, ``layer2.0.bn1.gamma``, ``layer2.0.bn1.running_mean``).

One converter per operator type (:data:`CONVERTERS`), attribute defaults from the operator's
schema at the model's opset. Nodes that only compute constants (``Constant``, the
``Shape`` → ``Gather`` → ``Unsqueeze`` → ``Concat`` chain ``x.view(x.size(0), -1)`` exports, the
copies of shared initializers a deduplicating export adds) are evaluated here and make no
layer. Everything is checked before anything runs: the file (``onnx.checker``), every node's
operator and attributes, and every shape hpctrain infers against the graph's own. A graph with
nodes that map onto no kind is refused in one line that names each of them, by operator type
and node name; none is ever skipped.

Mapped, with what each becomes:

- ``Conv`` (2-D, 3-D; groups, dilations; explicit padding, ``SAME_*`` at stride 1, ``VALID``):
  ``conv``; ``ConvTranspose`` (2-D, 3-D; groups, dilations, explicit padding and
  ``output_padding``; not ``output_shape`` or ``auto_pad``): ``deconv``;
- ``Transpose`` of an image's (or volume's) channels to the last axis and back: nothing; between
  the two, ``LayerNormalization`` over the last axis is ``layernorm`` over the channels, a
  ``MatMul`` by a constant (its ``Add`` the bias) a 1×1 ``conv``, and GELU and the other
  functions of one entry what they are elsewhere (ConvNeXt's LayerNorm2d and its block's
  ``Linear`` layers, which PyTorch runs channels-last);
- ``Mul`` by a constant of one value per channel, (C, 1, …, 1): ``layerscale`` (ConvNeXt's
  ``layer_scale``);
- ``BatchNormalization`` (inference or training mode; ONNX's momentum m is PyTorch's 1 − m):
  ``batchnorm``;
- ``Relu``, ``LeakyRelu``, ``Tanh``, ``Mul`` by a scalar: ``relu``, ``leakyrelu``, ``tanh``,
  ``scale``;
- ``MaxPool`` (pads, ``ceil_mode``): ``maxpool``; ``AveragePool`` (``count_include_pad``
  either way): ``avgpool``; ``GlobalAveragePool``: ``avgpool kernel=global``;
- ``Flatten`` (``axis=1``), ``Reshape`` to (N, −1): ``flatten``;
- ``Gemm`` (``transB`` either way, with a bias or none), ``MatMul`` (the ``Add`` of a
  constant after it its bias): ``linear``;
- ``Add``, ``Sum`` of tensors of one shape: ``add``; ``Concat`` along channels: ``concat``;
- ``Dropout``: ``dropout``; ``Identity``: nothing (the same tensor).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.errors import UserError, one_line, shown, shown_path
from hpctrain.layout.partition import Window
from hpctrain.model.kinds import KINDS
from hpctrain.model.kinds.base import INPUT, LayerSpec, Shape
from hpctrain.model.kinds.layerscale import PARAMETER as LAYER_SCALE
from hpctrain.model.kinds.layerscale import scale_shape
from hpctrain.model.kinds.maxpool import ceil_windows
from hpctrain.model.kinds.mul import per_channel
from hpctrain.model.net import MAX_NAME, NetError, NetSpec, StartingWeights, check_layer_name

OPSETS = range(13, 22)  #: the default domain's opsets read (13 to 21)
ONNX_EXTRA = "pip install 'hpctrain[onnx]'"
LOSS_KEY = "hpctrain.loss"  #: metadata an exported model keeps its loss under
MSE = "mean squared error"  #: the value of :data:`LOSS_KEY` for a regression
# a graph's batch size inside a shape it computes (Shape of an activation): unknown until run
BATCH = np.iinfo(np.int64).min


def require_onnx(what: str) -> Any:
    """The ``onnx`` module, or a :class:`~hpctrain.errors.UserError` naming the extra to
    install for ``what`` (``--net model.onnx``)."""
    try:
        import onnx
    except ImportError:
        raise UserError(f"{what} needs the onnx package, which is not installed; install it "
                        f"with {ONNX_EXTRA}") from None
    return onnx


@dataclass
class Imported:
    """An ONNX model as a net and its weights by hpctrain's tensor names."""

    net: NetSpec
    weights: dict[str, np.ndarray]


class _Unsupported(Exception):
    """A node no kind expresses; the message says why, briefly."""


def load_model(path: str | Path) -> Any:
    """The ``ModelProto`` in ``path``, checked by ``onnx.checker``; a
    :class:`~hpctrain.model.net.NetError` in one line for a file that is none."""
    onnx = require_onnx(f"reading {shown_path(path)}")
    path = Path(path)
    if not path.is_file():
        raise NetError(f"{shown_path(path)}: no such file; give the path of an "
                       f"ONNX model")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(weightless(model))
    except Exception as err:  # noqa: BLE001 - protobuf's and the checker's many errors alike
        raise NetError(f"{shown_path(path)}: not a valid ONNX model "
                       f"({one_line(str(err) or type(err).__name__, 160)}); export it again "
                       f"with torch.onnx.export") from None
    return model


def weightless(model: Any) -> Any:
    """``model`` with its initializers made graph inputs of their types and shapes: what the
    checker and shape inference read, without copying the weights (VGG-16's 528 MB took
    them 14 s)."""
    import onnx

    g = model.graph
    known = {i.name for i in g.input}
    weights = [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
               for t in g.initializer if t.name not in known]
    graph = onnx.helper.make_graph(list(g.node), g.name or "graph", [*g.input, *weights],
                                   list(g.output), value_info=list(g.value_info))
    light = onnx.helper.make_model(graph, opset_imports=list(model.opset_import),
                                   ir_version=model.ir_version)
    light.metadata_props.extend(model.metadata_props)
    return light


def import_onnx(path: str | Path, image_size: int | None = None,
                regression: bool | None = None, fallback_size: int | None = None) -> Imported:
    """The net and weights of the ONNX model at ``path``.

    ``image_size``: the input's height and width (every spatial axis of a volume), for a
    graph whose spatial sizes are dynamic or to run it at another size; ``fallback_size``: the
    size to take only where the graph gives none. ``regression``: the loss is the mean squared
    error (True) or cross-entropy (False); None takes the model's :data:`LOSS_KEY` metadata,
    else cross-entropy.
    """
    model = load_model(path)
    graph = _Graph(model, str(path), image_size, fallback_size)
    graph.convert()
    said = _metadata(model).get(LOSS_KEY)
    given = regression is not None or said is not None
    if regression is None:
        regression = said == MSE
    return Imported(dataclasses.replace(graph.net(regression), loss_given=given), graph.weights)


def _metadata(model: Any) -> dict[str, str]:
    return {entry.key: entry.value for entry in model.metadata_props}


def decimal(value: float) -> float:
    """The shortest decimal that a float32 attribute rounds from (ONNX keeps floats in 32
    bits): 0.30000001192092896 is 0.3, as the model's author wrote it.

    >>> decimal(np.float32(0.3)), decimal(np.float32(1e-5))
    (0.3, 1e-05)
    """
    return float(str(np.float32(value)))


# --- names -------------------------------------------------------------------------------

# what a weightless node is called after the module path it ran in, where the path's last
# module is not itself that operation (``layer1.0.add``, but ``relu`` for ``/relu/Relu``)
SHORT = {"Relu": "relu", "LeakyRelu": "leakyrelu", "Tanh": "tanh", "MaxPool": "maxpool",
         "AveragePool": "avgpool", "GlobalAveragePool": "avgpool", "Flatten": "flatten",
         "Reshape": "flatten", "Add": "add", "Sum": "add", "Concat": "concat",
         "Dropout": "dropout", "Mul": "scale", "BatchNormalization": "bn", "Conv": "conv",
         "Gemm": "fc", "MatMul": "fc", "Sigmoid": "sigmoid", "HardSigmoid": "hardsigmoid",
         "HardSwish": "hardswish", "Clip": "clip", "ReduceMean": "avgpool",
         "Resize": "upsample", "Div": "gelu", "LayerNormalization": "layernorm",
         "ConvTranspose": "deconv"}
# what a module's own parameter ends in (``layer1.0.conv1.weight``, torchvision's ConvNeXt's
# ``features.1.0.layer_scale``): the rest is the module, which names the layer
WEIGHT_SUFFIXES = (".weight", f".{LAYER_SCALE}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NUMBERED = re.compile(r"_\d+$")


def module_path(node_name: str, op_type: str) -> str:
    """The PyTorch module path a node ran in, from the scope in its name:
    ``/layer1/layer1.0/relu_1/Relu`` → ``layer1.0.relu_1``; empty for a node at the top
    (``/Flatten``) or named as ONNX numbers nodes (``Conv_12``). A name without scopes is the
    path itself (a graph built by hand names its nodes as it likes).

    >>> module_path("/layer2/layer2.0/downsample/downsample.0/Conv", "Conv")
    'layer2.0.downsample.0'
    >>> module_path("/Flatten", "Flatten"), module_path("Relu_3", "Relu")
    ('', '')
    """
    if "/" not in node_name:
        return "" if re.fullmatch(rf"{op_type}(_\d+)?", node_name) else node_name
    path: list[str] = []
    for part in node_name.split("/")[1:-1]:  # the last part is the operation itself
        if path and part.startswith(path[-1] + "."):  # a child of a Sequential: its full name
            path[-1] = part
        else:
            path.append(part)
    return ".".join(path)


def safe_name(text: str) -> str:
    """``text`` as a layer name: characters outside letters, digits, '_', '-' and '.' made '_',
    empty parts dropped, cut to ``MAX_NAME`` (255) characters."""
    parts = [p for p in _UNSAFE.sub("_", text).split(".") if p]
    name = ".".join(parts)
    if name.startswith("-"):
        name = "_" + name
    return name[:MAX_NAME].rstrip(".")


# --- the graph ---------------------------------------------------------------------------


@dataclass
class _Graph:
    """The conversion of one model's graph, node by node in the graph's (topological) order."""

    model: Any
    file: str
    image_size: int | None
    fallback_size: int | None = None
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    shapes: dict[str, Shape] = field(default_factory=dict)  # tensor → per-sample shape
    producer: dict[str, str] = field(default_factory=dict)  # tensor → layer name, or INPUT
    layers: list[LayerSpec] = field(default_factory=list)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    refused: list[str] = field(default_factory=list)  # "OpType 'node' (why)"
    unknown: set[str] = field(default_factory=set)  # outputs of refused nodes
    absorbed: set[int] = field(default_factory=set)  # nodes folded into an earlier layer
    ceil_layers: set[str] = field(default_factory=set)  # pools of ceil_mode 1
    # tensors that are an image's (or volume's) channels moved last by a Transpose: their
    # shapes are kept channels-first, as the layers computing them see them
    channels_last: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        import onnx

        self.onnx = onnx
        self.where = shown_path(self.file)  # the file as messages name it
        self.opset = next((o.version for o in self.model.opset_import if o.domain in ("",
                                                                                "ai.onnx")), 0)
        if self.opset not in OPSETS:
            raise NetError(f"{self.where}: opset {self.opset}; hpctrain reads opsets "
                           f"{OPSETS.start} to {OPSETS.stop - 1}: export it again with "
                           f"torch.onnx.export(…, opset_version=17)")
        g = self.model.graph
        for tensor in g.initializer:
            self.constants[tensor.name] = onnx.numpy_helper.to_array(tensor)
        self.consumers: dict[str, list[Any]] = {}
        for node in g.node:
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)
        self.graph_outputs = {o.name for o in g.output}
        inputs = [i for i in g.input if i.name not in self.constants]
        if len(inputs) != 1:
            raise NetError(f"{self.where}: the graph has {len(inputs)} inputs "
                           f"({', '.join(i.name for i in inputs) or 'none'}); hpctrain trains "
                           f"nets of one input, the batch of images, volumes or features")
        self.input_name = inputs[0].name
        self.input_shape = self._input_shape(inputs[0])
        self.shapes[self.input_name] = self.input_shape
        self.producer[self.input_name] = INPUT
        if len(g.output) != 1:
            raise NetError(f"{self.where}: the graph has {len(g.output)} outputs; hpctrain "
                           f"trains nets of one output, the logits or targets (drop auxiliary "
                           f"heads before exporting)")

    def _input_shape(self, value: Any) -> Shape:
        """The per-sample shape of the graph's input: its static sizes after the batch, the
        spatial ones ``image_size`` where given."""
        dims = value.type.tensor_type.shape.dim
        sizes = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        self.batch = sizes[0] if sizes and sizes[0] else None  # a graph of a fixed batch
        name = shown(value.name)
        if len(sizes) not in (2, 4, 5):
            raise NetError(f"{self.where}: input {name} has {len(sizes)} axes; hpctrain reads "
                           f"(N, F), (N, C, H, W) or (N, C, D, H, W)")
        per_sample = sizes[1:]
        if self.image_size is None and None in per_sample[1:] and self.fallback_size:
            self.image_size = self.fallback_size
        if self.image_size is not None:
            if len(per_sample) == 1:
                raise NetError(f"{self.where}: input {name} is flat (N, F); --image-size "
                               f"{self.image_size} does not apply")
            per_sample = [per_sample[0]] + [self.image_size] * (len(per_sample) - 1)
        if None in per_sample or min(per_sample) < 1:
            axes = ["F"] if len(per_sample) == 1 else ["C", "D", "H", "W"][-len(per_sample):]
            dynamic = [a for a, s in zip(axes, per_sample, strict=True) if not s]
            raise NetError(f"{self.where}: input {name} has no fixed size along "
                           f"{', '.join(dynamic)}; give --image-size (or export with a fixed "
                           f"size)")
        return tuple(per_sample)

    # -- helpers ---------------------------------------------------------------------------

    def attribute(self, node: Any, name: str) -> Any:
        """Attribute ``name`` of ``node``, or its default in the operator's schema at the
        model's opset (None where the schema has none)."""
        for a in node.attribute:
            if a.name == name:
                value = self.onnx.helper.get_attribute_value(a)
                return value.decode() if isinstance(value, bytes) else value
        schema = self.onnx.defs.get_schema(node.op_type, self.opset, node.domain)
        if name not in schema.attributes:  # an attribute of a later opset
            return None
        default = schema.attributes[name].default_value
        if default.type == self.onnx.AttributeProto.UNDEFINED:
            return None
        value = self.onnx.helper.get_attribute_value(default)
        return value.decode() if isinstance(value, bytes) else value

    def constant(self, node: Any, index: int, what: str) -> np.ndarray:
        """Input ``index`` of ``node``, which must be a constant (a weight, a shape)."""
        name = node.input[index] if index < len(node.input) else ""
        if name not in self.constants:
            raise _Unsupported(f"its {what} is computed, not a constant")
        return self.constants[name]

    def optional_constant(self, node: Any, index: int, what: str) -> np.ndarray | None:
        if index >= len(node.input) or not node.input[index]:
            return None
        return self.constant(node, index, what)

    def activation(self, node: Any, index: int = 0) -> str:
        name = node.input[index]
        if name not in self.shapes:
            raise _Unsupported("its input is a constant, not the data")
        return name

    def only_output(self, node: Any) -> None:
        """Refuse a node whose outputs after the first are read (BatchNormalization's running
        statistics in training mode, MaxPool's indices, Dropout's mask)."""
        for extra in node.output[1:]:
            if extra and (self.consumers.get(extra) or extra in self.graph_outputs):
                raise _Unsupported(f"its output {shown(extra)} is read")

    def name_for(self, node: Any, weight: str | None = None) -> str:
        """A new layer name: the PyTorch module of a weight (``layer1.0.conv1.weight`` →
        ``layer1.0.conv1``), else the module path in the node's name, else the operation."""
        short = SHORT.get(node.op_type, node.op_type.lower())
        path = module_path(node.name, node.op_type)
        ending = next((e for e in WEIGHT_SUFFIXES if weight and weight.endswith(e)), None)
        if weight and ending and not weight.startswith("onnx::"):
            base = weight[:-len(ending)]
        elif weight is not None:  # an anonymous weight: the module the node ran in
            base = path or short
        elif path and _NUMBERED.sub("", path.split(".")[-1]).lower() != short:
            base = f"{path}.{short}"  # a function called inside a module: layer1.0.add
        else:
            base = path or short
        base = safe_name(base) or short
        name, k = base, 0
        while name in self.names or name == INPUT:
            k += 1
            suffix = f"_{k}"
            name = base[:MAX_NAME - len(suffix)].rstrip(".") + suffix
        check_layer_name(name, self.where)
        self.names.add(name)
        return name

    def add_layer(self, node: Any, kind: str, texts: dict[str, Any], inputs: list[str],
                  weights: dict[str, np.ndarray] | None = None, weight_name: str | None = None,
                  output: str | None = None) -> str:
        """Append a layer of ``kind`` with options ``texts`` (read by the kind, as a net file's
        line) reading tensors ``inputs``; it gives ``node``'s first output (or ``output``).
        Returns its name."""
        where = f"{self.where}, node {shown(node.name or node.op_type)} ({node.op_type})"
        kind_of = KINDS[kind]
        options = kind_of.parse({k: str(v) for k, v in texts.items()}, where)
        name = self.name_for(node, weight_name if weights else None)
        spec = LayerSpec(name, kind, options, tuple(self.producer[t] for t in inputs), where)
        shapes = tuple(self.shapes[t] for t in inputs)
        spec = kind_of.resolve(spec, shapes, where)
        out = kind_of.out_shape(spec, shapes, where)
        expected = {**kind_of.param_shapes(spec, shapes), **kind_of.buffer_shapes(spec, shapes)}
        for suffix, value in (weights or {}).items():
            if tuple(value.shape) != tuple(expected[suffix]):
                raise _Unsupported(f"its {suffix} has shape {tuple(value.shape)}, where the "
                                   f"layer needs {tuple(expected[suffix])}")
        self.layers.append(spec)
        for suffix, value in (weights or {}).items():
            self.weights[f"{name}.{suffix}"] = np.asarray(value)
        output = output or node.output[0]
        self.shapes[output] = out
        self.producer[output] = name
        if inputs[0] in self.channels_last:  # a layer of one position at a time keeps it so
            self.channels_last.add(output)
        return name

    def alias(self, node: Any, source: str) -> None:
        """``node``'s first output is tensor ``source`` itself."""
        self.shapes[node.output[0]] = self.shapes[source]
        self.producer[node.output[0]] = self.producer[source]
        if source in self.channels_last:
            self.channels_last.add(node.output[0])

    # -- the walk --------------------------------------------------------------------------

    def convert(self) -> None:
        # Constant nodes first: a pattern read from its first node (GELU's Div) needs the
        # constants its later nodes take, which the exporter writes just before each
        for node in self.model.graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self.constants[node.output[0]] = _constant_value(self, node)
        for node in self.model.graph.node:
            if id(node) in self.absorbed:
                continue
            given = [name for name in node.input if name]
            if any(name in self.unknown for name in given):
                self.unknown.update(node.output)  # after a refused node: nothing to add
                if node.op_type not in CONVERTERS and node.op_type not in EVALUATORS:
                    self.refuse(node, "no hpctrain kind computes it")
                continue
            try:
                if node.domain not in ("", "ai.onnx"):
                    raise _Unsupported(f"an operator of domain {node.domain}")
                if node.op_type == "Shape" and given and given[0] in self.shapes:
                    self.constants[node.output[0]] = self.shape_of(node)
                elif all(name in self.constants for name in given):
                    if node.op_type not in EVALUATORS:
                        raise _Unsupported("it computes a constant hpctrain does not fold; "
                                           "export with do_constant_folding=True")
                    self.constants[node.output[0]] = EVALUATORS[node.op_type](self, node)
                elif any(name in self.channels_last for name in given) and \
                        node.op_type not in CHANNELS_LAST_READERS:
                    raise _Unsupported(f"it reads channels moved last by a Transpose; hpctrain "
                                       f"reads those only in "
                                       f"{', '.join(sorted(CHANNELS_LAST_READERS))}")
                elif node.op_type in CONVERTERS:
                    CONVERTERS[node.op_type](self, node)
                else:
                    raise _Unsupported("no hpctrain kind computes it")
            except _Unsupported as err:
                self.refuse(node, str(err))
            except NetError as err:  # a value the kind refuses (a slope, a window too large)
                self.refuse(node, str(err).split("): ", 1)[-1])
        if self.refused:
            listed = "; ".join(self.refused)
            raise NetError(f"{self.where}: {len(self.refused)} node(s) map onto no hpctrain "
                           f"layer kind: {listed}. Supported: {', '.join(sorted(CONVERTERS))}")

    def refuse(self, node: Any, why: str) -> None:
        self.refused.append(f"{node.op_type} {shown(node.name or '(unnamed)')} ({why})")
        self.unknown.update(node.output)

    def shape_of(self, node: Any) -> np.ndarray:
        """``Shape`` of an activation: (batch, *per-sample), the batch :data:`BATCH` (the
        channels last where a Transpose moved them there)."""
        shape = self.shapes[node.input[0]]
        if node.input[0] in self.channels_last:
            shape = (*shape[1:], shape[0])
        full = np.array([BATCH, *shape], dtype=np.int64)
        start, end = self.attribute(node, "start") or 0, self.attribute(node, "end")
        return full[start:end]

    def net(self, regression: bool) -> NetSpec:
        """The net the walk made, checked against the graph's own shapes."""
        output = self.model.graph.output[0].name
        if output not in self.producer or self.producer[output] == INPUT:
            raise NetError(f"{self.where}: the graph's output {shown(output)} is not computed "
                           f"from its input by layers hpctrain runs")
        reach = {self.producer[output]}
        for layer in reversed(self.layers):
            if layer.name in reach:
                reach.update(layer.inputs)
        dead = [layer.name for layer in self.layers if layer.name not in reach]
        if dead:
            raise NetError(f"{self.where}: the outputs of {', '.join(dead)} lead to no output "
                           f"of the graph; remove those nodes before exporting")
        shape = self.shapes[output]
        # a class score per pixel: (K, *S), at the input's spatial size (a segmentation net's)
        per_pixel = len(shape) > 1 and shape[1:] == self.input_shape[1:] and not regression
        if len(shape) != 1 and not per_pixel:
            raise NetError(f"{self.where}: the graph's output has per-sample shape {shape}; "
                           f"hpctrain trains nets whose output is (N, K), logits or targets, "
                           f"or (N, K, *S), a class score per pixel of an input of spatial "
                           f"size S {self.input_shape[1:]}")
        net = NetSpec(self.file, self.input_shape, shape[0], tuple(self.layers), regression,
                      weights=StartingWeights(self.file))
        self._check_shapes(net)
        return net

    def _check_shapes(self, net: NetSpec) -> None:
        """Every layer's output shape as the graph's shape inference gives it, where it gives
        one (a size of its own, not the batch): a mapping that reads an operator otherwise
        than ONNX does is refused, naming the node."""
        if self.image_size is not None:
            return  # the graph's shapes are those of its own input size
        inferred = self.onnx.shape_inference.infer_shapes(weightless(self.model))
        known = {}
        for value in (*inferred.graph.value_info, *inferred.graph.output):
            dims = value.type.tensor_type.shape.dim
            known[value.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                      for d in dims[1:])
        produced = {name: tensor for tensor, name in self.producer.items()
                    if name != INPUT and tensor in known}
        for layer, ours in zip(net.layers, net.out_shapes, strict=True):
            tensor = produced.get(layer.name, "")
            theirs = known.get(tensor)
            if theirs is not None and tensor in self.channels_last:  # (H, W, C): (C, H, W)
                theirs = (theirs[-1], *theirs[:-1])
            if theirs is not None and layer.name in self.ceil_layers:
                # ONNX's shape inference keeps a ceil-mode window that starts in the padding
                # after; onnxruntime and PyTorch drop it, as hpctrain does: one more is theirs
                theirs = tuple(o if t == o + 1 else t for t, o in zip(theirs, ours,
                                                                       strict=False))
            if theirs is not None and len(theirs) == len(ours) and any(
                    t is not None and t != o for t, o in zip(theirs, ours, strict=True)):
                raise NetError(f"{layer.where}: hpctrain reads its output as per-sample shape "
                               f"{ours}, but the graph says {theirs}")


# --- constants ---------------------------------------------------------------------------


def _constant_value(graph: _Graph, node: Any) -> np.ndarray:
    onnx = graph.onnx
    for a in node.attribute:
        if a.name == "value":
            return onnx.numpy_helper.to_array(a.t)
        if a.name in ("value_float", "value_int"):
            return np.array(onnx.helper.get_attribute_value(a))
        if a.name in ("value_floats", "value_ints"):
            return np.array(list(onnx.helper.get_attribute_value(a)))
    raise _Unsupported("a Constant hpctrain cannot read (sparse or string)")


def _axes(graph: _Graph, node: Any, index: int) -> list[int] | None:
    """Unsqueeze's and Squeeze's axes: an input from opset 13."""
    found = graph.optional_constant(node, index, "axes")
    return None if found is None else [int(a) for a in np.atleast_1d(found)]


def _unsqueeze(graph: _Graph, node: Any) -> np.ndarray:
    data = graph.constants[node.input[0]]
    axes = sorted(a % (data.ndim + len(axes_)) for axes_ in [_axes(graph, node, 1) or []]
                  for a in axes_)
    for axis in axes:
        data = np.expand_dims(data, axis)
    return data


def _squeeze(graph: _Graph, node: Any) -> np.ndarray:
    data = graph.constants[node.input[0]]
    axes = _axes(graph, node, 1)
    return np.squeeze(data) if axes is None else np.squeeze(data, tuple(a % data.ndim
                                                                        for a in axes))


def _slice(graph: _Graph, node: Any) -> np.ndarray:
    data = graph.constants[node.input[0]]
    starts, ends = graph.constant(node, 1, "starts"), graph.constant(node, 2, "ends")
    axes = graph.optional_constant(node, 3, "axes")
    steps = graph.optional_constant(node, 4, "steps")
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        index[int(axis)] = slice(int(start), int(end), int(step))
    return data[tuple(index)]


def _cast(graph: _Graph, node: Any) -> np.ndarray:
    data = graph.constants[node.input[0]]
    if data.dtype == np.int64 and (data == BATCH).any():
        return data  # a shape with the batch in it stays a shape
    return data.astype(graph.onnx.helper.tensor_dtype_to_np_dtype(graph.attribute(node, "to")))


def _reshape_constant(graph: _Graph, node: Any) -> np.ndarray:
    data, shape = graph.constants[node.input[0]], graph.constant(node, 1, "shape")
    dims = [data.shape[i] if d == 0 else int(d) for i, d in enumerate(shape)]
    return data.reshape(dims)


EVALUATORS: dict[str, Callable[[_Graph, Any], np.ndarray]] = {
    "Constant": _constant_value,
    "Identity": lambda g, n: g.constants[n.input[0]],
    "Cast": _cast,
    "Gather": lambda g, n: np.take(g.constants[n.input[0]], g.constants[n.input[1]],
                                   axis=g.attribute(n, "axis")),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": lambda g, n: np.concatenate([np.atleast_1d(g.constants[i]) for i in n.input],
                                          axis=g.attribute(n, "axis")),
    "Slice": _slice,
    "Reshape": _reshape_constant,
    "Transpose": lambda g, n: np.transpose(g.constants[n.input[0]], g.attribute(n, "perm")),
}
"""Operators evaluated here when every input is a constant, as what computes weights and
shapes is."""


# --- layers ------------------------------------------------------------------------------


def _pads(graph: _Graph, node: Any, x: Shape, kernel: list[int], stride: list[int],
          dilation: list[int] | None = None) -> list[tuple[int, int]]:
    """(before, after) per spatial axis from ``auto_pad`` and ``pads`` (``SAME_*`` of the
    window's span, dilated)."""
    auto = graph.attribute(node, "auto_pad") or "NOTSET"
    axes = len(kernel)
    if auto == "VALID":
        return [(0, 0)] * axes
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        if any(s != 1 for s in stride):
            raise _Unsupported(f"auto_pad {auto} with stride {stride}")
        total = [d * (k - 1) for k, d in zip(kernel, dilation or [1] * axes, strict=True)]
        small = [t // 2 for t in total]
        return [(t - s, s) if auto == "SAME_LOWER" else (s, t - s)
                for t, s in zip(total, small, strict=True)]
    if auto != "NOTSET":
        raise _Unsupported(f"auto_pad {auto}")
    pads = graph.attribute(node, "pads") or [0] * (2 * axes)
    return [(int(pads[i]), int(pads[i + axes])) for i in range(axes)]


def _sizes(values: list[int]) -> str:
    return "x".join(str(v) for v in values)


def _pad_text(pads: list[tuple[int, int]]) -> str:
    return "x".join(f"{b}+{a}" for b, a in pads)


def _ones(graph: _Graph, node: Any, name: str, axes: int) -> None:
    found = graph.attribute(node, name)
    if found is not None and any(v != 1 for v in found):
        raise _Unsupported(f"{name} {list(found)}")


def _conv(graph: _Graph, node: Any) -> None:
    x = graph.activation(node)
    weight = graph.constant(node, 1, "weight")
    bias = graph.optional_constant(node, 2, "bias")
    axes = weight.ndim - 2
    if axes not in (2, 3):
        raise _Unsupported(f"a {axes}-D convolution; hpctrain convolves images and volumes")
    groups = graph.attribute(node, "group")
    dilation = list(graph.attribute(node, "dilations") or [1] * axes)
    kernel = list(graph.attribute(node, "kernel_shape") or weight.shape[2:])
    stride = list(graph.attribute(node, "strides") or [1] * axes)
    pads = _pads(graph, node, graph.shapes[x], kernel, stride, dilation)
    weights = {"weight": weight}
    if bias is not None:
        weights["bias"] = bias
    graph.add_layer(node, "conv", {"out": weight.shape[0], "kernel": _sizes(kernel),
                                   "stride": _sizes(stride), "pad": _pad_text(pads),
                                   "bias": int(bias is not None), "groups": groups,
                                   "dilation": _sizes(dilation)}, [x], weights,
                    node.input[1])


def _deconv(graph: _Graph, node: Any) -> None:
    """ConvTranspose as PyTorch's ``ConvTranspose2d``/``3d`` exports it: its weight (C, O/G,
    K…) as it is, ``pads`` cropped from the output and ``output_padding`` given back at its
    end."""
    x = graph.activation(node)
    weight = graph.constant(node, 1, "weight")
    bias = graph.optional_constant(node, 2, "bias")
    axes = weight.ndim - 2
    if axes not in (2, 3):
        raise _Unsupported(f"a {axes}-D transposed convolution; hpctrain convolves images and "
                           f"volumes")
    if graph.attribute(node, "output_shape"):
        raise _Unsupported("output_shape; export the layer with output_padding, as PyTorch does")
    auto = graph.attribute(node, "auto_pad") or "NOTSET"
    if auto != "NOTSET":
        raise _Unsupported(f"auto_pad {auto}; give explicit pads")
    groups = graph.attribute(node, "group")
    kernel = list(graph.attribute(node, "kernel_shape") or weight.shape[2:])
    stride = list(graph.attribute(node, "strides") or [1] * axes)
    dilation = list(graph.attribute(node, "dilations") or [1] * axes)
    outpad = list(graph.attribute(node, "output_padding") or [0] * axes)
    pads = graph.attribute(node, "pads") or [0] * (2 * axes)
    weights = {"weight": weight}
    if bias is not None:
        weights["bias"] = bias
    graph.add_layer(node, "deconv", {
        "out": weight.shape[1] * groups, "kernel": _sizes(kernel), "stride": _sizes(stride),
        "pad": _pad_text([(int(pads[i]), int(pads[i + axes])) for i in range(axes)]),
        "outpad": _sizes(outpad), "bias": int(bias is not None), "groups": groups,
        "dilation": _sizes(dilation)}, [x], weights, node.input[1])


def _batchnorm(graph: _Graph, node: Any) -> None:
    x = graph.activation(node)
    graph.only_output(node)
    names = ("scale", "bias", "mean", "var")
    gamma, beta, mean, var = (graph.constant(node, i + 1, what) for i, what in enumerate(names))
    # ONNX's running mean is m·mean + (1 − m)·batch mean: PyTorch's momentum is 1 − m
    momentum = float(Decimal(1) - Decimal(str(np.float32(graph.attribute(node, "momentum")))))
    if momentum <= 0:  # PyTorch's momentum=None: a cumulative average of every batch seen
        raise _Unsupported("momentum 1 (PyTorch's momentum=None, a cumulative average); "
                           "give the batch norm a momentum such as 0.1")
    graph.add_layer(node, "batchnorm", {"eps": repr(decimal(graph.attribute(node, "epsilon"))),
                                        "momentum": repr(momentum)}, [x],
                    {"gamma": gamma, "beta": beta, "running_mean": mean, "running_var": var},
                    node.input[1])


def _pointwise(kind: str, **texts: Callable[[_Graph, Any], Any]) -> Callable[[_Graph, Any], None]:
    def convert(graph: _Graph, node: Any) -> None:
        graph.add_layer(node, kind, {key: read(graph, node) for key, read in texts.items()},
                        [graph.activation(node)])

    return convert


def _sigmoid(graph: _Graph, node: Any) -> None:
    """σ(x); x·σ(x) (a ``Mul`` of the input by its sigmoid, which alone reads it: SiLU, as
    PyTorch writes it) is one silu layer."""
    x = graph.activation(node)
    readers = graph.consumers.get(node.output[0], [])
    if len(readers) == 1 and node.output[0] not in graph.graph_outputs:
        mul = readers[0]
        if mul.op_type == "Mul" and sorted(mul.input) == sorted([x, node.output[0]]):
            graph.absorbed.add(id(mul))
            graph.add_layer(node, "silu", {}, [x], output=mul.output[0])
            return
    graph.add_layer(node, "sigmoid", {}, [x])


def _hardsigmoid(graph: _Graph, node: Any) -> None:
    """max(0, min(1, αx + β)) with PyTorch's α = 1/6, β = 1/2: ReLU6(x + 3)/6."""
    alpha, beta = graph.attribute(node, "alpha"), graph.attribute(node, "beta")
    if abs(alpha - 1 / 6) > 1e-6 or abs(beta - 0.5) > 1e-6:
        raise _Unsupported(f"alpha {alpha:g}, beta {beta:g}; hpctrain's hardsigmoid is "
                           f"PyTorch's (alpha 1/6, beta 1/2)")
    graph.add_layer(node, "hardsigmoid", {}, [graph.activation(node)])


def _clip(graph: _Graph, node: Any) -> None:
    """x cut to [min, max] (both given, as constants): relu6 for [0, 6]."""
    x = graph.activation(node)
    low = graph.optional_constant(node, 1, "min")
    high = graph.optional_constant(node, 2, "max")
    if low is None or high is None:
        raise _Unsupported("an open bound; hpctrain clips to [min, max]")
    low, high = decimal(float(low.reshape(-1)[0])), decimal(float(high.reshape(-1)[0]))
    if (low, high) == (0, 6):
        graph.add_layer(node, "relu6", {}, [x])
    else:
        graph.add_layer(node, "clip", {"min": repr(low), "max": repr(high)}, [x])


def _reduce_mean(graph: _Graph, node: Any) -> None:
    """The mean over every spatial axis (``x.mean([2, 3])``): a global average pool, then a
    flatten where the axes are dropped (keepdims 0)."""
    x = graph.activation(node)
    rank = len(graph.shapes[x]) + 1
    axes = graph.attribute(node, "axes")
    if axes is None:
        given = graph.optional_constant(node, 1, "axes")
        axes = None if given is None else given.tolist()
    if rank < 4 or axes is None or sorted(a % rank for a in axes) != list(range(2, rank)):
        raise _Unsupported(f"a mean over axes {axes}; hpctrain averages over every spatial "
                           f"axis (a global average pool)")
    if graph.attribute(node, "keepdims") == 0:
        pooled = f"{node.output[0]} (pooled)"
        graph.add_layer(node, "avgpool", {"kernel": "global"}, [x], output=pooled)
        graph.add_layer(node, "flatten", {}, [pooled])
    else:
        graph.add_layer(node, "avgpool", {"kernel": "global"}, [x])


def _resize(graph: _Graph, node: Any) -> None:
    """``F.interpolate`` as PyTorch writes it: nearest (``asymmetric``, ``floor``) or linear
    (``half_pixel``, ``pytorch_half_pixel`` or ``align_corners``), to constant ``scales`` or
    ``sizes`` (the batch and channels kept): an upsample layer."""
    x = graph.activation(node)
    shape = graph.shapes[x]
    mode = graph.attribute(node, "mode")
    transform = graph.attribute(node, "coordinate_transformation_mode")
    if graph.attribute(node, "antialias"):
        raise _Unsupported("antialias 1")
    policy = graph.attribute(node, "keep_aspect_ratio_policy")
    if policy not in (None, "stretch"):
        raise _Unsupported(f"keep_aspect_ratio_policy {policy}")
    if mode == "nearest":
        if transform != "asymmetric" or graph.attribute(node, "nearest_mode") != "floor":
            raise _Unsupported(f"nearest with {transform} and "
                               f"{graph.attribute(node, 'nearest_mode')}; hpctrain's is "
                               f"PyTorch's (asymmetric, floor)")
        texts: dict[str, Any] = {"mode": "nearest"}
    elif mode == "linear":
        if transform not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            raise _Unsupported(f"linear with {transform}")
        texts = {"mode": "bilinear", "align": int(transform == "align_corners")}
    else:
        raise _Unsupported(f"mode {mode}")
    scales = graph.optional_constant(node, 2, "scales")
    sizes = graph.optional_constant(node, 3, "sizes")
    spatial = list(shape[1:])
    if sizes is not None and sizes.size:
        if len(sizes) != len(shape) + 1 or int(sizes[1]) != shape[0]:
            raise _Unsupported(f"sizes {sizes.tolist()}; hpctrain resizes the spatial axes")
        texts["size"] = _sizes([int(s) for s in sizes[2:]])
    elif scales is not None and scales.size:
        factors = [float(s) for s in scales]
        if factors[:2] != [1.0, 1.0] or any(f != int(f) or f < 1 for f in factors[2:]):
            raise _Unsupported(f"scales {factors}; hpctrain resizes by whole factors (or to "
                               f"sizes) along the spatial axes")
        texts["scale"] = _sizes([int(f) for f in factors[2:]])
    else:
        raise _Unsupported("neither scales nor sizes")
    if len(spatial) < 2:
        raise _Unsupported("a flat input")
    outputs = ([int(s) for s in sizes[2:]] if "size" in texts
               else [n * int(f) for n, f in zip(spatial, scales[2:], strict=True)])
    if transform == "pytorch_half_pixel" and 1 in outputs:
        # it reads entry 0 for an output of one entry, F.interpolate the middle
        raise _Unsupported("pytorch_half_pixel to a size of 1; export with half_pixel")
    graph.add_layer(node, "upsample", texts, [x])


def _only_reader(graph: _Graph, tensor: str, op_type: str) -> Any | None:
    """The node of ``op_type`` that alone reads ``tensor`` (which is no graph output), or
    None."""
    readers = graph.consumers.get(tensor, [])
    if len(readers) == 1 and tensor not in graph.graph_outputs \
            and readers[0].op_type == op_type:
        return readers[0]
    return None


def _scalar(graph: _Graph, name: str) -> float | None:
    value = graph.constants.get(name)
    return None if value is None or value.size != 1 else float(value.reshape(-1)[0])


def _div(graph: _Graph, node: Any) -> None:
    """GELU as PyTorch writes ``F.gelu``: x/√2 → Erf → + 1 → x·(…) → ·½, one gelu layer."""
    x = graph.activation(node)
    erf = _only_reader(graph, node.output[0], "Erf")
    add = erf and _only_reader(graph, erf.output[0], "Add")
    mul = add and _only_reader(graph, add.output[0], "Mul")
    half = mul and _only_reader(graph, mul.output[0], "Mul")
    root = _scalar(graph, node.input[1])
    if not (half and root is not None and abs(root - 2 ** 0.5) < 1e-6
            and _scalar(graph, next(i for i in add.input if i != erf.output[0])) == 1.0
            and x in mul.input
            and _scalar(graph, next(i for i in half.input if i != mul.output[0])) == 0.5):
        raise _Unsupported("a division that is not GELU's x/√2 (x/√2 → Erf → +1 → ·x → ·½)")
    graph.absorbed.update(id(n) for n in (erf, add, mul, half))
    graph.add_layer(node, "gelu", {}, [x], output=half.output[0])


CHANNELS_LAST = {4: [0, 2, 3, 1], 5: [0, 2, 3, 4, 1]}  # an image's, a volume's
CHANNELS_FIRST = {4: [0, 3, 1, 2], 5: [0, 4, 1, 2, 3]}


def _layernorm_layer(graph: _Graph, node: Any, x: str, output: str | None = None) -> None:
    """A layernorm layer of LayerNormalization ``node`` (over the last axis) reading ``x``."""
    channels = graph.shapes[x][0]
    scale = graph.constant(node, 1, "scale")
    bias = graph.optional_constant(node, 2, "bias")
    if bias is None:
        bias = np.zeros(channels, dtype=scale.dtype)
    graph.add_layer(node, "layernorm", {"eps": repr(decimal(graph.attribute(node, "epsilon")))},
                    [x], {"gamma": scale, "beta": bias}, node.input[1], output)


def _layernorm(graph: _Graph, node: Any) -> None:
    """LayerNormalization over the last axis: a flat input's features, or an image's channels
    moved last (ConvNeXt's LayerNorm2d, and the norm of its block)."""
    x = graph.activation(node)
    graph.only_output(node)
    rank = len(graph.shapes[x]) + 1
    if (len(graph.shapes[x]) != 1 and x not in graph.channels_last) \
            or graph.attribute(node, "axis") not in (-1, rank - 1):
        raise _Unsupported(f"axis {graph.attribute(node, 'axis')} of shape "
                           f"{graph.shapes[x]}; hpctrain normalises a flat input's features, or "
                           f"an image's channels moved last by a Transpose")
    _layernorm_layer(graph, node, x)


def _transpose(graph: _Graph, node: Any) -> None:
    """An image's channels moved last, or moved back: no layer. What reads the channels-last
    tensor runs over the channels at each position (:data:`CHANNELS_LAST_READERS`), as PyTorch
    writes ConvNeXt's LayerNorm2d and the ``Linear`` layers of its block."""
    x = graph.activation(node)
    rank = len(graph.shapes[x]) + 1
    perm = list(graph.attribute(node, "perm") or [])
    if x in graph.channels_last and perm == CHANNELS_FIRST.get(rank):
        # the same layer's output, channels first again: an alias that is not channels-last
        graph.shapes[node.output[0]] = graph.shapes[x]
        graph.producer[node.output[0]] = graph.producer[x]
    elif x not in graph.channels_last and perm == CHANNELS_LAST.get(rank):
        graph.alias(node, x)
        graph.channels_last.add(node.output[0])
    else:
        raise _Unsupported(f"a transpose {perm}; hpctrain reads one only of an image's "
                           f"channels to the last axis, and back")


def _pool_window(graph: _Graph, node: Any) -> tuple[str, list[int], list[int], list]:
    x = graph.activation(node)
    graph.only_output(node)
    kernel = list(graph.attribute(node, "kernel_shape"))
    if len(kernel) not in (2, 3):
        raise _Unsupported(f"a {len(kernel)}-D window")
    _ones(graph, node, "dilations", len(kernel))
    stride = list(graph.attribute(node, "strides") or [1] * len(kernel))
    return x, kernel, stride, _pads(graph, node, graph.shapes[x], kernel, stride)


def _maxpool(graph: _Graph, node: Any) -> None:
    x, kernel, stride, pads = _pool_window(graph, node)
    if graph.attribute(node, "storage_order"):
        raise _Unsupported("storage_order 1")
    ceil = bool(graph.attribute(node, "ceil_mode"))
    name = graph.add_layer(node, "maxpool", {"kernel": _sizes(kernel), "stride": _sizes(stride),
                                             "pad": _pad_text(pads), "ceil": int(ceil)}, [x])
    if ceil:
        graph.ceil_layers.add(name)


def _avgpool(graph: _Graph, node: Any) -> None:
    x, kernel, stride, pads = _pool_window(graph, node)
    if graph.attribute(node, "ceil_mode"):
        sizes = graph.shapes[x][1:]
        if any(ceil_windows(n, k, s, b, a) != Window(k, s, b, a).out_size(n)
               for n, k, s, (b, a) in zip(sizes, kernel, stride, pads, strict=True)):
            raise _Unsupported("ceil_mode 1 that adds windows")
    name = graph.add_layer(node, "avgpool", {"kernel": _sizes(kernel), "stride": _sizes(stride),
                                             "pad": _pad_text(pads),
                                             "count_pad": int(bool(graph.attribute(
                                                 node, "count_include_pad")))}, [x])
    if graph.attribute(node, "ceil_mode"):
        graph.ceil_layers.add(name)


def _global_avgpool(graph: _Graph, node: Any) -> None:
    x = graph.activation(node)
    if len(graph.shapes[x]) < 3:
        raise _Unsupported("a flat input")
    graph.add_layer(node, "avgpool", {"kernel": "global"}, [x])


def _flatten_layer(graph: _Graph, node: Any, x: str) -> None:
    if len(graph.shapes[x]) == 1:
        graph.alias(node, x)  # already (N, F)
    else:
        graph.add_layer(node, "flatten", {}, [x])


def _flatten(graph: _Graph, node: Any) -> None:
    x = graph.activation(node)
    axis = graph.attribute(node, "axis")
    if axis % (len(graph.shapes[x]) + 1) != 1:
        raise _Unsupported(f"axis {axis}; hpctrain flattens each sample (axis 1)")
    _flatten_layer(graph, node, x)


def _reshape(graph: _Graph, node: Any) -> None:
    """A reshape to (N, −1) (or (N, F), or (−1, F)) of each sample: a flatten."""
    x = graph.activation(node)
    target = [int(d) for d in graph.constant(node, 1, "shape")]
    full = [BATCH, *graph.shapes[x]]
    features = int(np.prod(graph.shapes[x]))
    keep = not (graph.opset >= 14 and graph.attribute(node, "allowzero"))
    dims = [full[i] if d == 0 and keep and i < len(full) else d for i, d in enumerate(target)]
    # the batch kept: as the graph computes it, or the fixed batch of a graph that has one (a
    # constant on a dynamic batch would regroup the samples at any other batch)
    batch = dims[0] == BATCH or (graph.batch is not None and dims[0] == graph.batch)
    flat = len(dims) == 2 and (batch and dims[1] in (-1, features)
                               or dims[0] == -1 and dims[1] == features)
    if not flat:
        shown_dims = ["N" if d == BATCH else str(d) for d in target]
        raise _Unsupported(f"a reshape to ({', '.join(shown_dims)}), not to (N, -1)")
    _flatten_layer(graph, node, x)


def _linear(graph: _Graph, node: Any, x: str, weight: np.ndarray, bias: np.ndarray | None,
            weight_name: str, output: str | None = None) -> None:
    """A linear layer of ``weight`` (out, in) reading flat ``x``."""
    if len(graph.shapes[x]) != 1:
        raise _Unsupported(f"an input of per-sample shape {graph.shapes[x]}; flatten it first")
    weights = {"weight": np.ascontiguousarray(weight)}
    if bias is not None:
        out = weight.shape[0]
        if bias.size not in (1, out) or (bias.ndim > 1 and bias.shape[-1] not in (1, out)):
            raise _Unsupported(f"a bias of shape {bias.shape}")
        weights["bias"] = np.broadcast_to(bias.reshape(-1), (out,)).copy()
    graph.add_layer(node, "linear", {"out": weight.shape[0], "bias": int(bias is not None)},
                    [x], weights, weight_name, output)


def _gemm(graph: _Graph, node: Any) -> None:
    x = graph.activation(node)
    b = graph.constant(node, 1, "weight")
    c = graph.optional_constant(node, 2, "bias")
    if graph.attribute(node, "transA"):
        raise _Unsupported("transA 1")
    for name in ("alpha", "beta"):
        if decimal(graph.attribute(node, name)) != 1:
            raise _Unsupported(f"{name} {decimal(graph.attribute(node, name))}")
    weight = b if graph.attribute(node, "transB") else b.T
    _linear(graph, node, x, weight, c, node.input[1])


def _matmul(graph: _Graph, node: Any) -> None:
    """X·B with B a constant (in, out): a linear layer of Bᵀ, or on an image's channels moved
    last a 1×1 convolution of Bᵀ (PyTorch's ``Linear`` at each position); an ``Add`` of a
    constant that alone reads it is its bias."""
    x = graph.activation(node)
    b = graph.constant(node, 1, "weight")
    if b.ndim != 2:
        raise _Unsupported(f"a weight of shape {b.shape}")
    bias, output = None, None
    readers = graph.consumers.get(node.output[0], [])
    if len(readers) == 1 and node.output[0] not in graph.graph_outputs:
        add = readers[0]
        other = [i for i in add.input if i != node.output[0]]
        if add.op_type == "Add" and len(other) == 1 and other[0] in graph.constants:
            bias, output = graph.constants[other[0]], add.output[0]
            graph.absorbed.add(id(add))
    if x in graph.channels_last:
        _pointwise_conv(graph, node, x, b.T, bias, output)
    else:
        _linear(graph, node, x, b.T, bias, node.input[1], output)


def _pointwise_conv(graph: _Graph, node: Any, x: str, weight: np.ndarray,
                    bias: np.ndarray | None, output: str | None) -> None:
    """A 1×1 convolution of ``weight`` (out, in) on the channels of ``x``, moved last."""
    out, spatial = weight.shape[0], len(graph.shapes[x]) - 1
    if weight.shape[1] != graph.shapes[x][0]:
        raise _Unsupported(f"a weight of shape {weight.T.shape} for {graph.shapes[x][0]} "
                           f"channels")
    weights = {"weight": np.ascontiguousarray(weight.reshape(out, -1, *(1,) * spatial))}
    if bias is not None:
        if bias.size not in (1, out) or (bias.ndim > 1 and bias.shape[-1] not in (1, out)):
            raise _Unsupported(f"a bias of shape {bias.shape}")
        weights["bias"] = np.broadcast_to(bias.reshape(-1), (out,)).copy()
    graph.add_layer(node, "conv", {"out": out, "kernel": _sizes([1] * spatial),
                                   "bias": int(bias is not None)}, [x], weights, node.input[1],
                    output)


def _add(graph: _Graph, node: Any) -> None:
    """``Add`` of two tensors, or ``Sum`` of several, of one shape."""
    inputs = list(node.input)
    if any(name in graph.constants for name in inputs):
        raise _Unsupported(f"an {node.op_type} of a constant that is no MatMul's bias")
    shapes = {graph.shapes[name] for name in inputs}
    if len(shapes) > 1:
        raise _Unsupported(f"a broadcast of {' and '.join(map(str, sorted(shapes)))}")
    if len(inputs) == 1:
        graph.alias(node, inputs[0])
    else:
        graph.add_layer(node, "add", {}, inputs)


def _concat(graph: _Graph, node: Any) -> None:
    inputs = [graph.activation(node, i) for i in range(len(node.input))]
    rank = len(graph.shapes[inputs[0]]) + 1
    if graph.attribute(node, "axis") % rank != 1:
        raise _Unsupported(f"axis {graph.attribute(node, 'axis')}; hpctrain joins channels "
                           f"(axis 1)")
    if len(inputs) == 1:
        graph.alias(node, inputs[0])
    else:
        graph.add_layer(node, "concat", {}, inputs)


def _dropout(graph: _Graph, node: Any) -> None:
    x = graph.activation(node)
    graph.only_output(node)
    ratio = graph.optional_constant(node, 1, "ratio")
    p = 0.5 if ratio is None else decimal(float(ratio))
    graph.add_layer(node, "dropout", {"p": repr(p)}, [x])


def _identity(graph: _Graph, node: Any) -> None:
    graph.alias(node, graph.activation(node))


def _mul(graph: _Graph, node: Any) -> None:
    """A product by a scalar constant (a scale layer), by a constant of one value per channel
    (a layerscale layer: ConvNeXt's ``layer_scale``, (C, 1, 1)), or of two computed tensors of
    one shape or one by a gate of one value per channel (a mul layer: squeeze-excitation)."""
    a, b = node.input
    if a in graph.shapes and b in graph.shapes:
        if per_channel(graph.shapes[a], graph.shapes[b]):
            a, b = b, a  # the gate second
        if graph.shapes[b] != graph.shapes[a] and not per_channel(graph.shapes[b],
                                                                   graph.shapes[a]):
            raise _Unsupported(f"a product of shapes {graph.shapes[a]} and {graph.shapes[b]}; "
                               f"hpctrain multiplies tensors of one shape, or by one value per "
                               f"channel")
        graph.add_layer(node, "mul", {}, [a, b])
        return
    x, factor = (a, b) if b in graph.constants else (b, a)
    if factor not in graph.constants or x not in graph.shapes:
        raise _Unsupported("a product of two computed tensors")
    value = graph.constants[factor]
    if value.ndim == len(graph.shapes[x]) + 1 and value.shape[0] == 1:
        value = value[0]  # (1, C, 1, 1): the batch axis broadcast too
    if value.size != 1 and tuple(value.shape) == scale_shape(graph.shapes[x]):
        graph.add_layer(node, "layerscale", {}, [x], {LAYER_SCALE: value}, factor)
        return
    if value.size != 1:
        raise _Unsupported(f"a product with a constant of shape {value.shape}, not a scalar "
                           f"nor one value per channel, {scale_shape(graph.shapes[x])}")
    graph.add_layer(node, "scale", {"factor": repr(decimal(float(value.reshape(-1)[0])))}, [x])


CONVERTERS: dict[str, Callable[[_Graph, Any], None]] = {
    "Conv": _conv,
    "ConvTranspose": _deconv,
    "BatchNormalization": _batchnorm,
    "Relu": _pointwise("relu"),
    "LeakyRelu": _pointwise("leakyrelu",
                            slope=lambda g, n: repr(decimal(g.attribute(n, "alpha")))),
    "Tanh": _pointwise("tanh"),
    "Sigmoid": _sigmoid,
    "HardSigmoid": _hardsigmoid,
    "HardSwish": _pointwise("hardswish"),
    "Clip": _clip,
    "ReduceMean": _reduce_mean,
    "Resize": _resize,
    "Div": _div,
    "LayerNormalization": _layernorm,
    "Transpose": _transpose,
    "MaxPool": _maxpool,
    "AveragePool": _avgpool,
    "GlobalAveragePool": _global_avgpool,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Add": _add,
    "Sum": _add,
    "Concat": _concat,
    "Dropout": _dropout,
    "Identity": _identity,
    "Mul": _mul,
}
"""One converter per operator type on the data, each adding the layer the node is."""

CHANNELS_LAST_READERS = {"Transpose", "LayerNormalization", "MatMul", "Div", "Relu", "Sigmoid",
                         "Tanh", "Identity"}
"""The operators that may read an image's channels moved last, each computing one position at a
time as the same layer does channels-first (the normalisation and the matrix product over its
channels, GELU's Div chain and the other functions of one entry)."""
