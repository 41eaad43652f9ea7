"""The ``--device gpu`` path with ``--collectives nccl`` on the launched ranks, through the strict
CuPy and NCCL stand-ins (:mod:`tests.gpu_standin`, :mod:`tests.nccl_standin`): ``verify`` of the
nets and plans of :mod:`tests.mpi.test_gpu_ranks`; a training step that copies nothing to or
from the host for its messages; the primitives against their MPI results; and what NCCL refuses.
"""

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.comm.collectives import AllGather, allreduce_sum
from hpctrain.comm.grid import GridSet
from hpctrain.comm.halo import HaloExchange
from hpctrain.comm.redistribute import Redistribute
from hpctrain.comm.transport import NcclGroup, group_of
from hpctrain.device.backend import make_backend
from hpctrain.errors import UserError
from hpctrain.layout.layout import CHANNEL_AXIS, HEIGHT_AXIS, Layout
from hpctrain.layout.partition import Window, block_ranges, halo_plans
from tests.mpi.helpers import all_agree, block, global_random, host
from tests.mpi.test_gpu_ranks import CASES, per_step, verify_every_plan


@pytest.mark.parametrize(("net", "size", "plans", "counts"), CASES, ids=[c[0] for c in CASES])
def test_verify_under_nccl_passes_on_every_plan(standin_nccl, net, size, plans, counts, tmp_path,
                                                monkeypatch, capsys):
    verify_every_plan(MPI.COMM_WORLD, net, size, plans, counts, tmp_path, monkeypatch,
                      "--collectives", "nccl")


@pytest.mark.parametrize(("grid", "precision"), [("1x{p}", "fp32"),
                                                 ("conv=domain:{p}x1,fc={p}x1", "fp32"),
                                                 ("conv=domain:{p}x1,fc={p}x1", "bf16")])
def test_a_step_under_nccl_copies_only_the_loss_totals_and_the_flag(
        standin_nccl, grid, precision, tmp_path, monkeypatch, capsys):
    """Every message stays on the device: a step copies to the host the loss totals and to the
    device the non-finite flag, as on one rank, and waits for the device as often as it does
    on one rank (the sums are queued on the stream, never waited for). Under bf16 the
    messages and sums are 16-bit, the totals float32."""
    comm = MPI.COMM_WORLD
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    p = comm.Get_size()
    argv = ["--net", "smallcnn", "--image-size", "16", "--batch", "8", "--device", "gpu",
            "--compute", "flops", "--threads", "1", "--print-every", "100",
            "--precision", precision]
    shared = per_step(standin_nccl, [*argv, "--grid", grid.format(p=p),
                                     "--collectives", "nccl"], comm)
    alone = per_step(standin_nccl, [*argv, "--grid", "1x1", "--collectives", "nccl"],
                     MPI.COMM_SELF)
    assert all_agree(comm, (shared["to_host"], shared["to_device"]) == (1, 1))
    assert all_agree(comm, (shared["to_host_bytes"], shared["to_device_bytes"])
                     == (alone["to_host_bytes"], alone["to_device_bytes"]))
    assert all_agree(comm, shared["sync"] == alone["sync"])


def test_collectives_flag_picks_the_transport(standin_nccl, standin_cupy, monkeypatch):
    comm = MPI.COMM_WORLD
    assert make_backend("gpu", "fp32", comm, "auto").collectives == "nccl"
    assert make_backend("gpu", "fp32", comm, "mpi").collectives == "mpi"
    assert make_backend("cpu", "fp32", comm, "auto").collectives == "mpi"
    with pytest.raises(UserError, match="--device gpu"):
        make_backend("cpu", "fp32", comm, "nccl")
    monkeypatch.delattr(standin_cupy.cuda, "nccl")
    assert make_backend("gpu", "fp32", comm, "auto").collectives == "mpi"
    with pytest.raises(UserError, match="no NCCL"):
        make_backend("gpu", "fp32", comm, "nccl")


