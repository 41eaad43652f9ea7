"""Communication primitives: parallel vs serial, adjoint tests, round trips."""

import itertools

import numpy as np
import pytest

from hpctrain.comm.collectives import AllGather, allreduce_sum
from hpctrain.comm.halo import HaloExchange
from hpctrain.comm.redistribute import Redistribute
from hpctrain.layout.layout import CHANNEL_AXIS, HEIGHT_AXIS, Layout
from hpctrain.layout.partition import SplitError, Window, block_ranges, factorisations, halo_plans
from tests.mpi.helpers import all_agree, block, global_random, host, local_dot

SHAPE = (7, 5, 6, 3)  # N, C, H, W: uneven on 2, 3 and 4 ranks


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_allgather_and_its_adjoint(comm, grids, backend, grid_shape, axis):
    grid = grids.get(grid_shape)
    n = SHAPE[axis] + 2
    if n < grid.pr:
        pytest.skip("fewer entries than ranks")
    ranges = block_ranges(n, grid.pr)
    shape = list(SHAPE)
    shape[axis] = n
    x = global_random(shape, 1)
    sl = [slice(None)] * 4
    sl[axis] = slice(*ranges[grid.i])
    local = backend.xp.asarray(np.ascontiguousarray(x[tuple(sl)]))
    gather = AllGather(backend, grid.model_comm, axis, ranges)
    y = gather.forward(local)
    assert all_agree(comm, np.array_equal(host(y), x))
    dy = backend.xp.asarray(global_random(shape, 100 + comm.Get_rank()))  # independent partials
    dx = gather.backward(dy)
    np.testing.assert_allclose(local_dot(comm, y, dy), local_dot(comm, local, dx), rtol=1e-12)


def test_allreduce_sum(comm, backend):
    a = backend.xp.full(3, float(comm.Get_rank() + 1))
    total = host(allreduce_sum(backend, comm, a.copy()))
    p = comm.Get_size()
    assert all_agree(comm, np.allclose(total, p * (p + 1) / 2))


WINDOWS = [Window(3, 1, 1), Window(5, 1, 2), Window(3, 2, 1), Window(2, 2, 0), Window(11, 4, 2)]


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("height", [12, 23])
def test_halo_exchange_and_its_adjoint(comm, grids, backend, grid_shape, window, height):
    grid = grids.get(grid_shape)
    try:
        plan = halo_plans(height, grid.pr, window, "test")[grid.i]
    except SplitError:
        pytest.skip("split refused")
    x = global_random((3, 2, height, 4), 2)
    local = backend.xp.asarray(np.ascontiguousarray(x[:, :, plan.own[0]:plan.own[1]]))
    halo = HaloExchange(backend, grid.model_comm, plan)
    ext = halo.finish(halo.start(local))
    assert all_agree(comm, np.array_equal(host(ext), x[:, :, plan.need[0]:plan.need[1]]))
    dy = backend.xp.asarray(global_random(ext.shape, 50 + comm.Get_rank()))
    dx = halo.finish_backward(halo.start_backward(dy.copy()))  # handed over: dX may be it
    np.testing.assert_allclose(local_dot(comm, ext, dy), local_dot(comm, local, dx), rtol=1e-12)


def layouts(p):
    out = []
    for pr, pc in factorisations(p):
        for axis in (None, CHANNEL_AXIS, HEIGHT_AXIS):
            layout = Layout(SHAPE, (pr, pc), axis)
            if layout not in out:
                out.append(layout)
    return out


def flat_layouts(p):
    """(N, C·H·W) layouts: replicated, block-split features, and the uneven feature split that
    flattening a channel split gives (whole channels of H·W features each)."""
    n, c, h, w = SHAPE
    out = []
    for pr, pc in factorisations(p):
        ranges = tuple((lo * h * w, hi * h * w) for lo, hi in block_ranges(c, pr))
        for layout in (Layout((n, c * h * w), (pr, pc)),
                       Layout((n, c * h * w), (pr, pc), CHANNEL_AXIS),
                       Layout((n, c * h * w), (pr, pc), CHANNEL_AXIS, ranges)):
            if layout not in out:
                out.append(layout)
    return out


@pytest.mark.parametrize("family", [layouts, flat_layouts], ids=["4d", "flat"])
def test_every_redistribution_round_trip_and_adjoint(comm, grids, backend, family):
    rank = comm.Get_rank()
    found = family(comm.Get_size())
    x = global_random(found[0].shape, 3)
    kinds = set()
    for src, dst in itertools.product(found, repeat=2):
        move, back = Redistribute(backend, grids, src, dst), Redistribute(backend, grids, dst, src)
        kinds.add(move.move.method)
        y = move.forward(block(backend, x, src, rank))
        ok = np.array_equal(host(y), host(block(backend, x, dst, rank)))
        ok &= np.array_equal(host(back.forward(y)), host(block(backend, x, src, rank)))
        assert all_agree(comm, ok), f"{src} -> {dst} ({move.move.method})"
        dy = backend.xp.asarray(global_random(y.shape, 1000 + rank))  # independent per rank
        dx = move.backward(dy)
        lhs, rhs = local_dot(comm, y, dy), local_dot(comm, block(backend, x, src, rank), dx)
        np.testing.assert_allclose(lhs, rhs, rtol=1e-12, err_msg=f"{src} -> {dst}")
    if comm.Get_size() >= 2:
        assert kinds == {"identity", "slice", "allgather", "general"}


def test_cheapest_method_is_chosen(comm, grids, backend):
    p = comm.Get_size()
    if p == 1:
        pytest.skip("one rank moves nothing")
    batch = Layout((8, 4, 6, 6), (1, p))
    model = Layout((8, 4, 6, 6), (p, 1))
    assert Redistribute(backend, grids, batch, batch).move.method == "identity"
    assert Redistribute(backend, grids, batch, model).move.method == "allgather"
    split = Layout((8, 4, 6, 6), (p, 1), CHANNEL_AXIS)
    assert Redistribute(backend, grids, model, split).move.method == "slice"
    assert Redistribute(backend, grids, split, model).move.method == "allgather"
    assert Redistribute(backend, grids, split, batch).move.method == "general"
