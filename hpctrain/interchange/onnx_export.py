"""ONNX models out: a net and its trained tensors as an inference graph (opset 17 or 18) that
onnxruntime runs and :mod:`~hpctrain.interchange.onnx_import` reads back.

One converter per layer kind (:data:`WRITERS`), the inverse of the importer's: each layer
becomes the ONNX node of the same name (``Conv``, ``BatchNormalization`` with its running
statistics, ``MaxPool`` with ``ceil_mode``, ``AveragePool`` with ``count_include_pad``, ``Gemm``,
…; ``Dropout`` stays as the node that inference skips, so that a model read back trains with it).
Initializers carry PyTorch's names (:mod:`~hpctrain.interchange.torch_names`), so a net read
back keeps its layers' names, and batch norm stays a node of its own (never folded into the
convolution before it, which would lose it). The batch axis is dynamic; the other sizes are the
net's. The metadata say the loss, so that ``--net model.onnx`` trains it as it was trained.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np

from hpctrain.errors import UserError
from hpctrain.interchange.onnx_import import LOSS_KEY, MSE, require_onnx
from hpctrain.interchange.torch_names import torch_names
from hpctrain.interchange.weights import EXPORT_MARK
from hpctrain.model.kinds.base import INPUT, LayerSpec
from hpctrain.model.kinds.layerscale import PARAMETER as LAYER_SCALE
from hpctrain.model.net import NetSpec

OPSETS = (17, 18)  #: the opsets written
PROTOBUF_LIMIT = 2**31 - 2**24  # bytes of weights an ONNX file holds, with room for the graph
OUTPUT = "output"  #: the graph output's name


class _Writer:
    """The graph being written: nodes, initializers, and each layer's output tensor."""

    def __init__(self, onnx: Any, net: NetSpec, tensors: dict[str, np.ndarray]) -> None:
        self.onnx, self.net, self.tensors = onnx, net, tensors
        self.names = torch_names(net)
        self.initializer_names = set(self.names.values())
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []

    def output_of(self, layer: str) -> str:
        """The tensor a layer gives: its name, unless an initializer is called so (ConvNeXt's
        ``features.1.0.layer_scale`` is a layer of the shipped net and PyTorch's name of its
        parameter)."""
        if layer == self.net.layers[-1].name:
            return OUTPUT
        return f"{layer}::output" if layer in self.initializer_names else layer

    def inputs_of(self, spec: LayerSpec) -> list[str]:
        return [INPUT if name == INPUT else self.output_of(name) for name in spec.inputs]

    def weight(self, spec: LayerSpec, suffix: str) -> str:
        """The initializer of tensor ``LAYER.suffix``, by PyTorch's name."""
        ours = f"{spec.name}.{suffix}"
        name = self.names[ours]
        value = np.asarray(self.tensors[ours], dtype=np.float32)
        self.initializers.append(self.onnx.numpy_helper.from_array(value, name))
        return name

    def constant(self, spec: LayerSpec, value: float, tag: str = "constant") -> str:
        name = f"{spec.name}::{tag}"
        self.nodes.append(self.onnx.helper.make_node(
            "Constant", [], [name], name=name,
            value=self.onnx.numpy_helper.from_array(np.array(value, dtype=np.float32))))
        return name

    def integers(self, spec: LayerSpec, values: list[int], tag: str) -> str:
        """A constant 1-D int64 tensor named after the layer and ``tag``."""
        name = f"{spec.name}::{tag}"
        self.nodes.append(self.onnx.helper.make_node(
            "Constant", [], [name], name=name,
            value=self.onnx.numpy_helper.from_array(np.array(values, dtype=np.int64))))
        return name

    def node(self, spec: LayerSpec, op: str, inputs: list[str], **attributes: Any) -> None:
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [self.output_of(spec.name)],
                                                     name=spec.name, **attributes))


