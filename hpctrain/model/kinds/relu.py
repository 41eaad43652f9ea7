"""``relu``: max(x, 0), on the layout that feeds it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpctrain.cost.memory import BOOL_BYTES, Footprint, larger
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape


class ReluKind(Kind):
    name = "relu"
    keeps_output = True  # the backward reads the sign of the output

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        # only timing runs the kernels: planning never loads them
        from hpctrain.kernels.activations import relu_backward, relu_forward

        x = random(work.x)
        return lambda: relu_forward(xp, x), lambda y: lambda: relu_backward(xp, y, x)

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        return {"output": fp.y}, larger({**fp.loose_input, "output": fp.y},
                                        {"output gradient": fp.y, "input gradient": fp.x,
                                         "sign mask": fp.x // fp.itemsize * BOOL_BYTES})

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.elementwise import ReLU  # needs MPI: only when run

        return ReLU(spec.name, ctx)


KIND = ReluKind()
