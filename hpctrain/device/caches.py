"""Evicting the CPU caches, so that a timing sees memory as a training step leaves it.

In a training step every kernel and every collective follows other layers' work, whose data
(activations, im2col columns, weights and their gradients) is far larger than the last-level
cache: a layer's weights, the activations its backward saved, and MPI's shared-memory buffers
come from DRAM. A kernel or a collective timed in a tight loop finds them all in cache instead
(measured on the 2-core reference VM, 32 MiB L3: ResNet-18's kernels at 64x64, batch 8 per rank,
87 ms warm, 102 ms with the caches evicted before each call, 98-100 ms inside training; a 4 KiB
Allreduce on two ranks 4.7 us back to back, 21 us after an eviction, 31 us inside training).
Timings therefore evict before each timed call (outside the timed region).

But only as much as a step pushes through: a step whose data fits the cache finds its kernels'
data there, as a timing in a tight loop does. A rank evicts 1.5x the bytes one step keeps on
it, up to 1.5x the whole cache. On a host whose last-level cache holds 480 MiB, writing 1.5x of
it before every sample made the planning of a 1 MiB net take a minute, all of it in eviction,
and timed its kernels colder than its training steps run them.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache

import numpy as np

DEFAULT_LLC = 32 << 20  # bytes, when sysfs does not say
MIB = 1 << 20


@lru_cache(maxsize=1)
def last_level_cache_bytes() -> int:
    """The largest CPU cache of cpu0, from sysfs (a default where it cannot be read)."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    largest = 0
    try:
        for entry in os.listdir(base):
            if not entry.startswith("index"):
                continue
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            largest = max(largest, int(text.rstrip("KMG")) * scale)
    except (OSError, ValueError):
        pass
    return largest or DEFAULT_LLC


@lru_cache(maxsize=1)
def _buffer() -> np.ndarray:
    # 1.5x the LLC: enough to push out what a loop left there under LRU-like replacement
    return np.zeros(3 * last_level_cache_bytes() // 2 // 4, np.float32)


def eviction_bytes(step_bytes: float | None = None) -> int:
    """Bytes written before each timed call: 1.5x what a step keeps on the rank
    (``step_bytes``, rounded up to whole MiB), at most 1.5x the last-level cache; 1.5x the
    cache when the step is not known (None).

    >>> eviction_bytes(2.5 * 2**20) == 3 * (3 << 20) // 2
    True
    >>> eviction_bytes(None) == eviction_bytes(1 << 50) == 3 * last_level_cache_bytes() // 2
    True
    """
    cache = last_level_cache_bytes()
    if step_bytes is not None and step_bytes < cache:
        cache = min(cache, max(1, math.ceil(step_bytes / MIB)) * MIB)
    return 3 * cache // 2


def evict_caches(device: str = "cpu", nbytes: int | None = None) -> None:
    """Write ``nbytes`` (:func:`eviction_bytes`; 1.5x the last-level cache when None) of a
    buffer (CPU only; a GPU's kernels read device memory, which host traffic does not touch)."""
    if device != "cpu":
        return
    buf = _buffer()[:(eviction_bytes() if nbytes is None else nbytes) // 4]
    np.add(buf, 1.0, out=buf)
