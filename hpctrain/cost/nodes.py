"""Where a group of ranks lies on the nodes of a machine with levels.

Ranks fill nodes in blocks: rank r runs on node ``r // R``, R ranks per node (what Slurm's
default block distribution and ``mpiexec -hosts a:R,b:R`` give). On a Pr×Pc grid rank r sits
at ``(i, j) = (r % Pr, r // Pr)`` (:mod:`hpctrain.layout.layout`), so

- a *model group* (one j, every i: the ranks that split a layer's channels or image rows) is Pr
  consecutive ranks, ``j·Pr … j·Pr + Pr − 1``. When Pr divides R it lies inside one node;
- a *batch group* (one i, every j: the ranks that hold the same weight shard) is every Pr-th
  rank, ``i, i + Pr, …``. It crosses nodes as soon as P > R: R/Pr of its ranks on each node when
  Pr divides R, one on each of Pc nodes when R divides Pr;
- the world is one group of P consecutive ranks.

Every group of a pattern runs its collective at the same time (every batch group sums its
gradients in the same layer), so the ranks of one node whose groups cross nodes all use the
node's NICs at once: :class:`Span` counts them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class Group:
    """A pattern of equal groups that tile ``procs`` ranks: each holds ``size`` ranks
    ``stride`` apart. On a Pr×Pc grid of P ranks, ``Group(Pr, 1, P)`` is a model group,
    ``Group(Pc, Pr, P)`` a batch group and ``Group(P, 1, P)`` the world."""

    size: int
    stride: int = 1
    procs: int = 0  # 0: size·stride, one tiling

    def members(self) -> list[range]:
        """Every group's ranks."""
        block = self.size * self.stride
        return [range(base + first, base + first + block, self.stride)
                for base in range(0, max(self.procs, block), block)
                for first in range(self.stride)]


@dataclass(frozen=True)
class Span:
    """How the busiest group of a pattern lies on nodes.

    ``per_node``: the most of its ranks on one node (k); ``nodes``: the nodes it spans (m);
    ``sharing``: the most ranks of one node that talk across the network at once, in this
    group or another of the pattern (the ranks that share the node's NICs).
    """

    per_node: int
    nodes: int
    sharing: int

    @property
    def inside_node(self) -> bool:
        return self.nodes == 1


def span(group: Group, ranks_per_node: int) -> Span:
    """Where ``group`` lies on nodes of ``ranks_per_node`` ranks (see the module's text)."""
    return _span(group, ranks_per_node)


@lru_cache(maxsize=4096)
def _span(group: Group, per_node: int) -> Span:
    size, stride = group.size, group.stride
    if size <= 1:
        return Span(1, 1, 0)
    if stride == 1 and per_node % size == 0:  # model groups inside a node
        return Span(size, 1, 0)
    if stride == 1 and size % per_node == 0:  # whole nodes: every rank talks across
        return Span(per_node, size // per_node, per_node)
    if stride > 1 and per_node % stride == 0:  # R/Pr ranks of every batch group on a node
        k = per_node // stride
        if size <= k:
            return Span(size, 1, 0)
        if size % k == 0:
            return Span(k, size // k, per_node)
    if stride > 1 and stride % per_node == 0:  # one rank per node, R groups on each node
        return Span(1, size, per_node)
    return _by_rank(group, per_node)


def _by_rank(group: Group, per_node: int) -> Span:
    """Any other pattern (a size that neither divides R nor is a multiple of it), group by
    group: O(P), once per pattern."""
    worst_k, worst_nodes = 1, 1
    crossing: dict[int, int] = {}  # node → its ranks in groups that cross nodes
    for ranks in group.members():
        counts: dict[int, int] = {}
        for r in ranks:
            counts[r // per_node] = counts.get(r // per_node, 0) + 1
        worst_k = max(worst_k, max(counts.values()))
        worst_nodes = max(worst_nodes, len(counts))
        if len(counts) > 1:
            for node, count in counts.items():
                crossing[node] = crossing.get(node, 0) + count
    return Span(worst_k, worst_nodes, max(crossing.values(), default=0))


@lru_cache(maxsize=4096)
def halo_crossings(parts: int, procs: int, per_node: int, stride: int = 1) -> int:
    """For chains of ``parts`` ranks ``stride`` apart (by default consecutive: model groups,
    whose image rows exchange halos with both neighbours), the most ranks of one node that send
    a halo to another node at once: 0 when every chain lies inside a node, else 1 or 2 (a
    node's first and last rank) for consecutive chains, up to every rank of a node for chains
    of a larger stride."""
    if parts <= 1 or per_node % (parts * stride) == 0:
        return 0
    block = parts * stride  # the chains' pattern repeats every block ranks, the nodes' every R
    ranks = max(procs, block)
    period = math.lcm(block, per_node)
    if ranks % period == 0:  # every period alike: one stands for them all
        ranks = period
    sender = np.arange(ranks, dtype=np.int64)
    sender = sender[(sender % block) // stride < parts - 1]  # a rank with a next in its chain
    nodes = np.concatenate([sender // per_node, (sender + stride) // per_node])
    apart = np.tile(nodes[:len(sender)] != nodes[len(sender):], 2)
    return int(np.bincount(nodes[apart]).max(initial=0))
