"""The layers of mobile, grouped and segmentation nets on one process: grouped, depthwise and
dilated convolution, the gates and clipped units (sigmoid, silu, hardsigmoid, hardswish, relu6,
clip), the gate's product (``mul``), resizing (``upsample``), GELU and layer norm over the
channels, each kernel against PyTorch's (forward and every gradient, float64, 1e-12); their
net-file keys, refusals and text; their prices; ONNX in and out; the shipped ``mobilenet_v2``
and ``resnext50`` against torchvision's; and torchvision's mobile and grouped models imported
from ONNX with their weights, against onnxruntime.

The distributed runs of the same layers, every mode against one process, are in
``tests/mpi/test_mobile_layers.py``.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from hpctrain.cost.work import LocalWork
from hpctrain.kernels import activations
from hpctrain.kernels.conv import conv_backward, conv_forward
from hpctrain.layout.layout import Layout, Split
from hpctrain.layout.partition import SplitError, Window
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import NetError, parse_net
from hpctrain.model.net_text import net_text

TOLERANCE = 1e-12


def net_of(body: str, size: int = 16, channels: int = 8):
    return parse_net(f"input channels={channels} size={size} classes=3\n{body}\n"
                     f"avgpool kernel=global\nflatten\nlinear out=3\n", "test.net")


# -- kernels against PyTorch -----------------------------------------------------------------

CONV_CASES = [  # (channels, outputs, groups): plain, grouped, depthwise, depthwise × 2
    (4, 6, 1), (4, 6, 2), (6, 6, 6), (4, 8, 4), (6, 12, 6)]


@pytest.mark.reference
@pytest.mark.parametrize("axes", [1, 2, 3])
def test_grouped_and_dilated_convolution_equals_pytorchs(axes):
    """Every case of channels, groups, kernel, stride, dilation and order of the windows, on
    1-, 2- and 3-D inputs with uneven padding: Y, dX, dW and db as PyTorch gives them."""
    torch = pytest.importorskip("torch")
    functional = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d,
                  3: torch.nn.functional.conv3d}[axes]
    rng = np.random.default_rng(axes)
    for (c, o, g), k, s, d, last in itertools.product(CONV_CASES, (1, 3), (1, 2), (1, 2),
                                                       (None, True, False)):
        size = (7, 9, 6)[:axes]
        x = rng.standard_normal((2, c, *size))
        w = rng.standard_normal((o, c // g, *(k,) * axes))
        b = rng.standard_normal(o)
        pads = tuple((1, 2) for _ in range(axes))
        y, cache = conv_forward(np, x, w, b, (s,) * axes, pads, last, (d,) * axes, g)
        dy = rng.standard_normal(y.shape)
        dx, dw, db = conv_backward(np, dy, w, cache, (s,) * axes)
        tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (x, w, b))
        padded = torch.nn.functional.pad(tx, [p for pair in reversed(pads) for p in pair])
        ty = functional(padded, tw, tb, stride=s, dilation=d, groups=g)
        ty.backward(torch.tensor(dy))
        case = f"C={c} O={o} G={g} k={k} s={s} d={d} channels_last={last}"
        for name, got, want in (("Y", y, ty), ("dX", dx, tx.grad), ("dW", dw, tw.grad),
                                ("db", db, tb.grad)):
            want = want.detach().numpy()
            assert got.shape == want.shape, f"{case}: {name} shape"
            error = np.abs(got - want).max() / np.abs(want).max()
            assert error < TOLERANCE, f"{case}: {name} off by {error:.1e}"


def test_a_weight_that_does_not_fit_its_groups_is_refused():
    with pytest.raises(ValueError, match="groups"):
        conv_forward(np, np.ones((1, 4, 5, 5)), np.ones((6, 3, 3, 3)), None, (1, 1),
                     ((0, 0), (0, 0)), groups=2)


@pytest.mark.reference
@pytest.mark.parametrize("kind,reads", [("sigmoid", "y"), ("silu", "x"), ("hardsigmoid", "y"),
                                        ("hardswish", "x"), ("relu6", "y"), ("clip", "y")])
def test_each_activation_and_its_derivative_equal_pytorchs(kind, reads):
    """On a grid through every kink (±3, 0, 6 and the clip's bounds) and beyond, f and dX as
    PyTorch's; the derivative read from Y or from X as the layer keeps it."""
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    reference = {"sigmoid": torch.sigmoid, "silu": functional.silu,
                 "hardsigmoid": functional.hardsigmoid, "hardswish": functional.hardswish,
                 "relu6": functional.relu6,
                 "clip": lambda t: functional.hardtanh(t, -0.5, 0.75)}[kind]
    options = KINDS[kind].parse({"min": "-0.5", "max": "0.75"} if kind == "clip" else {},
                                "test")
    forward, derivative = KINDS[kind].functions(options)
    x = np.concatenate([np.linspace(-9, 9, 1801), [-3.0, 3.0, 0.0, 6.0, -0.5, 0.75, -40.0,
                                                   40.0]])
    dy = np.random.default_rng(0).standard_normal(x.shape)
    tx = torch.tensor(x, requires_grad=True)
    ty = reference(tx)
    ty.backward(torch.tensor(dy))
    y = forward(np, x)
    dx = derivative(np, y if reads == "y" else x, dy)
    assert np.abs(y - ty.detach().numpy()).max() < TOLERANCE
    # PyTorch's hardsigmoid scales by a float32 1/6 even in float64
    assert np.abs(dx - tx.grad.numpy()).max() < (1e-7 if kind == "hardsigmoid" else TOLERANCE)


def test_gelu_keeps_a_16_bit_dtype():
    """SciPy's erf has no 16-bit loop: GELU computes in float32 and gives back X's dtype."""
    import ml_dtypes

    forward, derivative = KINDS["gelu"].functions(None)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        x = np.linspace(-3, 3, 13).astype(dtype)
        assert forward(np, x).dtype == dtype and derivative(np, x, x).dtype == dtype
        want = 0.5 * x.astype(np.float64) * (1 + np.tanh(0.7978845608 * (
            x.astype(np.float64) + 0.044715 * x.astype(np.float64) ** 3)))
        assert np.abs(forward(np, x).astype(np.float64) - want).max() < 2e-2


def test_sigmoid_of_large_inputs_is_exact_and_quiet():
    """(1 + tanh(x/2))/2 overflows nowhere: no warning, 0 and 1 at the ends."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = activations.sigmoid_forward(np, np.array([-1000.0, 0.0, 1000.0], np.float32))
    assert y.tolist() == [0.0, 0.5, 1.0]


@pytest.mark.reference
def test_the_gate_product_and_its_gradients_equal_pytorchs():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    a, g = rng.standard_normal((2, 5, 4, 3)), rng.standard_normal((2, 5, 1, 1))
    dy = rng.standard_normal(a.shape)
    ta, tg = torch.tensor(a, requires_grad=True), torch.tensor(g, requires_grad=True)
    (ta * tg).backward(torch.tensor(dy))
    da, dg = activations.gate_backward(np, dy, a, g)
    assert np.abs(da - ta.grad.numpy()).max() < TOLERANCE
    assert np.abs(dg - tg.grad.numpy()).max() < TOLERANCE


# -- the net file -------------------------------------------------------------------------------


def test_groups_and_dilation_shape_a_convolution():
    net = net_of("conv name=dw out=8 kernel=3 pad=2 dilation=2 groups=8\n"
                 "conv name=g out=12 kernel=3 stride=2 pad=1 groups=4\n"
                 "conv name=d out=4 kernel=3 pad=2+1x3 dilation=2x3\nsilu")
    shapes = dict(zip([layer.name for layer in net.layers], net.out_shapes, strict=True))
    assert shapes["dw"] == (8, 16, 16)
    assert shapes["g"] == (12, 8, 8)
    # height 8 + 2 + 1 − (2·2 + 1) + 1 = 7, width 8 + 6 − (3·2 + 1) + 1 = 8
    assert shapes["d"] == (4, 7, 8)
    params = net.param_shapes()
    assert params["dw.weight"] == (8, 1, 3, 3)
    # pad=same pads the dilated span: 2·(3 − 1) zeros along each axis
    same = net_of("conv name=s out=8 kernel=3 pad=same dilation=2")
    assert same.out_shapes[0] == (8, 16, 16)
    assert same.layers[0].options.pad == ((2, 2), (2, 2))
    assert params["g.weight"] == (12, 2, 3, 3)


@pytest.mark.parametrize("line,fragment", [
    ("conv out=8 kernel=3 groups=3", "groups=3 must divide its 8 input and 8 output channels"),
    ("conv out=6 kernel=3 groups=4", "groups=4 must divide"),
    ("conv out=8 kernel=3 groups=0", "groups=0 must be a positive integer"),
    ("conv out=8 kernel=3 dilation=0", "dilation"),
    ("conv out=8 kernel=3 dilation=2x2x2", "dilation for 3 axes"),
    ("conv out=8 kernel=5 dilation=4", "too small for its window"),
    ("clip min=1 max=1", "min must be below max"),
    ("clip max=6", "clip needs min="),
    ("relu6 max=6", "relu6 takes no 'max'"),
    ("mul in=input,input,input", "multiplies two inputs, not 3"),
])
def test_a_bad_layer_is_refused_in_one_line(line, fragment):
    with pytest.raises(NetError) as caught:
        net_of(line, size=8)
    assert "\n" not in str(caught.value)
    assert fragment in str(caught.value)


def test_a_gate_of_another_shape_is_refused():
    with pytest.raises(NetError, match=r"one value per channel, \(8, 1, 1\)"):
        net_of("conv name=a out=8 kernel=1\navgpool name=p kernel=2\nmul in=a,p")


def test_a_net_of_the_new_kinds_reads_back_from_its_text():
    net = net_of("conv name=dw out=8 kernel=3 pad=2 dilation=2 groups=8 bias=0\nrelu6\n"
                 "conv name=pw out=8 kernel=1\nhardswish\navgpool name=p kernel=global\n"
                 "conv name=fc1 in=p out=4 kernel=1\nsilu\nconv name=fc2 out=8 kernel=1\n"
                 "hardsigmoid\nmul in=hardswish1,hardsigmoid1\nsigmoid\nclip min=-0.5 max=0.75\n"
                 "conv out=8 kernel=3 pad=1")
    text = net_text(net)
    assert "groups=8" in text and "dilation=2x2" in text
    assert "groups=1" not in text and "dilation=1" not in text  # plain lines as they were
    assert parse_net(text, "again.net").layers == net.layers


# -- layouts and prices -------------------------------------------------------------------------


def conv_layouts(body: str, split: Split, batch: int = 4):
    net = net_of(body)
    k = 0
    spec = net.layers[k]
    kind = KINDS[spec.kind]
    fed = (Layout((batch, *net.in_shapes(k)[0]), (1, 1)),)
    inputs, output = kind.layouts(spec, fed, (batch, *net.out_shapes[k]), split)
    return spec, kind, inputs, output


def test_a_model_split_of_a_grouped_convolution_cuts_its_input_with_its_groups():
    """Each of 4 ranks computes 2 of 8 depthwise channels from its own 2 input channels: the
    input is cut as the output is, not replicated, and nothing is summed."""
    spec, kind, (x,), y = conv_layouts("conv out=8 kernel=3 pad=1 groups=8",
                                       Split((1, 4, 1, 1)))
    kind.check(spec, (x,), y)
    assert x.parts[1] == 4 and x.replicas == 1
    assert kind.input_split(spec, (x,), y) is None
    work = kind.work(spec, (x,), y, True)
    assert (work.x[1], work.out, work.groups) == (2, 2, 2)
    dense = net_of("conv out=8 kernel=3 pad=1").layers[0]
    _, _, (xd,), yd = conv_layouts("conv out=8 kernel=3 pad=1", Split((1, 1, 1, 1)))
    assert kind.flops(work)[0] * 8 * 4 == pytest.approx(
        kind.flops(kind.work(dense, (xd,), yd, True))[0])
    assert kind.local_parameters(spec, (x,), y) == 2 * (9 + 1)


@pytest.mark.parametrize("split,fragment", [
    (Split((1, 3, 1, 1)), "its 4 groups cannot be cut into 3 blocks of whole groups"),
    (Split((1, 1, 1, 1), inputs=2), "never on their own"),
])
def test_splits_a_grouped_convolution_cannot_take_are_refused(split, fragment):
    spec, kind, inputs, output = conv_layouts("conv out=12 kernel=3 pad=1 groups=4", split)
    with pytest.raises(SplitError, match=fragment):
        kind.check(spec, inputs, output)


def test_a_plain_convolution_keeps_its_timing_key():
    """groups and dilation enter a work's key only where they are not 1: the timings a
    machine profile holds for plain convolutions stay valid."""
    op = KINDS["conv"]
    plain = LocalWork(op, (2, 3, 8, 8), 4, (3, 3), (1, 1), ((1, 1), (1, 1)))
    assert plain.key() == "conv|(2, 3, 8, 8)|4|(3, 3)|(1, 1)|((1, 1), (1, 1))|True"
    dilated = LocalWork(op, (2, 4, 8, 8), 4, (3, 3), (1, 1), ((2, 2), (2, 2)), groups=4,
                        dilation=(2, 2))
    assert dilated.key().endswith("|groups 4|dilation (2, 2)")
    assert dilated.out_sizes() == (8, 8)


def test_a_dilated_window_spans_and_halos_its_taps():
    window = Window(3, 1, 2, 2, dilation=2)
    assert window.span == 5 and window.out_size(8) == 8
    assert window.rows_needed(2, 4) == (0, 6)  # rows 0, 2, 4 … 2·3 − 2 + 4
    assert str(window) == "3/1/2 dilated 2"


# -- torchvision's models from ONNX --------------------------------------------------------------

TORCHVISION_MODELS = ["mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "mnasnet0_5",
                      "resnext50_32x4d", "regnet_y_400mf"]


@pytest.mark.reference
@pytest.mark.parametrize("name", TORCHVISION_MODELS)
def test_torchvisions_mobile_and_grouped_models_import_with_their_weights(name, tmp_path):
    """The model exported as the docs say (opset 17, training-preserving) imports with no
    refusal and computes in hpctrain (float64, one process, evaluation) what onnxruntime
    computes from the same file, to 1e-5."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    pytest.importorskip("onnx")
    from hpctrain.interchange.onnx_import import import_onnx
    from tests.test_interchange import randomise_statistics, run_onnx, to_onnx
    from tests.test_onnx_import import hpctrain_forward

    torch.manual_seed(0)
    model = randomise_statistics(getattr(torchvision.models, name)(num_classes=7))
    path = to_onnx(model, torch.randn(2, 3, 32, 32), tmp_path / f"{name}.onnx")
    imported = import_onnx(path)
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32))
    got, _ = hpctrain_forward(imported.net, x)
    want = run_onnx(path, x.astype(np.float32))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    kinds = {layer.kind for layer in imported.net.layers}
    expected = {"mobilenet_v2": {"relu6"}, "mobilenet_v3_small": {"hardswish", "hardsigmoid",
                                                                   "mul"},
                "efficientnet_b0": {"silu", "sigmoid", "mul"}, "mnasnet0_5": {"relu"},
                "resnext50_32x4d": {"relu"}, "regnet_y_400mf": {"sigmoid", "mul"}}[name]
    assert expected <= kinds
    assert any(layer.kind == "conv" and layer.options.groups > 1
               for layer in imported.net.layers)


