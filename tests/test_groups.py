"""Layers on groups of ranks, without MPI: layouts on a block of the world's ranks, moves
between groups against the brute-force piece list, their price against each rank's part, plan
files with ``ranks A-B`` and their refusals, the schedule every rank follows and the critical
path that prices it."""

import pickle
import random

import numpy as np
import pytest

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import load_machine
from hpctrain.layout.layout import CHANNEL_AXIS, Layout, box_size, relative_slices
from hpctrain.layout.moves import (
    GeneralMove,
    _busiest_receiver_by_mesh_rank,
    move_between,
    transfer_pieces,
)
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.placement import input_layout, plan_layouts, schedule
from hpctrain.plan.planner import evaluate, evaluate_placed, format_plan
from hpctrain.plan.plans import (
    LayerPlan,
    PlanError,
    parse_plan,
    parse_ranks,
    plan_from_spec,
    plan_text,
)
from hpctrain.plan.pricing import CostModel
from hpctrain.plan.side_by_side import critical_path
from tests.grouped_plans import grouped_plan
from tests.mpi.test_groups import BRANCHES_NET
from tests.test_moves import assert_each_rank_plans_its_share, layouts_of, random_shape


def test_a_layout_on_a_group_holds_nothing_outside_it():
    layout = Layout((8, 4), (2, 2), CHANNEL_AXIS, first=4, procs=8)
    assert [layout.box(r) for r in range(4)] == [((0, 0), (0, 0))] * 4
    assert layout.box(5) == ((0, 4), (2, 4)) == layout.local().box(1)
    assert layout.rank_of((1, 0), 0) == 6 and list(layout.ranks) == [4, 5, 6, 7]
    assert layout.describe() == "2x2 batch/2 features/2 on ranks 4-7"
    assert layout.on_group and not layout.local().on_group
    assert layout != layout.local() and pickle.loads(pickle.dumps(layout)) == layout
    assert layout.with_shape((8, 6)).first == 4 and layout.replicated().procs == 8
    # the world's layouts hash as before groups existed (the cost model's tables key on them)
    assert hash(layout.local()) == hash(Layout((8, 4), (2, 2), CHANNEL_AXIS))


def random_pair(rng, p):
    """Two layouts of one random shape on random blocks of p ranks (the world among them)."""
    shape = random_shape(rng, p)
    placed = []
    for _ in range(2):
        size = rng.choice([p, rng.randint(1, p)])
        first = rng.randint(0, p - size)
        placed.append(rng.choice(layouts_of(shape, size)).on_ranks(first, p))
    return placed


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_moves_between_groups_send_every_piece_once_from_a_holder(p):
    rng = random.Random(p)
    for _ in range(60):
        src, dst = random_pair(rng, p)
        move = move_between(src, dst)
        if src.first != dst.first or src.size != dst.size:
            assert isinstance(move, GeneralMove)
        if isinstance(move, GeneralMove):
            assert_each_rank_plans_its_share(move, p)
        filled = {r: np.zeros(dst.local_shape(r), int) for r in range(p)}
        for piece in transfer_pieces(src, dst):
            assert all(s0 <= b0 and b1 <= s1 for (s0, s1), (b0, b1)
                       in zip(src.box(piece.sender), piece.box, strict=True))
            filled[piece.receiver][relative_slices(piece.box, dst.box(piece.receiver))] += 1
        assert all((f == 1).all() for f in filled.values()), (src, dst)


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_a_move_between_groups_is_priced_at_its_busiest_receiver(p):
    """The share of its block a rank receives and the messages it takes, rank by rank from the
    pieces each rank plans, against the vector formula of the price."""
    rng = random.Random(10 + p)
    for _ in range(40):
        src, dst = random_pair(rng, p)
        if src.first == dst.first and src.size == dst.size:
            continue
        move = GeneralMove(src, dst)
        share, messages = 0.0, 0
        for rank in dst.ranks:
            need = box_size(dst.box(rank))
            if not need:
                continue
            plan = move.exchange(rank)
            share = max(share, sum(box_size(b) for _, b in plan.receives) / need)
            messages = max(messages, len(plan.receives))
        found = _busiest_receiver_by_mesh_rank(src, dst)
        assert found == pytest.approx((share, messages)), (src, dst)


