"""``gelu``: x·Φ(x) = x·(1 + erf(x/√2))/2, entry by entry (PyTorch's exact GELU, ConvNeXt's
activation)."""

from __future__ import annotations

from typing import Any

from hpctrain.cost.memory import Footprint
from hpctrain.model.kinds.pointwise import Derivative, Function, PointwiseKind


class GeluKind(PointwiseKind):
    name = "gelu"
    keeps_output = False
    reads_input = True  # not one-to-one below 0: the derivative needs x

    def functions(self, options: Any) -> tuple[Function, Derivative]:
        from hpctrain.kernels.activations import gelu_backward, gelu_forward

        return gelu_forward, gelu_backward

    def scratch(self, fp: Footprint) -> dict[str, float]:
        return {"Φ(x) and φ(x)": 2 * fp.x}


KIND = GeluKind()
