"""Resizing of images and volumes (``upsample``) on the layout that feeds it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpctrain.kernels.resize import resampling_matrix, resize_backward, resize_forward
from hpctrain.layers.base import Layer
from hpctrain.layers.rows import HaloBlock

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
        resamplings = options.windows()
        self.block = HaloBlock(ctx.backend, ctx.grids, self.in_layout, resamplings, name)
        xp = ctx.backend.xp
        self.matrices = [xp.asarray(resampling_matrix(r, out, rows), dtype=ctx.backend.dtype)
                         for r, rows, out in zip(resamplings, self.block.rows, self.block.outs,
                                                 strict=True)]

    def forward(self, x: Any, step: int) -> Any:
        return resize_forward(self.backend.xp, self.block.extend(x), self.matrices)

    def backward(self, dy: Any) -> Any:
        return self.block.give_back(resize_backward(self.backend.xp, dy, self.matrices))
