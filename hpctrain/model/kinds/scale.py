"""``scale factor=F``: F·x, entry by entry (CosmoFlow's output scaling, tanh × 1.2)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from hpctrain.model.kinds.pointwise import Derivative, Function, PointwiseKind
from hpctrain.model.options import Key, number


@dataclass(frozen=True)
class ScaleOptions:
    factor: float


class ScaleKind(PointwiseKind):
    name = "scale"
    keys = {"factor": Key(number)}
    options = ScaleOptions
    keeps_output = False  # F·dY needs no Y
    timed = ScaleOptions(1.0)

    def functions(self, options: ScaleOptions) -> tuple[Function, Derivative]:
        from hpctrain.kernels.activations import scale_backward, scale_forward

        return (partial(scale_forward, factor=options.factor),
                partial(scale_backward, factor=options.factor))


KIND = ScaleKind()
