"""``maxpool kernel=K [stride=K] [pad=0] [ceil=0]``: max-pooling (``K``, ``HxW`` or ``DxHxW``);
padding never wins. ``ceil=1`` rounds the number of windows up, as PyTorch's ``ceil_mode=True``
(GoogLeNet's pools): a last window that would start past the input (or its padding before) is
dropped."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hpctrain.cost.memory import BOOL_BYTES, Footprint
from hpctrain.kernels.sliding import position_dtype
from hpctrain.model.kinds.base import LayerSpec, Shape
from hpctrain.model.kinds.window import (
    POOL_KEYS,
    PoolKind,
    PoolOptions,
    check_windows_hold_input,
    padded_bytes,
    padded_copy_bytes,
    windows_of,
)
from hpctrain.model.options import Key, flag, option_text

INDEX_BYTES = 8  # intp


@dataclass(frozen=True)
class MaxPoolOptions(PoolOptions):
    ceil: bool = False  # the windows counted rounding up (ceil_mode)
    # per axis, the padding after that ceil adds for the input the net was made for, counted
    # in ``pad`` (which the kernels and splits read) and taken back out when made again
    ceil_pad: tuple[int, ...] = ()


def ceil_windows(n: int, kernel: int, stride: int, before: int, after: int) -> int:
    """Windows along an axis of ``n`` entries rounding up, as PyTorch's ``ceil_mode``: the last
    starts inside the input or its padding before.

    >>> ceil_windows(112, 3, 2, 0, 0), ceil_windows(6, 2, 2, 0, 0), ceil_windows(5, 3, 2, 1, 1)
    (56, 3, 3)
    """
    count = -(-(n + before + after - kernel) // stride) + 1
    return count - 1 if (count - 1) * stride >= n + before else count


def ceil_padding(n: int, kernel: int, stride: int, before: int, after: int) -> int:
    """The least padding to add after an axis of ``n`` entries so that rounding down counts the
    windows rounding up does (:func:`ceil_windows`).

    >>> ceil_padding(112, 3, 2, 0, 0), ceil_padding(6, 2, 2, 0, 0)
    (1, 0)
    """
    count = ceil_windows(n, kernel, stride, before, after)
    return max(0, (count - 1) * stride + kernel - (n + before + after))


class MaxPoolKind(PoolKind):
    name = "maxpool"
    keys = {**POOL_KEYS, "ceil": Key(flag, "0")}
    options = MaxPoolOptions

    def pool_kernels(self, options: object = None) -> tuple[Callable, Callable]:
        from hpctrain.kernels.pool import maxpool_backward, maxpool_forward

        return maxpool_forward, maxpool_backward

    def resolve(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> LayerSpec:
        """The window per axis; under ``ceil`` the padding after grown so that the windows the
        kernels count are those rounding up gives (padding never wins a maximum)."""
        o = spec.options
        if o.ceil_pad:  # made before, perhaps for another input size: start from the file's
            pad = tuple((b, a - e) for (b, a), e in zip(o.pad, o.ceil_pad, strict=True))
            spec = dataclasses.replace(spec, options=dataclasses.replace(o, pad=pad,
                                                                         ceil_pad=()))
        spec = super().resolve(spec, shapes, where)
        o, shape = spec.options, shapes[0]
        if len(shape) != len(o.kernel) + 1:  # out_shape names the mismatch
            return spec
        if o.ceil:
            extra = tuple(ceil_padding(n, w.kernel, w.stride, w.before, w.after)
                          for n, w in zip(shape[1:], windows_of(o), strict=True))
            pad = tuple((b, a + e) for (b, a), e in zip(o.pad, extra, strict=True))
            spec = dataclasses.replace(spec, options=dataclasses.replace(o, pad=pad,
                                                                         ceil_pad=extra))
        check_windows_hold_input(spec, shape, where)
        return spec

    def option_texts(self, options: MaxPoolOptions) -> dict[str, str]:
        texts = super().option_texts(options)
        if options.ceil_pad:  # the file's padding, which ceil grows again when read
            texts["pad"] = option_text(tuple((b, a - e) for (b, a), e in
                                             zip(options.pad, options.ceil_pad, strict=True)))
        return texts

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """The position of each window's maximum, kept (one byte each); the padded input and
        the comparison masks while they are found, and windows that tile the input copied tap
        by tap; the backward's flat indices (int64) and the float64 sums it scatters into,
        before their cast (windows that do not overlap put their entries in place on the CPU:
        no sums there, a bound above)."""
        work, b = fp.work, fp.itemsize
        n, c = work.x[:2]
        outputs = n * c * math.prod(work.out_sizes())
        y = outputs * b
        position = np.dtype(position_dtype(work.kernel)).itemsize
        padded_entries = padded_bytes(work, b) // b
        forward = {**fp.loose_input, "padded input": padded_copy_bytes(fp), "output": y,
                   "positions and masks": outputs * (2 * position + BOOL_BYTES)}
        if tuple(work.kernel) == tuple(work.stride):  # hpctrain.kernels.pool's tiles
            forward["window taps"] = outputs * math.prod(work.kernel) * b
        backward = {"output gradient": y, "flat indices": outputs * INDEX_BYTES,
                    "float64 sums": padded_entries * 8,
                    "padded input gradient": padded_entries * b}
        return {"maxima positions": outputs * position}, fp.phases(forward, backward)


KIND = MaxPoolKind()
