"""Max- and average-pooling, NCHW, with separate top/bottom padding.

Top and bottom padding differ for a row band of a height-split image (see
:mod:`hpctrain.kernels.conv`). Kernels and strides may be an int (square) or a (height, width) pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.kernels.sliding import padded, pair, position_dtype, unpadded, windows


@dataclass(frozen=True)
class PoolCache:
    first: Any  # (N, C, Ho, Wo): position in window order (a·kw + e) of each window's maximum
    x_shape: tuple[int, ...]
    pads: tuple[int, int, int]


@dataclass(frozen=True)
class AvgPoolCache:
    x_shape: tuple[int, ...]  # the backward needs only shapes: average-pooling is linear
    pads: tuple[int, int, int]


def maxpool_forward(xp: Any, x: Any, kernel: int | tuple[int, int], stride: int | tuple[int, int],
                    pads: tuple[int, int, int]) -> tuple[Any, PoolCache]:
    """Y[n, c, p, q] = max_{a < kh, e < kw} Xpad[n, c, p·sh + a, q·sw + e].

    Xpad is X padded by ``pads`` = (top, bottom, left=right) with −∞, so padding never wins.
    A running maximum over the kh·kw strided views of X, each the size of Y: no copy of the
    windows (kh·kw times Y). Beside it, the position of each window's first maximum (a strict
    comparison keeps the earlier of equals), one byte per output for the usual kernels: all the
    backward needs, where keeping the windows would keep the padded input alive.
    """
    kh, kw = pair(kernel)
    sh, sw = pair(stride)
    win = windows(xp, padded(xp, x, pads, -xp.inf), kh, kw, sh, sw)
    y = win[:, :, 0, 0].copy()
    first = xp.zeros(y.shape, dtype=position_dtype(kh, kw))
    higher = xp.empty(y.shape, dtype=bool)
    step = xp.empty_like(first)
    for position in range(1, kh * kw):
        candidate = win[:, :, position // kw, position % kw]
        xp.greater(candidate, y, out=higher)
        # first = position where higher, else first: three passes of plain arithmetic, several
        # times faster than a masked copy (wrapping uint8 arithmetic is still exact)
        xp.subtract(first.dtype.type(position), first, out=step)
        step *= higher
        first += step
        xp.maximum(y, candidate, out=y)
    return y, PoolCache(first, x.shape, pads)


def maxpool_backward(xp: Any, dy: Any, kernel: int | tuple[int, int],
                     stride: int | tuple[int, int], cache: PoolCache) -> Any:
    """dX: each dY entry goes to the position of its window's maximum — the first one in
    window order when several entries tie, so each dY entry is counted exactly once.

    One scatter-add (``bincount``) of dY to the flat index of each maximum in the padded input,
    where adding window position by position would take kh·kw passes over strided views.
    Overlapping windows may send several entries to one place: they are summed in float64,
    then rounded once.
    """
    kh, kw = pair(kernel)
    sh, sw = pair(stride)
    n, c, ho, wo = dy.shape
    top, bottom, side = cache.pads
    h, w = cache.x_shape[2:]
    hp, wp = h + top + bottom, w + 2 * side
    # flat index ((n·C + c)·Hp + p·sh + a)·Wp + q·sw + e: the window's corner plus the offset
    # of its maximum, looked up by position
    offsets = xp.asarray([a * wp + e for a in range(kh) for e in range(kw)], dtype=xp.intp)
    flat = offsets.take(cache.first)
    flat += (xp.arange(n * c) * (hp * wp)).reshape(n, c, 1, 1)  # broadcast: no full temporary
    flat += (xp.arange(ho) * (sh * wp)).reshape(ho, 1) + xp.arange(wo) * sw
    sums = xp.bincount(flat.reshape(-1), weights=dy.reshape(-1), minlength=n * c * hp * wp)
    dxp = sums.astype(dy.dtype).reshape(n, c, hp, wp)
    return unpadded(dxp, cache.pads)


def avgpool_forward(xp: Any, x: Any, kernel: int | tuple[int, int], stride: int | tuple[int, int],
                    pads: tuple[int, int, int]) -> tuple[Any, AvgPoolCache]:
    """Y[n, c, p, q] = (1 / (kh·kw)) Σ_{a < kh, e < kw} Xpad[n, c, p·sh + a, q·sw + e].

    Xpad is X padded by ``pads`` = (top, bottom, left=right) with zeros, and the padding IS
    counted in the divisor: it is always kh·kw (PyTorch's default, ``count_include_pad=True``).
    So a row band of a height-split image averages exactly as the whole image does. A running
    sum over the kh·kw strided views of X, each the size of Y: no copy of the windows is made.
    """
    kh, kw = pair(kernel)
    sh, sw = pair(stride)
    win = windows(xp, padded(xp, x, pads, 0.0), kh, kw, sh, sw)
    y = win[:, :, 0, 0].copy()
    for position in range(1, kh * kw):
        xp.add(y, win[:, :, position // kw, position % kw], out=y)
    y /= kh * kw
    return y, AvgPoolCache(x.shape, pads)


def avgpool_backward(xp: Any, dy: Any, kernel: int | tuple[int, int],
                     stride: int | tuple[int, int], cache: AvgPoolCache) -> Any:
    """dX = the adjoint of :func:`avgpool_forward`: dY/(kh·kw) added to every position of each
    window, then the padding dropped."""
    kh, kw = pair(kernel)
    sh, sw = pair(stride)
    n, c, ho, wo = dy.shape
    top, bottom, side = cache.pads
    h, w = cache.x_shape[2:]
    share = dy / (kh * kw)
    dxp = xp.zeros((n, c, h + top + bottom, w + 2 * side), dtype=dy.dtype)
    for a in range(kh):
        for e in range(kw):
            dxp[:, :, a:a + sh * ho:sh, e:e + sw * wo:sw] += share
    return unpadded(dxp, cache.pads)
