"""Move an activation between two layouts (forward) and its gradient back (backward, the adjoint).

The cheapest exact method is chosen once, from the layouts alone:

- ``identity``: the layouts are equal; nothing moves.
- ``slice``: every rank's new block lies inside its old one (replicated → split on one grid);
  forward takes a slice, backward pads the gradient with zeros — no messages either way.
- ``allgather``: on the target grid, the old blocks of each model group tile the new block along
  one axis (a channel- or height-split tensor becoming replicated, or a 1×P batch split becoming
  a Pr×Pc one); forward ``Allgatherv``, backward ``Reduce_scatter``.
- ``alltoall``: anything else; forward ``Alltoallv`` of the pieces of :func:`transfer_pieces`,
  backward the same pieces in reverse, added into the sources.

The all-gather and all-to-all report their time to the backend's comm clock; identity and
slice move nothing between ranks and report none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpi4py import MPI

from hpctrain.backend import Backend
from hpctrain.comm.collectives import AllGather
from hpctrain.grid import GridSet
from hpctrain.layout import Box, Layout, box_size, relative_slices
from hpctrain.moves import transfer_pieces


def _contains(outer: Box, inner: Box) -> bool:
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in zip(outer, inner, strict=True))


def _allgather_axis(src: Layout, dst: Layout) -> int | None:
    """The axis along which each target model group's source blocks tile its target block."""
    pr = dst.grid[0]
    if pr == 1:
        return None
    found = None
    for rank in range(dst.size):
        group = [rank - rank % pr + i for i in range(pr)]
        need, blocks = dst.box(rank), [src.box(r) for r in group]
        axes = [a for a in range(len(need)) if any(b[a] != need[a] for b in blocks)]
        if len(axes) != 1 or (found is not None and axes[0] != found):
            return None
        found = axes[0]
        edges = [need[found][0]] + [b[found][1] for b in blocks]
        if edges[-1] != need[found][1]:
            return None
        if any(b[found][0] != edges[k] for k, b in enumerate(blocks)):
            return None
    return found


@dataclass(frozen=True)
class _Route:
    """One direction of an all-to-all: (peer, box) per message, and MPI counts/displacements."""

    peers: list[tuple[int, Box]]
    counts: list[int]
    displs: list[int]

    @classmethod
    def of(cls, peers: list[tuple[int, Box]], size: int) -> _Route:
        counts = [0] * size
        for peer, box in peers:
            counts[peer] = box_size(box)
        return cls(peers, counts, [sum(counts[:k]) for k in range(size)])


class Redistribute:
    """forward: activation from layout ``src`` to ``dst``; backward: its gradient, back."""

    def __init__(self, backend: Backend, grids: GridSet, src: Layout, dst: Layout) -> None:
        self.backend, self.src, self.dst = backend, src, dst
        self.comm: MPI.Comm = grids.world
        self.rank = self.comm.Get_rank()
        self.src_box, self.dst_box = src.box(self.rank), dst.box(self.rank)
        if src == dst:
            self.kind = "identity"
        elif all(_contains(src.box(r), dst.box(r)) for r in range(dst.size)):
            self.kind = "slice"
            self.slices = relative_slices(self.dst_box, self.src_box)
        elif (axis := _allgather_axis(src, dst)) is not None:
            self.kind = "allgather"
            grid = grids.get(dst.grid)
            group = [self.rank - grid.i + i for i in range(grid.pr)]
            ranges = tuple(src.box(r)[axis] for r in group)
            self.gather = AllGather(backend, grid.model_comm, axis, ranges)
        else:
            self.kind = "alltoall"
            self._plan_alltoall()

    def _plan_alltoall(self) -> None:
        pieces = transfer_pieces(self.src, self.dst)
        me, size = self.rank, self.comm.Get_size()
        self.outgoing = _Route.of(
            sorted((p.receiver, p.box) for p in pieces if p.sender == me != p.receiver), size)
        self.incoming = _Route.of(
            sorted((p.sender, p.box) for p in pieces if p.receiver == me != p.sender), size)
        self.local = [p.box for p in pieces if p.sender == me == p.receiver]

    def forward(self, x: Any) -> Any:
        if self.kind == "identity":
            return x
        if self.kind == "slice":
            return self.backend.xp.ascontiguousarray(x[self.slices])
        if self.kind == "allgather":
            return self.gather.forward(x)
        out = self.backend.xp.empty(self.dst.local_shape(self.rank), dtype=x.dtype)
        self._exchange(x, self.src_box, out, self.dst_box, self.outgoing, self.incoming,
                       accumulate=False)
        return out

    def backward(self, dy: Any) -> Any:
        xp = self.backend.xp
        if self.kind == "identity":
            return dy
        if self.kind == "slice":
            dx = xp.zeros(self.src.local_shape(self.rank), dtype=dy.dtype)
            dx[self.slices] = dy
            return dx
        if self.kind == "allgather":
            return self.gather.backward(dy)
        dx = xp.zeros(self.src.local_shape(self.rank), dtype=dy.dtype)
        self._exchange(dy, self.dst_box, dx, self.src_box, self.incoming, self.outgoing,
                       accumulate=True)
        return dx

    def _exchange(self, a: Any, a_box: Box, out: Any, out_box: Box, send: _Route,
                  recv: _Route, accumulate: bool) -> None:
        """Alltoallv the ``send`` pieces of ``a`` into ``out`` (added when ``accumulate``)."""
        with self.backend.clock.comm():  # packing, Alltoallv and unpacking
            xp, be = self.backend.xp, self.backend
            send_buf = xp.empty(sum(send.counts), dtype=a.dtype)
            for peer, box in send.peers:
                start = send.displs[peer]
                send_buf[start:start + send.counts[peer]] = a[relative_slices(box, a_box)].ravel()
            recv_buf = be.empty_mpi((sum(recv.counts),), a.dtype)
            be.clock.sent(send_buf.nbytes)
            self.comm.Alltoallv([be.to_mpi(send_buf), (send.counts, send.displs)],
                                [recv_buf, (recv.counts, recv.displs)])
            recv_buf = be.from_mpi(recv_buf)
            blocks = [(box, a[relative_slices(box, a_box)]) for box in self.local]
            for peer, box in recv.peers:
                start = recv.displs[peer]
                shape = [hi - lo for lo, hi in box]
                blocks.append((box, recv_buf[start:start + recv.counts[peer]].reshape(shape)))
            for box, block in blocks:
                if accumulate:
                    out[relative_slices(box, out_box)] += block
                else:
                    out[relative_slices(box, out_box)] = block
