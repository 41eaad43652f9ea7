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
from hpctrain.comm.transport import NcclGroup, group_of, release
from hpctrain.device.backend import make_backend
from hpctrain.errors import UserError
from hpctrain.layers.base import Parameter
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
    # moves are exact; sums (the reduce-scatter, the all-reduce) round in another order: a
    # 16-bit sum is rounded at each of the P − 1 hops of NCCL's ring, and at each of the P − 1
    # additions of MPI's operation, each rounding within half an ulp (2^-8 of a bf16 value):
    # the two differ by at most the sum of both
    tol = {"fp64": 1e-13, "bf16": 2 * max(p - 1, 1) * 2.0 ** -8}[dtype]
    ok = True
    for k, (a, b) in enumerate(zip(*results, strict=True)):
        a, b = host(a).astype(np.float64), host(b).astype(np.float64)
        ok = ok and a.shape == b.shape and (np.allclose(a, b, rtol=tol, atol=tol * 4)
                                            if k in (1, 2) else np.array_equal(a, b))
    assert all_agree(comm, ok and all(a.dtype == b.dtype for a, b in zip(*results)))


def node_rank(comm, size: bool = False) -> int:
    """This rank's rank on its node, the device the stand-in gives it (one per rank); with
    ``size``, the number of ranks on its node."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size() if size else node.Get_rank()
    finally:
        node.Free()


def test_the_standin_refuses_what_nccl_refuses(standin_nccl):
    """Host memory, a datatype other than the buffer's, a count past its end, a send outside
    a group and ranks that disagree on a call are the stand-in's own checks (NCCL would fault,
    read garbage or hang); another device current and a destroyed communicator NCCL's."""
    from tests import nccl_standin as nccl

    comm = MPI.COMM_WORLD
    p, rank = comm.Get_size(), comm.Get_rank()
    own = node_rank(comm)
    standin_nccl.cuda.Device(own).use()
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
    standin_nccl.counters.devices += 1
    standin_nccl.counters.current_device = standin_nccl.counters.devices - 1
    refuses(lambda: nc.size(), "device")
    standin_nccl.counters.current_device = own
    nc.destroy()
    refuses(lambda: nc.size(), "destroyed")
    assert all_agree(comm, all(refused))


def test_ranks_sharing_a_gpu_run_mpi_unless_nccl_lets_them(standin_nccl, monkeypatch, capsys):
    """Every rank of a node on one GPU. NCCL before 2.30.3 refuses a communicator whose ranks
    share a device (the stand-in refuses it too, on every rank): auto picks MPI, and says so
    on rank 0 only; ``--collectives nccl`` is refused on every rank, in one line. NCCL 2.30.3
    with NCCL_MULTI_RANK_GPU_ENABLE=1 runs them."""
    from tests import nccl_standin as nccl

    comm = MPI.COMM_WORLD
    release(comm)  # a communicator an earlier test left, made on a device of its own
    shared = node_rank(comm, size=True) > 1
    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
    standin_nccl.counters.devices = 1
    capsys.readouterr()
    auto = make_backend("gpu", "fp32", comm, "auto")
    said = capsys.readouterr().out
    ok = auto.collectives == ("mpi" if shared else "nccl")
    ok = ok and (said.startswith("collectives: mpi (") if shared and comm.Get_rank() == 0
                 else said == "")
    try:
        make_backend("gpu", "fp32", comm, "nccl")
        refused = ""
    except UserError as err:
        refused = str(err)
    ok = ok and (("NCCL 2.21.5" in refused and "--collectives mpi" in refused
                  and "\n" not in refused) if shared else refused == "")
    if shared:  # what NCCL itself does with such a communicator: refuses it everywhere
        uid = comm.bcast(nccl.get_unique_id() if comm.Get_rank() == 0 else None, root=0)
        try:
            nccl.NcclCommunicator(comm.Get_size(), uid, comm.Get_rank())
            ok = False
        except nccl.NcclError as err:
            ok = ok and "ncclInvalidUsage" in str(err)
    monkeypatch.setattr(nccl, "VERSION", 23003)
    monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1")
    allowed = make_backend("gpu", "fp32", comm, "nccl")
    ok = ok and allowed.collectives == "nccl"
    with GridSet(comm) as grids:
        x = allowed.xp.ones(3, dtype=np.float32)
        ok = ok and np.all(host(allreduce_sum(allowed, grids.world, x)) == comm.Get_size())
    assert all_agree(comm, ok)