def test_plan_files_give_groups_and_read_back():
    plan = grouped_plan(BRANCHES_NET, 4, 8, offset=1)
    # three branches on 4 ranks: aligned blocks of 2, 1 and 1 ranks
    assert {e.ranks for e in plan} == {None, (0, 2), (2, 1), (3, 1)}
    assert parse_plan(plan_text(BRANCHES_NET, plan), "p", BRANCHES_NET, 4) == plan
    assert "a1 domain 2x1 ranks 0-1" in plan_text(BRANCHES_NET, plan).splitlines()
    assert parse_ranks("0-3", 4, "p", "stem") is None  # every rank of 4: no group


@pytest.mark.parametrize("text,message", [
    ("b1 batch 1x2 ranks 3-4", "layer b1: ranks 3-4 are not a block of the ranks 0-3"),
    ("b1 batch 1x2 ranks 2-1", "ranks 2-1 are not a block"),
    ("b1 batch 1x2 ranks two", "is not a block of ranks; write ranks A-B"),
    ("b1 model 2x2 ranks 0-1", "grid 2x2 needs 4 processes but ranks 0-1 are 2"),
    ("b1 split n=1,c=4 ranks 0-1", "needs 4 processes but ranks 0-1 are 2"),
    ("b1 batch 1x2 on 0-1", "expected 'NAME MODE RxC'"),
])
def test_bad_groups_in_plan_files_are_refused_in_one_line(text, message):
    with pytest.raises(PlanError, match=message) as err:
        parse_plan(text, "p.plan", BRANCHES_NET, 4)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def _with(plan, **entries):
    names = [spec.name for spec in BRANCHES_NET.layers]
    plan = list(plan)
    for name, entry in entries.items():
        plan[names.index(name)] = entry
    return plan


def test_plans_that_cannot_run_on_their_groups_are_refused_naming_the_layer():
    world = grouped_plan(BRANCHES_NET, 4, 8)
    cases = [
        (_with(world, b1=LayerPlan("batch", (1, 3), ranks=(0, 3)),
               b2=LayerPlan("batch", (1, 2), ranks=(2, 2))),
         "layer b2 on ranks 2-3 overlaps layer b1 on ranks 0-2"),
        (_with(world, stem=LayerPlan("batch", (1, 2), ranks=(0, 2))), "layer stem reads the "
                                                                       "input batch"),
        (_with(world, fc=LayerPlan("batch", (1, 2), ranks=(2, 2))), "last layer fc runs on "
                                                                    "ranks 2-3"),
    ]
    for plan, message in cases:
        with pytest.raises(PlanError, match=message):
            plan_layouts(BRANCHES_NET, plan, 8, 4)
    # c joins a and b, but the region of x ends at d, which reads a too: c joins no region
    net = parse_net("""
        input channels=2 size=5 classes=3
        conv name=x out=2 kernel=1
        conv name=a out=2 kernel=1
        conv name=b in=x out=2 kernel=1
        add name=c in=a,b
        add name=d in=c,a
        flatten
        linear name=fc out=3
    """, "crossed")
    plan = [LayerPlan("batch", (1, 4)), LayerPlan("batch", (1, 2), ranks=(0, 2)),
            LayerPlan("batch", (1, 2), ranks=(2, 2)), *[LayerPlan("follow")] * 3,
            LayerPlan("batch", (1, 4))]
    with pytest.raises(PlanError, match="layer c reads layers on different groups"):
        plan_layouts(net, plan, 8, 4)
    # nested groups are allowed: a region on 0-1, 2-2 and 3-3, another on 0-0, 2-3 and 3-3
    nested = _with(world, f1=LayerPlan("batch", (1, 1), ranks=(0, 1)),
                   f2=LayerPlan("batch", (1, 1), ranks=(0, 1)),
                   g1=LayerPlan("batch", (1, 2), ranks=(2, 2)))
    plan_layouts(BRANCHES_NET, nested, 8, 4)


@pytest.mark.parametrize("name", ["alexnet", "resdigits", "inception_v3", "resnet50"])
def test_without_groups_the_schedule_is_the_nets_order(name):
    net = load_net(name)
    plan = plan_from_spec("1x4", net, 4)
    layouts = plan_layouts(net, plan, 8, 4)
    order = schedule(net, layouts, input_layout(net, plan, 8, 4))
    want = [(k, e) for k in range(len(net.layers)) for e in [*range(len(net.producers(k))),
                                                             None]]
    assert [(s.layer, s.input) for s in order] == want


