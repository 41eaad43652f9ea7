"""Several axes split at once, on 2 to 8 ranks: ``verify`` against one process in float64
under height × width, depth × height × width, channels × height and sample × channels × height
splits; odd sizes and uneven blocks, strided and padded windows, chains and nets with branches
and batch norm."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_training_app import env, launch, mpiexec
from tests.test_volumes_on_ranks import RESIDUAL

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")


def verified(tmp_path, procs: int, net: str, grid: str, *extra: str) -> dict[str, str]:
    """``verify`` on ``procs`` ranks, which must pass below 1e-12; each layer's 'layout in ->
    out' by name."""
    result = launch(procs, "verify", "--net", net, "--grid", grid, "--batch", "4", *extra,
                    tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1].endswith("PASS"), lines[-1]
    assert float(lines[-1].split("largest relative error ")[1].split()[0]) < 1e-12
    start = lines[0].index("layout in -> out")
    # the layouts, then four columns of errors
    return {line.split()[0]: line[start:].rsplit(None, 4)[0].strip() for line in lines[1:-1]}


@pytest.mark.parametrize("procs,grid,conv1", [
    (4, "conv=h2w2,fc=4x1", "4x1 batch/1 height/2 width/2 -> 4x1 batch/1 height/2 width/2"),
    (4, "conv=c2h2,fc=n2c2",
     "4x1 batch/1 height/2 replicated/2 -> 4x1 batch/1 channels/2 height/2"),
    (8, "conv=n2c2h2,fc=8x1",
     "4x2 batch/2 height/2 replicated/2 -> 4x2 batch/2 channels/2 height/2"),
    (2, "conv=w2,fc=2x1", "2x1 batch/1 width/2 -> 2x1 batch/1 width/2"),
])
def test_a_chain_verifies_with_several_axes_split(tmp_path, procs, grid, conv1):
    layouts = verified(tmp_path, procs, "smallcnn", grid, "--image-size", "10")
    assert layouts["conv1"] == conv1


def test_odd_sizes_split_unevenly_verify(tmp_path):
    """An 11×11 image over 3 width blocks (3, 4, 4) and then 11 → 5 rows after the pool, a
    padded 3×3 window: uneven blocks on every rank count that is not a divisor."""
    layouts = verified(tmp_path, 3, "smallcnn", "conv=w3,fc=3x1", "--image-size", "11")
    assert layouts["conv2"].endswith("width/3")


def test_a_net_with_branches_and_batch_norm_verifies_split_in_height_and_width(tmp_path):
    """ResNet-18 at 32×32: the stem and the first stages split 2×2 in height and width, the
    residual adds and batch norms on the same blocks; the stages too small for it fall back to
    channels, as /model asks."""
    layouts = verified(tmp_path, 4, "resnet18", "conv=h2w2/model,fc=4x1", "--image-size", "32")
    assert layouts["conv1"].endswith("height/2 width/2")
    assert layouts["layer1_0.add1"].endswith("height/2 width/2")
    assert layouts["layer4_1.conv2"].endswith("channels/4")


@pytest.mark.parametrize("procs,grid,stem", [
    (8, "conv=d2h2w2,fc=8x1", "8x1 batch/1 depth/2 height/2 width/2"),
    (4, "conv=n1c2d2,fc=2x2", "4x1 batch/1 channels/2 depth/2"),
    (4, "conv=h2w2,fc=4x1", "4x1 batch/1 height/2 width/2"),
])
def test_a_residual_volume_net_verifies_split_along_several_axes(tmp_path, procs, grid, stem):
    """The 3-D residual net (batch norm, a residual add, ``pad=same``, a stride of 1x2x2, a
    global average pool) with its volume cut along two or three axes."""
    (tmp_path / "res3d.net").write_text(RESIDUAL)
    layouts = verified(tmp_path, procs, "res3d.net", grid)
    assert layouts["stem"].endswith(stem)


def test_a_split_naming_an_axis_the_layer_lacks_is_refused(tmp_path):
    result = launch(2, "verify", "--net", "smallcnn", "--grid", "conv=d2,fc=2x1", "--batch",
                    "4", tmp_path=tmp_path)
    assert result.returncode == 2
    assert "layer conv1 has no axis 'd'" in result.stderr


# The case of tests/mpi/test_torch_reference.py on 8 ranks, run as pytest runs it but without
# pytest: only rank 0 runs PyTorch, so only rank 0 imports it. The other ranks import the
# reference with a stand-in for torch that gives its model classes a base and nothing else
# (a call into it fails): 8 ranks importing torch on 2 cores took 8 s, longer than the rest.
# While rank 0 imports it the others sleep in a barrier rather than spin in a collective.
EIGHT_RANKS = """
import sys
import traceback
import types

from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.Get_rank() != 0:
    torch = types.ModuleType("torch")
    torch.nn = types.ModuleType("torch.nn")
    torch.nn.Module = object
    torch.nn.functional = types.ModuleType("torch.nn.functional")
    sys.modules.update({m.__name__: m for m in (torch, torch.nn, torch.nn.functional)})
try:
    from tests.mpi import test_torch_reference as reference

    reference.on_root(comm, lambda: None)
    for case, (model, make_plan) in reference.CASES_ON_8.items():
        if comm.Get_rank() == 0:
            net = reference.MODELS[model][0]()
            for layer, entry in zip(net.layers, make_plan(net), strict=True):
                if layer.kind == "conv":
                    print("plan", case, layer.name, entry.describe())
        reference.test_eight_ranks_split_in_depth_height_and_width_match_pytorch(comm, case)
        if comm.Get_rank() == 0:
            print("passed", case, flush=True)
except BaseException:
    traceback.print_exc()
    sys.stderr.flush()
    comm.Abort(1)
"""


def test_a_volume_net_split_in_depth_height_and_width_matches_pytorch(tmp_path):
    """CosmoFlow at 32³ on 8 ranks, its convolutions cut 2×2×2 in depth, height and width,
    against an independent PyTorch model: two SGD steps from the same weights, float64
    (``tests/mpi/test_torch_reference.py``, whose other cases run on 4 ranks)."""
    if importlib.util.find_spec("torch") is None:  # found, not imported: rank 0 imports it
        pytest.skip("no torch")
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([mpiexec(), "-n", "8", sys.executable, "-c", EIGHT_RANKS],
                            capture_output=True, text=True, timeout=600, cwd=root,
                            env=env(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    case = "cosmoflow-conv=d2h2w2,fc=8x1"
    assert f"passed {case}" in result.stdout.splitlines(), result.stdout
    plans = [line.split(None, 3)[3] for line in result.stdout.splitlines()
             if line.startswith(f"plan {case} ")]
    assert plans == ["split n=1,c=1,d=2,h=2,w=2"] * 5, plans  # each block, 32 planes deep to 2
