"""Move an activation between two layouts (forward) and its gradient back (backward, the adjoint).

The method and this rank's part in it come from :func:`hpctrain.moves.plan_move`, computed once
from the two layouts (see :mod:`hpctrain.moves` for the kinds):

- ``identity``: nothing moves.
- ``slice``: forward takes a slice of the local block, backward pads the gradient with zeros.
- ``allgather``: forward ``Allgatherv`` over the target grid's model communicator, backward
  its adjoint ``Reduce_scatter``.
- ``general``: forward each piece goes point to point (``Isend``/``Irecv``, then ``Waitall``)
  from its one sender to its receiver on the world communicator, only between ranks that share
  data; backward the same pieces travel in reverse and are added into the sources.

The all-gather and the general exchange report their time and bytes to the backend's comm
clock; identity and slice move nothing between ranks and report none.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from hpctrain.backend import Backend
from hpctrain.comm.collectives import AllGather
from hpctrain.grid import GridSet
from hpctrain.layout import Box, Layout, box_size, relative_slices
from hpctrain.moves import ALLGATHER, IDENTITY, SLICE, plan_move

# Tag of the pieces on the world communicator: one message per pair of ranks per exchange, and
# exchanges complete one at a time, so one tag keeps them apart from other world traffic.
_PIECE_TAG = 31


class Redistribute:
    """forward: activation from layout ``src`` to ``dst``; backward: its gradient, back."""

    def __init__(self, backend: Backend, grids: GridSet, src: Layout, dst: Layout) -> None:
        self.backend, self.src, self.dst = backend, src, dst
        self.comm: MPI.Comm = grids.world
        self.rank = self.comm.Get_rank()
        self.src_box, self.dst_box = src.box(self.rank), dst.box(self.rank)
        self.plan = plan_move(src, dst, self.rank)
        self.kind = self.plan.kind
        if self.kind == ALLGATHER:
            model_comm = grids.get(dst.grid).model_comm
            self.gather = AllGather(backend, model_comm, self.plan.axis, self.plan.ranges)

    def forward(self, x: Any) -> Any:
        if self.kind == IDENTITY:
            return x
        if self.kind == SLICE:
            return self.backend.xp.ascontiguousarray(x[self.plan.slices])
        if self.kind == ALLGATHER:
            return self.gather.forward(x)
        out = self.backend.xp.empty(self.dst.local_shape(self.rank), dtype=x.dtype)
        self._exchange(x, self.src_box, out, self.dst_box, self.plan.sends, self.plan.receives,
                       accumulate=False)
        return out

    def backward(self, dy: Any) -> Any:
        xp = self.backend.xp
        if self.kind == IDENTITY:
            return dy
        if self.kind == SLICE:
            dx = xp.zeros(self.src.local_shape(self.rank), dtype=dy.dtype)
            dx[self.plan.slices] = dy
            return dx
        if self.kind == ALLGATHER:
            return self.gather.backward(dy)
        dx = xp.zeros(self.src.local_shape(self.rank), dtype=dy.dtype)
        self._exchange(dy, self.dst_box, dx, self.src_box, self.plan.receives, self.plan.sends,
                       accumulate=True)
        return dx

    def _exchange(self, a: Any, a_box: Box, out: Any, out_box: Box,
                  send: tuple[tuple[int, Box], ...], recv: tuple[tuple[int, Box], ...],
                  accumulate: bool) -> None:
        """Send the ``send`` pieces of ``a`` and put the ``recv`` pieces and the pieces this rank
        keeps into ``out`` (added when ``accumulate``: the adjoint sums every piece's
        gradient into its source, and replicas of a source overlap)."""
        be = self.backend

        def put(box: Box, block: Any) -> None:
            if accumulate:
                out[relative_slices(box, out_box)] += block
            else:
                out[relative_slices(box, out_box)] = block

        with be.clock.comm():  # packing, the messages and unpacking
            # one receive and one send buffer, a contiguous stretch per peer: one staging copy
            # each way on a GPU, however many pieces
            recv_at, recv_total = _stretches(recv)
            send_at, send_total = _stretches(send)
            recv_buf = be.empty_mpi((recv_total,), a.dtype)
            requests = [self.comm.Irecv(recv_buf[lo:hi], source=peer, tag=_PIECE_TAG)
                        for (peer, _), (lo, hi) in zip(recv, recv_at, strict=True)]
            send_buf = be.xp.empty(send_total, dtype=a.dtype)
            for (_, box), (lo, hi) in zip(send, send_at, strict=True):
                send_buf[lo:hi] = a[relative_slices(box, a_box)].ravel()
            send_buf = be.to_mpi(send_buf)
            be.clock.sent(send_buf.nbytes)
            requests += [self.comm.Isend(send_buf[lo:hi], dest=peer, tag=_PIECE_TAG)
                         for (peer, _), (lo, hi) in zip(send, send_at, strict=True)]
            for box in self.plan.local:  # while the messages travel
                put(box, a[relative_slices(box, a_box)])
            MPI.Request.Waitall(requests)
            recv_buf = be.from_mpi(recv_buf)
            for (_, box), (lo, hi) in zip(recv, recv_at, strict=True):
                put(box, recv_buf[lo:hi].reshape([b1 - b0 for b0, b1 in box]))


def _stretches(pieces: tuple[tuple[int, Box], ...]) -> tuple[list[tuple[int, int]], int]:
    """Where each piece lies in one flat buffer holding them all in order, and its length."""
    at, end = [], 0
    for _, box in pieces:
        size = box_size(box)
        at.append((end, end + size))
        end += size
    return at, end