@pytest.mark.parametrize("procs", [2, 3, 4, 8])
def test_the_schedule_forks_every_group_before_any_group_runs(procs):
    """A topological order in which, per region on groups, every step on every rank (the moves
    out of the fork, the pool on the fork's ranks) comes before the first step on a group: no
    group waits for another's branch to reach its input."""
    net = load_net("inception_v3", 75)
    plan = grouped_plan(net, procs, 8)
    layouts = plan_layouts(net, plan, 8, procs)
    order = schedule(net, layouts, input_layout(net, plan, 8, procs))
    position = {(s.layer, s.input): i for i, s in enumerate(order)}
    assert len(position) == len(order) == sum(len(net.producers(k)) + 1
                                              for k in range(len(net.layers)))
    for k in range(len(net.layers)):  # topological: inputs moved after their producers ran
        for e, p in enumerate(net.producers(k)):
            assert position[k, e] < position[k, None]
            assert p < 0 or position[p, None] < position[k, e]
    from hpctrain.model.regions import fork_join_regions
    for region in fork_join_regions(net):
        grouped = [position[k, None] for k in region.inside if layouts[k].output.on_group]
        if not grouped or region.fork >= 0 and layouts[region.fork].output.on_group:
            continue  # no groups, or a region inside one group's branch
        forking = [position[k, e] for k in region.inside for e, p in enumerate(net.producers(k))
                   if p == region.fork] + [position[k, None] for k in region.inside
                                           if not layouts[k].output.on_group]
        assert max(forking) < min(grouped), region


def test_the_critical_path_runs_groups_side_by_side():
    world, left, right = ((0, 4),), ((0, 2),), ((2, 2),)
    steps = [(world, 1.0, 10.0), (left, 2.0, 20.0), (right, 3.0, 30.0), (left, 4.0, 40.0),
             (world + left, 1.0, 1.0)]
    # forward: 1, then left 2 + 4 beside right 3, then the join: 1 + 6 + 1
    # backward: join 1, left 40 + 20 beside right 30, then 10: 1 + 60 + 10
    assert critical_path(steps, 4) == (8.0, 71.0)
    assert critical_path([(world, 1.0, 2.0)] * 3, 4) == (3.0, 6.0)


@pytest.mark.parametrize("name,spec", [("resdigits", "conv=domain:2x2,fc=4x1"),
                                       ("inception_v3", "2x2"), ("resnet18", "1x4")])
def test_without_groups_the_placed_prices_are_the_segments(name, spec):
    """Pricing a plan layer by layer from the layouts it runs on gives the times the segment
    model gives (the planner's): one cost model, two ways to add it up."""
    net = load_net(name, {"resdigits": None, "inception_v3": 75}.get(name, 64))
    model = CostModel(net, 16, 4, load_machine("dgx-h100"), FlopModel(1e13))
    plan = plan_from_spec(spec, net, 4)
    segments = evaluate(model, [plan[k] for k in model.heads])
    placed = evaluate_placed(model, plan)
    assert placed.iteration_time == pytest.approx(segments.iteration_time, rel=1e-12)
    for a, b in zip(placed.layers, segments.layers, strict=True):
        assert a.total == pytest.approx(b.total, rel=1e-12, abs=1e-18)
    assert placed.side_by_side == pytest.approx(0.0, abs=1e-15)


def test_plan_tables_show_each_layers_group_and_what_running_side_by_side_saves():
    model = CostModel(BRANCHES_NET, 8, 4, load_machine("dgx-h100"), FlopModel(1e12))
    plan = grouped_plan(BRANCHES_NET, 4, 8)
    planned = evaluate_placed(model, plan)
    text = format_plan(planned)
    assert "ranks 0-1" in text and "ranks 3-3" in text and "groups side by side" in text
    total = sum(c.total for c in [*planned.layers, planned.loss, planned.data])
    assert 0 < planned.side_by_side < total
    assert planned.iteration_time == pytest.approx(total + planned.last_bucket
                                                   - planned.side_by_side)
