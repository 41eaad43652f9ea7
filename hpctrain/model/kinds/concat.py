"""``concat in=a,b[,…]``: inputs joined along channels (Inception branches).

Each rank joins whole channel ranges, so the inputs must not be split by channels: on its first
input's grid, a height split stays (every input is moved to the same row blocks) and anything
else is replicated over Pr — a channel-split branch is all-gathered, which the model-parallel
convolutions reading the result would do anyway."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpctrain.cost.memory import Footprint
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import CHANNEL_AXIS, Layout, Split, largest_block
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape
from hpctrain.model.options import NetError


class ConcatKind(Kind):
    name = "concat"
    many_inputs = True

    def out_shape(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> Shape:
        for name, shape in zip(spec.inputs[1:], shapes[1:], strict=True):
            if len(shape) != len(shapes[0]) or shape[1:] != shapes[0][1:]:
                raise NetError(f"{where}: layer {spec.name} (concat) joins {spec.inputs[0]} of "
                               f"shape {shapes[0]} and {name} of shape {shape}; all but the "
                               f"channels must be equal")
        return (sum(shape[0] for shape in shapes), *shapes[0][1:])

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        """Every input on the first's spatial split, its channels whole: the channels are what
        the inputs are joined along."""
        first = fed[0].without((CHANNEL_AXIS,))
        return tuple(first.with_shape(x.shape) for x in fed), first.with_shape(out_shape)

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork:
        return LocalWork(self, largest_block(output), need_dx=need_dx)

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        half = work.x[1] // 2
        a = random((work.x[0], half, *work.x[2:]))
        b = random((work.x[0], work.x[1] - half, *work.x[2:]))
        return ((lambda: xp.concatenate([a, b], axis=1)),
                (lambda y: lambda: (xp.ascontiguousarray(y[:, :half]),
                                    xp.ascontiguousarray(y[:, half:]))))

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        return {}, fp.phases({**fp.loose_input, "output": fp.y},
                          {"output gradient": fp.y, "input gradients": fp.y})

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.concat import Concat

        return Concat(spec.name, ctx)


KIND = ConcatKind()
