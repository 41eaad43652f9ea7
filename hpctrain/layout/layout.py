"""Tensor layouts: how an activation of global shape (N, C, H, W), (N, C, D, H, W) or (N, F) sits
on P ranks.

A layout is one record for every split: the P ranks form a *mesh* of digits, slowest first,
and each digit either cuts one axis of the tensor or holds replicas. A rank's coordinate on
each digit comes from its number in mixed radix (the last digit varies fastest); the axis a
digit cuts is split by the block rule of :mod:`hpctrain.layout.partition`, and where several
digits cut one axis, their coordinates combine in mixed radix into one block index.

A layer's split is a degree per axis of its output — sample, channels and each spatial axis —
and a number of replicas (:class:`Split`); its mesh is, slowest first, the batch, the spatial
axes in order, the channels, then the replicas. The batch varies slowest so that the ranks that
share a sample block are consecutive (the heavy collectives stay inside a node under block task
placement); the channels sit below the spatial axes so that a convolution's input, whose
channels are whole, keeps on each rank the same spatial block as its output.

The 1.5D grids are special cases. On a Pr×Pc grid the mesh is (Pc, Pr): rank r has grid
coordinates ``i = r % Pr`` (model/domain index) and ``j = r // Pr`` (batch index). Worked
example, ranks 0..5 on Pr×Pc = 2×3::

    rank   0  1  2  3  4  5
    i      0  1  0  1  0  1      model groups (size Pr): {0,1} {2,3} {4,5}
    j      0  0  1  1  2  2      batch groups (size Pc): {0,2,4} {1,3,5}

*Batch* cuts only the sample axis; *model* also the channels (or features) over i; *domain*
the first spatial axis over i; with nothing cut over i the tensor is replicated over the Pr
ranks of a batch group. A split of height and width on 8 ranks, 2 sample blocks each cut 2×2,
is the mesh (2, 2, 2) cutting axes (N, H, W): rank 5 = 1·4 + 0·2 + 1 holds sample block 1,
height block 0 and width block 1.

A layer may run on a *group* of ranks, a block ``first … first + size − 1`` of the P ranks of
the world (``first`` and ``procs``): its mesh then numbers the group's ranks from 0, and the
ranks outside it hold nothing (an empty box). On 8 ranks, ``Layout((8, 4), (2, 2), 1, first=4,
procs=8)`` is a 2×2 grid of the features on ranks 4…7: rank 5 holds batch block 0 and feature
block 1, ranks 0…3 nothing. Everything else about the layout (its cuts, its communicators) is
the group's, as if the group were the world.

Gradients of a replicated activation are held as *partial sums*: the true gradient is the sum of
the replicas' buffers. This makes every communication step an exact linear map whose backward is
its adjoint; e.g. the adjoint of an all-gather is a reduce-scatter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from hpctrain.cost.nodes import Group
from hpctrain.layout.partition import BlockRanges, block_range, block_ranges

Box = tuple[tuple[int, int], ...]

BATCH_AXIS = 0
CHANNEL_AXIS = 1
HEIGHT_AXIS = 2
REPLICAS = -1  # a mesh digit that cuts no axis: its ranks hold the same block
# a split's digit that cuts a weighted layer's input channels: its ranks hold parts of one sum
REDUCTION = -2


def axis_letters(ndim: int) -> str:
    """The letter of each axis of a tensor of ``ndim`` axes, batch first: ``nc`` for (N, F),
    ``nchw`` for an image, ``ncdhw`` for a volume (a spec's and a plan file's names)."""
    return {2: "nc", 3: "ncw", 4: "nchw", 5: "ncdhw"}[ndim]


def axis_name(shape: tuple[int, ...], axis: int) -> str:
    """The name of ``axis`` of a tensor of global ``shape`` (``batch``, ``channels``, …)."""
    if axis == BATCH_AXIS:
        return "batch"
    if axis == CHANNEL_AXIS:
        return "channels" if len(shape) >= 3 else "features"
    return {"d": "depth", "h": "height", "w": "width"}[axis_letters(len(shape))[axis]]


def grid_coords(rank: int, grid: tuple[int, int]) -> tuple[int, int]:
    """(i, j) of ``rank`` on a Pr×Pc grid: i = rank % Pr, j = rank // Pr."""
    pr, _ = grid
    return rank % pr, rank // pr


