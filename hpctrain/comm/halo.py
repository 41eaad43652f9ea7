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

from mpi4py import MPI

from hpctrain.device.backend import Backend
from hpctrain.layout.partition import HaloPlan

ROW_AXIS = 2
_DOWN, _UP = 11, 12  # tags: rows travelling to the rank below / above


def _n(rows: tuple[int, int]) -> int:
    return rows[1] - rows[0]


@dataclass
class _InFlight:
    requests: list[MPI.Request]
    received: list[Any | None]  # from above, from below
    keep: tuple  # the arrays the layer handed in, and the send buffers, alive until the wait


class HaloExchange:
    """Planned once from a :class:`~hpctrain.layout.partition.HaloPlan`; ``comm`` holds the
    ranks that split ``axis`` (of the arrays: 2 is the first spatial axis), in order."""

    def __init__(self, backend: Backend, comm: MPI.Comm, plan: HaloPlan,
                 axis: int = ROW_AXIS) -> None:
        self.backend, self.comm, self.plan, self.axis = backend, comm, plan, axis
        rank = comm.Get_rank()
        self.above, self.below = rank - 1, rank + 1

    def _rows(self, x: Any, lo: int, hi: int) -> Any:
        """``x``'s planes [lo, hi) along the split axis."""
        return x[(slice(None),) * self.axis + (slice(lo, hi),)]

    def _shape(self, x: Any, n_rows: int) -> tuple[int, ...]:
        return (*x.shape[:self.axis], n_rows, *x.shape[self.axis + 1:])

    def _exchange(self, x: Any, to_above: Any, to_below: Any, rows_from_above: int,
                  rows_from_below: int) -> _InFlight:
        """Post receives of row blocks shaped like ``x`` and sends of ``to_above``/``to_below``."""
        requests, received, sent = [], [], []
        with self.backend.clock.comm():  # posting is cheap, but staging sends is not on a GPU
            for n_rows, peer, tag in ((rows_from_above, self.above, _DOWN),
                                      (rows_from_below, self.below, _UP)):
                buf = self.backend.empty_mpi(self._shape(x, n_rows), x.dtype) if n_rows else None
                if buf is not None:
                    requests.append(self.comm.Irecv(buf, source=peer, tag=tag))
                received.append(buf)
            for rows, peer, tag in ((to_above, self.above, _UP), (to_below, self.below, _DOWN)):
                if rows.shape[self.axis]:
                    buf = self.backend.to_mpi(rows)
                    self.backend.clock.sent(buf.nbytes)
                    requests.append(self.comm.Isend(buf, dest=peer, tag=tag))
                    sent.append(buf)
        return _InFlight(requests, received, (x, sent))

    def _received(self, pending: _InFlight) -> tuple[Any | None, Any | None]:
        # timed: the wait left exposed after the interior rows were computed
        with self.backend.clock.comm():
            MPI.Request.Waitall(pending.requests)
            return tuple(None if b is None else self.backend.from_mpi(b)
                         for b in pending.received)

    def start(self, x: Any) -> _InFlight:
        """Post the halo messages for X: (N, C, own rows, …)."""
        p, h0 = self.plan, self.plan.own[0]
        return self._exchange(x, self._rows(x, p.send_top[0] - h0, p.send_top[1] - h0),
                              self._rows(x, p.send_bottom[0] - h0, p.send_bottom[1] - h0),
                              _n(p.recv_top), _n(p.recv_bottom))

    def finish(self, pending: _InFlight) -> Any:
        """X_ext: (N, C, need rows, …) — top halo, the needed own rows, bottom halo."""
        top, bottom = self._received(pending)
        p, (x, _) = self.plan, pending.keep
        lo, hi = max(p.need[0], p.own[0]), min(p.need[1], p.own[1])
        own = self._rows(x, max(lo - p.own[0], 0), max(hi - p.own[0], 0))
        parts = [b for b in (top, own, bottom) if b is not None]
        return parts[0] if len(parts) == 1 else self.backend.xp.concatenate(parts, axis=self.axis)

    def start_backward(self, dx_ext: Any) -> _InFlight:
        """Send the gradients of the halo rows of dX_ext back to the ranks that own them."""
        p, rows = self.plan, dx_ext.shape[self.axis]
        return self._exchange(dx_ext, self._rows(dx_ext, 0, _n(p.recv_top)),
                              self._rows(dx_ext, rows - _n(p.recv_bottom), rows),
                              _n(p.send_top), _n(p.send_bottom))

    def finish_backward(self, pending: _InFlight) -> Any:
        """dX: (N, C, own rows, …) — own rows of dX_ext plus the halo gradients sent back."""
        from_above, from_below = self._received(pending)
        p, (dx_ext, _) = self.plan, pending.keep
        h0, h1 = p.own
        dx = self.backend.xp.zeros(self._shape(dx_ext, h1 - h0), dtype=dx_ext.dtype)
        lo, hi = max(p.need[0], h0), min(p.need[1], h1)
        if hi > lo:
            start = _n(p.recv_top)
            self._rows(dx, lo - h0, hi - h0)[...] += self._rows(dx_ext, start, start + hi - lo)
        for rows, grad in ((p.send_top, from_above), (p.send_bottom, from_below)):
            if grad is not None:
                self._rows(dx, rows[0] - h0, rows[1] - h0)[...] += grad
        return dx
