"""float16 and bfloat16 arrays through every primitive over MPI: moves send their bytes, sums
add in float32 and round back at each addition (as NCCL does), and a float32 array beside
16-bit storage (batch norm's statistics) stays float32."""

import numpy as np
import pytest
from ml_dtypes import bfloat16
from mpi4py import MPI

from hpctrain.comm.collectives import AllGather, allreduce_sum
from hpctrain.comm.gradients import GradientReducer
from hpctrain.comm.halo import HaloExchange
from hpctrain.comm.redistribute import Redistribute
from hpctrain.comm.transport import mpi_buffer, sum_op
from hpctrain.device.backend import Backend
from hpctrain.layers.base import Parameter
from hpctrain.layout.layout import CHANNEL_AXIS, HEIGHT_AXIS, Layout
from hpctrain.layout.partition import Window, block_ranges, halo_plans
from tests.mpi.helpers import all_agree, block, global_random

DTYPES = [np.float16, bfloat16]
IDS = ["fp16", "bf16"]
EPS = {np.dtype(np.float16): 2.0 ** -11, np.dtype(bfloat16): 2.0 ** -8}  # half an ulp at 1


def every_rank(comm, shape, seed, dtype):
    """Each rank's array (rows: ranks), the same on every rank, rounded to ``dtype``."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((comm.Get_size(), *shape)) * 3).astype(dtype)


def close_to_rounded_sum(comm, got, parts):
    """``got`` is the float32 sum of ``parts`` (ranks first) rounded, within one rounding per
    addition: P − 1 additions, each off by at most half an ulp of what it adds."""
    dtype = np.dtype(parts.dtype)
    wide = parts.astype(np.float32)
    exact = wide.sum(axis=0)
    bound = (comm.Get_size() - 1) * EPS[dtype] * np.abs(wide).sum(axis=0) * 2 + \
        EPS[dtype] * np.abs(exact)
    ok = got.dtype == dtype and bool(np.all(np.abs(got.astype(np.float32) - exact) <= bound))
    if comm.Get_size() <= 2:  # one addition: exactly the float32 sum rounded
        ok = ok and np.array_equal(got.view(np.uint16), exact.astype(dtype).view(np.uint16))
    return ok


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_the_sum_operation_adds_in_float32_and_rounds(comm, dtype):
    parts = every_rank(comm, (1000,), 1, dtype)
    mine = parts[comm.Get_rank()].copy()
    comm.Allreduce(MPI.IN_PLACE, mpi_buffer(mine), sum_op(dtype))
    assert all_agree(comm, close_to_rounded_sum(comm, mine, parts))
    # every rank holds the same bits
    first = comm.bcast(mine.view(np.uint16), root=0)
    assert all_agree(comm, np.array_equal(first, mine.view(np.uint16)))


def test_the_sum_operation_is_made_once_per_dtype():
    assert sum_op(bfloat16) is sum_op(np.dtype(bfloat16))
    assert sum_op(np.float16) is not sum_op(bfloat16)
    assert sum_op(np.float32) is MPI.SUM and sum_op(np.float64) is MPI.SUM


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_allreduce_sum_and_reduce_scatter_of_sixteen_bits(comm, dtype):
    backend = Backend(np, dtype)
    parts = every_rank(comm, (4, 7), 2, dtype)
    total = allreduce_sum(backend, comm, parts[comm.Get_rank()].copy())
    assert all_agree(comm, close_to_rounded_sum(comm, total, parts))
    # the same sum, non-blocking, started in place
    summed = backend_sum_in_flight(backend, comm, parts[comm.Get_rank()].copy())
    assert all_agree(comm, close_to_rounded_sum(comm, summed, parts))
    # the reduce-scatter of an uneven split keeps each rank its block of the sum
    p = comm.Get_size()
    ranges = block_ranges(2 * p + 1, p)
    parts = every_rank(comm, (2 * p + 1, 3), 3, dtype)
    gather = AllGather(backend, comm, 0, tuple(ranges))
    own = gather.backward(parts[comm.Get_rank()].copy())
    lo, hi = ranges[comm.Get_rank()]
    assert all_agree(comm, close_to_rounded_sum(comm, own, parts[:, lo:hi]))


def backend_sum_in_flight(backend, comm, a):
    reducer = GradientReducer(backend, bucket_bytes=0)
    param = Parameter("w", None, a.shape, None)
    param.value, param.grad = a, a
    reducer.start()
    reducer.add(comm, [param])
    reducer.progress()
    reducer.finish()
    return param.grad


def test_a_float32_array_beside_sixteen_bit_storage_stays_float32(comm):
    """Batch norm's statistics are float32 under bf16 storage: summed as float32."""
    backend = Backend(np, bfloat16)
    a = np.full(5, 1.0 + 2.0 ** -12, dtype=np.float32)  # not a bfloat16 value
    total = allreduce_sum(backend, comm, a.copy())
    want = np.float32(comm.Get_size()) * a
    assert all_agree(comm, total.dtype == np.float32 and np.allclose(total, want, rtol=1e-6))


