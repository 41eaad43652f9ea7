"""Layouts on meshes: a degree per axis, several axes at once, replicas anywhere on the mesh —
blocks, coordinates, the 1.5D grids as special cases, and every move between two such layouts
against brute force (pure maths, no MPI)."""

import itertools
import pickle
import random

import numpy as np
import pytest

from hpctrain.layout.layout import (
    CHANNEL_AXIS,
    HEIGHT_AXIS,
    REPLICAS,
    Layout,
    Split,
    relative_slices,
)
from hpctrain.layout.moves import (
    AllGatherMove,
    GeneralMove,
    IdentityMove,
    SliceMove,
    move_between,
)
from hpctrain.layout.moves import (
    _busiest_receiver_on_meshes as busiest_on_meshes,
)
from hpctrain.layout.partition import factorisations, ordered_factorisations
from tests.test_moves import assert_each_rank_plans_its_share


def random_mesh_layout(rng, shape, p):
    """A layout of ``shape`` on ``p`` ranks: p cut into random digits, each cutting a random
    axis or holding replicas."""
    sizes, left = [], p
    while left > 1:
        d = rng.choice([f for f in range(2, left + 1) if left % f == 0])
        sizes.append(d)
        left //= d
    axes = [rng.choice([REPLICAS, *range(len(shape))]) for _ in sizes]
    return Layout(shape, mesh=sizes, axes=axes)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6, 8, 12])
def test_mesh_blocks_tile_the_tensor_once_per_replica(p):
    rng = random.Random(p)
    shape = (7, 5, 6, 9)
    for _ in range(40):
        layout = random_mesh_layout(rng, shape, p)
        count = np.zeros(shape, int)
        for r in range(p):
            count[relative_slices(layout.box(r), tuple((0, n) for n in shape))] += 1
        assert (count == layout.replicas).all(), layout
        assert layout.largest_block == tuple(
            max(hi - lo for lo, hi in axis)
            for axis in zip(*(layout.box(r) for r in range(p)), strict=True))


@pytest.mark.parametrize("p", [2, 4, 6, 8, 12])
def test_rank_of_inverts_the_block_and_replica_indices(p):
    rng = random.Random(10 + p)
    for _ in range(40):
        layout = random_mesh_layout(rng, (8, 6, 12, 12), p)
        for rank in range(p):
            blocks = [layout.block_index(rank, a) for a in range(4)]
            assert layout.rank_of(blocks, layout.replica_index(rank)) == rank


def test_the_grids_are_meshes_of_two_digits():
    shape = (8, 6, 10, 10)
    for pr, pc in factorisations(12):
        for axis in (None, CHANNEL_AXIS, HEIGHT_AXIS):
            grid = Layout(shape, (pr, pc), axis)
            mesh = Layout(shape, mesh=(pc, pr), axes=(0, REPLICAS if axis is None else axis))
            assert grid == mesh and hash(grid) == hash(mesh) and grid.is_grid
            assert [grid.box(r) for r in range(12)] == [mesh.box(r) for r in range(12)]
    # the modes as splits give the same layouts
    assert Layout.of_split(shape, Split.of_mode("model", (4, 3), 4)) == Layout(
        shape, (4, 3), CHANNEL_AXIS)
    assert Layout.of_split(shape, Split.of_mode("domain", (4, 3), 4)) == Layout(
        shape, (4, 3), HEIGHT_AXIS)
    assert Layout.of_split((8, 6), Split.of_mode("replicated", (4, 3), 2)) == Layout(
        (8, 6), (4, 3))


def test_a_split_names_its_mode():
    assert Split((2, 2, 1, 1)).mode == "model"
    assert Split((2, 1, 2, 1)).mode == "domain"
    assert Split((4, 1, 1, 1)).mode == "batch"
    assert Split((2, 1), 2).mode == "replicated"
    assert Split((1, 1, 2, 2)).mode == "split"
    assert Split((2, 2), 2).mode == "split"
    assert Split((1, 2, 1, 2, 2)).text() == "n=1,c=2,d=1,h=2,w=2"


