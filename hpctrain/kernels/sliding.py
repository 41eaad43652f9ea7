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


def prefer_channels_last(channels: int, kh: int, kw: int, out_width: int) -> bool:
    """Whether a convolution takes its windows channels-last (see :mod:`hpctrain.kernels.conv`):
    when a position's channels (the stretch channels-last) are at least twice an output row's
    entries (the stretch channel-major), and the kernel is more than 1×1. (Here, beside
    :func:`position_dtype`, so that the memory model may read it while planning.)

    Fitted to measurements, forward plus backward at batch 4–16, channels-last ÷ channel-major:
    C = 32, Wo = 14: 0.70; C = 64, Wo = 28: 0.94; C = 64, Wo = 56: 1.11; C = 8, Wo = 14: 1.36;
    a 1×1 kernel, C = 256, Wo = 14: 1.13; AlexNet's conv1 (C = 3, 11×11, Wo = 31): 1.2."""
    return kh * kw > 1 and channels >= 2 * out_width


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


def windows_last(xp: Any, x: Any, kh: int, kw: int, sh: int, sw: int) -> Any:
    """Read-only view (N, Ho, Wo, kh, kw, C) of every kh×kw window of a contiguous
    channels-last X: (N, H, W, C), as :func:`windows` takes them. A window's (kw, C) entries
    lie together, so gathering it copies kh stretches of kw·C."""
    n, h, w, c = x.shape
    ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
    step_n, step_h, step_w, step_c = x.strides
    return xp.lib.stride_tricks.as_strided(
        x, shape=(n, ho, wo, kh, kw, c),
        strides=(step_n, step_h * sh, step_w * sw, step_h, step_w, step_c))
