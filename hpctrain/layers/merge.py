"""Layers of several inputs: the sum (residual connections) and the channel concatenation
(Inception branches). Their inputs arrive on one layout; the network moves them there."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpctrain.layers.base import Layer
from hpctrain.layout import CHANNEL_AXIS, Layout

if TYPE_CHECKING:
    from hpctrain.kinds.base import BuildContext


class _Merge(Layer):
    """A layer of several inputs, on the layouts in ``inputs``."""

    mode = "follow"
    inputs: tuple[Layout, ...]

    @property
    def in_layouts(self) -> tuple[Layout, ...]:
        return self.inputs


class Add(_Merge):
    """Y = X₁ + X₂ + …; ΔXₖ = ΔY for every input (the same array, which nobody modifies)."""

    def __init__(self, name: str, ctx: BuildContext) -> None:
        self.name, self.backend, self.params = name, ctx.backend, []
        self.inputs, self.out_layout = ctx.inputs, ctx.output
        self.in_layout = ctx.inputs[0]

    def forward(self, xs: list[Any], step: int) -> Any:
        y = xs[0] + xs[1]
        for x in xs[2:]:
            y += x
        return y

    def backward(self, dy: Any) -> list[Any]:
        return [dy] * len(self.inputs)


class Concat(_Merge):
    """Y = [X₁, X₂, …] along channels; ΔXₖ is ΔY's channels of input k.

    The inputs share a layout that does not split channels (a height split, or replicated over
    Pr), so each rank joins whole channel ranges: X: (N/Pc, Cₖ, H[/Pr], W) → Y: (N/Pc, ΣCₖ, …).
    """

    def __init__(self, name: str, ctx: BuildContext) -> None:
        self.name, self.backend, self.params = name, ctx.backend, []
        self.inputs, self.out_layout = ctx.inputs, ctx.output
        self.in_layout = ctx.inputs[0]
        self.channels = [layout.shape[CHANNEL_AXIS] for layout in ctx.inputs]

    def forward(self, xs: list[Any], step: int) -> Any:
        return self.backend.xp.concatenate(xs, axis=CHANNEL_AXIS)

    def backward(self, dy: Any) -> list[Any]:
        xp, grads, start = self.backend.xp, [], 0
        for c in self.channels:
            grads.append(xp.ascontiguousarray(dy[:, start:start + c]))
            start += c
        return grads
