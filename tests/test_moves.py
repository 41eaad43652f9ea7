"""Moves between layouts: the per-rank plans against the global brute-force piece list, the
classification against brute-force containment and tiling, and the list of a plan's moves
(pure maths, no MPI)."""

import itertools
import random

import numpy as np
import pytest

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine
from hpctrain.layout.layout import CHANNEL_AXIS, HEIGHT_AXIS, Layout, relative_slices
from hpctrain.layout.moves import (
    AllGatherMove,
    GeneralMove,
    IdentityMove,
    SliceMove,
    move_between,
    parts_overlapping,
    transfer_pieces,
)
from hpctrain.layout.partition import block_range, factorisations
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.placement import input_layout, move_pairs, plan_layouts
from hpctrain.plan.planner import choices_of, evaluate
from hpctrain.plan.plans import plan_from_spec
from hpctrain.plan.pricing import CostModel


def flattened(layout):
    """The (N, C·H·W) layout that flattening a 4-D ``layout`` gives (see placement.py)."""
    n, c, h, w = layout.shape
    ranges = None
    if layout.split_axis == CHANNEL_AXIS:
        ranges = tuple((lo * h * w, hi * h * w) for lo, hi in layout.split_ranges)
    return Layout((n, c * h * w), layout.grid, CHANNEL_AXIS if ranges else None, ranges)


def layouts_of(shape, p):
    """Every layout of ``shape`` on p ranks: each Pr×Pc and each split axis (or none)."""
    axes = (None, CHANNEL_AXIS, HEIGHT_AXIS) if len(shape) == 4 else (None, CHANNEL_AXIS)
    found = []
    for grid in factorisations(p):
        for axis in axes:
            layout = Layout(shape, grid, axis)
            if layout not in found:
                found.append(layout)
    return found


def flat_family(shape, p):
    """2-D layouts of the flattened ``shape``: block splits and the splits flattening gives."""
    n, c, h, w = shape
    found = layouts_of((n, c * h * w), p)
    for grid in factorisations(p):
        layout = flattened(Layout(shape, grid, CHANNEL_AXIS))
        if layout not in found:
            found.append(layout)
    return found


def random_shape(rng, p):
    """A 4-D shape, uneven on most grids; now and then an axis shorter than its parts."""
    n = rng.choice([p, p + 1, 2 * p + 3, rng.randint(1, 3 * p + 2)])
    return (n, rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 3))


def pairs(seed, p, limit):
    """Layout pairs on p ranks (4-D and 2-D), at most ``limit`` of them, drawn reproducibly."""
    rng = random.Random(seed)
    shape = random_shape(rng, p)
    found = list(itertools.product(layouts_of(shape, p), repeat=2))
    found += list(itertools.product(flat_family(shape, p), repeat=2))
    rng.shuffle(found)
    return found[:limit]


CASES = [(p, seed) for p in (1, 2, 3, 4, 5, 6, 8) for seed in range(3)]
CASES += [(p, seed) for p in (12, 16, 30) for seed in range(2)] + [(64, 0), (64, 1)]


def test_parts_overlapping_matches_brute_force():
    rng = random.Random(5)
    for _ in range(3000):
        n, parts = rng.randint(1, 40), rng.randint(1, 12)
        lo = rng.randint(0, n)
        hi = rng.randint(lo, n)
        layout = Layout((n, 4), (1, parts))
        want = []
        for k in range(parts):
            a, b = block_range(n, parts, k)
            if max(a, lo) < min(b, hi):
                want.append((k, (max(a, lo), min(b, hi))))
        assert parts_overlapping(layout, 0, lo, hi) == want, (n, parts, lo, hi)
        cuts = sorted(rng.randint(0, n) for _ in range(parts - 1))  # explicit, some empty
        ranges = tuple(zip([0, *cuts], [*cuts, n], strict=True))
        split = Layout((4, n), (parts, 1), CHANNEL_AXIS, ranges if parts > 1 else None)
        if parts == 1:
            continue
        want = [(k, (max(a, lo), min(b, hi))) for k, (a, b) in enumerate(split.split_ranges)
                if max(a, lo) < min(b, hi)]
        assert parts_overlapping(split, CHANNEL_AXIS, lo, hi) == want, (n, parts, lo, hi)


