"""Batch-norm statistics over groups of samples: which samples share a channel's mean and
variance, and which of those a rank holds.

Global statistics (one group: the whole mini-batch) make every plan compute exactly what one
process computes on the whole batch. Statistics over *groups* of consecutive samples ("ghost"
batch norm) are what data-parallel frameworks compute: PyTorch's DistributedDataParallel keeps
each rank's sub-batch to itself, MLPerf's ResNet-50 sums over a "bn group" of a few GPUs. Here a
group is a set of samples, not of ranks: the mini-batch of ``batch`` samples is cut into
``groups`` blocks by the block rule (:func:`~hpctrain.layout.partition.block_ranges`), so the
statistics, and so the numbers, are the same under every plan and on one process. A user names
the groups by ranks (``rank``: one group per rank's share of the batch; ``K``: K ranks' shares),
which :func:`groups_for` turns into a number of sample groups once P is known.

A layer's sample blocks must respect the groups: each rank's samples lie within one group (the
ranks of that group sum their parts) or are whole groups (the rank sums nothing over the batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from hpctrain.layout.partition import SplitError, block_ranges

GLOBAL = "global"
PER_RANK = "rank"


def groups_for(choice: str | int, procs: int, where: str) -> int:
    """The number of sample groups of a ``--bn-group`` / ``group=`` choice on ``procs`` ranks:
    1 (global), P (per rank) or P/K (K ranks per group). Refused, naming the fix, where K does
    not divide P."""
    if choice == GLOBAL:
        return 1
    if choice == PER_RANK:
        return procs
    if not isinstance(choice, int) or choice < 1:
        raise SplitError(f"{where}: batch-norm group {choice!r}: give global, rank or a "
                         f"number of ranks")
    if procs % choice:
        raise SplitError(f"{where}: batch-norm groups of {choice} ranks do not divide "
                         f"{procs} ranks; give a divisor of {procs}, rank or global")
    return procs // choice


@dataclass(frozen=True)
class HeldGroups:
    """The groups whose samples one sample block holds (some or all of each).

    ``first``: the index of the first; ``ranges``: each group's samples within the block, as
    (start, stop) relative to the block's first sample; ``sizes``: each group's whole size in
    samples; ``whole``: the block holds every sample of its groups (it shares them with no other
    sample block).
    """

    first: int
    ranges: tuple[tuple[int, int], ...]
    sizes: tuple[int, ...]
    whole: bool


@lru_cache(maxsize=4096)
def held_groups(batch: int, groups: int, lo: int, hi: int) -> HeldGroups:
    """The groups of ``batch`` samples cut ``groups`` ways that samples [lo, hi) touch.
    Refused where the block holds part of a group and more than that group."""
    cuts = block_ranges(batch, groups)
    first = _group_of(batch, groups, lo)
    last = _group_of(batch, groups, hi - 1)
    spans = [cuts[g] for g in range(first, last + 1)]
    whole = spans[0][0] == lo and spans[-1][1] == hi
    if not whole and first != last:
        raise SplitError(f"samples {lo}..{hi - 1} hold part of batch-norm group {first} "
                         f"(samples {spans[0][0]}..{spans[0][1] - 1}) and more: the groups must "
                         f"nest with the sample blocks")
    ranges = tuple((max(a, lo) - lo, min(b, hi) - lo) for a, b in spans)
    return HeldGroups(first, ranges, tuple(b - a for a, b in spans), whole)


def _group_of(batch: int, groups: int, sample: int) -> int:
    """Which group of the block rule holds ``sample``."""
    cuts = block_ranges(batch, groups)
    g = min(groups - 1, sample * groups // batch)
    while cuts[g][0] > sample:
        g -= 1
    while cuts[g][1] <= sample:
        g += 1
    return g


def check_nesting(batch: int, groups: int, parts: int, layer: str) -> None:
    """Refuse, naming the layer and the sizes, a cut of ``batch`` samples into ``parts`` sample
    blocks that does not nest with ``groups`` statistics groups (checked on every block; the
    answer is cached per sizes)."""
    if groups > batch:
        raise SplitError(f"layer {layer}: {groups} batch-norm groups need at least {groups} "
                         f"samples; raise --batch to {groups} or use larger groups")
    try:
        _nests(batch, groups, parts)
    except SplitError as err:
        raise SplitError(f"layer {layer}: {err}; split the batch {groups} ways or a multiple "
                         f"of it, or use other groups") from None


@lru_cache(maxsize=1024)
def _nests(batch: int, groups: int, parts: int) -> None:
    if parts % groups == 0 or groups % parts == 0:
        return  # block k·n//parts of one cut is a block boundary of the other: they nest
    for lo, hi in block_ranges(batch, parts):
        held_groups(batch, groups, lo, hi)


@lru_cache(maxsize=1024)
def sharing_blocks(batch: int, groups: int, parts: int) -> int:
    """The most sample blocks that share one group: those whose statistics are summed
    together (1 where each block holds whole groups)."""
    if parts <= groups:
        return 1
    if parts % groups == 0:
        return parts // groups
    cuts = block_ranges(batch, parts)
    counts: dict[int, int] = {}
    for lo, _ in cuts:
        g = _group_of(batch, groups, lo)
        counts[g] = counts.get(g, 0) + 1
    return max(counts.values())
