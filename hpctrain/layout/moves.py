"""Moves between two layouts of one tensor: the methods, what one rank does in each, and their
price.

Pure maths, no MPI. A move takes a tensor held on layout ``src`` to layout ``dst`` on the same P
ranks; :func:`move_between` picks its method, the first of :data:`METHODS` whose rule holds,
and gives the :class:`Move`. Execution (:class:`~hpctrain.comm.redistribute.Redistribute`), the
cost model (:mod:`hpctrain.plan.pricing`) and timing (:mod:`hpctrain.record.timing`) all work from
that one object, so prediction and execution cannot disagree. Rank r sits at
``(i, j) = (r % Pr, r // Pr)`` on each layout's grid (see :mod:`hpctrain.layout.layout`). The
methods:

- :class:`IdentityMove` (``identity``): the layouts are equal; nothing moves.
- :class:`SliceMove` (``slice``): every rank's new block lies inside its old one; forward a
  slice, backward the gradient padded with zeros. No messages.
- :class:`AllGatherMove` (``allgather``): each model group of the target grid holds, between its
  members, exactly the target block, cut along one axis in member order; forward
  ``Allgatherv`` over the model communicator, backward its adjoint ``Reduce_scatter``.
- :class:`GeneralMove` (``general``): anything else; each rank sends the pieces of its block
  that other ranks need, point to point, and the backward sends the gradients of the same
  pieces back and adds them.

A rank's share of a general move is found by interval arithmetic on the two layouts: which
blocks of the other layout overlap its own block along the batch axis (block rule) and along the
split axes (bisection on the split ranges). It costs O(pieces of this rank), never O(P).
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import numpy as np

from hpctrain.cost.collectives import (
    allgather_time,
    exchange_time,
    exchange_times,
    reduce_scatter_time,
)
from hpctrain.cost.machine import Machine
from hpctrain.cost.nodes import Group
from hpctrain.layout.layout import (
    BATCH_AXIS,
    REPLICAS,
    Box,
    Layout,
    intersect,
    relative_slices,
)
from hpctrain.layout.partition import BlockRanges, block_range, block_ranges

Range = tuple[int, int]


def _check_pair(src: Layout, dst: Layout) -> None:
    if src.shape != dst.shape:
        raise ValueError(f"cannot redistribute shape {src.shape} into {dst.shape}")
    if src.procs != dst.procs:
        raise ValueError(f"cannot redistribute from a world of {src.procs} ranks to one of "
                         f"{dst.procs}; a move keeps the world")


def same_ranks(src: Layout, dst: Layout) -> bool:
    """Whether the two layouts lie on the same ranks (the world, or one group)."""
    return src.first == dst.first and src.size == dst.size


class Move:
    """A tensor moved from layout ``src`` to ``dst`` on the same ranks, by one method.

    A method is a subclass: its rule (:meth:`fits`, from the two layouts in O(1)), what one rank
    does in it (a method of its own: :meth:`SliceMove.slices`, :meth:`AllGatherMove.gathered`,
    :meth:`GeneralMove.exchange`), its time at the busiest rank (:meth:`seconds`) and the
    buffers its execution allocates (:meth:`buffer_bytes`).
    """

    method: ClassVar[str]  # the name a plan table shows ("fed by")
    moves_data: ClassVar[bool] = True  # False: nothing runs, and nothing is timed

    def __init__(self, src: Layout, dst: Layout) -> None:
        self.src, self.dst = src, dst

    @staticmethod
    def fits(src: Layout, dst: Layout) -> bool:
        """Whether this method moves ``src`` to ``dst`` exactly."""
        raise NotImplementedError

    def seconds(self, machine: Machine, itemsize: int) -> tuple[float, float]:
        """(forward, backward) seconds at the busiest rank, for entries of ``itemsize`` bytes."""
        return 0.0, 0.0

    def buffer_bytes(self, itemsize: int) -> float:
        """Bytes the execution allocates for a moment at the busiest rank, in the larger of its
        two directions (the move's result, and its buffers)."""
        return 0.0

    def _blocks(self, itemsize: int) -> tuple[float, float]:
        """Bytes of the largest source block and of the largest target block."""
        return (math.prod(self.src.largest_block) * itemsize,
                math.prod(self.dst.largest_block) * itemsize)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.src.describe()} -> {self.dst.describe()})"


class IdentityMove(Move):
    """The layouts are equal: nothing moves, and the array is handed on as it is."""

    method = "identity"
    moves_data = False

    @staticmethod
    def fits(src: Layout, dst: Layout) -> bool:
        return src == dst


class SliceMove(Move):
    """Every rank's new block lies inside its old one: forward a slice (a contiguous copy),
    backward the gradient padded with zeros.

    Holds when ``src`` is not split over its Pr ranks and ``Pr_src`` is a multiple of
    ``Pr_dst``: rank r's batch block on the target grid (index ``r // Pr_dst`` of
    ``Pc_dst = m·Pc_src`` parts, ``m = Pr_src / Pr_dst``) lies inside its block on the source
    grid (index ``r // Pr_src``), by the nesting of the block rule
    (:mod:`hpctrain.layout.partition`), and ``src`` holds every entry of the other axes.
    """

    method = "slice"

    @staticmethod
    def fits(src: Layout, dst: Layout) -> bool:
        if src.is_grid and dst.is_grid:
            return src.split_axis is None and src.grid[0] % dst.grid[0] == 0
        return _cuts_more(src, dst)

    def slices(self, rank: int) -> tuple[slice, ...]:
        """The slices that pick ``rank``'s new block out of its old one."""
        return relative_slices(self.dst.box(rank), self.src.box(rank))

    def buffer_bytes(self, itemsize: int) -> float:
        source, target = self._blocks(itemsize)
        return source + target  # the old block, and the slice's copy or the padded gradient


class AllGatherMove(Move):
    """Each model group of the target grid gathers its block along one axis: forward
    ``Allgatherv`` over the model communicator, backward its adjoint ``Reduce_scatter``.

    Holds when ``dst`` is replicated over ``Pr_dst > 1`` ranks and either ``src`` is split on
    the same grid (the model group's split ranges tile the axis in order), or ``src`` is a batch
    split on 1×P (the group's P-way batch blocks ``j·Pr … j·Pr + Pr − 1`` tile its Pc-way block
    ``j``, again by nesting).
    """

    method = "allgather"

    @staticmethod
    def fits(src: Layout, dst: Layout) -> bool:
        if src.is_grid and dst.is_grid:
            return dst.split_axis is None and dst.grid[0] > 1 and (
                (src.grid == dst.grid and src.split_axis is not None)
                or src.grid == (1, src.size))
        return _gathered_digit(src, dst) is not None

    @property
    def digits(self) -> tuple[int, ...]:
        """The digits of the target's mesh whose ranks gather together, the model group of a
        grid or the one digit a mesh stops cutting."""
        dst = self.dst
        if not (self.src.is_grid and dst.is_grid):
            return (_gathered_digit(self.src, dst),)
        return dst.digits_of((REPLICAS,))

    def gathered(self, rank: int) -> tuple[int, tuple[Range, ...]]:
        """(axis, ranges): ``rank``'s group gathers along ``axis``, member k holding
        ``ranges[k]`` of it."""
        src, dst = self.src, self.dst
        if not (src.is_grid and dst.is_grid):
            axis = src.axes[_gathered_digit(src, dst)]
            return axis, src.split_ranges or block_ranges(src.shape[axis], src.parts[axis])
        pr = dst.grid[0]
        if src.grid == dst.grid:
            return src.split_axis, src.split_ranges
        local = rank - dst.first
        first = local - local % pr  # the group's ranks on 1×P: first … first + Pr − 1
        n = src.shape[BATCH_AXIS]
        return BATCH_AXIS, tuple(block_range(n, src.size, first + i) for i in range(pr))

    def seconds(self, machine: Machine, itemsize: int) -> tuple[float, float]:
        group, block = self.dst.digit_group(self.digits), self._blocks(itemsize)[1]
        return allgather_time(machine, group, block), reduce_scatter_time(machine, group, block)

    def buffer_bytes(self, itemsize: int) -> float:
        return 2 * sum(self._blocks(itemsize))  # a contiguous copy, the receive buffer, result


def _cuts_more(src: Layout, dst: Layout) -> bool:
    """Whether ``dst`` is ``src`` on the same mesh with some replica digits made cuts: then
    every rank's new block lies inside its old one."""
    if src.mesh != dst.mesh or src.split_ranges != dst.split_ranges and src.cut_axes:
        return False
    return all(a == REPLICAS or a == b for a, b in zip(src.axes, dst.axes, strict=True))


def _gathered_digit(src: Layout, dst: Layout) -> int | None:
    """The one digit of a common mesh on which ``src`` cuts an axis (no other digit cuts it)
    and ``dst`` holds replicas, every other digit alike; None when there is none."""
    if src.mesh != dst.mesh:
        return None
    differ = [k for k, (a, b) in enumerate(zip(src.axes, dst.axes, strict=True)) if a != b]
    if len(differ) != 1:
        return None
    k = differ[0]
    axis = src.axes[k]
    if dst.axes[k] != REPLICAS or axis in (REPLICAS, BATCH_AXIS) or src.axes.count(axis) != 1:
        return None
    return k


