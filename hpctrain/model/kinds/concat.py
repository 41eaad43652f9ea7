"""``concat in=a,b[,…]``: inputs joined along channels (Inception branches).

Each rank joins whole channel ranges, so the inputs must not be split by channels: on its first
input's grid, a height split stays (every input is moved to the same row blocks) and anything
else is replicated over Pr — a channel-split branch is all-gathered, which the model-parallel
convolutions reading the result would do anyway."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import Layer
from hpctrain.layout.layout import CHANNEL_AXIS, HEIGHT_AXIS, Layout, largest_block
from hpctrain.model.kinds.base import BuildContext, Footprint, Kind, LayerSpec, Shape, larger
from hpctrain.model.options import NetError


class Concat(Layer):
    """Y = [X₁, X₂, …] along channels; ΔXₖ is ΔY's channels of input k.

    The inputs share a layout that does not split channels (a height split, or replicated over
    Pr), so each rank joins whole channel ranges: X: (N/Pc, Cₖ, H[/Pr], W) → Y: (N/Pc, ΣCₖ, …).
    """

    mode = "follow"

    def __init__(self, name: str, ctx: BuildContext) -> None:
        self.name, self.backend, self.params = name, ctx.backend, []
        self.inputs, self.out_layout = ctx.inputs, ctx.output
        self.in_layout = ctx.inputs[0]
        self.channels = [layout.shape[CHANNEL_AXIS] for layout in ctx.inputs]

    @property
    def in_layouts(self) -> tuple[Layout, ...]:
        return self.inputs

    def forward(self, xs: list[Any], step: int) -> Any:
        return self.backend.xp.concatenate(xs, axis=CHANNEL_AXIS)

    def backward(self, dy: Any) -> list[Any]:
        xp, grads, start = self.backend.xp, [], 0
        for c in self.channels:
            grads.append(xp.ascontiguousarray(dy[:, start:start + c]))
            start += c
        return grads


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

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape, mode: str,
                grid: tuple[int, int]) -> tuple[tuple[Layout, ...], Layout]:
        first = fed[0]
        split = HEIGHT_AXIS if first.split_axis == HEIGHT_AXIS else None
        inputs = tuple(Layout(x.shape, first.grid, split) for x in fed)
        return inputs, Layout(out_shape, first.grid, split)

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork:
        return LocalWork(self.name, largest_block(output), need_dx=need_dx)

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
        return {}, larger({**fp.loose_input, "output": fp.y},
                          {"output gradient": fp.y, "input gradients": fp.y})

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        return Concat(spec.name, ctx)


KIND = ConcatKind()
