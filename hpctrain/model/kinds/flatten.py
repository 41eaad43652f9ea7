"""``flatten``: (C, H, W) -> (C·H·W,), C-major (a volume likewise); a channel split becomes a
feature split."""

from __future__ import annotations

import math

from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import CHANNEL_AXIS, HEIGHT_AXIS, Layout
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape


class FlattenKind(Kind):
    name = "flatten"
    pass_through = True  # the output is a view of the input

    def out_shape(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> Shape:
        return (math.prod(shapes[0]),)

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape, mode: str,
                grid: tuple[int, int]) -> tuple[tuple[Layout, ...], Layout]:
        """A height-split input cannot be flattened in place (its rows are not contiguous
        features): its rows are gathered first."""
        x = fed[0]
        if len(x.shape) < 4:  # (N, F): already flat
            return fed, Layout(out_shape, x.grid, x.split_axis, x.split_ranges)
        source = x.replicated() if x.split_axis == HEIGHT_AXIS else x
        per_channel = math.prod(x.shape[2:])
        ranges = None
        if source.split_axis == CHANNEL_AXIS:
            ranges = tuple((lo * per_channel, hi * per_channel)
                           for lo, hi in source.split_ranges)
        return (source,), Layout(out_shape, x.grid, CHANNEL_AXIS if ranges else None, ranges)

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork | None:
        return None  # a reshape

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.elementwise import Flatten  # needs MPI: only when run

        return Flatten(spec.name, ctx)


KIND = FlattenKind()