@pytest.mark.parametrize("dtype", ["fp64", "bf16"])
def test_primitives_under_nccl_give_what_mpi_gives(standin_nccl, dtype):
    comm = MPI.COMM_WORLD
    p, rank = comm.Get_size(), comm.Get_rank()
    nccl = make_backend("gpu", dtype, comm, "nccl")
    mpi = make_backend("gpu", dtype, comm, "mpi")
    xp, storage = nccl.xp, nccl.dtype
    results = []
    with GridSet(comm) as grids:
        for backend in (nccl, mpi):
            found = []
            # uneven all-gather and its reduce-scatter: NCCL pads to the largest block
            ranges = tuple(block_ranges(2 * p + 1, p))
            lo, hi = ranges[rank]
            x = global_random((3, 2 * p + 1, 2), 1).astype(storage)
            gather = AllGather(backend, comm, CHANNEL_AXIS, ranges)
            found.append(gather.forward(xp.asarray(np.ascontiguousarray(x[:, lo:hi]))))
            dy = global_random((3, 2 * p + 1, 2), 10 + rank).astype(storage)
            found.append(gather.backward(xp.asarray(dy)))
            found.append(allreduce_sum(backend, comm, xp.asarray(dy)))
            # a halo exchange and its adjoint
            plan = halo_plans(4 * p, p, Window(3, 1, 1), "test")[rank]
            x = global_random((2, 2, 4 * p, 3), 2).astype(storage)
            halo = HaloExchange(backend, comm, plan)
            ext = halo.finish(halo.start(xp.asarray(np.ascontiguousarray(
                x[:, :, plan.own[0]:plan.own[1]]))))
            found += [ext, halo.finish_backward(halo.start_backward(ext * 2))]
            # a general move and its adjoint
            shape = (2 * p, 2 * p, 2 * p, 3)
            src, dst = Layout(shape, (p, 1), CHANNEL_AXIS), Layout(shape, (p, 1), HEIGHT_AXIS)
            move = Redistribute(backend, grids, src, dst)
            y = move.forward(block(backend, global_random(shape, 3).astype(storage), src, rank))
            found += [y, move.backward(y * 3)]
            results.append(found)
    assert p == 1 or isinstance(group_of(nccl, comm), NcclGroup)
    # moves are exact; sums (the reduce-scatter, the all-reduce) may round in another order:
    # NCCL's stand-in rounds a 16-bit sum once, MPI's operation at each addition
    tol = {"fp64": 1e-13, "bf16": 2.0 ** -8 * p}[dtype]
    ok = True
    for k, (a, b) in enumerate(zip(*results, strict=True)):
        a, b = host(a).astype(np.float64), host(b).astype(np.float64)
        ok = ok and a.shape == b.shape and (np.allclose(a, b, rtol=tol, atol=tol * 4)
                                            if k in (1, 2) else np.array_equal(a, b))
    assert all_agree(comm, ok and all(a.dtype == b.dtype for a, b in zip(*results)))


def test_the_standin_refuses_what_nccl_refuses(standin_nccl):
    from tests import nccl_standin as nccl

    comm = MPI.COMM_WORLD
    p, rank = comm.Get_size(), comm.Get_rank()
    uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
    nc = nccl.NcclCommunicator(p, uid, rank)
    xp, stream = standin_nccl, 0
    a = xp.zeros(4, dtype=np.float32)
    refused = []

    def refuses(call, fragment):
        try:
            call()
        except nccl.NcclError as err:
            refused.append(fragment in str(err))
        else:
            refused.append(False)

    host_array = np.zeros(4, np.float32)
    refuses(lambda: nc.allReduce(host_array.ctypes.data, host_array.ctypes.data, 4,
                                 nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream), "host memory")
    refuses(lambda: nc.allReduce(a, a, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream),
            "device pointer")
    refuses(lambda: nc.allReduce(a.data.ptr, a.data.ptr, 4, nccl.NCCL_FLOAT16, nccl.NCCL_SUM,
                                 stream), "passed as NCCL datatype")
    refuses(lambda: nc.allReduce(a.data.ptr, a.data.ptr, 5, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                                 stream), "past the end")
    refuses(lambda: nc.send(a.data.ptr, 4, nccl.NCCL_FLOAT32, (rank + 1) % p, stream),
            "outside groupStart")
    if p > 1:
        # ranks that disagree on the count all hear of it
        refuses(lambda: nc.allReduce(a.data.ptr, a.data.ptr, 4 if rank == 0 else 3,
                                     nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream),
                "ranks disagree")
        # a receive that expects more entries than its peer sends fails where it is received
        got = xp.zeros(4, dtype=np.float32)
        try:
            nccl.groupStart()
            nc.send(a.data.ptr, 3 if rank == 0 else 4, nccl.NCCL_FLOAT32, (rank + 1) % p,
                    stream)
            nc.recv(got.data.ptr, 4, nccl.NCCL_FLOAT32, (rank - 1) % p, stream)
            nccl.groupEnd()
            mine = False
        except nccl.NcclError as err:
            mine = "met a send of 3" in str(err)
        refused.append(bool(comm.allreduce(int(mine))))
    standin_nccl.counters.devices, standin_nccl.counters.current_device = 2, 1
    refuses(lambda: nc.size(), "device")
    standin_nccl.counters.current_device = 0
    nc.destroy()
    refuses(lambda: nc.size(), "destroyed")
    assert all_agree(comm, all(refused))
