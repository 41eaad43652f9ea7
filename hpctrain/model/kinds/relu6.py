"""``relu6``: min(max(x, 0), 6), entry by entry (MobileNet v2's activation): a
:mod:`clip <hpctrain.model.kinds.clip>` with its bounds fixed."""

from __future__ import annotations

from typing import Any

from hpctrain.model.kinds.clip import ClipKind, ClipOptions
from hpctrain.model.kinds.pointwise import Derivative, Function

RELU6 = ClipOptions(0.0, 6.0)


class Relu6Kind(ClipKind):
    name = "relu6"
    keys = {}
    options = type(None)

    def parse(self, texts: dict[str, str], where: str) -> Any:
        return super(ClipKind, self).parse(texts, where)

    def functions(self, options: Any) -> tuple[Function, Derivative]:
        return super().functions(RELU6)


KIND = Relu6Kind()