@pytest.mark.reference
def test_a_net_of_the_new_kinds_exports_to_onnx_and_back(tmp_path):
    """``model_proto`` writes every new kind (groups and dilation kept) so that onnxruntime
    computes what hpctrain computes, and importing the file gives the same layers back."""
    pytest.importorskip("onnx")
    from hpctrain.interchange.onnx_export import model_proto
    from hpctrain.interchange.onnx_import import import_onnx
    from tests.test_interchange import random_tensors, run_onnx
    from tests.test_onnx_import import hpctrain_forward
    from tests.torch_reference import MOBILE_NET

    net = parse_net(MOBILE_NET, "mobile")
    path = tmp_path / "mobile.onnx"
    path.write_bytes(model_proto(net, random_tensors(net)).SerializeToString())
    back = import_onnx(path).net

    def meaning(layer):  # a resize by a factor comes back as one to the size it gives
        o = layer.options
        return (layer.kind, (o.mode, o.align, o.outputs) if layer.kind == "upsample" else o)

    assert [meaning(a) for a in back.layers] == [meaning(a) for a in net.layers]
    x = np.random.default_rng(4).standard_normal((3, *net.input_shape))
    got, _ = hpctrain_forward(back, x)
    want = run_onnx(path, x.astype(np.float32))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


