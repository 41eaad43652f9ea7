"""What makes planning fast keeps its numbers: the move tables gathered from a model's grid of
priced moves against each move priced on its own, and the plans of a search that reuses those
prices against the plans of one made on a fresh model."""

import collections
import math
import random

import numpy as np
import pytest

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import load_machine
from hpctrain.layout.layout import CHANNEL_AXIS, Layout
from hpctrain.model.net import load_net
from hpctrain.plan.planner import _move_grid, plan_network
from hpctrain.plan.pricing import CostModel


def model_of(name, batch, procs, machine="dgx-h100"):
    profile = load_machine(machine)
    return CostModel(load_net(name), batch, procs, profile, FlopModel(profile.flops))


def join_layouts(model, space="balanced"):
    """Per join of the net (layer, input, producer): the producer's output and the layer's
    input under every choice of their segments."""
    owner = {k: s for s, members in enumerate(model.segments) for k in members}
    every = [model.choices(s) + model.split_choices(s, space)
             for s in range(len(model.segments))]
    laid = [[dict(zip(model.segments[s], model.runnable_layouts(s, c), strict=True))
             for c in found] for s, found in enumerate(every)]
    for k, e, p in model.joins:
        if p >= 0:
            yield (k, [where[p].output for where in laid[owner[p]]],
                   [where[k].inputs[e] for where in laid[owner[k]]])


@pytest.mark.parametrize("name, procs", [("resdigits", 8), ("minibranch", 6),
                                         ("inception_v3", 4)])
@pytest.mark.parametrize("weighed", [False, True])
def test_the_grid_of_moves_prices_each_as_a_move_alone(name, procs, weighed):
    """Every pair of layouts at every join, asked for in random subsets and orders (rows and
    columns met in any order, some asked twice), against each pair's move and memory alone."""
    model, fresh = model_of(name, 16, procs), model_of(name, 16, procs)
    rng = random.Random(procs)
    for k, sources, targets in join_layouts(model):
        for _ in range(3):
            srcs = rng.sample(sources, rng.randint(1, len(sources))) + [None]
            dsts = rng.sample(targets, rng.randint(1, len(targets))) + [None]
            rng.shuffle(srcs)
            rng.shuffle(dsts)
            grid = _move_grid(model, srcs, dsts, k, weighed)
            for i, src in enumerate(srcs):
                for j, dst in enumerate(dsts):
                    if src is None or dst is None:
                        assert (grid[i, j] == 0.0).all()
                        continue
                    move, *seconds = model.move_cost(src, dst)  # read back from the grid
                    alone, *by_itself = fresh.move_cost(src, dst)
                    assert (type(move), move.src, move.dst, seconds) == (
                        type(alone), alone.src, alone.dst, by_itself)
                    alone = (sum(by_itself), 0.0, 0.0)
                    if weighed:
                        kept, held = fresh.move_memory(src, dst, k)
                        alone = alone[0], sum(kept.values()), sum(held.values())
                    assert tuple(grid[i, j]) == alone
            pairs = [(i, j) for i in range(len(srcs)) for j in range(len(dsts))
                     if rng.random() < 0.5]
            if pairs:
                some = _move_grid(model, srcs, dsts, k, weighed, pairs)
                assert np.array_equal(some, np.array([grid[i, j] for i, j in pairs]))


@pytest.mark.parametrize("name, procs, machine", [("resdigits", 8, "dgx-h100"),
                                                  ("minibranch", 16, "cori-knl"),
                                                  ("inception_v3", 8, "dgx-h100")])
def test_searches_that_share_a_models_prices_plan_as_fresh_ones(name, procs, machine):
    """The grids with groups, then balanced, on one model (each search reusing the moves the
    ones before priced), against each search on a model of its own."""
    shared = model_of(name, 32, procs, machine)
    for space, groups in (("grids", True), ("balanced", False), ("grids", False)):
        fresh = plan_network(model_of(name, 32, procs, machine), space=space, groups=groups)
        again = plan_network(shared, space=space, groups=groups)
        assert again.plans == fresh.plans
        assert again.iteration_time == fresh.iteration_time


