"""The ONNX importer (:mod:`hpctrain.interchange.onnx_import`) on graphs built node by node with
``onnx.helper`` (:mod:`tests.onnx_graphs`), not exported from PyTorch: every mapped operator and
option, checked against onnxruntime running the same file; the names, weights, options and input
shape the import gives; and the refusals, each one line naming every node it cannot map.

The comparisons run hpctrain's forward on one process in float64, in evaluation mode (running
statistics, no dropout) unless a test says otherwise, and onnxruntime in float32, to a relative
error of 1e-5 (the largest difference over the largest reference entry). Weights and batch-norm
statistics are seeded random, the running means non-zero and the variances away from 1, so a
mapping that drops or confuses any of them shows.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from mpi4py import MPI  # noqa: E402
from onnx import numpy_helper  # noqa: E402

from hpctrain.comm.grid import GridSet  # noqa: E402
from hpctrain.commands.verify import relative_error  # noqa: E402
from hpctrain.device.backend import Backend  # noqa: E402
from hpctrain.errors import shown_path  # noqa: E402
from hpctrain.interchange.onnx_import import (  # noqa: E402
    LOSS_KEY,
    MSE,
    import_onnx,
    module_path,
    safe_name,
)
from hpctrain.model.net import LAYER_NAME, MAX_NAME, NetError  # noqa: E402
from hpctrain.plan.plans import plan_from_spec  # noqa: E402
from hpctrain.run.network import Network  # noqa: E402
from tests.onnx_graphs import Graph, save  # noqa: E402

TOLERANCE = 1e-5
BATCH = 3
CLASSES = 3


# -- helpers ---------------------------------------------------------------------------------


def onnxruntime_outputs(model, x: np.ndarray) -> list[np.ndarray]:
    """Every graph output of ``model`` on ``x`` under onnxruntime (float32, one thread)."""
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # no warnings about shapes the outputs declare
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.astype(np.float32)})


def hpctrain_forward(net, x: np.ndarray, training: bool = False):
    """(logits, {buffer name: value}) of one forward of ``net`` on one process in float64, its
    starting weights the file's."""
    net = net.with_statistics("global", 1)
    with GridSet(MPI.COMM_SELF) as grids:
        network = Network(net, plan_from_spec("1x1", net, 1), len(x), grids,
                          Backend(np, np.float64), 0)
        network.set_training(training)
        y = network.forward(x.astype(np.float64), 0)
        return np.asarray(y), {b.name: np.array(b.value) for b in network.buffers}


def sample(shape, batch: int = BATCH, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, *shape))


def check_against_onnxruntime(tmp_path, model, batch: int = BATCH, image_size=None,
                              training: bool = False, what: str = "model"):
    """Import ``model`` from a file, run it in hpctrain and onnxruntime on one random batch, and
    assert the logits agree; returns the import."""
    path = save(model, tmp_path / "model.onnx")
    imported = import_onnx(path, image_size=image_size)
    x = sample(imported.net.input_shape, batch)
    got, _ = hpctrain_forward(imported.net, x, training)
    want = onnxruntime_outputs(model, x)[0]
    assert got.shape == want.shape, f"{what}: hpctrain gives {got.shape}, onnxruntime {want.shape}"
    error = relative_error(got, want)
    assert error <= TOLERANCE, f"{what}: relative error {error:.2e} against onnxruntime"
    return imported


def classify(g: Graph, y: str) -> str:
    """A classifier head on ``y``: Flatten, then a Gemm to :data:`CLASSES` outputs."""
    return g.gemm(g.flatten(y), CLASSES)


def refused(path, *fragments: str) -> str:
    """Importing ``path`` raises a NetError of one line naming the file and each fragment."""
    with pytest.raises(NetError) as caught:
        import_onnx(path)
    message = str(caught.value)
    assert "\n" not in message, f"not one line: {message!r}"
    assert shown_path(path) in message, f"the file is not named: {message}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


# -- every operator and option against onnxruntime -----------------------------------------

