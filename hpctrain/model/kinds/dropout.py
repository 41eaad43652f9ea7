"""``dropout [p=0.5]``: inverted dropout whose mask depends on (seed, layer, step) only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpctrain.cost.memory import RANDOM_BYTES, Footprint
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape
from hpctrain.model.options import Key, fraction


@dataclass(frozen=True)
class DropoutOptions:
    p: float


class DropoutKind(Kind):
    name = "dropout"
    keys = {"p": Key(fraction(0.0, 1.0), "0.5")}
    options = DropoutOptions
    computes_in_evaluation = False  # off: the input passes on
    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        """The mask is drawn by the counter RNG in every forward."""
        # only timing runs the kernels: planning never loads them
        from hpctrain.kernels.activations import dropout_mask

        x = random(work.x)
        box = tuple((0, n) for n in work.x)
        mask = dropout_mask(xp, 1, 0.5, work.x, box, dtype)
        return (lambda: x * dropout_mask(xp, 1, 0.5, work.x, box, dtype),
                lambda _: lambda: x * mask)

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        if spec.options.p == 0:
            return {}, {}
        entries = fp.x // fp.itemsize
        forward = {**fp.loose_input, "random numbers": entries * RANDOM_BYTES, "output": fp.y}
        return {"mask": fp.x}, fp.phases(forward, {"output gradient": fp.y,
                                                   "input gradient": fp.x})

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.elementwise import Dropout  # needs MPI: only when run

        return Dropout(spec.name, spec.options.p, ctx)


KIND = DropoutKind()
