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

A group is a :class:`~hpctrain.cost.nodes.Group` (a bare size p: p consecutive ranks). On a
flat profile only its size counts. On a profile with levels a group inside one node is priced
on the node's link at its size; a group that spans m nodes with k ranks on each
(:func:`~hpctrain.cost.nodes.span`) is priced as the hierarchical algorithm that MPI libraries
and NCCL run for it:

- all-reduce: reduce-scatter inside each node (k ranks), all-reduce of the node's n/k bytes
  between the m nodes (k such all-reduces at once, one per position on the node), all-gather
  inside each node;
- all-gather of n bytes: all-gather of n/k bytes between the nodes, then inside each node;
- reduce-scatter: inside each node, then of the n/k bytes between the nodes.

Each step between nodes is priced on the network's link for m nodes, its bytes slowed by
NIC sharing: when s ranks of a node talk across at once and the node has ν NICs, each moves at
1/max(1, s/ν) of a NIC's rate. Where calibrate measured the collective on that very shape (k
ranks on each of m nodes, every group at once: :meth:`hpctrain.cost.machine.Network.shape`),
the measured fit prices it instead, as one collective on p = k·m ranks: what the MPI library
really runs there, node-aware or not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from hpctrain.cost.machine import COLLECTIVES, Fit, Machine, found_on
from hpctrain.cost.nodes import Group, span


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


def _level_time(link: Fit, collective: str, p: int, n: float, share: float = 1.0) -> float:
    if p == 1 or n == 0:
        return 0.0
    m, c = terms(collective, p)
    return link.seconds(m, c * n * share)


def _as_group(group: Group | int) -> Group:
    return group if isinstance(group, Group) else Group(group, 1, group)


def collective_time(machine: Machine, collective: str, group: Group | int, n: float) -> float:
    """Seconds of ``collective`` of ``n`` bytes on ``group`` (see the module's text). Found
    once per machine, collective, group and size: a plan prices the same sums over the same
    groups for thousands of candidate layouts, and each bucket's latency many times more."""
    known = found_on(machine, "collectives")
    key = (collective, group, n)
    found = known.get(key)
    if found is None:
        if len(known) >= 1 << 16:  # a bound on memory, as the layouts' caches
            known.clear()
        found = known[key] = _collective_time(machine, collective, _as_group(group), n)
    return found


def _collective_time(machine: Machine, collective: str, group: Group, n: float) -> float:
    """:func:`collective_time`, computed."""
    p = group.size
    if p == 1 or n == 0:
        return 0.0
    net = machine.network
    if net is None:
        return _level_time(machine.link(collective, p), collective, p, n)
    where = span(group, machine.ranks_per_node)
    if where.inside_node:
        return _level_time(machine.link(collective, p), collective, p, n)
    k, nodes = where.per_node, where.nodes
    if k > 1 and (measured := net.shape(collective, k, nodes)) is not None:
        return _level_time(measured, collective, p, n)
    share = max(1.0, where.sharing / net.nics)

    def inside(step: str, size: float) -> float:
        return _level_time(machine.link(step, k), step, k, size)

    def across(step: str, size: float) -> float:
        return _level_time(net.link(step, nodes), step, nodes, size, share)

    if collective == "allreduce":
        return inside("reduce_scatter", n) + across("allreduce", n / k) + inside("allgather", n)
    if collective == "allgather":
        return across("allgather", n / k) + inside("allgather", n)
    if collective == "reduce_scatter":
        return inside("reduce_scatter", n) + across("reduce_scatter", n / k)
    raise ValueError(f"{collective!r} is priced by halo_time or exchange_time")


def allgather_time(machine: Machine, group: Group | int, n: float) -> float:
    return collective_time(machine, "allgather", group, n)


def reduce_scatter_time(machine: Machine, group: Group | int, n: float) -> float:
    return collective_time(machine, "reduce_scatter", group, n)


def allreduce_time(machine: Machine, group: Group | int, n: float) -> float:
    return collective_time(machine, "allreduce", group, n)


def bucket_latency(machine: Machine, group: Group | int) -> float:
    """The latency of one all-reduce on ``group``: α's terms, and β's for one byte. A bucket of
    gradients pays it once, however many layers it holds."""
    return allreduce_time(machine, group, 1.0)


def gradient_sum_seconds(machine: Machine, group: Group | int, n: float) -> float:
    """An all-reduce of ``n`` bytes of gradients as one part of a bucket
    (:class:`~hpctrain.comm.gradients.GradientReducer`): its bytes in full and its share
    min(1, n / bucket) of one all-reduce's latency, which the bucket pays once for all the
    gradients in it. Summed over the layers of a bucket that fills, this is the bucket's own
    time; a layer of a bucket or more goes alone and pays the latency in full. With buckets of
    0 bytes every sum goes alone. The last bucket of a communicator, partly filled, pays its
    latency whole (:mod:`hpctrain.plan.buckets` adds it, once per communicator)."""
    whole = allreduce_time(machine, group, n)
    bucket = machine.bucket_bytes
    if whole == 0.0 or n >= bucket:
        return whole
    return whole - bucket_latency(machine, group) * (1 - n / bucket)