def _pads(pad: tuple[tuple[int, int], ...]) -> list[int]:
    """ONNX's pads: every axis's padding before, then every axis's after."""
    return [b for b, _ in pad] + [a for _, a in pad]


def _weighted_inputs(w: _Writer, spec: LayerSpec) -> list[str]:
    """A (transposed) convolution's inputs: its input, its weight, and its bias if it has one."""
    inputs = [*w.inputs_of(spec), w.weight(spec, "weight")]
    return [*inputs, w.weight(spec, "bias")] if spec.options.bias else inputs


def _conv(w: _Writer, spec: LayerSpec) -> None:
    o = spec.options
    w.node(spec, "Conv", _weighted_inputs(w, spec), kernel_shape=list(o.kernel),
           strides=list(o.stride), pads=_pads(o.pad), group=o.groups,
           dilations=list(o.dilation))


def _deconv(w: _Writer, spec: LayerSpec) -> None:
    o = spec.options
    w.node(spec, "ConvTranspose", _weighted_inputs(w, spec), kernel_shape=list(o.kernel),
           strides=list(o.stride), pads=_pads(o.pad), output_padding=list(o.outpad),
           group=o.groups, dilations=list(o.dilation))


def _batchnorm(w: _Writer, spec: LayerSpec) -> None:
    o = spec.options
    inputs = [*w.inputs_of(spec), *(w.weight(spec, s) for s in ("gamma", "beta", "running_mean",
                                                                  "running_var"))]
    # ONNX's momentum weighs the running value: PyTorch's 1 − momentum
    w.node(spec, "BatchNormalization", inputs, epsilon=o.eps,
           momentum=float(Decimal(1) - Decimal(repr(o.momentum))))


def _maxpool(w: _Writer, spec: LayerSpec) -> None:
    o = spec.options
    pad = tuple((b, a - e) for (b, a), e in zip(o.pad, o.ceil_pad or (0,) * len(o.pad),
                                                strict=True))
    w.node(spec, "MaxPool", w.inputs_of(spec), kernel_shape=list(o.kernel),
           strides=list(o.stride), pads=_pads(pad), ceil_mode=int(o.ceil))


def _avgpool(w: _Writer, spec: LayerSpec) -> None:
    o = spec.options
    if o.kernel is None:
        w.node(spec, "GlobalAveragePool", w.inputs_of(spec))
        return
    w.node(spec, "AveragePool", w.inputs_of(spec), kernel_shape=list(o.kernel),
           strides=list(o.stride), pads=_pads(o.pad), count_include_pad=int(o.count_pad))


def _linear(w: _Writer, spec: LayerSpec) -> None:
    inputs = [*w.inputs_of(spec), w.weight(spec, "weight")]
    if spec.options.bias:
        inputs.append(w.weight(spec, "bias"))
    w.node(spec, "Gemm", inputs, transB=1)


def _add(w: _Writer, spec: LayerSpec) -> None:
    inputs = w.inputs_of(spec)
    w.node(spec, "Add" if len(inputs) == 2 else "Sum", inputs)


def _dropout(w: _Writer, spec: LayerSpec) -> None:
    w.node(spec, "Dropout", [*w.inputs_of(spec), w.constant(spec, spec.options.p)])


def _simple(op: str, **attributes: Callable[[Any], Any]) -> Callable[[_Writer, LayerSpec], None]:
    def write(w: _Writer, spec: LayerSpec) -> None:
        w.node(spec, op, w.inputs_of(spec),
               **{key: read(spec.options) for key, read in attributes.items()})

    return write


def _clip(low: Callable[[Any], float], high: Callable[[Any], float]
          ) -> Callable[[_Writer, LayerSpec], None]:
    """Clip to [low, high] of the layer's options (its bounds as inputs, from opset 11)."""
    def write(w: _Writer, spec: LayerSpec) -> None:
        w.node(spec, "Clip", [*w.inputs_of(spec), w.constant(spec, low(spec.options), "min"),
                              w.constant(spec, high(spec.options), "max")])

    return write


