"""The shipped segmentation nets against the models they are: ``deeplabv3`` against torchvision's
``deeplabv3_resnet50``, ``deepcam`` against the MLPerf HPC reference network (DeepLabv3+ on an
aligned Xception), written here in plain PyTorch from its published layers. Each has the model's
parameters (count, names and shapes: its state dict loads with ``strict=True``) and, from the
same tensors, computes what the model computes (exported by ``model_proto``, run by
onnxruntime, float32). torchvision's segmentation models (FCN, DeepLabv3, LR-ASPP) and PyTorch's
transposed convolutions import from ONNX with their weights, a class score per pixel."""

from __future__ import annotations

import numpy as np
import pytest

from hpctrain.model.net import load_net

pytestmark = pytest.mark.reference


def same_outputs(net, model, x: np.ndarray, tensors) -> float:
    """The largest difference, relative to the largest output, between ``model`` on ``x`` and
    ``net`` exported with ``tensors`` and run by onnxruntime."""
    import onnxruntime as ort
    import torch

    from hpctrain.interchange.onnx_export import model_proto
    from hpctrain.interchange.weights import state_dict

    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in
                           state_dict(net, tensors).items()}, strict=True)
    with torch.no_grad():
        want = model.eval()(torch.from_numpy(x))
    want = (want["out"] if isinstance(want, dict) else want).numpy()
    session = ort.InferenceSession(model_proto(net, tensors).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, {"input": x})[0]
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


def parameter_count(net) -> int:
    return sum(int(np.prod(s)) for s in net.param_shapes().values())