# -- the shipped mobile and grouped nets -----------------------------------------------------------

SHIPPED = {"mobilenet_v2": "mobilenet_v2", "resnext50": "resnext50_32x4d"}


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_net_is_torchvisions_layer_for_layer(name):
    """The shipped net has torchvision's parameters (count and names: its state dict loads
    with ``strict=True``), and from the same tensors computes what torchvision's model does
    (through ``model_proto`` and onnxruntime, float32, 1e-5)."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from hpctrain.interchange.onnx_export import model_proto
    from hpctrain.interchange.weights import state_dict
    from hpctrain.model.net import load_net
    from tests.test_interchange import random_tensors

    net = load_net(name, 64)
    model = getattr(torchvision.models, SHIPPED[name])()
    assert sum(int(np.prod(s)) for s in net.param_shapes().values()) == sum(
        p.numel() for p in model.parameters())
    tensors = random_tensors(net, seed=5)
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in
                           state_dict(net, tensors).items()}, strict=True)
    x = np.random.default_rng(6).standard_normal((2, *net.input_shape)).astype(np.float32)
    with torch.no_grad():
        want = model.eval()(torch.from_numpy(x)).numpy()
    session = ort.InferenceSession(model_proto(net, tensors).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, {"input": x})[0]
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


# -- resizing ------------------------------------------------------------------------------------


@pytest.mark.reference
@pytest.mark.parametrize("line,call", [
    ("upsample scale=2", dict(scale_factor=2, mode="nearest")),
    ("upsample scale=3x2", dict(scale_factor=(3, 2), mode="nearest")),
    ("upsample scale=2 mode=bilinear", dict(scale_factor=2, mode="bilinear",
                                            align_corners=False)),
    ("upsample size=17x9 mode=bilinear", dict(size=(17, 9), mode="bilinear",
                                              align_corners=False)),
    ("upsample size=17x9 mode=bilinear align=1", dict(size=(17, 9), mode="bilinear",
                                                      align_corners=True)),
    ("upsample size=17x9", dict(size=(17, 9), mode="nearest")),
    ("upsample scale=4 mode=bilinear align=1", dict(scale_factor=4, mode="bilinear",
                                                    align_corners=True)),
])
def test_upsampling_equals_pytorchs_interpolate(line, call):
    """The layer's kernels on a whole 7×5 image, Y and dX, against F.interpolate."""
    torch = pytest.importorskip("torch")
    from hpctrain.kernels.resize import resampling_matrix, resize_backward, resize_forward

    net = parse_net(f"input channels=3 height=7 width=5 classes=3\n{line}\n"
                    f"avgpool kernel=global\nflatten\nlinear out=3\n", "t")
    options = net.layers[0].options
    matrices = [resampling_matrix(r, (0, r.n_out), (0, r.n_in)) for r in options.windows()]
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 7, 5))
    y = resize_forward(np, x, matrices)
    dy = rng.standard_normal(y.shape)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.interpolate(tx, **call)
    ty.backward(torch.tensor(dy))
    assert y.shape == tuple(ty.shape) == (2, 3, *net.out_shapes[0][1:])
    assert np.abs(y - ty.detach().numpy()).max() < TOLERANCE
    assert np.abs(resize_backward(np, dy, matrices) - tx.grad.numpy()).max() < TOLERANCE


