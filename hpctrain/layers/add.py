"""The sum of several inputs of one shape (residual connections), on its first input's layout."""

from __future__ import annotations

from typing import Any

from hpctrain.layers.base import Join


class Add(Join):
    """Y = X₁ + X₂ + …; ΔXₖ = ΔY for every input (the same array, which nobody modifies).

    The inputs arrive on one layout (the first's): X, Y: any block, the same on every input.
    """

    def forward(self, xs: list[Any], step: int) -> Any:
        y = xs[0] + xs[1]
        for x in xs[2:]:
            y += x
        return y

    def backward(self, dy: Any) -> list[Any]:
        return [dy] * len(self.inputs)
