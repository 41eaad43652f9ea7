"""The CPUs this process may run on. Its own module, light to import: the planner asks whether
a second core is free for a search beside its own (:mod:`hpctrain.plan.beside`) and must not
load the thread set-up (:mod:`hpctrain.device.threads`) to learn it."""

from __future__ import annotations

import os


def affinity() -> frozenset[int]:
    """The CPUs this process may run on (``os.sched_getaffinity``), or all of the machine's
    where there is no affinity to read."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity API (macOS): every CPU
        return frozenset(range(os.cpu_count() or 1))
