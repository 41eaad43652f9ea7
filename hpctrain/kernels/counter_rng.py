"""Counter-based random numbers: value k of a stream depends only on (key, k).

A rank draws exactly the entries of its own block, indexed by their *global* position, so dropout
masks, initial weights and synthetic data are the same whatever the grid — and no rank ever draws
(or holds) the whole tensor. The mixing function is SplitMix64's finaliser, run in uint64 with
wrap-around on NumPy or CuPy alike.
"""

from __future__ import annotations

from typing import Any

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


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
    """Uniform [0, 1) numbers, one per entry of the uint64 ``index`` array."""
    z = index * xp.uint64(GOLDEN) + xp.uint64(key)
    z = (z ^ (z >> xp.uint64(30))) * xp.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> xp.uint64(27))) * xp.uint64(0x94D049BB133111EB)
    z = z ^ (z >> xp.uint64(31))
    return ((z >> xp.uint64(11)).astype(xp.float64) * (1.0 / (1 << 53))).astype(dtype)


def uniform_block(xp: Any, key: int, shape: tuple[int, ...], box: tuple[tuple[int, int], ...],
                  dtype: Any) -> Any:
    """The ``box`` block of a global ``shape`` tensor of uniform [0, 1) numbers under ``key``."""
    return uniform(xp, key, global_index(xp, shape, box), dtype)
