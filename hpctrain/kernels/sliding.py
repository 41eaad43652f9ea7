"""Shared helpers for sliding-window kernels (convolution and pooling) over d spatial axes.

An input is X: (N, C, S1, …, Sd) — d = 2 for images (N, C, H, W), d = 3 for volumes
(N, C, D, H, W). A window size and a stride are d-tuples, one entry per spatial axis, and the
zero padding is a d-tuple of (before, after) pairs (:data:`Pads`): the two sides of an axis
may differ, as TensorFlow's ``same`` padding does for an even kernel (one more after than
before) and as a band of a split axis does (only the ranks at the edges pad).
"""

from __future__ import annotations

from math import prod
from typing import Any

Pads = tuple[tuple[int, int], ...]
"""Zero padding per spatial axis as (before, after) pairs, such as ((0, 1), (1, 1), (0, 1))."""


def out_size(n: int, k: int, s: int, before: int, after: int) -> int:
    """The number of windows of size ``k`` at stride ``s`` along an axis of ``n`` entries
    padded by ``before`` and ``after``: ⌊(n + before + after − k)/s⌋ + 1.

    >>> out_size(64, 2, 1, 0, 1)  # TensorFlow's "same" for an even kernel
    64
    """
    return (n + before + after - k) // s + 1


def full_size(n: int, kernel: int, stride: int, dilation: int = 1) -> int:
    """Entries that ``n`` inputs of a transposed convolution reach: (n − 1)·s + D·(K − 1) + 1
    (none without inputs), before its padding crops them (:mod:`hpctrain.kernels.deconv`).

    >>> full_size(8, 3, 2)  # a decoder's kernel 3, stride 2: 17, cropped to 16
    17
    """
    return (n - 1) * stride + dilation * (kernel - 1) + 1 if n > 0 else 0


def position_dtype(kernel: tuple[int, ...]) -> Any:
    """The integer type of a position in a window of size ``kernel``, one byte for the usual
    kernels. (Here, not beside max-pooling, so that the memory model may read it while
    planning.)"""
    import numpy as np

    return np.uint8 if prod(kernel) <= 256 else np.int32


def prefer_channels_last(channels: int, kernel: tuple[int, ...], out_last: int) -> bool:
    """Whether a convolution takes its windows channels-last (see :mod:`hpctrain.kernels.conv`).

    Yes when a position's channels (the stretch channels-last) are at least twice an output
    row's entries along the last axis, ``out_last`` (the stretch channel-major), eight times
    for a volume (three or more spatial axes), and the kernel is more than one entry. (Here,
    beside :func:`position_dtype`, so that the memory model may read it while planning.)

    Fitted to measurements, forward plus backward at batch 4–16, channels-last ÷
    channel-major: C = 32, Wo = 14: 0.70; C = 64, Wo = 28: 0.94; C = 64, Wo = 56: 1.11;
    C = 8, Wo = 14: 1.36; a 1×1 kernel, C = 256, Wo = 14: 1.13; AlexNet's conv1 (C = 3,
    11×11, Wo = 31): 1.2. Volumes, float32, one thread, stride 1, batch 1–16, by C/Wo
    (``python bench/conv3d.py --orders``): a 2×2×2 kernel, C/Wo = 0.25 (CosmoFlow's 64³
    layer): 1.66; 1 (its 32³ layer): 1.19–1.23; 4 (16³): 1.10–1.15; 16 (8³): 0.97; 64 (4³):
    0.83. A 3×3×3 kernel, C/Wo = 0.06–0.5: 1.25–2.60; 2: 0.98; 8: 0.87; 32: 0.71.
    """
    return prod(kernel) > 1 and channels >= (8 if len(kernel) >= 3 else 2) * out_last


