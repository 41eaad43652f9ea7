"""Volume nets as data: the input line of a volume and of a regression, windows given once or
per axis, ``pad=same`` and before+after padding, the pointwise kinds, CosmoFlow's parameter
count, and the ``replicated`` mode a linear layer falls back to on more ranks than outputs."""

import numpy as np
import pytest

from hpctrain.kernels.activations import (
    leaky_relu_backward,
    leaky_relu_forward,
    scale_backward,
    scale_forward,
    tanh_backward,
    tanh_forward,
)
from hpctrain.kernels.loss import mean_squared_error
from hpctrain.model.net import NetError, load_net, parse_net
from hpctrain.plan.plans import PlanError, plan_from_spec

VOLUME = """input channels=2 size=6x8x10 targets=3
conv out=4 kernel=3 pad=1
maxpool kernel=2
conv out=4 kernel=2 pad=same
flatten
linear out=3
"""


def test_cosmoflow_has_the_reference_parameter_count_and_shapes():
    """2,454,964 parameters, as mlcommons/hpc's build_model with its defaults: five 2³ convs
    from 4 to 16..256 channels (349,168), then 16384 -> 128 -> 64 -> 4 (2,105,796)."""
    net = load_net("cosmoflow")
    assert net.input_shape == (4, 128, 128, 128) and net.regression and net.classes == 4
    assert net.parameter_count() == 2_454_964
    convs = [net.out_shapes[k] for k, l in enumerate(net.layers) if l.kind == "maxpool"]
    assert convs == [(16, 64, 64, 64), (32, 32, 32, 32), (64, 16, 16, 16), (128, 8, 8, 8),
                     (256, 4, 4, 4)]
    assert net.layers[0].options.pad == ((0, 1),) * 3  # TensorFlow's same for a 2³ kernel
    small = load_net("cosmoflow", 32)
    assert small.input_shape == (4, 32, 32, 32) and small.out_shapes[-1] == (4,)


def test_volume_input_windows_and_padding():
    net = parse_net(VOLUME, "v")
    assert net.input_shape == (2, 6, 8, 10)
    assert net.out_shapes[0] == (4, 6, 8, 10)  # kernel 3 on every axis, pad 1
    assert net.out_shapes[1] == (4, 3, 4, 5)
    assert net.out_shapes[2] == (4, 3, 4, 5)  # same: 0 before, 1 after
    assert parse_net(VOLUME.replace("size=6x8x10", "size=8 depth=6"), "v").input_shape == (
        2, 6, 8, 8)
    per_axis = parse_net(VOLUME.replace("kernel=3 pad=1", "kernel=3x1x1 pad=1x0+1x0"), "v")
    assert per_axis.layers[0].options.kernel == (3, 1, 1)
    assert per_axis.layers[0].options.pad == ((1, 1), (0, 1), (0, 0))
    assert per_axis.out_shapes[0] == (4, 6, 9, 10)
    same = {k: parse_net(VOLUME.replace("kernel=2 pad=same", f"kernel={k} pad=same"), "v")
            .layers[2].options.pad[0] for k in (1, 2, 3, 4)}
    assert same == {1: (0, 0), 2: (0, 1), 3: (1, 1), 4: (1, 2)}
    assert parse_net(VOLUME, "v").with_image_size(12).input_shape == (2, 12, 12, 12)


@pytest.mark.parametrize("change,message", [
    (("kernel=3 pad=1", "kernel=3x3 pad=1"), "gives kernel for 2 axes but its input has 3"),
    (("kernel=2 pad=same", "kernel=2 stride=2 pad=same"), "pad=same needs stride=1"),
    (("pad=1", "pad=1x1x1x1"), "must be P, B+A"),
    (("targets=3", "targets=3 classes=3"), "classes=… (cross-entropy) or targets=…"),
    (("size=6x8x10", "size=6x8x10 depth=4"), "size=DxHxW or depth=…, not both"),
    (("size=6x8x10", "size=6x8x0"), "must be positive"),
    (("maxpool kernel=2", "maxpool kernel=2 pad=0+2"), "that hold only padding"),
    (("flatten", "leakyrelu slope=1.5\nflatten"), "slope=1.5 must be in [0, 1)"),
    (("flatten", "scale\nflatten"), "scale needs factor=…"),
    (("linear out=3", "linear out=2"), "(targets=3)"),
])
def test_bad_volume_nets_are_refused_in_one_line(change, message):
    with pytest.raises(NetError, match=None) as err:
        parse_net(VOLUME.replace(*change), "v")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_linear_layer_with_fewer_outputs_than_model_ranks_runs_replicated():
    net = load_net("cosmoflow", 32)
    modes = {net.layers[k].name: p.mode for k, p in enumerate(plan_from_spec("8x1", net, 8))
             if p.mode != "follow"}
    assert modes["linear2"] == "model" and modes["linear3"] == "replicated"
    plans = plan_from_spec("conv=domain:4x2,fc=replicated:4x2", net, 8)
    assert {p.mode for p in plans} == {"domain", "model", "follow", "replicated"}
    with pytest.raises(PlanError, match="conv layers cannot be replicated-parallel"):
        plan_from_spec("conv=replicated:4x2,fc=4x2", net, 8)


