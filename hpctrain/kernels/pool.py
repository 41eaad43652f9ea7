"""Max- and average-pooling, NCHW, with separate top/bottom padding.

Top and bottom padding differ for a row band of a height-split image (see :mod:`.conv`). Kernels
and strides may be an int (square) or a (height, width) pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.kernels.window import padded, pair, unpadded, windows


@dataclass(frozen=True)
class PoolCache:
    windows: Any  # (N, C, kh, kw, Ho, Wo) read-only view of the padded input
    y: Any  # (N, C, Ho, Wo): the maxima
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
    windows (kh·kw times Y) and no argmax is made; the backward finds the maxima again.
    """
    kh, kw = pair(kernel)
    sh, sw = pair(stride)
    win = windows(xp, padded(xp, x, pads, -xp.inf), kh, kw, sh, sw)
    y = win[:, :, 0, 0].copy()
    for position in range(1, kh * kw):
        xp.maximum(y, win[:, :, position // kw, position % kw], out=y)
    return y, PoolCache(win, y, x.shape, pads)


def maxpool_backward(xp: Any, dy: Any, kernel: int | tuple[int, int],
                     stride: int | tuple[int, int], cache: PoolCache) -> Any:
    """dX: each dY entry goes to the position of its window's maximum — the first one in
    window order when several entries tie, so each dY entry is counted exactly once."""
    kh, kw = pair(kernel)
    sh, sw = pair(stride)
    n, c, ho, wo = dy.shape
    top, bottom, side = cache.pads
    h, w = cache.x_shape[2:]
    dxp = xp.zeros((n, c, h + top + bottom, w + 2 * side), dtype=dy.dtype)
    taken = xp.zeros(dy.shape, dtype=bool)
    for a in range(kh):
        for e in range(kw):
            hit = cache.windows[:, :, a, e] == cache.y
            hit &= ~taken
            taken |= hit
            dxp[:, :, a:a + sh * ho:sh, e:e + sw * wo:sw] += xp.where(hit, dy, 0)
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
