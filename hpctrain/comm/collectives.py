"""Collectives along one axis of a tensor, as forward/adjoint pairs.

Each call's data movement (the MPI call, with the transposes and host staging around it) is
timed by the backend's comm clock.
"""

from __future__ import annotations

import math
from typing import Any

from mpi4py import MPI

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

    def forward(self, x: Any) -> Any:
        if self.comm.Get_size() == 1:
            return x
        xp, be = self.backend.xp, self.backend
        with be.clock.comm():
            xt = _front(xp, x, self.axis)
            inner = math.prod(xt.shape[1:])
            recv = be.empty_mpi((self.total, *xt.shape[1:]), xt.dtype)
            counts = [n * inner for n in self.lengths]
            be.clock.sent(xt.nbytes)
            self.comm.Allgatherv(be.to_mpi(xt), [recv, counts])
            return xp.ascontiguousarray(xp.moveaxis(be.from_mpi(recv), 0, self.axis))

    def backward(self, dy: Any) -> Any:
        if self.comm.Get_size() == 1:
            return dy
        xp, be = self.backend.xp, self.backend
        with be.clock.comm():
            dyt = _front(xp, dy, self.axis)
            inner = math.prod(dyt.shape[1:])
            recv = be.empty_mpi((self.lengths[self.rank], *dyt.shape[1:]), dyt.dtype)
            be.clock.sent(dyt.nbytes)
            self.comm.Reduce_scatter(be.to_mpi(dyt), recv, [n * inner for n in self.lengths],
                                     MPI.SUM)
            return xp.ascontiguousarray(xp.moveaxis(be.from_mpi(recv), 0, self.axis))


def allreduce_sum(backend: Backend, comm: MPI.Comm, a: Any) -> Any:
    """Σ over ``comm`` of ``a`` (returns ``a`` itself when the communicator has one rank)."""
    if comm.Get_size() == 1:
        return a
    with backend.clock.comm():
        buf = backend.to_mpi(a)
        backend.clock.sent(buf.nbytes)
        comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM)
        return backend.from_mpi(buf)
