"""Inputs joined along channels (Inception branches), on a layout that does not split them."""

from __future__ import annotations

from typing import Any

from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import CHANNEL_AXIS, Layout


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
