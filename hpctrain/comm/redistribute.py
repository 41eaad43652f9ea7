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
from hpctrain.layout import Box, Layout, relative_slices
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
            requests, received, outgoing = [], [], []
            for peer, box in recv:
                buf = be.empty_mpi(tuple(hi - lo for lo, hi in box), a.dtype)
                requests.append(self.comm.Irecv(buf, source=peer, tag=_PIECE_TAG))
                received.append((box, buf))
            for peer, box in send:
                buf = be.to_mpi(a[relative_slices(box, a_box)])  # each piece packed contiguous
                be.clock.sent(buf.nbytes)
                requests.append(self.comm.Isend(buf, dest=peer, tag=_PIECE_TAG))
                outgoing.append(buf)  # alive until the wait
            for box in self.plan.local:  # while the messages travel
                put(box, a[relative_slices(box, a_box)])
            MPI.Request.Waitall(requests)
            for box, buf in received:
                put(box, be.from_mpi(buf))