def depthwise_channels_last(channels: int) -> bool:
    """Whether a depthwise convolution runs channels-last (see
    :func:`hpctrain.kernels.conv.conv_forward`): each of its taps is one product and one sum
    over the whole output, and channels-last both run along a position's channels, one
    contiguous stretch, where channel-major they broadcast a weight per channel and sum across
    the samples and positions. Yes from :data:`DEPTHWISE_CHANNELS` channels, which pays for the
    transposes channels-last adds."""
    return channels >= DEPTHWISE_CHANNELS


DEPTHWISE_CHANNELS = 64
"""The fewest channels a depthwise layer runs channels-last with
(:func:`depthwise_channels_last`). Chosen on MobileNet v2's depthwise layers at 64², batch 16,
3×3, float32, one thread, forward plus backward, channels-last ÷ channel-major: 32 channels
1.33, 96: 1.0–1.1, 144 and more 0.16–0.67. Held out of the choice, EfficientNet-B0's 5×5 layers
at 64² (144–1152 channels: 0.11–0.48) and MobileNet v2's at 224², batch 4 (32 channels, 112²:
1.59; 96 and more: 0.26–0.82), each on the side the rule picks (``python bench/depthwise.py
--orders``)."""


def live_taps(size: tuple[int, ...], kernel: tuple[int, ...], stride: tuple[int, ...],
              pads: Pads, dilation: tuple[int, ...] | None = None
              ) -> tuple[tuple[slice, ...], Pads] | None:
    """The taps of a window that read input entries, and the padding that is left without the
    others; None when every tap reads some input entry (nothing to drop).

    Tap a of axis i reads padded entries aᵢ·Dᵢ + sᵢ·p, p = 0 … Pᵢ − 1; one that reads only the
    padding (zeros) adds nothing to any output. Per axis, the taps from the first that reads an
    input entry to the last are kept (``slice(lo, hi)``); the padding shrinks by the dropped
    taps' reach, (before − lo·D, after − (K − hi)·D), which leaves the same Pᵢ windows. An axis
    whose padding would go below zero (a tap dropped at a stride that steps over the input)
    keeps every tap (``slice(None)``).

    ResNet-18's last stage at 32² (1×1 images, 3×3 kernels padded by 1) keeps the middle tap
    alone: its convolutions are 1×1 products, a ninth of the work.

    >>> live_taps((1, 1), (3, 3), (1, 1), ((1, 1), (1, 1)))
    ((slice(1, 2, None), slice(1, 2, None)), ((0, 0), (0, 0)))
    >>> live_taps((8, 8), (3, 3), (1, 1), ((1, 1), (1, 1))) is None
    True
    """
    dilation = dilation or (1,) * len(kernel)
    taps, left, dropped = [], [], False
    for m, k, s, (before, after), step in zip(size, kernel, stride, pads, dilation,
                                               strict=True):
        windows = out_size(m, step * (k - 1) + 1, s, before, after)
        live = [a for a in range(k) if _reads_input(a * step, s, windows, before, m)]
        lo, hi = (live[0], live[-1] + 1) if live else (0, k)
        trimmed = (before - lo * step, after - (k - hi) * step)
        if (lo, hi) == (0, k) or min(trimmed) < 0:
            taps.append(slice(None))
            left.append((before, after))
        else:
            taps.append(slice(lo, hi))
            left.append(trimmed)
            dropped = True
    return (tuple(taps), tuple(left)) if dropped else None