@pytest.mark.reference
def test_trilinear_upsampling_of_a_volume_equals_pytorchs():
    torch = pytest.importorskip("torch")
    from hpctrain.kernels.resize import resampling_matrix, resize_forward

    net = parse_net("input channels=2 size=4x5x3 classes=3\nupsample scale=2x3x2 "
                    "mode=bilinear\navgpool kernel=global\nflatten\nlinear out=3\n", "t")
    matrices = [resampling_matrix(r, (0, r.n_out), (0, r.n_in))
                for r in net.layers[0].options.windows()]
    x = np.random.default_rng(8).standard_normal((2, 2, 4, 5, 3))
    want = torch.nn.functional.interpolate(torch.tensor(x), scale_factor=(2, 3, 2),
                                           mode="trilinear", align_corners=False).numpy()
    assert np.abs(resize_forward(np, x, matrices) - want).max() < TOLERANCE


@pytest.mark.reference
def test_nearest_resizing_picks_pytorchs_rows_for_every_size():
    """PyTorch takes a nearest row in float32 (⌊o·(n_in/n_out)⌋); a float64 ratio picks
    another row for a few sizes (14 to 46, 26 to 22). Every size up to 30 to 70."""
    torch = pytest.importorskip("torch")
    from hpctrain.kernels.resize import Resampling

    for n_in in range(1, 31):
        for n_out in range(1, 71):
            rows, _, _ = Resampling(n_in, n_out).sources(np.arange(n_out))
            x = torch.arange(n_in, dtype=torch.float32).reshape(1, 1, n_in)
            want = torch.nn.functional.interpolate(x, size=n_out, mode="nearest")
            assert rows.tolist() == want.reshape(-1).long().tolist(), (n_in, n_out)


