"""calibrate on several "nodes": MPICH's fork launcher names hosts that all run here, and MPI
treats each as a node of its own (``Split_type(COMM_TYPE_SHARED)`` follows the host names), so
both levels are measured on one machine."""

import os
import re
import subprocess
import sys

import pytest

from hpctrain.cost.machine import load_machine
from tests.test_training_app import mpiexec

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
SCRIPT = """import sys
from mpi4py import MPI
from hpctrain.cli import main
code = main(sys.argv[1:])
print(f"rank {MPI.COMM_WORLD.Get_rank()} exit {code}", flush=True)
sys.exit(code)
"""


def calibrate(tmp_path, *launch, timeout=60):
    """``calibrate --quick`` under ``mpiexec LAUNCH``; each rank prints its exit status."""
    return subprocess.run([mpiexec(), *launch, sys.executable, "-c", SCRIPT, "calibrate",
                           "--quick", "--out", str(tmp_path / "m.toml")],
                          capture_output=True, text=True, timeout=timeout, env=ENV, cwd=tmp_path)


def on_hosts(hosts, procs):
    return ["-launcher", "fork", "-hosts", hosts, "-n", str(procs)]


def test_two_nodes_of_two_give_both_levels(tmp_path):
    result = calibrate(tmp_path, *on_hosts("nodeA:2,nodeB:2", 4))
    assert result.returncode == 0, result.stderr
    machine = load_machine(str(tmp_path / "m.toml"))
    assert machine.levelled and machine.ranks_per_node == 2
    net = machine.network
    for collective in ("allgather", "reduce_scatter", "allreduce", "alltoall", "halo"):
        assert 2 in net.fits[collective]  # 2 nodes (the halo: a message, keyed by 2)
        assert 2 in machine.fits[collective]  # 2 ranks of a node
    assert 1 <= net.nics <= 2
    assert (net.alpha, net.beta) == (net.fits["halo"][2].alpha, net.fits["halo"][2].beta)
    # whole groups of 2 ranks on each of the 2 nodes: the world's all-reduce (the batch group
    # of 1x4) and the model group of 4x1's all-gather and reduce-scatter
    assert {c: set(s) for c, s in net.shapes.items()} == {
        "allreduce": {(2, 2)}, "allgather": {(2, 2)}, "reduce_scatter": {(2, 2)}}
    lines = result.stdout.splitlines()
    assert any(line.split()[:3] == ["shape", "allreduce", "2x2"] for line in lines)
    assert any(line.split()[:2] == ["network", "allreduce"] for line in lines)
    assert any(line.startswith("nics: ") for line in lines)


def test_one_rank_per_node_has_a_network_and_nothing_inside(tmp_path):
    result = calibrate(tmp_path, *on_hosts("nodeA:1,nodeB:1", 2))
    assert result.returncode == 0, result.stderr
    machine = load_machine(str(tmp_path / "m.toml"))
    assert machine.levelled and machine.ranks_per_node == 1 and machine.fits == {}
    assert machine.network.nics == 1 and 2 in machine.network.fits["allreduce"]
    assert "NIC sharing was not measured" in result.stdout


def test_one_node_is_flat_and_says_so(tmp_path):
    result = calibrate(tmp_path, "-n", "2")
    assert result.returncode == 0, result.stderr
    machine = load_machine(str(tmp_path / "m.toml"))
    assert not machine.levelled and machine.ranks_per_node == 2
    assert "measured the node level only" in result.stdout
    assert "[network]" not in (tmp_path / "m.toml").read_text()


def test_round_robin_placement_is_refused_on_every_rank_in_one_line(tmp_path):
    # hosts of one slot each, four ranks: MPICH deals them round-robin, 0 and 2 on nodeA,
    # 1 and 3 on nodeB
    result = calibrate(tmp_path, *on_hosts("nodeA:1,nodeB:1", 4), timeout=30)
    assert result.returncode != 0
    # the ranks' lines may arrive interleaved through the launcher: find each one's status
    exits = sorted(re.findall(r"rank (\d+) exit (\d+)", result.stdout))
    assert exits == [(str(r), "2") for r in range(4)], result.stdout
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("hpctrain: error: calibrate needs ranks to "
                                                     "fill nodes in blocks")
    assert "--distribution=block" in errors[0] and not (tmp_path / "m.toml").exists()
