"""Halo exchange for window layers split along a spatial axis (an image's height or width, a
volume's depth, height or width), by non-blocking point-to-point messages. A "row" is one plane
of that axis.

Several split axes are exchanged one after the other, each on the array the ones before extended
(see :mod:`hpctrain.layers.rows`): the planes sent along the second axis carry the halos received
along the first, so edges and corners arrive with no message of their own.

forward: each rank receives the rows above and below its block that its windows read.
backward (the adjoint): the gradients of those halo rows go back to their owners and are added.
Both are split into ``start`` (post the messages) and ``finish`` (wait), so the layer computes
its interior rows while the messages are in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from hpctrain.comm.transport import Pending, group_of
from hpctrain.device.backend import Backend
from hpctrain.layout.partition import HaloPlan

ROW_AXIS = 2
_HALO_TAG = 11


def _n(rows: tuple[int, int]) -> int:
    return rows[1] - rows[0]


@dataclass
class _InFlight:
    pending: Pending  # the messages, both ways
    shapes: list[tuple[int, ...] | None]  # of the blocks from above and from below
    keep: Any  # the array the layer handed in


class HaloExchange:
    """Planned once from a :class:`~hpctrain.layout.partition.HaloPlan`; ``comm`` holds the
    ranks that split ``axis`` (of the arrays: 2 is the first spatial axis), in order."""

    def __init__(self, backend: Backend, comm: MPI.Comm, plan: HaloPlan,
                 axis: int = ROW_AXIS) -> None:
        self.backend, self.comm, self.plan, self.axis = backend, comm, plan, axis
        rank = comm.Get_rank()
        self.above, self.below = rank - 1, rank + 1
        self.group = group_of(backend, comm)  # under NCCL, its communicator made now

    def _rows(self, x: Any, lo: int, hi: int) -> Any:
        """``x``'s planes [lo, hi) along the split axis."""
        return x[(slice(None),) * self.axis + (slice(lo, hi),)]

    def _shape(self, x: Any, n_rows: int) -> tuple[int, ...]:
        return (*x.shape[:self.axis], n_rows, *x.shape[self.axis + 1:])

    def _exchange(self, x: Any, to_above: Any, to_below: Any, rows_from_above: int,
                  rows_from_below: int) -> _InFlight:
        """Post receives of row blocks shaped like ``x`` and sends of ``to_above``/``to_below``,
        each way packed into one flat buffer (a stretch per neighbour)."""
        xp = self.backend.xp
        with self.backend.clock.comm():  # posting is cheap, but packing and staging are not
            receives, shapes, end = [], [], 0
            for n_rows, peer in ((rows_from_above, self.above), (rows_from_below, self.below)):
                shape = self._shape(x, n_rows) if n_rows else None
                if shape is not None:
                    size = int(np.prod(shape, dtype=np.int64))
                    receives.append((peer, end, end + size))
                    end += size
                shapes.append(shape)
            blocks = [(peer, rows) for rows, peer in ((to_above, self.above),
                                                      (to_below, self.below))
                      if rows.shape[self.axis]]
            sends, start = [], 0
            for peer, rows in blocks:
                sends.append((peer, start, start + rows.size))
                start += rows.size
            if len(blocks) > 1:
                send = xp.concatenate([rows.ravel() for _, rows in blocks])
            elif blocks:
                send = xp.ascontiguousarray(blocks[0][1]).reshape(-1)
            else:
                send = xp.empty(0, dtype=x.dtype)
            # one tag for both directions: each pair exchanges at most one message each way
            pending = self.group.start_exchange(send, sends, end, receives, _HALO_TAG)
        return _InFlight(pending, shapes, x)

    def _received(self, pending: _InFlight) -> tuple[Any | None, Any | None]:
        # timed: the wait left exposed after the interior rows were computed
        with self.backend.clock.comm():
            flat = pending.pending.wait()
            blocks, start = [], 0
            for shape in pending.shapes:
                if shape is None:
                    blocks.append(None)
                    continue
                size = int(np.prod(shape, dtype=np.int64))
                blocks.append(flat[start:start + size].reshape(shape))
                start += size
            return tuple(blocks)

    def start(self, x: Any) -> _InFlight:
        """Post the halo messages for X: (N, C, own rows, …)."""
        p, h0 = self.plan, self.plan.own[0]
        return self._exchange(x, self._rows(x, p.send_top[0] - h0, p.send_top[1] - h0),
                              self._rows(x, p.send_bottom[0] - h0, p.send_bottom[1] - h0),
                              _n(p.recv_top), _n(p.recv_bottom))

    def finish(self, pending: _InFlight) -> Any:
        """X_ext: (N, C, need rows, …) — top halo, the needed own rows, bottom halo."""
        top, bottom = self._received(pending)
        p, x = self.plan, pending.keep
        lo, hi = max(p.need[0], p.own[0]), min(p.need[1], p.own[1])
        own = self._rows(x, max(lo - p.own[0], 0), max(hi - p.own[0], 0))
        parts = [b for b in (top, own, bottom) if b is not None]
        return parts[0] if len(parts) == 1 else self.backend.xp.concatenate(parts, axis=self.axis)

    def start_backward(self, dx_ext: Any) -> _InFlight:
        """Send the gradients of the halo rows of dX_ext back to the ranks that own them.

        ``dx_ext`` is handed over: where no halo rows came in, :meth:`finish_backward` gives
        it back as dX with the neighbours' gradients added in place."""
        p, rows = self.plan, dx_ext.shape[self.axis]
        return self._exchange(dx_ext, self._rows(dx_ext, 0, _n(p.recv_top)),
                              self._rows(dx_ext, rows - _n(p.recv_bottom), rows),
                              _n(p.send_top), _n(p.send_bottom))

    def finish_backward(self, pending: _InFlight) -> Any:
        """dX: (N, C, own rows, …) — own rows of dX_ext plus the halo gradients sent back."""
        from_above, from_below = self._received(pending)
        p, dx_ext = self.plan, pending.keep
        h0, h1 = p.own
        lo, hi = max(p.need[0], h0), min(p.need[1], h1)
        start = _n(p.recv_top)
        if (lo, hi) != (h0, h1):  # some own rows no window read: their gradient is zero
            dx = self.backend.xp.zeros(self._shape(dx_ext, h1 - h0), dtype=dx_ext.dtype)
            if hi > lo:
                self._rows(dx, lo - h0, hi - h0)[...] += self._rows(dx_ext, start,
                                                                    start + hi - lo)
        elif dx_ext.shape[self.axis] == h1 - h0:
            # no halo rows came in: dX_ext is dX, and its messages are done, so it takes the
            # neighbours' gradients in place (a pass over the block fewer, and no new block)
            dx = dx_ext
        else:  # one copy of the own rows, where zeros and a sum take two passes
            dx = self._rows(dx_ext, start, start + h1 - h0).copy()
        for rows, grad in ((p.send_top, from_above), (p.send_bottom, from_below)):
            if grad is not None:
                self._rows(dx, rows[0] - h0, rows[1] - h0)[...] += grad
        return dx
