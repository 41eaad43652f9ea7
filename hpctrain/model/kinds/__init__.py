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



def compute_class(kind: str) -> str:
    """``(gemm)`` for a kind whose kernels are matrix products (the weighted kinds the
    planner splits: convolution, linear), ``(memory)`` for the rest, bound by memory traffic
    (element-wise, pooling, normalisation, the loss): what a kind's compute time scales like
    from one machine, or one timing rule, to another."""
    found = KINDS.get(kind)
    return "(gemm)" if found is not None and found.grid_key else "(memory)"


def compute_factors(scales: dict[str, tuple[float, float]], kind: str) -> tuple[float, float]:
    """The (forward, backward) factors a profile's ``compute_scale`` gives a layer of
    ``kind``: its own, else its class's (:func:`compute_class`), else none (1, 1)."""
    return scales.get(kind, scales.get(compute_class(kind), (1.0, 1.0)))
