"""``sigmoid``: 1/(1 + e^−x), entry by entry (a squeeze-excitation gate)."""

from __future__ import annotations

from typing import Any

from hpctrain.cost.memory import Footprint
from hpctrain.model.kinds.pointwise import Derivative, Function, PointwiseKind


class SigmoidKind(PointwiseKind):
    name = "sigmoid"

    def functions(self, options: Any) -> tuple[Function, Derivative]:
        from hpctrain.kernels.activations import sigmoid_backward, sigmoid_forward

        return sigmoid_forward, sigmoid_backward

    def scratch(self, fp: Footprint) -> dict[str, float]:
        return {"dY·Y": fp.x}


KIND = SigmoidKind()
