"""α–β times of the collectives hpctrain issues (pure functions of a profile and sizes).

Sizes ``n`` are bytes. ``p`` is the communicator size; every time is 0 when p = 1 or n = 0, as
the primitives return at once then.

- all-gather (Bruck), n = the gathered bytes:     α⌈log₂p⌉ + β·(p−1)/p·n
- reduce-scatter, n = the bytes each rank holds:  α⌈log₂p⌉ + β·(p−1)/p·n
- all-reduce (as the paper counts it):           2(α⌈log₂p⌉ + β·(p−1)/p·n)
- one halo message:                              α + β·n
- all-to-all, costed at the busiest receiver:     α·messages + β·n
"""

from __future__ import annotations

import math

from hpctrain.cost.machine import Machine


def log2_ceil(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


def allgather_time(machine: Machine, p: int, n: float) -> float:
    if p == 1 or n == 0:
        return 0.0
    fit = machine.link("allgather", p)
    return fit.alpha * log2_ceil(p) + fit.beta * (p - 1) / p * n


def reduce_scatter_time(machine: Machine, p: int, n: float) -> float:
    if p == 1 or n == 0:
        return 0.0
    fit = machine.link("reduce_scatter", p)
    return fit.alpha * log2_ceil(p) + fit.beta * (p - 1) / p * n


def allreduce_time(machine: Machine, p: int, n: float) -> float:
    if p == 1 or n == 0:
        return 0.0
    fit = machine.link("allreduce", p)
    return 2 * (fit.alpha * log2_ceil(p) + fit.beta * (p - 1) / p * n)


def halo_time(machine: Machine, n: float) -> float:
    if n == 0:
        return 0.0
    fit = machine.link("halo", 2)
    return fit.alpha + fit.beta * n


def alltoall_time(machine: Machine, p: int, messages: int, n: float) -> float:
    if p == 1 or messages == 0:
        return 0.0
    fit = machine.link("alltoall", p)
    return fit.alpha * messages + fit.beta * n