def assert_each_rank_plans_its_share(move, p):
    """Union over ranks of sends (and kept pieces) = union of receives = the global list."""
    src, dst = move.src, move.dst
    want = sorted((q.sender, q.receiver, q.box) for q in transfer_pieces(src, dst))
    sent, received = [], []
    for rank in range(p):
        plan = move.exchange(rank)
        sent += [(rank, q, box) for q, box in plan.sends]
        received += [(q, rank, box) for q, box in plan.receives]
        kept = [(rank, rank, box) for box in plan.local]
        sent += kept
        received += kept
    assert sorted(sent) == want, (src, dst)
    assert sorted(received) == want, (src, dst)
    return want


@pytest.mark.parametrize("p,seed", CASES)
def test_each_rank_plans_exactly_its_share_of_the_global_pieces(p, seed):
    for src, dst in pairs(seed, p, 150):
        move = move_between(src, dst)
        if isinstance(move, GeneralMove):
            assert_each_rank_plans_its_share(move, p)


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_transfer_pieces_fill_every_target_exactly_once_from_a_holder(p):
    shape = (7, 5, 6, 3)
    for src, dst in itertools.product(layouts_of(shape, p), repeat=2):
        filled = {r: np.zeros(dst.local_shape(r), int) for r in range(p)}
        for piece in transfer_pieces(src, dst):
            src_box = src.box(piece.sender)
            assert all(s0 <= b0 and b1 <= s1
                       for (s0, s1), (b0, b1) in zip(src_box, piece.box, strict=True))
            filled[piece.receiver][relative_slices(piece.box, dst.box(piece.receiver))] += 1
        assert all((f == 1).all() for f in filled.values()), (src, dst)


def _contained(src, dst):
    """Brute force: every rank's target block lies inside its source block."""
    return all(all(s0 <= d0 and d1 <= s1 for (s0, s1), (d0, d1)
                   in zip(src.box(r), dst.box(r), strict=True)) for r in range(dst.size))


def _gather_axis(src, dst):
    """Brute force: the axis along which every target model group's source blocks tile its
    target block in member order, or None."""
    pr = dst.grid[0]
    if pr == 1:
        return None
    found = None
    for first in range(0, dst.size, pr):
        need = dst.box(first)
        blocks = [src.box(first + i) for i in range(pr)]
        axes = [a for a in range(len(need)) if any(b[a] != need[a] for b in blocks)]
        if len(axes) != 1 or found not in (None, axes[0]):
            return None
        found = axes[0]
        edges = [need[found][0]] + [b[found][1] for b in blocks]
        if edges[-1] != need[found][1] or any(b[found][0] != edges[k]
                                              for k, b in enumerate(blocks)):
            return None
    return found


def _degenerate(layout):
    """Some rank's block is empty (an axis shorter than its number of parts)."""
    return any(hi <= lo for r in range(layout.size) for lo, hi in layout.box(r))


@pytest.mark.parametrize("p,seed", CASES)
def test_classification_agrees_with_brute_force(p, seed):
    methods = set()
    for src, dst in pairs(seed, p, 400):
        move = move_between(src, dst)
        method = type(move)
        methods.add(method)
        contained, axis = _contained(src, dst), _gather_axis(src, dst)
        assert (method is IdentityMove) == (src == dst)
        if method is SliceMove:
            assert contained, (src, dst)
            for rank in range(p):
                box = tuple((o0 + s.start, o0 + s.stop)
                            for (o0, _), s in zip(src.box(rank), move.slices(rank), strict=True))
                assert box == dst.box(rank)
        if method is AllGatherMove:
            assert axis is not None, (src, dst)
            for rank in range(p):
                gathered_axis, ranges = move.gathered(rank)
                first = rank - rank % dst.grid[0]
                assert gathered_axis == axis
                assert ranges == tuple(src.box(first + i)[axis] for i in range(dst.grid[0]))
        if src != dst and not contained and axis is None:
            assert method is GeneralMove, (src, dst)
        if not (_degenerate(src) or _degenerate(dst)):  # the structural rules miss nothing
            want = (IdentityMove if src == dst else SliceMove if contained
                    else AllGatherMove if axis is not None else GeneralMove)
            assert method is want, (src, dst)
    if p > 1:
        assert methods == {IdentityMove, SliceMove, AllGatherMove, GeneralMove}


def test_worked_examples():
    shape = (8, 4, 6, 6)
    batch, replicated = Layout(shape, (1, 4)), Layout(shape, (4, 1))
    split = Layout(shape, (4, 1), CHANNEL_AXIS)
    assert type(move_between(batch, batch)) is IdentityMove
    assert type(move_between(batch, replicated)) is AllGatherMove
    assert type(move_between(replicated, split)) is SliceMove
    assert type(move_between(split, replicated)) is AllGatherMove
    assert type(move_between(split, batch)) is GeneralMove
    # 4×1 channel split → 1×4: rank 1 keeps channel 1 of samples 2..3, sends channel 1 of the
    # other samples to their new owners, and receives the other channels of samples 2..3
    plan = move_between(split, batch).exchange(1)
    assert plan.local == (((2, 4), (1, 2), (0, 6), (0, 6)),)
    assert [q for q, _ in plan.sends] == [0, 2, 3]
    assert [q for q, _ in plan.receives] == [0, 2, 3]