@dataclass(frozen=True)
class Exchange:
    """What one rank does in a general move: ``sends`` lists (receiver, global box) and
    ``receives`` (sender, global box) for the pieces that travel, and ``local`` the boxes this
    rank keeps from its own block; each box is one piece, one message per pair of ranks."""

    sends: tuple[tuple[int, Box], ...] = ()
    receives: tuple[tuple[int, Box], ...] = ()
    local: tuple[Box, ...] = ()


class GeneralMove(Move):
    """Anything else: each rank sends the pieces of its block that other ranks need, point to
    point, and the backward sends the gradients of the same pieces back and adds them. Exact for
    every pair of layouts; priced at its busiest receiver, the same in both directions.

    The other methods' rules are structural: for degenerate sizes (an axis shorter than its
    number of parts, so that some block is empty) a slice or an all-gather may exist that they
    miss. Such a move is then general: it costs speed, never correctness.
    """

    method = "general"

    @staticmethod
    def fits(src: Layout, dst: Layout) -> bool:
        return True

    def exchange(self, rank: int) -> Exchange:
        """``rank``'s part. Where several ranks hold the same source block (``src`` replicated
        over its Pr ranks), a rank that holds it takes it from itself, and any other from the
        replica in the same position ``receiver % Pr_src`` of the block's batch group: every
        piece has one sender, so the backward returns each gradient to exactly one owner.
        Equivalently, a replica sends only to ranks congruent to itself modulo ``Pr_src``.

        Example: (8, 4, 6, 6) from a channel split on 4×1 to a batch split on 1×4. Rank 1
        holds channel 1 of samples 0..7 and needs samples 2..3: it keeps channel 1 of them,
        receives channels 0, 2 and 3 from ranks 0, 2 and 3, and sends channel 1 of samples
        0..1, 4..5 and 6..7 to ranks 0, 2 and 3.
        """
        src, dst = self.src, self.dst
        receives, local = [], []
        for sender, box in _receives(src, dst, rank):
            if sender == rank:
                local.append(box)
            else:
                receives.append((sender, box))
        sends = [(receiver, box) for receiver, box in _sends(src, dst, rank) if receiver != rank]
        return Exchange(tuple(sends), tuple(receives), tuple(local))

    def seconds(self, machine: Machine, itemsize: int) -> tuple[float, float]:
        if not same_ranks(self.src, self.dst):
            t = _between_groups_time(self.src, self.dst, machine, itemsize)
            return t, t
        if self.src.is_grid and self.dst.is_grid:
            share, messages = _busiest_receiver((self.src.grid, self.src.split_axis),
                                                (self.dst.grid, self.dst.split_axis))
        else:
            share, messages = _busiest_receiver_on_meshes(self.src, self.dst)
        # a rank's peers lie among the aligned max(Pr_src, Pr_dst) consecutive ranks around
        # it (the batch blocks of the finer grid nest in those of the coarser)
        peers = Group(max(self.src.grid[0], self.dst.grid[0]), 1, self.src.size)
        target = math.prod(self.dst.largest_block) * itemsize  # the larger target block
        t = exchange_time(machine, self.src.size, messages, share * target, peers)
        return t, t

    def buffer_bytes(self, itemsize: int) -> float:
        return 2 * sum(self._blocks(itemsize))  # the send and receive buffers, the result


METHODS: tuple[type[Move], ...] = (IdentityMove, SliceMove, AllGatherMove, GeneralMove)
"""The methods in order of preference; a move takes the first whose rule holds."""


def move_between(src: Layout, dst: Layout) -> Move:
    """The cheapest exact method that moves ``src`` to ``dst``, from the two layouts in O(1).

    A layout with Pr = 1 is never split (``Layout`` drops the split), so a 1×P source is always
    unsplit. Examples, P = 4: 1×4 → 4×1 replicated is an all-gather (along the batch); 4×1
    replicated → 4×1 channel split is a slice; 4×1 channel split → 1×4 is general.
    """
    if src.shape != dst.shape or src.procs != dst.procs:  # a planner asks tens of thousands
        _check_pair(src, dst)  # of times: the refusal called only where it refuses
    if not same_ranks(src, dst):  # between groups (or a group and the world): point to point
        return GeneralMove(src, dst)
    for method in METHODS[:-1]:  # a loop, not a generator: it runs once per distinct move
        if method.fits(src, dst):
            return method(src, dst)
    return GeneralMove(src, dst)  # the last method fits every pair


def methods_between(srcs: Sequence[Layout | None], dsts: Sequence[Layout | None],
                    si: np.ndarray, di: np.ndarray) -> np.ndarray:
    """The method :func:`move_between` picks for each move ``srcs[si[m]]`` → ``dsts[di[m]]``,
    as its place in :data:`METHODS`, every pair at once (a None layout is never indexed).

    A planner asks for tens of thousands of distinct moves of one shape, and the Python of one
    call per move was much of their price. The same rules, read from a row of facts per
    layout: between groups, general; then the first rule that holds. Between two 1.5D grids
    the slice's and the all-gather's rules read the grids and the split axes alone. Otherwise
    both rules need one mesh for the two layouts: where the meshes differ the move is
    general, and the few pairs on one mesh are given to :func:`move_between`."""
    known = [layout for layout in (*srcs, *dsts) if layout is not None]
    for layout in known:  # a planner asks tens of thousands of times: refused only where
        if layout.shape != known[0].shape or layout.procs != known[0].procs:  # it refuses
            _check_pair(known[0], layout)
    ids: dict[Layout, int] = {}
    meshes: dict[tuple[int, ...], int] = {}

    def facts(layouts: Sequence[Layout | None], index: np.ndarray) -> np.ndarray:
        rows = [(-1,) * 8 if layout is None else
                (ids.setdefault(layout, len(ids)), meshes.setdefault(layout.mesh, len(meshes)),
                 *_method_facts(layout)) for layout in layouts]
        return np.array(rows, dtype=np.int64).reshape(-1, 8)[index]

    src, dst = facts(srcs, si), facts(dsts, di)
    # columns: the layout, its mesh, first rank, ranks, 1.5D grid, split axis (-1: none), Pr, Pc
    same = (src[:, 2] == dst[:, 2]) & (src[:, 3] == dst[:, 3])
    grids = (src[:, 4] == 1) & (dst[:, 4] == 1)
    s_pr, d_pr, s_split, d_split = src[:, 6], dst[:, 6], src[:, 5], dst[:, 5]
    slices = grids & (s_split == -1) & (s_pr % d_pr == 0)
    gathers = grids & (d_split == -1) & (d_pr > 1) & (
        ((s_pr == d_pr) & (src[:, 7] == dst[:, 7]) & (s_split != -1))
        | ((s_pr == 1) & (src[:, 7] == src[:, 3])))
    found = np.full(len(si), METHODS.index(GeneralMove), dtype=np.int64)
    found[same & gathers] = METHODS.index(AllGatherMove)
    found[same & slices] = METHODS.index(SliceMove)
    equal = same & (src[:, 0] == dst[:, 0])
    found[equal] = METHODS.index(IdentityMove)
    for m in np.flatnonzero(same & ~grids & ~equal & (src[:, 1] == dst[:, 1])).tolist():
        found[m] = METHODS.index(type(move_between(srcs[si[m]], dsts[di[m]])))
    return found


@lru_cache(maxsize=65536)
def _method_facts(layout: Layout) -> tuple[int, ...]:
    """What :func:`methods_between` reads of a layout besides itself and its mesh: its first
    rank, its ranks, whether it is a 1.5D grid, its split axis there (-1: none, or not a
    grid), and its grid's Pr and Pc."""
    split = layout.cut_axes[0] if layout.is_grid and layout.cut_axes else -1
    return (layout.first, layout.size, int(layout.is_grid), split, *layout.grid)


