"""Move an activation between two layouts (forward) and its gradient back (backward, the adjoint).

The move and its method come from :func:`hpctrain.layout.moves.move_between`, computed once from
the two layouts; each method has its transfer here, which runs it (see
:mod:`hpctrain.layout.moves` for the methods):

- identity: nothing moves.
- slice: forward takes a slice of the local block, backward pads the gradient with zeros.
- all-gather: forward ``Allgatherv`` over the target grid's model communicator, backward its
  adjoint ``Reduce_scatter``.
- general: forward each piece goes point to point (``Isend``/``Irecv``, then ``Waitall``; under
  NCCL, sends and receives in one group call) from its one sender to its receiver on the world
  communicator, only between ranks that share data; backward the same pieces travel in reverse
  and are added into the sources.

The all-gather and the general exchange report their time and bytes to the backend's comm
clock; identity and slice move nothing between ranks and report none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.comm.collectives import AllGather
from hpctrain.comm.grid import GridSet
from hpctrain.comm.transport import group_of
from hpctrain.device.backend import Backend
from hpctrain.layout.layout import Box, Layout, box_size, relative_slices
from hpctrain.layout.moves import (
    AllGatherMove,
    GeneralMove,
    IdentityMove,
    Move,
    SliceMove,
    move_between,
)

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
    """forward: activation from layout ``src`` to ``dst``; backward: its gradient, back.

    ``move`` is the :class:`~hpctrain.layout.moves.Move` (its method, its price); this rank's
    part is set up once, here, by the transfer of that method.
    """

    def __init__(self, backend: Backend, grids: GridSet, src: Layout, dst: Layout) -> None:
        self.src, self.dst = src, dst
        self.move = move_between(src, dst)
        self.transfer = TRANSFERS[type(self.move)](backend, grids, self.move)

    def forward(self, x: Any) -> Any:
        return self.transfer.forward(x)

    def backward(self, dy: Any) -> Any:
        return self.transfer.backward(dy)


class _Identity:
    """Nothing moves: the array is handed on, and its gradient back."""

    def __init__(self, backend: Backend, grids: GridSet, move: IdentityMove) -> None:
        pass

    def forward(self, x: Any) -> Any:
        return x

    def backward(self, dy: Any) -> Any:
        return dy


class _Slice:
    """Forward a contiguous copy of this rank's new block; backward the gradient in zeros."""

    def __init__(self, backend: Backend, grids: GridSet, move: SliceMove) -> None:
        rank = grids.world.Get_rank()
        self.backend, self.slices = backend, move.slices(rank)
        self.src_shape = move.src.local_shape(rank)

    def forward(self, x: Any) -> Any:
        return self.backend.xp.ascontiguousarray(x[self.slices])

    def backward(self, dy: Any) -> Any:
        dx = self.backend.xp.zeros(self.src_shape, dtype=dy.dtype)
        dx[self.slices] = dy
        return dx


class _Gather:
    """The all-gather over the ranks of the target's mesh digits that gather (a grid's model
    communicator), and its adjoint."""

    def __init__(self, backend: Backend, grids: GridSet, move: AllGatherMove) -> None:
        axis, ranges = move.gathered(grids.world.Get_rank())
        self.gather = AllGather(backend, grids.over(move.dst, move.digits), axis, ranges)

    def forward(self, x: Any) -> Any:
        return self.gather.forward(x)

    def backward(self, dy: Any) -> Any:
        return self.gather.backward(dy)


class _Exchange:
    """The pieces of a general move, point to point: both routes set up once."""

    def __init__(self, backend: Backend, grids: GridSet, move: GeneralMove) -> None:
        self.backend, self.comm = backend, grids.world
        self.group = group_of(backend, self.comm)  # under NCCL, its communicator made now
        rank = self.comm.Get_rank()
        src_box, dst_box = move.src.box(rank), move.dst.box(rank)
        self.src_shape = move.src.local_shape(rank)
        p = move.exchange(rank)
        self.forward_route = _Route.of(p.sends, p.receives, p.local, src_box, dst_box)
        self.backward_route = _Route.of(p.receives, p.sends, p.local, dst_box, src_box)

    def forward(self, x: Any) -> Any:
        out = self.backend.xp.empty(self.forward_route.out_shape, dtype=x.dtype)
        self._exchange(x, out, self.forward_route, accumulate=False)
        return out

    def backward(self, dy: Any) -> Any:
        dx = self.backend.xp.zeros(self.src_shape, dtype=dy.dtype)
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
            send_buf = be.xp.empty(route.send_total, dtype=a.dtype)
            for _, lo, hi, where in route.sends:
                send_buf[lo:hi] = a[where].ravel()
            pending = self.group.start_exchange(
                send_buf, [(peer, lo, hi) for peer, lo, hi, _ in route.sends], route.recv_total,
                [(peer, lo, hi) for peer, lo, hi, _, _ in route.receives], _PIECE_TAG)
            for source, target in route.local:  # while the messages travel
                put(target, a[source])
            recv_buf = pending.wait()
            for _, lo, hi, where, shape in route.receives:
                put(where, recv_buf[lo:hi].reshape(shape))


TRANSFERS: dict[type[Move], type] = {IdentityMove: _Identity, SliceMove: _Slice,
                                     AllGatherMove: _Gather, GeneralMove: _Exchange}
"""The transfer that runs each method of :data:`hpctrain.layout.moves.METHODS`."""