def _silu(w: _Writer, spec: LayerSpec) -> None:
    """x·σ(x) as PyTorch writes it: a Sigmoid, and a Mul of the input by it."""
    (x,) = w.inputs_of(spec)
    gate = f"{spec.name}::sigmoid"
    w.nodes.append(w.onnx.helper.make_node("Sigmoid", [x], [gate], name=gate))
    w.node(spec, "Mul", [x, gate])


def _upsample(w: _Writer, spec: LayerSpec) -> None:
    """Resize to the layer's output sizes, as PyTorch writes ``F.interpolate(size=…)``: the
    sizes the input's batch and channels (Shape, sliced) joined to the spatial ones."""
    o = spec.options
    (x,) = w.inputs_of(spec)
    shape, kept, sizes = (f"{spec.name}::{what}" for what in ("shape", "kept", "sizes"))
    make = w.onnx.helper.make_node
    w.nodes.append(make("Shape", [x], [shape], name=shape))
    w.nodes.append(make("Slice", [shape, w.integers(spec, [0], "start"),
                                  w.integers(spec, [2], "end")], [kept], name=kept))
    w.nodes.append(make("Concat", [kept, w.integers(spec, list(o.outputs), "spatial")],
                        [sizes], name=sizes, axis=0))
    if o.mode == "nearest":
        modes = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                 "nearest_mode": "floor"}
    else:
        # half_pixel is F.interpolate's for every size (pytorch_half_pixel reads entry 0 for
        # an output of one entry)
        modes = {"mode": "linear", "coordinate_transformation_mode":
                 "align_corners" if o.align else "half_pixel"}
    w.node(spec, "Resize", [x, "", "", sizes], **modes)


def _gelu(w: _Writer, spec: LayerSpec) -> None:
    """x·(1 + erf(x/√2))/2 as PyTorch writes ``F.gelu``: Div, Erf, Add, Mul, Mul."""
    (x,) = w.inputs_of(spec)
    make = w.onnx.helper.make_node
    scaled, erf, plus, product = (f"{spec.name}::{what}" for what in ("scaled", "erf", "plus",
                                                                         "product"))
    w.nodes += [make("Div", [x, w.constant(spec, 2 ** 0.5, "root2")], [scaled], name=scaled),
                make("Erf", [scaled], [erf], name=erf)]
    w.nodes.append(make("Add", [erf, w.constant(spec, 1.0, "one")], [plus], name=plus))
    w.nodes.append(make("Mul", [x, plus], [product], name=product))
    w.node(spec, "Mul", [product, w.constant(spec, 0.5, "half")])


def _layernorm(w: _Writer, spec: LayerSpec) -> None:
    """LayerNormalization over the last axis: a flat input's features, or an image's channels
    moved last and back, as PyTorch writes ConvNeXt's LayerNorm2d."""
    (x,) = w.inputs_of(spec)
    rank = len(w.net.out_shapes[[layer.name for layer in w.net.layers].index(spec.name)]) + 1
    inputs = [w.weight(spec, "gamma"), w.weight(spec, "beta")]
    if rank == 2:
        w.node(spec, "LayerNormalization", [x, *inputs], axis=-1, epsilon=spec.options.eps)
        return
    make = w.onnx.helper.make_node
    last, normed = f"{spec.name}::channels_last", f"{spec.name}::normalized"
    order = list(range(rank))
    to_last = [0, *order[2:], 1]
    back = [0, rank - 1, *order[1:rank - 1]]
    w.nodes.append(make("Transpose", [x], [last], name=last, perm=to_last))
    w.nodes.append(make("LayerNormalization", [last, *inputs], [normed], name=normed, axis=-1,
                        epsilon=spec.options.eps))
    w.node(spec, "Transpose", [normed], perm=back)


def _scale(w: _Writer, spec: LayerSpec) -> None:
    w.node(spec, "Mul", [*w.inputs_of(spec), w.constant(spec, spec.options.factor)])


