"""Row bands for window layers (conv, pooling): the whole first spatial axis, or a split of it
with halos. "Rows" are the planes of that axis: an image's rows, a volume's depth slices. The
other spatial axes, where split, are extended with their halos first, axis by axis (the last
first), so the rows sent along the first axis carry every edge and corner.

Without a split there is one band: all output rows from the whole input. With a split
(domain parallelism) the output rows are cut into up to three bands: the *interior*, whose
windows read only owned rows and is computed while the halo messages travel, then the top and
bottom bands, computed from the rows extended with the halos. Backward runs the boundary bands
first so their halo gradients can be sent back while the interior band's backward runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpctrain.comm.grid import GridSet
from hpctrain.comm.halo import ROW_AXIS, HaloExchange
from hpctrain.device.backend import Backend
from hpctrain.kernels.resize import Resampling
from hpctrain.layout.layout import HEIGHT_AXIS, Layout, axis_name
from hpctrain.layout.partition import (
    HaloPlan,
    TransposedWindow,
    Window,
    halo_plans,
    windows_of,
)

# op_forward(x_rows, pads: (before, after) per spatial axis) -> (y_rows, cache)
OpForward = Callable[[Any, tuple[tuple[int, int], ...]], tuple[Any, Any]]
# op_backward(dy_rows, cache) -> dx_rows (or None); the op keeps its own parameter gradients
OpBackward = Callable[[Any, Any], Any]


class HaloBlock:
    """A rank's block of ``layout`` extended, along each split spatial axis, by the halo rows
    the layer's ``windows`` (one per spatial axis) read, the axes one after the other, the last
    first, so corners travel too; the gradients of those rows go back the same way, in
    reverse. For a layer computed on the extended block in one go (a resize, a transposed
    convolution): a convolution's rows overlap their halos with the interior
    (:class:`WindowRows`).

    ``rows`` and ``outs``: per spatial axis, the input rows held once extended and the output
    rows computed from them (the whole axis where it is not split)."""

    def __init__(self, backend: Backend, grids: GridSet, layout: Layout,
                 windows: list[Window | Resampling | TransposedWindow],
                 name: str) -> None:
        rank = grids.world.Get_rank()
        self.rows: list[tuple[int, int]] = []
        self.outs: list[tuple[int, int]] = []
        exchanges = []
        for k, window in enumerate(windows):
            axis, n = 2 + k, layout.shape[2 + k]
            if axis not in layout.spatial_cuts:
                self.rows.append((0, n))
                self.outs.append((0, window.out_size(n)))
                continue
            plan = halo_plans(n, layout.parts[axis], window, name,
                              axis_name(layout.shape, axis))[layout.block_index(rank, axis)]
            comm = grids.over(layout, layout.digits_of((axis,)))
            exchanges.append(HaloExchange(backend, comm, plan, axis))
            self.rows.append(plan.need)
            self.outs.append(plan.out)
        self.exchanges = sorted(exchanges, key=lambda e: -e.axis)

    def extend(self, x: Any) -> Any:
        """X: the rank's block -> its block with the halo rows of every split axis."""
        for exchange in self.exchanges:
            x = exchange.finish(exchange.start(x))
        return x

    def give_back(self, dx: Any) -> Any:
        """The adjoint of :meth:`extend`: the halo rows' gradients added by their owners."""
        for exchange in reversed(self.exchanges):
            dx = exchange.finish_backward(exchange.start_backward(dx))
        return dx


@dataclass(eq=False)  # bands are compared by identity
class _Band:
    out_rows: tuple[int, int]
    in_rows: tuple[int, int]  # global input rows read, clipped to the image
    cache: Any = None


