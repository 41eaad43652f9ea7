import pytest

from hpctrain.comm.grid import GridError, GridSet, ProcessGrid
from hpctrain.layout.layout import grid_coords
from tests.mpi.helpers import all_agree


def test_grid_coordinates_and_communicators(comm, grid_shape):
    pr, pc = grid_shape
    grid = ProcessGrid(comm, pr, pc)
    try:
        rank = comm.Get_rank()
        assert (grid.i, grid.j) == grid_coords(rank, grid_shape)
        assert tuple(grid.cart.Get_coords(rank)) == (grid.j, grid.i)
        model = grid.model_comm.allgather(rank)
        batch = grid.batch_comm.allgather(rank)
        ok = (model == [grid.j * pr + i for i in range(pr)]
              and batch == [j * pr + grid.i for j in range(pc)]
              and grid.model_comm.Get_rank() == grid.i and grid.batch_comm.Get_rank() == grid.j)
        assert all_agree(comm, ok)
    finally:
        grid.free()


def test_grid_that_does_not_fit_is_refused(comm):
    p = comm.Get_size()
    with pytest.raises(GridError, match=f"grid {p + 1}x1 needs {p + 1} processes but {p}"):
        ProcessGrid(comm, p + 1, 1)


def test_grid_set_builds_each_grid_once(comm, grid_shape):
    with GridSet(comm) as grids:
        assert grids.get(grid_shape) is grids.get(grid_shape)
