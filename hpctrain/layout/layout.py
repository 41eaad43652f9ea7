"""Tensor layouts: how an activation of global shape (N, C, H, W) or (N, F) sits on P ranks.

Every layer runs on a Pr×Pc grid. Rank r has grid coordinates ``i = r % Pr`` (model/domain
index) and ``j = r // Pr`` (batch index): ranks that share a batch shard are consecutive, so the
heavy model-parallel collectives stay within a node under block task placement. Worked example,
ranks 0..5 on Pr×Pc = 2×3::

    rank   0  1  2  3  4  5
    i      0  1  0  1  0  1      model groups (size Pr): {0,1} {2,3} {4,5}
    j      0  0  1  1  2  2      batch groups (size Pc): {0,2,4} {1,3,5}

The batch axis is always split over j with the block rule of :mod:`hpctrain.layout.partition`; one
other axis may be split over i (channels/features for model parallelism, height for domain
parallelism), and with no such axis the tensor is replicated over the Pr ranks of a batch group.

Gradients of a replicated activation are held as *partial sums*: the true gradient is the sum of
the replicas' buffers. This makes every communication step an exact linear map whose backward is
its adjoint; e.g. the adjoint of an all-gather is a reduce-scatter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from hpctrain.cost.nodes import Group
from hpctrain.layout.partition import BlockRanges, block_range, block_ranges

Box = tuple[tuple[int, int], ...]

BATCH_AXIS = 0
CHANNEL_AXIS = 1
HEIGHT_AXIS = 2


def first_axis_name(shape: tuple[int, ...]) -> str:
    """What the first spatial axis of a tensor of global ``shape`` is called: a volume's
    (N, C, D, H, W) depth, an image's height."""
    return "depth" if len(shape) == 5 else "height"


def grid_coords(rank: int, grid: tuple[int, int]) -> tuple[int, int]:
    """(i, j) of ``rank`` on a Pr×Pc grid: i = rank % Pr, j = rank // Pr."""
    pr, _ = grid
    return rank % pr, rank // pr


@dataclass(frozen=True)
class Layout:
    """Where each rank's block of a global tensor lies.

    Parameters
    ----------
    shape : global shape, batch first.
    grid : (Pr, Pc).
    split_axis : the axis cut over the Pr model/domain ranks, or None when replicated over them.
    split_ranges : the Pr ranges along ``split_axis``; block ranges by default (a
        :class:`~hpctrain.layout.partition.BlockRanges`, which stores none of them). Explicit ranges
        arise when flattening a channel-split (N, C, H, W) into (N, C·H·W).

    The hash leaves ``split_ranges`` out (they follow from the other fields but for a
    flattened split, and hashing them would cost O(Pr)), and is made once: layouts key the cost
    model's tables, looked up many thousand times per plan.
    """

    shape: tuple[int, ...]
    grid: tuple[int, int]
    split_axis: int | None = None
    split_ranges: Sequence[tuple[int, int]] | None = None

    def __post_init__(self) -> None:
        if self.grid[0] == 1:  # one model rank: the "split" holds everything
            object.__setattr__(self, "split_axis", None)
        if self.split_axis is not None and self.split_ranges is None:
            ranges = block_ranges(self.shape[self.split_axis], self.grid[0])
            object.__setattr__(self, "split_ranges", ranges)
        if self.split_axis is None:
            object.__setattr__(self, "split_ranges", None)
        # of integers only (no split: -1), so that it is the same in every process and a
        # pickled layout keeps a valid one
        axis = -1 if self.split_axis is None else self.split_axis
        object.__setattr__(self, "_hash", hash((self.shape, self.grid, axis)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def size(self) -> int:
        return self.grid[0] * self.grid[1]

    def box(self, rank: int) -> Box:
        """The global index ranges held by ``rank``, one (start, stop) per axis."""
        i, j = grid_coords(rank, self.grid)
        box = [(0, n) for n in self.shape]
        box[BATCH_AXIS] = block_range(self.shape[BATCH_AXIS], self.grid[1], j)
        if self.split_axis is not None:
            box[self.split_axis] = self.split_ranges[i]
        return tuple(box)

    @cached_property
    def largest_block(self) -> tuple[int, ...]:
        """The largest local shape any rank holds (blocks differ by at most one along each
        cut). Made once: the cost model asks for it many times per layout."""
        shape = list(self.shape)
        shape[BATCH_AXIS] = -(-shape[BATCH_AXIS] // self.grid[1])
        axis, ranges = self.split_axis, self.split_ranges
        if axis is not None:
            if isinstance(ranges, BlockRanges):  # O(1)
                shape[axis] = ranges.largest()
            else:  # explicit ranges (a flattened channel split)
                shape[axis] = max(hi - lo for lo, hi in ranges)
        return tuple(shape)

    def local_shape(self, rank: int) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.box(rank))

    @property
    def model_group(self) -> Group:
        """The Pr consecutive ranks that share a batch block and split the rest."""
        return Group(self.grid[0], 1, self.size)

    @property
    def batch_group(self) -> Group:
        """Every Pr-th rank, the ranks that hold the same model block and split the batch."""
        return Group(self.grid[1], self.grid[0], self.size)

    @property
    def world(self) -> Group:
        """Every rank, as one group."""
        return Group(self.size, 1, self.size)

    def replicated(self) -> Layout:
        """The same tensor on the same grid with the Pr split removed."""
        return Layout(self.shape, self.grid)

    def describe(self) -> str:
        pr, pc = self.grid
        if self.split_axis is None:
            split = "replicated" if pr > 1 else "whole"
        else:
            split = {HEIGHT_AXIS: first_axis_name(self.shape)}.get(self.split_axis, "channels"
                                             if len(self.shape) >= 4 else "features")
            split += f"/{pr}"
        return f"{pr}x{pc} batch/{pc} {split}"


def largest_block(layout: Layout) -> tuple[int, ...]:
    """The largest local shape any rank holds (:attr:`Layout.largest_block`)."""
    return layout.largest_block


def intersect(a: Box, b: Box) -> Box | None:
    box = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b, strict=True))
    return box if all(lo < hi for lo, hi in box) else None


def box_size(box: Box) -> int:
    n = 1
    for lo, hi in box:
        n *= hi - lo
    return n


def relative_slices(inner: Box, outer: Box) -> tuple[slice, ...]:
    """Slices that pick the global box ``inner`` out of an array holding ``outer``."""
    return tuple(slice(i0 - o0, i1 - o0) for (i0, i1), (o0, _) in zip(inner, outer, strict=True))