def test_deeplabv3_is_torchvisions_layer_for_layer():
    """39,638,869 parameters; a class score per pixel at the input's size, the backbone
    dilated (output stride 8) and the pooled branch resized to the size ``--image-size``
    gives."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    pytest.importorskip("onnxruntime")
    from tests.test_interchange import random_tensors

    net = load_net("deeplabv3", 40)
    assert net.per_pixel and net.out_shapes[-1] == (21, 40, 40)
    model = torchvision.models.segmentation.deeplabv3_resnet50(weights=None,
                                                               weights_backbone=None)
    assert parameter_count(net) == sum(p.numel() for p in model.parameters()) == 39_638_869
    x = np.random.default_rng(6).standard_normal((2, *net.input_shape)).astype(np.float32)
    with torch.no_grad():
        assert same_outputs(net, model, x, random_tensors(net, seed=5)) < 1e-5


def deepcam_reference(classes: int = 3, channels: int = 16):
    """The MLPerf HPC DeepCAM network at output stride 16, module for module as its state dict
    names them: an aligned Xception (separable convolutions padded by half their dilated span,
    each block's input through an in-place ReLU that its shortcut then reads), ASPP at rates
    1, 6, 12, 18 with a pooled branch, and the transposed-convolution decoder."""
    import torch
    from torch import nn
    from torch.nn import functional

    def bn_relu(width):
        return [nn.BatchNorm2d(width), nn.ReLU()]

    class Separable(nn.Module):
        def __init__(self, cin, cout, stride=1, dilation=1):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cin, 3, stride, 0, dilation, groups=cin, bias=False)
            self.pointwise = nn.Conv2d(cin, cout, 1, bias=False)
            span = 2 * dilation + 1
            self.pad = ((span - 1) // 2, span - 1 - (span - 1) // 2)

        def forward(self, x):
            return self.pointwise(self.conv1(functional.pad(x, self.pad * 2)))

    class Block(nn.Module):
        def __init__(self, rep, skip=None, relu_first=True):
            super().__init__()
            self.rep = nn.Sequential(*rep)
            if skip is not None:
                self.skip, self.skipbn = skip, nn.BatchNorm2d(skip.out_channels)
            self.relu_first = relu_first

        def forward(self, x):
            if self.relu_first:  # the reference's in-place ReLU: the shortcut reads it too
                x = functional.relu(x)
                y = self.rep[1:](x)
            else:
                y = self.rep(x)
            return y + (self.skipbn(self.skip(x)) if hasattr(self, "skip") else x)

    relu = nn.ReLU()

    def entry(cin, cout, first=False):
        rep = [Separable(cin, cout), nn.BatchNorm2d(cout), relu, Separable(cout, cout),
               nn.BatchNorm2d(cout), Separable(cout, cout, stride=2)]
        if not first:
            rep = [relu, *rep]
        return Block(rep, nn.Conv2d(cin, cout, 1, stride=2, bias=False), relu_first=not first)

    def middle():
        return Block([relu, Separable(728, 728), nn.BatchNorm2d(728), relu, Separable(728, 728),
                      nn.BatchNorm2d(728), relu, Separable(728, 728), nn.BatchNorm2d(728)])

    class Xception(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(channels, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32)
            self.conv2, self.bn2 = nn.Conv2d(32, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64)
            self.block1 = entry(64, 128, first=True)
            self.block2, self.block3 = entry(128, 256), entry(256, 728)
            for b in range(4, 20):
                setattr(self, f"block{b}", middle())
            self.block20 = Block([relu, Separable(728, 728), nn.BatchNorm2d(728), relu,
                                  Separable(728, 1024), nn.BatchNorm2d(1024),
                                  Separable(1024, 1024)], nn.Conv2d(728, 1024, 1, bias=False))
            self.conv3, self.bn3 = Separable(1024, 1536, dilation=2), nn.BatchNorm2d(1536)
            self.conv4, self.bn4 = Separable(1536, 1536, dilation=2), nn.BatchNorm2d(1536)
            self.conv5, self.bn5 = Separable(1536, 2048, dilation=2), nn.BatchNorm2d(2048)

        def forward(self, x):
            x = functional.relu(self.bn1(self.conv1(x)))
            x = functional.relu(self.bn2(self.conv2(x)))
            x = self.block1(x)
            low = functional.relu(x)  # block2's in-place ReLU reaches the skip's features
            for b in range(2, 21):
                x = getattr(self, f"block{b}")(x)
            for k in (3, 4, 5):
                x = functional.relu(getattr(self, f"bn{k}")(getattr(self, f"conv{k}")(x)))
            return x, low

    class Aspp(nn.Module):
        def __init__(self, rate):
            super().__init__()
            kernel, pad = (1, 0) if rate == 1 else (3, rate)
            self.atrous_convolution = nn.Conv2d(2048, 256, kernel, padding=pad, dilation=rate,
                                                bias=False)
            self.bn = nn.BatchNorm2d(256)

        def forward(self, x):
            return functional.relu(self.bn(self.atrous_convolution(x)))

    def up(cin, cout, last=False):
        deconv = nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=1,
                                    bias=False)
        return nn.Sequential(deconv) if last else nn.Sequential(deconv, *bn_relu(cout))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.deconv1, self.deconv2, self.deconv3 = up(256, 256), up(256, 256), up(256, 256)
            self.conv1 = nn.Sequential(nn.Conv2d(304, 256, 3, padding=1, bias=False),
                                       *bn_relu(256),
                                       nn.Conv2d(256, 256, 3, padding=1, bias=False),
                                       *bn_relu(256), nn.Conv2d(256, 256, 1))
            self.last_deconv = up(256, classes, last=True)

        def forward(self, x, low):
            x = self.conv1(torch.cat((self.deconv2(self.deconv1(x)), low), 1))
            return self.last_deconv(self.deconv3(x))

    class DeepCam(nn.Module):
        def __init__(self):
            super().__init__()
            self.xception_features = Xception()
            self.aspp1, self.aspp2, self.aspp3, self.aspp4 = (Aspp(r) for r in (1, 6, 12, 18))
            self.global_avg_pool = nn.Sequential(nn.AdaptiveAvgPool2d(1),
                                                 nn.Conv2d(2048, 256, 1, bias=False),
                                                 *bn_relu(256))
            self.conv1, self.bn1 = nn.Conv2d(1280, 256, 1, bias=False), nn.BatchNorm2d(256)
            self.conv2, self.bn2 = nn.Conv2d(128, 48, 1, bias=False), nn.BatchNorm2d(48)
            self.upsample = Decoder()

        def forward(self, x):
            x, low = self.xception_features(x)
            pooled = functional.interpolate(self.global_avg_pool(x), size=x.shape[2:],
                                            mode="bilinear", align_corners=True)
            x = torch.cat([self.aspp1(x), self.aspp2(x), self.aspp3(x), self.aspp4(x), pooled],
                          1)
            x = functional.relu(self.bn1(self.conv1(x)))
            low = functional.relu(self.bn2(self.conv2(low)))
            return self.upsample(x, low)

    return DeepCam()


def test_deepcam_is_the_mlperf_network_layer_for_layer():
    """56,454,720 parameters under the reference's names; 3 class scores per pixel of the 16
    climate fields at 768x1152, and at the reduced size ``make deepcam`` trains (from the same
    tensors, the same numbers as the reference's model)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    from tests.test_interchange import random_tensors

    full = load_net("deepcam", None)
    assert full.input_shape == (16, 768, 1152) and full.out_shapes[-1] == (3, 768, 1152)
    assert full.per_pixel
    model = deepcam_reference()
    assert parameter_count(full) == sum(p.numel() for p in model.parameters()) == 56_454_720
    net = load_net("deepcam", 32)
    x = np.random.default_rng(2).standard_normal((2, *net.input_shape)).astype(np.float32)
    with torch.no_grad():
        assert same_outputs(net, model, x, random_tensors(net, seed=3)) < 1e-5


SEGMENTATION_MODELS = ["fcn_resnet50", "deeplabv3_resnet50", "lraspp_mobilenet_v3_large"]


@pytest.mark.parametrize("name", SEGMENTATION_MODELS)
def test_torchvisions_segmentation_models_import_with_their_weights(name, tmp_path):
    """Dilated backbones, ASPP or LR-ASPP heads and the bilinear resize back to the input's
    size: imported, the net gives (N, 21, H, W) and computes what onnxruntime does."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from hpctrain.interchange.onnx_import import import_onnx
    from tests.test_interchange import run_onnx, to_onnx
    from tests.test_onnx_import import hpctrain_forward

    class Scores(torch.nn.Module):  # the model's dict output, {"out": …}, as one tensor
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x)["out"]

    model = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None)
    path = to_onnx(Scores(model.eval()), torch.randn(2, 3, 48, 40), tmp_path / f"{name}.onnx")
    net = import_onnx(path).net
    assert net.per_pixel and net.out_shapes[-1] == (21, 48, 40)
    x = np.random.default_rng(4).standard_normal((2, 3, 48, 40))
    got, _ = hpctrain_forward(net, x)
    want = run_onnx(path, x.astype(np.float32))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


def test_pytorchs_transposed_convolutions_import_and_export_back(tmp_path):
    """``ConvTranspose2d`` with output padding, groups and dilation, and a ``ConvTranspose3d``,
    as PyTorch exports them: imported, their weights and numbers are onnxruntime's; exported
    again, onnxruntime runs them to the same numbers."""
    torch = pytest.importorskip("torch")
    from hpctrain.interchange.onnx_export import model_proto
    from hpctrain.interchange.onnx_import import import_onnx
    from tests.test_interchange import run_onnx, to_onnx
    from tests.test_onnx_import import hpctrain_forward

    class Decoder(torch.nn.Module):
        """Down by 4 with strided convolutions, back up by 4 with transposed ones: a class
        score per pixel of the input."""

        def __init__(self, volume: bool) -> None:
            super().__init__()
            conv = torch.nn.Conv3d if volume else torch.nn.Conv2d
            transposed = torch.nn.ConvTranspose3d if volume else torch.nn.ConvTranspose2d
            self.down = torch.nn.Sequential(conv(4, 6, 3, 2, 1), torch.nn.ReLU(),
                                            conv(6, 6, 3, 2, 1))
            self.up = transposed(6, 6, 3, stride=2, padding=1, output_padding=1)
            self.grouped = transposed(6, 4, 4, stride=2, padding=1, groups=2, bias=False)
            self.dilated = transposed(4, 3, 3, padding=2, dilation=2)

        def forward(self, x):
            x = torch.relu(self.up(self.down(x)))
            return self.dilated(torch.relu(self.grouped(x)))

    for volume, shape in ((False, (4, 8, 12)), (True, (4, 4, 8, 4))):
        path = to_onnx(Decoder(volume).eval(), torch.randn(2, *shape), tmp_path / "d.onnx")
        imported = import_onnx(path)
        kinds = [layer.kind for layer in imported.net.layers]
        assert kinds.count("deconv") == 3
        x = np.random.default_rng(5).standard_normal((2, *shape))
        want = run_onnx(path, x.astype(np.float32))
        assert imported.net.per_pixel
        got, _ = hpctrain_forward(imported.net, x)
        assert got.shape == want.shape
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
        again = tmp_path / "again.onnx"
        again.write_bytes(model_proto(imported.net, imported.weights).SerializeToString())
        assert np.abs(run_onnx(again, x.astype(np.float32)) - want).max() < 1e-5 * np.abs(
            want).max()

