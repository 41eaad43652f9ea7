"""Move an activation between two layouts (forward) and its gradient back (backward, the adjoint).

The method and this rank's part in it come from :func:`hpctrain.layout.moves.plan_move`, computed
once from the two layouts (see :mod:`hpctrain.layout.moves` for the kinds):

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

from dataclasses import dataclass
from typing import Any

from mpi4py import MPI

from hpctrain.comm.collectives import AllGather
from hpctrain.comm.grid import GridSet
from hpctrain.device.backend import Backend
from hpctrain.layout.layout import Box, Layout, box_size, relative_slices
from hpctrain.layout.moves import ALLGATHER, IDENTITY, SLICE, plan_move

# Tag of the pieces on the world communicator: one message per pair of ranks per exchange, and
# exchanges complete one at a time, so one tag keeps them apart from other world traffic.
_PIECE_TAG = 31


@dataclass(frozen=True)
class _Route:
    """One direction of a general exchange, fixed at set-up: where each piece is read from the
    array sent (``sends``: peer, its stretch of the send buffer, the slices of the array),
    where each received piece goes (``receives``: peer, its stretch of the receive buffer, the
    slices of the result and the piece's shape), the pieces this rank keeps (slices of the
    array, slices of the result), both buffers' lengths and the result's shape."""

    sends: tuple[tuple[int, int, int, tuple[slice, ...]], ...]
    receives: tuple[tuple[int, int, int, tuple[slice, ...], tuple[int, ...]], ...]
    local: tuple[tuple[tuple[slice, ...], tuple[slice, ...]], ...]
    send_total: int
    recv_total: int
    out_shape: tuple[int, ...]

    @classmethod
    def of(cls, send: tuple[tuple[int, Box], ...], recv: tuple[tuple[int, Box], ...],
           local: tuple[Box, ...], a_box: Box, out_box: Box) -> _Route:
        """The route of an array holding ``a_box`` into a result holding ``out_box``: one
        contiguous stretch per piece, one buffer each way, in the order of the pieces."""
        sends, end = [], 0
        for peer, box in send:
            sends.append((peer, end, end + box_size(box), relative_slices(box, a_box)))
            end = sends[-1][2]
        receives, recv_end = [], 0
        for peer, box in recv:
            shape = tuple(b1 - b0 for b0, b1 in box)
            receives.append((peer, recv_end, recv_end + box_size(box),
                             relative_slices(box, out_box), shape))
            recv_end = receives[-1][2]
        kept = tuple((relative_slices(box, a_box), relative_slices(box, out_box))
                     for box in local)
        return cls(tuple(sends), tuple(receives), kept, end, recv_end,
                   tuple(b1 - b0 for b0, b1 in out_box))


class Redistribute:
    """forward: activation from layout ``src`` to ``dst``; backward: its gradient, back."""

    def __init__(self, backend: Backend, grids: GridSet, src: Layout, dst: Layout) -> None:
        self.backend, self.src, self.dst = backend, src, dst
        self.comm: MPI.Comm = grids.world
        self.rank = self.comm.Get_rank()
        src_box, dst_box = src.box(self.rank), dst.box(self.rank)
        self.src_shape = tuple(b1 - b0 for b0, b1 in src_box)
        self.plan = plan_move(src, dst, self.rank)
        self.kind = self.plan.kind
        if self.kind == ALLGATHER:
            model_comm = grids.get(dst.grid).model_comm
            self.gather = AllGather(backend, model_comm, self.plan.axis, self.plan.ranges)
        if self.kind not in (IDENTITY, SLICE, ALLGATHER):  # a general move: both routes now
            p = self.plan
            self.forward_route = _Route.of(p.sends, p.receives, p.local, src_box, dst_box)
            self.backward_route = _Route.of(p.receives, p.sends, p.local, dst_box, src_box)

    def forward(self, x: Any) -> Any:
        if self.kind == IDENTITY:
            return x
        if self.kind == SLICE:
            return self.backend.xp.ascontiguousarray(x[self.plan.slices])
        if self.kind == ALLGATHER:
            return self.gather.forward(x)
        out = self.backend.xp.empty(self.forward_route.out_shape, dtype=x.dtype)
        self._exchange(x, out, self.forward_route, accumulate=False)
        return out

    def backward(self, dy: Any) -> Any:
        xp = self.backend.xp
        if self.kind == IDENTITY:
            return dy
        if self.kind == SLICE:
            dx = xp.zeros(self.src_shape, dtype=dy.dtype)
            dx[self.plan.slices] = dy
            return dx
        if self.kind == ALLGATHER:
            return self.gather.backward(dy)
        dx = xp.zeros(self.src_shape, dtype=dy.dtype)
        self._exchange(dy, dx, self.backward_route, accumulate=True)
        return dx

    def _exchange(self, a: Any, out: Any, route: _Route, accumulate: bool) -> None:
        """Send ``route``'s pieces of ``a`` and put the pieces received and kept into ``out``
        (added when ``accumulate``: the adjoint sums every piece's gradient into its source,
        and replicas of a source overlap)."""
        be = self.backend

        def put(where: tuple[slice, ...], block: Any) -> None:
            if accumulate:
                out[where] += block
            else:
                out[where] = block

        with be.clock.comm():  # packing, the messages and unpacking
            # one receive and one send buffer, a contiguous stretch per peer: one staging copy
            # each way on a GPU, however many pieces
            recv_buf = be.empty_mpi((route.recv_total,), a.dtype)
            requests = [self.comm.Irecv(recv_buf[lo:hi], source=peer, tag=_PIECE_TAG)
                        for peer, lo, hi, _, _ in route.receives]
            send_buf = be.xp.empty(route.send_total, dtype=a.dtype)
            for _, lo, hi, where in route.sends:
                send_buf[lo:hi] = a[where].ravel()
            send_buf = be.to_mpi(send_buf)
            be.clock.sent(send_buf.nbytes)
            requests += [self.comm.Isend(send_buf[lo:hi], dest=peer, tag=_PIECE_TAG)
                         for peer, lo, hi, _ in route.sends]
            for source, target in route.local:  # while the messages travel
                put(target, a[source])
            MPI.Request.Waitall(requests)
            recv_buf = be.from_mpi(recv_buf)
            for _, lo, hi, where, shape in route.receives:
                put(where, recv_buf[lo:hi].reshape(shape))
