"""Process grids: the Pr×Pc arrangement of P ranks that one layer runs on."""

from __future__ import annotations

from mpi4py import MPI

from hpctrain.errors import UserError
from hpctrain.layout.layout import grid_coords


class GridError(UserError):
    """A grid that does not fit the number of processes."""


class ProcessGrid:
    """P ranks as a Pr×Pc grid, with a communicator along each axis.

    ``model_comm`` (size Pr) joins the ranks that share a batch shard and split the weights or
    the image; ``batch_comm`` (size Pc) joins the ranks that hold the same weight shard and split
    the batch. Ranks keep their world numbering (no reordering); rank r sits at
    ``(i, j) = (r % Pr, r // Pr)`` — see :mod:`hpctrain.layout.layout` for a worked example. Built
    with ``Create_cart`` on dims (Pc, Pr), whose row-major numbering is exactly ``r = j*Pr + i``,
    then ``Sub`` for each axis.
    """

    def __init__(self, comm: MPI.Comm, pr: int, pc: int) -> None:
        if pr < 1 or pc < 1 or pr * pc != comm.Get_size():
            raise GridError(
                f"grid {pr}x{pc} needs {pr * pc} processes but {comm.Get_size()} were launched; "
                f"choose R and C with R*C = {comm.Get_size()}"
            )
        self.shape = (pr, pc)
        self.world = comm
        self.rank = comm.Get_rank()
        self.cart = comm.Create_cart(dims=[pc, pr], periods=[False, False], reorder=False)
        self.model_comm = self.cart.Sub([False, True])
        self.batch_comm = self.cart.Sub([True, False])
        self.i, self.j = grid_coords(self.rank, self.shape)

    @property
    def pr(self) -> int:
        return self.shape[0]

    @property
    def pc(self) -> int:
        return self.shape[1]

    def free(self) -> None:
        for comm in (self.model_comm, self.batch_comm, self.cart):
            if comm != MPI.COMM_NULL:
                comm.Free()

    def __repr__(self) -> str:
        return f"ProcessGrid({self.pr}x{self.pc}, rank {self.rank} at i={self.i}, j={self.j})"


class GridSet:
    """Builds each distinct grid once over one communicator and frees them all on ``close``.

    Layers on different grids coexist: they ask the set for ``(Pr, Pc)`` and share the grid.
    """

    def __init__(self, comm: MPI.Comm) -> None:
        self.world = comm
        self._grids: dict[tuple[int, int], ProcessGrid] = {}

    def get(self, shape: tuple[int, int]) -> ProcessGrid:
        if shape not in self._grids:
            self._grids[shape] = ProcessGrid(self.world, *shape)
        return self._grids[shape]

    def close(self) -> None:
        for grid in self._grids.values():
            grid.free()
        self._grids.clear()

    def __enter__(self) -> GridSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
