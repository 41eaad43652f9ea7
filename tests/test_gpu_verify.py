"""``verify --device gpu`` on one rank through the strict CuPy stand-in: every shipped net's
forward and backward run on device arrays, touch the host only through explicit copies, and
agree with the serial computation."""

import pytest
from mpi4py import MPI

from hpctrain.commands import verify as verify_command
from tests.gpu_standin import SCALAR, TO_HOST

# (net, image size): small enough to take seconds on two cores
NETS = [("mlp", None), ("smallcnn", None), ("alexnet", 64), ("resnet18", 32),
        ("inception_v3", 75), ("cosmoflow", 32)]


@pytest.mark.parametrize(("net", "size"), NETS, ids=[net for net, _ in NETS])
def test_verify_on_the_gpu_path_passes(standin_cupy, net, size, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["--net", net, "--device", "gpu", "--batch", "2", "--threads", "1"]
    if size is not None:
        argv += ["--image-size", str(size)]
    assert verify_command.run(argv, MPI.COMM_WORLD) == 0
    assert "PASS" in capsys.readouterr().out
    counters = standin_cupy.counters
    assert counters.events[TO_HOST] > 0  # the layers' results came from device arrays
    assert counters.events[SCALAR] == 0  # verify copies whole arrays, never reads a scalar