def test_worked_example_of_the_module_text():
    """8 ranks, 2 sample blocks each cut 2×2 in height and width: rank 5 holds sample block 1,
    height block 0 and width block 1."""
    layout = Layout.of_split((4, 3, 6, 6), Split((2, 1, 2, 2)))
    assert layout.box(5) == ((2, 4), (0, 3), (0, 3), (3, 6))
    assert layout.describe() == "4x2 batch/2 height/2 width/2"
    # a conv's input keeps each rank's spatial block when the output's channels are cut
    out = Layout.of_split((4, 8, 6, 6), Split((1, 2, 2, 2)))
    x = Layout.of_split((4, 3, 6, 6), Split((1, 2, 2, 2)), cut=(2, 3))
    for rank in range(8):
        assert out.box(rank)[2:] == x.box(rank)[2:]
    assert x.replicas == 2 and x.cut_axes == (2, 3)


def test_single_axis_questions_refuse_a_multi_axis_layout():
    layout = Layout.of_split((4, 3, 6, 6), Split((1, 1, 2, 2)))
    with pytest.raises(ValueError, match="several axes"):
        layout.split_axis  # noqa: B018
    assert layout.without((3,)).split_axis == HEIGHT_AXIS


def test_a_pickled_mesh_layout_is_equal():
    layout = Layout.of_split((4, 3, 6, 6, 6), Split((1, 2, 2, 1, 2), 2))
    copy = pickle.loads(pickle.dumps(layout))
    assert copy == layout and hash(copy) == hash(layout) and copy.box(13) == layout.box(13)


def mesh_pairs(seed, p, count, shape=(6, 5, 7, 9)):
    rng = random.Random(seed)
    for _ in range(count):
        yield random_mesh_layout(rng, shape, p), random_mesh_layout(rng, shape, p)


@pytest.mark.parametrize("p,seed", [(2, 0), (3, 1), (4, 2), (6, 3), (8, 4), (12, 5)])
def test_every_move_between_meshes_is_exact(p, seed):
    """Each rank's part of a general move makes up the brute-force piece list; a slice's new
    block lies inside the old one; an all-gather's group holds the target block between its
    members in order; and the price's busiest receiver is the brute force's."""
    for src, dst in mesh_pairs(seed, p, 60):
        move = move_between(src, dst)
        if isinstance(move, IdentityMove):
            assert src == dst
        elif isinstance(move, SliceMove):
            for rank in range(p):
                inner, outer = dst.box(rank), src.box(rank)
                assert all(o0 <= i0 and i1 <= o1 for (i0, i1), (o0, o1)
                           in zip(inner, outer, strict=True)), (src, dst)
        elif isinstance(move, AllGatherMove) and not (src.is_grid and dst.is_grid):
            (digit,) = move.digits
            for rank in range(p):
                axis, ranges = move.gathered(rank)
                members = [q for q in range(p) if all(
                    c == d for k, (c, d) in enumerate(zip(dst.coordinates(q),
                                                          dst.coordinates(rank), strict=True))
                    if k != digit)]
                assert [src.box(q)[axis] for q in members] == list(ranges)
        want = assert_each_rank_plans_its_share(GeneralMove(src, dst), p)
        share, messages = busiest_on_meshes(src, dst)
        by_rank_share, by_rank_messages = 0.0, 0
        for rank in range(p):
            need = np.prod([hi - lo for lo, hi in dst.box(rank)])
            from_others = [q for q in want if q[1] == rank and q[0] != rank]
            moved = sum(np.prod([hi - lo for lo, hi in box]) for _, _, box in from_others)
            by_rank_share = max(by_rank_share, moved / need if need else 0.0)
            by_rank_messages = max(by_rank_messages, len(from_others))
        assert share == pytest.approx(by_rank_share), (src, dst)
        assert messages == by_rank_messages, (src, dst)


def test_structured_methods_arise_between_meshes():
    """The moves a multi-axis layer needs are cheap where they can be: its channel-whole input
    to its channel-cut output is a slice; gathering one axis back is an all-gather."""
    shape = (4, 8, 6, 6)
    out = Layout.of_split(shape, Split((1, 2, 2, 2)))
    x = Layout.of_split(shape, Split((1, 2, 2, 2)), cut=(2, 3))
    assert type(move_between(x, out)) is SliceMove
    assert type(move_between(out, x)) is AllGatherMove
    assert type(move_between(out, out.without((2,)))) is AllGatherMove
    assert type(move_between(out, Layout(shape, (1, 8)))) is GeneralMove


