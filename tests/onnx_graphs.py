"""Small ONNX models built with ``onnx.helper`` (not PyTorch), for the tests of the importer.

:class:`Graph` adds one node per call, one method per operator, each returning the name of the
tensor it gives. Weights are seeded random initializers named as PyTorch names a module's
tensors (``MODULE.weight``, ``MODULE.bias``, ``MODULE.running_mean``); batch-norm running means
are non-zero and running variances positive and away from 1, so that evaluating with the running
statistics differs from not using them. :meth:`Graph.model` gives a ``ModelProto`` that
``onnx.checker`` passed (full check, with shape inference), its batch axis a ``dim_param``
unless told otherwise. Shapes (for a weight's input size) come from ONNX's own shape inference.

The module imports ``onnx`` at its top: import it after ``pytest.importorskip("onnx")``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Dim = int | str  # a fixed size, or the name of a dynamic one (dim_param)


def _listed(value: int | Sequence[int], axes: int) -> list[int]:
    """``value`` once per spatial axis when one number is given."""
    return [int(value)] * axes if np.isscalar(value) else [int(v) for v in value]


class Graph:
    """An ONNX graph of one float input of per-sample shape ``shape`` (after the batch axis
    ``batch``: a dim_param name, or a number for a static batch), built node by node.

    ``opset``: the default domain's version the model imports. ``seed``: of every initializer.
    Node names default to ONNX's numbering (``Conv_3``), module names (the prefix of a node's
    weights) to the short operator name and the same number (``conv3``); give ``name=`` and
    ``module=`` to choose them.
    """

    def __init__(self, shape: Sequence[Dim], *, opset: int = 17, seed: int = 0,
                 batch: Dim = "N", input_name: str = "input"):
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.input = input_name
        self.inputs = [helper.make_tensor_value_info(input_name, TensorProto.FLOAT,
                                                     [batch, *shape])]
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.tensors = itertools.count()
        # per-sample shapes ONNX's inference may not find (a view's at opset 13)
        self.known: dict[str, tuple[Dim, ...]] = {}

    # -- plumbing ----------------------------------------------------------------------------

    def constant(self, name: str, value: np.ndarray) -> str:
        """An initializer ``name`` holding ``value``; returns ``name``."""
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def random(self, name: str, shape: Sequence[int], scale: float = 1.0,
               low: float | None = None, high: float | None = None) -> str:
        """A float32 initializer of normal draws times ``scale``, or uniform in [low, high)."""
        if low is not None:
            value = self.rng.uniform(low, high, shape)
        else:
            value = scale * self.rng.standard_normal(shape)
        return self.constant(name, value.astype(np.float32))

    def node(self, op_type: str, inputs: Sequence[str], *, name: str | None = None,
             outputs: int = 1, **attributes) -> str:
        """A node of ``op_type`` reading ``inputs`` ('' for an optional input left out);
        returns its first output (all are named ``t<k>``)."""
        number = len(self.nodes)
        names = [f"t{next(self.tensors)}" for _ in range(outputs)]
        given = {k: v for k, v in attributes.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), names,
                                           name=f"{op_type}_{number}" if name is None else name,
                                           **given))
        return names[0]

    def module(self, short: str, module: str | None) -> str:
        return f"{short}{len(self.nodes)}" if module is None else module

    def add_input(self, name: str, shape: Sequence[Dim]) -> str:
        """A second graph input (a net hpctrain refuses)."""
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def graph(self, outputs: Sequence[str]) -> onnx.GraphProto:
        values = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        return helper.make_graph(self.nodes, "test", self.inputs, values, self.initializers)

    def shape(self, x: str) -> tuple[Dim, ...]:
        """The per-sample shape of tensor ``x`` as ONNX infers it (a dynamic axis by its name,
        or '?'), inferred at a batch of 1 where the batch is dynamic, so that a flatten's size
        is known."""
        if x in self.known:
            return self.known[x]
        if x == self.input:
            dims = self.inputs[0].type.tensor_type.shape.dim
        else:
            graph = self.graph([x])
            batch = graph.input[0].type.tensor_type.shape.dim[0]
            if not batch.HasField("dim_value"):
                batch.dim_value = 1
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True,
                                                         data_prop=True)
            found = {v.name: v for v in inferred.graph.output}
            dims = found[x].type.tensor_type.shape.dim
        return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                     for d in dims[1:])

    def model(self, output: str, *, extra_outputs: Sequence[str] = (),
              metadata: dict[str, str] | None = None) -> onnx.ModelProto:
        """The model whose graph output is ``output`` (and ``extra_outputs``), checked."""
        model = helper.make_model(self.graph([output, *extra_outputs]),
                                  opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="tests/onnx_graphs.py")
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        for value, found in zip(model.graph.output, inferred.graph.output, strict=True):
            value.CopyFrom(found)  # the outputs' shapes, as ONNX infers them
        for key, value in (metadata or {}).items():
            model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
        onnx.checker.check_model(model, full_check=True)
        return model

    # -- operators with weights --------------------------------------------------------------

    def conv(self, x: str, out: int, kernel: int | Sequence[int] = 3, *, bias: bool = True,
             group: int | None = None, module: str | None = None, name: str | None = None,
             **attributes) -> str:
        """Conv of ``out`` channels (2-D or 3-D as ``x``); ``attributes``: pads, strides,
        auto_pad, dilations, kernel_shape as ONNX spells them."""
        channels = self.shape(x)[0]
        axes = len(self.shape(x)) - 1
        window = _listed(kernel, axes)
        module = self.module("conv", module)
        fan_in = channels // (group or 1) * int(np.prod(window))
        inputs = [x, self.random(f"{module}.weight", [out, channels // (group or 1), *window],
                                 scale=fan_in ** -0.5)]
        if bias:
            inputs.append(self.random(f"{module}.bias", [out], scale=0.5))
        return self.node("Conv", inputs, name=name, group=group, **attributes)

    def batchnorm(self, x: str, *, training: bool = False, module: str | None = None,
                  name: str | None = None, **attributes) -> str:
        """BatchNormalization with running statistics that matter; ``training``: the
        training_mode=1 form with its three outputs (running mean and variance unread)."""
        channels = self.shape(x)[0]
        module = self.module("bn", module)
        inputs = [x, self.random(f"{module}.weight", [channels], low=0.5, high=1.5),
                  self.random(f"{module}.bias", [channels], scale=0.5),
                  self.random(f"{module}.running_mean", [channels], low=0.3, high=0.8),
                  self.random(f"{module}.running_var", [channels], low=1.5, high=3.0)]
        if training:
            return self.node("BatchNormalization", inputs, name=name, outputs=3, training_mode=1,
                             **attributes)
        return self.node("BatchNormalization", inputs, name=name, **attributes)

    def gemm(self, x: str, out: int, *, trans_b: int | None = 1, bias: bool = True,
             module: str | None = None, name: str | None = None, **attributes) -> str:
        """Gemm of a weight (out, in) with transB=1, (in, out) with transB 0 or left out."""
        features = self.shape(x)[0]
        module = self.module("fc", module)
        shape = [out, features] if trans_b else [features, out]
        inputs = [x, self.random(f"{module}.weight", shape, scale=features ** -0.5)]
        if bias:
            inputs.append(self.random(f"{module}.bias", [out], scale=0.5))
        return self.node("Gemm", inputs, name=name, transB=trans_b, **attributes)

    def matmul(self, x: str, out: int, *, bias: bool = True, bias_first: bool = False,
               module: str | None = None, name: str | None = None) -> str:
        """MatMul by a weight (in, out), then (``bias``) an Add of a bias, the bias as the Add's
        first input with ``bias_first``."""
        features = self.shape(x)[0]
        module = self.module("fc", module)
        y = self.node("MatMul", [x, self.random(f"{module}.weight", [features, out],
                                                scale=features ** -0.5)], name=name)
        if not bias:
            return y
        b = self.random(f"{module}.bias", [out], scale=0.5)
        return self.node("Add", [b, y] if bias_first else [y, b])

    # -- operators without weights -----------------------------------------------------------

    def relu(self, x: str, *, name: str | None = None) -> str:
        return self.node("Relu", [x], name=name)

    def leakyrelu(self, x: str, alpha: float | None = None, *, name: str | None = None) -> str:
        return self.node("LeakyRelu", [x], name=name, alpha=alpha)

    def tanh(self, x: str, *, name: str | None = None) -> str:
        return self.node("Tanh", [x], name=name)

    def maxpool(self, x: str, kernel: int | Sequence[int], *, name: str | None = None,
                **attributes) -> str:
        axes = len(self.shape(x)) - 1
        return self.node("MaxPool", [x], name=name, kernel_shape=_listed(kernel, axes),
                         **attributes)

    def avgpool(self, x: str, kernel: int | Sequence[int], *, name: str | None = None,
                **attributes) -> str:
        axes = len(self.shape(x)) - 1
        return self.node("AveragePool", [x], name=name, kernel_shape=_listed(kernel, axes),
                         **attributes)

    def global_avgpool(self, x: str, *, name: str | None = None) -> str:
        return self.node("GlobalAveragePool", [x], name=name)

    def flatten(self, x: str, axis: int | None = None, *, name: str | None = None) -> str:
        return self.node("Flatten", [x], name=name, axis=axis)

    def reshape(self, x: str, shape: Sequence[int], *, name: str | None = None) -> str:
        """Reshape to a constant ``shape``."""
        target = self.constant(f"shape{len(self.nodes)}", np.array(shape, dtype=np.int64))
        return self.node("Reshape", [x, target], name=name)

    def view(self, x: str, *, shape_range: bool = False, name: str | None = None) -> str:
        """``x.view(x.size(0), -1)`` as torch.onnx.export writes it: Shape → Gather (index 0)
        → Unsqueeze → Concat with [-1] → Reshape, the constants as Constant nodes;
        ``shape_range``: Shape with start=0, end=1 (opset 15 on) in place of the Gather."""
        if shape_range:
            size = self.node("Shape", [x], start=0, end=1)
        else:
            index = self.node("Constant", [], value=numpy_helper.from_array(np.array(0)))
            batch = self.node("Gather", [self.node("Shape", [x]), index], axis=0)
            axes = self.node("Constant", [], value=numpy_helper.from_array(np.array([0])))
            size = self.node("Unsqueeze", [batch, axes])
        rest = self.node("Constant", [], value=numpy_helper.from_array(np.array([-1])))
        target = self.node("Concat", [size, rest], axis=0)
        y = self.node("Reshape", [x, target], name=name)
        self.known[y] = (int(np.prod(self.shape(x))),)
        return y

    def add(self, *xs: str, name: str | None = None) -> str:
        return self.node("Add", xs, name=name)

    def sum(self, *xs: str, name: str | None = None) -> str:
        return self.node("Sum", xs, name=name)

    def concat(self, *xs: str, axis: int = 1, name: str | None = None) -> str:
        return self.node("Concat", xs, name=name, axis=axis)

    def dropout(self, x: str, ratio: float | None = None, *, name: str | None = None) -> str:
        """Dropout, its ratio an input (as from opset 12) where given."""
        if ratio is None:
            return self.node("Dropout", [x], name=name)
        r = self.constant(f"ratio{len(self.nodes)}", np.array(ratio, dtype=np.float32))
        return self.node("Dropout", [x, r], name=name)

    def identity(self, x: str, *, name: str | None = None) -> str:
        return self.node("Identity", [x], name=name)

    def mul(self, x: str, factor: float, *, shape: Sequence[int] = (), first: bool = False,
            as_node: bool = False, name: str | None = None) -> str:
        """Mul by the constant ``factor`` (of ``shape``: () a scalar, (1,) ...), the constant
        first with ``first``, a Constant node's output with ``as_node``."""
        value = np.full(shape, factor, dtype=np.float32)
        if as_node:
            c = self.node("Constant", [], value=numpy_helper.from_array(value))
        else:
            c = self.constant(f"factor{len(self.nodes)}", value)
        return self.node("Mul", [c, x] if first else [x, c], name=name)

    def op(self, op_type: str, *xs: str, name: str | None = None, **attributes) -> str:
        """Any other operator (one hpctrain does not map)."""
        return self.node(op_type, xs, name=name, **attributes)


def save(model: onnx.ModelProto, path: str | Path) -> Path:
    """Write ``model`` to ``path``; returns the path."""
    path = Path(path)
    onnx.save(model, str(path))
    return path
