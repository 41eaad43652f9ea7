"""``clip min=A max=B``: x cut to [A, B], entry by entry (PyTorch's hardtanh, ONNX's Clip);
``relu6`` (:mod:`hpctrain.model.kinds.relu6`) is ``clip min=0 max=6``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from hpctrain.cost.memory import BOOL_BYTES, Footprint
from hpctrain.model.kinds.pointwise import Derivative, Function, PointwiseKind
from hpctrain.model.options import Key, NetError, number, option_text


@dataclass(frozen=True)
class ClipOptions:
    min: float
    max: float


class ClipKind(PointwiseKind):
    name = "clip"
    keys = {"min": Key(number), "max": Key(number)}
    options = ClipOptions
    timed = ClipOptions(0.0, 6.0)

    def parse(self, texts: dict[str, str], where: str) -> Any:
        options = super().parse(texts, where)
        if not options.min < options.max:
            raise NetError(f"{where}: clip min={option_text(options.min)} "
                           f"max={option_text(options.max)}: min must be below max")
        return options

    def functions(self, options: ClipOptions) -> tuple[Function, Derivative]:
        from hpctrain.kernels.activations import clip_backward, clip_forward

        return (partial(clip_forward, low=options.min, high=options.max),
                partial(clip_backward, low=options.min, high=options.max))

    def scratch(self, fp: Footprint) -> dict[str, float]:
        return {"inside mask": 3 * fp.x // fp.itemsize * BOOL_BYTES}


KIND = ClipKind()