@dataclass(frozen=True)
class Split:
    """A layer's split: a degree for each axis of its output, batch first (``degrees``; the
    channels, or a linear layer's features, second, then each spatial axis), the number of
    times its work is replicated, and, for a conv or linear layer, the degree of its *input*
    channels (or features): the reduction its output sums over. The product of all is the
    number of ranks.

    Example: ``Split((2, 1, 2, 2))`` cuts an image layer's samples in 2, its height in 2 and its
    width in 2 on 8 ranks; ``Split((2, 4), 2)`` cuts a linear layer's samples in 2 and its
    features in 4, each block computed twice, on 16 ranks; ``Split((1, 4), inputs=8)`` gives
    each of 32 ranks a 2-D block of a linear layer's weight, a quarter of its outputs by an
    eighth of its inputs.

    Input splits (the reduction): each rank multiplies its slice of the input channels by its
    block of the weight, a *partial* output; the ``inputs`` ranks that share an output block
    sum it inside the layer, by an all-reduce (the output is then replicated over them) or, with
    ``scatter``, a reduce-scatter that leaves each of them a part of the block's channels. No
    other layer sees a partial sum. On the mesh the input digit sits next to the channels',
    inside it (varying faster) unless ``inputs_outer``; a reduce-scatter needs it inside, so
    that each rank's part lies in its own block. Consecutive linear layers whose input and
    output digits swap (``c=4,i=8`` then ``i=4,c=8``) hand on with no move at all: the second
    reads its input cut exactly as the first's sum leaves it.
    """

    degrees: tuple[int, ...]
    replicas: int = 1
    inputs: int = 1
    inputs_outer: bool = False
    scatter: bool = False

    def __post_init__(self) -> None:
        if self.inputs < 1:
            raise ValueError(f"a split of the input channels {self.inputs} ways")
        if self.inputs == 1 or self.degrees[CHANNEL_AXIS] == 1:  # one order: one spelling
            object.__setattr__(self, "inputs_outer", False)
        if self.inputs == 1:
            object.__setattr__(self, "scatter", False)
        if self.scatter and self.inputs_outer:
            raise ValueError("a reduce-scatter needs the input digit inside the channels'")
        # hashed once, as a plan's entries that hold it are (and rebuilt, not unpickled)
        object.__setattr__(self, "_hash", hash((self.degrees, self.replicas, self.inputs,
                                                self.inputs_outer, self.scatter)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        return Split, (self.degrees, self.replicas, self.inputs, self.inputs_outer,
                       self.scatter)

    @property
    def procs(self) -> int:
        return math.prod(self.degrees) * self.replicas * self.inputs

    @property
    def grid(self) -> tuple[int, int]:
        """The grid (Pr, Pc) of this split, Pr ranks sharing each of Pc sample blocks."""
        return self.procs // self.degrees[0], self.degrees[0]

    def mesh(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(digit sizes, the axis each cuts) of this split's output, slowest first: the batch,
        the spatial axes in order, the channels and the input channels (``REDUCTION``, the
        order :attr:`inputs_outer` says), the replicas (see the module's text)."""
        channels = [CHANNEL_AXIS, REDUCTION]
        if self.inputs_outer:
            channels.reverse()
        order = [BATCH_AXIS, *range(2, len(self.degrees))]
        sizes = ([self.degrees[a] for a in order]
                 + [self.inputs if a == REDUCTION else self.degrees[a] for a in channels]
                 + [self.replicas])
        return tuple(sizes), (*order, *channels, REPLICAS)

    @property
    def mode(self) -> str:
        """The 1.5D mode this split is, or ``split``: ``batch`` cuts only the samples,
        ``model`` also the channels, ``domain`` the first spatial axis, ``replicated``
        replicates the work over the ranks that share a sample block."""
        cut = [a for a, d in enumerate(self.degrees) if d > 1 and a != BATCH_AXIS]
        if self.inputs > 1:
            return "split"
        if self.replicas > 1:
            return "split" if cut else "replicated"
        if not cut:
            return "batch"
        return {(CHANNEL_AXIS,): "model", (HEIGHT_AXIS,): "domain"}.get(tuple(cut), "split")

    def text(self) -> str:
        """``n=2,c=1,h=2,w=2`` (and ``,r=R`` for replicas): a plan file's form. An input split
        is ``i=Q`` next to ``c``, before it when its digit is the outer one, or ``s=Q`` when
        its sum is a reduce-scatter: ``n=2,c=4,i=8``, ``n=2,i=8,c=4``, ``n=2,c=4,s=8``."""
        letters = axis_letters(len(self.degrees))
        words = [f"{letters[a]}={d}" for a, d in enumerate(self.degrees)]
        if self.inputs > 1:
            words.insert(CHANNEL_AXIS + (0 if self.inputs_outer else 1),
                         f"{'s' if self.scatter else 'i'}={self.inputs}")
        return ",".join(words + ([f"r={self.replicas}"] if self.replicas > 1 else []))

    @classmethod
    def of_mode(cls, mode: str, grid: tuple[int, int], ndim: int) -> Split:
        """The split a 1.5D ``mode`` on ``grid`` (Pr, Pc) gives an output of ``ndim`` axes."""
        pr, pc = grid
        degrees = [pc] + [1] * (ndim - 1)
        if mode == "batch":
            degrees[0] = pr * pc
        elif mode in ("model", "domain"):
            degrees[CHANNEL_AXIS if mode == "model" else HEIGHT_AXIS] = pr
        elif mode == "replicated":
            return cls(tuple(degrees), pr)
        else:
            raise ValueError(f"no split for mode {mode!r}")
        return cls(tuple(degrees))


class Layout:
    """Where each rank's block of a global tensor lies (see the module's text).

    Made as the 1.5D grids are, ``Layout(shape, (Pr, Pc), split_axis, split_ranges)``, or on any
    mesh, ``Layout(shape, mesh=sizes, axes=cut)`` (:meth:`of_split` for a layer's
    :class:`Split`).

    Parameters
    ----------
    shape : global shape, batch first.
    grid : (Pr, Pc): the batch cut Pc ways over the slow digit, ``split_axis`` (or nothing: the
        Pr ranks replicate) cut Pr ways over the fast one.
    split_axis : the axis cut over the Pr model/domain ranks, or None when replicated over them.
    split_ranges : the ranges of the one axis a single digit cuts; block ranges by default (a
        :class:`~hpctrain.layout.partition.BlockRanges`, which stores none of them). Explicit
        ranges arise when flattening a channel-split (N, C, H, W) into (N, C·H·W).
    mesh, axes : the digit sizes, slowest first, and the axis each cuts (``REPLICAS``, -1:
        none). Digits of size 1 are dropped and neighbours on the same axis merged, so that one
        placement of blocks has one spelling.

    ``explicit_ranges`` holds, per axis, that axis's explicit block ranges as a tuple of
    (start, stop), or None where the block rule gives them (and for the batch, and an axis not
    cut): made once, as pricing a move asks for them per axis.

    What the pricing of layers and moves reads of a layout hundreds of thousands of times a
    plan is made once, as plain attributes (a property would run Python code at each read):
    ``size``, the ranks of its group (the whole world's, unless it lies on a group); ``parts``,
    how many blocks each axis is cut into, batch first; ``grid``, (Pr, Pc), Pr ranks sharing
    each of Pc sample blocks; ``replicas``, how many ranks hold each block; ``cut_axes``, the
    axes besides the batch that are cut, in order; ``spatial_cuts``, the spatial ones among
    them (2 is the first), along which a window layer exchanges halos; ``is_grid``, whether
    this is a 1.5D layout, the batch over the slow digit of a Pr×Pc grid and at most one other
    axis cut, over all Pr ranks of the fast one; ``largest_block``, the largest local shape any
    rank holds (blocks differ by at most one along each cut).

    Layouts are immutable; equal when every rank holds the same block. The hash leaves the
    ranges out (they follow from the other fields but for a flattened split, and hashing them
    would cost O(parts)), and is made once: layouts key the cost model's tables, looked up many
    thousand times per plan.
    """

    __slots__ = ("shape", "mesh", "axes", "split_ranges", "first", "procs", "_hash", "_key",
                 "explicit_ranges", "size", "parts", "grid", "replicas", "cut_axes",
                 "spatial_cuts", "is_grid", "largest_block")

    def __init__(self, shape: Sequence[int], grid: tuple[int, int] | None = None,
                 split_axis: int | None = None,
                 split_ranges: Sequence[tuple[int, int]] | None = None, *,
                 mesh: Sequence[int] | None = None, axes: Sequence[int] | None = None,
                 first: int = 0, procs: int | None = None) -> None:
        shape = tuple(shape)
        if mesh is None:
            pr, pc = grid
            mesh, axes = (pc, pr), (BATCH_AXIS, REPLICAS if split_axis is None else split_axis)
        try:
            sizes, cut, parts, size, replicas, is_grid, cut_axes = _mesh_facts(
                tuple(mesh), tuple(axes), len(shape))
        except _NoSuchAxis as err:
            raise ValueError(f"a layout of shape {shape} has no axis {err.args[0]}") from None
        set_ = object.__setattr__
        set_(self, "shape", shape)
        set_(self, "mesh", sizes)
        set_(self, "axes", cut)
        set_(self, "parts", parts)
        ranges = self._ranges(split_ranges)
        set_(self, "split_ranges", ranges)
        procs = size if procs is None else procs
        if first < 0 or first + size > procs:
            raise ValueError(f"a group of {size} ranks from rank {first} does not fit in "
                             f"{procs} ranks")
        set_(self, "first", first)
        set_(self, "procs", procs)
        # facts the pricing of moves asks for many times per layout, made once
        set_(self, "size", size)
        set_(self, "_key", (shape, sizes, cut, first, procs, ranges))
        explicit = ranges is not None and not isinstance(ranges, BlockRanges)
        set_(self, "explicit_ranges", self._explicit_by_axis(ranges) if explicit
             else (None,) * len(shape))
        set_(self, "grid", (size // parts[BATCH_AXIS], parts[BATCH_AXIS]))
        set_(self, "cut_axes", cut_axes)
        set_(self, "spatial_cuts", tuple(a for a in cut_axes if a >= HEIGHT_AXIS))
        set_(self, "replicas", replicas)
        block = [-(-n // p) for n, p in zip(shape, parts, strict=True)]
        if explicit:
            block[cut_axes[0]] = max(hi - lo for lo, hi in ranges)
        set_(self, "largest_block", tuple(block))
        set_(self, "is_grid", is_grid)
        # the world's layouts hash as they always have: a group is the exception
        set_(self, "_hash", hash((shape, sizes, cut)) if size == procs
             else hash((shape, sizes, cut, first, procs)))

    def _ranges(self, given: Sequence[tuple[int, int]] | None) -> Sequence | None:
        """The ranges of the one axis one digit cuts (block ranges unless given), else None."""
        cut = [a for a in self.axes if a not in (REPLICAS, BATCH_AXIS)]
        if len(cut) != 1:
            if given is not None and len(cut) > 1:
                raise ValueError("explicit ranges need a layout that cuts one axis besides "
                                 "the batch")
            return None
        n, parts = self.shape[cut[0]], self.parts[cut[0]]
        if given is None:
            return block_ranges(n, parts)
        given = tuple(tuple(r) for r in given)  # tuples, as every layout keys and compares them
        if len(given) != parts:
            raise ValueError(f"{len(given)} ranges for an axis cut {parts} ways")
        return block_ranges(n, parts) if given == block_ranges(n, parts) else given

    def _explicit_by_axis(self, ranges: Sequence | None) -> tuple:
        """Per axis, its explicit block ranges as a tuple of (start, stop), or None where the
        block rule cuts it (or nothing does, or it is the batch)."""
        if ranges is None or isinstance(ranges, BlockRanges):
            return (None,) * len(self.shape)
        explicit = tuple(tuple(r) for r in ranges)
        return tuple(explicit if axis != BATCH_AXIS and parts > 1 else None
                     for axis, parts in enumerate(self.parts))

    @classmethod
    def of_split(cls, shape: tuple[int, ...], split: Split, cut: Iterable[int] | None = None,
                 reduction: int = REPLICAS) -> Layout:
        """The layout of a tensor of ``shape`` under ``split``, cutting only the axes in
        ``cut`` (all by default); the digits of the others hold replicas. The input-channel
        digit cuts ``reduction`` (the channels of a layer's input, or of an output its sum
        scatters) or holds replicas. ``split`` has a degree per axis of ``shape``."""
        if len(split.degrees) != len(shape):
            raise ValueError(f"split {split} has {len(split.degrees)} degrees for shape {shape}")
        keep = frozenset(range(len(shape)) if cut is None else cut) | {BATCH_AXIS}
        return _layout_of_split(tuple(shape), split, keep, reduction)

    def on_ranks(self, first: int, procs: int) -> Layout:
        """This layout moved onto the ranks ``first …`` of a world of ``procs`` ranks (the
        module's text): the same cuts, held by the group's ranks in the same order."""
        if (first, procs) == (self.first, self.procs):
            return self
        return shared_layout(self.shape, self.mesh, self.axes, self._given_ranges(), first,
                             procs)

    def local(self) -> Layout:
        """This layout on its own group as the whole world (ranks numbered from 0)."""
        return self.on_ranks(0, self.size)

    @property
    def on_group(self) -> bool:
        """Whether the layout lies on a group of ranks smaller than the world."""
        return self.size != self.procs

    @property
    def ranks(self) -> range:
        """The world ranks that hold its blocks."""
        return range(self.first, self.first + self.size)

    def holds(self, rank: int) -> bool:
        """Whether world rank ``rank`` holds a block (it is in the layout's group)."""
        return self.first <= rank < self.first + self.size

    def _given_ranges(self) -> tuple[tuple[int, int], ...] | None:
        """The explicit ranges of the one axis one digit cuts; None where the block rule gives
        them (or no such axis is)."""
        ranges = self.split_ranges
        return None if ranges is None or isinstance(ranges, BlockRanges) else ranges

    # -- identity --------------------------------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("layouts are immutable")

    def __eq__(self, other: object) -> bool:
        # layouts key the cost model's tables: most comparisons are of a layout with itself,
        # or with an equal one made anew, whose fields compare as one tuple
        if self is other:
            return True
        if not isinstance(other, Layout):
            return NotImplemented
        return self._hash == other._hash and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        return shared_layout, (self.shape, self.mesh, self.axes, self._given_ranges(),
                               self.first, self.procs)

    def __repr__(self) -> str:
        return f"Layout({self.shape}, {self.describe()})"

    # -- the mesh ----------------------------------------------------------------------------

    @property
    def split_axis(self) -> int | None:
        """The one axis besides the batch that is cut, or None where none is (for the code
        that knows only the 1.5D grids). A layout that cuts several raises."""
        cut = self.cut_axes
        if len(cut) > 1:
            raise ValueError(f"layout {self.describe()} cuts several axes; ask cut_axes")
        return cut[0] if cut else None

    def coordinates(self, rank: int) -> tuple[int, ...]:
        """``rank``'s coordinate on each digit of the mesh (the last varies fastest). A world
        rank outside the group takes the coordinates of its place in the group's pattern
        repeated over the world (``(rank − first) mod size``): a move between groups picks its
        senders by them (:mod:`hpctrain.layout.moves`)."""
        rank = (rank - self.first) % self.size
        found = []
        for size in reversed(self.mesh):
            found.append(rank % size)
            rank //= size
        return tuple(reversed(found))

    def block_index(self, rank: int, axis: int) -> int:
        """Which of the ``parts[axis]`` blocks of ``axis`` ``rank`` holds."""
        index = 0
        for coordinate, size, cut in zip(self.coordinates(rank), self.mesh, self.axes,
                                         strict=True):
            if cut == axis:
                index = index * size + coordinate
        return index

    def box(self, rank: int) -> Box:
        """The global index ranges held by ``rank``, one (start, stop) per axis; (0, 0) on
        every axis for a rank outside the layout's group, which holds nothing."""
        if not self.holds(rank):
            return tuple((0, 0) for _ in self.shape)
        index = [0] * len(self.shape)
        for coordinate, size, cut in zip(self.coordinates(rank), self.mesh, self.axes,
                                         strict=True):
            if cut != REPLICAS:
                index[cut] = index[cut] * size + coordinate
        box = []
        for axis, (n, parts) in enumerate(zip(self.shape, self.parts, strict=True)):
            if parts == 1:
                box.append((0, n))
            elif self.split_ranges is not None and axis != BATCH_AXIS:
                box.append(tuple(self.split_ranges[index[axis]]))
            else:
                box.append(block_range(n, parts, index[axis]))
        return tuple(box)

    def local_shape(self, rank: int) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.box(rank))

    # -- groups of ranks ---------------------------------------------------------------------

    def digits_of(self, axes: Iterable[int]) -> tuple[int, ...]:
        """The positions of the mesh digits that cut ``axes`` (``REPLICAS`` among them:
        the replica digits)."""
        wanted = set(axes)
        return tuple(k for k, a in enumerate(self.axes) if a in wanted)

    def group(self, axes: Iterable[int]) -> Group:
        """The pattern of the groups of ranks that differ only in their blocks of ``axes``
        (``REPLICAS`` for the replicas), for the cost model (:meth:`digit_group`)."""
        return self.digit_group(self.digits_of(axes))

    def digit_group(self, digits: Sequence[int]) -> Group:
        """The pattern of the groups of ranks that differ only in the mesh ``digits``. Exact
        where those digits are neighbours on the mesh (every 1.5D group); otherwise a pattern of
        the same size whose stride is that of its fastest digit."""
        size = math.prod(self.mesh[k] for k in digits)
        if size == 1:
            return Group(1, 1, self.size)
        stride = math.prod(self.mesh[max(digits) + 1:])
        return Group(size, stride, self.size)

    def group_key(self, rank: int, digits: Iterable[int]) -> int:
        """The same number for ``rank`` and every rank that differs from it only in the
        coordinates of the mesh ``digits``: ``rank`` with those coordinates set to 0 (the
        colour of their communicator). On the mesh (2, 2, 2), digit 1 pairs rank 5 with rank 7:

        >>> layout = Layout((4, 3, 8, 8), mesh=(2, 2, 2), axes=(0, 2, 3))
        >>> layout.group_key(5, (1,)), layout.group_key(7, (1,))
        (5, 5)
        """
        digits = set(digits)
        key, weight = 0, 1
        for k in range(len(self.mesh) - 1, -1, -1):
            if k not in digits:
                key += rank // weight % self.mesh[k] * weight
            weight *= self.mesh[k]
        return key

    def replica_index(self, rank: int) -> int:
        """Which of the :attr:`replicas` copies of its block ``rank`` holds."""
        return self.block_index(rank, REPLICAS)

    def rank_of(self, blocks: Sequence[int], replica: int) -> int:
        """The world rank that holds block ``blocks[a]`` of each axis a, copy ``replica``: the
        inverse of :meth:`block_index` and :meth:`replica_index`."""
        index = [*blocks, replica]  # REPLICAS is -1: the last entry
        rank = 0
        for k, (size, cut) in enumerate(zip(self.mesh, self.axes, strict=True)):
            below = math.prod(s for s, a in zip(self.mesh[k + 1:], self.axes[k + 1:],
                                                strict=True) if a == cut)
            rank = rank * size + index[cut] // below % size
        return self.first + rank

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

    # -- related layouts -------------------------------------------------------------------

    def replicated(self) -> Layout:
        """The same tensor on the same mesh with every cut but the batch's made replicas."""
        return self.without(self.cut_axes)

    def without(self, axes: Iterable[int]) -> Layout:
        """The same tensor on the same mesh, the digits that cut ``axes`` made replicas."""
        drop = set(axes)
        if not drop & set(self.axes):
            return self
        return shared_layout(self.shape, self.mesh,
                             tuple(REPLICAS if a in drop else a for a in self.axes), None,
                             self.first, self.procs)

    def with_shape(self, shape: tuple[int, ...]) -> Layout:
        """A tensor of another ``shape`` (as many axes) cut the same way; explicit ranges kept
        while their axis keeps its length."""
        if shape == self.shape:
            return self
        ranges = self._given_ranges()
        if ranges is not None and shape[self.cut_axes[0]] != self.shape[self.cut_axes[0]]:
            ranges = None
        return shared_layout(tuple(shape), self.mesh, self.axes, ranges, self.first,
                             self.procs)

    def describe(self) -> str:
        """``PrxPc batch/Pc`` and the cuts, and ``on ranks A-B`` for a group."""
        words = self._describe_cuts()
        if self.on_group:
            words += f" on ranks {self.first}-{self.first + self.size - 1}"
        return words

    def _describe_cuts(self) -> str:
        pr, pc = self.grid
        if self.is_grid:
            axis = self.split_axis
            if axis is None:
                split = "replicated" if pr > 1 else "whole"
            else:
                split = ("channels" if len(self.shape) >= 4 else "features"
                         ) if axis == CHANNEL_AXIS else axis_name(self.shape, axis)
                split += f"/{pr}"
            return f"{pr}x{pc} batch/{pc} {split}"
        words = [f"{axis_name(self.shape, a)}/{self.parts[a]}" for a in self.cut_axes]
        if self.replicas > 1:
            words.append(f"replicated/{self.replicas}")
        return f"{pr}x{pc} batch/{pc} " + " ".join(words)


@lru_cache(maxsize=65536)
def _canonical(mesh: tuple[int, ...], axes: tuple[int, ...]
               ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Digits of size 1 dropped, neighbours cutting the same axis (or both replicas) merged.
    Made once per spelling: a split of 2ᵏ ranks is k digits, and a plan lays out thousands."""
    if len(mesh) != len(axes):
        raise ValueError(f"mesh {mesh} and axes {axes} differ in length")
    sizes: list[int] = []
    cut: list[int] = []
    for size, axis in zip(mesh, axes, strict=True):
        if size < 1:
            raise ValueError(f"mesh {mesh} has a digit of size {size}")
        if size == 1:
            continue
        if cut and cut[-1] == axis:
            sizes[-1] *= size
        else:
            sizes.append(size)
            cut.append(axis)
    return tuple(sizes), tuple(cut)


class _NoSuchAxis(ValueError):
    """A mesh digit cuts an axis the layout's shape does not have (the axis)."""


@lru_cache(maxsize=65536)
def _mesh_facts(mesh: tuple[int, ...], axes: tuple[int, ...], ndim: int) -> tuple:
    """What a layout of ``ndim`` axes on ``mesh`` cutting ``axes`` derives from them alone:
    (digit sizes, the axis each cuts, :func:`_canonical`; the parts of each axis; the ranks;
    the replicas; whether it is a 1.5D grid; the axes besides the batch that are cut). Made
    once per spelling: a planner makes thousands of layouts on a few meshes."""
    sizes, cut = _canonical(mesh, axes)
    for axis in cut:
        if axis != REPLICAS and not 0 <= axis < ndim:
            raise _NoSuchAxis(axis)
    parts = [1] * ndim
    for size, axis in zip(sizes, cut, strict=True):
        if axis != REPLICAS:
            parts[axis] *= size
    rest = cut[1:] if cut[:1] == (BATCH_AXIS,) else cut
    return (sizes, cut, tuple(parts), math.prod(sizes),
            math.prod(s for s, a in zip(sizes, cut, strict=True) if a == REPLICAS),
            len(rest) <= 1 and BATCH_AXIS not in rest,
            tuple(a for a in range(1, ndim) if parts[a] > 1))


@lru_cache(maxsize=65536)
def shared_layout(shape: tuple[int, ...], mesh: tuple[int, ...], axes: tuple[int, ...],
                  ranges: tuple[tuple[int, int], ...] | None = None, first: int = 0,
                  procs: int | None = None) -> Layout:
    """``Layout(shape, mesh=mesh, axes=axes, split_ranges=ranges, first=first, procs=procs)``,
    made once and shared (every argument a tuple or a number): a layout is immutable, and a
    planner derives the same ones again and again from others (moved onto a group, reshaped,
    with cuts made replicas, an input split's weight), thousands of times a plan. A shared
    layout also compares equal at once, by identity, where it keys a table."""
    return Layout(shape, mesh=mesh, axes=axes, split_ranges=ranges, first=first, procs=procs)


def shared_channel_digits(layout: Layout) -> tuple[int, ...]:
    """The digits of ``layout``'s mesh along which ranks hold the same channels: the ranks that
    share a layer's weight block, whose gradients are summed (every digit but the channels')."""
    return tuple(k for k, a in enumerate(layout.axes) if a != CHANNEL_AXIS)


@lru_cache(maxsize=65536)
def _layout_of_split(shape: tuple[int, ...], split: Split, keep: frozenset[int],
                     reduction: int) -> Layout:
    """:meth:`Layout.of_split`, made once: a planner lays out the same split of the same
    tensor for many candidates, and a layout is immutable."""
    sizes, axes = split.mesh()
    return Layout(shape, mesh=sizes, axes=tuple(
        reduction if a == REDUCTION else a if a in keep else REPLICAS for a in axes))


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