@pytest.mark.parametrize("line,fragment", [
    ("upsample", "scale=S (whole factors) or size=HxW"),
    ("upsample scale=2 size=4x4", "one of them"),
    ("upsample scale=2 mode=cubic", "mode='cubic' must be nearest or bilinear"),
    ("upsample scale=2 align=1", "give mode=bilinear"),
    ("upsample scale=2x2x2", "scale for 3 axes"),
    ("upsample size=input/0", "size=input/K with K a whole number of at least 1"),
    ("upsample size=inputs", "size=input/K"),
    ("upsample scale=2 size=input", "one of them"),
])
def test_a_bad_upsampling_is_refused(line, fragment):
    with pytest.raises(NetError) as caught:
        net_of(line, size=8)
    assert fragment in str(caught.value)


def test_an_upsampling_to_the_inputs_size_follows_the_image_size():
    """``size=input/K`` is the net's input size over K, rounded up (where K-fold striding
    leaves a feature map), and ``size=input`` the input's own: both follow ``--image-size``
    and read back from the net's text."""
    net = parse_net("input channels=3 size=64 classes=3\nconv out=4 kernel=3 stride=2 pad=1\n"
                    "conv out=4 kernel=3 stride=2 pad=1\navgpool name=p kernel=global\n"
                    "upsample name=back size=input/4 mode=bilinear align=1\n"
                    "add in=back,conv2\nupsample size=input mode=bilinear\nconv out=3 kernel=1",
                    "seg.net")
    assert net.out_shapes[3] == (4, 16, 16) and net.out_shapes[-1] == (3, 64, 64)
    again = parse_net(net_text(net), "again.net")
    assert again.layers == net.layers and "size=input/4" in net_text(net)
    smaller = net.with_image_size(37)  # 37 → 19 → 10 = ⌈37/4⌉
    assert smaller.out_shapes[3] == (4, 10, 10) and smaller.out_shapes[-1] == (3, 37, 37)


