"""``maxpool kernel=K [stride=K] [pad=0]``: max-pooling (``K``, ``HxW`` or ``DxHxW``); padding
never wins."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from hpctrain.cost.memory import BOOL_BYTES, Footprint, larger
from hpctrain.kernels.sliding import position_dtype
from hpctrain.model.kinds.base import LayerSpec, Shape
from hpctrain.model.kinds.window import PoolKind, padded_bytes, padded_copy_bytes
from hpctrain.model.options import NetError

INDEX_BYTES = 8  # intp


class MaxPoolKind(PoolKind):
    name = "maxpool"

    def pool_kernels(self) -> tuple[Callable, Callable]:
        from hpctrain.kernels.pool import maxpool_backward, maxpool_forward

        return maxpool_forward, maxpool_backward

    def resolve(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> LayerSpec:
        spec = super().resolve(spec, shapes, where)
        o = spec.options
        for pads, kernel in zip(o.pad, o.kernel, strict=True):
            if max(pads) > kernel // 2:
                raise NetError(f"{where}: maxpool pad={max(pads)} must be at most kernel // 2 "
                               f"= {kernel // 2}, or some windows would hold only padding")
        return spec

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """The position of each window's maximum, kept (one byte each); the padded input and
        the comparison masks while they are found; the backward's flat indices (int64) and the
        float64 sums it scatters into, before their cast."""
        work, b = fp.work, fp.itemsize
        n, c = work.x[:2]
        outputs = n * c * math.prod(work.out_sizes())
        y = outputs * b
        position = np.dtype(position_dtype(work.kernel)).itemsize
        padded_entries = padded_bytes(work, b) // b
        forward = {**fp.loose_input, "padded input": padded_copy_bytes(fp), "output": y,
                   "positions and masks": outputs * (2 * position + BOOL_BYTES)}
        backward = {"output gradient": y, "flat indices": outputs * INDEX_BYTES,
                    "float64 sums": padded_entries * 8,
                    "padded input gradient": padded_entries * b}
        return {"maxima positions": outputs * position}, larger(forward, backward)


KIND = MaxPoolKind()
