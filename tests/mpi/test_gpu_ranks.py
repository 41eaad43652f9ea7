"""The ``--device gpu`` path on the launched ranks, through the strict CuPy stand-in
(:mod:`tests.gpu_standin`): ``verify`` of five nets under batch, model and domain plans, with
MPI staged through the host and CUDA-aware; and what a training step sends through the host.

Every rank computes on stand-in device arrays, which refuse any implicit trip to the host, so a
collective, a halo exchange or a move that handed MPI a device array without the backend's
staging (or handed it host data where the MPI is CUDA-aware) fails here as it would on a GPU.
"""

import pytest
from mpi4py import MPI

from hpctrain.commands import train as train_command
from hpctrain.commands import verify as verify_command
from tests.gpu_standin import TO_HOST
from tests.mpi.helpers import all_agree

# (net, image size, plans, rank counts): small enough for 4 oversubscribed ranks. The two
# largest nets run where their plans differ: AlexNet's model-split classifier is uneven on 3
# ranks, even on 2 and 4; Inception-v3's batch split is the same on every count, so 2 ranks
# cover its branches, and the small nets cover the uneven splits and halos on 3 and 4.
EVERY_COUNT = (2, 3, 4)
CASES = [("smallcnn", 8, ("1x{p}", "conv=domain:{p}x1,fc={p}x1"), EVERY_COUNT),
         ("alexnet", 64, ("conv=1x{p},fc={p}x1",), (2, 3)),
         ("resnet18", 32, ("conv=domain:{p}x1,fc=1x{p}",), EVERY_COUNT),
         ("inception_v3", 75, ("1x{p}",), (2,)),
         ("cosmoflow", 32, ("conv=domain:{p}x1,fc={p}x1",), EVERY_COUNT)]


@pytest.fixture(params=[False, True], ids=["staged-mpi", "cuda-aware-mpi"])
def mpi_reads(request, standin_cupy, monkeypatch):
    """The stand-in, with MPI staged through host memory or reading device memory."""
    if request.param:
        monkeypatch.setenv("HPCTRAIN_CUDA_AWARE_MPI", "1")
    standin_cupy.counters.cuda_aware_mpi = request.param
    return standin_cupy


@pytest.mark.parametrize(("net", "size", "plans", "counts"), CASES, ids=[c[0] for c in CASES])
def test_verify_on_the_gpu_path_passes_on_every_plan(mpi_reads, net, size, plans, counts,
                                                     tmp_path, monkeypatch, capsys):
    comm = MPI.COMM_WORLD
    verify_every_plan(comm, net, size, plans, counts, tmp_path, monkeypatch)
    # the layers ran on device arrays: their results reached the host by explicit copies
    assert all_agree(comm, mpi_reads.counters.events[TO_HOST] > 0)


def verify_every_plan(comm, net, size, plans, counts, tmp_path, monkeypatch, *flags):
    """``verify --device gpu`` of ``net`` under each of ``plans`` (with ``flags``) passes on
    every rank, where the world has one of ``counts`` ranks."""
    p = comm.Get_size()
    if p == 1:  # every plan is 1x1: no message to stage or send, nothing beyond one process
        pytest.skip("one rank sends no message: tests/test_gpu_verify.py checks the GPU path "
                    "of one process")
    if p not in counts:
        pytest.skip(f"{net} runs on {'/'.join(map(str, counts))} ranks: its plans split on "
                    f"{p} as on one of those")
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    for plan in plans:
        argv = ["--net", net, "--image-size", str(size), "--device", "gpu", "--batch",
                str(2 * p), "--threads", "1", "--grid", plan.format(p=p), *flags]
        assert all_agree(comm, verify_command.run(argv, comm) == 0)


# per training step on rank 0 of 2 (smallcnn 16x16, batch 8): waits for the device, copies to
# the host and to the device, with bytes; MPI staged through the host, then CUDA-aware. Under
# 1x2 every gradient goes in one bucket: one staged message for all of them. No wait is per
# layer: the per-layer times and the comm clock are device events, read once at the step's end.
# Both ways: 2 syncs at the step's end (the timer's wait for its last event, the loop's before it
# reads the clock) and the loss totals' copy to the host, which the step prints. Staged, each
# message's copy out waits for the stream (1x2: the gradient bucket and the loss totals; domain:
# 11 messages); CUDA-aware, MPI reads device memory outside the stream, so the stream is
# synchronised before each message instead (a sync each: 2, or 11)
BUDGET_TWO_RANKS = {
    "1x2": ({"sync": 2, "to_host": 3, "to_device": 3, "to_host_bytes": 546392,
             "to_device_bytes": 546376},
            {"sync": 4, "to_host": 1, "to_device": 1, "to_host_bytes": 24,
             "to_device_bytes": 8}),
    "conv=domain:2x1,fc=2x1": ({"sync": 2, "to_host": 12, "to_device": 12,
                                "to_host_bytes": 138000, "to_device_bytes": 137984},
                               {"sync": 13, "to_host": 1, "to_device": 1, "to_host_bytes": 24,
                                "to_device_bytes": 8})}


def per_step(standin, argv, comm):
    """This rank's events per training step: a 4-step run less a 2-step one, halved."""
    found = []
    for steps in (2, 4):
        standin.counters.reset()
        assert all_agree(comm, train_command.run([*argv, "--steps", str(steps)], comm) == 0)
        found.append(standin.counters.snapshot())
    return {k: (found[1][k] - found[0][k]) // 2 for k in found[0] if not k.startswith("scalar")}


@pytest.mark.parametrize("grid", ["1x{p}", "conv=domain:{p}x1,fc={p}x1"])
def test_a_step_copies_each_message_through_the_host_only_where_mpi_is_staged(
        standin_cupy, grid, tmp_path, monkeypatch, capsys):
    """Staged, every message a step sends goes out through the host and comes back; CUDA-aware,
    the step copies what it copies on one rank (the loss totals out, the non-finite flag in).
    On two ranks both are held to their measured budget."""
    comm = MPI.COMM_WORLD
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    p = comm.Get_size()
    argv = ["--net", "smallcnn", "--image-size", "16", "--batch", "8", "--device", "gpu",
            "--compute", "flops", "--threads", "1", "--print-every", "100",
            "--grid", grid.format(p=p)]
    counts = []
    for aware in (False, True):
        standin_cupy.counters.cuda_aware_mpi = aware
        monkeypatch.setenv("HPCTRAIN_CUDA_AWARE_MPI", "1" if aware else "0")
        counts.append(per_step(standin_cupy, argv, comm))
    staged, aware = counts
    assert all_agree(comm, (aware["to_host"], aware["to_device"]) == (1, 1))
    if p > 1:
        assert all_agree(comm, staged["to_host"] > 1 and staged["to_device"] > 1)
    if p == 2 and comm.Get_rank() == 0:
        assert (staged, aware) == BUDGET_TWO_RANKS[grid.format(p=p)]
