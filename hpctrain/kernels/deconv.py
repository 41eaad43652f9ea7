"""Transposed convolution over d spatial axes (PyTorch's ``ConvTranspose2d``/``3d``, ONNX's
``ConvTranspose``): the adjoint of a convolution with respect to its input.

Each input entry i along an axis scatters its weighted copies to the outputs i·s + a·D for the
taps a = 0 … K − 1 (stride s, dilation D): the inputs 0 … n − 1 fill a *full* output of
(n − 1)·s + D·(K − 1) + 1 entries. A layer keeps a stretch of it: PyTorch's padding p drops p
entries before and p − output_padding after. The kernels here take that stretch as a ``crop``
per axis, (first, size) in the full output's entries, where ``first`` may be negative and the
stretch may run past the end: entries no input reaches are zero (plus the bias). The same
kernel thus runs on a whole image and on a band of one under a domain split, whose rows read
the input rows around them (:class:`~hpctrain.layout.partition.TransposedWindow`).

The forward is a convolution's column scatter (Wᵀ·X per group, then col2im); the input
gradient is a convolution of the output gradient, placed back in the full output, by the same
weight (:func:`~hpctrain.kernels.conv.conv_forward`), and the weight gradient that
convolution's weight gradient with the input X in the place of its output gradient.

W: (C, O/G, K1, …, Kd), PyTorch's order, is also the weight of that convolution from O
channels to C: no transpose is ever made.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Any

from hpctrain.kernels.conv import _hits, _per_group, conv_backward, conv_forward, narrowed
from hpctrain.kernels.products import matmul, narrow, widen
from hpctrain.kernels.sliding import full_size

Crop = tuple[tuple[int, int], ...]  # (first, size) per spatial axis, in full-output entries


@dataclass(frozen=True)
class DeconvCache:
    x: Any  # the input, which the weight gradient reads
    full: tuple[int, ...]  # the full output's sizes
    crop: Crop
    stride: tuple[int, ...]
    dilation: tuple[int, ...] | None
    groups: int


def _overlap(crop: Crop, full: tuple[int, ...]) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """The slices of the kept stretch and of the full output that hold the same entries."""
    ours, theirs = [], []
    for (first, size), m in zip(crop, full, strict=True):
        lo, hi = max(first, 0), min(first + size, m)
        hi = max(hi, lo)
        ours.append(slice(lo - first, hi - first))
        theirs.append(slice(lo, hi))
    every = (slice(None), slice(None))
    return (*every, *ours), (*every, *theirs)


def deconv_forward(xp: Any, x: Any, w: Any, b: Any | None, stride: tuple[int, ...], crop: Crop,
                   dilation: tuple[int, ...] | None = None, groups: int = 1
                   ) -> tuple[Any, DeconvCache]:
    """Yfull[n, g·O/G + o, i·s + a·D] += Σ_c W[g·C/G + c, o, a] · X[n, g·C/G + c, i] over the
    inputs i and taps a (d-tuples); Y the ``crop`` of Yfull, plus b[o].

    X: (N, C, S1, …, Sd), W: (C, O/G, K1, …, Kd), b: (O,) or None -> Y: (N, O, size1, …).
    16-bit X and W are multiplied in float32 and Y comes back in X's dtype.
    """
    if narrow(x.dtype):
        y, cache = deconv_forward(xp, widen(x), widen(w), None if b is None else widen(b),
                                  stride, crop, dilation, groups)
        return y.astype(x.dtype), cache
    n, c, *size = x.shape
    _, og, *kernel = w.shape
    d, o = len(size), og * groups
    stride = tuple(stride)
    if dilation is not None and all(step == 1 for step in dilation):
        dilation = None
    steps = dilation or (1,) * d
    full = tuple(full_size(m, k, s, step) for m, k, s, step
                 in zip(size, kernel, stride, steps, strict=True))
    y = xp.zeros((n, o, *(size_ for _, size_ in crop)), dtype=x.dtype)
    if min(size, default=1) > 0 and n:
        # columns Wᵀ·X, one product a group: (G, O/G·K, C/G) · (G, C/G, N·P)
        x_mat = _per_group(x.transpose(1, 0, *range(2, 2 + d)), groups)
        cols = matmul(xp, _per_group(w, groups).swapaxes(-1, -2), x_mat).reshape(
            o, *kernel, n, *size)
        y_full = xp.zeros((n, o, *full), dtype=x.dtype)
        for corner in product(*map(range, kernel)):
            y_full[(slice(None), slice(None), *_hits(corner, stride, size, dilation))] += \
                cols[(slice(None), *corner)].transpose(1, 0, *range(2, 2 + d))
        ours, theirs = _overlap(crop, full)
        y[ours] = y_full[theirs]
    if b is not None:
        y += b.reshape(o, *(1,) * d)
    return y, DeconvCache(x, full, tuple(map(tuple, crop)), stride, dilation, groups)


def deconv_backward(xp: Any, dy: Any, w: Any, cache: DeconvCache, need_dx: bool = True,
                    dw_out: Any | None = None) -> tuple[Any | None, Any, Any]:
    """Gradients (dX, dW, db) of :func:`deconv_forward` given dY: dYfull is dY put back in the
    full output (zero elsewhere); dX = W ⋆ dYfull, the convolution of stride s and dilation D
    that :func:`deconv_forward` is the adjoint of; dW its weight gradient against X; db = Σ dY.
    A 16-bit dY is summed in float32 and the gradients come back in its dtype."""
    if narrow(dy.dtype):
        return narrowed(dy.dtype, deconv_backward(xp, widen(dy), widen(w), cache, need_dx),
                        dw_out)
    n, o, *_ = dy.shape
    d = len(cache.full)
    db = dy.sum(axis=(0, *range(2, 2 + d)))
    x = cache.x
    if min(x.shape[2:], default=1) == 0 or not n:  # no input entry: nothing reached Y
        dw = xp.zeros_like(w) if dw_out is None else _zeroed(dw_out)
        return (xp.zeros_like(x) if need_dx else None), dw, db
    dy_full = xp.zeros((n, o, *cache.full), dtype=dy.dtype)
    ours, theirs = _overlap(cache.crop, cache.full)
    dy_full[theirs] = dy[ours]
    no_pads = ((0, 0),) * d
    dx, conv_cache = conv_forward(xp, dy_full, w, None, cache.stride, no_pads,
                                  dilation=cache.dilation, groups=cache.groups)
    _, dw, _ = conv_backward(xp, cache.x, w, conv_cache, cache.stride, need_dx=False,
                             dw_out=dw_out)
    return (dx if need_dx else None), dw, db


def _zeroed(a: Any) -> Any:
    a[...] = 0
    return a
