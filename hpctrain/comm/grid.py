"""Process grids: the Pr×Pc arrangement of P ranks that one layer runs on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mpi4py import MPI

from hpctrain.comm.transport import release
from hpctrain.errors import UserError
from hpctrain.layout.layout import Layout, grid_coords


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

    def free(self, abort: bool = False) -> None:
        """Free the communicators, and first the NCCL communicators made for them (aborted,
        not destroyed, with ``abort``: see :func:`~hpctrain.comm.transport.release`)."""
        for comm in (self.model_comm, self.batch_comm, self.cart):
            if comm != MPI.COMM_NULL:
                release(comm, abort)  # its NCCL communicator first, if one was made
                comm.Free()

    def __repr__(self) -> str:
        return f"ProcessGrid({self.pr}x{self.pc}, rank {self.rank} at i={self.i}, j={self.j})"


class GridSet:
    """Builds each distinct grid once over one communicator and frees them all on ``close``,
    with the NCCL communicators made for them and for the communicator it was given
    (:mod:`hpctrain.comm.transport`), which it does not free: the next use of that one makes
    a new NCCL communicator. As a context manager it destroys them on the normal way out
    (collective: every rank closes) and aborts them when an exception leaves it, where the
    other ranks may still be inside a collective and a destroy would wait for them forever.

    Layers on different grids coexist: they ask the set for ``(Pr, Pc)`` and share the grid.

    A layout on a group of ranks (:mod:`hpctrain.layout.layout`) gets its communicators from the
    set of that group (:meth:`group`), as if the group were the world: only its ranks take part.
    """

    def __init__(self, comm: MPI.Comm) -> None:
        self.world = comm
        self._grids: dict[tuple[int, int], ProcessGrid] = {}
        self._comms: dict[tuple, MPI.Comm] = {}
        self._groups: dict[tuple[int, int], GridSet] = {}

    def group(self, first: int, size: int) -> GridSet:
        """The set of the ranks ``first … first + size − 1`` of the world, made on first use by
        ``Create_group``, collective over those ranks alone (each makes its groups in the order
        it first meets them, the net's, the same on all)."""
        key = (first, size)
        if key not in self._groups:
            ranks = self.world.Get_group().Range_incl([(first, first + size - 1, 1)])
            try:
                # a tag of its own per group (within the 32767 MPI guarantees): ranks make
                # the groups they share in one order, and the tag keeps their set-ups apart
                comm = self.world.Create_group(ranks, tag=(first * 181 + size) % 32768)
            finally:
                ranks.Free()
            self._groups[key] = GridSet(comm)
        return self._groups[key]

    def _of(self, layout: Layout) -> tuple[GridSet, Layout]:
        """The set whose world is ``layout``'s ranks, and the layout on it."""
        if not layout.on_group:
            return self, layout
        return self.group(layout.first, layout.size), layout.local()

    def get(self, shape: tuple[int, int]) -> ProcessGrid:
        if shape not in self._grids:
            self._grids[shape] = ProcessGrid(self.world, *shape)
        return self._grids[shape]

    def over(self, layout: Layout, digits: Sequence[int]) -> MPI.Comm:
        """The communicator of the ranks that differ from this one only in the coordinates of
        ``layout``'s mesh ``digits`` (e.g. the ranks that split one axis between them), in world
        order, which is the order of those coordinates. Made once per mesh and digits: a 1.5D
        grid's own communicators where they are these, else a split of the world."""
        if layout.on_group:
            grids, local = self._of(layout)
            return grids.over(local, digits)
        digits = tuple(sorted(set(digits)))
        mesh = layout.mesh
        if not digits:
            return MPI.COMM_SELF
        if len(mesh) == 2:  # a Pr×Pc grid: (Pc, Pr)
            grid = self.get((mesh[1], mesh[0]))
            return {(0,): grid.batch_comm, (1,): grid.model_comm, (0, 1): grid.cart}[digits]
        if len(digits) == len(mesh):
            return self.world
        key = (mesh, digits)
        if key not in self._comms:
            rank = self.world.Get_rank()
            self._comms[key] = self.world.Split(layout.group_key(rank, digits), rank)
        return self._comms[key]

    def split(self, layout: Layout, digits: Sequence[int], tag: Any, colour: int) -> MPI.Comm:
        """The ranks of :meth:`over` ``(layout, digits)`` that give the same ``colour``, in world
        order; ``tag`` names the rule the colours follow (the same on every rank, e.g. a
        batch-norm layer's number of statistics groups). Made once per mesh, digits and tag,
        by a split of that communicator: every rank of it asks in the same order."""
        if layout.on_group:
            grids, local = self._of(layout)
            return grids.split(local, digits, tag, colour)
        parent = self.over(layout, digits)
        # the axes too: a mesh drops digits of one rank, so two layouts cut along different
        # axes may share one
        key = (layout.mesh, layout.axes, tuple(sorted(set(digits))), tag)
        if key not in self._comms:
            self._comms[key] = parent.Split(colour, parent.Get_rank())
        return self._comms[key]

    def close(self, abort: bool = False) -> None:
        """Free every communicator made here, each NCCL communicator first: destroyed
        (collective over each communicator), or with ``abort`` aborted on this rank alone."""
        for grids in self._groups.values():
            grids.close(abort)
            release(grids.world, abort)
            grids.world.Free()
        self._groups.clear()
        for grid in self._grids.values():
            grid.free(abort)
        self._grids.clear()
        for comm in self._comms.values():
            release(comm, abort)
            comm.Free()
        self._comms.clear()
        release(self.world, abort)  # kept, but its NCCL communicator goes before MPI does

    def __enter__(self) -> GridSet:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close(abort=kind is not None)
