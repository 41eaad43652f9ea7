"""``avgpool kernel=K [stride=K] [pad=0] [count_pad=1]``: average pooling (``K``, ``HxW`` or
``DxHxW``; zero padding counts in the divisor, as PyTorch's default, or with ``count_pad=0`` only
the input's own entries do, as ``count_include_pad=False``), or ``avgpool kernel=global``: the
mean of each channel over the whole image or volume, (C, H, W) -> (C, 1, 1) or (C, D, H, W) ->
(C, 1, 1, 1)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from hpctrain.cost.collectives import allreduce_time
from hpctrain.cost.machine import Machine
from hpctrain.cost.memory import Footprint
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import Layout, Split, largest_block
from hpctrain.model.kinds.base import LayerSpec, Shape
from hpctrain.model.kinds.window import (
    POOL_KEYS,
    PoolKind,
    PoolOptions,
    check_windows_hold_input,
    padded_bytes,
)
from hpctrain.model.options import Key, NetError, flag, sizes

GLOBAL = "global"


@dataclass(frozen=True)
class AvgPoolOptions(PoolOptions):
    count_pad: bool = True  # the padding counts in the divisor (count_include_pad)


def _kernel(key: str, text: str, where: str) -> tuple[int, ...] | None:
    """``global`` (None) or a window size."""
    return None if text == GLOBAL else sizes(1)(key, text, where)


class AvgPoolKind(PoolKind):
    name = "avgpool"
    keys = {**POOL_KEYS, "kernel": Key(_kernel), "count_pad": Key(flag, "1")}
    options = AvgPoolOptions

    def pool_kernels(self, options: AvgPoolOptions | None = None) -> tuple[Callable, Callable]:
        from hpctrain.kernels.pool import avgpool_backward, avgpool_forward

        if options is None or options.count_pad:
            return avgpool_forward, avgpool_backward
        return partial(avgpool_forward, count_pad=False), avgpool_backward

    def parse(self, texts: dict[str, str], where: str) -> AvgPoolOptions:
        o = super().parse(texts, where)
        if o.kernel is None and ("stride" in texts or "pad" in texts or "count_pad" in texts):
            raise NetError(f"{where}: avgpool kernel=global pools the whole image and takes "
                           f"no stride, pad or count_pad")
        return o

    def resolve(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> LayerSpec:
        spec = super().resolve(spec, shapes, where)
        o = spec.options
        if o.kernel is not None and not o.count_pad and len(shapes[0]) == len(o.kernel) + 1:
            check_windows_hold_input(spec, shapes[0], where)  # else a divisor of 0
        return spec

    def option_texts(self, options: AvgPoolOptions) -> dict[str, str]:
        if options.kernel is None:
            return {"kernel": GLOBAL}
        return super().option_texts(options)

    def out_shape(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> Shape:
        if spec.options.kernel is not None:
            return super().out_shape(spec, shapes, where)
        if len(shapes[0]) < 3:
            raise NetError(f"{where}: layer {spec.name} (avgpool) needs an image or volume "
                           f"input, got shape {shapes[0]}")
        return (shapes[0][0],) + (1,) * (len(shapes[0]) - 1)

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        """Global pooling of a spatial split: the partial sums are all-reduced over the ranks
        that split the spatial axes, so the output is replicated over them."""
        x = fed[0]
        if spec.options.kernel is None:
            return fed, x.without(x.spatial_cuts).with_shape(out_shape)
        return super().layouts(spec, fed, out_shape, split)

    def check(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> None:
        if spec.options.kernel is not None:
            super().check(spec, inputs, output)

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork:
        if spec.options.kernel is None:
            return LocalWork(self, largest_block(inputs[0]), need_dx=need_dx)
        return super().work(spec, inputs, output, need_dx)

    def flops(self, work: LocalWork) -> tuple[float, float]:
        if not work.kernel:  # global
            return float(math.prod(work.x)), float(math.prod(work.x))
        return super().flops(work)

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        if work.kernel:
            return super().kernels(xp, work, dtype, random)
        x = random(work.x)
        spatial = tuple(range(2, len(work.x)))
        dy = xp.ones((*work.x[:2], *(1 for _ in spatial)), dtype=dtype)
        return (lambda: x.sum(axis=spatial, keepdims=True),
                lambda _: lambda: xp.broadcast_to(dy, work.x).copy())

    def comm_time(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                  machine: Machine, itemsize: int, sums: float | None = None
                  ) -> tuple[float, float]:
        x = inputs[0]
        if spec.options.kernel is not None:
            return super().comm_time(spec, inputs, output, machine, itemsize, sums)
        spatial = x.spatial_cuts
        if not spatial:
            return 0.0, 0.0
        n, c = largest_block(x)[:2]
        t = allreduce_time(machine, x.group(spatial), n * c * itemsize)
        return t, t

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """Nothing kept; a padded copy of the input (and of its gradient) for a moment."""
        if spec.options.kernel is None:
            return {}, fp.phases({**fp.loose_input, "output": fp.y},
                              {"output gradient": fp.y, "input gradient": fp.x})
        padded = padded_bytes(fp.work, fp.itemsize)
        return {}, fp.phases({**fp.loose_input, "padded input": padded, "output": fp.y},
                          {"output gradient": fp.y, "padded input gradient": padded})

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        if spec.options.kernel is None:
            from hpctrain.layers.pool import GlobalAvgPool  # needs MPI: only when run

            return GlobalAvgPool(spec.name, ctx)
        return super().build(spec, ctx)


KIND = AvgPoolKind()
