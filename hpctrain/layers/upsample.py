"""Resizing of images and volumes (``upsample``) on the layout that feeds it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpctrain.comm.halo import HaloExchange
from hpctrain.kernels.resize import resampling_matrix, resize_backward, resize_forward
from hpctrain.layers.base import Layer
from hpctrain.layout.layout import axis_name
from hpctrain.layout.partition import halo_plans

if TYPE_CHECKING:
    from hpctrain.layers.base import BuildContext


class Upsample(Layer):
    """Y = X resized along each spatial axis by a small matrix
    (:mod:`hpctrain.kernels.resize`); ΔX = ΔY through the transposed matrices.

    X, Y: any block. Along a split spatial axis a rank holds its block of the output rows and
    reads its input rows and the halo rows beyond them (the axes extended one after the other,
    the last first, so corners travel too); ΔX's halo rows go back to their owners in reverse.
    """

    mode = "follow"

    def __init__(self, name: str, options: Any, ctx: BuildContext) -> None:
        self.name, self.backend, self.params = name, ctx.backend, []
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        x, rank, xp = self.in_layout, ctx.rank, ctx.backend.xp
        self.exchanges = []  # (axis, exchange), the last axis first
        matrices = []
        for k, resampling in enumerate(options.resamplings()):
            axis = 2 + k
            rows, out = (0, resampling.n_in), (0, resampling.n_out)
            if axis in x.spatial_cuts:
                plan = halo_plans(x.shape[axis], x.parts[axis], resampling, name,
                                  axis_name(x.shape, axis))[x.block_index(rank, axis)]
                comm = ctx.grids.over(x, x.digits_of((axis,)))
                self.exchanges.append(HaloExchange(ctx.backend, comm, plan, axis))
                rows, out = plan.need, plan.out
            matrices.append(xp.asarray(resampling_matrix(resampling, out, rows),
                                       dtype=ctx.backend.dtype))
        self.exchanges.sort(key=lambda e: -e.axis)
        self.matrices = matrices

    def forward(self, x: Any, step: int) -> Any:
        for exchange in self.exchanges:
            x = exchange.finish(exchange.start(x))
        return resize_forward(self.backend.xp, x, self.matrices)

    def backward(self, dy: Any) -> Any:
        dx = resize_backward(self.backend.xp, dy, self.matrices)
        for exchange in reversed(self.exchanges):
            dx = exchange.finish_backward(exchange.start_backward(dx))
        return dx
