"""``add in=a,b[,…]``: the sum of inputs of one shape (residual connections).

It runs on its first input's layout; every other input is moved there (an identity when the
producers share the layout, as the two paths of a residual block usually do). Its layer is
:class:`hpctrain.layers.add.Add`; this is the smallest kind of several inputs."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hpctrain.cost.memory import Footprint
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import Layout, Split
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape
from hpctrain.model.options import NetError


class AddKind(Kind):
    name = "add"
    many_inputs = True

    def out_shape(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> Shape:
        for name, shape in zip(spec.inputs[1:], shapes[1:], strict=True):
            if shape != shapes[0]:
                raise NetError(f"{where}: layer {spec.name} (add) adds {spec.inputs[0]} of shape "
                               f"{shapes[0]} and {name} of shape {shape}; the shapes must be "
                               f"equal")
        return shapes[0]

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        return (fed[0],) * len(fed), fed[0]

    def flops(self, work: LocalWork) -> tuple[float, float]:
        return float(math.prod(work.x)), 0.0

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        a, b = random(work.x), random(work.x)
        return (lambda: a + b), (lambda _: lambda: None)

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        return {}, {**fp.loose_input, "output": fp.y}

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.add import Add

        return Add(spec.name, ctx)


KIND = AddKind()