def test_replicated_source_sends_each_piece_once():
    """2×2 replicated → 4×1 feature split: ranks 0 and 1 both hold samples 0..3, ranks 2 and 3
    samples 4..7. Each piece comes from one replica, so its gradient goes back to one owner."""
    src, dst = Layout((8, 4), (2, 2)), Layout((8, 4), (4, 1), CHANNEL_AXIS)
    plans = [move_between(src, dst).exchange(r) for r in range(4)]
    # rank 2 needs feature 2 of all samples: samples 4..7 from itself, 0..3 from replica 0
    assert plans[2].local == (((4, 8), (2, 3)),)
    assert plans[2].receives == ((0, ((0, 4), (2, 3))),)
    assert sorted(q for plan in plans for q, _ in plan.sends) == [0, 1, 2, 3]


def test_layouts_must_share_shape_and_ranks():
    with pytest.raises(ValueError, match="shape"):
        move_between(Layout((4, 3), (1, 2)), Layout((4, 5), (1, 2)))
    with pytest.raises(ValueError, match="ranks"):
        move_between(Layout((4, 3), (1, 2)), Layout((4, 3), (1, 4)))


@pytest.mark.parametrize("spec", ["conv=domain:2x2,fc=4x1", "conv=4x1,fc=2x2", "1x4"])
def test_a_plans_moves_join_the_layouts_the_cost_model_prices(spec):
    net, batch, procs = load_net("smallcnn"), 8, 4
    plan = plan_from_spec(spec, net, procs)
    model = CostModel(net, batch, procs, Machine("test", 1e-6, 1e-9, 1e9), FlopModel(1e9))
    layouts = plan_layouts(net, plan, batch, procs)
    priced = [pair for k, choice in enumerate(choices_of(model, plan))
              for pair in model.segment_layouts(k, choice)]
    assert layouts == priced
    pairs = move_pairs(net, layouts, input_layout(net, plan, batch, procs))
    assert [dst for _, dst in pairs[:-1]] == [layer.input for layer in layouts]
    assert [src for src, _ in pairs[1:]] == [layer.output for layer in layouts]
    assert pairs[-1][1] == layouts[-1].output.replicated()


BRANCHING = """input channels=2 size=12 classes=3
conv name=c1 out=6 kernel=3 pad=1
batchnorm
relu name=r1
maxpool name=side in=input kernel=3 stride=1 pad=1
conv name=c2 in=side out=6 kernel=1
add in=r1,c2
avgpool kernel=global
flatten
linear out=3
"""


@pytest.mark.parametrize("net_name,spec", [
    ("resdigits", "resdigits-p4-mixed"), ("resdigits", "conv=domain:2x2,fc=4x1"),
    ("inception_v3", "inception_v3-p4-mixed"), ("branching", "conv=domain:4x1,fc=2x2"),
    ("branching", "2x2")])
def test_on_graphs_the_cost_model_prices_the_layouts_and_moves_that_run(net_name, spec):
    """Every layer's layouts, where the batch is produced, and every move the network makes
    (each priced once) are the cost model's too — here with a branch reading the input."""
    net = (parse_net(BRANCHING, "branching") if net_name == "branching"
           else load_net(net_name, 75 if net_name == "inception_v3" else None))
    batch, procs = 8, 4
    plan = plan_from_spec(spec, net, procs)
    model = CostModel(net, batch, procs, Machine("test", 1e-6, 1e-9, 1e9), FlopModel(1e9))
    choices = choices_of(model, plan)
    layouts = plan_layouts(net, plan, batch, procs)
    priced = {}
    for k, choice in enumerate(choices):
        priced.update(zip(model.segments[k], model.segment_layouts(k, choice), strict=True))
    assert [priced[k] for k in range(len(net.layers))] == layouts
    source = input_layout(net, plan, batch, procs)
    assert model.input_layout(choices[0]) == source
    planned = evaluate(model, choices, timed=False)
    moved = sum(model.move_cost(src, dst)[1] for src, dst in move_pairs(net, layouts, source))
    assert sum(c.redistribution[0] for c in [*planned.layers, planned.loss]) == pytest.approx(
        moved, rel=1e-12)
