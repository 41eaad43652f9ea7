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
    clip,
    concat,
    conv,
    deconv,
    dropout,
    flatten,
    gelu,
    hardsigmoid,
    hardswish,
    layernorm,
    layerscale,
    leakyrelu,
    linear,
    maxpool,
    mul,
    relu,
    relu6,
    scale,
    sigmoid,
    silu,
    tanh,
    upsample,
)
from hpctrain.model.kinds.base import Kind

#: Every layer kind, by the name a net file gives it.
KINDS: dict[str, Kind] = {module.KIND.name: module.KIND for module in (
    conv, linear, maxpool, avgpool, batchnorm, relu, leakyrelu, tanh, scale, dropout, flatten,
    add, concat, mul, sigmoid, silu, hardsigmoid, hardswish, relu6, clip, gelu, upsample,
    layernorm, deconv, layerscale)}



def compute_class(kind: str) -> str:
    """``(gemm)`` for a kind whose kernels are matrix products (the weighted kinds the
    planner splits: convolution, linear), ``(memory)`` for the rest, bound by memory traffic
    (element-wise, pooling, normalisation, the loss): what a kind's compute time scales like
    from one machine, or one timing rule, to another. ``kind`` may name a shape class
    (:func:`shape_class`)."""
    found = KINDS.get(kind_of(kind))
    return "(gemm)" if found is not None and found.grid_key else "(memory)"


def shape_class(kind: str, kernel: tuple[int, ...] = (), groups: int = 1) -> str:
    """The ``compute_scale`` key of work of ``kind`` with a window ``kernel`` (one extent per
    spatial axis) in ``groups`` groups: a convolution's shape class, the kind itself for the
    rest.

    A convolution is one im2col and one matrix product whatever its window, but how close a
    training step runs to its kernels timed alone differs with the window: a pointwise
    convolution (``conv 1x1``) reads each input once and keeps no columns, a factorised one
    (``conv 1xk``: one spatial extent of 1, Inception's 1×7 and 7×1) builds columns along one
    axis, a volume's (``conv 3-D``) builds columns many times its input. Fitted on 2-D square
    windows alone, one factor over-predicted Inception-v3 by 17–24 % and missed CosmoFlow by
    18–30 %; each class takes a factor of its own where the probes ran it, else the kind's.
    A grouped convolution (``conv grouped``, depthwise among them) is many small products, or
    none (a depthwise layer's taps are sums along the channels), far from the GEMM's pace
    whatever its window."""
    if kind != "conv" or not kernel:
        return kind
    if groups > 1:
        return "conv grouped"
    if all(extent == 1 for extent in kernel):
        return "conv 1x1"
    if len(kernel) == 3:
        return "conv 3-D"
    if 1 in kernel:
        return "conv 1xk"
    return kind


def kind_of(key: str) -> str:
    """The kind a ``compute_scale`` key (a kind or a shape class, :func:`shape_class`) is of."""
    return key.split(" ")[0]


BEYOND_CACHE = " beyond cache"
"""Appended to a kind (or class) in a profile's ``compute_scale``, it names the factors for
work that touches more than the profile's ``cache_bytes`` (:func:`beyond_cache`). Inside a
training step a layer finds what fits the cache where the layer before left it, and runs
several times faster than its kernels timed after an eviction; what does not fit comes from
memory either way. One factor per kind cannot hold both (fitted on small nets, it
under-predicted a 3-D net of large activations by 30 %), so the two are fitted apart, and so is
the size between them (:func:`hpctrain.plan.stepfit.fit_cache_bytes`)."""


def beyond_cache(touched: float, cache_bytes: int) -> bool:
    """Whether work touching ``touched`` bytes takes the factors beyond the cache
    (``cache_bytes`` 0: no work does)."""
    return bool(cache_bytes) and touched > cache_bytes


def scale_key(name: str, beyond_cache: bool) -> str:
    """The ``compute_scale`` key of a kind or class ``name`` for work within the cache, or
    beyond it (:data:`BEYOND_CACHE`)."""
    return name + BEYOND_CACHE if beyond_cache else name


def compute_factors(scales: dict[str, tuple[float, float]], kind: str,
                    beyond_cache: bool = False) -> tuple[float, float]:
    """The (forward, backward) factors a profile's ``compute_scale`` gives a layer of
    ``kind`` (or of a shape class, :func:`shape_class`): its own, else its kind's, else its
    class's (:func:`compute_class`), else none (1, 1). Work ``beyond_cache`` takes the factors
    fitted to such work (:data:`BEYOND_CACHE`) the same way, else none: a kernel timed after an
    eviction is what work larger than the cache sees."""
    for key in (kind, kind_of(kind), compute_class(kind)):
        found = scales.get(scale_key(key, beyond_cache))
        if found is not None:
            return found
    return (1.0, 1.0)


def compute_factors_for(scales: dict[str, tuple[float, float]], kind: str, touched: float,
                        cache_bytes: int) -> tuple[float, float]:
    """:func:`compute_factors` for work of ``kind`` touching ``touched`` bytes, on a profile
    whose work beyond ``cache_bytes`` takes factors of its own (:func:`beyond_cache`)."""
    return compute_factors(scales, kind, beyond_cache(touched, cache_bytes))