def test_gradients_of_two_dtypes_go_in_separate_buckets(comm):
    backend = Backend(np, bfloat16)
    reducer = GradientReducer(backend)  # one bucket would hold them all
    params = []
    for name, dtype in (("w", bfloat16), ("gamma", np.float32), ("b", bfloat16)):
        p = Parameter(name, None, (3,), None)
        p.value = np.zeros(3, dtype)
        p.grad = np.full(3, comm.Get_rank() + 1, dtype)
        params.append(p)
    reducer.start()
    reducer.add(comm, params)
    reducer.finish()
    n = comm.Get_size()
    want = n * (n + 1) / 2
    ok = all(p.grad.dtype == p.value.dtype and np.all(p.grad.astype(np.float32) == want)
             for p in params)
    assert all_agree(comm, ok)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_moves_of_sixteen_bits_are_exact(comm, grids, dtype):
    backend = Backend(np, dtype)
    p = comm.Get_size()
    # all-gather along the channels, uneven
    x = global_random((3, 2 * p + 1, 4, 2), 7).astype(dtype)
    ranges = block_ranges(2 * p + 1, p)
    lo, hi = ranges[comm.Get_rank()]
    gathered = AllGather(backend, comm, CHANNEL_AXIS, tuple(ranges)).forward(
        np.ascontiguousarray(x[:, lo:hi]))
    ok = gathered.dtype == dtype and np.array_equal(gathered.view(np.uint16), x.view(np.uint16))
    # a halo exchange along the rows
    height = 4 * p
    plan = halo_plans(height, p, Window(3, 1, 1), "test")[comm.Get_rank()]
    x = global_random((2, 3, height, 5), 8).astype(dtype)
    halo = HaloExchange(backend, comm, plan)
    ext = halo.finish(halo.start(np.ascontiguousarray(x[:, :, plan.own[0]:plan.own[1]])))
    ok = ok and ext.dtype == dtype and np.array_equal(
        ext.view(np.uint16), x[:, :, plan.need[0]:plan.need[1]].view(np.uint16))
    # a general move: a channel split to a row split
    shape = (2 * p, 2 * p, 2 * p, 3)
    src, dst = Layout(shape, (p, 1), CHANNEL_AXIS), Layout(shape, (p, 1), HEIGHT_AXIS)
    x = global_random(shape, 9).astype(dtype)
    move = Redistribute(backend, grids, src, dst)
    y = move.forward(block(backend, x, src, comm.Get_rank()))
    want = block(backend, x, dst, comm.Get_rank())
    ok = ok and y.dtype == dtype and np.array_equal(y.view(np.uint16), want.view(np.uint16))
    assert all_agree(comm, ok)
