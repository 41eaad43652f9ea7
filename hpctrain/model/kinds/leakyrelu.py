"""``leakyrelu [slope=0.01]``: x where x > 0, slope·x elsewhere (0 ≤ slope < 1), as Keras's and
PyTorch's LeakyReLU."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from hpctrain.cost.memory import BOOL_BYTES, Footprint
from hpctrain.model.kinds.pointwise import Derivative, Function, PointwiseKind
from hpctrain.model.options import Key, fraction


@dataclass(frozen=True)
class LeakyReluOptions:
    slope: float


class LeakyReluKind(PointwiseKind):
    name = "leakyrelu"
    keys = {"slope": Key(fraction(0.0, 1.0), "0.01")}
    options = LeakyReluOptions
    timed = LeakyReluOptions(0.01)

    def functions(self, options: LeakyReluOptions) -> tuple[Function, Derivative]:
        from hpctrain.kernels.activations import leaky_relu_backward, leaky_relu_forward

        return (partial(leaky_relu_forward, slope=options.slope),
                partial(leaky_relu_backward, slope=options.slope))

    def scratch(self, fp: Footprint) -> dict[str, float]:
        # the factor (1 or the slope) is made where dX is: only the mask is beside it
        return {"sign mask": fp.x // fp.itemsize * BOOL_BYTES}


KIND = LeakyReluKind()