def gradient_sums_seconds(machine: Machine, sums: Iterable[tuple[Group | int, float]]) -> float:
    """:func:`gradient_sum_seconds` of each of a layer's sums of gradients, (group, bytes),
    added up."""
    return sum(gradient_sum_seconds(machine, group, n) for group, n in sums)


def halo_time(machine: Machine, n: float, crossing: int = 0) -> float:
    """One halo message of ``n`` bytes; ``crossing`` > 0: it goes to another node, while that
    many ranks of the node send across at once (:func:`~hpctrain.cost.nodes.halo_crossings`)."""
    net = machine.network
    if net is None or not crossing:
        return _level_time(machine.link("halo", 2), "halo", 2, n)
    return _level_time(net.link("halo", 2), "halo", 2, n, max(1.0, crossing / net.nics))


def exchange_time(machine: Machine, p: int, messages: int, n: float,
                  peers: Group | None = None) -> float:
    """A general move on ``p`` ranks, at its busiest receiver: ``messages`` point-to-point
    messages from its peers, ``n`` bytes in all.

    α and β are the ``alltoall`` link's: its calibration sends one message to every other rank
    at once, the same per-message latency and per-byte cost under load as the exchange, whose
    messages all travel together too. With levels, ``peers`` is the group a rank's peers lie
    in: the messages from the peers on its own node go on the node's link, the rest (in
    proportion) on the network's, all the node's ranks receiving across at once.
    """
    if p == 1 or messages == 0:
        return 0.0
    link, near, far, share = _route(machine, p, peers)
    if far is None:
        return link.seconds(messages, n)
    return (link.seconds(messages * near, n * near)
            + far.seconds(messages * (1 - near), n * (1 - near) * share))


def exchange_times(machine: Machine, ranks: np.ndarray, peers: np.ndarray,
                   messages: np.ndarray, n: np.ndarray) -> np.ndarray:
    """:func:`exchange_time` of many general moves at once, move m on ``ranks[m]`` ranks with
    its peers in groups of ``peers[m]`` (``Group(peers[m], 1, ranks[m])``), from arrays of
    their ``messages`` and bytes ``n``: the same operations in the same order, so the same
    floats, element by element, each move's links and share of near peers looked up once
    per ranks and peers."""
    keys, index = np.unique(ranks.astype(np.int64) << 32 | peers, return_inverse=True)
    index = index.reshape(-1)
    found = [_route(machine, p, Group(q, 1, p)) if p > 1 else (Fit(0.0, 0.0), 1.0, None, 1.0)
             for p, q in ((key >> 32, key & 0xFFFFFFFF) for key in keys.tolist())]
    near = np.array([near for _, near, _, _ in found])[index]
    far = np.array([link is not None for _, _, link, _ in found])[index]
    local = _seconds_each([link for link, *_ in found], index, messages * near, n * near)
    if far.any():
        fits = [link or Fit(0.0, 0.0) for _, _, link, _ in found]
        share = np.array([share for *_, share in found])[index]
        local = np.where(far, local + _seconds_each(fits, index, messages * (1 - near),
                                                    n * (1 - near) * share), local)
    return np.where((messages == 0) | (ranks == 1), 0.0, local)


def _seconds_each(fits: list[Fit], index: np.ndarray, messages: np.ndarray,
                  byte_terms: np.ndarray) -> np.ndarray:
    """:meth:`Fit.seconds` of arrays of terms, element m by its own fit ``fits[index[m]]``:
    the same operations in the same order, so the same floats."""
    alpha, beta, knee, far_beta = (np.array([getattr(fit, key) for fit in fits])[index]
                                   for key in ("alpha", "beta", "knee", "far_beta"))
    near = np.minimum(byte_terms, knee)
    return alpha * messages + beta * near + far_beta * (byte_terms - near)


def _route(machine: Machine, p: int, peers: Group | None
           ) -> tuple[Fit, float, Fit | None, float]:
    """:func:`_exchange_route`, found once per machine, ranks and peers."""
    routes = found_on(machine, "routes")
    route = routes.get((p, peers))
    if route is None:
        route = routes[p, peers] = _exchange_route(machine, p, peers)
    return route


def _exchange_route(machine: Machine, p: int, peers: Group | None
                    ) -> tuple[Fit, float, Fit | None, float]:
    """(link, near, far link, share) of :func:`exchange_time` on ``p`` ranks with ``peers``:
    the one link that carries every message (far link None), or the node's link for the
    share ``near`` of them and the network's, its bytes slowed ``share`` times, for the
    rest."""
    net = machine.network
    if net is None:
        return machine.link("alltoall", p), 1.0, None, 1.0
    peers = peers or Group(p, 1, p)
    where = span(peers, machine.ranks_per_node)
    if where.inside_node:
        return machine.link("alltoall", peers.size), 1.0, None, 1.0
    near = (where.per_node - 1) / (peers.size - 1)  # the share of peers on the same node
    share = max(1.0, where.sharing / net.nics)
    return (machine.link("alltoall", where.per_node), near,
            net.link("alltoall", where.nodes), share)

