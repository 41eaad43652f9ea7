"""2-D convolution, NCHW, by im2col + GEMM, with separate top/bottom padding.

Top and bottom padding differ for a row band of a height-split image: only the ranks at the image
edges pad; the others read halo rows instead. Kernels and strides may be non-square.

The im2col matrix (every window of the input, one row or column per output position) comes in
one of two orders, the same numbers either way:

- *channel-major*, (C·kh·kw, N·Ho·Wo), gathered from the NCHW input as it is;
- *channels-last*, (N·Ho·Wo, kh·kw·C), gathered from an NHWC copy of the input.

Gathering the windows and scattering their gradients back (col2im, kh·kw strided adds) run as
loops over contiguous stretches: an output row (Wo entries) channel-major, the C channels of a
position channels-last. A stretch of a few entries costs NumPy its per-stretch overhead, so
the order with the longer stretch wins: channels-last for the deep, small images late in a
network (AlexNet's conv2–conv5 at 127²: 152 → 135 ms backward, 71 → 65 ms forward), channel-
major for a first layer's 3 channels and for 1×1 kernels. The rule is
:func:`~hpctrain.kernels.sliding.prefer_channels_last`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.kernels.sliding import (
    padded,
    pair,
    prefer_channels_last,
    unpadded,
    windows,
    windows_last,
)


@dataclass(frozen=True)
class ConvCache:
    cols: Any  # (C·kh·kw, N·Ho·Wo) channel-major, (N·Ho·Wo, kh·kw·C) channels-last
    x_shape: tuple[int, ...]
    pads: tuple[int, int, int]  # top, bottom, left=right
    channels_last: bool = False


def conv2d_forward(xp: Any, x: Any, w: Any, b: Any | None, stride: int | tuple[int, int],
                   pads: tuple[int, int, int], channels_last: bool | None = None
                   ) -> tuple[Any, ConvCache]:
    """Y[n, o, p, q] = Σ_{c, a, e} W[o, c, a, e] · Xpad[n, c, p·sh + a, q·sw + e] + b[o].

    X: (N, C, H, W), W: (O, C, kh, kw) -> Y: (N, O, Ho, Wo), with Xpad the input padded by
    ``pads`` = (top, bottom, left=right), ``stride`` an int or a (sh, sw) pair,
    Ho = ⌊(H + top + bottom − kh)/sh⌋ + 1 and Wo = ⌊(W + 2·side − kw)/sw⌋ + 1.
    ``channels_last``: the windows channels-last (True) or channel-major (False); by default
    :func:`~hpctrain.kernels.sliding.prefer_channels_last` chooses.
    """
    sh, sw = pair(stride)
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    top, bottom, side = pads
    if channels_last is None:
        channels_last = prefer_channels_last(c, kh, kw, (wd + 2 * side - kw) // sw + 1)
    if channels_last:
        x_last = xp.zeros((n, h + top + bottom, wd + 2 * side, c), dtype=x.dtype)
        x_last[:, top:top + h, side:side + wd] = x.transpose(0, 2, 3, 1)
        win = windows_last(xp, x_last, kh, kw, sh, sw)  # (N, Ho, Wo, kh, kw, C)
        ho, wo = win.shape[1:3]
        cols = win.reshape(n * ho * wo, kh * kw * c)
        y = cols @ _weight_last(xp, w).T  # (N·Ho·Wo, O)
        if b is not None:
            y += b
        y = y.reshape(n, ho, wo, o).transpose(0, 3, 1, 2)
    else:
        win = windows(xp, padded(xp, x, pads, 0.0), kh, kw, sh, sw)  # (N, C, kh, kw, Ho, Wo)
        ho, wo = win.shape[4:]
        cols = win.transpose(1, 2, 3, 0, 4, 5).reshape(c * kh * kw, n * ho * wo)
        y = (w.reshape(o, -1) @ cols).reshape(o, n, ho, wo)
        if b is not None:
            y += b.reshape(o, 1, 1, 1)
        y = y.transpose(1, 0, 2, 3)
    return xp.ascontiguousarray(y), ConvCache(cols, x.shape, pads, channels_last)


def conv2d_backward(xp: Any, dy: Any, w: Any, cache: ConvCache, stride: int | tuple[int, int],
                    need_dx: bool = True, dw_out: Any | None = None
                    ) -> tuple[Any | None, Any, Any]:
    """Gradients (dX, dW, db) of :func:`conv2d_forward` given dY: (N, O, Ho, Wo).

    dW = dY·colsᵀ (written into ``dw_out`` when given), db = Σ_{n, p, q} dY, and dX scatters
    Wᵀ·dY back to each window position (the adjoint of the window gather), then drops the
    padding. The windows are in the order the forward took them (``cache``).
    """
    if cache.channels_last:
        return _backward_last(xp, dy, w, cache, pair(stride), need_dx, dw_out)
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


def _backward_last(xp: Any, dy: Any, w: Any, cache: ConvCache, stride: tuple[int, int],
                   need_dx: bool, dw_out: Any | None) -> tuple[Any | None, Any, Any]:
    """:func:`conv2d_backward` for windows taken channels-last: dY in NHWC rows, dW made in
    (O, kh, kw, C) order and put back into (O, C, kh, kw), col2im into an NHWC gradient."""
    sh, sw = stride
    o, c, kh, kw = w.shape
    n, _, ho, wo = dy.shape
    dy_rows = xp.ascontiguousarray(dy.transpose(0, 2, 3, 1)).reshape(n * ho * wo, o)
    dw_last = (dy_rows.T @ cache.cols).reshape(o, kh, kw, c).transpose(0, 3, 1, 2)
    if dw_out is None:
        dw = xp.ascontiguousarray(dw_last)
    else:
        dw = dw_out
        dw[...] = dw_last
    db = dy_rows.sum(axis=0)
    if not need_dx:
        return None, dw, db
    dcols = (dy_rows @ _weight_last(xp, w)).reshape(n, ho, wo, kh, kw, c)
    top, bottom, side = cache.pads
    h, wd = cache.x_shape[2:]
    dx_last = xp.zeros((n, h + top + bottom, wd + 2 * side, c), dtype=dy.dtype)
    for a in range(kh):
        for e in range(kw):
            dx_last[:, a:a + sh * ho:sh, e:e + sw * wo:sw] += dcols[:, :, :, a, e]
    dx = dx_last[:, top:top + h, side:side + wd].transpose(0, 3, 1, 2)
    return xp.ascontiguousarray(dx), dw, db


def _weight_last(xp: Any, w: Any) -> Any:
    """W: (O, C, kh, kw) as the (O, kh·kw·C) matrix of channels-last windows."""
    o = w.shape[0]
    return xp.ascontiguousarray(w.transpose(0, 2, 3, 1)).reshape(o, -1)
