"""``hardswish``: x·ReLU6(x + 3)/6, entry by entry (MobileNet v3's activation)."""

from __future__ import annotations

from typing import Any

from hpctrain.cost.memory import Footprint
from hpctrain.model.kinds.pointwise import Derivative, Function, PointwiseKind


class HardSwishKind(PointwiseKind):
    name = "hardswish"
    keeps_output = False
    reads_input = True  # not one-to-one below 0: the derivative needs x

    def functions(self, options: Any) -> tuple[Function, Derivative]:
        from hpctrain.kernels.activations import hardswish_backward, hardswish_forward

        return hardswish_forward, hardswish_backward

    def scratch(self, fp: Footprint) -> dict[str, float]:
        return {"the factor, twice": 2 * fp.x}


KIND = HardSwishKind()
