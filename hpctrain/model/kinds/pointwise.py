"""What the pointwise kinds (relu, leakyrelu, tanh, scale, the gates and clipped units) share:
Y = f(X) entry by entry on the layout that feeds them, with a backward that reads Y, or X where
f is not one-to-one (silu, hardswish)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpctrain.cost.memory import Footprint
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape

Function = Callable[[Any, Any], Any]  # (xp, x) -> y
Derivative = Callable[[Any, Any, Any], Any]  # (xp, y, dy) -> dx


class PointwiseKind(Kind):
    """A kind computing Y = f(X) entry by entry. Subclasses give f and its derivative
    (:meth:`functions`, from :mod:`hpctrain.kernels.activations`) and say what the backward
    allocates beyond the gradients (:meth:`scratch`)."""

    keeps_output = True  # the derivative reads Y (scale's does not)
    reads_input = False  # the derivative reads X instead (keeps_output is then False)
    timed: Any = None  # options the kernels are timed with: the time does not depend on them

    def functions(self, options: Any) -> tuple[Function, Derivative]:
        raise NotImplementedError

    def scratch(self, fp: Footprint) -> dict[str, float]:
        """Bytes the backward allocates beside dY and dX (a mask, a product)."""
        return {}

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        # only timing runs the kernels: planning never loads them
        function, derivative = self.functions(self.timed)
        x = random(work.x)
        if self.reads_input:
            return lambda: function(xp, x), lambda y: lambda: derivative(xp, x, y)
        return lambda: function(xp, x), lambda y: lambda: derivative(xp, y, x)

    def keeps_input(self, spec: LayerSpec) -> bool:
        return self.reads_input

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        kept = {"output": fp.y} if self.keeps_output else {}
        return kept, fp.phases({**fp.loose_input, "output": fp.y},
                                        {"output gradient": fp.y, "input gradient": fp.x,
                                         **self.scratch(fp)})

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.elementwise import Pointwise  # needs MPI: only when run

        kept = "input" if self.reads_input else "output" if self.keeps_output else ""
        return Pointwise(spec.name, ctx, *self.functions(spec.options), kept)
