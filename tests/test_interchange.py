"""Models in and out, as a user runs them: a PyTorch model exported to ONNX, trained under a
plan on 2 ranks, exported back, and predicted with; torchvision's own models loading what
``export`` writes with ``strict=True``; ``--init`` from a torchvision state dict; a CosmoFlow
written in PyTorch that imports, plans and trains as the shipped ``cosmoflow``; and the
refusals, each one line with status 2.

Every comparison is with an independent computation: torchvision's model in PyTorch, or
onnxruntime running the exported file, relative error 1e-5 in float32.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpctrain.interchange.onnx_export import model_proto
from hpctrain.interchange.weights import state_dict
from hpctrain.model.net import load_net
from tests.reliability import assert_refused, launch
from tests.test_training_app import mpiexec

pytestmark = [pytest.mark.skipif(mpiexec() is None, reason="no mpiexec"),
              pytest.mark.reference]
torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
from safetensors.torch import load_file, save_file  # noqa: E402

TOLERANCE = 1e-5


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def randomise_statistics(model, seed: int = 0):
    """Running statistics far from 0 and 1, and a scale and shift off their defaults, so that
    a mapping that confuses them shows."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            n = module.num_features
            module.running_mean.copy_(torch.randn(n, generator=generator) * 0.2)
            module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
            module.weight.data.copy_(torch.rand(n, generator=generator) + 0.5)
            module.bias.data.copy_(torch.randn(n, generator=generator) * 0.1)
    return model.eval()


def to_onnx(model, x, path: Path) -> Path:
    """``model`` as ``torch.onnx.export`` writes it in training-preserving mode, the batch
    axis dynamic: the form the docs tell users to export."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), opset_version=17, dynamo=False,
                          input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                          training=torch.onnx.TrainingMode.PRESERVE,
                          do_constant_folding=False)
    return path


def run_onnx(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def succeeded(outcome) -> str:
    assert outcome.returncode == 0, (outcome.stdout[-3000:], outcome.stderr[-3000:])
    return outcome.stdout


def random_tensors(net, seed: int = 0) -> dict[str, np.ndarray]:
    """Every parameter and buffer of ``net``, seeded, variances positive."""
    rng = np.random.default_rng(seed)
    shapes = {**net.param_shapes(), **net.buffer_shapes()}
    found = {}
    for name, shape in shapes.items():
        value = rng.standard_normal(shape).astype(np.float32) * 0.05
        if name.endswith("running_var") or name.endswith("gamma"):
            value = np.abs(value) + 0.5
        found[name] = value
    return found


TORCHVISION = {"resnet18": {}, "resnet50": {}, "alexnet": {}, "vgg16": {},
               "inception_v3": {"aux_logits": False, "init_weights": False}}


@pytest.mark.parametrize("name", sorted(TORCHVISION))
def test_torchvision_loads_a_shipped_nets_state_dict_strictly(name):
    """The state dict ``export`` writes for a shipped torchvision net loads into
    torchvision's own model with ``strict=True``, every tensor where torchvision reads it."""
    net = load_net(name)
    tensors = random_tensors(net)
    found = state_dict(net, tensors, steps=7)
    model = getattr(torchvision.models, name)(**TORCHVISION[name])
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in found.items()},
                          strict=True)
    loaded = model.state_dict()
    for key, value in found.items():
        assert np.array_equal(loaded[key].numpy(), value), key


