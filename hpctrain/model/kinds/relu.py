"""``relu``: max(x, 0), on the layout that feeds it."""

from __future__ import annotations

from typing import Any

from hpctrain.cost.memory import BOOL_BYTES, Footprint
from hpctrain.model.kinds.pointwise import Derivative, Function, PointwiseKind


class ReluKind(PointwiseKind):
    name = "relu"

    def functions(self, options: Any) -> tuple[Function, Derivative]:
        from hpctrain.kernels.activations import relu_backward, relu_forward

        return relu_forward, relu_backward

    def scratch(self, fp: Footprint) -> dict[str, float]:
        return {"sign mask": fp.x // fp.itemsize * BOOL_BYTES}


KIND = ReluKind()