@pytest.mark.parametrize("p", [4, 6, 8, 16])
def test_moves_alike_but_for_their_sizes_share_one_busiest_receiver(p):
    """The busiest receiver found once per key (an axis cut evenly on both sides scaled to
    its least length) is what each move's own computation gives: of the bits, or rank by
    rank, on the world and between groups."""
    from hpctrain.layout.moves import (
        _busiest_receiver_by_mesh_rank,
        _busiest_receiver_of_bits,
        _busiest_receiver_on_meshes,
        _busiest_receiver_rank_by_rank,
    )
    from tests.test_mesh_layouts import random_mesh_layout

    rng = random.Random(p)
    for _ in range(150):
        base = (p * rng.choice([1, 2, 3]), rng.choice([4, 5, 8]), rng.choice([6, 7, 12]), 2)
        scaled = tuple(n * rng.choice([2, 3, 5]) for n in base)
        size = rng.choice([s for s in (p, p // 2, p // 4) if s >= 1 and p % s == 0])
        first = rng.choice(range(0, p - size + 1, size))
        drawn = [random_mesh_layout(rng, base, p), random_mesh_layout(rng, base, size),
                 random_mesh_layout(rng, base, p)]
        for shape in (base, scaled):  # the second finds the first's price where keys agree
            src, dst, world = (Layout(shape, mesh=d.mesh, axes=d.axes) for d in drawn)
            dst = dst.on_ranks(first, p)
            assert _busiest_receiver_by_mesh_rank(dst, src) == (
                _busiest_receiver_rank_by_rank(dst, src))
            assert _busiest_receiver_by_mesh_rank(src, dst) == (
                _busiest_receiver_rank_by_rank(src, dst))
            alone = _busiest_receiver_of_bits(src, world)
            if alone is None:
                alone = _busiest_receiver_rank_by_rank(src, world)
            assert _busiest_receiver_on_meshes(src, world) == alone


@pytest.mark.parametrize("name, batch, procs, machine", [("alexnet", 256, 64, "dgx-h100"),
                                                         ("vgg16", 96, 12, "cori-knl"),
                                                         ("mlp", 64, 16, "dgx-h100"),
                                                         ("alexnet", 2048, 4096, "cori-knl")])
@pytest.mark.parametrize("space", ["grids", "balanced"])
def test_a_chain_without_a_cap_is_searched_as_its_labels_would_be(name, batch, procs, machine,
                                                                  space, monkeypatch):
    """The search of a chain with no memory cap, one matrix per segment, against the labels'
    search it stands for: the same plan, ties broken alike, and the same time to the bit."""
    from hpctrain.plan import planner

    fast = plan_network(model_of(name, batch, procs, machine), space=space)
    monkeypatch.setattr(planner, "_heads_fed_from_outside", lambda *_: False)
    labels = plan_network(model_of(name, batch, procs, machine), space=space)
    assert fast.plans == labels.plans
    assert fast.iteration_time == labels.iteration_time


@pytest.mark.parametrize("seed", range(6))
def test_the_moves_left_unpriced_never_decide_a_column(seed):
    """Of a segment's pairs, those the bound leaves unpriced: with every move priced, each
    column's least and its first least row are the same, ties included (small integers, so
    many rows tie), and fewer distinct moves are priced."""
    from hpctrain.plan.planner import _worth_pricing

    rng = np.random.default_rng(seed)
    n_rows, n_cols, n_srcs, n_dsts = 40, 30, 12, 9
    times = rng.integers(0, 6, n_rows).astype(float)
    times[rng.random(n_rows) < 0.1] = np.inf  # rows no label reaches
    own = rng.integers(0, 4, n_cols).astype(float)
    rows, cols = rng.integers(0, n_srcs, n_rows), rng.integers(0, n_dsts, n_cols)
    every = rng.integers(0, 5, (n_srcs, n_dsts)).astype(float)
    later, upper = 1.0, 9.0
    priced = np.isfinite(times)[:, None] & ((times[:, None] + own[None, :]) + later <= upper)
    asked = []

    def price(pairs):
        asked.extend(pairs)
        return np.array([[every[i, j], 0.0, 0.0] for i, j in pairs]).reshape(-1, 3)

    moves = np.full((n_srcs, n_dsts), np.nan)
    needed = _worth_pricing(times, own, priced, rows, cols, moves, later, upper, price)
    assert len(asked) == len(set(asked))  # each move priced once

    def least(mask, table):
        reached = times[:, None] + (table[np.ix_(rows, cols)] + own[None, :])
        reached = np.where(mask & (reached + later <= upper), reached, np.inf)
        back = np.argmin(reached, axis=0)
        return back, reached[back, np.arange(n_cols)]

    back, fastest = least(needed, moves)
    all_back, all_fastest = least(priced, every)
    assert np.array_equal(fastest, all_fastest)
    assert np.array_equal(back, all_back)
    every_pair = {(int(rows[r]), int(cols[c])) for r, c in zip(*np.nonzero(priced))}
    assert set(asked) <= every_pair and len(asked) < len(every_pair)


@pytest.mark.parametrize("p, shape", [(8, (6, 5, 7, 9)), (16, (64, 12, 8, 8)),
                                      (32, (3, 33, 5, 17)), (64, (128, 96, 35, 35)),
                                      (256, (512, 192, 17, 17)), (1024, (2048, 8, 7, 7))])
def test_the_busiest_receiver_between_aligned_groups_from_the_bits(p, shape):
    """Between aligned groups of 2^k ranks (a group and the world, nested groups, groups
    apart) the busiest receiver found from the bits of the rank numbers is, to the bit, the
    one found rank by rank: for even and uneven blocks, empty ones and flattened ranges."""
    from hpctrain.layout.moves import (
        _busiest_receiver_of_aligned_bits,
        _busiest_receiver_rank_by_rank,
    )
    from hpctrain.model.kinds import KINDS
    from tests.test_mesh_layouts import random_mesh_layout

    rng = random.Random(p)
    flat = (shape[0], math.prod(shape[1:]))
    found = 0
    for _ in range(120 if p <= 64 else 30):
        flattened = rng.random() < 0.25  # a flattened split cuts by explicit ranges
        layouts = []
        for _ in range(2):
            size = rng.choice([p >> k for k in range(4) if p >> k >= 1])
            layout = random_mesh_layout(rng, shape, size)
            if flattened:
                channels = layout.without(a for a in layout.cut_axes if a != CHANNEL_AXIS)
                one_digit = channels.split_ranges is not None  # what flatten takes
                layout = (KINDS["flatten"].layouts(None, (layout,), flat, None)[1]
                          if one_digit and rng.random() < 0.7
                          else random_mesh_layout(rng, flat, size))
            layouts.append(layout.on_ranks(rng.randrange(0, p, size), p))
        for a, b in (layouts, layouts[::-1]):
            fast = _busiest_receiver_of_aligned_bits(a, b)
            if fast is not None:
                found += 1
                slow = _busiest_receiver_rank_by_rank(a, b)
                assert fast == slow and type(fast[0]) is float, (a, b, fast, slow)
    assert found > 30


@pytest.mark.parametrize("p", [8, 16, 32])
def test_a_receiver_outside_the_source_group_is_found_without_enumerating(p):
    """Into a layout whose group holds the source's group and more, the busiest receiver is
    one outside the source's group: it keeps nothing of a block that meets the most source
    blocks along every axis, found without enumerating the bits of the ranks, where the
    bits that say who is outside index no unevenly cut axis. Where they do, the outside ranks
    hold only some of those blocks, and the bits are enumerated. Both, to the bit, as rank
    by rank, on blocks even and uneven, empty ones included."""
    from hpctrain.layout.moves import (
        _axis_bits,
        _busiest_receiver_of_aligned_bits,
        _busiest_receiver_rank_by_rank,
        _cut_axis_keys,
    )
    from tests.test_mesh_layouts import random_mesh_layout

    rng = random.Random(p)
    kinds = collections.Counter()  # whether the outside bits index an uneven axis
    for _ in range(400):
        shape = (rng.choice([p, 2 * p]), rng.choice([3, 5, 6, 12]), rng.choice([3, 5, 10, 17]),
                 rng.choice([1, 3, 8]))
        small = p >> rng.choice([1, 2, 3])
        src = random_mesh_layout(rng, shape, small).on_ranks(rng.randrange(0, p, small), p)
        dst = random_mesh_layout(rng, shape, p)
        above = small.bit_length() - 1  # the bits of the ranks that say who is outside
        kinds[any(b >= above for a, _, even in _cut_axis_keys(src, dst) if not even
                  for b in _axis_bits(dst)[a])] += 1
        found = _busiest_receiver_of_aligned_bits(src, dst)
        assert found == _busiest_receiver_rank_by_rank(src, dst), (src, dst)
    assert min(kinds[True], kinds[False]) > 50, kinds


@pytest.mark.parametrize("seed", range(6))
def test_ranks_whose_even_axes_agree_or_not_stand_for_every_value_of_their_bits(seed):
    """The values of a group with evenly cut axes, from the enumerated bits alone and two
    kinds of rank per value, equal those found from every value of every bit, where an even
    axis keeps its share exactly where its pairs of bits agree: on random groups of up to 9
    bits with membership, uneven axes, pairs, fixed bits and pairs that can never agree."""
    from hpctrain.layout.moves import _aligned_group_values

    rng = random.Random(seed)
    checked = 0
    for _ in range(60):
        width = rng.randint(1, 9)
        bits = list(range(width))
        factors = [("member", tuple(rng.sample(bits, rng.randint(0, min(2, width)))),
                    rng.choice([0, 1, -1]))]
        if factors[0][1] == ():
            factors[0] = ("member", (), rng.choice([0, -1]))
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.4:  # an uneven axis on a few bits
                s_bits = tuple(rng.sample(bits, rng.randint(0, min(2, width))))
                d_bits = tuple(rng.sample(bits, rng.randint(1, min(2, width))))
                n = rng.randint(1, 9)
                factors.append(("axis", (n, 1 << len(s_bits), 1 << len(d_bits), None, None),
                                s_bits, d_bits))
            else:  # an even one: pairs of bits, bits against fixed values
                edges = tuple(tuple(rng.sample(bits, 2)) for _ in range(rng.randint(0, 3))
                              if width >= 2)
                pins = tuple((rng.choice(bits), rng.randint(0, 1))
                             for _ in range(rng.randint(0, 2)))
                s, d = 1 << rng.randint(0, 3), 1 << rng.randint(0, 3)
                factors.append(("even", min(8 // s, 8 // d) / (8 // d), max(1, s // d),
                                edges, pins, rng.random() < 0.05))
        factors = tuple(factors)
        found = _aligned_group_values(width, factors)
        every = _aligned_group_values_every_bit(width, factors)
        assert found[1:] == every[1:], factors
        assert _product_least(found[0]) == _product_least(every[0]), factors
        checked += 1
    assert checked == 60


def _product_least(tuples):
    """The least product over a group's least tuples, as the combination reads them."""
    return min((math.prod(t) for t in tuples), default=None)


def _aligned_group_values_every_bit(width, factors):
    """``_aligned_group_values``'s tuple computed from every value of every bit (the even
    axes' shares and blocks met per value), by the plain code the even factors replace, and
    summed up as it sums up its two kinds of rank per value."""
    from hpctrain.layout.moves import (
        _axis_bounds,
        _axis_parts_met,
        _bit_field,
        _group_summary,
    )

    values = np.arange(1 << width, dtype=np.int64)
    member = np.ones(len(values), dtype=bool)
    shares, met = [], np.ones(len(values), dtype=np.int64)
    empty = np.zeros(len(values), dtype=bool)
    for factor in factors:
        if factor[0] == "member":
            member = _bit_field(values, factor[1]) == factor[2]
        elif factor[0] == "even":
            _, share, most, edges, pins, never = factor
            agree = np.full(len(values), not never)
            for a, b in edges:
                agree &= (values >> a & 1) == (values >> b & 1)
            for b, value in pins:
                agree &= (values >> b & 1) == value
            shares.append(np.where(agree, share, 0.0))
            met *= most
        else:
            _, (n, s_parts, d_parts, s_ranges, d_ranges), s_bits, d_bits = factor
            s0, s1 = _axis_bounds(n, s_parts, s_ranges, _bit_field(values, s_bits))
            d0, d1 = _axis_bounds(n, d_parts, d_ranges, _bit_field(values, d_bits))
            empty |= d1 <= d0
            shares.append(np.clip(np.minimum(s1, d1) - np.maximum(s0, d0), 0, None)
                          / np.maximum(d1 - d0, 1))
            met *= _axis_parts_met(n, s_parts, s_ranges, d0, d1)
    return _group_summary(member, shares, met, empty)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_search_runs_with_no_walk_of_cycles_and_leaves_the_collector_as_it_found_it(enabled):
    """No collection of reference cycles runs while ``plan_over`` searches (each would walk
    every price the search has made), and the collector is on after it exactly where it was
    on before."""
    import gc

    from hpctrain.plan.spaces import plan_over

    model = model_of("minibranch", 32, 8)
    walks = []

    def count(phase, info):
        if phase == "start":
            walks.append(info["generation"])

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    gc.callbacks.append(count)
    try:
        plan_over(model)
        assert gc.isenabled() == enabled
    finally:
        gc.callbacks.remove(count)
        (gc.enable if was else gc.disable)()
    assert walks == []


@pytest.mark.parametrize("weighed", [False, True])
def test_tables_made_for_one_free_share_serve_another_as_if_made_for_it(weighed):
    """A net with branches searched with the hideable share of its sums counted free reuses
    the tables a search counting them made (the moves do not change, the segments' own costs
    do): each table is the one a fresh model makes for that share, on a subset of the choices
    too."""
    from hpctrain.plan.planner import _plan_tables

    profile = load_machine("dgx-h100")
    net = load_net("inception_v3")

    def fresh():
        return CostModel(net, 32, 8, profile, FlopModel(profile.flops), overlap=True)

    shared = fresh()
    assert shared.hidden_share > 0
    every = [shared.choices(k) for k in range(len(shared.segments))]
    some = [found[::2] for found in every]
    _plan_tables(shared, every, weighed, 0.0)
    for candidates in (every, some):
        again = _plan_tables(shared, candidates, weighed, shared.hidden_share)
        alone = _plan_tables(fresh(), candidates, weighed, shared.hidden_share)
        assert len(again) == len(alone)
        for a, b in zip(again, alone, strict=True):
            assert a.variables == b.variables
            for field in ("values", "memory", "moment"):
                assert np.array_equal(getattr(a, field), getattr(b, field))


@pytest.mark.parametrize("below", [math.inf, 1.5e-4])
def test_tables_with_regions_on_groups_serve_another_free_share_as_if_made_for_it(below):
    """The tables of a search that weighs regions on groups, made counting every sum, serve
    the search with the hideable share counted free (and a round of the last buckets below
    the same latency): each table the one a fresh model makes for that share."""
    from hpctrain.plan.grouped import GroupedSpace
    from hpctrain.plan.planner import _plan_tables

    profile = load_machine("dgx-h100")
    net = load_net("inception_v3")

    def fresh():
        return CostModel(net, 256, 64, profile, FlopModel(profile.flops), overlap=True)

    shared = fresh()
    every = [shared.choices(k) for k in range(len(shared.segments))]
    made = _plan_tables(shared, every, False, 0.0, GroupedSpace(shared, every, 0.0, below))
    share = shared.hidden_share
    space = GroupedSpace(shared, every, share, below)
    assert any(space.extra)
    again = _plan_tables(shared, every, False, share, space)
    assert len(shared.grouped_tables[below]) == 1  # made once, and served again
    model = fresh()
    alone = _plan_tables(model, every, False, share, GroupedSpace(model, every, share, below))
    assert len(again) == len(alone) == len(made)
    assert any(not np.array_equal(a.values, b.values) for a, b in zip(made, again))
    for a, b in zip(again, alone, strict=True):
        assert a.variables == b.variables and np.array_equal(a.values, b.values)


def test_a_planned_model_is_freed_by_its_last_reference_with_the_collector_paused():
    """What a search keeps (the model's prices, tables and regions) holds no cycle back to
    the model: with no collection of cycles at all, dropping the model and its plan frees it,
    so a run that plans again and again (``--replan-after``) does not keep the old models."""
    import gc
    import weakref

    from hpctrain.plan.spaces import plan_over

    was = gc.isenabled()
    gc.disable()
    try:
        model = model_of("minibranch", 32, 8)
        plan = plan_over(model)
        gone = weakref.ref(model)
        del model, plan
        assert gone() is None
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("p", [4, 8, 12, 64, 1024])
@pytest.mark.parametrize("machine, itemsize", [("dgx-h100", 4), ("cori-knl", 2),
                                               ("default", 4), ("perlmutter-cpu", 4)])
def test_general_moves_in_closed_form_price_as_one_by_one(p, machine, itemsize):
    """Many general moves priced at once (:func:`general_seconds_in_closed_form`) give each the
    float :meth:`GeneralMove.seconds` gives it alone, to the bit: between random layouts on
    meshes and 1.5D grids, on the world and on groups (on the same ranks, nested or apart), cut
    by explicit ranges or not, evenly or not, on P powers of two and not; a pair it leaves to
    one by one (NaN) is one outside its closed form, or one between groups whose receivers'
    index of an unevenly cut block is partly fixed by where the groups lie."""
    from hpctrain.layout.moves import (
        GeneralMove,
        _axis_bits,
        general_seconds_in_closed_form,
        move_between,
    )
    from hpctrain.model.kinds import KINDS
    from tests.test_mesh_layouts import random_mesh_layout

    profile = load_machine(machine)
    rng = random.Random(p)
    closed = uneven = 0
    kinds = collections.Counter()  # (same ranks, target's group starts in source's, and back)
    for _ in range(12):
        shape = (p * rng.choice([1, 2]), rng.choice([4, 6, 8, 12]), rng.choice([5, 8, 16]),
                 rng.choice([2, 3, 4]))
        flat = (shape[0], math.prod(shape[1:]))
        flattened = rng.random() < 0.3
        laid = []
        for _ in range(24):
            size = rng.choice([p >> k for k in range(3) if (p >> k) and p % (p >> k) == 0])
            layout = random_mesh_layout(rng, shape, size)
            if rng.random() < 0.3:
                layout = Layout(shape, (size // (size & -size), size & -size),
                                rng.choice([None, CHANNEL_AXIS]))
            if flattened:
                one = layout.without(a for a in layout.cut_axes if a != CHANNEL_AXIS)
                layout = (KINDS["flatten"].layouts(None, (layout,), flat, None)[1]
                          if one.split_ranges is not None and rng.random() < 0.7
                          else random_mesh_layout(rng, flat, size))
            laid.append(layout.on_ranks(rng.randrange(0, p, size) if size < p else 0, p))
        srcs, dsts = laid[:12], laid[12:]
        pairs = [(i, j) for i in range(12) for j in range(12)
                 if isinstance(move_between(srcs[i], dsts[j]), GeneralMove)]
        si, di = (np.array([pair[k] for pair in pairs], dtype=np.int64) for k in (0, 1))
        found = general_seconds_in_closed_form(srcs, dsts, si, di, profile, itemsize)
        for (i, j), seconds in zip(pairs, found, strict=True):
            src, dst = srcs[i], dsts[j]
            cut = [a for a in range(len(src.shape)) if src.parts[a] > 1 or dst.parts[a] > 1]
            same = src.first == dst.first and src.size == dst.size
            placed = same or src.first % src.size == 0 and dst.first % dst.size == 0
            powers = _axis_bits(src) is not None and _axis_bits(dst) is not None
            plain = all(src.explicit_ranges[a] is None and dst.explicit_ranges[a] is None
                        for a in cut)
            cuts = [(src.shape[a], src.parts[a], dst.parts[a]) for a in cut]
            even = plain and all(n % s == 0 and n % d == 0 for n, s, d in cuts)
            filled = plain and all(s <= n and d <= n for n, s, d in cuts) and sum(
                n % s != 0 or n % d != 0 for n, s, d in cuts) <= 2
            grids = src.is_grid and dst.is_grid
            if not (placed and powers and (same and grids or filled)):
                assert np.isnan(seconds), (src, dst)  # outside the closed form
                continue
            # evenly cut, or on the same ranks: every receiver's bits free
            assert not np.isnan(seconds) or not (even or same), (src, dst)
            if np.isnan(seconds):
                continue  # a varying block's index partly fixed by where the groups lie
            closed += 1
            uneven += not even
            kinds[same, src.first <= dst.first < src.first + src.size,
                  dst.first <= src.first < dst.first + dst.size] += 1
            alone = GeneralMove(src, dst).seconds(profile, itemsize)
            assert alone == (seconds, seconds), (src, dst, alone, seconds)
    assert closed > 30 if p & (p - 1) == 0 else closed == 0, closed  # 12: none
    assert uneven > 10 if p & (p - 1) == 0 else uneven == 0, uneven
    assert len(kinds) == (5 if p & (p - 1) == 0 else 0), kinds  # nested either way, or apart


def random_move_layouts(rng, p, count):
    """``count`` layouts of one random shape on ``p`` ranks, alike enough that every method
    of a move is among their pairs: 1.5D grids (every Pr, split or not), layouts on two meshes
    (so that many pairs share one, a cut made replicas or the other way), sometimes flattened
    with explicit ranges, on the world or on groups."""
    from hpctrain.layout.layout import REPLICAS
    from hpctrain.layout.partition import SplitError
    from hpctrain.model.kinds import KINDS

    shape = (p * rng.choice([1, 2]), rng.choice([4, 6, 8]), rng.choice([5, 8]),
             rng.choice([2, 3]))
    flat = (shape[0], math.prod(shape[1:]))
    sizes = [p >> k for k in range(3) if (p >> k) and p % (p >> k) == 0]
    meshes = {}
    for size in sizes:
        meshes[size] = []
        for _ in range(2):
            digits, left = [], size
            while left > 1:
                digits.append(2 if left % 2 == 0 and rng.random() < 0.7 else
                              rng.choice([f for f in range(2, left + 1) if left % f == 0]))
                left //= digits[-1]
            meshes[size].append(digits)
    flattened = rng.random() < 0.3
    laid = []
    while len(laid) < count:
        size = rng.choice(sizes)
        try:
            if rng.random() < 0.4:
                pr = rng.choice([d for d in range(1, size + 1) if size % d == 0])
                made = [Layout(shape, (pr, size // pr), rng.choice([None, CHANNEL_AXIS, 2]))]
            else:
                digits = rng.choice(meshes[size])
                axes = [rng.choice([REPLICAS, 0, 1, 2, 3]) for _ in digits]
                made = [Layout(shape, mesh=digits, axes=axes)]
                alone = [k for k, a in enumerate(axes) if a > 0 and axes.count(a) == 1]
                if alone and rng.random() < 0.7:  # its sibling, one axis's cut made replicas
                    axes[rng.choice(alone)] = REPLICAS
                    made.append(Layout(shape, mesh=digits, axes=axes))
            if flattened:
                ones = [layout.without(a for a in layout.cut_axes if a != CHANNEL_AXIS)
                        for layout in made]
                made = [KINDS["flatten"].layouts(None, (one,), flat, None)[1]
                        if one.split_ranges is not None and rng.random() < 0.7
                        else Layout(flat, (1, size)) for one in ones]
        except (SplitError, ValueError):
            continue
        first = rng.randrange(0, p, size) if size < p and rng.random() < 0.5 else 0
        laid += [layout.on_ranks(first, p) for layout in made]
    return laid[:count]


@pytest.mark.parametrize("p", [4, 8, 12, 64])
def test_many_moves_at_once_take_the_method_and_price_of_each_alone(p):
    """:func:`methods_between` picks for every pair of random layouts the method
    :func:`move_between` picks, and :meth:`CostModel.move_arrays` gives each pair the floats a
    fresh model's :meth:`CostModel.move_cost` gives it alone, both ways and with a forward
    alone; a None among the layouts, never indexed, is passed over."""
    from hpctrain.layout.moves import METHODS, methods_between

    rng = random.Random(p)
    seen = collections.Counter()
    for _ in range(10):
        laid = random_move_layouts(rng, p, 16)
        srcs, dsts = [*laid, None], [None, *laid]
        pairs = [(i, j) for i in range(16) for j in range(1, 17)]
        rng.shuffle(pairs)
        si, di = (np.array([pair[k] for pair in pairs], dtype=np.int64) for k in (0, 1))
        found = methods_between(srcs, dsts, si, di)
        for inference in (False, True):
            model, fresh = (model_of("resdigits", 16, p, "cori-knl") for _ in range(2))
            model.inference = fresh.inference = inference
            methods, forward, backward = model.move_arrays(srcs, dsts, si, di)
            assert np.array_equal(methods, found)
            for m, (i, j) in enumerate(pairs):
                src, dst = srcs[i], dsts[j]
                alone, f, b = fresh.move_cost(src, dst)
                assert METHODS[found[m]] is type(alone), (src, dst)
                assert (forward[m], backward[m]) == (f, b), (src, dst)
                seen[type(alone).__name__, src.is_grid and dst.is_grid] += 1
    for method in ("SliceMove", "AllGatherMove", "GeneralMove"):  # on grids and on meshes
        assert seen[method, True] and seen[method, False], seen
    assert seen["IdentityMove", True], seen


@pytest.mark.parametrize("name, procs, machine, inference", [
    ("vgg16", 64, "dgx-h100", False), ("inception_v3", 16, "dgx-h100", False),
    ("resdigits", 8, "cori-knl", True)])
def test_the_moves_of_a_join_priced_at_once_are_those_priced_one_by_one(name, procs, machine,
                                                                       inference):
    """Every move of every join of a net's balanced space, made by
    :meth:`CostModel.price_moves` at once, is the move a fresh model makes alone: the same
    method and the same seconds both ways, a forward alone included."""
    profile = load_machine(machine)
    together, alone = (CostModel(load_net(name), 2 * procs, procs, profile,
                                 FlopModel(profile.flops), inference=inference)
                       for _ in range(2))
    moves = 0
    for _, sources, targets in join_layouts(together):
        srcs, dsts = list(dict.fromkeys(sources)), list(dict.fromkeys(targets))
        together.price_moves((src, dst) for src in srcs for dst in dsts)
        for src in srcs:
            for dst in dsts:
                move, forward, backward = together.move_cost(src, dst)
                fresh, f, b = alone.move_cost(src, dst)
                assert (type(move), move.src, move.dst, forward, backward) == (
                    type(fresh), fresh.src, fresh.dst, f, b)
                moves += 1
    assert moves > 1000


@pytest.mark.parametrize("name, procs", [("minibranch", 8), ("resdigits", 4)])
def test_a_layers_memory_found_when_first_read_is_what_pricing_it_at_once_gives(name, procs):
    """A layer's memory is found when first read: a plan's memory, layer by layer, with and
    without a cap (which reads every candidate's), is what a model that reads each layer's as
    soon as it prices it finds; a plan keeps its memory once its model is gone; copies of one
    price have tables of their own; a cost pickles."""
    import gc
    import pickle
    import weakref

    from hpctrain.plan.spaces import plan_over

    def tables(planned):
        return [(c.layer, c.resident, c.transient)
                for c in (*planned.layers, planned.loss, planned.data)]

    eager = model_of(name, 32, procs)
    price = eager._price_layer

    def priced_with_memory(*args):
        cost = price(*args)
        cost.memory_found()
        return cost

    eager._price_layer = priced_with_memory
    expected = [tables(plan_over(eager, cap)) for cap in (None, 4 * 2**30)]
    planned, gone = [], []
    for cap in (None, 4 * 2**30):  # a model each: a cap's search reads every price
        lazy = model_of(name, 32, procs)
        assert all(callable(c.memory_of)  # nothing read yet
                   for c in lazy.segment_cost(1, lazy.choices(1)[0]).layers)
        planned.append(plan_over(lazy, cap))
        gone.append(weakref.ref(lazy))
        del lazy
    gc.collect()
    assert all(ref() is None for ref in gone)
    assert [tables(p) for p in planned] == expected  # read after the models are gone

    fresh = model_of(name, 32, procs)
    k, choice = fresh.heads[1], fresh.choices(1)[-1]
    where = fresh.runnable_layouts(1, choice)[0]
    one, two = (fresh.layer_cost(k, choice.mode, where, None) for _ in range(2))
    assert callable(one.memory_of) and callable(two.memory_of)
    one.resident["extra"] = 1.0
    assert "extra" not in two.resident and "extra" not in fresh.layer_cost(
        k, choice.mode, where, None).resident
    again = pickle.loads(pickle.dumps(fresh.layer_cost(k, choice.mode, where, None)))
    assert again.resident == two.resident and again.transient == two.transient
