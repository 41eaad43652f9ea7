"""Shared helpers for sliding-window kernels (convolution and pooling)."""

from __future__ import annotations

from typing import Any


def padded(xp: Any, x: Any, pads: tuple[int, int, int], value: float) -> Any:
    """X: (N, C, H, W) padded by (top, bottom, left=right) with ``value``."""
    top, bottom, side = pads
    if top == bottom == side == 0:
        return x
    return xp.pad(x, ((0, 0), (0, 0), (top, bottom), (side, side)), constant_values=value)


def unpadded(x: Any, pads: tuple[int, int, int]) -> Any:
    top, bottom, side = pads
    h, w = x.shape[2:]
    return x[:, :, top:h - bottom, side:w - side]


def windows(xp: Any, x: Any, kh: int, kw: int, stride: int) -> Any:
    """Read-only view (N, C, kh, kw, Ho, Wo) of every kh×kw window of X: (N, C, H, W)."""
    x = xp.ascontiguousarray(x)
    n, c, h, w = x.shape
    ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
    sn, sc, sh, sw = x.strides
    return xp.lib.stride_tricks.as_strided(
        x, shape=(n, c, kh, kw, ho, wo), strides=(sn, sc, sh, sw, sh * stride, sw * stride))
