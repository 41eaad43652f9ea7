"""Shared helpers for sliding-window kernels (convolution and pooling)."""

from __future__ import annotations

from numbers import Integral
from typing import Any


def pair(value: int | tuple[int, int]) -> tuple[int, int]:
    """``(value, value)`` for an int, else the ``(height, width)`` pair itself.

    Lets a kernel size or stride be given as one int for the square case or as a pair.
    """
    if isinstance(value, Integral):  # NumPy integers too
        return int(value), int(value)
    if len(value) != 2:
        raise ValueError(f"window size or stride {value!r}: give an int or a (height, width) pair")
    height, width = value
    return int(height), int(width)


def position_dtype(kh: int, kw: int) -> Any:
    """The integer type of a position in a kh×kw window: one byte for the usual kernels.
    (Here, not beside max-pooling, so that the memory model may read it while planning.)"""
    import numpy as np

    return np.uint8 if kh * kw <= 256 else np.int32


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


def windows(xp: Any, x: Any, kh: int, kw: int, sh: int, sw: int) -> Any:
    """Read-only view (N, C, kh, kw, Ho, Wo) of every kh×kw window of X: (N, C, H, W).

    Window (p, q) starts at row p·sh and column q·sw, so Ho = ⌊(H − kh)/sh⌋ + 1 and
    Wo = ⌊(W − kw)/sw⌋ + 1.
    """
    x = xp.ascontiguousarray(x)
    n, c, h, w = x.shape
    ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
    step_n, step_c, step_h, step_w = x.strides  # bytes
    return xp.lib.stride_tricks.as_strided(
        x, shape=(n, c, kh, kw, ho, wo),
        strides=(step_n, step_c, step_h, step_w, step_h * sh, step_w * sw))
