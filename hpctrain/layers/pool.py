"""Pooling on whatever layout feeds it: channel-split, replicated, or height-split (domain)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpctrain.comm.collectives import allreduce_sum
from hpctrain.kernels.products import widen
from hpctrain.layers.base import Layer
from hpctrain.layers.rows import WindowRows

if TYPE_CHECKING:
    from hpctrain.layers.base import BuildContext


class Pool(Layer):
    """Y = a reduction (max, mean) over each window; it acts per channel, so any channel split
    passes through.

    A height-split input (after a domain-parallel layer) is pooled domain-parallel: X: (N/Pc, C,
    H/Pr + halo, W) -> Y: (N/Pc, C, Ho/Pr, Wo), with the same halo exchange as convolution.
    ``forward_kernel(xp, x, kernel, stride, pads) -> (y, cache)`` and ``backward_kernel(xp, dy,
    kernel, stride, cache) -> dx`` are the local kernels.
    """

    mode = "follow"

    def __init__(self, name: str, options: Any, ctx: BuildContext,
                 forward_kernel: Callable, backward_kernel: Callable) -> None:
        self.name, self.backend, self.params = name, ctx.backend, []
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        self.kernel, self.stride = options.kernel, options.stride
        self.forward_kernel, self.backward_kernel = forward_kernel, backward_kernel
        self.rows = WindowRows.of(ctx.backend, ctx.grids, self.in_layout, options, name)

    def _forward_rows(self, x: Any, pads: tuple[tuple[int, int], ...]) -> tuple[Any, Any]:
        return self.forward_kernel(self.backend.xp, x, self.kernel, self.stride, pads)

    def _backward_rows(self, dy: Any, cache: Any) -> Any:
        return self.backward_kernel(self.backend.xp, dy, self.kernel, self.stride, cache)

    def forward(self, x: Any, step: int) -> Any:
        y, bands = self.rows.forward(x, self._forward_rows)
        self.bands = bands if self.training else None  # evaluation keeps nothing for a backward
        return y

    def backward(self, dy: Any) -> Any:
        return self.rows.backward(dy, self.bands, self._backward_rows, self.need_dx)


class GlobalAvgPool(Layer):
    """Y[n, c] = mean of X[n, c] over the whole image: (N, C, H, W) -> (N, C, 1, 1), and over
    the whole volume likewise.

    Under a split of the spatial axes each rank sums its block and the partial sums are
    all-reduced over the ranks that split them (the Pr ranks of a batch group under a height
    split), so Y is replicated over them; the backward all-reduces the gradient's partial sums
    the same way (the adjoint) and spreads it evenly over the block. Otherwise it is local, and
    a channel split passes through.
    """

    mode = "follow"

    def __init__(self, name: str, ctx: BuildContext) -> None:
        self.name, self.backend, self.params = name, ctx.backend, []
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        self.scale = 1.0 / math.prod(self.in_layout.shape[2:])  # every rank: the whole image
        x = self.in_layout
        self.comm = ctx.grids.over(x, x.digits_of(x.spatial_cuts)) if x.spatial_cuts else None

    def forward(self, x: Any, step: int) -> Any:
        self.x_shape = x.shape
        y = (widen(x).sum(axis=tuple(range(2, x.ndim)), keepdims=True) * self.scale).astype(
            x.dtype, copy=False)  # a 16-bit image summed in float32
        return y if self.comm is None else allreduce_sum(self.backend, self.comm, y)

    def backward(self, dy: Any) -> Any:
        if self.comm is not None:
            dy = allreduce_sum(self.backend, self.comm, dy.copy())  # the caller's dy stays
        return self.backend.xp.broadcast_to(dy * dy.dtype.type(self.scale),
                                            self.x_shape).copy()
