"""Convolution over d spatial axes, (N, C, S1, …, Sd), by im2col + GEMM, with zero padding.

Images are d = 2, (N, C, H, W); volumes d = 3, (N, C, D, H, W); d = 1 works too. Each spatial
axis has its own kernel size, stride and (before, after) padding
(``Pads`` in :mod:`hpctrain.kernels.sliding`): the two sides differ for a band of a split axis (only
the ranks at the edges pad; the others read halo entries instead) and for TensorFlow's ``same``
padding of an even kernel (one more after than before).

The im2col matrix (every window of the input, one row or column per output position) comes in
one of two orders, the same numbers either way (K = K1·…·Kd entries in a window, P =
P1·…·Pd output positions per sample, O output channels):

- *channel-major*, (C·K, N·P), gathered from the (N, C, S1, …, Sd) input as it is;
- *channels-last*, (N·P, K·C), gathered from an (N, S1, …, Sd, C) copy of the input.

Gathering the windows and scattering their gradients back (col2im, K strided adds) run as
loops over contiguous stretches: an output row along the last axis (Pd entries) channel-major,
the C channels of a position channels-last. A stretch of a few entries costs NumPy its
per-stretch overhead, so the order with the longer stretch wins: channels-last for the deep,
small images late in a network (AlexNet's conv2–conv5 at 127²: 152 → 135 ms backward, 71 → 65
ms forward), channel-major for a first layer's 3 channels, for 1×1 kernels and for volumes
with fewer than eight channels per output row entry (CosmoFlow's 64³ and 32³ layers). The
rule is :func:`~hpctrain.kernels.sliding.prefer_channels_last`.

A volume's input gradient goes a slab of output planes at a time (:data:`SLAB_BYTES`), so that
the column gradients of a slab are scattered back while they are still in cache: CosmoFlow's
64³ layer's backward 80 → 59 ms; an image's, in one go. Channel-major columns
with :data:`SAMPLE_POSITIONS` output positions a sample or more are multiplied a sample at a
time (on NumPy, ungrouped): Y comes out of the products in its own order and the backward reads
dY as it lies, with no transposed copies of either.

Two shapes skip the general path. Taps that read only padding (every window's, as at a 1×1 or
2×2 image late in a network) are dropped, with the padding they reached
(:func:`~hpctrain.kernels.sliding.live_taps`): they add only zeros, and their weight gradient
is zero. A *pointwise* convolution (a 1×1 kernel at stride 1, unpadded and ungrouped, also
what dropping taps leaves of ResNet-18's last stage) is a product of W with each sample's
(C, P) matrix as it lies, Y[n] = W·X[n]: no columns and no transposes. At P = 1 it is one
product of the (N, C) rows, as a fully connected layer; below :data:`POINTWISE_POSITIONS`
positions it keeps the general path's one product over every sample, which beats many thin
ones.

A *dilated* convolution takes every Dᵢ-th entry along axis i in a window (its taps span
Dᵢ·(Kᵢ − 1) + 1 entries): the same gather with longer steps. A *grouped* one (G groups) cuts
the channels into G groups and each group of O/G outputs reads its own C/G inputs: the columns
are taken channel-major and the G products go as one batched product. A *depthwise* one (each
group one input and one output channel, MobileNet's) has no product worth the columns: it adds
up K shifted copies of the input, each scaled by its tap's weight per channel.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import product
from math import prod
from typing import Any

import numpy as np

from hpctrain.kernels.norm import channel_sums
from hpctrain.kernels.products import matmul, narrow, widen
from hpctrain.kernels.sliding import (
    Pads,
    check_windows,
    depthwise_channels_last,
    live_taps,
    out_size,
    padded,
    prefer_channels_last,
    spans,
    unpadded,
    windows,
    windows_last,
)

SLAB_BYTES = 4 * 2**20
"""The input gradient of a volume (d ≥ 3) goes a slab of output planes at a time, with about
this many bytes of column gradients: they stay in cache between their GEMM and the col2im
scatter, where the whole matrix would go out to memory and back. Measured, the backward of
CosmoFlow's 64³ layer (16 → 32 channels, 2×2×2, batch 1, float32, one thread) by slab: 0.5
MiB 63 ms, 4 MiB 59 ms, 16 MiB 74 ms, a sample at a time 80 ms; its 32³ layer (32 → 64)
25, 25, 30, 28 ms; a 16³ layer at batch 4 (64 → 128), 8 MiB a sample: 43–46 ms whatever the
slab (``python bench/conv3d.py --slabs``)."""


POINTWISE_POSITIONS = 49
"""The fewest output positions per sample (P) at which a pointwise convolution multiplies each
sample's (C, P) matrix as it lies (``_pointwise``); below, one product over the columns of
every sample, as the general path. (P = 1 is a single product of the samples' rows.)"""


SAMPLE_POSITIONS = 1024
"""The fewest output positions per sample (P) at which channel-major columns are multiplied a
sample at a time: Y comes out of the products in its own (N, O, P) order, and the backward reads
dY as it lies, where one product over every sample's columns gives (O, N·P) and takes a
transposed copy each way. Measured, float32, one thread, forward and backward, one product →
a sample at a time (ms of CPU time): CosmoFlow's 32³ layer (4 → 16 channels, batch 16) 39.3 →
32.3 and 23.0 → 16.6, its 16³ layer 21.4 → 18.1 and 34.5 → 34.9; ResNet-50's first layer at 64²
(batch 8, P = 1024) 3.7 → 3.0 and 2.4 → 2.3; Inception v3's 32 → 64 layer at 35² (P = 1225)
7.1 → 6.6 and 17.0 → 14.4. Below, no gain: AlexNet's first layer at 127² (P = 961) 14.1 → 14.5
and 10.0 → 10.1, CosmoFlow's 8³ layer (P = 512) 6.5 → 7.2 and 15.9 → 15.4."""


@dataclass(frozen=True)
class ConvCache:
    cols: Any  # (C·K, N·P) channel-major, (N·P, K·C) channels-last; a depthwise layer's padded X;
    # a pointwise layer's X as (N, C, P)
    x_shape: tuple[int, ...]
    pads: Pads  # (before, after) per spatial axis
    channels_last: bool = False
    dilation: tuple[int, ...] | None = None  # None: no dilation
    groups: int = 1
    taps: tuple[slice, ...] | None = None  # the taps kept (live_taps); None: all of them
    pointwise: bool = False  # cols is X itself (_pointwise)


def conv_forward(xp: Any, x: Any, w: Any, b: Any | None, stride: tuple[int, ...], pads: Pads,
                 channels_last: bool | None = None, dilation: tuple[int, ...] | None = None,
                 groups: int = 1) -> tuple[Any, ConvCache]:
    """Y[n, o, p] = Σ_{c, a} W[o, c, a] · Xpad[n, g·C/G + c, p·s + a·D] + b[o], p and a
    d-tuples, g = ⌊o/(O/G)⌋ the group of output o.

    X: (N, C, S1, …, Sd), W: (O, C/G, K1, …, Kd), b: (O,) or None -> Y: (N, O, P1, …, Pd)
    (contiguous), with Xpad the input padded with zeros by ``pads`` ((before, after) per
    spatial axis), ``stride`` and ``dilation`` (D, None for all 1) d-tuples, ``groups`` G
    dividing C and O, and Pᵢ = ⌊(Sᵢ + beforeᵢ + afterᵢ − Dᵢ·(Kᵢ − 1) − 1)/sᵢ⌋ + 1.
    ``channels_last``: the windows channels-last (True) or channel-major (False); by default
    :func:`~hpctrain.kernels.sliding.prefer_channels_last` chooses (channel-major for G > 1).

    16-bit X and W (bfloat16, float16) are multiplied, and their windows kept, in float32; Y
    comes back in X's dtype (a tensor core's sums are float32 too).
    """
    if narrow(x.dtype):
        y, cache = conv_forward(xp, widen(x), widen(w), None if b is None else widen(b), stride,
                                pads, channels_last, dilation, groups)
        return y.astype(x.dtype), cache
    n, c, *size = x.shape
    o, cg, *kernel = w.shape
    d = len(size)
    check_windows(d, tuple(kernel), stride, pads)
    if cg * groups != c or o % groups:
        raise ValueError(f"weight {w.shape} with {groups} groups does not fit input {x.shape}")
    kernel, stride = tuple(kernel), tuple(stride)
    if dilation is not None and all(step == 1 for step in dilation):
        dilation = None
    live = live_taps(tuple(size), kernel, stride, pads, dilation)
    if live is not None:  # the taps that read only padding dropped, and the padding they read
        taps, pads = live
        y, cache = conv_forward(xp, x, w[(slice(None), slice(None), *taps)], b, stride, pads,
                                channels_last, dilation, groups)
        return y, replace(cache, taps=taps)
    if (groups == 1 and channels_last is not True and all(k == 1 for k in kernel)
            and all(step == 1 for step in stride) and not any(map(any, pads))
            and (prod(size) == 1 or prod(size) >= POINTWISE_POSITIONS)):
        return _pointwise(xp, x, w, b)
    span = spans(kernel, dilation)
    if groups > 1:
        if cg == 1 and o == groups:
            return _depthwise(xp, x, w, b, stride, pads, dilation, channels_last)
        channels_last = False  # the grouped products are taken channel-major
    if channels_last is None:
        before, after = pads[-1]
        channels_last = prefer_channels_last(
            c, kernel, out_size(size[-1], span[-1], stride[-1], before, after))
    if channels_last:
        x_last = xp.zeros((n, *(m + before + after for m, (before, after) in zip(size, pads)), c),
                          dtype=x.dtype)
        x_last[_inside(size, pads)] = x.transpose(0, *range(2, 2 + d), 1)
        win = windows_last(xp, x_last, kernel, stride, dilation)  # (N, P1, …, Pd, K1, …, Kd, C)
        out = win.shape[1:1 + d]
        cols = win.reshape(n * prod(out), prod(kernel) * c)
        y = matmul(xp, cols, _weight_last(xp, w).T)  # (N·P, O)
        if b is not None:
            y += b
        y = y.reshape(n, *out, o).transpose(0, 1 + d, *range(1, 1 + d))
    else:
        win = windows(xp, padded(xp, x, pads, 0.0), kernel, stride, dilation)  # (N, C, K…, P…)
        out = win.shape[2 + d:]
        cols = win.transpose(1, *range(2, 2 + d), 0, *range(2 + d, 2 + 2 * d)).reshape(
            c * prod(kernel), n * prod(out))
        if _per_sample(xp, groups, out):  # Y[n] = W·cols[n], (N, O, P): Y's own order
            y = matmul(xp, w.reshape(o, -1), _sample_columns(cols, n)).reshape(n, o, *out)
            if b is not None:
                y += b.reshape(o, *(1,) * d)
        else:  # one product per group: (G, O/G, C/G·K) · (G, C/G·K, N·P)
            y = matmul(xp, _per_group(w, groups), _per_group(cols, groups)).reshape(o, n, *out)
            if b is not None:
                y += b.reshape(o, *(1,) * (1 + d))
            y = y.transpose(1, 0, *range(2, 2 + d))
    return xp.ascontiguousarray(y), ConvCache(cols, x.shape, tuple(map(tuple, pads)),
                                              channels_last, dilation, groups)


def conv_backward(xp: Any, dy: Any, w: Any, cache: ConvCache, stride: tuple[int, ...],
                  need_dx: bool = True, dw_out: Any | None = None
                  ) -> tuple[Any | None, Any, Any]:
    """Gradients (dX, dW, db) of :func:`conv_forward` given dY: (N, O, P1, …, Pd).

    dW = dY·colsᵀ (written into ``dw_out`` when given), db = Σ_{n, p} dY, and dX scatters
    Wᵀ·dY back to each window position (the adjoint of the window gather), then drops the
    padding; for a volume, a slab of output planes at a time (:data:`SLAB_BYTES`). The
    windows are in the order the forward took them (``cache``), as are its dilation and
    groups. A 16-bit dY is summed in float32 and the gradients come back in its dtype.
    """
    if narrow(dy.dtype):
        return narrowed(dy.dtype, conv_backward(xp, widen(dy), widen(w), cache, stride,
                                                need_dx), dw_out)
    stride = tuple(stride)
    if cache.taps is not None:  # dW is zero at the dropped taps
        taps = (slice(None), slice(None), *cache.taps)
        dx, dw_live, db = conv_backward(xp, dy, w[taps], replace(cache, taps=None), stride,
                                        need_dx)
        dw = xp.zeros_like(w) if dw_out is None else dw_out
        if dw_out is not None:
            dw[...] = 0
        dw[taps] = dw_live
        return dx, dw, db
    if cache.pointwise:
        return _pointwise_backward(xp, dy, w, cache, need_dx, dw_out)
    o, cg, *kernel = w.shape
    if cache.groups > 1 and cg == 1 and o == cache.groups:
        return _depthwise_backward(xp, dy, w, cache, stride, need_dx, dw_out)
    if cache.channels_last:
        return _backward_last(xp, dy, w, cache, stride, need_dx, dw_out)
    c = cache.x_shape[1]
    n, _, *out = dy.shape
    d, g = len(out), cache.groups
    if _per_sample(xp, g, out):
        return _backward_per_sample(xp, dy, w, cache, stride, need_dx, dw_out)
    dy_mat = _per_group(dy.transpose(1, 0, *range(2, 2 + d)), g)
    dw_mat = None if dw_out is None else _per_group(dw_out, g)
    dw = matmul(xp, dy_mat, _per_group(cache.cols, g).swapaxes(-1, -2),
                out=dw_mat).reshape(w.shape)
    db = channel_sums(xp, dy)
    if not need_dx:
        return None, dw, db
    if d >= 3 and g == 1:
        return _input_gradient_slabs(xp, dy, w, cache, stride), dw, db
    dcols = matmul(xp, _per_group(w, g).swapaxes(-1, -2), dy_mat).reshape(c, *kernel, n, *out)
    size = cache.x_shape[2:]
    dxp = xp.zeros((n, c, *(m + before + after for m, (before, after) in zip(size, cache.pads))),
                   dtype=dy.dtype)
    for corner in product(*map(range, kernel)):
        dxp[(slice(None), slice(None), *_hits(corner, stride, out, cache.dilation))] += \
            dcols[(slice(None), *corner)].transpose(1, 0, *range(2, 2 + d))
    return unpadded(dxp, cache.pads), dw, db


def _per_sample(xp: Any, groups: int, out: Sequence[int]) -> bool:
    """Whether channel-major columns are multiplied a sample at a time (``_sample_columns``):
    on NumPy, ungrouped, with at least :data:`SAMPLE_POSITIONS` output positions a sample."""
    return xp is np and groups == 1 and prod(out) >= SAMPLE_POSITIONS


def _sample_columns(cols: Any, n: int) -> Any:
    """Channel-major columns (C·K, N·P) as the (N, C·K, P) stack of each sample's columns: a
    view, each matrix's rows N·P entries apart, which BLAS takes as it is."""
    return cols.reshape(cols.shape[0], n, -1).swapaxes(0, 1)


def _backward_per_sample(xp: Any, dy: Any, w: Any, cache: ConvCache, stride: tuple[int, ...],
                         need_dx: bool, dw_out: Any | None) -> tuple[Any | None, Any, Any]:
    """:func:`conv_backward` of channel-major columns a sample at a time: dW = Σₙ dY[n]·cols[n]ᵀ
    and dcols[n] = Wᵀ·dY[n], with dY[n] the (O, P) matrix of sample n as it lies: no transposed
    copy of dY, and col2im adds whole (N, C, P…) blocks."""
    o, c, *kernel = w.shape
    n, _, *out = dy.shape
    d = len(out)
    dy_rows = xp.ascontiguousarray(dy).reshape(n, o, -1)  # dY: (N, O, P)
    cols = _sample_columns(cache.cols, n)  # (N, C·K, P)
    w_mat = w.reshape(o, -1)  # (O, C·K)
    dw_mat = None if dw_out is None else dw_out.reshape(o, -1)
    dw = matmul(xp, dy_rows, cols.swapaxes(1, 2)).sum(axis=0, out=dw_mat).reshape(w.shape)
    db = channel_sums(xp, dy_rows)
    if not need_dx:
        return None, dw, db
    if d >= 3:
        return _input_gradient_slabs(xp, dy, w, cache, stride), dw, db
    dcols = matmul(xp, w_mat.T, dy_rows).reshape(n, c, *kernel, *out)
    size = cache.x_shape[2:]
    dxp = xp.zeros((n, c, *(m + before + after for m, (before, after) in zip(size, cache.pads))),
                   dtype=dy.dtype)
    for corner in product(*map(range, kernel)):
        dxp[(slice(None), slice(None), *_hits(corner, stride, out, cache.dilation))] += \
            dcols[(slice(None), slice(None), *corner)]
    return unpadded(dxp, cache.pads), dw, db


def narrowed(dtype: Any, gradients: tuple[Any | None, Any, Any], dw_out: Any | None
             ) -> tuple[Any | None, Any, Any]:
    """(dX, dW, db) made in float32 from a 16-bit dY, given back in its ``dtype``: dW written
    into ``dw_out`` where given (the kept buffer; the 16-bit kernels' copy is the layer's)."""
    dx, dw, db = gradients
    if dw_out is not None:
        dw_out[...] = dw
        dw = dw_out
    else:
        dw = dw.astype(dtype)
    return (None if dx is None else dx.astype(dtype)), dw, db.astype(dtype)


def _per_group(a: Any, groups: int) -> Any:
    """``a`` (rows grouped along its first axis) as a matrix, or a stack of ``groups``
    matrices, one a group: a plain convolution keeps its one 2-D product (on a GPU, the one
    cuBLAS call a 16-bit product takes; :func:`~hpctrain.kernels.products.matmul`)."""
    if groups == 1:
        return a.reshape(a.shape[0], -1)
    return a.reshape(groups, a.shape[0] // groups, -1)


def _pointwise(xp: Any, x: Any, w: Any, b: Any | None) -> tuple[Any, ConvCache]:
    """:func:`conv_forward` of a 1×1 kernel at stride 1, unpadded and ungrouped: Y[n] = W·X[n]
    + b with X[n] the (C, P) matrix of sample n as it lies, or at P = 1 the rows Y = X·Wᵀ + b
    of the (N, C) samples; the kept X is a view of the input, not a copy."""
    n, c, *size = x.shape
    o = w.shape[0]
    x_rows = xp.ascontiguousarray(x).reshape(n, c, -1)  # X: (N, C, P)
    w_mat = w.reshape(o, c)  # W: (O, C)
    if x_rows.shape[2] == 1:
        y = matmul(xp, x_rows.reshape(n, c), w_mat.T)  # (N, O)
        if b is not None:
            y += b
    else:
        y = matmul(xp, w_mat, x_rows)  # (N, O, P), one product a sample
        if b is not None:
            y += b.reshape(o, 1)
    pads = ((0, 0),) * len(size)
    return y.reshape(n, o, *size), ConvCache(x_rows, x.shape, pads, pointwise=True)


def _pointwise_backward(xp: Any, dy: Any, w: Any, cache: ConvCache, need_dx: bool,
                        dw_out: Any | None) -> tuple[Any | None, Any, Any]:
    """:func:`conv_backward` of :func:`_pointwise`: dW = Σₙ dY[n]·X[n]ᵀ, db = Σ_{n, p} dY,
    dX[n] = Wᵀ·dY[n]; at P = 1 the products of the (N, O) and (N, C) rows."""
    x_rows = cache.cols  # X: (N, C, P)
    n, c, positions = x_rows.shape
    o = w.shape[0]
    w_mat = w.reshape(o, c)
    dy_rows = xp.ascontiguousarray(dy).reshape(n, o, positions)  # dY: (N, O, P)
    dw_mat = None if dw_out is None else dw_out.reshape(o, c)
    if positions == 1:
        dy_rows, x_rows = dy_rows.reshape(n, o), x_rows.reshape(n, c)
        dw = matmul(xp, dy_rows.T, x_rows, out=dw_mat)
        db = dy_rows.sum(axis=0)
        dx = matmul(xp, dy_rows, w_mat) if need_dx else None  # (N, C)
    else:
        dw = matmul(xp, dy_rows, x_rows.swapaxes(1, 2)).sum(axis=0, out=dw_mat)
        db = channel_sums(xp, dy_rows)
        dx = matmul(xp, w_mat.T, dy_rows) if need_dx else None  # (N, C, P)
    dw = dw.reshape(w.shape)
    return (None if dx is None else dx.reshape(cache.x_shape)), dw, db


def _depthwise(xp: Any, x: Any, w: Any, b: Any | None, stride: tuple[int, ...], pads: Pads,
               dilation: tuple[int, ...] | None, channels_last: bool | None = None
               ) -> tuple[Any, ConvCache]:
    """:func:`conv_forward` of a depthwise layer (W: (C, 1, K1, …, Kd)): Y is the sum over the
    window's taps a of Xpad shifted by a·D, times W[:, 0, a] per channel. It keeps the padded
    input, which its backward reads, instead of columns K times its size; channel-major, or
    channels-last where :func:`~hpctrain.kernels.sliding.depthwise_channels_last` says the
    channels are the longer stretch."""
    n, c, *size = x.shape
    d = len(size)
    kernel = tuple(w.shape[2:])
    out = tuple(out_size(m, k, s, before, after) for m, k, s, (before, after)
                in zip(size, spans(kernel, dilation), stride, pads, strict=True))
    if channels_last is None:
        channels_last = depthwise_channels_last(c)
    if channels_last:
        xpad = xp.zeros((n, *(m + before + after for m, (before, after) in zip(size, pads)), c),
                        dtype=x.dtype)
        xpad[_inside(size, pads)] = x.transpose(0, *range(2, 2 + d), 1)
        taps = xp.ascontiguousarray(w[:, 0].transpose(*range(1, 1 + d), 0))  # (K…, C)
        y = xp.zeros((n, *out, c), dtype=x.dtype)
    else:
        xpad = padded(xp, x, pads, 0.0)
        taps = w[:, 0].reshape(c, -1).T.reshape(*kernel, 1, c, *(1,) * d)
        y = xp.zeros((n, c, *out), dtype=x.dtype)
    product_ = xp.empty_like(y)  # one buffer for every tap's product
    for corner in product(*map(range, kernel)):
        xp.multiply(xpad[_tap(corner, stride, out, dilation, channels_last)], taps[corner],
                    out=product_)
        y += product_
    if channels_last:
        if b is not None:
            y += b
        y = xp.ascontiguousarray(y.transpose(0, 1 + d, *range(1, 1 + d)))
    elif b is not None:
        y += b.reshape(c, *(1,) * d)
    return y, ConvCache(xpad, x.shape, tuple(map(tuple, pads)), channels_last, dilation, c)


def _depthwise_backward(xp: Any, dy: Any, w: Any, cache: ConvCache, stride: tuple[int, ...],
                        need_dx: bool, dw_out: Any | None) -> tuple[Any | None, Any, Any]:
    """:func:`conv_backward` of :func:`_depthwise`: per tap a, dW[:, 0, a] = Σ_{n, p} dY ·
    Xpad shifted by a·D, and dXpad shifted by a·D gains dY · W[:, 0, a]; in the order of the
    windows the forward took."""
    xpad, kernel, last = cache.cols, tuple(w.shape[2:]), cache.channels_last
    n, c, *out = dy.shape
    d = len(out)
    db = channel_sums(xp, dy)
    if last:
        dy = xp.ascontiguousarray(dy.transpose(0, *range(2, 2 + d), 1))
        taps = xp.ascontiguousarray(w[:, 0].transpose(*range(1, 1 + d), 0))
        summed = tuple(range(0, 1 + d))  # every axis but the channels (the last)
    else:
        taps = w[:, 0].reshape(c, -1).T.reshape(*kernel, 1, c, *(1,) * d)
        summed = (0, *range(2, 2 + d))
    dw = xp.empty_like(w) if dw_out is None else dw_out
    dxp = xp.zeros_like(xpad) if need_dx else None
    product_ = xp.empty_like(dy)
    for corner in product(*map(range, kernel)):
        hits = _tap(corner, stride, out, cache.dilation, last)
        xp.multiply(dy, xpad[hits], out=product_)
        dw[(slice(None), 0, *corner)] = product_.sum(axis=summed)
        if need_dx:
            xp.multiply(dy, taps[corner], out=product_)
            dxp[hits] += product_
    if dxp is None:
        return None, dw, db
    if not last:
        return unpadded(dxp, cache.pads), dw, db
    dx = dxp[_inside(cache.x_shape[2:], cache.pads)].transpose(0, 1 + d, *range(1, 1 + d))
    return xp.ascontiguousarray(dx), dw, db


def _tap(corner: Sequence[int], stride: Sequence[int], out: Sequence[int],
         dilation: Sequence[int] | None, channels_last: bool) -> tuple[slice, ...]:
    """The entries of a padded input that tap ``corner`` reads (:func:`_hits`), channel-major
    (N, C, S…) or channels-last (N, S…, C)."""
    every = slice(None)
    hits = _hits(corner, stride, out, dilation)
    return (every, *hits, every) if channels_last else (every, every, *hits)


def _backward_last(xp: Any, dy: Any, w: Any, cache: ConvCache, stride: tuple[int, ...],
                   need_dx: bool, dw_out: Any | None) -> tuple[Any | None, Any, Any]:
    """:func:`conv_backward` for windows taken channels-last: dY in (N·P, O) rows, dW made in
    (O, K1, …, Kd, C) order and put back into (O, C, K1, …, Kd), col2im into a channels-last
    gradient."""
    o, c, *kernel = w.shape
    n, _, *out = dy.shape
    d = len(out)
    dy_rows = xp.ascontiguousarray(dy.transpose(0, *range(2, 2 + d), 1)).reshape(-1, o)
    dw_last = matmul(xp, dy_rows.T, cache.cols).reshape(o, *kernel, c).transpose(0, 1 + d,
                                                                        *range(1, 1 + d))
    if dw_out is None:
        dw = xp.ascontiguousarray(dw_last)
    else:
        dw = dw_out
        dw[...] = dw_last
    db = dy_rows.sum(axis=0)
    if not need_dx:
        return None, dw, db
    if d >= 3:
        return _input_gradient_slabs(xp, dy, w, cache, stride), dw, db
    dcols = matmul(xp, dy_rows, _weight_last(xp, w)).reshape(n, *out, *kernel, c)
    size = cache.x_shape[2:]
    dx_last = xp.zeros((n, *(m + before + after for m, (before, after) in zip(size, cache.pads)),
                        c), dtype=dy.dtype)
    every_position = (slice(None),) * (1 + d)
    for corner in product(*map(range, kernel)):
        dx_last[(slice(None), *_hits(corner, stride, out, cache.dilation))] += \
            dcols[(*every_position, *corner)]
    dx = dx_last[_inside(size, cache.pads)].transpose(0, 1 + d, *range(1, 1 + d))
    return xp.ascontiguousarray(dx), dw, db


def _input_gradient_slabs(xp: Any, dy: Any, w: Any, cache: ConvCache, stride: tuple[int, ...]
                          ) -> Any:
    """dX of a volume in either order of the windows, a slab of output planes at a time
    (``_slabs``): each slab's column gradients, Wᵀ·dY, are scattered back (col2im) while
    they are still in cache, where the whole matrix would go out to memory and back."""
    o, c, *kernel = w.shape
    n, _, *out = dy.shape
    d = len(out)
    size = cache.x_shape[2:]
    full = tuple(m + before + after for m, (before, after) in zip(size, cache.pads, strict=True))
    last = cache.channels_last
    if last:
        w_mat = _weight_last(xp, w)  # (O, K·C)
        grad = xp.zeros((n, *full, c), dtype=dy.dtype)
    else:
        w_mat = w.reshape(o, -1).T  # (C·K, O)
        grad = xp.zeros((n, c, *full), dtype=dy.dtype)
    corners = list(product(*map(range, kernel)))
    every_position = (slice(None),) * d
    for i, planes in _slabs(n, out, c * prod(kernel) * dy.dtype.itemsize):
        block = (planes.stop - planes.start, *out[1:])
        dy_block = dy[i, :, planes].reshape(o, -1)  # (O, planes·P2·…·Pd), a view
        shift = planes.start * stride[0]
        if last:
            dcols = matmul(xp, dy_block.T, w_mat).reshape(*block, *kernel, c)
            for corner in corners:
                hits = _hits(corner, stride, block, cache.dilation, shift)
                grad[(i, *hits)] += dcols[(*every_position, *corner)]
        else:
            dcols = matmul(xp, w_mat, dy_block).reshape(c, *kernel, *block)
            for corner in corners:
                hits = _hits(corner, stride, block, cache.dilation, shift)
                grad[(i, slice(None), *hits)] += dcols[(slice(None), *corner)]
    if not last:
        return unpadded(grad, cache.pads)
    dx = grad[_inside(size, cache.pads)].transpose(0, 1 + d, *range(1, 1 + d))
    return xp.ascontiguousarray(dx)


def _slabs(n: int, out: Sequence[int], column_bytes: int) -> Iterator[tuple[int, slice]]:
    """(sample, slab of output planes along the first spatial axis) pairs that cover every
    output position, each slab's columns about :data:`SLAB_BYTES`, at least one plane."""
    planes = max(1, SLAB_BYTES // (column_bytes * prod(out[1:])))
    for i in range(n):
        for start in range(0, out[0], planes):
            yield i, slice(start, min(out[0], start + planes))


def _hits(corner: Sequence[int], stride: Sequence[int], out: Sequence[int],
          dilation: Sequence[int] | None = None, shift: int = 0) -> tuple[slice, ...]:
    """The padded input entries that tap ``corner`` of every window reads: per axis
    aᵢ·Dᵢ, aᵢ·Dᵢ + sᵢ, …, aᵢ·Dᵢ + sᵢ·(Pᵢ − 1), the first axis moved on by ``shift`` entries
    (a slab's first plane)."""
    dilation = dilation or (1,) * len(corner)
    starts = [a * step for a, step in zip(corner, dilation, strict=True)]
    starts[0] += shift
    return tuple(slice(a, a + s * m, s) for a, s, m in zip(starts, stride, out, strict=True))


def _inside(size: Sequence[int], pads: Pads) -> tuple[slice, ...]:
    """The unpadded part of a padded channels-last (N, S1 + before + after, …, C) array."""
    return (slice(None), *(slice(before, before + m) for m, (before, _) in zip(size, pads,
                                                                              strict=True)))


def _weight_last(xp: Any, w: Any) -> Any:
    """W: (O, C, K1, …, Kd) as the (O, K·C) matrix of channels-last windows."""
    o, d = w.shape[0], w.ndim - 2
    return xp.ascontiguousarray(w.transpose(0, *range(2, 2 + d), 1)).reshape(o, -1)
