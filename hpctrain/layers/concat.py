"""Inputs joined along channels (Inception branches), on a layout that does not split them."""

from __future__ import annotations

from typing import Any

from hpctrain.layers.base import BuildContext, Join
from hpctrain.layout.layout import CHANNEL_AXIS


class Concat(Join):
    """Y = [X₁, X₂, …] along channels; ΔXₖ is ΔY's channels of input k.

    The inputs share a layout that does not split channels (a height split, or replicated over
    Pr), so each rank joins whole channel ranges: X: (N/Pc, Cₖ, H[/Pr], W) → Y: (N/Pc, ΣCₖ, …).
    """

    def __init__(self, name: str, ctx: BuildContext) -> None:
        super().__init__(name, ctx)
        self.channels = [layout.shape[CHANNEL_AXIS] for layout in ctx.inputs]

    def forward(self, xs: list[Any], step: int) -> Any:
        return self.backend.xp.concatenate(xs, axis=CHANNEL_AXIS)

    def backward(self, dy: Any) -> list[Any]:
        xp, grads, start = self.backend.xp, [], 0
        for c in self.channels:
            grads.append(xp.ascontiguousarray(dy[:, start:start + c]))
            start += c
        return grads
