"""``flatten``: (C, H, W) -> (C·H·W,), C-major (a volume likewise); a channel split becomes a
feature split."""

from __future__ import annotations

import math

from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import CHANNEL_AXIS, Layout, Split
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape


class FlattenKind(Kind):
    name = "flatten"
    pass_through = True  # the output is a view of the input

    def out_shape(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> Shape:
        return (math.prod(shapes[0]),)

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        """An input split along a spatial axis cannot be flattened in place (its rows are not
        contiguous features): those axes are gathered first. A channel split stays, as
        features in blocks of whole channels."""
        x = fed[0]
        if len(x.shape) < 3:  # (N, F): already flat
            return fed, x.with_shape(out_shape)
        source = x.without(a for a in x.cut_axes if a != CHANNEL_AXIS)
        per_channel = math.prod(x.shape[2:])
        ranges = None
        if CHANNEL_AXIS in source.cut_axes:
            ranges = tuple((lo * per_channel, hi * per_channel)
                           for lo, hi in source.split_ranges)
        axes = tuple(CHANNEL_AXIS if a == CHANNEL_AXIS else a for a in source.axes)
        return (source,), Layout(out_shape, mesh=source.mesh, axes=axes, split_ranges=ranges,
                                 first=source.first, procs=source.procs)

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork | None:
        return None  # a reshape

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.elementwise import Flatten  # needs MPI: only when run

        return Flatten(spec.name, ctx)


KIND = FlattenKind()
