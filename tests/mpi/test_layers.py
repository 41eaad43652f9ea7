"""Every layer kind in every mode on every Pr×Pc grid against the same layer on one process."""

import pytest
from mpi4py import MPI

from hpctrain.comm.gather import gather_to_root
from hpctrain.comm.grid import GridSet
from hpctrain.layout.layout import CHANNEL_AXIS, HEIGHT_AXIS, Layout
from hpctrain.layout.partition import SplitError
from tests.mpi.helpers import block, check_close, global_random, make_layer, sum_gradients


def owned_gradient(backend, dy, layout, rank):
    """The rank's dY block; replicas hold partial sums, so only the first holder gets it."""
    first = min(r for r in range(layout.size) if layout.box(r) == layout.box(rank))
    return block(backend, dy, layout, rank) * (1.0 if rank == first else 0.0)


def run(backend, layer, x, dy, rank):
    y = layer.forward(block(backend, x, layer.in_layout, rank), step=3)
    dx = layer.backward(owned_gradient(backend, dy, layer.out_layout, rank))
    sum_gradients(backend, layer)
    return y, dx


def compare(comm, backend, make, x_shape):
    """Build ``make(grids, serial)`` in parallel and on rank 0 alone; compare everything."""
    rank = comm.Get_rank()
    with GridSet(comm) as grids:
        layer = make(grids, False)
        x = global_random(x_shape, 0)
        dy = global_random(layer.out_layout.shape, 1)
        y, dx = run(backend, layer, x, dy, rank)
        got_y = gather_to_root(backend, comm, y, layer.out_layout.shape, layer.out_layout.box,
                               "copy")
        got_dx = gather_to_root(backend, comm, dx, layer.in_layout.shape, layer.in_layout.box,
                                "sum")
        got_params = [gather_to_root(backend, comm, p.grad, p.shape, p.box, "copy")
                      for p in layer.params]
    want_y = want_dx = None
    want_params = [None] * len(got_params)
    if rank == 0:
        with GridSet(MPI.COMM_SELF) as serial_grids:
            serial = make(serial_grids, True)
            want_y, want_dx = (backend.to_numpy(a) for a in run(backend, serial, x, dy, 0))
            want_params = [backend.to_numpy(p.grad) for p in serial.params]
    check_close(comm, got_y, want_y, "output")
    check_close(comm, got_dx, want_dx, "input gradient")
    for got, want in zip(got_params, want_params):
        check_close(comm, got, want, "parameter gradient")


CONVS = [  # (N, C, H, W), out, kernel, stride, pad
    ((5, 3, 13, 7), 5, 3, 1, 1), ((4, 2, 17, 9), 7, 5, 2, 2), ((3, 3, 23, 10), 4, 11, 4, 2),
    ((6, 2, 8, 8), 3, 1, 1, 0), ((4, 3, 12, 6), 6, 3, 2, 0)]


@pytest.mark.parametrize("mode", ["model", "domain"])
@pytest.mark.parametrize("shape,out,kernel,stride,pad", CONVS)
def test_conv(comm, backend, grid_shape, mode, shape, out, kernel, stride, pad):
    conv = {"out": out, "kernel": kernel, "stride": stride, "pad": pad}

    def make(grids, serial):
        fed = Layout(shape, (1, 1))
        if serial:
            return make_layer("conv", conv, fed, "batch", (1, 1), grids, backend, key=42)
        return make_layer("conv", conv, fed, mode, grid_shape, grids, backend, key=42)

    try:
        compare(comm, backend, make, shape)
    except SplitError as err:  # refused identically on every rank
        pytest.skip(str(err))


@pytest.mark.parametrize("axis", [None, CHANNEL_AXIS, HEIGHT_AXIS])
@pytest.mark.parametrize("kernel,stride,pad", [(2, 2, 0), (3, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_maxpool_on_every_layout(comm, backend, grid_shape, axis, kernel, stride, pad):
    shape = (5, 6, 15, 9)
    pool = {"kernel": kernel, "stride": stride, "pad": pad}

    def make(grids, serial):
        layout = Layout(shape, (1, 1) if serial else grid_shape, None if serial else axis)
        return make_layer("maxpool", pool, layout, "follow", layout.grid, grids, backend)

    try:
        compare(comm, backend, make, shape)
    except SplitError as err:
        pytest.skip(str(err))


@pytest.mark.parametrize("n,f_in,f_out", [(7, 10, 9), (4, 5, 4), (9, 33, 13)])
def test_linear(comm, backend, grid_shape, n, f_in, f_out):
    def make(grids, serial):
        fed = Layout((n, f_in), (1, 1))
        if serial:
            return make_layer("linear", {"out": f_out}, fed, "batch", (1, 1), grids, backend, 7)
        return make_layer("linear", {"out": f_out}, fed, "model", grid_shape, grids, backend, 7)

    try:
        compare(comm, backend, make, (n, f_in))
    except SplitError as err:
        pytest.skip(str(err))


@pytest.mark.parametrize("kind", ["relu", "dropout", "flatten"])
@pytest.mark.parametrize("axis", [None, CHANNEL_AXIS, HEIGHT_AXIS])
def test_followers_on_every_layout(comm, backend, grid_shape, kind, axis):
    shape = (5, 7, 9, 4)
    if axis is not None and shape[axis] < grid_shape[0]:
        pytest.skip("fewer entries than ranks")

    def make(grids, serial):
        layout = Layout(shape, (1, 1) if serial else grid_shape, None if serial else axis)
        options = {"p": 0.4} if kind == "dropout" else {}
        return make_layer(kind, options, layout, "follow", layout.grid, grids, backend, key=9)

    compare(comm, backend, make, shape)
