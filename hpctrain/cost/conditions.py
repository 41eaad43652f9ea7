"""Whether a measurement was taken on a quiet machine, and what to say when it was not.

A profile is measured once and then planned with by every run that names it (or by every run,
``local`` being the default), so figures taken while another job shared the cores mislead long
after that job ended: an all-reduce timed at 60 times its quiet time made the planner choose a
plan 31 % slower. ``calibrate`` therefore checks its conditions before and after it measures,
and the fits it makes:

- **the CPU each rank gets**: a short busy loop on every rank at once, its process CPU time over
  its wall time (:func:`cpu_share`). On a quiet node a rank gets all of a core, or
  cores / ranks where the job itself puts more ranks than cores on the node (which training
  would do too, so it is not a disturbance); another process on those cores takes its share.
  The loop is timed on every rank together, as the collectives are.
- **the fits**: a collective's α–β fit far off its own points (:data:`RESIDUAL_LIMIT`) says the
  repeats disagreed, as they do on a machine whose load comes and goes.

Where either fails the profile is still written (a node that is never quiet still needs one),
with a ``warning`` that every plan made with it repeats until it is measured again
(:func:`hpctrain.cost.machine.warning_lines`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

SPIN_SECONDS = 0.2
"""Wall time of the busy loop each rank runs to see how much of a core it gets."""
QUIET_SHARE = 0.75
"""The least share of what its node's cores allow a rank must get for the node to count as
quiet. A core shared with one other busy process gives about half."""
RESIDUAL_LIMIT = 0.75
"""The worst relative residual of a collective's fit beyond which its repeats disagreed. On
this 2-core machine quiet fits stayed within 4–35 % of their points (61 % once, under
``--quick``'s few repeats), and busy ones were 89–99 % off."""


def cpu_share(seconds: float = SPIN_SECONDS) -> float:
    """The share of one core this process got while it computed for ``seconds``: its CPU time
    over the wall time of a busy loop (1 on a core of its own)."""
    values = np.ones(256)
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        values.sum()
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def share_allowed(cpus: int, ranks: int) -> float:
    """The share of a core each of ``ranks`` ranks can get on ``cpus`` CPUs when nothing else
    runs: 1, or fewer where the job itself oversubscribes them."""
    return min(1.0, cpus / max(ranks, 1))


def cores_allowed(node: Any) -> float:
    """:func:`share_allowed` for the ranks of ``node`` (the ranks on this node), over the
    CPUs any of them may run on. Collective over ``node``; its cost grows with the ranks of one
    node, never with the job."""
    from hpctrain.device.cpus import affinity

    cpus = set().union(*node.allgather(affinity()))
    return share_allowed(len(cpus), node.Get_size())


def quiet_share(comm: Any, node: Any) -> float:
    """The least share of what its node's cores allow that any rank of ``comm`` got over the
    same busy loop (1: every rank got all it could). Collective over ``comm``."""
    from mpi4py import MPI

    allowed = cores_allowed(node)
    comm.Barrier()  # every rank loops at once, as they measure
    return float(comm.allreduce(cpu_share() / allowed, op=MPI.MIN))


def troubles(shares: dict[str, float], residuals: list[tuple[str, int, float]]) -> list[str]:
    """What makes the figures doubtful, one phrase each: the checks of ``shares`` (when: share)
    below :data:`QUIET_SHARE`, and the fits of ``residuals`` ((collective, ranks, worst
    residual)) beyond :data:`RESIDUAL_LIMIT`."""
    found = []
    low = [f"{share:.0%} {when}" for when, share in shares.items() if share < QUIET_SHARE]
    if low:
        found.append(f"the least share of its cores a rank got was {', '.join(low)} (another "
                     f"process ran)")
    off = [(residual, f"{collective} on {ranks}") for collective, ranks, residual in residuals
           if residual > RESIDUAL_LIMIT]
    if off:
        found.append(f"fits up to {max(off)[0]:.0%} off their points, their repeats "
                     f"disagreeing ({', '.join(name for _, name in off)})")
    return found


def warning_text(found: list[str]) -> str:
    """The profile's warning for ``found`` (empty for none)."""
    if not found:
        return ""
    return (f"measured on a busy machine: {'; '.join(found)}; calibrate again when the node "
            f"is quiet")
