"""α–β times of the collectives hpctrain issues (pure functions of a profile and sizes).

Sizes ``n`` are bytes. ``p`` is the communicator size; every time is 0 when p = 1 or n = 0, as
the primitives return at once then.

- all-gather (Bruck), n = the gathered bytes:     α⌈log₂p⌉ + β·(p−1)/p·n
- reduce-scatter, n = the bytes each rank holds:  α⌈log₂p⌉ + β·(p−1)/p·n
- all-reduce (as the paper counts it):           2(α⌈log₂p⌉ + β·(p−1)/p·n)
- one halo message:                              α + β·n
- point-to-point exchange (a general move),
  costed at the busiest receiver:                 α·messages + β·n

A calibrated fit may price the bytes of β·(…) past its knee at a second rate (messages that
outgrow the caches, :class:`hpctrain.cost.machine.Fit`).
"""

from __future__ import annotations

import math

from hpctrain.cost.machine import COLLECTIVES, Machine


def log2_ceil(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


def terms(collective: str, p: int) -> tuple[float, float]:
    """``(m, c)`` with the time of ``collective`` on ``p`` ranks equal to α·m + β·c·n.

    ⌈log₂p⌉ and (p−1)/p for all-gather and reduce-scatter, twice both for all-reduce, 1 and 1
    for one halo message, p−1 and 1 for an all-to-all that sends to every other rank. The times
    below and the calibration's fits (α = a/m, β = b/c of a fitted line a + b·n) both use these.
    """
    if collective in ("allgather", "reduce_scatter"):
        return float(log2_ceil(p)), (p - 1) / p
    if collective == "allreduce":
        return 2.0 * log2_ceil(p), 2 * (p - 1) / p
    if collective == "alltoall":
        return float(p - 1), 1.0
    if collective == "halo":
        return 1.0, 1.0
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")


def _time(machine: Machine, collective: str, p: int, n: float) -> float:
    if p == 1 or n == 0:
        return 0.0
    m, c = terms(collective, p)
    return machine.link(collective, p).seconds(m, c * n)


def allgather_time(machine: Machine, p: int, n: float) -> float:
    return _time(machine, "allgather", p, n)


def reduce_scatter_time(machine: Machine, p: int, n: float) -> float:
    return _time(machine, "reduce_scatter", p, n)


def allreduce_time(machine: Machine, p: int, n: float) -> float:
    return _time(machine, "allreduce", p, n)


def halo_time(machine: Machine, n: float) -> float:
    return _time(machine, "halo", 2, n)


def exchange_time(machine: Machine, p: int, messages: int, n: float) -> float:
    """A general move on ``p`` ranks, at its busiest receiver: ``messages`` point-to-point
    messages from its peers, ``n`` bytes in all.

    α and β are the ``alltoall`` link's: its calibration sends one message to every other rank
    at once, the same per-message latency and per-byte cost under load as the exchange, whose
    messages all travel together too.
    """
    if p == 1 or messages == 0:
        return 0.0
    return machine.link("alltoall", p).seconds(messages, n)
