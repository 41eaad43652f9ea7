"""Two nodes on this machine: MPICH's ``-launcher fork -hosts nodeA:2,nodeB:2`` gives each pair
of ranks its own node (a node-local communicator of 2; messages between the pairs take the
network path). verify and a short training run under a plan made for a profile with levels,
against one process; and the warning when ranks do not fill the nodes in blocks."""

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.test_training_app import mpiexec

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")

# two ranks per node, the network ten times slower than the node's link
PROFILE = """name = "two-nodes"
alpha = 2e-6
beta = 1e-10
flops = 1e10
ranks_per_node = 2
[network]
alpha = 2e-5
beta = 1e-9
nics = 1
"""


def launch(hosts: str | None, procs: int, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HPCTRAIN_CACHE_DIR": str(cwd / "cache")}
    where = ["-launcher", "fork", "-hosts", hosts] if hosts else []
    command = [mpiexec(), *where, "-n", str(procs), sys.executable, "-m", "hpctrain", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=cwd, env=env)


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "two-nodes.toml"
    path.write_text(PROFILE)
    return path


def test_verify_passes_on_two_nodes_under_the_levelled_plan(tmp_path, profile):
    result = launch("nodeA:2,nodeB:2", 4, "verify", "--net", "resdigits", "--grid", "auto",
                    "--batch", "8", "--machine", str(profile), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout and "warning" not in result.stdout


def test_training_on_two_nodes_gives_the_losses_of_one_process(tmp_path, profile):
    common = ("--net", "smallcnn", "--batch", "8", "--steps", "3", "--print-every", "1")
    two = launch("nodeA:2,nodeB:2", 4, *common, "--grid", "auto", "--machine", str(profile),
                 "--log", "two.h5", cwd=tmp_path)
    assert two.returncode == 0, two.stdout + two.stderr
    one = launch(None, 1, *common, "--grid", "1x1", "--log", "one.h5", cwd=tmp_path)
    assert one.returncode == 0, one.stdout + one.stderr
    with h5py.File(tmp_path / "two.h5") as a, h5py.File(tmp_path / "one.h5") as b:
        assert len(a["steps/loss"]) == 3
        np.testing.assert_allclose(a["steps/loss"][:], b["steps/loss"][:], rtol=1e-5)


def test_ranks_not_placed_in_blocks_are_warned_about(tmp_path, profile):
    """One slot per host: MPICH deals the ranks round robin, 0 and 2 on nodeA."""
    result = launch("nodeA:1,nodeB:1", 4, "verify", "--net", "smallcnn", "--grid", "auto",
                    "--batch", "8", "--machine", str(profile), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning: the ranks do not fill nodes in blocks" in result.stdout