def test_an_upsampling_halo_is_a_row_or_two():
    """×2 on 13 rows split 4 ways (the output's 26 rows cut 7, 6, 7, 6, the input's 4, 3, 3,
    3): each rank reads at most a row beyond its own from each neighbour for the blocks'
    misalignment, and bilinear one more for its second source."""
    from hpctrain.kernels.resize import Resampling
    from hpctrain.layout.partition import halo_plans

    for mode, most in (("bilinear", 2), ("nearest", 1)):
        for plan in halo_plans(13, 4, Resampling(13, 26, mode), "up"):
            for lo, hi in (plan.recv_top, plan.recv_bottom):
                assert hi - lo <= most, (mode, plan)


@pytest.mark.reference
def test_pytorchs_interpolate_imports_from_onnx_and_exports_back(tmp_path):
    """``F.interpolate`` by a factor (nearest), to a size (bilinear), and with aligned corners
    back to the input's size, as PyTorch exports it (Resize, its sizes computed from Shape):
    imported, it computes what onnxruntime does; exported again, onnxruntime runs it to the
    same numbers."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from hpctrain.interchange.onnx_export import model_proto
    from hpctrain.interchange.onnx_import import import_onnx
    from tests.test_interchange import run_onnx, to_onnx
    from tests.test_onnx_import import hpctrain_forward

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            y = torch.nn.functional.interpolate(self.conv(x), scale_factor=2)
            y = torch.nn.functional.interpolate(y, size=(30, 23), mode="bilinear")
            y = torch.nn.functional.interpolate(y, size=x.shape[-2:], mode="bilinear",
                                                align_corners=True)
            return self.fc(y.mean((2, 3)))

    path = to_onnx(Decoder().eval(), torch.randn(2, 3, 13, 11), tmp_path / "decoder.onnx")
    net = import_onnx(path).net
    resized = [layer.options for layer in net.layers if layer.kind == "upsample"]
    assert [(o.mode, o.align, o.outputs) for o in resized] == [
        ("nearest", False, (26, 22)), ("bilinear", False, (30, 23)), ("bilinear", True, (13, 11))]
    x = np.random.default_rng(9).standard_normal((2, 3, 13, 11))
    got, _ = hpctrain_forward(net, x)
    want = run_onnx(path, x.astype(np.float32))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    from onnx import load, numpy_helper

    # the layers are named as PyTorch's modules: their tensors go back under the same names
    tensors = {t.name: numpy_helper.to_array(t) for t in load(str(path)).graph.initializer}
    again = tmp_path / "again.onnx"
    again.write_bytes(model_proto(net, tensors).SerializeToString())
    assert np.abs(run_onnx(again, x.astype(np.float32)) - want).max() / np.abs(want).max() < 1e-5


# -- ConvNeXt's layer norm over the channels, and GELU ---------------------------------------------


@pytest.mark.reference
def test_gelu_equals_pytorchs():
    torch = pytest.importorskip("torch")
    forward, derivative = KINDS["gelu"].functions(None)
    x = np.concatenate([np.linspace(-9, 9, 1801), [0.0, -40.0, 40.0]])
    dy = np.random.default_rng(10).standard_normal(x.shape)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.gelu(tx)
    ty.backward(torch.tensor(dy))
    assert np.abs(forward(np, x) - ty.detach().numpy()).max() < TOLERANCE
    assert np.abs(derivative(np, x, dy) - tx.grad.numpy()).max() < TOLERANCE


@pytest.mark.reference
@pytest.mark.parametrize("shape", [(3, 6, 5, 4), (3, 6, 2, 3, 4), (5, 7)])
def test_layer_norm_equals_pytorchs_over_the_channels(shape):
    """Over the channels at each position of an image or volume (ConvNeXt's LayerNorm2d:
    F.layer_norm of the channels-last tensor), over the features of a flat input; Y, dX, dγ
    and dβ."""
    torch = pytest.importorskip("torch")
    from hpctrain.kernels.norm import layernorm_backward, layernorm_forward

    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape) * 3 + 1
    gamma, beta = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    dy = rng.standard_normal(shape)
    y, cache = layernorm_forward(np, x, gamma, beta, 1e-6, shape[1], lambda a: a)
    dx, dgamma, dbeta = layernorm_backward(np, dy, cache, shape[1], lambda a: a)
    tx, tg, tb = (torch.tensor(v, requires_grad=True) for v in (x, gamma, beta))
    last = tx.movedim(1, -1)
    ty = torch.nn.functional.layer_norm(last, (shape[1],), tg, tb, 1e-6).movedim(-1, 1)
    ty.backward(torch.tensor(dy))
    for got, want in ((y, ty), (dx, tx.grad), (dgamma, tg.grad), (dbeta, tb.grad)):
        want = want.detach().numpy()
        assert np.abs(got - want).max() / np.abs(want).max() < TOLERANCE


@pytest.mark.reference
def test_pytorchs_gelu_and_layer_norms_import_from_onnx(tmp_path):
    """F.gelu (Div, Erf, Add, Mul, Mul), ConvNeXt's LayerNorm2d (the channels moved last, a
    LayerNormalization, moved back) and nn.LayerNorm on features, as PyTorch exports them: one
    layer each, computing what onnxruntime does."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from hpctrain.interchange.onnx_import import import_onnx
    from tests.test_interchange import run_onnx, to_onnx
    from tests.test_onnx_import import hpctrain_forward

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
            self.norm = torch.nn.LayerNorm(6, eps=1e-6)
            self.fc = torch.nn.Linear(6, 5)
            self.head_norm = torch.nn.LayerNorm(5)
            self.head = torch.nn.Linear(5, 3)

        def forward(self, x):
            y = torch.nn.functional.gelu(self.conv(x))
            y = self.norm(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            return self.head(self.head_norm(self.fc(y.mean((2, 3)))))

    torch.manual_seed(1)
    model = Block().eval()
    with torch.no_grad():
        for norm in (model.norm, model.head_norm):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    path = to_onnx(model, torch.randn(2, 3, 7, 6), tmp_path / "block.onnx")
    net = import_onnx(path).net
    assert [layer.kind for layer in net.layers] == [
        "conv", "gelu", "layernorm", "avgpool", "flatten", "linear", "layernorm", "linear"]
    x = np.random.default_rng(12).standard_normal((2, 3, 7, 6))
    got, _ = hpctrain_forward(net, x)
    want = run_onnx(path, x.astype(np.float32))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


@pytest.mark.reference
def test_a_resize_to_one_row_and_a_dilated_same_convolution_go_through_onnx(tmp_path):
    """Exported, a bilinear resize to a size of 1 along an axis reads the middle of the input
    in onnxruntime too (half_pixel, not pytorch_half_pixel); imported, a Conv of
    ``auto_pad=SAME_UPPER`` with dilation 2 pads its dilated span, as ONNX's shape inference
    says (onnxruntime runs no dilated SAME_UPPER)."""
    pytest.importorskip("onnx")
    from hpctrain.interchange.onnx_export import model_proto
    from hpctrain.interchange.onnx_import import import_onnx
    from tests.onnx_graphs import Graph, save
    from tests.test_interchange import random_tensors, run_onnx
    from tests.test_onnx_import import hpctrain_forward

    net = parse_net("input channels=2 height=4 width=5 classes=3\nupsample size=1x3 "
                    "mode=bilinear\nflatten\nlinear out=3\n", "t")
    path = tmp_path / "one.onnx"
    path.write_bytes(model_proto(net, random_tensors(net)).SerializeToString())
    x = np.random.default_rng(13).standard_normal((2, 2, 4, 5))
    got, _ = hpctrain_forward(import_onnx(path).net, x)
    want = run_onnx(path, x.astype(np.float32))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5

    g = Graph((3, 8, 8))
    y = g.conv(g.input, 4, 3, dilations=[2, 2], auto_pad="SAME_UPPER")
    model = g.model(g.gemm(g.flatten(y), 3))
    net = import_onnx(save(model, tmp_path / "same.onnx")).net
    assert net.out_shapes[0] == (4, 8, 8)
    assert net.layers[0].options.pad == ((2, 2), (2, 2))
