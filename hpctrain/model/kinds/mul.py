"""``mul in=a,g``: the product of ``a`` by ``g`` entry by entry, ``g`` of ``a``'s shape or one
value per channel, (C, 1, …, 1), broadcast over the spatial axes: the gate of a
squeeze-excitation block (MobileNet v3, EfficientNet, RegNetY), x × σ(W₂·δ(W₁·pool(x))).

It runs on ``a``'s layout. A per-channel ``g`` is moved to ``a``'s layout with the spatial
splits made replicas: each rank of a domain split reads the whole gate of its samples and
channels, and the gate's gradient, a sum over the positions, is a partial sum on each of them
that the move's adjoint adds up (:mod:`hpctrain.layout.moves`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hpctrain.cost.memory import Footprint
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import HEIGHT_AXIS, Layout, Split, largest_block
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape
from hpctrain.model.options import NetError


def per_channel(shape: Shape, of: Shape) -> bool:
    """Whether ``shape`` is one value per channel of a tensor of per-sample shape ``of``:
    (C, 1, …, 1) for an image or volume of C channels."""
    return len(of) > 1 and shape == (of[0], *(1,) * (len(of) - 1))


class MulKind(Kind):
    name = "mul"
    many_inputs = True

    def out_shape(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> Shape:
        if len(shapes) != 2:
            raise NetError(f"{where}: layer {spec.name} (mul) multiplies two inputs, not "
                           f"{len(shapes)}; give in=a,gate")
        a, g = shapes
        if g != a and not per_channel(g, a):
            raise NetError(f"{where}: layer {spec.name} (mul) multiplies {spec.inputs[0]} of "
                           f"shape {a} by {spec.inputs[1]} of shape {g}; the second must be of "
                           f"the first's shape or one value per channel, "
                           f"{(a[0], *(1,) * (len(a) - 1))}")
        return a

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        """Both on the first input's layout; a per-channel gate with its spatial splits made
        replicas."""
        a, g = fed
        if g.shape == a.shape:
            return (a, a), a
        gate = a.without(range(HEIGHT_AXIS, len(a.shape))).with_shape(g.shape)
        return (a, gate), a

    def keeps_input(self, spec: LayerSpec) -> bool:
        return True  # each input's gradient is the output's times the other input

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork:
        return LocalWork(self, largest_block(inputs[0]), need_dx=need_dx)

    def flops(self, work: LocalWork) -> tuple[float, float]:
        entries = float(math.prod(work.x))
        return entries, 3 * entries  # the product; two products and the gate's sum

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        from hpctrain.kernels.activations import gate_backward

        a = random(work.x)
        g = random((*work.x[:2], *(1,) * (len(work.x) - 2)))
        return (lambda: a * g), (lambda y: lambda: gate_backward(xp, y, a, g))

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        return {}, fp.phases({**fp.loose_input, "output": fp.y},
                             {"output gradient": fp.y, "input gradients": 2 * fp.x})

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.mul import Mul  # needs MPI: only when run

        return Mul(spec.name, ctx)


KIND = MulKind()
