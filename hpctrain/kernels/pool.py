"""Max-pooling, NCHW, with separate top/bottom padding (padding never wins the max)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.kernels.window import padded, unpadded, windows


@dataclass(frozen=True)
class PoolCache:
    windows: Any  # (N, C, k, k, Ho, Wo) read-only view of the padded input
    y: Any  # (N, C, Ho, Wo): the maxima
    x_shape: tuple[int, ...]
    pads: tuple[int, int, int]


def maxpool_forward(xp: Any, x: Any, kernel: int, stride: int, pads: tuple[int, int, int]
                    ) -> tuple[Any, PoolCache]:
    """Y[n, c, p, q] = max over the kernel×kernel window at (p·stride, q·stride).

    A running maximum over the kernel² strided views of X, each the size of Y: no copy of the
    windows (kernel² times Y) and no argmax is made; the backward finds the maxima again.
    """
    win = windows(xp, padded(xp, x, pads, -xp.inf), kernel, kernel, stride)
    y = win[:, :, 0, 0].copy()
    for position in range(1, kernel * kernel):
        xp.maximum(y, win[:, :, position // kernel, position % kernel], out=y)
    return y, PoolCache(win, y, x.shape, pads)


def maxpool_backward(xp: Any, dy: Any, kernel: int, stride: int, cache: PoolCache) -> Any:
    """dX: each dY entry goes to the position of its window's maximum — the first one in
    window order when several entries tie, so each dY entry is counted exactly once."""
    n, c, ho, wo = dy.shape
    top, bottom, side = cache.pads
    h, w = cache.x_shape[2:]
    dxp = xp.zeros((n, c, h + top + bottom, w + 2 * side), dtype=dy.dtype)
    taken = xp.zeros(dy.shape, dtype=bool)
    for a in range(kernel):
        for e in range(kernel):
            hit = cache.windows[:, :, a, e] == cache.y
            hit &= ~taken
            taken |= hit
            dxp[:, :, a:a + stride * ho:stride, e:e + stride * wo:stride] += xp.where(hit, dy, 0)
    return unpadded(dxp, cache.pads)
