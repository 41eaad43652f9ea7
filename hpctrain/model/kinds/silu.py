"""``silu``: x·σ(x) (SiLU, or swish), entry by entry, as EfficientNet uses it."""

from __future__ import annotations

from typing import Any

from hpctrain.cost.memory import Footprint
from hpctrain.model.kinds.pointwise import Derivative, Function, PointwiseKind


class SiluKind(PointwiseKind):
    name = "silu"
    keeps_output = False
    reads_input = True  # x·σ(x) is not one-to-one: the derivative needs x

    def functions(self, options: Any) -> tuple[Function, Derivative]:
        from hpctrain.kernels.activations import silu_backward, silu_forward

        return silu_forward, silu_backward

    def scratch(self, fp: Footprint) -> dict[str, float]:
        return {"σ(x) and its factors": 2 * fp.x}


KIND = SiluKind()
