"""Freed memory kept for reuse: glibc's malloc told not to hand big blocks back to the system.

By default glibc serves a large block with an ``mmap`` of its own and unmaps it when it is
freed: every block above 128 KiB at first, then, once such a block was freed, those above its
size, up to 32 MiB; the top of its heap is trimmed back to the system likewise. A training step
allocates and frees the same large arrays every step (im2col columns, activations, gradients,
messages), so the largest of them come back as fresh pages each step: the kernel faults and
zeroes every page again, in the step's time. On a virtual machine whose host takes freed pages
back, a page may cost a fault on the host too. Measured side by side on such a machine
(``bench/freed_memory.py``; docs/running.md), the 3-D nets, whose convolutions' im2col columns
lie above 32 MiB, stepped 1.03–1.44× faster with memory kept, the 2-D ones alike, at the price
of a higher peak (+15–23 % for ``res3d``: a freed block in the middle of the heap is reused,
never returned).

So, by the first rule that applies:

1. ``HPCTRAIN_KEEP_FREED_MEMORY=0``: the malloc as it is (where memory is tight);
2. the environment sets what this rule would (``MALLOC_MMAP_MAX_``, ``MALLOC_MMAP_THRESHOLD_``,
   ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``, or those in ``GLIBC_TUNABLES``): the user's
   word, left as it is;
3. the C library is glibc: ``mallopt`` turns ``mmap`` off for allocations (``M_MMAP_MAX`` = 0,
   so every block comes from the heap and is reused once freed) and trimming off
   (``M_TRIM_THRESHOLD`` = -1, so the heap's top stays);
4. another C library: its allocator as it is.

The process then keeps its high-water mark of memory until it exits. Blocks already mapped keep
their mapping and are unmapped when freed; the rule applies to what is allocated after it.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping

SWITCH = "HPCTRAIN_KEEP_FREED_MEMORY"
# glibc's settings of what the rule sets (mallopt(3)); setting any one is the user's choice.
# Each also stops glibc from raising its mmap threshold as blocks are freed.
GLIBC_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                   "MALLOC_TOP_PAD_")
GLIBC_TUNABLES = ("glibc.malloc.mmap_max", "glibc.malloc.mmap_threshold",
                  "glibc.malloc.trim_threshold", "glibc.malloc.top_pad")
M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers, from glibc's malloc.h
M_MMAP_MAX = -4


def user_setting(environ: Mapping[str, str]) -> str | None:
    """The environment variable by which the user set what the rule sets, if any."""
    for name in GLIBC_VARIABLES:
        if name in environ:
            return name
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(f"{name}=" in tunables for name in GLIBC_TUNABLES):
        return "GLIBC_TUNABLES"
    return None


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> str:
    """Apply the rule above to this process (idempotent); what it decided, in words."""
    environ = os.environ if environ is None else environ
    if environ.get(SWITCH, "").strip() == "0":
        return f"malloc as it is ({SWITCH}=0)"
    setting = user_setting(environ)
    if setting is not None:
        return f"malloc as {setting} sets it"
    if platform.libc_ver()[0] != "glibc":
        return "the C library's malloc as it is"
    import ctypes

    libc = ctypes.CDLL(None)
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, -1)):
        return "glibc malloc as it is (mallopt refused)"
    return "freed memory kept (glibc malloc: no mmap, no trim)"
