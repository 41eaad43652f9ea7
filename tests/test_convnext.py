"""ConvNeXt on one process: the layer scale (``layerscale``) against PyTorch (Y, dX, dγ, float64,
1e-12), its net-file line, shape and prices; torchvision's ConvNeXt-T imported from ONNX with its
weights (the channels-last ``MatMul`` layers as 1×1 convolutions, the layer scale's ``Mul``, the
``Transpose`` nodes absorbed) against onnxruntime, and what the import refuses; the new kind
exported to ONNX and read back; and the shipped ``convnext_tiny`` and ``efficientnet_b0``,
torchvision's models parameter for parameter.

The distributed runs, every mode against one process and a ConvNeXt block against PyTorch
under a domain plan, are in ``tests/mpi/test_convnext.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpctrain.cost.memory import Footprint
from hpctrain.layout.layout import Layout, Split
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import NetError, load_net, parse_net
from hpctrain.model.net_text import net_text

TOLERANCE = 1e-12


def net_of(body: str, size: int = 8, channels: int = 6):
    return parse_net(f"input channels={channels} size={size} classes=3\n{body}\n"
                     f"avgpool kernel=global\nflatten\nlinear out=3\n", "test.net")


# -- the kind ------------------------------------------------------------------------------------


@pytest.mark.reference
@pytest.mark.parametrize("shape", [(3, 5, 4, 7), (2, 4, 3, 2, 5), (4, 6)])
def test_the_layer_scale_and_its_gradients_equal_pytorchs(shape):
    """An image, a volume and a flat input: γ of shape (C, 1, …, 1) as torchvision's
    ``layer_scale`` broadcast over the positions."""
    torch = pytest.importorskip("torch")
    from hpctrain.kernels.activations import layer_scale_backward
    from hpctrain.model.kinds.layerscale import scale_shape

    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape)
    gamma = rng.standard_normal(scale_shape(shape[1:]))
    dy = rng.standard_normal(shape)
    tx, tg = torch.tensor(x, requires_grad=True), torch.tensor(gamma, requires_grad=True)
    (tg * tx).backward(torch.tensor(dy))
    dx, dgamma = layer_scale_backward(np, dy, x, gamma)
    assert np.abs(x * gamma - (tg * tx).detach().numpy()).max() < TOLERANCE
    assert np.abs(dx - tx.grad.numpy()).max() < TOLERANCE
    assert dgamma.shape == gamma.shape
    assert np.abs(dgamma - tg.grad.numpy()).max() < TOLERANCE


def test_a_layer_scale_has_one_value_per_channel_and_reads_back_from_its_text():
    net = net_of("conv name=c out=8 kernel=3 pad=1\nlayerscale name=ls init=0.25\n"
                 "layerscale name=plain")
    assert net.param_shapes()["ls.layer_scale"] == (8, 1, 1)
    assert net.layers[1].options.init == 0.25
    assert net.layers[2].options.init == 1e-6  # torchvision's ConvNeXt
    assert net.out_shapes[1] == (8, 8, 8)
    assert parse_net(net_text(net), "again.net").layers == net.layers
    flat = parse_net("input features=5 classes=3\nlayerscale\nlinear out=3\n", "t")
    assert flat.param_shapes()["layerscale1.layer_scale"] == (5,)


def test_a_bad_layer_scale_is_refused_in_one_line():
    with pytest.raises(NetError) as caught:
        net_of("layerscale init=tiny")
    assert "\n" not in str(caught.value) and "init='tiny' is not a number" in str(caught.value)


@pytest.mark.parametrize("split,held,group", [
    (Split((1, 1, 1, 1)), 8, 1),  # one process
    (Split((4, 1, 1, 1)), 8, 4),  # batch: γ on every rank, Δγ summed over the 4
    (Split((1, 4, 1, 1)), 2, 1),  # model: 2 channels' γ each, nothing summed
    (Split((1, 1, 2, 1)), 8, 2),  # domain: γ replicated, Δγ summed over the height split
    (Split((2, 2, 1, 1)), 4, 2),  # model × batch: half the channels, summed over the batch
])
def test_a_layer_scale_holds_its_channels_and_sums_over_the_other_blocks(split, held, group):
    """It follows the layout that feeds it: its parameters are its channel block's, summed
    over every rank holding that block, as a bias is."""
    kind = KINDS["layerscale"]
    net = net_of("layerscale name=ls", channels=8)
    spec = net.layers[0]
    x = Layout.of_split((4, 8, 8, 8), split)
    inputs, output = kind.layouts(spec, (x,), (4, 8, 8, 8), None)
    assert output == x
    assert kind.local_parameters(spec, inputs, output) == held
    assert kind.gradient_group(inputs, output).size == group
    work = kind.work(spec, inputs, output, True)
    entries = np.prod(work.x)
    assert kind.flops(work) == (entries, 3 * entries)
    assert kind.keeps_input(spec)


def test_a_layer_scale_is_priced_as_an_element_wise_product():
    kind = KINDS["layerscale"]
    spec = net_of("layerscale").layers[0]
    fp = Footprint(x=100.0, y=100.0, work=None, itemsize=4, loose_input={"input": 100.0},
                   height_split=False)
    kept, transient = kind.memory(spec, fp)
    assert kept == {}
    assert transient == fp.phases({"input": 100.0, "output": 100.0},
                                  {"output gradient": 100.0, "input gradient": 100.0,
                                   "product with X": 100.0})


# -- ONNX in and out -----------------------------------------------------------------------------


def randomise_convnext(model, seed: int = 0):
    """Layer scales, norms and biases off their defaults (1e-6, 1 and 0), so that each block's
    branch counts and a mapping that confuses them shows."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_scale") or (p.ndim == 1 and name.endswith("weight")):
                p.copy_(torch.rand(p.shape, generator=generator) + 0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return model.eval()


@pytest.mark.reference
def test_torchvisions_convnext_tiny_imports_with_its_weights(tmp_path):
    """ConvNeXt-T (weights=None, 7 classes, its scales and norms randomised), exported as the
    docs say (opset 17, training-preserving) at 32², imports with no refusal: each block a
    depthwise conv, a layernorm, two 1×1 convs (the channels-last Linear layers, their weights
    transposed) with gelu between, a layerscale and an add; hpctrain computes (float64, one
    process) what onnxruntime computes, to 1e-5."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    pytest.importorskip("onnx")
    from hpctrain.interchange.onnx_import import import_onnx
    from hpctrain.interchange.torch_names import torch_names
    from tests.test_interchange import run_onnx, to_onnx
    from tests.test_onnx_import import hpctrain_forward

    torch.manual_seed(0)
    model = randomise_convnext(torchvision.models.convnext_tiny(weights=None, num_classes=7))
    path = to_onnx(model, torch.randn(2, 3, 32, 32), tmp_path / "convnext_tiny.onnx")
    imported = import_onnx(path)
    net = imported.net
    block = [layer for layer in net.layers if layer.name.startswith("features.1.0")]
    assert [layer.kind for layer in block] == ["conv", "layernorm", "conv", "gelu", "conv",
                                               "layerscale", "add"]
    assert [layer.options.kernel for layer in block if layer.kind == "conv"] == [
        (7, 7), (1, 1), (1, 1)]
    assert block[0].options.groups == 96
    state = {name: p.detach().numpy() for name, p in model.named_parameters()}
    names = torch_names(net)
    assert sorted(names[ours] for ours in imported.weights) == sorted(state)
    for ours, value in imported.weights.items():
        theirs = state[names[ours]]
        assert np.array_equal(value.reshape(theirs.shape), theirs), ours
    assert np.array_equal(imported.weights["features.1.0.block.3.weight"][:, :, 0, 0],
                          state["features.1.0.block.3.weight"])  # (out, in): Bᵀ of the MatMul
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32))
    got, _ = hpctrain_forward(net, x)
    want = run_onnx(path, x.astype(np.float32))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


def channels_last_model(body):
    """A conv, then ``body(g, y)`` on its output, then a classifier: an ONNX model by hand."""
    from tests.onnx_graphs import Graph

    g = Graph((4, 5, 5))
    y = g.conv(g.input, 6, 1)
    return g.model(g.gemm(g.flatten(body(g, y)), 3))


def test_what_the_channels_last_import_refuses_is_named(tmp_path):
    """A Transpose other than to channels-last and back, an operator that reads the
    channels-last tensor but is not one position at a time, and a product by a constant that is
    neither a scalar nor one value per channel: each node named, with why."""
    pytest.importorskip("onnx")
    from tests.onnx_graphs import save
    from tests.test_onnx_import import refused

    def transposed(g, y):
        return g.node("Transpose", [y], perm=[0, 1, 3, 2])

    def pooled_channels_last(g, y):
        last = g.node("Transpose", [y], perm=[0, 2, 3, 1])
        return g.node("Transpose", [g.node("Softmax", [last], axis=-1)], perm=[0, 3, 1, 2])

    def by_a_map(g, y):
        return g.node("Mul", [y, g.constant("map", np.ones((6, 5, 5), np.float32))])

    refused(save(channels_last_model(transposed), tmp_path / "t.onnx"),
            "Transpose", "a transpose [0, 1, 3, 2]")
    refused(save(channels_last_model(pooled_channels_last), tmp_path / "s.onnx"),
            "Softmax", "channels moved last by a Transpose")
    refused(save(channels_last_model(by_a_map), tmp_path / "m.onnx"),
            "Mul", "not a scalar nor one value per channel, (6, 1, 1)")


@pytest.mark.reference
def test_a_layer_scale_exports_to_onnx_and_back(tmp_path):
    """``model_proto`` writes a layerscale as a Mul by its γ, named as PyTorch names it, that
    onnxruntime computes as hpctrain does; read back it is the same layer with the same γ."""
    pytest.importorskip("onnx")
    from hpctrain.interchange.onnx_export import model_proto
    from hpctrain.interchange.onnx_import import import_onnx
    from tests.test_interchange import random_tensors, run_onnx
    from tests.test_onnx_import import hpctrain_forward

    net = net_of("conv name=dw out=6 kernel=7 pad=3 groups=6\nlayernorm name=norm eps=1e-6\n"
                 "conv name=pw1 out=12 kernel=1\ngelu\nconv name=pw2 out=6 kernel=1\n"
                 "layerscale name=block\nadd in=block,input")
    tensors = random_tensors(net)
    path = tmp_path / "block.onnx"
    path.write_bytes(model_proto(net, tensors).SerializeToString())
    back = import_onnx(path)
    assert [(a.kind, a.options) for a in back.net.layers] == [
        (a.kind, a.options) for a in net.layers]
    assert np.array_equal(back.weights["block.layer_scale"], tensors["block.layer_scale"])
    x = np.random.default_rng(4).standard_normal((3, *net.input_shape))
    got, _ = hpctrain_forward(back.net, x)
    want = run_onnx(path, x.astype(np.float32))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


# -- the shipped nets ----------------------------------------------------------------------------

SHIPPED = {"convnext_tiny": ("convnext_tiny", 28_589_128),
           "efficientnet_b0": ("efficientnet_b0", 5_288_548)}


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_net_is_torchvisions_parameter_for_parameter(name, tmp_path):
    """torchvision's parameter count; its state dict (``export``'s) loads into torchvision's
    model with ``strict=True``, and from the same tensors hpctrain's ONNX export computes in
    onnxruntime what torchvision's model does (float32, 1e-5); the state dict and the ONNX model
    read back as ``--init`` give the same tensors (ConvNeXt's Linear weights (out, in)
    reshaped; its layer scales named as PyTorch names them both ways)."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    pytest.importorskip("safetensors")
    from hpctrain.interchange.onnx_export import model_proto
    from hpctrain.interchange.weights import read_weights, state_dict, write_safetensors
    from hpctrain.model.net import StartingWeights
    from tests.test_interchange import random_tensors

    model_name, count = SHIPPED[name]
    net = load_net(name, 64)
    model = getattr(torchvision.models, model_name)(weights=None)
    assert sum(int(np.prod(s)) for s in net.param_shapes().values()) == count == sum(
        p.numel() for p in model.parameters())
    tensors = random_tensors(net, seed=5)
    found = state_dict(net, tensors)
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in found.items()},
                          strict=True)
    x = np.random.default_rng(6).standard_normal((2, *net.input_shape)).astype(np.float32)
    with torch.no_grad():
        want = model.eval()(torch.from_numpy(x)).numpy()
    exported = tmp_path / f"{name}.onnx"
    exported.write_bytes(model_proto(net, tensors).SerializeToString())
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    got = session.run(None, {"input": x})[0]
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    path = tmp_path / f"{name}.safetensors"
    write_safetensors(path, found, {})
    for source in (path, exported):
        back = read_weights(StartingWeights(str(source)), net)
        assert back.keys() == tensors.keys(), source
        assert all(np.array_equal(back[k], tensors[k]) for k in tensors), source


@pytest.mark.reference
def test_torchvisions_convnext_onnx_starts_the_shipped_net(tmp_path):
    """``--init`` of torchvision's own ConvNeXt-T export fills every tensor of the shipped
    ``convnext_tiny``: the layer names differ (a block's layer scale), PyTorch's do not."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    pytest.importorskip("onnx")
    from hpctrain.interchange.weights import read_weights
    from hpctrain.model.net import StartingWeights
    from tests.test_interchange import to_onnx

    torch.manual_seed(2)
    model = randomise_convnext(torchvision.models.convnext_tiny(weights=None))
    path = to_onnx(model, torch.randn(1, 3, 32, 32), tmp_path / "convnext_tiny.onnx")
    net = load_net("convnext_tiny", 32)
    found = read_weights(StartingWeights(str(path)), net)
    assert found.keys() == net.param_shapes().keys()
    state = dict(model.named_parameters())
    assert np.array_equal(found["features.5.3.layer_scale.layer_scale"],
                          state["features.5.3.layer_scale"].detach().numpy())
    assert np.array_equal(found["features.7.2.block.5.weight"][:, :, 0, 0],
                          state["features.7.2.block.5.weight"].detach().numpy())
