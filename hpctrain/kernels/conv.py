"""2-D convolution, NCHW, by im2col + GEMM, with separate top/bottom padding.

Top and bottom padding differ for a row band of a height-split image: only the ranks at the image
edges pad; the others read halo rows instead. Kernels and strides may be non-square.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.kernels.window import padded, pair, unpadded, windows


@dataclass(frozen=True)
class ConvCache:
    cols: Any  # (C·kh·kw, N·Ho·Wo)
    x_shape: tuple[int, ...]
    pads: tuple[int, int, int]  # top, bottom, left=right


def conv2d_forward(xp: Any, x: Any, w: Any, b: Any | None, stride: int | tuple[int, int],
                   pads: tuple[int, int, int]) -> tuple[Any, ConvCache]:
    """Y[n, o, p, q] = Σ_{c, a, e} W[o, c, a, e] · Xpad[n, c, p·sh + a, q·sw + e] + b[o].

    X: (N, C, H, W), W: (O, C, kh, kw) -> Y: (N, O, Ho, Wo), with Xpad the input padded by
    ``pads`` = (top, bottom, left=right), ``stride`` an int or a (sh, sw) pair,
    Ho = ⌊(H + top + bottom − kh)/sh⌋ + 1 and Wo = ⌊(W + 2·side − kw)/sw⌋ + 1.
    """
    sh, sw = pair(stride)
    n, c = x.shape[:2]
    o, _, kh, kw = w.shape
    win = windows(xp, padded(xp, x, pads, 0.0), kh, kw, sh, sw)  # (N, C, kh, kw, Ho, Wo) view
    ho, wo = win.shape[4:]
    cols = win.transpose(1, 2, 3, 0, 4, 5).reshape(c * kh * kw, n * ho * wo)
    y = (w.reshape(o, -1) @ cols).reshape(o, n, ho, wo)
    if b is not None:
        y += b.reshape(o, 1, 1, 1)
    return xp.ascontiguousarray(y.transpose(1, 0, 2, 3)), ConvCache(cols, x.shape, pads)


def conv2d_backward(xp: Any, dy: Any, w: Any, cache: ConvCache, stride: int | tuple[int, int],
                    need_dx: bool = True, dw_out: Any | None = None
                    ) -> tuple[Any | None, Any, Any]:
    """Gradients (dX, dW, db) of :func:`conv2d_forward` given dY: (N, O, Ho, Wo).

    dW = dY·colsᵀ (written into ``dw_out`` when given), db = Σ_{n, p, q} dY, and dX scatters
    Wᵀ·dY back to each window position (the adjoint of the window gather), then drops the
    padding.
    """
    sh, sw = pair(stride)
    o, c, kh, kw = w.shape
    n, _, ho, wo = dy.shape
    dy_mat = dy.transpose(1, 0, 2, 3).reshape(o, n * ho * wo)
    dw_mat = None if dw_out is None else dw_out.reshape(o, -1)
    dw = xp.matmul(dy_mat, cache.cols.T, out=dw_mat).reshape(w.shape)
    db = dy.sum(axis=(0, 2, 3))
    if not need_dx:
        return None, dw, db
    dcols = (w.reshape(o, -1).T @ dy_mat).reshape(c, kh, kw, n, ho, wo)
    top, bottom, side = cache.pads
    h, wd = cache.x_shape[2:]
    dxp = xp.zeros((n, c, h + top + bottom, wd + 2 * side), dtype=dy.dtype)
    for a in range(kh):
        for e in range(kw):
            dxp[:, :, a:a + sh * ho:sh, e:e + sw * wo:sw] += dcols[:, a, e].transpose(1, 0, 2, 3)
    return unpadded(dxp, cache.pads), dw, db
