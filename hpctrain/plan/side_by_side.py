"""The time of a step whose layers run on groups of ranks side by side: the critical path of
the schedule every rank follows (:func:`hpctrain.plan.placement.schedule`).

Each step of the schedule (a layer, or a move into one) occupies its ranks: a layer those of its
layout, a move those of both its layouts. A step starts when the last of its ranks is free and
holds them all until it ends, so the ranks of concurrent groups advance each on their own clock,
and a step on every rank waits for the slowest group. The forward runs the schedule in order,
the backward reversed, each step taking its own forward or backward seconds. Without groups every
step occupies every rank and the time is the plain sum.

Clocks are kept per block of ranks between consecutive group boundaries (at most twice the
number of groups plus one), never per rank: O(steps × blocks) at any P.
"""

from __future__ import annotations

from collections.abc import Sequence

Ranks = tuple[tuple[int, int], ...]  # blocks (first, size) of ranks a step occupies


def critical_path(steps: Sequence[tuple[Ranks, float, float]], procs: int
                  ) -> tuple[float, float]:
    """(forward, backward) seconds of ``steps`` (each: the blocks of ranks it occupies, its
    forward and its backward seconds) run in order forward and reversed backward, on
    ``procs`` ranks (the module's text)."""
    cuts = sorted({0, procs, *(edge for ranks, _, _ in steps for first, size in ranks
                               for edge in (first, first + size))})
    pieces = list(zip(cuts, cuts[1:], strict=False))
    held_by: dict[Ranks, tuple[int, ...]] = {}  # a net's steps occupy a few sets of blocks
    for ranks, _, _ in steps:
        if ranks not in held_by:
            held_by[ranks] = tuple(i for i, (lo, hi) in enumerate(pieces) if any(
                first <= lo and hi <= first + size for first, size in ranks))
    occupied = [held_by[ranks] for ranks, _, _ in steps]
    totals = []
    for order, which in ((range(len(steps)), 1), (reversed(range(len(steps))), 2)):
        clock = [0.0] * len(pieces)
        for s in order:
            held = occupied[s]
            if not held:
                continue
            end = max(clock[i] for i in held) + steps[s][which]
            for i in held:
                clock[i] = end
        totals.append(max(clock))
    return totals[0], totals[1]