class WindowRows:
    """Run a window op over the rows a rank owns.

    Parameters
    ----------
    window : the op's window along the first spatial axis.
    n_rows : input size along it (global).
    other_pads : (before, after) zero padding of each other spatial axis: the image's padding
        where that axis is whole, else the padding of this rank's block of it.
    halo : the exchange for a height-split input, or None when the rank holds every row.
    plan : the halo plan of this rank (None without a split).
    extensions : the halo exchanges of the other split spatial axes, last axis first: the
        input is extended by each in turn before the rows are run, and its gradient given back
        through them in reverse (each the adjoint of its forward).
    """

    def __init__(self, backend: Backend, window: Window, n_rows: int,
                 other_pads: tuple[tuple[int, int], ...], halo: HaloExchange | None = None,
                 plan: HaloPlan | None = None,
                 extensions: tuple[HaloExchange, ...] = ()) -> None:
        self.backend, self.window, self.n_rows = backend, window, n_rows
        self.other_pads = other_pads
        self.halo, self.plan, self.extensions = halo, plan, extensions
        self.n_out = window.out_size(n_rows)

    @classmethod
    def of(cls, backend: Backend, grids: GridSet, layout: Layout, options: Any, name: str
           ) -> WindowRows:
        """The rows of a window layer with ``options`` (kernel, stride, pad: one per spatial
        axis) on ``layout``: with this rank's halo exchange along every spatial axis ``layout``
        cuts."""
        rank = grids.world.Get_rank()
        windows = windows_of(options)
        pads = list(options.pad)
        exchanges = {}
        for axis in layout.spatial_cuts:
            plans = halo_plans(layout.shape[axis], layout.parts[axis], windows[axis - 2], name,
                               axis_name(layout.shape, axis))
            plan = plans[layout.block_index(rank, axis)]
            comm = grids.over(layout, layout.digits_of((axis,)))
            exchanges[axis] = (HaloExchange(backend, comm, plan, axis), plan)
            pads[axis - 2] = (plan.pad_top, plan.pad_bottom)
        extensions = tuple(exchanges[a][0] for a in sorted(exchanges, reverse=True)
                           if a > HEIGHT_AXIS)
        h = layout.shape[HEIGHT_AXIS]
        if HEIGHT_AXIS not in exchanges:
            return cls(backend, windows[0], h, tuple(pads[1:]), extensions=extensions)
        halo, plan = exchanges[HEIGHT_AXIS]
        return cls(backend, windows[0], h, tuple(pads[1:]), halo, plan, extensions)

    def _extend(self, x: Any) -> Any:
        for exchange in self.extensions:
            x = exchange.finish(exchange.start(x))
        return x

    def _give_back(self, dx: Any) -> Any:
        for exchange in reversed(self.extensions):
            dx = exchange.finish_backward(exchange.start_backward(dx))
        return dx

    def _band(self, out_rows: tuple[int, int]
              ) -> tuple[_Band, tuple[tuple[int, int], ...]]:
        lo, hi = self.window.rows_needed(*out_rows)
        pads = ((max(0, -lo), max(0, hi - self.n_rows)), *self.other_pads)
        return _Band(out_rows, (max(lo, 0), min(hi, self.n_rows))), pads

    def forward(self, x: Any, op: OpForward) -> tuple[Any, list[_Band]]:
        """Y for the owned output rows, and the bands (with their caches) for ``backward``."""
        x = self._extend(x)
        self.x_shape = x.shape
        if self.halo is None:
            band, pads = self._band((0, self.n_out))
            y, band.cache = op(x, pads)
            return y, [band]
        p = self.plan
        pending = self.halo.start(x)
        outputs: dict[str, Any] = {}
        bands: list[_Band] = []
        has_interior = p.interior[1] > p.interior[0]
        if has_interior:
            band, pads = self._band(p.interior)
            lo, hi = band.in_rows[0] - p.own[0], band.in_rows[1] - p.own[0]
            outputs["interior"], band.cache = op(x[:, :, lo:hi], pads)
            bands.append(band)
        x_ext = self.halo.finish(pending)
        inner = p.interior if has_interior else (p.out[1], p.out[1])
        for where, rows in (("top", (p.out[0], inner[0])), ("bottom", (inner[1], p.out[1]))):
            if rows[1] > rows[0]:
                band, pads = self._band(rows)
                lo, hi = band.in_rows[0] - p.need[0], band.in_rows[1] - p.need[0]
                outputs[where], band.cache = op(x_ext[:, :, lo:hi], pads)
                bands.append(band)
        ordered = [outputs[k] for k in ("top", "interior", "bottom") if k in outputs]
        y = ordered[0] if len(ordered) == 1 else self.backend.xp.concatenate(ordered, ROW_AXIS)
        return y, bands

    def backward(self, dy: Any, bands: list[_Band], op: OpBackward, need_dx: bool) -> Any:
        """dX for the owned input rows (None unless ``need_dx``; the op's parameter grads run)."""
        dx = self._backward_rows(dy, bands, op, need_dx)
        return self._give_back(dx) if need_dx else None

    def _backward_rows(self, dy: Any, bands: list[_Band], op: OpBackward, need_dx: bool) -> Any:
        p = self.plan
        if len(bands) == 1 and (self.halo is None or bands[0].in_rows == p.need):
            # one band read every row the rank needed (the whole axis, or a split whose windows
            # read only owned rows, as a pool's that tile them): its dX is dX_ext, with no
            # zeroed block to sum it into; the caller drops it unless need_dx
            dx = op(dy, bands[0].cache)
            if self.halo is None or not need_dx:
                return dx
            return self.halo.finish_backward(self.halo.start_backward(dx))
        boundary = [b for b in bands if b.out_rows != p.interior]
        interior = [b for b in bands if b.out_rows == p.interior]
        n, c, _, *rest = self.x_shape
        dx_ext = self.backend.xp.zeros((n, c, p.need[1] - p.need[0], *rest), dtype=dy.dtype)
        pending = None
        for band in boundary + interior:
            if band in interior and need_dx:
                pending = self.halo.start_backward(dx_ext)  # halo rows are final: send them
            dx_band = op(dy[:, :, band.out_rows[0] - p.out[0]:band.out_rows[1] - p.out[0]],
                         band.cache)
            if need_dx:
                lo, hi = band.in_rows[0] - p.need[0], band.in_rows[1] - p.need[0]
                dx_ext[:, :, lo:hi] += dx_band
        if not need_dx:
            return None
        return self.halo.finish_backward(pending or self.halo.start_backward(dx_ext))
