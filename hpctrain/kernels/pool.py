"""Max- and average-pooling over d spatial axes, (N, C, S1, …, Sd), with padding.

Images are d = 2, (N, C, H, W); volumes d = 3, (N, C, D, H, W). Kernel sizes and strides are
d-tuples, the padding a (before, after) pair per spatial axis
(``Pads`` in :mod:`hpctrain.kernels.sliding`): the two sides differ for a band of a split axis (see
:mod:`hpctrain.kernels.conv`) and for TensorFlow's ``same`` padding of an even kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from math import prod
from typing import Any

import numpy as np

from hpctrain.kernels.sliding import (
    Pads,
    check_windows,
    out_size,
    padded,
    position_dtype,
    unpadded,
    windows,
)


@dataclass(frozen=True)
class PoolCache:
    first: Any  # (N, C, O1, …, Od): position in window order (row-major) of each maximum
    x_shape: tuple[int, ...]
    pads: Pads


@dataclass(frozen=True)
class AvgPoolCache:
    x_shape: tuple[int, ...]  # the backward needs only shapes: average-pooling is linear
    pads: Pads
    divisor: Any  # K1·…·Kd, or (O1, …, Od) counts of the input entries in each window


def maxpool_forward(xp: Any, x: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
                    pads: Pads) -> tuple[Any, PoolCache]:
    """Y[n, c, p] = max_{a < K} Xpad[n, c, p·s + a], p and a d-tuples (a < K per axis).

    Xpad is X padded by ``pads`` ((before, after) per spatial axis) with −∞, so padding never
    wins. A running maximum over the K1·…·Kd strided views of X, each the size of Y: no copy of
    the windows (K1·…·Kd times Y). Beside it, the position of each window's first maximum in
    row-major window order (a strict comparison keeps the earlier of equals), one byte per
    output for the usual kernels: all the backward needs, where keeping the windows would keep
    the padded input alive.

    Windows that tile the input (stride = kernel, as CosmoFlow's 2×2×2 pools) are first copied
    tap by tap into one block each (``_taps_first``) on NumPy: every pass then runs over
    contiguous entries, where a strided view of a tap steps over the others' entries
    (CosmoFlow's first pool, 16 channels of 32³, batch 16, float32, one thread: 33 → 25 ms of
    CPU time). The same maxima and positions either way.
    """
    check_windows(x.ndim - 2, kernel, stride, pads)
    kernel, stride = tuple(kernel), tuple(stride)
    xpad = padded(xp, x, pads, -xp.inf)
    if xp is np and kernel == stride:  # windows side by side: their taps one block each
        taps = _taps_first(xpad, kernel)
        candidates = [taps[position] for position in range(len(taps))]
    else:
        win = windows(xp, xpad, kernel, stride)
        candidates = [win[corner] for corner in _corners(kernel)]
    y = candidates[0].copy()
    first = xp.zeros(y.shape, dtype=position_dtype(kernel))
    higher = xp.empty(y.shape, dtype=bool)
    step = xp.empty_like(first)
    for position, candidate in enumerate(candidates[1:], start=1):
        xp.greater(candidate, y, out=higher)
        # first = position where higher, else first: three passes of plain arithmetic, several
        # times faster than a masked copy (wrapping uint8 arithmetic is still exact)
        xp.subtract(first.dtype.type(position), first, out=step)
        step *= higher
        first += step
        xp.maximum(y, candidate, out=y)
    return y, PoolCache(first, x.shape, tuple(map(tuple, pads)))


def maxpool_backward(xp: Any, dy: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
                     cache: PoolCache) -> Any:
    """dX, each dY entry sent to the position of its window's maximum — the first one in
    window order when several entries tie, so each dY entry is counted exactly once.

    One scatter-add (``bincount``; on CuPy ``add.at``, as CuPy's ``bincount`` waits for the
    device to read its input's largest entry) of dY to the flat index of each maximum in the
    padded input, where adding window position by position would take K1·…·Kd passes over
    strided views.
    Overlapping windows may send several entries to one place: they are summed in float64,
    then rounded once. Windows that do not overlap (stride ≥ kernel on every axis) send at
    most one, which is put in place on NumPy, in dY's dtype: the same numbers without the
    float64 sums (CosmoFlow's first pool: 25 → 14 ms).
    """
    n, c, *out = dy.shape
    d = len(out)
    size = tuple(m + before + after for m, (before, after) in zip(cache.x_shape[2:], cache.pads,
                                                                   strict=True))
    # entries between neighbours along each padded spatial axis: (S2·…·Sd, …, Sd, 1)
    steps = [prod(size[axis + 1:]) for axis in range(d)]
    # flat index (n·C + c)·S + Σᵢ (pᵢ·sᵢ + aᵢ)·stepᵢ: the window's corner plus the offset of its
    # maximum, looked up by position (the offsets made where dY is: no host copy in the step)
    offsets = _flat_grid(xp, kernel, steps)
    flat = offsets.reshape(-1).take(cache.first)
    flat += (xp.arange(n * c) * prod(size)).reshape(n, c, *(1,) * d)  # broadcast, no temporary
    # each window's corner, (O1, …, Od): one pass over the flat index to add it
    flat += _flat_grid(xp, out, [s * step for s, step in zip(stride, steps, strict=True)])
    if xp is np and all(s >= k for s, k in zip(stride, kernel, strict=True)):
        # windows that do not overlap send at most one entry to each place: put, not sum
        dxp = np.zeros((n, c, *size), dtype=dy.dtype)
        dxp.reshape(-1)[flat.reshape(-1)] = dy.reshape(-1)
        return unpadded(dxp, cache.pads)
    if xp is np:
        sums = np.bincount(flat.reshape(-1), weights=dy.reshape(-1), minlength=n * c * prod(size))
    else:
        sums = xp.zeros(n * c * prod(size), dtype=xp.float64)
        xp.add.at(sums, flat.reshape(-1), dy.reshape(-1).astype(xp.float64))
    dxp = sums.astype(dy.dtype).reshape(n, c, *size)
    return unpadded(dxp, cache.pads)


def _flat_grid(xp: Any, counts: Sequence[int], spacings: Sequence[int]) -> Any:
    """Σᵢ aᵢ·spacingᵢ for every a with aᵢ < countsᵢ, as an integer array of shape
    (counts1, …, countsd): the flat index of each point of a grid of d axes, from its first.
    For counts (2, 3) and spacings (10, 1): [[0, 1, 2], [10, 11, 12]]."""
    d = len(counts)
    grid = 0
    for axis, (count, spacing) in enumerate(zip(counts, spacings, strict=True)):
        grid = grid + (xp.arange(count, dtype=xp.intp) * spacing).reshape(
            count, *(1,) * (d - 1 - axis))
    return grid


def avgpool_forward(xp: Any, x: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
                    pads: Pads, count_pad: bool = True) -> tuple[Any, AvgPoolCache]:
    """Y[n, c, p] = (1 / D[p]) Σ_{a < K} Xpad[n, c, p·s + a], p and a d-tuples.

    Xpad is X padded by ``pads`` ((before, after) per spatial axis) with zeros. With
    ``count_pad`` (PyTorch's default, ``count_include_pad=True``) the padding counts in the
    divisor: D = K1·…·Kd everywhere. Without it D[p] is the number of X's own entries in window
    p (``count_include_pad=False``), counted from the same padding: a band of a split axis pads
    only at the image's edges (its other rows are halo rows, real entries), so it averages
    exactly as the whole input does either way. A running sum over the K1·…·Kd strided views of
    X, each the size of Y: no copy of the windows is made.
    """
    check_windows(x.ndim - 2, kernel, stride, pads)
    kernel, stride = tuple(kernel), tuple(stride)
    pads = tuple(map(tuple, pads))
    members = _window_members(xp, x, kernel, stride, pads)
    if members is not None:  # a small image: every window's sum as one product
        n, c, *size = x.shape
        y = xp.matmul(x.reshape(n * c, -1), members).reshape(
            n, c, *(out_size(m, k, s, before, after) for m, k, s, (before, after)
                    in zip(size, kernel, stride, pads, strict=True)))
    else:
        win = windows(xp, padded(xp, x, pads, 0.0), kernel, stride)
        corners = _corners(kernel)
        y = win[corners[0]].copy()
        for corner in corners[1:]:
            xp.add(y, win[corner], out=y)
    divisor = prod(kernel) if count_pad else _entries_per_window(xp, x.shape[2:], kernel,
                                                                 stride, pads, y.dtype)
    y /= divisor
    return y, AvgPoolCache(x.shape, tuple(map(tuple, pads)), divisor)


def _entries_per_window(xp: Any, size: Sequence[int], kernel: tuple[int, ...],
                        stride: tuple[int, ...], pads: Pads, dtype: Any) -> Any:
    """(O1, …, Od): how many entries of an input of spatial ``size`` padded by ``pads`` each
    window holds, as a product of one count per axis (the windows are boxes)."""
    found = 1
    for axis, (n, k, s, (before, after)) in enumerate(zip(size, kernel, stride, pads,
                                                          strict=True)):
        starts = xp.arange(out_size(n, k, s, before, after)) * s - before
        count = xp.minimum(starts + k, n) - xp.maximum(starts, 0)
        found = found * count.astype(dtype).reshape(-1, *(1,) * (len(size) - 1 - axis))
    return found


def avgpool_backward(xp: Any, dy: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
                     cache: AvgPoolCache) -> Any:
    """dX = the adjoint of :func:`avgpool_forward`: dY/D added to every position of each
    window, then the padding dropped."""
    n, c, *out = dy.shape
    share = dy / cache.divisor
    members = _window_members(xp, share, kernel, stride, cache.pads, cache.x_shape)
    if members is not None:  # each input entry's windows' shares, as one product
        return xp.matmul(share.reshape(n * c, -1), members.T).reshape(cache.x_shape)
    size = (m + before + after for m, (before, after) in zip(cache.x_shape[2:], cache.pads,
                                                              strict=True))
    dxp = xp.zeros((n, c, *size), dtype=dy.dtype)
    for corner in product(*map(range, kernel)):
        dxp[(slice(None), slice(None), *(slice(a, a + s * m, s) for a, s, m in
                                         zip(corner, stride, out, strict=True)))] += share
    return unpadded(dxp, cache.pads)


SMALL_POOL_PRODUCT = 64 * 64
"""The largest (input entries) × (windows) of one image's channel whose average-pooling goes as
one product with a 0/1 matrix (``_window_members``), on NumPy in float32 or float64: below
it BLAS's product beats NumPy's strided adds, one per tap over a few entries each (Inception
v3's 3×3 pools at 75²: 3×3 and 7×7 images, 8 samples, 192–768 channels)."""


def _window_members(xp: Any, a: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
                    pads: Pads, x_shape: tuple[int, ...] | None = None) -> Any:
    """M: (S, P), M[i, p] = 1 where input entry i (of S = S1·…·Sd) lies in window p (of the P
    windows): Y = X·M sums every window (the padding's zeros left out), dX = dY·Mᵀ; None where
    the image is too large (:data:`SMALL_POOL_PRODUCT`) or ``a`` is not a NumPy float32 or
    float64 array. ``a``: the input, or the output gradient with ``x_shape`` the input's.
    An infinite entry of X gives NaN to every window of its channel (∞·0), where the sum of
    its own windows would give ∞ to those alone."""
    size = tuple((a.shape if x_shape is None else x_shape)[2:])
    out = tuple(out_size(m, k, s, before, after) for m, k, s, (before, after)
                in zip(size, kernel, stride, pads, strict=True))
    if (xp is not np or a.dtype not in (np.float32, np.float64)
            or prod(size) * prod(out) > SMALL_POOL_PRODUCT):
        return None
    return _members(size, kernel, stride, pads, a.dtype.str)


@lru_cache(maxsize=64)
def _members(size: tuple[int, ...], kernel: tuple[int, ...], stride: tuple[int, ...],
             pads: Pads, dtype: str) -> Any:
    """The 0/1 matrix of ``_window_members``, made once per shape."""
    full = tuple(m + before + after for m, (before, after) in zip(size, pads, strict=True))
    index = np.arange(prod(full)).reshape(full)
    inside = index[tuple(slice(before, before + m) for m, (before, _) in zip(size, pads,
                                                                             strict=True))]
    position = np.full(prod(full), -1)
    position[inside.reshape(-1)] = np.arange(prod(size))  # padded entry -> input entry
    win = windows(np, position.reshape(1, 1, *full), kernel, stride)[0, 0]  # (K…, O…)
    out = win.shape[len(kernel):]
    members = np.zeros((prod(size), prod(out)), dtype=np.dtype(dtype))
    for corner in product(*map(range, kernel)):
        entry = win[corner].reshape(-1)
        real = entry >= 0
        members[entry[real], np.arange(prod(out))[real]] = 1
    members.setflags(write=False)
    return members


def _taps_first(x: Any, kernel: tuple[int, ...]) -> Any:
    """(K1·…·Kd, N, C, O1, …, Od): a contiguous copy of the windows of X: (N, C, S1, …, Sd) at
    stride = kernel, Oᵢ = ⌊Sᵢ/Kᵢ⌋, one block per tap in row-major window order. Axis i is
    cut into Oᵢ tiles of Kᵢ entries (a view), then the tap axes moved to the front."""
    n, c, *size = x.shape
    d = len(kernel)
    out = [m // k for m, k in zip(size, kernel, strict=True)]
    tiles = x[(slice(None), slice(None), *(slice(0, o * k) for o, k in zip(out, kernel,
                                                                            strict=True)))]
    tiles = tiles.reshape(n, c, *(e for o, k in zip(out, kernel, strict=True) for e in (o, k)))
    # (N, C, O1, K1, …, Od, Kd) -> (K1, …, Kd, N, C, O1, …, Od)
    order = (*(3 + 2 * axis for axis in range(d)), 0, 1, *(2 + 2 * axis for axis in range(d)))
    return np.ascontiguousarray(tiles.transpose(order)).reshape(prod(kernel), n, c, *out)


def _corners(kernel: tuple[int, ...]) -> list[tuple[Any, ...]]:
    """Indices into a (N, C, K1, …, Kd, O1, …, Od) window view of each offset within the
    window, in row-major window order: each picks an (N, C, O1, …, Od) strided view."""
    every = (slice(None), slice(None))
    return [(*every, *corner) for corner in product(*map(range, kernel))]
