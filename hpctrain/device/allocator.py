"""Freed memory kept for reuse: glibc's malloc told not to hand big blocks back to the system.

By default glibc serves every block above 32 MiB (and, until its threshold adapts, every block
above 128 KiB) with its own ``mmap`` and returns it with ``munmap`` when it is freed; the top of
its heap is trimmed back likewise. A training step allocates and frees the same large arrays
every step (im2col columns, activations, gradients, messages), so each of them comes back as
fresh pages: the kernel faults and zeroes every page again, in the step's time. On a virtual
machine whose host takes freed pages back, a page may cost a fault on the host too: a first
write of 200 MB took 0.3–0.45 s where writing it again took 24 ms. Measured with
``compare-plans`` on 2 ranks of such a machine (``bench/freed_memory.py``), the ranks spent
38–49 % of their CPU time in the kernel and stepped 1.5–2.4× slower than with the memory kept
(docs/running.md).

So, by the first rule that applies:

1. the environment sets glibc's malloc (``MALLOC_*_`` variables, or ``glibc.malloc`` in
   ``GLIBC_TUNABLES``): the user's word, left as it is — ``MALLOC_MMAP_MAX_=65536`` gives back
   glibc's own behaviour;
2. the C library is glibc: ``mallopt`` turns ``mmap`` off for allocations (``M_MMAP_MAX`` = 0,
   so every block comes from the heap and is reused once freed) and trimming off
   (``M_TRIM_THRESHOLD`` = -1, so the heap's top stays);
3. another C library: its allocator as it is.

The process then keeps its high-water mark of memory until it exits, which is what a training
run's peak is anyway (the memory model prices that peak). Blocks already mapped keep their
mapping and are unmapped when freed; the rule applies to what is allocated after it.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping

# glibc's environment variables for malloc (see mallopt(3)); any one set is the user's choice
GLIBC_VARIABLES = ("MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_MMAP_MAX_",
                   "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_")
M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers, from glibc's malloc.h
M_MMAP_MAX = -4


def user_setting(environ: Mapping[str, str]) -> str | None:
    """The environment variable by which the user set glibc's malloc, if any."""
    for name in GLIBC_VARIABLES:
        if name in environ:
            return name
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> str:
    """Apply the rule above to this process (idempotent); what it decided, in words."""
    setting = user_setting(os.environ if environ is None else environ)
    if setting is not None:
        return f"malloc as {setting} sets it"
    if platform.libc_ver()[0] != "glibc":
        return "the C library's malloc as it is"
    import ctypes

    libc = ctypes.CDLL(None)
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, -1)):
        return "glibc malloc as it is (mallopt refused)"
    return "freed memory kept (glibc malloc: no mmap, no trim)"