RNG = np.random.default_rng(3)


def numeric_derivative(f, x, h=1e-6):
    return (f(x + h) - f(x - h)) / (2 * h)


@pytest.mark.parametrize("forward,backward", [
    (lambda x: leaky_relu_forward(np, x, 0.3), lambda y, dy: leaky_relu_backward(np, y, dy, 0.3)),
    (lambda x: tanh_forward(np, x), lambda y, dy: tanh_backward(np, y, dy)),
    (lambda x: scale_forward(np, x, 1.2), lambda y, dy: scale_backward(np, y, dy, 1.2)),
])
def test_pointwise_derivatives_match_finite_differences(forward, backward):
    x = RNG.standard_normal((3, 4, 5))
    x[np.abs(x) < 1e-3] = 0.5  # keep away from the kink
    dy = RNG.standard_normal(x.shape)
    np.testing.assert_allclose(backward(forward(x), dy), dy * numeric_derivative(forward, x),
                               rtol=1e-7, atol=1e-9)


@pytest.mark.reference
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_leaky_relu_equals_pytorchs_entry_for_entry(dtype):
    """Without ``where``'s branches, the same numbers as PyTorch's, the kink, signed zeros
    and non-finite values included."""
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal(64).astype(dtype)
    x[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30]
    dy = RNG.standard_normal(64).astype(dtype)
    dy[6:9] = [np.inf, -np.inf, np.nan]
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.leaky_relu(tx, 0.3)
    ty.backward(torch.tensor(dy))
    y = leaky_relu_forward(np, x, 0.3)
    np.testing.assert_array_equal(y, ty.detach().numpy())
    assert np.array_equal(np.signbit(y), np.signbit(ty.detach().numpy()))
    # PyTorch's gradient reads X; this one reads Y, whose sign is X's
    np.testing.assert_array_equal(leaky_relu_backward(np, y, dy, 0.3), tx.grad.numpy())


def test_mean_squared_error_and_its_gradient():
    y, t = RNG.standard_normal((5, 4)), RNG.standard_normal((5, 4))
    loss, correct, grad = mean_squared_error(np, y, t, 1 / 5)
    assert loss == pytest.approx(((y - t) ** 2).mean(axis=1).sum()) and correct == 0
    bumped = y.copy()
    bumped[2, 1] += 1e-6
    want = (mean_squared_error(np, bumped, t, 1)[0] - loss) / 1e-6 / 5
    assert grad[2, 1] == pytest.approx(want, rel=1e-5)


def test_a_depth_split_too_fine_for_a_layer_is_refused_naming_it():
    from hpctrain.layout.partition import SplitError
    from hpctrain.plan.placement import plan_layouts
    from hpctrain.plan.plans import LayerPlan

    net = load_net("cosmoflow", 32)  # block5 reads 2 planes
    plan = [LayerPlan({"conv": "domain", "linear": "model"}.get(l.kind, "follow"), (4, 1))
            for l in net.layers]
    with pytest.raises(SplitError, match=r"layer block5.conv1: input depth of size 2 cannot "
                                         r"be split 4 ways"):
        plan_layouts(net, plan, 4, 4)


def test_a_regression_and_a_classifier_of_the_same_shapes_are_different_architectures():
    """Checkpoints and run logs compare architectures: a 3-class head and a 3-target head
    have the same parameters, but not the same loss."""
    regression = parse_net(VOLUME, "v")
    classifier = parse_net(VOLUME.replace("targets=3", "classes=3"), "v")
    assert regression.param_shapes() == classifier.param_shapes()
    assert regression.architecture() != classifier.architecture()
    assert regression.architecture()[-1] == "loss mean squared error"


def test_a_window_refused_when_the_net_is_made_names_its_line():
    with pytest.raises(NetError, match=r"^v, line 4: layer conv2 gives kernel for 2 axes"):
        parse_net(VOLUME.replace("kernel=2 pad=same", "kernel=2x2"), "v")
    with pytest.raises(NetError, match=r"^v, line 3: layer maxpool1: pad=same needs stride=1 "
                                       r"\(a pool's stride is its kernel unless given\)"):
        parse_net(VOLUME.replace("maxpool kernel=2", "maxpool kernel=2 pad=same"), "v")