@pytest.mark.parametrize("name,size", [("resnet18", 32), ("inception_v3", 75)])
def test_an_exported_shipped_net_runs_in_onnxruntime_as_in_torchvision(name, size):
    """``model_proto`` of a shipped net (inference form, running statistics) computes in
    onnxruntime what torchvision's model computes from the same state dict."""
    net = load_net(name, size)
    tensors = random_tensors(net, seed=1)
    model = getattr(torchvision.models, name)(**TORCHVISION[name])
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in
                           state_dict(net, tensors).items()}, strict=True)
    x = np.random.default_rng(2).standard_normal((2, *net.input_shape)).astype(np.float32)
    with torch.no_grad():
        want = model.eval()(torch.from_numpy(x)).numpy()
    session = ort.InferenceSession(model_proto(net, tensors).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    assert relative(session.run(None, {"input": x})[0], want) < TOLERANCE


@pytest.fixture(scope="module")
def resnet_onnx(tmp_path_factory) -> Path:
    """torchvision's ResNet-18 with 10 classes, statistics randomised, exported at 32²."""
    torch.manual_seed(0)
    model = randomise_statistics(torchvision.models.resnet18(num_classes=10))
    return to_onnx(model, torch.randn(2, 3, 32, 32),
                   tmp_path_factory.mktemp("resnet") / "resnet18.onnx")


def test_import_train_export_and_predict_agree_with_onnxruntime_and_torchvision(
        tmp_path, resnet_onnx):
    """The round trip: an exported ResNet-18 trains two steps on 2 ranks under a mixed plan
    (its layers named as PyTorch names them in the plan file), goes back out as ONNX and as a
    state dict, and ``predict`` on 2 ranks under the forward-only auto plan gives what
    onnxruntime gives on the exported model and torchvision on the state dict."""
    plan = tmp_path / "mixed.plan"
    succeeded(launch("--net", str(resnet_onnx), "--batch", "8", "--steps", "1", "--grid",
                     "auto", "--compute", "flops", "--machine", "cori-knl", "--plan-only",
                     "--plan-file", str(plan), cwd=tmp_path))
    lines = plan.read_text().splitlines()
    assert any(line.startswith("layer2.0.conv1 ") for line in lines), lines
    succeeded(launch("--net", str(resnet_onnx), "--batch", "8", "--steps", "2", "--lr",
                     "0.1", "--grid", "conv=2x1,fc=2x1", "--checkpoint-dir", "ck",
                     cwd=tmp_path, timeout=180))
    for out in ("trained.onnx", "trained.safetensors"):
        succeeded(launch("export", "--checkpoint", "ck", "--out", out, cwd=tmp_path, procs=1))
    x = np.random.default_rng(3).standard_normal((10, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    shown = succeeded(launch("predict", "--checkpoint", "ck", "--data", "x.npy", "--out",
                             "p.h5", "--batch", "4", "--grid", "auto", cwd=tmp_path,
                             timeout=180))
    assert "predicted 10 samples" in shown
    with h5py.File(tmp_path / "p.h5") as h5:
        outputs = h5["outputs"][...]
        assert h5.attrs["format"] == "hpctrain-predictions"
    assert outputs.shape == (10, 10)
    assert relative(outputs, run_onnx(tmp_path / "trained.onnx", x)) < TOLERANCE
    model = torchvision.models.resnet18(num_classes=10)
    model.load_state_dict(load_file(str(tmp_path / "trained.safetensors")), strict=True)
    with torch.no_grad():
        torch_outputs = model.eval()(torch.from_numpy(x)).numpy()
    assert relative(outputs, torch_outputs) < TOLERANCE
    before = run_onnx(resnet_onnx, x)
    assert relative(outputs, before) > 1e-3  # the two steps trained


def test_init_takes_torchvision_weights_into_the_shipped_net_and_a_new_head(tmp_path,
                                                                          resnet_onnx):
    """``--init`` reads a torchvision state dict into the shipped ResNet-18 by torchvision's
    names; into the 10-class imported ResNet a 1000-class head is refused, naming the layer
    and its shapes, until ``--init-except fc`` keeps it fresh."""
    torch.manual_seed(1)
    model = randomise_statistics(torchvision.models.resnet18())
    save_file(model.state_dict(), str(tmp_path / "tv.safetensors"))
    x = np.random.default_rng(4).standard_normal((4, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    succeeded(launch("predict", "--net", "resnet18", "--image-size", "32", "--init",
                     "tv.safetensors", "--data", "x.npy", "--out", "p.h5", "--grid", "2x1",
                     cwd=tmp_path))
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    with h5py.File(tmp_path / "p.h5") as h5:
        assert relative(h5["outputs"][...], want) < TOLERANCE
    refused = launch("--net", str(resnet_onnx), "--init", "tv.safetensors", "--steps", "1",
                     "--batch", "4", cwd=tmp_path)
    assert_refused(refused, "layer fc: weight (10, 512) in the net, (1000, 512) in the file")
    assert "--init-except fc" in refused.error_lines[0]
    succeeded(launch("--net", str(resnet_onnx), "--init", "tv.safetensors", "--init-except",
                     "fc", "--steps", "1", "--batch", "4", cwd=tmp_path))
    # the other way: the 10-class ONNX model's weights into the shipped 1000-class net
    refused = launch("--net", "resnet18", "--image-size", "32", "--init", str(resnet_onnx),
                     "--steps", "1", "--batch", "4", cwd=tmp_path)
    assert_refused(refused, "layer fc: weight (1000, 512) in the net, (10, 512) in the file")


class CosmoBlock(torch.nn.Module):
    """A CosmoFlow block as the shipped net's: conv 2³ 'same', leaky ReLU 0.3, max-pool 2³."""

    def __init__(self, channels: int, out: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv3d(channels, out, 2, padding="same")

    def forward(self, x):
        return torch.nn.functional.max_pool3d(
            torch.nn.functional.leaky_relu(self.conv1(x), 0.3), 2)


class CosmoFlow(torch.nn.Module):
    """CosmoFlow in PyTorch, its modules named as the shipped ``cosmoflow``'s layers."""

    def __init__(self, size: int) -> None:
        super().__init__()
        widths = [4, 16, 32, 64, 128, 256]
        for k in range(5):
            setattr(self, f"block{k + 1}", CosmoBlock(widths[k], widths[k + 1]))
        self.linear1 = torch.nn.Linear(256 * (size // 32) ** 3, 128)
        self.linear2 = torch.nn.Linear(128, 64)
        self.linear3 = torch.nn.Linear(64, 4)

    def forward(self, x):
        for k in range(5):
            x = getattr(self, f"block{k + 1}")(x)
        x = x.view(x.size(0), -1)
        x = torch.nn.functional.leaky_relu(self.linear1(x), 0.3)
        x = torch.nn.functional.leaky_relu(self.linear2(x), 0.3)
        return torch.tanh(self.linear3(x)) * 1.2


def test_a_pytorch_cosmoflow_imports_plans_and_trains_as_the_shipped_one(tmp_path):
    """CosmoFlow written in PyTorch and exported imports to the shipped net's layers and
    parameters, gets the shipped net's plan, and trains two steps on 2 ranks to the same losses
    as the shipped net started from the same weights (``--init`` the ONNX file)."""
    from hpctrain.interchange.onnx_import import import_onnx

    torch.manual_seed(5)
    path = to_onnx(CosmoFlow(32).eval(), torch.randn(2, 4, 32, 32, 32), tmp_path / "cf.onnx")
    imported = import_onnx(path, regression=True).net
    shipped = load_net("cosmoflow", 32)
    assert [layer.kind for layer in imported.layers] == [layer.kind for layer in shipped.layers]
    assert [s.options for s in imported.layers] == [s.options for s in shipped.layers]
    assert list(imported.param_shapes().values()) == list(shipped.param_shapes().values())
    plans = []
    for net in (str(path), "cosmoflow"):
        out = tmp_path / f"{Path(net).stem}.plan"
        succeeded(launch("plan", "--net", net, "--image-size", "32", "--procs", "8", "--batch",
                         "16", "--machine", "cori-knl", "--loss", "mse", "--out", str(out),
                         cwd=tmp_path, procs=1))
        plans.append([line.split()[1:] for line in out.read_text().splitlines()
                      if line and not line.startswith("#")])
    assert plans[0] == plans[1]
    losses = []
    for net, extra in ((str(path), ["--loss", "mse"]), ("cosmoflow", ["--init", str(path)])):
        shown = succeeded(launch("--net", net, "--image-size", "32", "--batch", "4", "--steps",
                                 "2", "--grid", "conv=domain:2x1,fc=2x1", "--log",
                                 f"{Path(net).stem}.h5", *extra, cwd=tmp_path, timeout=180))
        assert "step     2/2" in shown
        with h5py.File(tmp_path / f"{Path(net).stem}.h5") as h5:
            losses.append(h5["steps/loss"][...])
    assert np.array_equal(losses[0], losses[1])


def test_unsupported_graphs_bad_files_and_flags_are_refused_in_one_line(tmp_path, resnet_onnx):
    """Status 2 and one line: an ONNX model with operators no kind computes (every such node
    named), a file that is no ONNX model, predict without weights, and the flags that would
    pass in silence."""
    onnx = pytest.importorskip("onnx")
    model = onnx.load(str(resnet_onnx))
    last = model.graph.output[0].name
    model.graph.node.append(onnx.helper.make_node("Softmax", [last], ["probs"], name="head"))
    model.graph.node.append(onnx.helper.make_node("Erf", ["probs"], ["gated"], name="gate"))
    model.graph.output[0].name = "gated"
    onnx.save(model, str(tmp_path / "softmax.onnx"))
    outcome = launch("--net", "softmax.onnx", "--steps", "1", cwd=tmp_path)
    assert_refused(outcome, "2 node(s) map onto no hpctrain layer kind")
    assert "Softmax 'head'" in outcome.error_lines[0]
    assert "Erf 'gate'" in outcome.error_lines[0]
    (tmp_path / "junk.onnx").write_bytes(np.random.default_rng(0).bytes(999))
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 32, 32), np.float32))
    np.save(tmp_path / "pixels.npy", np.zeros((2, 3, 32, 32), np.uint8))
    net = str(resnet_onnx)
    for args, message in (
            (["--net", "junk.onnx", "--steps", "1"], "not a valid ONNX model"),
            (["predict", "--data", "x.npy", "--out", "p.h5"],
             "predict needs the net and its weights"),
            (["predict", "--net", net, "--data", "x.npy", "--split", "train", "--out", "p.h5"],
             "--split train"),
            (["predict", "--net", net, "--data", "pixels.npy", "--out", "p.h5"],
             "give (N, *sample) floats"),
            (["predict", "--net", net, "--data", "x.npy", "--out", "p.h5", "--plan-file",
              "my.plan"], "give --grid auto, or drop --plan-file"),
            (["--net", net, "--init-except", "fc", "--steps", "1"], "give --init FILE too"),
            (["--net", net, "--init", net, "--init-except", "nothing_here", "--steps", "1"],
             "--init-except nothing_here"),
            (["export", "--checkpoint", "nowhere", "--out", "model.pt"], "must end in .onnx")):
        assert_refused(in_process(args, tmp_path), message)


def in_process(args: list[str], cwd: Path):
    """``python -m hpctrain ARGS`` run in this process, on one rank (no launch: a refusal
    comes before anything collective), as the command line exits: status and standard
    error."""
    import contextlib
    import io
    import os

    from hpctrain.cli import main
    from tests.reliability import Outcome

    before, stderr = Path.cwd(), io.StringIO()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(stderr):
            code = main(list(args))
    finally:
        os.chdir(before)
    return Outcome(code, "", stderr.getvalue(), 0.0)


def test_the_default_plan_file_stays_in_runs_whatever_the_nets_path():
    """``--grid auto`` writes runs/NET-pP-bB-sSIZE-PRECISION.plan, NET the net file's name
    without its folder and suffix: a model given as ``../models/x.onnx`` or by an absolute
    path writes no folder of its own under runs/, nor beside it. The image size and the
    precision are in the name: a run at 127² does not overwrite the 224² run's plan."""
    from hpctrain.commands.setup import plan_file_path
    from hpctrain.model.net import parse_net

    for name, stem in (("../models/res net.onnx", "res_net"), ("/abs/x.net", "x"),
                       ("alexnet", "alexnet")):
        net = parse_net("input features=4 classes=2\nlinear out=2\n", name)
        assert plan_file_path(None, net, 4, 16, "fp32") == Path(f"runs/{stem}-p4-b16-fp32.plan")
        assert plan_file_path(None, net, 4, 16, "bf16", "predict") == Path(
            f"runs/{stem}-p4-b16-bf16-predict.plan")
    assert plan_file_path("mine.plan", net, 4, 16, "fp32") == Path("mine.plan")
    square = parse_net("input channels=3 size=224 classes=2\nconv out=2 kernel=1\n", "alexnet")
    wide = parse_net("input channels=3 height=768 width=1152 classes=2\nconv out=2 kernel=1\n",
                     "deepcam")
    assert plan_file_path(None, square, 4, 16, "fp32") == Path("runs/alexnet-p4-b16-s224-fp32.plan")
    assert plan_file_path(None, wide, 4, 16, "tf32") == Path(
        "runs/deepcam-p4-b16-s768x1152-tf32.plan")


def test_init_except_covers_a_module_and_every_layer_under_it():
    """``--init-except layer4`` keeps every layer of ResNet-18's last stage fresh, by either
    spelling, and not ``layer40``-like neighbours; ``classifier.6`` is AlexNet's ``fc8``."""
    from hpctrain.interchange.weights import fresh_layers

    net = load_net("resnet18", 32)
    stage = {layer.name for layer in net.layers if layer.name.startswith("layer4_")}
    assert fresh_layers(net, ("layer4",))[0] == stage
    assert fresh_layers(net, ("layer4.0.conv1",))[0] == {"layer4_0.conv1"}
    assert fresh_layers(net, ("layer4_0.conv1",))[0] == {"layer4_0.conv1"}
    assert fresh_layers(load_net("alexnet"), ("classifier.6",))[0] == {"fc8"}
    assert fresh_layers(net, ("layer",))[0] == set()


def test_an_onnx_export_over_two_gib_is_refused_for_a_state_dict():
    """protobuf holds 2 GiB at most: a larger net is refused in one line naming its size and
    the state dict to write instead (no tensor is read to find out)."""
    from hpctrain.errors import UserError
    from hpctrain.model.net import parse_net

    net = parse_net("input features=24000 classes=2\nlinear out=24000\nlinear out=2\n", "big")
    tensors = {name: np.broadcast_to(np.float32(0), shape)
               for name, shape in net.param_shapes().items()}
    with pytest.raises(UserError, match=r"2\.15 GiB of weights.*\.safetensors"):
        model_proto(net, tensors)


def test_evaluation_keeps_nothing_for_a_backward():
    """After a forward in evaluation no layer holds its columns, its input or its output for
    a backward that will not come (the forward-only memory model counts none)."""
    from mpi4py import MPI

    from hpctrain.comm.grid import GridSet
    from hpctrain.device.backend import Backend
    from hpctrain.plan.plans import plan_from_spec
    from hpctrain.run.network import Network

    net = load_net("resdigits").with_statistics("global", 1)
    with GridSet(MPI.COMM_SELF) as grids:
        network = Network(net, plan_from_spec("1x1", net, 1), 4, grids,
                          Backend(np, np.float32), 0)
        network.set_training(False)
        network.forward(np.zeros((4, *net.input_shape), np.float32), 0)
        kept = {layer.name: name for layer in network.layers for name in ("bands", "x", "y")
                if getattr(layer, name, None) is not None}
    assert kept == {}


def test_an_onnx_net_without_the_onnx_package_names_the_extra(monkeypatch, resnet_onnx):
    """Where onnx is not installed, ``--net model.onnx`` says which extra installs it."""
    import sys

    from hpctrain.errors import UserError
    from hpctrain.interchange.nets import load_network

    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx then raises ImportError
    with pytest.raises(UserError, match=r"pip install 'hpctrain\[onnx\]'"):
        load_network(str(resnet_onnx))
