"""The halo exchange of several split axes at once, axis by axis, against the gathered tensor:
every rank's block extended along each split axis (the last first, each exchange carrying the
halos already received) equals the global tensor over the rows its windows read, edges and
corners included; and the exchange's backward is its adjoint."""

import numpy as np
import pytest

from hpctrain.comm.halo import HaloExchange
from hpctrain.layout.layout import Layout, Split, axis_name
from hpctrain.layout.partition import SplitError, Window, factorisations, halo_plans
from tests.mpi.helpers import all_agree, block, global_random, host, local_dot

WINDOWS = [Window(3, 1, 1), Window(2, 2, 0), Window(5, 2, 2)]


def splits(procs: int, spatial: int) -> list[Split]:
    """Every split of ``procs`` ranks over the batch and ``spatial`` spatial axes with at least
    two spatial axes cut where ``procs`` allows (the channels whole)."""
    found = []
    for degrees in _products(procs, 1 + spatial):
        n, *space = degrees
        found.append(Split((n, 1, *space)))
    return found


def _products(procs: int, count: int) -> list[tuple[int, ...]]:
    if count == 1:
        return [(procs,)]
    return [(a, *rest) for a, _ in factorisations(procs) for rest in _products(procs // a,
                                                                                count - 1)]


def extend(backend, grids, layout, window, rank, x):
    """``x`` (this rank's block) extended along every split spatial axis, the last first; the
    exchanges, for the backward."""
    exchanges = []
    for axis in sorted((a for a in layout.cut_axes if a >= 2), reverse=True):
        plan = halo_plans(layout.shape[axis], layout.parts[axis], window, "test",
                          axis_name(layout.shape, axis))[layout.block_index(rank, axis)]
        comm = grids.over(layout, layout.digits_of((axis,)))
        exchange = HaloExchange(backend, comm, plan, axis)
        x = exchange.finish(exchange.start(x))
        exchanges.append((exchange, plan))
    return x, exchanges


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 11, 9), (2, 2, 7, 9, 8)], ids=["image", "volume"])
def test_multi_axis_halos_equal_the_gathered_tensor_and_are_adjoint(comm, grids, backend,
                                                                   window, shape):
    rank = comm.Get_rank()
    x = global_random(shape, 7)
    for split in splits(comm.Get_size(), len(shape) - 2):
        layout = Layout.of_split(shape, split)
        try:
            local = block(backend, x, layout, rank)
            ext, exchanges = extend(backend, grids, layout, window, rank, local)
        except SplitError:
            continue  # refused the same way on every rank: an axis too short for the window
        # the extended block is the global tensor over the needed rows of every split axis
        box = [slice(lo, hi) for lo, hi in layout.box(rank)]
        for exchange, plan in exchanges:
            box[exchange.axis] = slice(*plan.need)
        assert all_agree(comm, np.array_equal(host(ext), x[tuple(box)])), split
        dy = backend.xp.asarray(global_random(ext.shape, 50 + rank))
        dx = dy.copy()  # handed over to the exchanges, which may add into it
        for exchange, _ in reversed(exchanges):
            dx = exchange.finish_backward(exchange.start_backward(dx))
        assert dx.shape == local.shape
        np.testing.assert_allclose(local_dot(comm, ext, dy), local_dot(comm, local, dx),
                                   rtol=1e-12)