def parts_overlapping(layout: Layout, axis: int, lo: int, hi: int) -> list[tuple[int, Range]]:
    """The parts of ``layout``'s cut of ``axis`` that meet ``[lo, hi)``, each with that meet.

    An axis cut into ``parts`` blocks by the block rule: block k meets ``[lo, hi)`` iff
    ``k·n // parts < hi`` and ``(k+1)·n // parts > lo``, i.e. ``⌈(lo+1)·parts / n⌉ − 1 ≤ k ≤
    ⌊(hi·parts − 1) / n⌋``. An axis cut by explicit ranges (a flattened split), which tile it in
    order, is searched by bisection. An axis not cut is one part, 0, holding everything. Empty
    meets are left out.
    """
    if hi <= lo:
        return []
    parts = layout.parts[axis]
    if parts == 1:
        return [(0, (lo, hi))]
    ranges = layout.split_ranges if axis != BATCH_AXIS else None
    if ranges is None or isinstance(ranges, BlockRanges):
        n = layout.shape[axis]
        first = max(-(-(lo + 1) * parts // n) - 1, 0)
        last = min((hi * parts - 1) // n, parts - 1)
        found_ranges = [block_range(n, parts, k) for k in range(first, last + 1)]
    else:
        first = bisect_right(ranges, lo, key=lambda r: r[1])
        last = bisect_left(ranges, hi, key=lambda r: r[0]) - 1
        found_ranges = ranges[first:last + 1]
    found = []
    for k, (a, b) in enumerate(found_ranges, start=first):
        a, b = max(a, lo), min(b, hi)
        if a < b:
            found.append((k, (a, b)))
    return found


def _empty(box: Box) -> bool:
    return any(hi <= lo for lo, hi in box)


def _meets(layout: Layout, box: Box) -> list[tuple[tuple[int, ...], Box]]:
    """The blocks of ``layout`` that meet ``box``, as (block index per axis, the meet)."""
    found: list[tuple[tuple[int, ...], Box]] = [((), ())]
    for axis, span in enumerate(box):
        found = [((*index, k), (*meet, part)) for index, meet in found
                 for k, part in parts_overlapping(layout, axis, *span)]
    return found


def _receives(src: Layout, dst: Layout, rank: int) -> list[tuple[int, Box]]:
    """(sender, box) of every piece of ``rank``'s target block, its own pieces included: each
    from the copy of its source block whose replica index is ``rank``'s own (so ``rank``
    itself where it holds that block)."""
    need = dst.box(rank)
    if _empty(need):
        return []
    replica = src.replica_index(rank)
    return [(src.rank_of(index, replica), box) for index, box in _meets(src, need)]


def _sends(src: Layout, dst: Layout, rank: int) -> list[tuple[int, Box]]:
    """(receiver, box) of every piece ``rank`` sends from its source block, to itself included:
    to every copy of each target block that meets it, whose holder's replica index on the
    source is ``rank``'s (the choice of :func:`_receives`)."""
    have = src.box(rank)
    if _empty(have):
        return []
    replica, copies = src.replica_index(rank), src.replicas
    pieces = []
    for index, box in _meets(dst, have):
        for copy in _congruent_copies(dst, index, src, replica, copies):
            pieces.append((copy, box))
    return pieces


def _congruent_copies(dst: Layout, index: tuple[int, ...], src: Layout, replica: int,
                      copies: int) -> list[int]:
    """The ranks that hold block ``index`` of ``dst`` and whose replica index on ``src`` is
    ``replica``. On 1.5D grids the replica index is ``rank % Pr_src`` and the copies of a block
    are consecutive ranks, so they are stepped through directly; otherwise every copy is
    checked."""
    n = dst.replicas
    first = dst.rank_of(index, 0)
    if n == 1:
        return [first] if copies == 1 or src.replica_index(first) == replica else []
    if src.is_grid and dst.is_grid:  # copies first … first + n − 1; r ≡ src.first + replica
        step = copies                   # (mod Pr_src) at the ranks of replica index ``replica``
        start = first + (src.first + replica - first) % step if step > 1 else first
        return list(range(start, first + n, step))
    found = (dst.rank_of(index, c) for c in range(n))
    return [q for q in found if copies == 1 or src.replica_index(q) == replica]


@dataclass(frozen=True)
class Piece:
    """One block moved by a redistribution: ``box`` goes from rank ``sender`` to ``receiver``."""

    sender: int
    receiver: int
    box: Box


def transfer_pieces(src: Layout, dst: Layout) -> list[Piece]:
    """Every piece of the move on every rank, by brute force: O(P²) box intersections.

    The reference that the tests check :meth:`GeneralMove.exchange` against, and that the move
    benchmark times for contrast; nothing else calls it. Same choice of one sender per piece as
    :meth:`GeneralMove.exchange`.
    """
    _check_pair(src, dst)
    owners: dict[Box, list[int]] = {}
    for rank in src.ranks:
        owners.setdefault(src.box(rank), []).append(rank)
    pieces = []
    for receiver in dst.ranks:
        need = dst.box(receiver)
        for block, holders in owners.items():
            box = intersect(block, need)
            if box is None:
                continue
            sender = holders[src.replica_index(receiver)]  # itself, if it holds it
            pieces.append(Piece(sender, receiver, box))
    return pieces


# -- the busiest receiver of a general move (its price) -----------------------------------------

def _intervals(ranks: np.ndarray, grid: tuple[int, int], split: int | None, axis: int
               ) -> tuple[np.ndarray, np.ndarray, int]:
    """Each rank's interval of ``axis`` as fractions of its length, and the number of parts."""
    pr, pc = grid
    if axis == BATCH_AXIS:
        j = ranks // pr
        return j / pc, (j + 1) / pc, pc
    if axis == split:
        i = ranks % pr
        return i / pr, (i + 1) / pr, pr
    return np.zeros(len(ranks)), np.ones(len(ranks)), 1


@lru_cache(maxsize=65536)
def _busiest_receiver(src: tuple, dst: tuple) -> tuple[float, int]:
    """For layouts given as (grid, split axis): the largest share of its block a rank must
    receive from others in a general move, and the most messages a rank receives, one per
    source block it overlaps other than its own (even splits).

    In closed form when every fraction of a block boundary is exact in binary floating point
    (the grids' sides that cut an axis are powers of two, as for any P = 2^k); otherwise rank
    by rank, whose rounding differs from rank to rank in the last bit, which the plan keeps."""
    (src_grid, src_split), (dst_grid, dst_split) = src, dst
    cuts = [src_grid[1], dst_grid[1]]  # the batch is always cut Pc ways
    cuts += [grid[0] for grid, split in (src, dst) if split is not None]
    if all(n & (n - 1) == 0 for n in cuts):
        return _busiest_receiver_closed_form(src_grid[0], src_split, dst_grid[0], dst_split)
    return _busiest_receiver_by_rank(src, dst)


def _busiest_receiver_closed_form(src_pr: int, src_split: int | None, dst_pr: int,
                                  dst_split: int | None) -> tuple[float, int]:
    """:func:`_busiest_receiver` when one of ``src_pr``, ``dst_pr`` divides the other (powers
    of two), in O(1).

    Along the batch, rank r's source block is the batch share of the ``src_pr`` consecutive
    ranks ``src_pr·⌊r/src_pr⌋ …`` and its target block that of ``dst_pr`` ranks: with
    ``src_pr ≥ dst_pr`` the target lies inside the source, else it takes ``dst_pr/src_pr``
    source blocks, each ``src_pr/dst_pr`` of it. Along an axis that only the source splits,
    every rank holds 1/Pr_src of what it needs, from all Pr_src parts; along one only the target
    splits, it holds all of it. Along one both split with different Pr, some rank's part of
    the source lies outside its part of the target: it holds nothing it needs. Every value
    is a power of two, so the floating-point result is exact, as rank by rank.
    """
    kept = min(src_pr, dst_pr) / dst_pr
    blocks = max(1, dst_pr // src_pr)  # source blocks the busiest rank's target block meets
    if src_split is not None and src_split == dst_split:
        if src_pr == dst_pr:  # the same split (ranges given otherwise): nothing moves
            return 0.0, 0
        return 1.0, blocks * max(1, src_pr // dst_pr)
    if src_split is not None:
        kept /= src_pr
        blocks *= src_pr
    return 1 - kept, blocks - 1  # its own block needs no message


def _busiest_receiver_by_rank(src: tuple, dst: tuple) -> tuple[float, int]:
    """:func:`_busiest_receiver` rank by rank, in O(P): every axis but the batch and the split
    ones multiplies each rank's share by exactly 1 and its messages by 1, so only those are
    visited."""
    (src_grid, src_split), (dst_grid, dst_split) = src, dst
    ranks = np.arange(src_grid[0] * src_grid[1])
    kept = np.ones(len(ranks))
    messages = np.ones(len(ranks), dtype=np.int64)
    eps = 1e-9
    for axis in sorted({BATCH_AXIS, src_split, dst_split} - {None}):
        s0, s1, s_parts = _intervals(ranks, src_grid, src_split, axis)
        d0, d1, _ = _intervals(ranks, dst_grid, dst_split, axis)
        kept *= np.clip(np.minimum(s1, d1) - np.maximum(s0, d0), 0, None) / (d1 - d0)
        messages *= np.ceil(d1 * s_parts - eps).astype(np.int64) - np.floor(
            d0 * s_parts + eps).astype(np.int64)
    messages -= (kept > eps).astype(np.int64)  # its own block needs no message
    return float(np.max(1 - kept)), int(np.max(messages))


def _block_indices(layout: Layout, ranks: np.ndarray) -> list[np.ndarray]:
    """Each rank's block index along every axis (:meth:`Layout.block_index`, vectorised);
    ``ranks`` numbered from 0 within the layout's group."""
    index: list[np.ndarray | None] = [None] * len(layout.shape)
    stride = layout.size
    for size, axis in zip(layout.mesh, layout.axes, strict=True):
        stride //= size
        if axis != REPLICAS:
            digit = _digit(ranks, stride, size)
            index[axis] = digit if index[axis] is None else index[axis] * size + digit
    zeros = np.zeros(len(ranks), dtype=np.int64)  # an axis no digit cuts: one block, read only
    zeros.flags.writeable = False
    return [zeros if found is None else found for found in index]


def _digit(ranks: np.ndarray, stride: int, size: int) -> np.ndarray:
    """``ranks // stride % size`` (a floored modulo, as Python's), by a shift and a mask where
    both are powers of two: a division of an array of int64 costs several times more, and at
    tens of thousands of ranks the moves between groups are priced from little else."""
    if stride & (stride - 1) == 0 and size & (size - 1) == 0:
        return (ranks >> (stride.bit_length() - 1)) & (size - 1)
    return ranks // stride % size


def _bounds(layout: Layout, axis: int, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The [start, stop) of block ``index`` of ``axis``, per rank."""
    return _axis_bounds(layout.shape[axis], layout.parts[axis], layout.explicit_ranges[axis],
                        index)


def _axis_bounds(n: int, parts: int, ranges: tuple | None, index: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The [start, stop) of block ``index`` of an axis of length ``n`` cut into ``parts`` by
    the block rule, or by explicit ``ranges``."""
    if ranges is not None:
        table = np.asarray(ranges, dtype=np.int64)
        return table[index, 0], table[index, 1]
    return index * n // parts, (index + 1) * n // parts


def _parts_met(layout: Layout, axis: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """How many blocks of ``layout``'s ``axis`` meet each [lo, hi) (non-empty)."""
    return _axis_parts_met(layout.shape[axis], layout.parts[axis],
                           layout.explicit_ranges[axis], lo, hi)


def _axis_parts_met(n: int, parts: int, ranges: tuple | None, lo: np.ndarray, hi: np.ndarray
                    ) -> np.ndarray:
    """How many blocks of an axis (as :func:`_axis_bounds`) meet each [lo, hi) (non-empty)."""
    if parts == 1:
        return np.ones(len(lo), dtype=np.int64)
    if ranges is not None:
        table = np.asarray(ranges, dtype=np.int64)
        first = np.searchsorted(table[:, 1], lo, side="right")
        last = np.searchsorted(table[:, 0], hi, side="left") - 1
    elif parts > n:  # blocks of 0 or 1 entries: one non-empty block per entry
        return hi - lo
    else:
        first = np.maximum(-(-(lo + 1) * parts // n) - 1, 0)
        last = np.minimum((hi * parts - 1) // n, parts - 1)
    return np.maximum(last - first + 1, 0)


@lru_cache(maxsize=65536)
def _busiest_receiver_on_meshes(src: Layout, dst: Layout) -> tuple[float, int]:
    """:func:`_busiest_receiver` for layouts on any meshes: from the bits of the rank numbers
    where every digit is a power of two (:func:`_busiest_receiver_of_bits`), else rank by
    rank. Found once per :func:`_pair_key`."""
    cut = _cut_axis_keys(src, dst)
    key = ("meshes", *_pair_key(src, dst, cut))
    found = _BY_PAIR_KEY.get(key)
    if found is None:
        found = _busiest_receiver_of_bits(src, dst, cut)
        if found is None:
            found = _busiest_receiver_by_mesh_rank(src, dst)
        _remember(key, found)
    return found


_BY_PAIR_KEY: dict[tuple, tuple[float, int]] = {}  # the busiest receivers by _pair_key


def _remember(key: tuple, found: tuple[float, int]) -> None:
    if len(_BY_PAIR_KEY) >= 1 << 17:  # a bound on memory, as the functions' own caches
        _BY_PAIR_KEY.clear()
    _BY_PAIR_KEY[key] = found


def _pair_key(src: Layout, dst: Layout, cut: tuple | None = None) -> tuple:
    """What the busiest receiver of a move from ``src`` to ``dst`` depends on, and nothing
    else: both meshes, the axes their digits cut and their ranks, and per axis either cuts,
    its key (the length of an axis both cut evenly scaled down to the least that
    keeps its blocks in proportion: a rank's share of a block is a ratio of two of its
    lengths, the same float scaled, and the blocks met a count). The moves of a net's layers
    of other sizes but alike cuts (ResNet's stages) share one price of the busiest receiver;
    their bytes differ, and are priced apart. ``cut``: ``_cut_axis_keys``, if found."""
    cut = _cut_axis_keys(src, dst) if cut is None else cut
    return (len(src.shape), src.mesh, src.axes, src.first, src.size, dst.mesh, dst.axes,
            dst.first, dst.size, tuple((a, key) for a, key, _ in cut))


def _cut_axis_keys(src: Layout, dst: Layout) -> tuple[tuple[int, tuple, bool], ...]:
    """(axis, key, even) of each axis either layout cuts, in order: what the busiest
    receiver's key and its computation ask of each axis, found once.

    ``even``: both cuts are by the block rule into blocks of one size. ``key``: (length,
    source parts, target parts, source ranges, target ranges), the length the least that
    gives the same blocks in proportion where both cuts are even (what a rank keeps is a
    share, and the blocks it meets a count: both unchanged by scaling the axis), so that moves
    of tensors alike but for their size share one entry."""
    return _cut_axis_keys_of(src.shape, src.parts, dst.parts, src.explicit_ranges,
                             dst.explicit_ranges)


@lru_cache(maxsize=65536)
def _cut_axis_keys_of(shape: tuple[int, ...], s_parts: tuple[int, ...],
                      d_parts: tuple[int, ...], s_explicit: tuple, d_explicit: tuple
                      ) -> tuple[tuple[int, tuple, bool], ...]:
    """``_cut_axis_keys`` from what it reads of the two layouts: many pairs of layouts (on
    other meshes or ranks) cut a tensor alike."""
    found = []
    for axis, (n, s, d, s_ranges, d_ranges) in enumerate(zip(
            shape, s_parts, d_parts, s_explicit, d_explicit)):
        if s == 1 and d == 1:
            continue
        even = s_ranges is None and d_ranges is None and n % s == 0 and n % d == 0
        found.append((axis, (math.lcm(s, d) if even else n, s, d, s_ranges, d_ranges), even))
    return tuple(found)


@lru_cache(maxsize=65536)
def _axis_bits(layout: Layout) -> list[tuple[int, ...]] | None:
    """Per axis, the bits of a rank's number that make its block index, most significant
    first; None unless every digit is a power of two."""
    if any(size & (size - 1) for size in layout.mesh):
        return None
    bits: list[tuple[int, ...]] = [() for _ in layout.shape]
    low = 0
    for size, axis in zip(reversed(layout.mesh), reversed(layout.axes), strict=True):
        width = size.bit_length() - 1
        if axis != REPLICAS:
            bits[axis] = tuple(range(low + width - 1, low - 1, -1)) + bits[axis]
        low += width
    return bits


def _busiest_receiver_of_bits(src: Layout, dst: Layout, cut_keys: tuple | None = None
                              ) -> tuple[float, int] | None:
    """:func:`_busiest_receiver` where every digit of both meshes is a power of two (None
    otherwise), in work that grows with the bits uneven axes share, not with P.

    A rank's block index along an axis is then a field of its bits, in the source and in the
    target. What a rank keeps of its target block is a product over the axes, and so is the
    number of source blocks it meets.

    Along an axis both cut evenly into s source and d target blocks, every rank meets
    max(1, s/d) source blocks, and keeps min(1, d/s) of its target block where the coarser
    cut's field equals the leading part of the finer one's, nothing elsewhere: where those
    fields are the same bits of the rank, always; where a pair of bits differs, at the ranks
    whose two bits differ. Such a rank keeps nothing, and where one of the two bits is free
    of what the other axes' target blocks read, it does so at a rank meeting the most blocks.

    The uneven axes are enumerated: axes whose fields share no bit vary independently, so the
    busiest rank is found per group of axes that share bits (enumerating only that group's
    bits) and the groups' extremes multiply. A group is priced once for every move that has
    it, wherever its bits sit in the rank. ``cut_keys``: ``_cut_axis_keys``, if found."""
    src_bits, dst_bits = _axis_bits(src), _axis_bits(dst)
    if src_bits is None or dst_bits is None:
        return None
    cut_keys = _cut_axis_keys(src, dst) if cut_keys is None else cut_keys
    # plain loops rather than generators: this runs for most distinct moves of a plan
    s_parts, d_parts, shape = src.parts, dst.parts, src.shape
    keys = {a: key for a, key, _ in cut_keys}
    cut = [a for a, _, _ in cut_keys]
    even = [a for a, _, is_even in cut_keys if is_even]
    for a in cut:
        if d_parts[a] > shape[a]:
            even = []  # some target blocks are empty: every axis is enumerated
            break
    uneven = [a for a in cut if a not in even]
    kept = 1  # math.prod's start and order: the same floating-point products
    met = 1
    differ = []  # pairs of bits whose values decide whether an even axis keeps anything
    for a in even:
        kept *= min(1.0, d_parts[a] / s_parts[a])
        met *= max(1, s_parts[a] // d_parts[a])
        coarse, fine = ((src_bits[a], dst_bits[a]) if len(src_bits[a]) <= len(dst_bits[a])
                        else (dst_bits[a], src_bits[a]))
        differ += [(f, c) for f, c in zip(fine, coarse) if f != c]
    if not uneven:  # what the groups below give when there are none
        return (1.0, met) if differ else (1.0 - kept, met - 1)
    if differ:
        read = {b for a in uneven for b in dst_bits[a]}  # what the blocks met depend on
        if any(f not in read or c not in read for f, c in differ):
            summaries = _group_summaries(keys, uneven, src_bits, dst_bits)
            return 1.0, met * math.prod(most for _, most, _, _ in summaries)
        uneven, kept, met = cut, 1.0, 1  # entangled: every axis enumerated
    summaries = _group_summaries(keys, uneven, src_bits, dst_bits)
    if any(least is None for least, *_ in summaries):
        return 0.0, 0  # some axis has an empty target block at every rank
    kept *= math.prod(least for least, *_ in summaries)
    every = [most for _, most, _, _ in summaries]
    keeping = [most for _, _, most, _ in summaries]
    messages = 0  # a rank that keeps part of its block needs no message for that part
    if all(most >= 0 for most in keeping):
        messages = met * math.prod(keeping) - 1
    for g, (*_, dropping) in enumerate(summaries):  # ranks that keep nothing, by a group
        if dropping >= 0:
            messages = max(messages, met * dropping * math.prod(every[:g] + every[g + 1:]))
    return 1.0 - kept, messages


def general_seconds_in_closed_form(srcs: Sequence[Layout], dsts: Sequence[Layout],
                                   si: np.ndarray, di: np.ndarray, machine: Machine,
                                   itemsize: int) -> np.ndarray:
    """:meth:`GeneralMove.seconds` (each direction's) of the general moves ``srcs[si[m]]`` →
    ``dsts[di[m]]``, every pair m at once, where the busiest receiver (and, between groups, the
    busiest sender) has a closed form with nothing enumerated: every digit a power of two;
    each layout cutting every axis into no more blocks than it has entries, at most two axes
    unevenly (the block rule's); and either both layouts on the same ranks
    (``_busiest_receiver_of_bits``), or each on a group that starts at a multiple of its size
    (``_busiest_receiver_of_aligned_bits``, both ways, as ``_between_groups_time`` asks). A
    pair of 1.5D grids on the same ranks takes the grids' own rule (``_busiest_receiver``,
    found once per pair of grids), as alone, whatever its cuts. NaN for any other pair (priced
    one by one). Every layout has the same shape.

    The same operations in the same order as one by one, so the same floats: along the axes
    in order, the share kept multiplies by min(1, d/s) and the blocks met by max(1, s/d), and
    a rank keeps nothing where a bit of the coarser cut's index differs from the bit it faces
    in the finer one's. Between groups, a receiver keeps part of its block only where the
    target's group lies inside the source's: the source's index of one of its ranks is then
    the target's bits under a fixed prefix, and a bit of the prefix never faces its own, so
    the same test holds. Anywhere else some receiver keeps nothing. The sender is the
    receiver of the move back. Most distinct moves of a plan at thousands of ranks are such,
    and the Python around each closed form was most of their price.

    Cuts by the block rule into 2^a and 2^b blocks nest, evenly or not: a target block lies
    in one source block (a ≤ b), keeping a share of 1 where the indices agree, or holds 2^(a-b)
    of them, whose sizes may differ. That axis's share varies with the receiver's source
    block: the least is the smallest ratio of a source block the receivers hold to the
    target block around it (``_least_shares``). Every other factor is a power of two or
    1, and with at most two such shares the least product is theirs times the others, in any
    order. Where some of the receivers' bits of that block's index are fixed by the prefix
    and some not, the pair is priced one by one (NaN)."""
    found = np.full(len(si), np.nan)
    if not len(si):
        return found
    src, dst = (_FactTable(layouts) for layouts in (srcs, dsts))
    n = src.shape[int(si[0])]
    if (src.shape != n).any() or (dst.shape != n).any():
        raise ValueError("moves of one shape at a time")
    sp, dp = src.parts[si], dst.parts[di]
    cut = (sp > 1) | (dp > 1)
    plain = ~src.explicit[si] & ~dst.explicit[di]
    even = plain & (n % sp == 0) & (n % dp == 0)
    filled = plain & (sp <= n) & (dp <= n)  # no block empty: uneven cuts nest as even ones
    same = (src.first[si] == dst.first[di]) & (src.size[si] == dst.size[di])
    aligned = (src.first[si] % src.size[si] == 0) & (dst.first[di] % dst.size[di] == 0)
    grids = src.grid[si] & dst.grid[di]
    cuts_fit = np.all(~cut | filled, axis=1) & ((cut & ~even).sum(axis=1) <= 2)
    closed = np.flatnonzero(src.powers[si] & dst.powers[di]
                            & np.where(same, grids | cuts_fit, aligned & cuts_fit))
    if not len(closed):
        return found
    si, di, sp, dp, cut = si[closed], di[closed], sp[closed], dp[closed], cut[closed]
    same, even = same[closed], even[closed]
    # an axis's bits, most significant first, fall in value: the first k of them are its k
    # highest. The coarser cut's bits lead the finer one's iff the finer one's bits at or
    # above the coarser one's lowest are exactly the coarser one's.
    coarser = src.count[si] <= dst.count[di]
    coarse = np.where(coarser, src.mask[si], dst.mask[di])
    fine = np.where(coarser, dst.mask[di], src.mask[si])
    lowest = np.where(coarser, src.lowest[si], dst.lowest[di])
    led = (np.minimum(src.count[si], dst.count[di]) == 0) | (
        (fine & ~((np.int64(1) << lowest) - 1)) == coarse)
    differ = (cut & ~led).any(axis=1)
    fs, ns, fd, nd = src.first[si], src.size[si], dst.first[di], dst.size[di]
    ruled = same & grids[closed]  # the grids' own rule prices these
    varies = cut & ~even & (dp < sp) & ~ruled[:, None]  # a share that follows the source block
    # the receivers, the target's group, are the source's ranks from (fd - fs) mod ns on
    kept, met = _kept_and_met(cut, sp, dp, varies, _least_shares(
        n, sp, dp, src.mask[si], _bits_of(nd), (fd - fs) % ns, varies))
    share, messages = np.where(differ, 1.0, 1.0 - kept), np.where(differ, met, met - 1)
    if ruled.any():  # the grids' own rule, as one by one
        at = np.flatnonzero(ruled)
        found_by_rule = [_busiest_receiver((srcs[i].grid, srcs[i].split_axis),
                                           (dsts[j].grid, dsts[j].split_axis))
                         for i, j in zip(si[at].tolist(), di[at].tolist(), strict=True)]
        share[at] = [found[0] for found in found_by_rule]
        messages[at] = [found[1] for found in found_by_rule]
    moved = share * (dst.block[di] * itemsize)  # the larger target block's bytes, as received
    ranks, peers = src.size[si], np.maximum(src.pr[si], dst.pr[di])
    apart = np.flatnonzero(~same)
    if len(apart):  # between groups: the busier of the busiest receiver and sender
        fs, ns, fd, nd = fs[apart], ns[apart], fd[apart], nd[apart]
        inside = (fd >= fs) & (fd + nd <= fs + ns)  # the target's group in the source's
        around = (fs >= fd) & (fs + ns <= fd + nd)  # the source's group in the target's
        # the move back: where the source's group lies inside the target's, its receivers keep
        # their share where the bits agree, as on the same ranks; elsewhere one keeps nothing
        keeps_back = around & ~differ[apart]
        back = cut[apart] & ~even[apart] & (sp[apart] < dp[apart])
        kept_back, met_back = _kept_and_met(cut[apart], dp[apart], sp[apart], back, _least_shares(
            n, dp[apart], sp[apart], dst.mask[di[apart]], _bits_of(ns), (fs - fd) % nd, back))
        received = np.where(inside, share[apart], 1.0) * (dst.block[di[apart]] * itemsize)
        copies = -(-dst.replicas[di[apart]] // src.replicas[si[apart]])
        sent = np.where(keeps_back, 1.0 - kept_back, 1.0) * (src.block[si[apart]] * itemsize)
        messages[apart] = np.maximum(np.where(inside, messages[apart], met[apart]),
                                     np.where(keeps_back, met_back - 1, met_back) * copies)
        moved[apart] = np.maximum(received, sent * copies)
        ranks[apart] = src.procs[si[apart]]
        peers[apart] = np.maximum(fs + ns, fd + nd) - np.minimum(fs, fd)
    found[closed] = exchange_times(machine, ranks, peers, messages, moved)
    return found


def _kept_and_met(cut: np.ndarray, sp: np.ndarray, dp: np.ndarray, varies: np.ndarray,
                  least: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Of each move of :func:`general_seconds_in_closed_form`, from the blocks ``sp`` and
    ``dp`` of each axis and which axes are ``cut``: the share of its block a receiver keeps
    where its indices agree with its source's, and the source blocks every receiver meets.
    Along an axis that ``varies`` the share is ``least`` there (``_least_shares``; None
    where none varies)."""
    kept = np.ones(len(sp))
    met = np.ones(len(sp), dtype=np.int64)
    for axis in range(sp.shape[1]):
        on = cut[:, axis]
        share = np.minimum(1.0, dp[:, axis] / sp[:, axis])
        if least is not None:
            share = np.where(varies[:, axis], least[:, axis], share)
        kept = np.where(on, kept * share, kept)
        met = np.where(on, met * np.maximum(1, sp[:, axis] // dp[:, axis]), met)
    return kept, met


def _bits_of(size: np.ndarray) -> np.ndarray:
    """log2 of each of ``size``, powers of two."""
    return np.frexp(size.astype(float))[1].astype(np.int64) - 1


def _least_shares(n: np.ndarray, parts: np.ndarray, coarser: np.ndarray, mask: np.ndarray,
                  width: np.ndarray, offset: np.ndarray, wanted: np.ndarray
                  ) -> np.ndarray | None:
    """Per move and axis (where ``wanted``): the least share of its target block a receiver
    keeps where the source cuts the axis (``n`` entries) into ``parts`` blocks and the target
    into ``coarser`` < ``parts``, by the block rule, none empty. The cuts nest (block i of the
    source lies in block i >> log2(parts / coarser) of the target), so a receiver that keeps
    anything keeps its source block: the least is the smallest ratio of a source block the
    receivers hold to the target block around it.

    The receivers are a group of 2^``width`` ranks from ``offset`` on in the source's
    numbering, aligned: the source's bits of the axis (``mask``) below ``width`` take every
    value among them, and those above are ``offset``'s. Where all are free the receivers hold
    every block (``_least_nested_share``); where all are fixed, one block, the one
    ``offset``'s bits name; NaN where some of both (one by one). None where none is wanted."""
    if not wanted.any():
        return None
    found = np.full(mask.shape, np.nan)
    low = (np.int64(1) << width[:, None]) - 1
    free = wanted & ((mask & low) == mask)
    fixed = wanted & ((mask & low) == 0)
    lengths = np.broadcast_to(n, mask.shape)
    if fixed.any():
        index = _gathered(np.broadcast_to(offset[:, None], mask.shape)[fixed], mask[fixed])
        found[fixed] = _nested_shares(lengths[fixed], parts[fixed], coarser[fixed], index)
    found[free] = [_least_nested_share(*key) for key in zip(
        lengths[free].tolist(), parts[free].tolist(), coarser[free].tolist())]
    return found


def _nested_shares(n: np.ndarray, parts: np.ndarray, coarser: np.ndarray, index: np.ndarray
                   ) -> np.ndarray:
    """The ratio of block ``index`` of ``n`` entries cut ``parts`` ways to the block of the
    ``coarser`` cut around it (the block rule's, nested), as a receiver's share is computed
    rank by rank."""
    lo, hi = _axis_bounds(n, parts, None, index)
    around_lo, around_hi = _axis_bounds(n, coarser, None, index // (parts // coarser))
    return (hi - lo) / (around_hi - around_lo)


@lru_cache(maxsize=4096)
def _least_nested_share(n: int, parts: int, coarser: int) -> float:
    """The least ratio of a block of ``n`` entries cut ``parts`` ways to the block of the
    ``coarser`` cut around it (the block rule's, nested), each computed as a receiver's share
    rank by rank is."""
    return float(_nested_shares(n, parts, coarser, np.arange(parts, dtype=np.int64)).min())


def _gathered(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Each of ``values``' bits under ``mask``, packed in order into the low bits: the index
    a layout's bits of an axis (most significant first) give a rank number."""
    found = np.zeros(mask.shape, dtype=np.int64)
    taken = np.zeros(mask.shape, dtype=np.int64)
    for bit in range(int(mask.max()).bit_length()):
        on = (mask >> bit) & 1 == 1
        found |= np.where(on, ((values >> bit) & 1) << taken, 0)
        taken += on
    return found


@lru_cache(maxsize=65536)
def _closed_form_facts(layout: Layout) -> tuple[int, ...]:
    """What :func:`general_seconds_in_closed_form` reads of a layout, in one row: whether every
    digit of its mesh is a power of two (1; else 0, and the rest means nothing), its first
    rank, its ranks, Pr, whether it is a 1.5D grid, the entries of its largest block, the
    ranks holding each block, the world's ranks, and per axis its length, its blocks, whether
    explicit ranges cut it, its bits of the rank as a mask, their number and the lowest of
    them (0 where none)."""
    bits = _axis_bits(layout)
    if bits is None:  # blocks and groups of 1, that no remainder divides by zero
        return ((0, 0, 1, 0, 0, 0, 1, 1) + layout.shape + (1,) * len(layout.shape)
                + (0,) * (4 * len(layout.shape)))
    return (1, layout.first, layout.size, layout.grid[0], int(layout.is_grid),
            math.prod(layout.largest_block), layout.replicas, layout.procs, *layout.shape,
            *layout.parts,
            *(int(r is not None) for r in layout.explicit_ranges),
            *(sum(1 << b for b in found) for found in bits), *(len(found) for found in bits),
            *(min(found, default=0) for found in bits))


class _FactTable:
    """:func:`_closed_form_facts` of many layouts as arrays, a row per layout."""

    def __init__(self, layouts: Sequence[Layout]) -> None:
        rows = np.array([_closed_form_facts(layout) for layout in layouts], dtype=np.int64)
        ndim = (rows.shape[1] - 8) // 6
        self.powers, self.first, self.size, self.pr = rows[:, 0] == 1, *rows[:, 1:4].T
        self.grid, self.block = rows[:, 4] == 1, rows[:, 5]
        self.replicas, self.procs = rows[:, 6], rows[:, 7]
        self.shape, self.parts, self.explicit, self.mask, self.count, self.lowest = (
            rows[:, 8 + k * ndim:8 + (k + 1) * ndim] for k in range(6))
        self.explicit = self.explicit == 1


def _sharing_bits(items: list[tuple[int, set[int]]]) -> list[tuple[set[int], list[int]]]:
    """The groups of ``items`` (name, the bits of the rank it reads) that share bits, directly
    or through others: (their bits, their names in order), in the order the last of each
    arrived. Groups apart vary independently, so each is enumerated on its own."""
    groups: list[tuple[set[int], list[int]]] = []
    for name, read in items:
        bits, members = set(read), [name]
        for group in [g for g in groups if g[0] & bits]:
            groups.remove(group)
            bits |= group[0]
            members = group[1] + members
        groups.append((bits, sorted(members)))
    return groups


def _group_summaries(keys: dict[int, tuple], axes: list[int],
                     src_bits: list[tuple[int, ...]], dst_bits: list[tuple[int, ...]]
                     ) -> list[tuple]:
    """``_group_extremes`` of each group of ``axes`` that share bits of the rank (``keys``:
    each axis's key, as ``_cut_axis_keys`` gives it)."""
    groups = _sharing_bits([(axis, set(src_bits[axis]) | set(dst_bits[axis])) for axis in axes])
    summaries = []
    for bits, members in sorted(groups, key=lambda g: g[1]):
        place = {bit: i for i, bit in enumerate(sorted(bits))}  # the group's own numbering
        summaries.append(_group_extremes(len(bits), tuple(
            (*keys[a], tuple(place[b] for b in src_bits[a]),
             tuple(place[b] for b in dst_bits[a])) for a in members)))
    return summaries


@lru_cache(maxsize=65536)
def _group_extremes(width: int, axes: tuple) -> tuple:
    """Over the ranks' values of ``width`` bits and the ``axes`` they index, each (length,
    source parts, target parts, source ranges, target ranges, source bits, target bits):
    among the ranks whose target block is not empty, (the least share of it a rank keeps, the
    most source blocks met, the most met where something is kept, the most met where nothing
    is); None, -1, -1, -1 where every target block is empty. Share and blocks met are the
    products over the axes, as :func:`_busiest_receiver_by_mesh_rank` forms them."""
    values = np.arange(1 << width, dtype=np.int64)
    kept = np.ones(len(values))
    met = np.ones(len(values), dtype=np.int64)
    empty = np.zeros(len(values), dtype=bool)
    for n, s_parts, d_parts, s_ranges, d_ranges, s_bits, d_bits in axes:
        s0, s1 = _axis_bounds(n, s_parts, s_ranges, _bit_field(values, s_bits))
        d0, d1 = _axis_bounds(n, d_parts, d_ranges, _bit_field(values, d_bits))
        empty |= d1 <= d0
        kept *= np.clip(np.minimum(s1, d1) - np.maximum(s0, d0), 0, None) / np.maximum(
            d1 - d0, 1)
        met *= _axis_parts_met(n, s_parts, s_ranges, d0, d1)
    full = ~empty
    if not full.any():
        return None, -1, -1, -1

    def most(where: np.ndarray) -> int:
        return int(met[where].max()) if where.any() else -1

    return float(kept[full].min()), most(full), most(full & (kept > 0)), most(full & (kept == 0))


@lru_cache(maxsize=65536)
def _busiest_receiver_by_mesh_rank(src: Layout, dst: Layout) -> tuple[float, int]:
    """:func:`_busiest_receiver` for layouts on any meshes and any ranks, rank by rank in
    O(ranks) vector work over the target's ranks: the share of its target block a rank does
    not hold in the source (it is outside the source's group, or holds another block there),
    and the source blocks its target block meets other than its own, from the integer block
    bounds of every axis. Found once per :func:`_pair_key`."""
    cut = _cut_axis_keys(src, dst)
    key = ("by rank", *_pair_key(src, dst, cut))
    found = _BY_PAIR_KEY.get(key)
    if found is None:
        found = _busiest_receiver_of_aligned_bits(src, dst, cut)
        if found is None:
            found = _busiest_receiver_rank_by_rank(src, dst)
        _remember(key, found)
    return found


def _busiest_receiver_rank_by_rank(src: Layout, dst: Layout) -> tuple[float, int]:
    """:func:`_busiest_receiver_by_mesh_rank`, computed."""
    ranks = np.arange(dst.first, dst.first + dst.size, dtype=np.int64)
    kept = ((ranks >= src.first) & (ranks < src.first + src.size)).astype(float)
    src_index = _block_indices(src, _digit(ranks - src.first, 1, src.size))
    dst_index = _block_indices(dst, ranks - dst.first)
    messages = np.ones(len(ranks), dtype=np.int64)
    empty = np.zeros(len(ranks), dtype=bool)  # a target block with nothing in it
    for axis in range(len(src.shape)):
        if src.parts[axis] == 1 and dst.parts[axis] == 1:
            continue
        # the bounds of every block and the source blocks each target block meets, found
        # once per block and gathered by the ranks' block indices
        s0, s1 = (bound[src_index[axis]]
                  for bound in _bounds(src, axis, np.arange(src.parts[axis])))
        lo, hi = _bounds(dst, axis, np.arange(dst.parts[axis]))
        block = dst_index[axis]
        d0, d1 = lo[block], hi[block]
        empty |= (hi <= lo)[block]
        length = np.maximum(hi - lo, 1)[block]
        kept *= np.clip(np.minimum(s1, d1) - np.maximum(s0, d0), 0, None) / length
        messages *= _parts_met(src, axis, lo, hi)[block]
    messages -= (kept > 0).astype(np.int64)  # its own block needs no message
    share = np.where(empty, 0.0, 1 - kept)
    return float(np.max(share)), int(np.max(np.where(empty, 0, messages)))


def _busiest_receiver_of_aligned_bits(src: Layout, dst: Layout, cut_keys: tuple | None = None
                                      ) -> tuple[float, int] | None:
    """``_busiest_receiver_rank_by_rank`` to the bit, from the bits of the rank numbers,
    where every digit of both meshes is a power of two and each group starts at a multiple of
    its size (None otherwise): the moves between a group and the world, or between groups, of
    a branched net on 2^k ranks.

    Number a target rank ``u`` within the target's group (``gd`` bits). Two aligned blocks of
    ranks are nested or apart, so the source's number of the same rank is ``u``'s low bits
    (the source's group no larger) or ``u`` under a fixed prefix (larger); and whether it is
    in the source's group at all is fixed, or asks that ``u``'s bits above the source's size
    equal a constant. Every block index, and this membership, is then a field of ``u``'s bits.
    The ranks' values are enumerated per group of axes that share bits (once per group alike,
    wherever its bits sit), and the groups combine exactly as rank by rank: a rank outside the
    source's group keeps nothing; one inside keeps the product of its axes' shares in the
    order of the axes, a rounding that grows with each share, so that the least is that
    product over the least tuples of shares each group has. The blocks met are integers, and
    multiply. ``cut_keys``: ``_cut_axis_keys`` of the two layouts, if found."""
    src_bits, dst_bits = _axis_bits(src), _axis_bits(dst)
    if src_bits is None or dst_bits is None or src.first % src.size or dst.first % dst.size:
        return None
    cut_keys = _cut_axis_keys(src, dst) if cut_keys is None else cut_keys
    gd = dst.size.bit_length() - 1
    gs = src.size.bit_length() - 1
    around = gs < gd and dst.first <= src.first < dst.first + dst.size
    if around and not any(b >= gs for a, _, even in cut_keys if not even for b in dst_bits[a]) \
            or not (around or src.first <= dst.first < src.first + src.size):
        # some ranks lie outside the source's group, and they have every block of the
        # unevenly cut axes (the bits that say who is outside index none of them): one keeps
        # nothing of a block that meets the most source blocks along every axis at once
        return 1.0, math.prod(_most_blocks_met(key) for _, key, _ in cut_keys)
    offset = (dst.first - src.first) % src.size  # the source's number of u = 0, when gs > gd
    # each factor, membership first and then the axes in order: the bits of u it reads, and
    # what _aligned_group_values needs of it
    factors: list[tuple[set[int], tuple]] = []
    if around:
        above = tuple(range(gd - 1, gs - 1, -1))  # u's bits above the source's size
        factors.append((set(above), ("member", above, (src.first - dst.first) >> gs)))
    else:  # the target's ranks are all in the source's group, or none is
        member = src.first <= dst.first < src.first + src.size
        factors.append((set(), ("member", (), 0 if member else -1)))
    for axis, key, even in cut_keys:
        if src.parts[axis] == 1 and dst.parts[axis] <= src.shape[axis] and key[4] is None:
            continue  # every rank keeps all of its block (a share of 1.0), from one block
        # a source bit at or above gd is the fixed prefix's: -1 for a 0, -2 for a 1
        s_bits = tuple(b if b < gd else -1 - (offset >> b & 1) for b in src_bits[axis])
        if even:
            factor = _even_factor(key, s_bits, dst_bits[axis])
            read = {b for edge in factor[3] for b in edge} | {b for b, _ in factor[4]}
        else:
            factor = ("axis", key, s_bits, dst_bits[axis])
            read = {b for b in s_bits if b >= 0} | set(dst_bits[axis])
        factors.append((read, factor))
    groups = _sharing_bits([(k, bits) for k, (bits, _) in enumerate(factors)])
    found = []
    for bits, members in groups:
        place = {bit: i for i, bit in enumerate(sorted(bits))}  # the group's own numbering
        found.append(_aligned_group_values(len(bits), tuple(
            _renumbered(factors[k][1], place) for k in members)))
    if not all(full for _, full, *_ in found):
        return 0.0, 0  # every target block is empty
    if any(outside for _, _, outside, *_ in found):
        least = 0.0  # a rank outside the source's group keeps nothing of its block
    else:
        order = sorted((k, g, i) for g, (_, members) in enumerate(groups)
                       for i, k in enumerate(k for k in members if k > 0))
        if math.prod(len(tuples) for tuples, *_ in found) > 1 << 12:
            return None  # too many tuples to combine: rank by rank
        least = math.inf
        for chosen in itertools.product(*(tuples for tuples, *_ in found)):
            kept = 1.0  # as rank by rank: 1.0 for a rank in the source's group, times shares
            for _, g, i in order:
                kept *= chosen[g][i]
            least = min(least, kept)
    messages = 0 if any(empty for _, _, _, empty, *_ in found) else -1
    every = [most for *_, most, _, _ in found]
    if all(keeping >= 0 for *_, keeping, _ in found):  # keeps part of its block: one less
        messages = max(messages, math.prod(keeping for *_, keeping, _ in found) - 1)
    for g, (*_, dropping) in enumerate(found):  # keeps nothing, by group g
        if dropping >= 0:
            messages = max(messages, dropping * math.prod(every[:g] + every[g + 1:]))
    return 1 - least, messages


@lru_cache(maxsize=4096)
def _most_blocks_met(key: tuple) -> int:
    """The most source blocks a non-empty target block of an axis meets (``key``: the axis's
    (length, source parts, target parts, source ranges, target ranges), as
    ``_cut_axis_keys``)."""
    n, s_parts, d_parts, s_ranges, d_ranges = key
    d0, d1 = _axis_bounds(n, d_parts, d_ranges, np.arange(d_parts, dtype=np.int64))
    full = d1 > d0
    return int(_axis_parts_met(n, s_parts, s_ranges, d0[full], d1[full]).max())


def _even_factor(key: tuple, s_bits: tuple[int, ...], d_bits: tuple[int, ...]) -> tuple:
    """An axis both layouts cut evenly, as a factor of ``_busiest_receiver_of_aligned_bits``
    that asks no enumeration of its bits: ("even", the share a rank keeps where its blocks
    agree, the source blocks every rank meets, the pairs of bits that must be equal, the bits
    that must hold a value, whether they can never agree).

    Cut into 2^a source and 2^b target blocks of one size each, a target block lies in one
    source block (a ≤ b) or holds 2^(a-b) of them: every rank meets max(1, 2^(a-b)), and
    keeps a share min(1, 2^(b-a)) of its target block where the coarser index equals the
    leading bits of the finer one, bit for bit, and nothing elsewhere (the blocks are then
    apart). Each bit of the coarser index and the bit it faces is a pair of u's bits, a bit
    against a fixed one, or two fixed ones."""
    n, s_parts, d_parts = key[:3]
    coarse, fine = (s_bits, d_bits) if len(s_bits) <= len(d_bits) else (d_bits, s_bits)
    edges, pins, never = [], [], False
    for f, c in zip(fine, coarse):
        if f == c:
            continue  # the same bit, or the same fixed value: always equal
        if f >= 0 and c >= 0:
            edges.append((f, c))
        elif f >= 0 or c >= 0:
            pins.append((max(f, c), -1 - min(f, c)))
        else:
            never = True  # two fixed bits that differ
    # the share as rank by rank forms it: the overlap over the target block's length
    share = min(n // s_parts, n // d_parts) / (n // d_parts)
    return "even", share, max(1, s_parts // d_parts), tuple(edges), tuple(pins), never


def _renumbered(factor: tuple, place: dict[int, int]) -> tuple:
    """A factor of ``_busiest_receiver_of_aligned_bits`` with its bits of ``u`` in its
    group's own numbering (the fixed bits, negative, as they are)."""
    if factor[0] == "member":
        return "member", tuple(place[b] for b in factor[1]), factor[2]
    if factor[0] == "even":
        _, share, met, edges, pins, never = factor
        return ("even", share, met, tuple((place[a], place[b]) for a, b in edges),
                tuple((place[b], value) for b, value in pins), never)
    _, key, s_bits, d_bits = factor
    return ("axis", key, tuple(place[b] if b >= 0 else b for b in s_bits),
            tuple(place[b] for b in d_bits))


def _bit_field(values: np.ndarray, bits: tuple[int, ...]) -> np.ndarray:
    """The number whose binary digits are ``values``' ``bits``, most significant first; a bit
    -1 is a fixed 0, -2 a fixed 1."""
    found = np.zeros(len(values), dtype=np.int64)
    start = 0
    while start < len(bits):  # a run of descending bits, or of fixed ones, at once
        stop = start + 1
        if bits[start] >= 0:
            while stop < len(bits) and bits[stop] == bits[stop - 1] - 1 >= 0:
                stop += 1
            run = stop - start
            found = (found << run) | (values >> bits[stop - 1] & ((1 << run) - 1))
        else:
            fixed = -1 - bits[start]
            while stop < len(bits) and bits[stop] < 0:
                fixed = fixed << 1 | (-1 - bits[stop])
                stop += 1
            found = (found << (stop - start)) | fixed
        start = stop
    return found


@lru_cache(maxsize=65536)
def _aligned_group_values(width: int, factors: tuple) -> tuple:
    """Over the values of ``width`` bits and the ``factors`` they decide (of
    ``_busiest_receiver_of_aligned_bits``), where the target block is not empty: (the
    least tuples of the axes' shares kept by a rank in the source's group, none dominated by
    another; whether there is such a value at all; whether some of them are outside the
    source's group; whether some target block is empty; the most source blocks met, then
    where moreover the rank keeps part of its block, then where it keeps none, -1 where there
    is none). Each share is computed as ``_busiest_receiver_rank_by_rank`` computes it.

    Only the bits the membership and the unevenly cut axes read are enumerated. An evenly cut
    axis (:func:`_even_factor`) meets a fixed number of blocks and keeps a fixed share or
    nothing, by whether its pairs of bits agree; so each value of the enumerated bits stands
    for two kinds of rank at most, those whose other bits let every even axis agree and those
    whose bits let one disagree (:func:`_agreement`), and a rank of either kind has the same
    shares and blocks met as any other of its kind. At 65,536 ranks the batch axis alone
    reads 16 bits, and the rest a few."""
    enumerated = sorted({b for factor in factors for b in _enumerated_bits(factor)})
    values = _spread(np.arange(1 << len(enumerated), dtype=np.int64), enumerated)
    member = np.ones(len(values), dtype=bool)
    columns: list[np.ndarray | float] = []  # per axis: its shares, or an even axis's share
    met = np.ones(len(values), dtype=np.int64)
    empty = np.zeros(len(values), dtype=bool)
    for factor in factors:
        if factor[0] == "member":
            _, bits, wanted = factor
            member = _bit_field(values, bits) == wanted
            continue
        if factor[0] == "even":
            columns.append(factor[1])
            met *= factor[2]
            continue
        _, (n, s_parts, d_parts, s_ranges, d_ranges), s_bits, d_bits = factor
        s0, s1 = _axis_bounds(n, s_parts, s_ranges, _bit_field(values, s_bits))
        d0, d1 = _axis_bounds(n, d_parts, d_ranges, _bit_field(values, d_bits))
        empty |= d1 <= d0
        length = np.maximum(d1 - d0, 1)
        columns.append(np.clip(np.minimum(s1, d1) - np.maximum(s0, d0), 0, None) / length)
        met *= _axis_parts_met(n, s_parts, s_ranges, d0, d1)
    agree, differ = _agreement(width, set(enumerated),
                               [f for f in factors if f[0] == "even"], values)
    rows = np.concatenate([np.flatnonzero(agree), np.flatnonzero(differ)])
    agrees = np.arange(len(rows)) < np.count_nonzero(agree)
    member, met, empty = member[rows], met[rows], empty[rows]
    shares = [np.where(agrees, column, 0.0) if isinstance(column, float) else column[rows]
              for column in columns]
    return _group_summary(member, shares, met, empty)


def _group_summary(member: np.ndarray, shares: list[np.ndarray], met: np.ndarray,
                   empty: np.ndarray) -> tuple:
    """``_aligned_group_values``'s tuple from its kinds of rank: each one's membership of the
    source's group, share of its block kept per axis, source blocks met and whether its target
    block is empty."""
    full = ~empty
    if not full.any():
        return (), False, False, True, -1, -1, -1
    inside = full & member
    keeping = inside.copy()
    for share in shares:
        keeping &= share > 0

    def most(where: np.ndarray) -> int:
        return int(met[where].max()) if where.any() else -1

    table = np.stack(shares, axis=1)[inside] if shares else np.ones((int(inside.sum()), 0))
    return (_least_tuples(table), True, bool((full & ~member).any()), bool(empty.any()),
            most(full), most(keeping), most(full & ~keeping))


def _enumerated_bits(factor: tuple) -> tuple[int, ...]:
    """The bits of u a factor of ``_aligned_group_values`` reads that are enumerated: all of
    the membership's and an unevenly cut axis's, none of an even one's."""
    if factor[0] == "member":
        return factor[1]
    if factor[0] == "even":
        return ()
    return tuple(b for b in factor[2] if b >= 0) + factor[3]


def _spread(counts: np.ndarray, bits: list[int]) -> np.ndarray:
    """Each of ``counts`` with its binary digit i moved to bit ``bits[i]`` (ascending)."""
    if bits == list(range(len(bits))):
        return counts
    found = np.zeros(len(counts), dtype=np.int64)
    for i, bit in enumerate(bits):
        found |= (counts >> i & 1) << bit
    return found


def _agreement(width: int, enumerated: set[int], evens: list[tuple], values: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per value of the ``enumerated`` bits (``values``, the other bits 0): whether some
    setting of the other bits of ``width`` lets every one of the ``evens``' pairs of bits be
    equal and its fixed bits hold, and whether some setting makes one fail.

    The pairs join bits into sets that must all be equal: they can where the enumerated bits
    of each set are equal in the value and no two of its fixed values differ. A set with a
    bit not enumerated can always fail (that bit set against a neighbour); one of enumerated
    bits alone fails exactly where it cannot hold."""
    if not evens:
        return np.ones(len(values), dtype=bool), np.zeros(len(values), dtype=bool)
    parent = list(range(width))

    def root(b: int) -> int:
        while parent[b] != b:
            parent[b] = parent[parent[b]]
            b = parent[b]
        return b

    for factor in evens:
        for a, b in factor[3]:
            parent[root(a)] = root(b)
    touched = {b for f in evens for edge in f[3] for b in edge} | {
        b for f in evens for b, _ in f[4]}
    sets: dict[int, list[int]] = {}
    for b in sorted(touched):
        sets.setdefault(root(b), []).append(b)
    pinned: dict[int, set[int]] = {}
    for factor in evens:
        for b, value in factor[4]:
            pinned.setdefault(root(b), set()).add(value)
    never = (any(f[5] for f in evens) or any(len(found) > 1 for found in pinned.values()))
    agree = np.ones(len(values), dtype=bool)
    can_fail = never
    for top, members in sets.items():
        known = [b for b in members if b in enumerated]
        can_fail |= len(known) < len(members)
        if not known:
            continue
        first = values >> known[0] & 1
        for b in known[1:]:
            agree &= (values >> b & 1) == first
        for value in pinned.get(top, ()):
            agree &= first == value
    if never:
        agree[:] = False
    return agree, (np.ones(len(values), dtype=bool) if can_fail else ~agree)


def _least_tuples(table: np.ndarray) -> tuple[tuple[float, ...], ...]:
    """The distinct rows of ``table`` that no other row is at most in every column: where a
    product grows with each entry, its least over the rows is among them (a row with a 0 is
    alone enough). All the distinct rows where they are too many to compare pairwise."""
    if len(table) == 0:
        return ()
    if table.shape[1] <= 1:
        return (tuple(float(x) for x in table.min(axis=0)),)
    zero = (table == 0).any(axis=1)
    if zero.any():
        return (tuple(float(x) for x in table[zero.argmax()]),)
    codes = np.zeros(len(table), dtype=np.int64)  # one number per distinct row
    for column in table.T:
        found, inverse = np.unique(column, return_inverse=True)
        codes = np.unique(codes * len(found) + inverse.reshape(-1), return_inverse=True)[1]
    rows = table[np.unique(codes, return_index=True)[1]]
    if len(rows) <= 1024:
        below = rows[None, :, :] <= rows[:, None, :]  # [i, j]: row j at most row i
        same = (rows[None, :, :] == rows[:, None, :]).all(axis=2)
        rows = rows[~(below.all(axis=2) & ~same).any(axis=1)]
    return tuple(tuple(float(x) for x in row) for row in rows)


def _between_groups_time(src: Layout, dst: Layout, machine: Machine, itemsize: int) -> float:
    """A general move between layouts on different ranks (a group and another, or the world),
    at the busier of its busiest receiver and its busiest sender, rank by rank over the two
    groups (O(ranks) vector work; the planner prices such a move once per pair of layouts).

    A receiver keeps what it holds of its target block where it is in the source's group too,
    and takes the rest, one message per other source block it meets. A sender sends its block,
    less what it keeps, to each of the target's copies of every block it meets that pick it
    (one copy in ``src.replicas`` of them, as :meth:`GeneralMove.exchange` chooses)."""
    share, messages = _busiest_receiver_by_mesh_rank(src, dst)  # rank numbers offset:
    sent, sends = _busiest_receiver_by_mesh_rank(dst, src)       # not from their bits
    copies = -(-dst.replicas // src.replicas)
    source, target = (math.prod(layout.largest_block) * itemsize for layout in (src, dst))
    received, sent_bytes = share * target, sent * source * copies
    lo = min(src.first, dst.first)
    hi = max(src.first + src.size, dst.first + dst.size)
    peers = Group(hi - lo, 1, src.procs)
    return exchange_time(machine, src.procs, max(messages, sends * copies),
                         max(received, sent_bytes), peers)
