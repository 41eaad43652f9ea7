"""The product of two inputs entry by entry, the second of the first's shape or one value per
channel (a squeeze-excitation gate)."""

from __future__ import annotations

from typing import Any

from hpctrain.kernels.activations import gate_backward
from hpctrain.layers.base import Join


class Mul(Join):
    """Y = A ⊙ G; ΔA = ΔY ⊙ G and ΔG = ΔY ⊙ A, summed over the spatial axes where G is one value
    per channel (broadcast over them).

    A, Y: any block; G: the same block, or its samples' and channels' gate, whole along the
    spatial axes on every rank of a spatial split, where ΔG is a partial sum over those ranks
    that the move which replicated G adds up.
    """

    def forward(self, xs: list[Any], step: int) -> Any:
        a, g = xs
        self.kept = (a, g) if self.training else None
        return a * g

    def backward(self, dy: Any) -> list[Any]:
        a, g = self.kept
        return list(gate_backward(self.backend.xp, dy, a, g))