def test_grids_destroy_their_nccl_communicators_on_every_rank_and_abort_on_an_error(
        standin_nccl):
    """A normal exit destroys every NCCL communicator, the world's too (before MPI finalises),
    on every rank: ncclCommDestroy is collective. An exception aborts them instead: a destroy
    on the rank that raised would wait for ranks still inside a collective."""
    from tests import nccl_standin as nccl

    comm = MPI.COMM_WORLD
    p = comm.Get_size()
    release(comm)  # a communicator an earlier test left
    nccl.ended.clear()
    backend = make_backend("gpu", "fp32", comm, "nccl")
    x = backend.xp.ones(2, dtype=np.float32)
    with GridSet(comm) as grids:
        allreduce_sum(backend, grids.world, x)
        allreduce_sum(backend, grids.get((1, p)).batch_comm, x)
    destroyed = list(nccl.ended)
    nccl.ended.clear()
    with pytest.raises(RuntimeError, match="a layer failed"), GridSet(comm) as grids:
        allreduce_sum(backend, grids.world, x)
        raise RuntimeError("a layer failed")
    aborted = list(nccl.ended)
    # one communicator of the world, and for P > 1 the batch communicator's own
    want = 0 if p == 1 else 2
    ok = sorted(destroyed) == [("destroy", comm.Get_rank(), p)] * want
    ok = ok and aborted == [("abort", comm.Get_rank(), p)] * (want // 2)
    assert all_agree(comm, ok)


def test_a_bf16_sum_rounds_at_each_hop_of_the_ring(standin_nccl):
    """1 on rank 0 and 2^-8 on each other rank: each hop adds half an ulp of 1 and rounds to
    even, back to 1, so NCCL's ring gives 1 where one rounding of the whole sum would give
    1 + (P − 1)·2^-8: a 16-bit sum is P − 1 roundings off, not one."""
    from ml_dtypes import bfloat16

    comm = MPI.COMM_WORLD
    p, rank = comm.Get_size(), comm.Get_rank()
    backend = make_backend("gpu", "bf16", comm, "nccl")
    x = backend.xp.asarray(np.full(4, 1.0 if rank == 0 else 2.0 ** -8, dtype=bfloat16))
    with GridSet(comm) as grids:
        got = host(allreduce_sum(backend, grids.world, x)).astype(np.float64)
    exact = 1 + (p - 1) * 2.0 ** -8
    ok = np.all(got == 1.0) and np.all(np.abs(got - exact) <= (p - 1) * 2.0 ** -8)
    assert all_agree(comm, bool(ok))


def _reduce_in_flight(backend, comm, steps=2):
    """Gradients of four layers on the world and halves of it, summed in flight in buckets of
    one layer, as ``--overlap`` sums them: (whether every parameter was handed over with its
    sum, the streams the sums were queued on, the host waits the reducer made)."""
    from hpctrain.comm.gradients import GradientReducer
    from tests import nccl_standin as nccl

    xp, rank = backend.xp, comm.Get_rank()
    half = comm.Split(rank % 2, rank)
    streams = []
    queue = nccl.NcclCommunicator.allReduce

    def allreduce(self, send, recv, count, datatype, op, stream):
        streams.append(stream)
        return queue(self, send, recv, count, datatype, op, stream)

    nccl.NcclCommunicator.allReduce = allreduce
    reducer = GradientReducer(backend, 1, in_flight=True)
    ok, waits = True, 0
    try:
        for step in range(steps):
            expected, handed = {}, {}

            def on_reduced(params, handed=handed):
                for p in params:  # what an update reads now, copied on the device
                    handed[p.name] = p.grad.copy()

            before = xp.counters.waits()
            reducer.start(on_reduced)
            names = []
            for k, (where, shape) in enumerate([(comm, (3, 4)), (half, (5,)), (comm, (7, 2)),
                                                (half, (2, 9))]):
                grad = np.random.default_rng([step, k, rank]).standard_normal(shape)
                p = Parameter(f"{k}", xp.zeros(shape), shape)
                p.grad = xp.asarray(grad)
                expected[p.name] = where.allreduce(grad, op=MPI.SUM)
                names.append(p.name)
                reducer.add(where, [p])
                reducer.progress()
            reducer.finish()
            waits += xp.counters.waits() - before
            ok = ok and sorted(handed) == sorted(names) and all(
                np.array_equal(host(handed[name]), expected[name]) for name in names)
    finally:
        nccl.NcclCommunicator.allReduce = queue
        release(half)  # before the handle can be reused by another communicator
        half.Free()
    return ok, streams, waits


def test_gradient_sums_in_flight_run_beside_the_compute_stream(standin_nccl):
    """Under NCCL with ``--overlap`` each bucket's sum is queued on a non-blocking stream of its
    communicator's own, after an event marks its gradients made, so it runs beside the rest of
    the backward: every sum arrives, the host never waits for one, and the compute stream is
    made to wait for each before its update reads it. (On the compute stream, as before, no
    sum could overlap anything.)"""
    comm = MPI.COMM_WORLD
    backend = make_backend("gpu", "fp64", comm, "nccl")
    ok, streams, waits = _reduce_in_flight(backend, comm)
    current = standin_nccl.cuda.get_current_stream().ptr
    if comm.Get_size() > 1:
        ok = ok and len(streams) > 0 and all(s != current for s in streams)
    assert all_agree(comm, ok and waits == 0)


def test_a_sum_read_without_its_event_reads_the_gradients_unsummed(standin_nccl, monkeypatch):
    """The stand-in writes a sum queued beside the compute stream only once an event orders it,
    as a GPU may finish it only then: a wait that forgets to make the compute stream wait for
    the sum's event hands the optimizer the unsummed gradients, and the numbers go wrong. So
    the test above holds the ordering, not only the sums."""
    from hpctrain.comm import transport

    comm = MPI.COMM_WORLD
    if comm.Get_size() == 1:
        pytest.skip("nothing is summed on one rank")
    monkeypatch.setattr(transport._Beside, "wait", lambda self: self._result)
    ok, _, _ = _reduce_in_flight(make_backend("gpu", "fp64", comm, "nccl"), comm, steps=1)
    # the sums still land later (at the next wait for the device): flush them before the end
    standin_nccl.cuda.Device().synchronize()
    assert all_agree(comm, not ok)


def test_the_standin_refuses_a_side_stream_that_would_race_or_serialise(standin_nccl):
    """The stand-in's own checks (NCCL would race or serialise in silence): a collective on a
    blocking stream beside the current one (ordered with the null stream: nothing overlaps
    it), and one on a side stream that has not waited for the current stream since its last
    collective (it could read its buffer before the kernels writing it ran)."""
    from tests import nccl_standin as nccl

    comm = MPI.COMM_WORLD
    p, rank = comm.Get_size(), comm.Get_rank()
    cuda = standin_nccl.cuda
    cuda.Device(node_rank(comm)).use()
    uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
    nc = nccl.NcclCommunicator(p, uid, rank)
    a = standin_nccl.ones(4, dtype=np.float32)
    found = []
    for stream, waits, fragment in ((cuda.Stream(), True, "blocking stream"),
                                    (cuda.Stream(non_blocking=True), False, "not waited"),
                                    (cuda.Stream(non_blocking=True), True, None)):
        if waits:
            made = cuda.Event(disable_timing=True)
            made.record(cuda.get_current_stream())
            stream.wait_event(made)
        try:
            nc.allReduce(a.data.ptr, a.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                         stream.ptr)
            found.append(fragment is None)
        except nccl.NcclError as err:
            found.append(fragment is not None and fragment in str(err))
    # the accepted one has not landed until an event orders it
    unsummed = bool(np.all(host(a) == 1))
    done = cuda.Event(disable_timing=True)
    done.record(stream)
    cuda.get_current_stream().wait_event(done)
    summed = bool(np.all(host(a) == p))
    nc.destroy()
    assert all_agree(comm, all(found) and summed and (unsummed or p == 1))


def test_calibrate_measures_the_overlap_of_sums_beside_the_stream(standin_nccl):
    """``calibrate``'s overlap share goes through the stream the sums of ``--overlap`` use:
    the sum is queued beside the GEMMs."""
    from hpctrain.comm import benchmarks

    comm = MPI.COMM_WORLD
    backend = make_backend("gpu", "fp32", comm, "nccl")
    share = benchmarks.measure_overlap(comm, backend, 8, 2)
    beside = comm.Get_size() == 1 or group_of(backend, comm)._beside is not None
    assert all_agree(comm, 0.0 <= share <= 1.0 and beside)


def test_training_with_sums_beside_the_stream_equals_blocking_sums(standin_nccl):
    """Every layer updated as its sum arrives, the sums in flight beside the compute stream
    (``--overlap`` under NCCL), trains as blocking sums over MPI do, on a plan that mixes
    modes and grids."""
    from functools import partial

    from hpctrain.comm.gather import gather_to_root
    from hpctrain.data.synthetic import SyntheticData
    from hpctrain.run.network import Network
    from hpctrain.run.optimizer import SGD
    from tests.mpi.test_training import NET, mixed_plans

    comm = MPI.COMM_WORLD
    plan = mixed_plans(comm.Get_size())[-1]
    found = []
    for collectives, overlap in (("nccl", True), ("mpi", False)):
        backend = make_backend("gpu", "fp64", comm, collectives)
        with GridSet(comm) as grids:
            network = Network(NET, plan, 9, grids, backend, seed=5, overlap=overlap)
            data = SyntheticData(backend, NET.input_shape, NET.classes, 9, seed=5)
            optimizer = SGD(network.params, lr=0.05, momentum=0.9, weight_decay=1e-3)
            losses = [network.train_step(data, step, update=partial(optimizer.step, 0.05))[0]
                      for step in range(3)]
            params = [host(gather_to_root(backend, comm, p.value, p.shape, p.box, "copy"))
                      for p in network.params]
        found.append((losses, params))
    (a, pa), (b, pb) = found
    ok = np.allclose(a, b, rtol=1e-12)
    if comm.Get_rank() == 0:
        ok = ok and all(np.allclose(x, y, rtol=1e-11, atol=1e-13) for x, y in zip(pa, pb))
    assert all_agree(comm, ok)
