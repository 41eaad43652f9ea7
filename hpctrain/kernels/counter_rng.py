"""Counter-based random numbers: value k of a stream depends only on (key, k).

A rank draws exactly the entries of its own block, indexed by their *global* position, so dropout
masks, initial weights and synthetic data are the same whatever the grid — and no rank ever draws
(or holds) the whole tensor. The mixing function is SplitMix64's finaliser, run in uint64 with
wrap-around on NumPy or CuPy alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
CHUNK = 1 << 16  # entries a stretch on NumPy: 512 KiB a uint64 buffer


def _mix_int(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def stream_key(*words: int) -> int:
    """A 64-bit key from integers such as (seed, purpose, layer, step)."""
    key = 0
    for w in words:
        key = _mix_int((key + GOLDEN + (w & MASK64)) & MASK64)
    return key


def global_index(xp: Any, shape: tuple[int, ...], box: tuple[tuple[int, int], ...]) -> Any:
    """Flat row-major index, in the global ``shape``, of every entry of the block ``box``."""
    index = xp.zeros((1,) * len(shape), dtype=xp.uint64)
    for axis, ((lo, hi), n) in enumerate(zip(box, shape, strict=True)):
        axis_shape = [1] * len(shape)
        axis_shape[axis] = hi - lo
        index = index * xp.uint64(n) + xp.arange(lo, hi, dtype=xp.uint64).reshape(axis_shape)
    return index


def uniform(xp: Any, key: int, index: Any, dtype: Any) -> Any:
    """Uniform [0, 1) numbers, one per entry of the uint64 ``index`` array.

    On NumPy a stretch of ``CHUNK`` entries at a time, whose finaliser passes stay in a core's
    cache instead of each writing a new array to memory: 17.0 against 6.9 ms for a batch of
    CosmoFlow's 32³ volumes (2 Mi entries), the same numbers. A device takes the whole array at
    once."""
    if xp is not np:
        return _finalised(xp, key, index).astype(dtype)
    out = np.empty(index.shape, dtype=dtype)
    entries, values = index.reshape(-1), out.reshape(-1)
    for lo in range(0, entries.size, CHUNK):
        values[lo:lo + CHUNK] = _finalised(np, key, entries[lo:lo + CHUNK])
    return out


def _finalised(xp: Any, key: int, index: Any) -> Any:
    """SplitMix64's finaliser of ``index``·GOLDEN + ``key``, its top 53 bits as float64 in
    [0, 1): in place on two buffers after the first product."""
    z = index * xp.uint64(GOLDEN)
    z += xp.uint64(key)
    shifted = xp.empty_like(z)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
        xp.right_shift(z, xp.uint64(shift), out=shifted)
        z ^= shifted
        if factor is not None:
            z *= xp.uint64(factor)
    z >>= xp.uint64(11)
    return z * (1.0 / (1 << 53))  # below 2^53: exact in float64


def uniform_block(xp: Any, key: int, shape: tuple[int, ...], box: tuple[tuple[int, int], ...],
                  dtype: Any) -> Any:
    """The ``box`` block of a global ``shape`` tensor of uniform [0, 1) numbers under ``key``."""
    return uniform(xp, key, global_index(xp, shape, box), dtype)