@pytest.mark.parametrize("p", [4096, 65536])
def test_a_ranks_share_of_a_move_between_meshes_costs_no_more_than_its_pieces(p):
    """At P = 4096 and 65,536 one rank's part of a move from a depth×height×width split to a
    batch split visits only its own pieces (no O(P) set-up per rank)."""
    shape = (64, 16, 32, 32, 32)
    src = Layout.of_split(shape, Split((p // 4096, 1, 16, 16, 16)))
    dst = Layout.of_split(shape, Split((64, 1, 1, 1, 1), p // 64))
    part = GeneralMove(src, dst).exchange(p - 1)
    assert len(part.receives) + len(part.local) <= 16 * 16 * 16
    assert all(q < p for q, _ in part.sends)


def test_every_split_of_a_small_tensor_is_a_layout():
    """Every split of 8 ranks over (n, c, h, w) of a 4-sample 8-channel 8×8 tensor gives a
    layout whose blocks tile it (a smoke test over the whole space of degrees)."""
    seen = 0
    for degrees in itertools.product((1, 2, 4, 8), repeat=4):
        if np.prod(degrees) != 8:
            continue
        layout = Layout.of_split((4, 8, 8, 8), Split(degrees))
        assert layout.parts == degrees
        seen += 1
    assert seen == 20


@pytest.mark.parametrize("p,seed,shape", [
    (2, 0, (64, 32, 64, 64)), (4, 1, (64, 32, 64, 64)), (8, 2, (12, 6, 7, 5)),
    (16, 3, (64, 32, 64, 64)), (32, 4, (16, 8, 7, 7, 7)), (64, 5, (256, 64, 56, 56)),
    (64, 6, (3, 5, 7, 9)), (1024, 7, (4096, 64, 7, 7)), (512, 8, (8, 4, 16, 16, 16))])
def test_the_busiest_receiver_of_power_of_two_meshes_from_the_bits(p, seed, shape):
    """Where every digit is a power of two the price is found from the bits of the rank
    numbers (even axes in closed form, uneven ones per group of shared bits); it is the one
    found rank by rank, for even and uneven blocks, empty ones, and at many ranks."""
    from hpctrain.layout.moves import _busiest_receiver_by_mesh_rank, _busiest_receiver_of_bits

    count = 40 if p > 64 else 150
    for src, dst in mesh_pairs(seed, p, count, shape=shape):
        found = _busiest_receiver_of_bits(src, dst)
        assert found is not None
        share, messages = _busiest_receiver_by_mesh_rank(src, dst)
        assert found[0] == pytest.approx(share, abs=1e-15), (src, dst)
        assert found[1] == messages, (src, dst)


def test_the_busiest_receiver_of_flattened_blocks_from_the_bits():
    """A flattened channel split cuts its features by explicit ranges: priced from the bits
    as rank by rank, into and out of every split of the flat tensor."""
    from hpctrain.layout.moves import _busiest_receiver_by_mesh_rank, _busiest_receiver_of_bits
    from hpctrain.model.kinds import KINDS

    rng = random.Random(0)
    checked = 0
    for p in (4, 8, 16):
        flats = [Layout.of_split((8, 180), Split(d[:2], d[2]))
                 for d in ordered_factorisations(p, 3)]
        splits = [d for d in ordered_factorisations(p, 5)
                  if all(k <= n for k, n in zip(d, (8, 12, 3, 5)))]
        for _ in range(40):
            d = rng.choice(splits)
            x = Layout.of_split((8, 12, 3, 5), Split(d[:4], d[4]))
            _, flat = KINDS["flatten"].layouts(None, (x,), (8, 180), None)
            for src, dst in ((flat, y) for y in flats):
                for a, b in ((src, dst), (dst, src)):
                    share, messages = _busiest_receiver_by_mesh_rank(a, b)
                    assert _busiest_receiver_of_bits(a, b) == (pytest.approx(share, abs=1e-15),
                                                               messages), (a, b)
                    checked += 1
    assert checked > 1000