# name → (per-sample input shape, the graph on the input up to the tensor fed to the head: a
# Flatten and a Gemm are added unless the graph's last tensor is already the logits)
CASES = {
    # Conv: pads, strides, auto_pad, bias, kernel_shape given, 3-D
    "conv-pads-symmetric": ((3, 9, 9), lambda g, x: g.conv(x, 4, 3, pads=[1, 1, 1, 1])),
    "conv-pads-asymmetric-no-bias": ((3, 9, 8), lambda g, x: g.conv(
        x, 4, 3, pads=[0, 1, 2, 1], bias=False)),
    "conv-no-pads-kernel-shape": ((3, 9, 9), lambda g, x: g.conv(x, 4, 3, kernel_shape=[3, 3])),
    "conv-stride-2": ((3, 9, 9), lambda g, x: g.conv(x, 4, 3, strides=[2, 2], pads=[1] * 4)),
    "conv-stride-2x1-kernel-3x2": ((3, 9, 8), lambda g, x: g.conv(x, 4, (3, 2), strides=[2, 1])),
    # an even kernel pads unevenly: SAME_UPPER puts the extra row after, SAME_LOWER before
    "conv-same-upper": ((3, 7, 8), lambda g, x: g.conv(x, 4, (2, 4), auto_pad="SAME_UPPER")),
    "conv-same-lower": ((3, 7, 8), lambda g, x: g.conv(x, 4, (2, 4), auto_pad="SAME_LOWER")),
    "conv-valid-stride-2": ((3, 9, 8), lambda g, x: g.conv(x, 4, 3, auto_pad="VALID",
                                                           strides=[2, 2])),
    "conv3d-pads-strides": ((2, 5, 6, 7), lambda g, x: g.conv(x, 3, 3, pads=[1, 0, 1, 1, 1, 0],
                                                              strides=[1, 2, 1])),
    "conv3d-same-lower-no-bias": ((2, 5, 6, 7), lambda g, x: g.conv(
        x, 3, (2, 3, 2), auto_pad="SAME_LOWER", bias=False)),
    # MaxPool: ceil_mode where it adds a window (12 with kernel 3 stride 2, with and without
    # padding), pads, default strides, auto_pad, 3-D
    "maxpool-ceil-0": ((2, 12, 12), lambda g, x: g.maxpool(x, 3, strides=[2, 2], ceil_mode=0)),
    "maxpool-ceil-1": ((2, 12, 12), lambda g, x: g.maxpool(x, 3, strides=[2, 2], ceil_mode=1)),
    "maxpool-ceil-1-padded": ((2, 12, 10), lambda g, x: g.maxpool(
        x, 3, strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    "maxpool-pads-asymmetric": ((2, 7, 7), lambda g, x: g.maxpool(x, 3, strides=[2, 2],
                                                                 pads=[0, 1, 1, 0])),
    "maxpool-default-stride": ((2, 7, 6), lambda g, x: g.maxpool(x, 2)),
    "maxpool-same-lower": ((2, 7, 7), lambda g, x: g.maxpool(x, (2, 3), auto_pad="SAME_LOWER")),
    "maxpool3d-ceil-1": ((2, 5, 6, 7), lambda g, x: g.maxpool(x, 2, strides=[2, 2, 2],
                                                              ceil_mode=1)),
    # AveragePool: count_include_pad either way with padding, ceil_mode that adds no window
    "avgpool-count-include-pad-0": ((2, 9, 8), lambda g, x: g.avgpool(
        x, 3, strides=[2, 2], pads=[1] * 4, count_include_pad=0)),
    "avgpool-count-include-pad-1": ((2, 9, 8), lambda g, x: g.avgpool(
        x, 3, strides=[2, 2], pads=[1] * 4, count_include_pad=1)),
    "avgpool-pads-asymmetric-count-1": ((2, 7, 7), lambda g, x: g.avgpool(
        x, 3, strides=[2, 2], pads=[0, 1, 1, 2], count_include_pad=1)),
    "avgpool-ceil-1-no-new-window": ((2, 9, 9), lambda g, x: g.avgpool(
        x, 3, strides=[2, 2], pads=[1] * 4, ceil_mode=1, count_include_pad=0)),
    "avgpool-same-upper": ((2, 7, 7), lambda g, x: g.avgpool(x, 2, auto_pad="SAME_UPPER")),
    "avgpool3d-count-include-pad-0": ((2, 5, 6, 7), lambda g, x: g.avgpool(
        x, 3, strides=[2, 2, 2], pads=[1] * 6, count_include_pad=0)),
    "avgpool3d-count-include-pad-1": ((2, 5, 6, 7), lambda g, x: g.avgpool(
        x, 3, strides=[2, 2, 2], pads=[1] * 6, count_include_pad=1)),
    "global-avgpool": ((3, 5, 6), lambda g, x: g.global_avgpool(g.conv(x, 4, 3))),
    "global-avgpool-3d": ((2, 5, 6, 7), lambda g, x: g.global_avgpool(x)),
    # BatchNormalization (inference form) and the pointwise operators
    "batchnorm": ((3, 6, 6), lambda g, x: g.batchnorm(g.conv(x, 4, 3, bias=False))),
    "batchnorm-epsilon": ((3, 6, 6), lambda g, x: g.batchnorm(g.conv(x, 4, 3), epsilon=0.1,
                                                              momentum=0.7)),
    "batchnorm-3d": ((2, 4, 5, 6), lambda g, x: g.batchnorm(g.conv(x, 3, 3, pads=[1] * 6))),
    "relu": ((3, 6, 6), lambda g, x: g.relu(g.conv(x, 4, 3))),
    "leakyrelu": ((3, 6, 6), lambda g, x: g.leakyrelu(g.conv(x, 4, 3), 0.2)),
    "leakyrelu-default-alpha": ((3, 6, 6), lambda g, x: g.leakyrelu(g.conv(x, 4, 3))),
    "tanh": ((3, 6, 6), lambda g, x: g.tanh(g.conv(x, 4, 3))),
    # Flatten and the reshapes that flatten
    "flatten-axis-minus-3": ((3, 6, 6), lambda g, x: g.gemm(g.flatten(g.conv(x, 4, 3), -3), 3)),
    "view-chain": ((3, 6, 6), lambda g, x: g.gemm(g.view(g.conv(x, 4, 3)), 3)),
    "view-chain-shape-start-end": ((3, 6, 6), lambda g, x: g.gemm(
        g.view(g.conv(x, 4, 3), shape_range=True), 3)),
    "reshape-0-minus-1": ((3, 6, 6), lambda g, x: g.gemm(g.reshape(g.conv(x, 4, 3), [0, -1]), 3)),
    "reshape-minus-1-features": ((3, 6, 6), lambda g, x: g.gemm(
        g.reshape(g.conv(x, 4, 3), [-1, 4 * 4 * 4]), 3)),
    # Gemm and MatMul, on images flattened and on a flat input
    "gemm-transb-1": ((3, 4, 4), lambda g, x: g.gemm(g.flatten(x), 3, trans_b=1)),
    "gemm-transb-0": ((3, 4, 4), lambda g, x: g.gemm(g.flatten(x), 3, trans_b=0)),
    "gemm-transb-default": ((3, 4, 4), lambda g, x: g.gemm(g.flatten(x), 3, trans_b=None)),
    "gemm-no-bias": ((3, 4, 4), lambda g, x: g.gemm(g.flatten(x), 3, bias=False)),
    "matmul-add": ((3, 4, 4), lambda g, x: g.matmul(g.flatten(x), 3)),
    "matmul-add-bias-first": ((3, 4, 4), lambda g, x: g.matmul(g.flatten(x), 3,
                                                               bias_first=True)),
    "matmul-alone": ((3, 4, 4), lambda g, x: g.matmul(g.flatten(x), 3, bias=False)),
    "mlp-flat-input": ((12,), lambda g, x: g.gemm(g.tanh(g.matmul(g.flatten(x), 8)), 3)),
    # merges: a residual Add, a Sum of three and of one, a Concat of branches
    "add-residual": ((3, 6, 6), lambda g, x: g.relu(g.add(g.conv(x, 3, 3, pads=[1] * 4), x))),
    "sum-of-three": ((3, 6, 6), lambda g, x: g.sum(g.conv(x, 3, 3, pads=[1] * 4), x, g.relu(x))),
    "sum-of-one": ((3, 6, 6), lambda g, x: g.sum(g.conv(x, 3, 3))),
    "concat-branches": ((3, 6, 6), lambda g, x: g.concat(
        g.conv(x, 3, 3, pads=[1] * 4), g.maxpool(x, 3, strides=[1, 1], pads=[1] * 4),
        g.conv(x, 2, 1))),
    "concat-axis-minus-3": ((3, 6, 6), lambda g, x: g.concat(g.conv(x, 3, 3, pads=[1] * 4), x,
                                                             axis=-3)),
    # Dropout (off in evaluation), Identity, Mul by a scalar constant
    "dropout-ratio": ((3, 6, 6), lambda g, x: g.dropout(g.conv(x, 3, 3), 0.3)),
    "dropout-no-ratio": ((3, 6, 6), lambda g, x: g.dropout(g.conv(x, 3, 3))),
    "identity": ((3, 6, 6), lambda g, x: g.conv(g.identity(x), 3, 3)),
    "mul-scalar": ((3, 6, 6), lambda g, x: g.mul(g.conv(x, 3, 3), 0.37)),
    "mul-constant-first-shape-1": ((3, 6, 6), lambda g, x: g.mul(g.conv(x, 3, 3), -1.5,
                                                                 shape=(1,), first=True)),
    "mul-constant-node": ((3, 6, 6), lambda g, x: g.mul(g.conv(x, 3, 3), 2.5,
                                                        shape=(1, 1, 1, 1), as_node=True)),
}


@pytest.mark.reference
@pytest.mark.parametrize("case", CASES)
def test_operator_matches_onnxruntime(tmp_path, case):
    """Each case's graph, with a classifier head where it has none, gives onnxruntime's logits;
    its input shape is the graph's."""
    shape, body = CASES[case]
    g = Graph(shape, seed=list(CASES).index(case))
    y = body(g, g.input)
    if len(g.shape(y)) > 1 or y == g.input:
        y = classify(g, y)
    imported = check_against_onnxruntime(tmp_path, g.model(y), what=case)
    assert imported.net.input_shape == tuple(shape)


def representative(opset: int, training: bool = False) -> tuple[Graph, str]:
    """conv → batchnorm → relu → maxpool (ceil) → conv + residual add → avgpool (padding not
    counted) → concat with a 1x1 conv → dropout → the view chain → gemm, at ``opset``; a
    training-mode batch norm and no dropout with ``training``. Returns the graph and its
    logits."""
    g = Graph((3, 12, 12), opset=opset, seed=opset)
    x = g.relu(g.batchnorm(g.conv(g.input, 4, 3, pads=[1] * 4, bias=False), training=training))
    x = g.maxpool(x, 3, strides=[2, 2], ceil_mode=1)
    x = g.add(g.conv(x, 4, 3, pads=[1] * 4), x)
    x = g.avgpool(x, 3, strides=[2, 2], pads=[1] * 4, count_include_pad=0)
    x = g.concat(x, g.conv(x, 2, 1))
    if not training:
        x = g.dropout(x, 0.25)
    return g, g.gemm(g.view(x), 5)


@pytest.mark.reference
@pytest.mark.parametrize("opset", [13, 17, 18, 21])
def test_representative_graph_at_each_opset(tmp_path, opset):
    g, y = representative(opset)
    imported = check_against_onnxruntime(tmp_path, g.model(y), what=f"opset {opset}")
    kinds = [layer.kind for layer in imported.net.layers]
    assert kinds == ["conv", "batchnorm", "relu", "maxpool", "conv", "add", "avgpool", "conv",
                     "concat", "dropout", "flatten", "linear"], kinds


@pytest.mark.reference
@pytest.mark.parametrize("opset", [14, 17])
def test_training_mode_batchnorm_matches_onnxruntime(tmp_path, opset):
    """BatchNormalization with training_mode=1 and its three outputs: in training, hpctrain's
    forward (batch statistics) gives onnxruntime's output, and the running mean it updates is
    the one onnxruntime returns, ONNX's momentum m being PyTorch's 1 - m."""
    g, y = representative(opset, training=True)
    bn = next(n for n in g.nodes if n.op_type == "BatchNormalization")
    imported = check_against_onnxruntime(tmp_path, g.model(y), training=True,
                                         what=f"training mode, opset {opset}")
    layer = next(layer for layer in imported.net.layers if layer.kind == "batchnorm")
    assert layer.options.momentum == pytest.approx(0.1)  # ONNX's default momentum is 0.9
    # the running mean after one training forward, against onnxruntime's second output (a
    # model that returns it; the importer refuses a graph of two outputs)
    x = sample(imported.net.input_shape)
    _, buffers = hpctrain_forward(imported.net, x, training=True)
    want = onnxruntime_outputs(g.model(y, extra_outputs=[bn.output[1]]), x)[1]
    start = imported.weights[f"{layer.name}.running_mean"]
    got = buffers[f"{layer.name}.running_mean"]
    assert np.abs(want - start).max() > 1e-3, "the running mean did not move: nothing compared"
    assert relative_error(got, want) <= TOLERANCE, (got, want)


@pytest.mark.reference
def test_running_statistics_matter(tmp_path):
    """The seeded running statistics differ from a batch's: evaluation (which the comparisons
    run) and training give different logits, so a mapping that drops them would show."""
    g = Graph((3, 6, 6))
    path = save(g.model(classify(g, g.relu(g.batchnorm(g.conv(g.input, 4, 3))))),
                tmp_path / "bn.onnx")
    imported = import_onnx(path)
    x = sample(imported.net.input_shape)
    evaluation, _ = hpctrain_forward(imported.net, x, training=False)
    training, _ = hpctrain_forward(imported.net, x, training=True)
    assert relative_error(training, evaluation) > 1e-2


@pytest.mark.reference
def test_static_batch_axis(tmp_path):
    """A graph whose batch axis is a number (exported without dynamic axes), its flatten the
    constant-folded Reshape (4, -1), imports; hpctrain's net takes any batch."""
    g = Graph((3, 6, 6), batch=4)
    y = g.gemm(g.reshape(g.relu(g.conv(g.input, 4, 3)), [4, -1]), CLASSES)
    imported = check_against_onnxruntime(tmp_path, g.model(y), batch=4)
    assert imported.net.input_shape == (3, 6, 6)
    assert [layer.kind for layer in imported.net.layers] == ["conv", "relu", "flatten", "linear"]


# -- shapes: the graph's, or --image-size -------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 9, 7), (2, 5, 6, 7), (12,)])
def test_input_shape_and_classes_come_from_the_graph(tmp_path, shape):
    g = Graph(shape)
    y = g.gemm(g.flatten(g.input), 7)
    imported = import_onnx(save(g.model(y), tmp_path / "m.onnx"))
    assert imported.net.input_shape == shape
    assert imported.net.classes == 7


def dynamic_size_graph(tmp_path):
    """A graph whose height and width are dim_params: conv, global pooling, a Gemm."""
    g = Graph((3, "H", "W"))
    model = g.model(classify(g, g.global_avgpool(g.relu(g.conv(g.input, 4, 3, pads=[1] * 4)))))
    return model, save(model, tmp_path / "dynamic.onnx")


def test_dynamic_image_size_is_refused_without_image_size(tmp_path):
    _, path = dynamic_size_graph(tmp_path)
    refused(path, "'input'", "H, W", "--image-size")


@pytest.mark.reference
def test_image_size_gives_a_dynamic_graph_its_size(tmp_path):
    model, _ = dynamic_size_graph(tmp_path)
    imported = check_against_onnxruntime(tmp_path, model, image_size=10)
    assert imported.net.input_shape == (3, 10, 10)


def test_image_size_overrides_a_static_size_and_not_a_flat_input(tmp_path):
    g = Graph((3, 8, 8))
    path = save(g.model(classify(g, g.global_avgpool(g.conv(g.input, 4, 3)))), tmp_path / "a.onnx")
    assert import_onnx(path, image_size=12).net.input_shape == (3, 12, 12)
    g = Graph((12,))
    path = save(g.model(g.gemm(g.input, CLASSES)), tmp_path / "flat.onnx")
    with pytest.raises(NetError, match="--image-size 12 does not apply"):
        import_onnx(path, image_size=12)


def test_ceil_mode_cases_add_a_window(tmp_path):
    """The ceil_mode cases above are ones where rounding up adds an output row and column, so
    the comparisons check the option and not only its absence."""
    sizes = {}
    for case in ("maxpool-ceil-0", "maxpool-ceil-1", "maxpool-ceil-1-padded"):
        shape, body = CASES[case]
        g = Graph(shape)
        net = import_onnx(save(g.model(classify(g, body(g, g.input))), tmp_path / "p.onnx")).net
        sizes[case] = net.out_shapes[0][1:]
    assert sizes["maxpool-ceil-1"] == tuple(n + 1 for n in sizes["maxpool-ceil-0"])
    g = Graph(CASES["maxpool-ceil-1-padded"][0])
    floor = g.maxpool(g.input, 3, strides=[2, 2], pads=[1] * 4)
    assert sizes["maxpool-ceil-1-padded"] == tuple(n + 1 for n in g.shape(floor)[1:])


@pytest.mark.reference
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_ceil_window_starting_in_the_padding(tmp_path, op):
    """Size 11, kernel 2, stride 2, padding 1, ceil_mode 1: the last window would start in the
    padding after the input. PyTorch and onnxruntime drop it (6 windows), as hpctrain does;
    ONNX's shape inference (the opset <= 21 text) counts it (7): the import takes
    onnxruntime's count, and computes what onnxruntime computes."""
    g = Graph((2, 11, 11))
    pool = g.node(op, [g.input], name="pool", kernel_shape=[2, 2], strides=[2, 2],
                  pads=[1] * 4, ceil_mode=1)
    theirs = onnxruntime_outputs(g.model(pool), sample((2, 11, 11)))[0]
    model = g.model(classify(g, g.global_avgpool(pool)))
    imported = check_against_onnxruntime(tmp_path, model, what=f"{op} ceil_mode 1")
    assert theirs.shape == (BATCH, *imported.net.out_shapes[0]) == (BATCH, 2, 6, 6)


# -- names, weights, options ----------------------------------------------------------------


def test_layer_names_from_weights_and_node_scopes(tmp_path):
    """A weight's module names its layer (``layer2.0.conv1.weight`` → ``layer2.0.conv1``), an
    anonymous weight's node scope names it, a weightless node its scope (a function called
    inside a module gets the operation's short name), a numbered node (``Relu_7``) the short
    name, repeats numbered ``_1``, ``_2``, and no layer is called ``input``."""
    g = Graph((3, 6, 6))
    x = g.conv(g.input, 4, 3, pads=[1] * 4, module="layer2.0.conv1",
               name="/layer2/layer2.0/conv1/Conv")
    x = g.batchnorm(x, module="layer2.0.bn1", name="/layer2/layer2.0/bn1/BatchNormalization")
    x = g.relu(x, name="/layer2/layer2.0/relu/Relu")
    x = g.add(x, g.conv(g.input, 4, 1, module="onnx::Conv_17",
                        name="/layer2/layer2.0/downsample/downsample.0/Conv"),
              name="/layer2/layer2.0/Add")
    x = g.relu(x, name="/layer2/layer2.0/relu_1/Relu")
    x = g.relu(g.relu(g.relu(x, name="Relu_7"), name="Relu_9"), name="Relu")
    x = g.conv(x, 4, 1, module="input")
    x = g.conv(x, 4, 1, module="layer3.conv", bias=False)
    x = g.conv(x, 4, 1, module="onnx::Conv_30", name="/layer3/conv/Conv", bias=False)
    y = g.gemm(g.flatten(g.global_avgpool(x, name="/avgpool/GlobalAveragePool"),
                         name="/Flatten"), CLASSES, module="fc")
    imported = import_onnx(save(g.model(y), tmp_path / "names.onnx"))
    names = [layer.name for layer in imported.net.layers]
    assert names == ["layer2.0.conv1", "layer2.0.bn1", "layer2.0.relu",
                     "layer2.0.downsample.0", "layer2.0.add", "layer2.0.relu_1",
                     "relu", "relu_1", "relu_2", "input_1", "layer3.conv", "layer3.conv_1",
                     "avgpool", "flatten", "fc"], names
    assert imported.net.layers[4].inputs == ("layer2.0.relu", "layer2.0.downsample.0")


def test_weights_are_the_initializers_under_hpctrain_names(tmp_path):
    """Conv and Gemm weights and biases as they are; batch norm's scale, shift and statistics
    as gamma, beta, running_mean, running_var; a Gemm's (in, out) weight of transB=0 and a
    MatMul's transposed; nothing else."""
    g = Graph((3, 6, 6))
    x = g.batchnorm(g.conv(g.input, 4, 3, module="conv1"), module="bn1")
    x = g.gemm(g.flatten(g.global_avgpool(x)), 6, trans_b=0, module="fc1")
    x = g.gemm(g.relu(x), 5, trans_b=1, bias=False, module="fc2")
    y = g.matmul(x, CLASSES, module="fc3")
    model = g.model(y)
    file = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    imported = import_onnx(save(model, tmp_path / "w.onnx"))
    want = {"conv1.weight": file["conv1.weight"], "conv1.bias": file["conv1.bias"],
            "bn1.gamma": file["bn1.weight"], "bn1.beta": file["bn1.bias"],
            "bn1.running_mean": file["bn1.running_mean"],
            "bn1.running_var": file["bn1.running_var"],
            "fc1.weight": file["fc1.weight"].T, "fc1.bias": file["fc1.bias"],
            "fc2.weight": file["fc2.weight"],
            "fc3.weight": file["fc3.weight"].T, "fc3.bias": file["fc3.bias"]}
    assert sorted(imported.weights) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(imported.weights[name], value, err_msg=name)
    assert file["fc1.weight"].shape == (4, 6)  # (in, out): the transpose is not a no-op
    shapes = {**imported.net.param_shapes(), **imported.net.buffer_shapes()}
    assert {name: tuple(v.shape) for name, v in imported.weights.items()} == shapes


def test_options_read_from_attributes_and_inputs(tmp_path):
    """What evaluation does not show: batch norm's epsilon and momentum (ONNX's m is PyTorch's
    1 - m), dropout's ratio input; and the slope, factor, windows and pads as given."""
    g = Graph((3, 9, 9))
    x = g.batchnorm(g.conv(g.input, 4, (3, 2), strides=[2, 1], pads=[0, 1, 2, 1]),
                    epsilon=1e-3, momentum=0.7)
    x = g.leakyrelu(g.mul(x, 0.3), 0.2)
    x = g.maxpool(x, 2, strides=[1, 2], ceil_mode=1)
    x = g.avgpool(x, 3, pads=[1, 0, 1, 0], count_include_pad=0)
    y = classify(g, g.dropout(x, 0.35))
    layers = {layer.kind: layer.options
              for layer in import_onnx(save(g.model(y), tmp_path / "o.onnx")).net.layers}
    assert (layers["batchnorm"].eps, layers["batchnorm"].momentum) == (1e-3, 0.3)
    assert layers["dropout"].p == 0.35
    assert layers["leakyrelu"].slope == 0.2
    assert layers["scale"].factor == 0.3
    assert (layers["conv"].kernel, layers["conv"].stride) == ((3, 2), (2, 1))
    assert layers["conv"].pad == ((0, 2), (1, 1))
    assert (layers["maxpool"].kernel, layers["maxpool"].stride) == ((2, 2), (1, 2))
    assert layers["maxpool"].ceil is True
    assert layers["avgpool"].pad == ((1, 1), (0, 0)) and layers["avgpool"].count_pad is False


def test_loss_from_argument_or_metadata(tmp_path):
    g = Graph((5,))
    y = g.gemm(g.input, 2)
    plain = save(g.model(y), tmp_path / "plain.onnx")
    marked = save(g.model(y, metadata={LOSS_KEY: MSE}), tmp_path / "marked.onnx")
    net = import_onnx(plain).net
    assert (net.regression, net.loss_given) == (False, False)
    net = import_onnx(plain, regression=True).net
    assert (net.regression, net.loss_given) == (True, True)
    net = import_onnx(marked).net
    assert (net.regression, net.loss_given) == (True, True)


def test_module_path_of_torch_node_names():
    assert module_path("/layer1/layer1.0/relu_1/Relu", "Relu") == "layer1.0.relu_1"
    assert module_path("/layer2/layer2.0/downsample/downsample.0/Conv", "Conv") == \
        "layer2.0.downsample.0"
    assert module_path("/features/features.0/Conv", "Conv") == "features.0"
    assert module_path("/Mixed_5b/branch1x1/conv/Conv", "Conv") == "Mixed_5b.branch1x1.conv"
    assert module_path("/layer1/layer1.0/Add", "Add") == "layer1.0"
    for top in ("/Flatten", "Flatten", "Flatten_12", "Relu_3"):
        assert module_path(top, top.strip("/").split("_")[0]) == "", top
    assert module_path("my_block.relu", "Relu") == "my_block.relu"  # a hand-made name


def test_safe_name_of_torch_style_names():
    assert safe_name("onnx::Conv_12") == "onnx__Conv_12"
    assert safe_name("/layer1/layer1.0/Add") == "_layer1_layer1.0_Add"
    assert safe_name("..a..b.") == "a.b"
    assert safe_name("-x") == "_-x"  # a name starts with a letter, digit or '_'
    assert safe_name("a b:c") == "a_b_c"
    assert len(safe_name("x" * 300)) == MAX_NAME
    assert safe_name("x" * (MAX_NAME - 1) + ".y") == "x" * (MAX_NAME - 1)  # no trailing '.'


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_safe_name_is_always_a_layer_name(text):
    name = safe_name(text)
    assert name == "" or (LAYER_NAME.fullmatch(name) and len(name) <= MAX_NAME), name


def test_names_cut_to_the_limit_are_numbered_within_it(tmp_path):
    g = Graph((3, 6, 6))
    x = g.conv(g.input, 3, 3, module="a" * 260)
    x = g.conv(x, 3, 1, module="a" * 260 + "b")
    imported = import_onnx(save(g.model(classify(g, x)), tmp_path / "long.onnx"))
    names = [layer.name for layer in imported.net.layers[:2]]
    assert len(set(names)) == 2 and all(len(n) <= MAX_NAME for n in names), names


# -- refusals -------------------------------------------------------------------------------


def test_every_unknown_node_is_listed_in_one_line(tmp_path):
    """Softmax and Erf, and a Mul beside them by a gate that is not one per channel: all three
    named, by operator type and node name; the nodes after a refused one (the Add) are not."""
    g = Graph((4, 6, 6))
    a = g.node("Mul", [g.input, g.avgpool(g.input, [1, 6])], name="gated")
    b = g.op("Erf", g.input, name="erf")
    y = g.op("Softmax", classify(g, g.add(a, b)), name="probabilities")
    message = refused(save(g.model(y), tmp_path / "u.onnx"), "3 node(s)", "Mul 'gated'",
                      "a product of shapes (4, 6, 6) and (4, 6, 1)", "Erf 'erf'",
                      "Softmax 'probabilities'")
    assert "Add" not in message.split("Supported:")[0]


def refusal_graph(case: str) -> tuple[Graph, str]:
    """A graph with one node the importer cannot map, that node named ``bad``, and its
    logits."""
    g = Graph((4, 8, 8))
    x = g.input
    if case == "hardsigmoid-not-pytorchs":
        x = g.op("HardSigmoid", x, alpha=0.2, name="bad")
    elif case == "clip-open-above":
        x = g.node("Clip", [x, g.constant("low", np.array(0.0, np.float32))], name="bad")
    elif case == "resize-cubic":
        x = g.node("Resize", [x, "", g.constant("scales", np.array([1, 1, 2, 2], np.float32))],
                   mode="cubic", name="bad")
    elif case == "reduce-mean-over-channels":
        x = g.node("ReduceMean", [x], axes=[1], name="bad")
    elif case == "conv-same-stride-2":
        x = g.conv(x, 4, 3, strides=[2, 2], auto_pad="SAME_UPPER", name="bad")
    elif case == "avgpool-ceil-adds-a-window":
        x = g.avgpool(x, 3, strides=[2, 2], ceil_mode=1, name="bad")
    elif case == "concat-axis-2":
        x = g.concat(x, x, axis=2, name="bad")
    elif case == "flatten-axis-2":
        return g, g.gemm(g.flatten(x, 2, name="bad"), CLASSES)
    elif case == "reshape-not-a-flatten":
        return g, classify(g, g.reshape(x, [0, 4, -1], name="bad"))
    elif case == "add-of-a-constant":
        x = g.add(x, g.constant("shift", np.ones((4, 1, 1), np.float32)), name="bad")
    elif case == "mul-by-a-tensor":
        x = g.node("Mul", [x, g.random("factors", [4, 8, 1])], name="bad")
    elif case == "mul-broadcast-along-rows":
        x = g.node("Mul", [x, g.avgpool(x, [1, 8])], name="bad")
    elif case == "gemm-alpha-2":
        return g, g.gemm(g.flatten(x), CLASSES, alpha=2.0, name="bad")
    elif case in ("deconv-output-shape", "deconv-auto-pad"):
        extra = ({"output_shape": [16, 16]} if case == "deconv-output-shape"
                 else {"auto_pad": "SAME_UPPER"})
        x = g.node("ConvTranspose", [x, g.random("deconv.weight", [4, 4, 3, 3])], name="bad",
                   strides=[2, 2], **extra)
    return g, classify(g, x)


REFUSALS = {
    "hardsigmoid-not-pytorchs": ("HardSigmoid", "alpha 0.2, beta 0.5"),
    "clip-open-above": ("Clip", "an open bound"),
    "resize-cubic": ("Resize", "mode cubic"),
    "reduce-mean-over-channels": ("ReduceMean", "a mean over axes [1]"),
    "conv-same-stride-2": ("Conv", "auto_pad SAME_UPPER with stride [2, 2]"),
    "avgpool-ceil-adds-a-window": ("AveragePool", "ceil_mode 1 that adds windows"),
    "concat-axis-2": ("Concat", "axis 2"),
    "flatten-axis-2": ("Flatten", "axis 2"),
    "reshape-not-a-flatten": ("Reshape", "a reshape to (0, 4, -1), not to (N, -1)"),
    "add-of-a-constant": ("Add", "constant"),
    "mul-by-a-tensor": ("Mul", "not a scalar nor one value per channel, (4, 1, 1)"),
    "mul-broadcast-along-rows": ("Mul", "a product of shapes (4, 8, 8) and (4, 8, 1)"),
    "gemm-alpha-2": ("Gemm", "alpha 2.0"),
    "deconv-output-shape": ("ConvTranspose", "output_shape; export the layer with output_padding"),
    "deconv-auto-pad": ("ConvTranspose", "auto_pad SAME_UPPER"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_unsupported_node_is_refused_by_type_name_and_reason(tmp_path, case):
    op, why = REFUSALS[case]
    g, y = refusal_graph(case)
    refused(save(g.model(y), tmp_path / f"{case}.onnx"), "1 node(s)", f"{op} 'bad' (", why)


def test_two_inputs_are_refused(tmp_path):
    g = Graph((3, 4, 4))
    other = g.add_input("mask", ["N", 3, 4, 4])
    y = classify(g, g.add(g.input, other))
    refused(save(g.model(y), tmp_path / "two.onnx"), "2 inputs", "input, mask")


def test_two_outputs_are_refused(tmp_path):
    g = Graph((3, 4, 4))
    y = classify(g, g.relu(g.input))
    aux = g.gemm(g.flatten(g.input), 2)
    refused(save(g.model(y, extra_outputs=[aux]), tmp_path / "two.onnx"), "2 outputs")


def test_an_input_of_three_axes_is_refused(tmp_path):
    g = Graph((3, 16))
    refused(save(g.model(g.relu(g.input)), tmp_path / "1d.onnx"), "'input' has 3 axes")


@pytest.mark.parametrize("opset", [12, 22])
def test_opsets_outside_13_to_21_are_refused(tmp_path, opset):
    g = Graph((3, 6, 6), opset=opset)
    y = classify(g, g.global_avgpool(g.relu(g.conv(g.input, 4, 3))))
    refused(save(g.model(y), tmp_path / "o.onnx"), f"opset {opset}", "13 to 21")


def test_opsets_13_and_21_are_read(tmp_path):
    for opset in (13, 21):
        g = Graph((3, 6, 6), opset=opset)
        y = classify(g, g.global_avgpool(g.relu(g.conv(g.input, 4, 3))))
        net = import_onnx(save(g.model(y), tmp_path / "o.onnx")).net
        assert [layer.kind for layer in net.layers] == ["conv", "relu", "avgpool", "flatten",
                                                        "linear"]


def file_content(content: str) -> bytes:
    if content == "random-bytes":
        return np.random.default_rng(0).bytes(2000)
    if content == "empty":
        return b""
    g = Graph((3, 6, 6))
    whole = g.model(classify(g, g.relu(g.conv(g.input, 4, 3)))).SerializeToString()
    return whole[:len(whole) // 2]  # truncated


@pytest.mark.parametrize("content", ["random-bytes", "empty", "truncated"])
def test_a_malformed_file_is_refused(tmp_path, content):
    data = file_content(content)
    path = tmp_path / f"{content}.onnx"
    path.write_bytes(data)
    refused(path, "not a valid ONNX model", "export it again")


def test_a_missing_file_is_refused(tmp_path):
    refused(tmp_path / "absent.onnx", "no such file")


def test_a_reshape_of_a_constant_batch_on_a_dynamic_batch_is_refused(tmp_path):
    g = Graph((4, 2, 2))
    y = g.reshape(g.relu(g.input), [2, -1], name="bad")
    refused(save(g.model(y), tmp_path / "r.onnx"), "Reshape 'bad'")
