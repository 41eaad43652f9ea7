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


PROGRESS_SCRIPT = """import os, sys, time
from pathlib import Path
import hpctrain.comm.benchmarks as benchmarks
from hpctrain.cli import main
go, timed = Path(sys.argv[1]), benchmarks.time_calls

def waiting(world, *args, **kwargs):
    # every timing waits until the test has read rank 0's first progress line: it reaches the
    # test while the job runs only if it was flushed
    deadline = time.monotonic() + 8
    while not go.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("no progress line reached the test within 8 s")
        time.sleep(0.01)
    world.Barrier()
    return 1e-4  # instant: the phases, not the times, are under test

benchmarks.time_calls = waiting
sys.exit(main(sys.argv[2:]))
"""

PHASES = ["4 ranks (2 nodes of 2)", "inside a node: allgather", "inside a node: reduce_scatter",
          "inside a node: allreduce", "inside a node: alltoall and halo",
          "between nodes: allgather", "between nodes: reduce_scatter", "between nodes: allreduce",
          "between nodes: alltoall and halo", "between nodes: NIC sharing",
          "whole groups across nodes", "FLOP rate", "overlap"]


def test_rank_0_says_each_phase_as_it_starts_flushed(tmp_path):
    """On two nodes calibrate runs for minutes: rank 0 prints a line per phase while it runs
    (each timing here waits until the first line has reached the test), once, before the
    table."""
    go = tmp_path / "go"
    buffered = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED"}  # as a batch job's
    job = subprocess.Popen([mpiexec(), *on_hosts("nodeA:2,nodeB:2", 4), sys.executable, "-c",
                            PROGRESS_SCRIPT, str(go), "calibrate", "--quick", "--out",
                            str(tmp_path / "m.toml")], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=buffered, cwd=tmp_path)
    try:
        lines = []
        for line in job.stdout:
            lines.append(line)
            if line.startswith("calibrate: "):
                go.touch()
                break
        lines += job.stdout.readlines()  # (communicate would lose what the loop buffered)
        errors = job.stderr.read()
        job.wait(timeout=60)
    finally:
        job.kill()
    assert job.returncode == 0, errors
    progress = [line for line in lines if line.startswith("calibrate: ")]
    assert len(progress) == len(PHASES), "".join(lines)
    for line, phase in zip(progress, PHASES, strict=True):
        assert re.fullmatch(r"calibrate: \[\d+ s\] .+\n", line) and phase in line, line
    assert lines.index(progress[-1]) < next(k for k, line in enumerate(lines)
                                            if line.startswith("threads: "))
