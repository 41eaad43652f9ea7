"""Threads per rank: the rules, in order, and that the limit reaches the BLAS (serial)."""

import os

import pytest

from hpctrain.device.threads import NodeShare, choose_threads, configure_threads

UNBOUND = NodeShare(cpus=64, machine_cpus=64, ranks_on_node=16, ranks_on_mask=16)
BOUND = NodeShare(cpus=8, machine_cpus=64, ranks_on_node=16, ranks_on_mask=2)


@pytest.mark.parametrize("requested, environ, share, want", [
    # nothing said: the node's CPUs over the ranks on the node
    (None, {}, UNBOUND, 4),
    # more ranks than CPUs (oversubscribed): never fewer than one
    (None, {}, NodeShare(2, 2, 4, 4), 1),
    # an affinity mask from the launcher: its CPUs, shared by the ranks bound to it
    (None, {}, BOUND, 4),
    (None, {}, NodeShare(1, 64, 64, 1), 1),
    # the mask wins over SLURM_CPUS_PER_TASK, which wins over the node's share
    (None, {"SLURM_CPUS_PER_TASK": "6"}, BOUND, 4),
    (None, {"SLURM_CPUS_PER_TASK": "6"}, UNBOUND, 6),
    # an explicit OMP_NUM_THREADS (or a BLAS's own variable) is the user's word
    (None, {"OMP_NUM_THREADS": "3", "SLURM_CPUS_PER_TASK": "6"}, BOUND, 3),
    (None, {"OMP_NUM_THREADS": "2,1"}, UNBOUND, 2),
    (None, {"OPENBLAS_NUM_THREADS": "5"}, UNBOUND, 5),
    # unusable values are ignored, not obeyed
    (None, {"OMP_NUM_THREADS": "0", "SLURM_CPUS_PER_TASK": "x"}, UNBOUND, 4),
    (None, {"OMP_NUM_THREADS": ""}, UNBOUND, 4),
    # --threads overrides everything
    (7, {"OMP_NUM_THREADS": "3"}, BOUND, 7),
])
def test_the_first_rule_that_applies_decides(requested, environ, share, want):
    threads, reason = choose_threads(requested, environ, share)
    assert threads == want and reason


def test_the_reason_names_the_rule():
    assert choose_threads(None, {"OMP_NUM_THREADS": "3"}, UNBOUND)[1] == "OMP_NUM_THREADS=3"
    assert "affinity" in choose_threads(None, {}, BOUND)[1]
    assert choose_threads(2, {}, UNBOUND)[1] == "--threads 2"


def test_the_limit_reaches_every_blas_pool():
    from threadpoolctl import threadpool_info, threadpool_limits

    with threadpool_limits():  # restore this process's pools afterwards
        choice = configure_threads(requested=1)
        pools = [p for p in threadpool_info() if p["user_api"] == "blas"]
        assert choice.threads == 1 and "1 thread per rank" in choice.describe()
        assert pools and all(p["num_threads"] == 1 for p in pools)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs CPU affinity")
def test_affinity_is_the_mask_or_every_cpu(monkeypatch):
    from hpctrain.device import cpus

    assert cpus.affinity() == frozenset(os.sched_getaffinity(0))
    monkeypatch.delattr(os, "sched_getaffinity")  # as on macOS
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert cpus.affinity() == frozenset({0, 1, 2})
