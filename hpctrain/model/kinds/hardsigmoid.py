"""``hardsigmoid``: ReLU6(x + 3)/6, entry by entry (MobileNet v3's gate)."""

from __future__ import annotations

from typing import Any

from hpctrain.cost.memory import BOOL_BYTES, Footprint
from hpctrain.model.kinds.pointwise import Derivative, Function, PointwiseKind


class HardSigmoidKind(PointwiseKind):
    name = "hardsigmoid"

    def functions(self, options: Any) -> tuple[Function, Derivative]:
        from hpctrain.kernels.activations import hardsigmoid_backward, hardsigmoid_forward

        return hardsigmoid_forward, hardsigmoid_backward

    def scratch(self, fp: Footprint) -> dict[str, float]:
        return {"dY/6": fp.x, "inside mask": fp.x // fp.itemsize * BOOL_BYTES}


KIND = HardSigmoidKind()
