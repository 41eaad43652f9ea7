"""``tanh``: the hyperbolic tangent, entry by entry."""

from __future__ import annotations

from typing import Any

from hpctrain.cost.memory import Footprint
from hpctrain.model.kinds.pointwise import Derivative, Function, PointwiseKind


class TanhKind(PointwiseKind):
    name = "tanh"

    def functions(self, options: Any) -> tuple[Function, Derivative]:
        from hpctrain.kernels.activations import tanh_backward, tanh_forward

        return tanh_forward, tanh_backward

    def scratch(self, fp: Footprint) -> dict[str, float]:
        return {"1 - y²": fp.x}


KIND = TanhKind()