def _reads_input(offset: int, stride: int, windows: int, before: int, size: int) -> bool:
    """Whether a tap at ``offset`` of ``windows`` windows at ``stride`` reads any of the
    entries before … before + size − 1 of a padded axis (its input, not its padding)."""
    first = max(0, -((offset - before) // stride))  # the first window at or past the input
    return first < windows and offset + stride * first < before + size


def padded(xp: Any, x: Any, pads: Pads, value: float) -> Any:
    """A copy of X (N, C, S1, …, Sd) padded by ``pads`` (before, after per spatial axis)
    with ``value``, or X itself when every pad is 0."""
    if not any(before or after for before, after in pads):
        return x
    return xp.pad(x, ((0, 0), (0, 0), *pads), constant_values=value)


def unpadded(x: Any, pads: Pads) -> Any:
    """The view of a padded (N, C, S1 + before + after, …) array without its padding."""
    return x[(slice(None), slice(None),
              *(slice(before, n - after) for (before, after), n in zip(pads, x.shape[2:],
                                                                       strict=True)))]


def spans(kernel: tuple[int, ...], dilation: tuple[int, ...] | None) -> tuple[int, ...]:
    """Entries each window covers along each axis: dilation·(kernel − 1) + 1 (the kernel
    itself undilated, ``dilation`` None)."""
    if dilation is None:
        return tuple(kernel)
    return tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True))


def windows(xp: Any, x: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
            dilation: tuple[int, ...] | None = None) -> Any:
    """Read-only view (N, C, K1, …, Kd, O1, …, Od) of every window of X: (N, C, S1, …, Sd).

    Window (p1, …, pd) starts at entry pᵢ·sᵢ of axis i and takes every Dᵢ-th entry from there
    (D the ``dilation``; 1: adjacent entries), so Oᵢ = ⌊(Sᵢ − spanᵢ)/sᵢ⌋ + 1 (:func:`spans`); for
    images, (N, C, kh, kw, Ho, Wo).
    """
    x = xp.ascontiguousarray(x)
    steps = x.strides[2:]  # bytes
    dilation = dilation or (1,) * len(kernel)
    out = tuple(out_size(n, k, s, 0, 0) for n, k, s in zip(x.shape[2:], spans(kernel, dilation),
                                                              stride, strict=True))
    return xp.lib.stride_tricks.as_strided(
        x, shape=(*x.shape[:2], *kernel, *out),
        strides=(*x.strides[:2], *(step * d for step, d in zip(steps, dilation, strict=True)),
                 *(step * s for step, s in zip(steps, stride, strict=True))))


def windows_last(xp: Any, x_last: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
                 dilation: tuple[int, ...] | None = None) -> Any:
    """Read-only view (N, O1, …, Od, K1, …, Kd, C) of every window of a contiguous
    channels-last X: (N, S1, …, Sd, C), as :func:`windows` takes them. A window's (Kd, C)
    entries lie together when undilated, so gathering it copies K1·…·K(d−1) stretches of
    Kd·C."""
    n, *size, c = x_last.shape
    steps = x_last.strides[1:-1]
    dilation = dilation or (1,) * len(kernel)
    out = tuple(out_size(m, k, s, 0, 0) for m, k, s in zip(size, spans(kernel, dilation), stride,
                                                            strict=True))
    return xp.lib.stride_tricks.as_strided(
        x_last, shape=(n, *out, *kernel, c),
        strides=(x_last.strides[0], *(step * s for step, s in zip(steps, stride, strict=True)),
                 *(step * d for step, d in zip(steps, dilation, strict=True)),
                 x_last.strides[-1]))


def check_windows(d: int, kernel: tuple[int, ...], stride: tuple[int, ...], pads: Pads) -> None:
    """Raise a ValueError unless ``kernel``, ``stride`` and ``pads`` each give one entry per
    spatial axis of a d-axis input, with windows of at least one entry and positive strides."""
    for name, value in (("kernel", kernel), ("stride", stride), ("pads", pads)):
        if not isinstance(value, tuple | list) or len(value) != d:
            raise ValueError(f"{name} {value!r}: give one entry per spatial axis ({d})")
    if min(kernel) < 1 or min(stride) < 1:
        raise ValueError(f"kernel {kernel!r}, stride {stride!r}: every entry must be >= 1")
    if any(not isinstance(pair, tuple | list) or len(pair) != 2 or min(pair) < 0
           for pair in pads):
        raise ValueError(f"pads {pads!r}: give a (before, after) pair >= 0 per spatial axis")
