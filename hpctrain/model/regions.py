"""Fork–join regions of a net: where independent branches could run side by side.

A *fork* is a tensor two or more layers read (a layer's output, or the net's input). Its *join*
is the first layer every path from the fork passes through: its immediate post-dominator in the
net's graph. The layers on those paths, strictly between the two, are the region's *inside*, and
the region stands alone when nothing outside feeds the inside or the join: every layer inside
reads the fork or another layer inside, and so does the join. (Nothing inside is read from
outside but by the join: a reader outside would be on a path from the fork, hence inside.)

The inside falls apart into *branches*, the sets of layers connected to each other; an edge
straight from the fork to the join (a ResNet block's identity shortcut) is an empty branch. An
Inception module is one region of four branches (three in the modules that halve the image,
one of them a max-pool without weights); a ResNet block one of two, the main path and the
shortcut. Regions nest: Inception-v3's last two modules split two of their branches in two
again, each pair joined by a concat of its own inside the branch. A fork whose join also reads
layers outside its paths makes no region.

Regions are computed from the graph alone: positions in file order, which is a topological order
(every layer reads only earlier ones), so the post-dominators come out of one backward pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpctrain.model.kinds import KINDS
from hpctrain.model.net import NetSpec

INPUT = -1  # the position of the net's input as a fork


@dataclass(frozen=True)
class Region:
    """The layers between ``fork`` (a position; ``INPUT``, -1, for the net's input) and ``join``,
    as ``branches``: each branch's layers in net order, branches ordered by their first layer, an
    empty tuple for each edge straight from the fork to the join (listed last)."""

    fork: int
    join: int
    branches: tuple[tuple[int, ...], ...]

    @property
    def inside(self) -> tuple[int, ...]:
        """Every layer strictly between the fork and the join, in net order."""
        return tuple(sorted(k for branch in self.branches for k in branch))

    def weighted_branches(self, net: NetSpec) -> int:
        """How many branches hold a layer with weights (a convolution or a linear layer): the
        branches worth a group of ranks of their own."""
        return sum(any(KINDS[net.layers[k].kind].weighted for k in branch)
                   for branch in self.branches)


def post_dominators(count: int, readers: Mapping[int, Sequence[int]]) -> list[int]:
    """The immediate post-dominator of each of ``count`` nodes in topological order, each read
    by ``readers[node]`` (later nodes): ``count`` (a virtual exit after them all) for a node
    nothing reads.

    One backward pass: a node's post-dominator is the meeting point, in the post-dominator tree
    already built for every later node, of its readers, found by walking the lower of two
    positions up (Cooper, Harvey and Kennedy's ``intersect``: a post-dominator lies after the
    node it post-dominates).

    >>> post_dominators(4, {0: (1, 2), 1: (3,), 2: (3,)})  # a diamond
    [3, 3, 3, 4]
    """
    ipdom = [count] * count
    for k in range(count - 1, -1, -1):
        if readers.get(k):
            ipdom[k] = _meet_all(ipdom, readers[k])
    return ipdom


def _meet_all(ipdom: list[int], nodes: Sequence[int]) -> int:
    """The first node all of ``nodes`` pass through on every way out."""
    meet = nodes[0]
    for other in nodes[1:]:
        meet = _meet(ipdom, meet, other)
    return meet


def _meet(ipdom: list[int], a: int, b: int) -> int:
    """The first layer both ``a`` and ``b`` pass through on every way out."""
    while a != b:  # the lower one is never the exit, which lies after every layer
        if a < b:
            a = ipdom[a]
        else:
            b = ipdom[b]
    return a


def fork_join_regions(net: NetSpec) -> list[Region]:
    """Every region of ``net`` that stands alone (see the module's docstring), by fork in net
    order; none for a chain."""
    exit_ = len(net.layers)
    readers = net.consumers
    ipdom = post_dominators(exit_, readers)
    regions = []
    for fork in [INPUT, *range(exit_)]:
        if len(readers.get(fork, ())) < 2:
            continue
        join = _meet_all(ipdom, readers[fork])
        if join == exit_:  # the paths never meet in one layer
            continue
        inside = _inside(net, fork, join)
        if all(p == fork or p in inside for k in (*inside, join) for p in net.producers(k)):
            regions.append(Region(fork, join, _branches(net, fork, join, inside)))
    return regions


def _inside(net: NetSpec, fork: int, join: int) -> set[int]:
    """The layers reached from ``fork`` before ``join``: every path from the fork meets the
    join, and nothing before the fork is reached."""
    found: set[int] = set()
    todo = [k for k in net.consumers.get(fork, ()) if k != join]
    while todo:
        k = todo.pop()
        if k in found:
            continue
        found.add(k)
        todo += [r for r in net.consumers.get(k, ()) if r != join]
    return found


def _branches(net: NetSpec, fork: int, join: int, inside: set[int]
              ) -> tuple[tuple[int, ...], ...]:
    """``inside`` cut into its connected parts (by edges between its own layers), then an empty
    branch per edge from the fork straight into the join."""
    part = {k: k for k in inside}

    def root(k: int) -> int:
        while part[k] != k:
            part[k] = part[part[k]]
            k = part[k]
        return k

    for k in inside:
        for p in net.producers(k):
            if p in inside:
                part[root(k)] = root(p)
    groups: dict[int, list[int]] = {}
    for k in sorted(inside):
        groups.setdefault(root(k), []).append(k)
    branches = sorted((tuple(g) for g in groups.values()), key=lambda g: g[0])
    direct = sum(p == fork for p in net.producers(join))
    return (*branches, *[()] * direct)
