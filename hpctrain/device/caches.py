"""Evicting the CPU caches, so that a timing sees memory as a training step leaves it.

In a training step every kernel and every collective follows other layers' work, whose data
(activations, im2col columns, weights and their gradients) is far larger than the last-level
cache: a layer's weights, the activations its backward saved, and MPI's shared-memory buffers
come from DRAM. A kernel or a collective timed in a tight loop finds them all in cache instead
(measured on the 2-core reference VM, 32 MiB L3: ResNet-18's kernels at 64x64, batch 8 per rank,
87 ms warm, 102 ms with the caches evicted before each call, 98-100 ms inside training; a 4 KiB
Allreduce on two ranks 4.7 us back to back, 21 us after an eviction, 31 us inside training).
Timings therefore evict before each timed call (outside the timed region).
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np

DEFAULT_LLC = 32 << 20  # bytes, when sysfs does not say


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


def evict_caches(device: str = "cpu") -> None:
    """Write a buffer larger than the last-level cache (CPU only; a GPU's kernels read device
    memory, which host traffic does not touch)."""
    if device != "cpu":
        return
    buf = _buffer()
    np.add(buf, 1.0, out=buf)
