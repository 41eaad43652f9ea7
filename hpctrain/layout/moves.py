"""Moves between two layouts of one tensor: which method, and what one rank sends and receives.

Pure maths, no MPI. :class:`~hpctrain.comm.redistribute.Redistribute` executes a move and the
cost model prices it, both from :func:`move_kind`, so prediction and execution cannot disagree.

A move takes a tensor held on layout ``src`` to layout ``dst`` on the same P ranks. Rank r sits
at ``(i, j) = (r % Pr, r // Pr)`` on each layout's grid (see :mod:`hpctrain.layout.layout`). Its
kind:

- ``identity``: the layouts are equal; nothing moves.
- ``slice``: every rank's new block lies inside its old one; forward a slice, backward the
  gradient padded with zeros. No messages.
- ``allgather``: each model group of the target grid holds, between its members, exactly the
  target block, cut along one axis in member order; forward ``Allgatherv`` over the model
  communicator, backward its adjoint ``Reduce_scatter``.
- ``general``: anything else; each rank sends the pieces of its block that other ranks need,
  point to point, and the backward sends the gradients of the same pieces back and adds them.

A rank's share of a general move is found by interval arithmetic on the two layouts: which
blocks of the other layout overlap its own block along the batch axis (block rule) and along the
split axes (bisection on the split ranges). It costs O(pieces of this rank), never O(P).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from hpctrain.layout.layout import BATCH_AXIS, Box, Layout, intersect, relative_slices
from hpctrain.layout.partition import block_range

IDENTITY, SLICE, ALLGATHER, GENERAL = "identity", "slice", "allgather", "general"

Range = tuple[int, int]


def _check_pair(src: Layout, dst: Layout) -> None:
    if src.shape != dst.shape:
        raise ValueError(f"cannot redistribute shape {src.shape} into {dst.shape}")
    if src.size != dst.size:
        raise ValueError(f"cannot redistribute from {src.size} ranks to {dst.size}; a move "
                         f"keeps the number of ranks")


def move_kind(src: Layout, dst: Layout) -> str:
    """The cheapest exact method that moves ``src`` to ``dst``, from the two layouts in O(1).

    - ``slice`` when ``src`` is not split over its Pr ranks and ``Pr_src`` is a multiple of
      ``Pr_dst``: rank r's batch block on the target grid (index ``r // Pr_dst`` of
      ``Pc_dst = m·Pc_src`` parts, ``m = Pr_src / Pr_dst``) lies inside its block on the source
      grid (index ``r // Pr_src``), by the nesting of the block rule
      (:mod:`hpctrain.layout.partition`), and ``src`` holds every entry of the other axes.
    - ``allgather`` when ``dst`` is replicated over ``Pr_dst > 1`` ranks and either ``src`` is
      split on the same grid (the model group's split ranges tile the axis in order), or ``src``
      is a batch split on 1×P (the group's P-way batch blocks ``j·Pr … j·Pr + Pr − 1`` tile its
      Pc-way block ``j``, again by nesting).
    - ``general`` otherwise.

    A layout with Pr = 1 is never split (``Layout`` drops the split), so a 1×P source is always
    the unsplit case above. These rules are structural: for degenerate sizes (an axis shorter
    than its number of parts, so that some block is empty) a slice or an all-gather may exist
    that they miss. Such a move is then ``general``, which is exact for every pair of layouts;
    it costs speed, never correctness.

    Examples, P = 4: 1×4 → 4×1 replicated is ``allgather`` (along the batch); 4×1 replicated →
    4×1 channel split is ``slice``; 4×1 channel split → 1×4 is ``general``.
    """
    _check_pair(src, dst)
    if src == dst:
        return IDENTITY
    (src_pr, _), (dst_pr, _) = src.grid, dst.grid
    if src.split_axis is None and src_pr % dst_pr == 0:
        return SLICE
    if dst.split_axis is None and dst_pr > 1 and (
            (src.grid == dst.grid and src.split_axis is not None)
            or (src.grid == (1, src.size))):
        return ALLGATHER
    return GENERAL


@dataclass(frozen=True)
class MovePlan:
    """What one rank does in a move (see :func:`plan_move`).

    ``kind`` is the method of :func:`move_kind`. For ``slice``, ``slices`` picks the new block out
    of the old one. For ``allgather``, the model group gathers along ``axis`` and member k holds
    ``ranges[k]`` of it. For ``general``, ``sends`` lists (receiver, global box) and
    ``receives`` (sender, global box) for the pieces that travel, and ``local`` the boxes this
    rank keeps from its own block; each box is one piece, one message per pair of ranks.
    """

    kind: str
    slices: tuple[slice, ...] | None = None
    axis: int | None = None
    ranges: tuple[Range, ...] | None = None
    sends: tuple[tuple[int, Box], ...] = ()
    receives: tuple[tuple[int, Box], ...] = ()
    local: tuple[Box, ...] = ()


def plan_move(src: Layout, dst: Layout, rank: int) -> MovePlan:
    """Rank ``rank``'s part in moving a tensor from ``src`` to ``dst``.

    Where several ranks hold the same source block (``src`` replicated over its Pr ranks), a
    rank that holds it takes it from itself, and any other from the replica in the same position
    ``receiver % Pr_src`` of the block's batch group: every piece has one sender, so the backward
    returns each gradient to exactly one owner. Equivalently, a replica sends only to ranks
    congruent to itself modulo ``Pr_src``.

    Example: (8, 4, 6, 6) from a channel split on 4×1 to a batch split on 1×4. Rank 1 holds
    channel 1 of samples 0..7 and needs samples 2..3: it keeps channel 1 of them, receives
    channels 0, 2 and 3 from ranks 0, 2 and 3, and sends channel 1 of samples 0..1, 4..5 and
    6..7 to ranks 0, 2 and 3.
    """
    kind = move_kind(src, dst)
    if kind == IDENTITY:
        return MovePlan(kind)
    if kind == SLICE:
        return MovePlan(kind, slices=relative_slices(dst.box(rank), src.box(rank)))
    if kind == ALLGATHER:
        pr = dst.grid[0]
        if src.grid == dst.grid:
            return MovePlan(kind, axis=src.split_axis, ranges=src.split_ranges)
        first = rank - rank % pr  # the group's ranks on 1×P: first … first + Pr − 1
        n = src.shape[BATCH_AXIS]
        return MovePlan(kind, axis=BATCH_AXIS,
                        ranges=tuple(block_range(n, src.size, first + i) for i in range(pr)))
    receives, local = [], []
    for sender, box in _receives(src, dst, rank):
        if sender == rank:
            local.append(box)
        else:
            receives.append((sender, box))
    sends = [(receiver, box) for receiver, box in _sends(src, dst, rank) if receiver != rank]
    return MovePlan(kind, sends=tuple(sends), receives=tuple(receives), local=tuple(local))


def parts_overlapping(layout: Layout, axis: int, lo: int, hi: int) -> list[tuple[int, Range]]:
    """The parts of ``layout``'s cut of ``axis`` that meet ``[lo, hi)``, each with that meet.

    The batch axis is cut into Pc blocks by the block rule: block k meets ``[lo, hi)`` iff
    ``k·n // Pc < hi`` and ``(k+1)·n // Pc > lo``, i.e. ``⌈(lo+1)·Pc / n⌉ − 1 ≤ k ≤
    ⌊(hi·Pc − 1) / n⌋``. The split axis is cut by ``split_ranges``, which tile it in order, found
    by bisection. Any other axis is one part, 0, holding everything. Empty meets are left out.
    """
    if hi <= lo:
        return []
    if axis == BATCH_AXIS:
        n, parts = layout.shape[BATCH_AXIS], layout.grid[1]
        first = max(-(-(lo + 1) * parts // n) - 1, 0)
        last = min((hi * parts - 1) // n, parts - 1)
        found = []
        for k in range(first, last + 1):
            a, b = block_range(n, parts, k)
            a, b = max(a, lo), min(b, hi)
            if a < b:
                found.append((k, (a, b)))
        return found
    if axis == layout.split_axis:
        ranges = layout.split_ranges
        first = bisect_right(ranges, lo, key=lambda r: r[1])
        last = bisect_left(ranges, hi, key=lambda r: r[0]) - 1
        found = []
        for k in range(first, last + 1):
            a, b = max(ranges[k][0], lo), min(ranges[k][1], hi)
            if a < b:
                found.append((k, (a, b)))
        return found
    return [(0, (lo, hi))]


def _empty(box: Box) -> bool:
    return any(hi <= lo for lo, hi in box)


def _with(box: Box, axis: int, span: Range) -> Box:
    return (*box[:axis], span, *box[axis + 1:])


def _receives(src: Layout, dst: Layout, rank: int) -> list[tuple[int, Box]]:
    """(sender, box) of every piece of ``rank``'s target block, its own pieces included."""
    need = dst.box(rank)
    if _empty(need):
        return []
    src_pr = src.grid[0]
    axis = src.split_axis
    pieces = []
    for j, batch in parts_overlapping(src, BATCH_AXIS, *need[BATCH_AXIS]):
        box = _with(need, BATCH_AXIS, batch)
        if axis is None:  # replicated source: itself if it holds block j, else one replica
            sender = rank if rank // src_pr == j else j * src_pr + rank % src_pr
            pieces.append((sender, box))
            continue
        for i, span in parts_overlapping(src, axis, *need[axis]):
            pieces.append((j * src_pr + i, _with(box, axis, span)))
    return pieces


def _sends(src: Layout, dst: Layout, rank: int) -> list[tuple[int, Box]]:
    """(receiver, box) of every piece ``rank`` sends from its source block, to itself included.

    A receiver whose target block meets this rank's block takes the piece from it unless the
    block is replicated and the receiver chose another replica (:func:`plan_move`): then only
    receivers congruent to ``rank`` modulo ``Pr_src`` are kept, stepped through directly.
    """
    have = src.box(rank)
    if _empty(have):
        return []
    src_pr, (dst_pr, _) = src.grid[0], dst.grid
    step = src_pr if src.split_axis is None else 1
    axis = dst.split_axis
    pieces = []
    for j, batch in parts_overlapping(dst, BATCH_AXIS, *have[BATCH_AXIS]):
        box = _with(have, BATCH_AXIS, batch)
        first = j * dst_pr
        if axis is None:  # every replica of target block j needs the whole meet
            start = first + (rank - first) % step
            pieces += [(q, box) for q in range(start, first + dst_pr, step)]
            continue
        for i, span in parts_overlapping(dst, axis, *have[axis]):
            q = first + i
            if (q - rank) % step == 0:
                pieces.append((q, _with(box, axis, span)))
    return pieces


@dataclass(frozen=True)
class Piece:
    """One block moved by a redistribution: ``box`` goes from rank ``sender`` to ``receiver``."""

    sender: int
    receiver: int
    box: Box


def transfer_pieces(src: Layout, dst: Layout) -> list[Piece]:
    """Every piece of the move on every rank, by brute force: O(P²) box intersections.

    The reference that the tests check :func:`plan_move` against, and that the move benchmark
    times for contrast; nothing else calls it. Same choice of one sender per piece as
    :func:`plan_move`.
    """
    _check_pair(src, dst)
    owners: dict[Box, list[int]] = {}
    for rank in range(src.size):
        owners.setdefault(src.box(rank), []).append(rank)
    pieces = []
    for receiver in range(dst.size):
        need = dst.box(receiver)
        for block, holders in owners.items():
            box = intersect(block, need)
            if box is None:
                continue
            sender = receiver if receiver in holders else holders[receiver % len(holders)]
            pieces.append(Piece(sender, receiver, box))
    return pieces
