"""The layer kinds, one module each, and their registry.

Adding a kind: write ``hpctrain/model/kinds/NAME.py`` defining a
:class:`~hpctrain.model.kinds.base.Kind` subclass and ``KIND = NameKind()`` (read
:mod:`hpctrain.model.kinds.tanh` for the smallest, and :mod:`hpctrain.model.kinds.base` for the
contract), then add the module to :data:`KINDS` below.
"""

from __future__ import annotations

from hpctrain.model.kinds import (
    add,
    avgpool,
    batchnorm,
    concat,
    conv,
    dropout,
    flatten,
    leakyrelu,
    linear,
    maxpool,
    relu,
    scale,
    tanh,
)
from hpctrain.model.kinds.base import Kind

#: Every layer kind, by the name a net file gives it.
KINDS: dict[str, Kind] = {module.KIND.name: module.KIND for module in (
    conv, linear, maxpool, avgpool, batchnorm, relu, leakyrelu, tanh, scale, dropout, flatten,
    add, concat)}

