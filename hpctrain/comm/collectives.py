"""Collectives along one axis of a tensor, as forward/adjoint pairs.

Each call's data movement (the MPI or NCCL call, with the transposes and host staging around
it) is timed by the backend's comm clock; the group of :mod:`hpctrain.comm.transport` runs it.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from hpctrain.comm.transport import group_of
from hpctrain.device.backend import Backend


def _front(xp: Any, a: Any, axis: int) -> Any:
    """``a`` with ``axis`` moved first, contiguous, so MPI blocks along ``axis`` are contiguous."""
    return xp.ascontiguousarray(xp.moveaxis(a, axis, 0))


class AllGather:
    """forward: all-gather along ``axis``; backward: reduce-scatter along ``axis``.

    Rank k of ``comm`` holds ``ranges[k]`` of the gathered axis. The backward takes the partial
    gradients held by every member of ``comm`` for the whole tensor, sums them, and leaves each
    member its own block: the adjoint of the all-gather, and half the bytes of an all-reduce.
    """

    def __init__(self, backend: Backend, comm: MPI.Comm, axis: int,
                 ranges: tuple[tuple[int, int], ...]) -> None:
        self.backend, self.comm, self.axis, self.ranges = backend, comm, axis, ranges
        self.rank = comm.Get_rank()
        self.lengths = [hi - lo for lo, hi in ranges]
        self.total = sum(self.lengths)
        self.group = group_of(backend, comm)  # under NCCL, its communicator made now

    def forward(self, x: Any) -> Any:
        if self.comm.Get_size() == 1:
            return x
        xp, be = self.backend.xp, self.backend
        with be.clock.comm():
            gathered = self.group.allgather(_front(xp, x, self.axis), self.lengths)
            return xp.ascontiguousarray(xp.moveaxis(gathered, 0, self.axis))

    def backward(self, dy: Any) -> Any:
        if self.comm.Get_size() == 1:
            return dy
        xp, be = self.backend.xp, self.backend
        with be.clock.comm():
            own = self.group.reduce_scatter(_front(xp, dy, self.axis), self.lengths)
            return xp.ascontiguousarray(xp.moveaxis(own, 0, self.axis))


def allreduce_sum(backend: Backend, comm: MPI.Comm, a: Any) -> Any:
    """Σ over ``comm`` of ``a`` (returns ``a`` itself when the communicator has one rank), in
    ``a``'s dtype: a 16-bit float is summed in float32 and rounded back at each addition."""
    if comm.Get_size() == 1:
        return a
    with backend.clock.comm():
        return group_of(backend, comm).allreduce(a)
