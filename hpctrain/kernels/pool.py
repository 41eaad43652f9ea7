"""Max-pooling, NCHW, with separate top/bottom padding (padding never wins the max)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.kernels.window import padded, unpadded, windows


@dataclass(frozen=True)
class PoolCache:
    argmax: Any  # (N, C, Ho, Wo): flat position a*kw + e of the max inside its window
    x_shape: tuple[int, ...]
    pads: tuple[int, int, int]


def maxpool_forward(xp: Any, x: Any, kernel: int, stride: int, pads: tuple[int, int, int]
                    ) -> tuple[Any, PoolCache]:
    """Y[n, c, p, q] = max over the kernel×kernel window at (p·stride, q·stride)."""
    win = windows(xp, padded(xp, x, pads, -xp.inf), kernel, kernel, stride)
    n, c, _, _, ho, wo = win.shape
    flat = win.transpose(0, 1, 4, 5, 2, 3).reshape(n, c, ho, wo, kernel * kernel)
    argmax = flat.argmax(axis=-1)
    y = xp.take_along_axis(flat, argmax[..., None], axis=-1)[..., 0]
    return y, PoolCache(argmax, x.shape, pads)


def maxpool_backward(xp: Any, dy: Any, kernel: int, stride: int, cache: PoolCache) -> Any:
    """dX: each dY entry goes to the position of its window's maximum."""
    n, c, ho, wo = dy.shape
    top, bottom, side = cache.pads
    h, w = cache.x_shape[2:]
    dxp = xp.zeros((n, c, h + top + bottom, w + 2 * side), dtype=dy.dtype)
    for a in range(kernel):
        for e in range(kernel):
            hit = cache.argmax == a * kernel + e
            dxp[:, :, a:a + stride * ho:stride, e:e + stride * wo:stride] += xp.where(hit, dy, 0)
    return unpadded(dxp, cache.pads)