def _layerscale(w: _Writer, spec: LayerSpec) -> None:
    """A Mul by γ, (C, 1, …, 1), as PyTorch writes ConvNeXt's ``layer_scale * x``."""
    w.node(spec, "Mul", [*w.inputs_of(spec), w.weight(spec, LAYER_SCALE)])


WRITERS: dict[str, Callable[[_Writer, LayerSpec], None]] = {
    "conv": _conv,
    "deconv": _deconv,
    "batchnorm": _batchnorm,
    "relu": _simple("Relu"),
    "leakyrelu": _simple("LeakyRelu", alpha=lambda o: o.slope),
    "tanh": _simple("Tanh"),
    "scale": _scale,
    "maxpool": _maxpool,
    "avgpool": _avgpool,
    "flatten": _simple("Flatten", axis=lambda o: 1),
    "linear": _linear,
    "add": _add,
    "concat": _simple("Concat", axis=lambda o: 1),
    "dropout": _dropout,
    "sigmoid": _simple("Sigmoid"),
    "silu": _silu,
    "hardsigmoid": _simple("HardSigmoid", alpha=lambda o: 1 / 6, beta=lambda o: 0.5),
    "hardswish": _simple("HardSwish"),
    "relu6": _clip(lambda o: 0.0, lambda o: 6.0),
    "clip": _clip(lambda o: o.min, lambda o: o.max),
    "mul": _simple("Mul"),
    "upsample": _upsample,
    "gelu": _gelu,
    "layernorm": _layernorm,
    "layerscale": _layerscale,
}
"""One writer per layer kind, the ONNX node (or nodes) the layer is."""


def model_proto(net: NetSpec, tensors: dict[str, np.ndarray], opset: int = 17,
                doc: str = "") -> Any:
    """``net`` with ``tensors`` (every parameter and buffer, by hpctrain's names) as a checked
    ONNX ``ModelProto`` of ``opset``, its batch axis dynamic."""
    onnx = require_onnx("writing an ONNX model")
    size = sum(np.asarray(t).size * 4 for t in tensors.values())
    if size >= PROTOBUF_LIMIT:
        raise UserError(f"net {net.name} holds {size / 2**30:.2f} GiB of weights; an ONNX file "
                        f"holds at most 2 GiB (protobuf's limit): export it to .safetensors")
    if opset not in OPSETS:
        raise ValueError(f"opset {opset}: hpctrain writes opsets {', '.join(map(str, OPSETS))}")
    missing = sorted({layer.kind for layer in net.layers} - set(WRITERS))
    if missing:
        raise ValueError(f"no ONNX writer for kinds {', '.join(missing)}")
    writer = _Writer(onnx, net, tensors)
    for spec in net.layers:
        WRITERS[spec.kind](writer, spec)
    helper = onnx.helper
    graph = helper.make_graph(
        writer.nodes, net.name.rsplit("/", 1)[-1] or "net",
        [helper.make_tensor_value_info(INPUT, onnx.TensorProto.FLOAT,
                                       ["batch", *net.input_shape])],
        [helper.make_tensor_value_info(OUTPUT, onnx.TensorProto.FLOAT,
                                       ["batch", *net.out_shapes[-1]])],
        writer.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="hpctrain", doc_string=doc)
    model.ir_version = min(model.ir_version, 8 if opset == 17 else 9)  # what runtimes read
    helper.set_model_props(model, {
        LOSS_KEY: MSE if net.regression else "cross-entropy", "writer": EXPORT_MARK,
        "hpctrain.net": net.name})
    onnx.checker.check_model(model)
    return model


def is_our_model(path: Any) -> bool:
    """Whether ``path`` is an ONNX model hpctrain wrote (its metadata say so); the model is
    read without its weights' external data."""
    try:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - anything unreadable is not ours
        return False
    return any(p.key == "writer" and p.value == EXPORT_MARK for p in model.metadata_props)
