"""The planner over every axis (``space="axes"``): a degree for each axis of a weighted
layer's output and replicas, searched exactly — against brute force over the whole space, never
worse than the 1.5D plan, and under a memory cap that no 1.5D plan fits."""

import itertools
import re

import pytest

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine
from hpctrain.model.net import parse_net
from hpctrain.plan.planner import PlannerError, evaluate, format_plan, plan_network
from hpctrain.plan.pricing import CostModel

MACHINE = Machine("test", alpha=2e-6, beta=1 / 6e9, flops=1e11)
SLOW_NET = Machine("slow", alpha=1e-4, beta=1 / 1e8, flops=1e12)

NET = """input channels=2 size=12 classes=5
conv out=4 kernel=3 pad=1
relu
conv out=8 kernel=3 pad=1
relu
maxpool kernel=2
flatten
linear out=5
"""

WIDE = """# few samples, few channels, large images: the spatial axes are what can be cut
input channels=1 size=64 classes=3
conv out=2 kernel=5 pad=2
relu
conv out=2 kernel=5 pad=2
relu
avgpool kernel=global
flatten
linear out=3
"""


def model_of(text, batch, procs, machine):
    return CostModel(parse_net(text, "t"), batch, procs, machine, FlopModel(machine.flops))


def every_plan(model, space="axes"):
    options = [model.choices(k) + model.split_choices(k, space)
               for k in range(len(model.segments))]
    return [evaluate(model, list(combo)) for combo in itertools.product(*options)]


@pytest.mark.parametrize("text,batch,procs,machine", [
    (NET, 4, 4, MACHINE), (NET, 2, 4, SLOW_NET), (WIDE, 1, 4, MACHINE), (WIDE, 2, 4, SLOW_NET),
    (NET, 3, 3, SLOW_NET)])
def test_the_plan_over_every_axis_is_the_brute_force_optimum(text, batch, procs, machine):
    model = model_of(text, batch, procs, machine)
    every = every_plan(model)
    best = min(p.iteration_time for p in every)
    planned = plan_network(model, space="axes")
    assert planned.iteration_time == pytest.approx(best, rel=1e-12)
    assert planned.iteration_time <= plan_network(model).iteration_time * (1 + 1e-12)
    # and under caps between the leanest plan's memory and the fastest's
    needs = sorted({p.memory for p in every if p.memory < planned.memory})
    for cap in needs[::max(1, len(needs) // 4)]:
        capped = plan_network(model, cap, space="axes")
        assert capped.memory <= cap
        assert capped.iteration_time == pytest.approx(
            min(p.iteration_time for p in every if p.memory <= cap), rel=1e-12)


BRANCHED = """# a residual block: the add joins two segments that are not consecutive
input channels=2 size=16 classes=3
conv name=stem out=4 kernel=3 pad=1
relu name=stem_relu
conv name=a out=4 kernel=3 pad=1
batchnorm name=a_bn
add in=a_bn,stem_relu
relu
avgpool kernel=global
flatten
linear out=3
"""


@pytest.mark.parametrize("text,batch,procs,machine", [
    (NET, 4, 4, MACHINE), (WIDE, 1, 8, MACHINE), (WIDE, 2, 4, SLOW_NET),
    (BRANCHED, 2, 4, MACHINE), (BRANCHED, 1, 8, SLOW_NET)])
def test_the_balanced_plan_is_the_brute_force_optimum_of_its_space(text, batch, procs, machine):
    """Over the balanced splits the planner is exact too, on chains and on a net with a
    branch; the space lies between the grids and every split, and so does its optimum."""
    from hpctrain.plan.segments import balanced_degrees, whole_degrees

    model = model_of(text, batch, procs, machine)
    best = min(p.iteration_time for p in every_plan(model, "balanced"))
    planned = plan_network(model, space="balanced")
    assert planned.iteration_time == pytest.approx(best, rel=1e-12)
    assert planned.iteration_time <= plan_network(model).iteration_time * (1 + 1e-12)
    assert planned.iteration_time >= plan_network(model, space="axes").iteration_time * (
        1 - 1e-12)
    for k in range(len(model.segments)):
        shape = (batch, *model.net.out_shapes[model.heads[k]])
        assert set(balanced_degrees(procs, shape)) <= set(whole_degrees(procs, shape))
        for choice in model.split_choices(k, "balanced"):
            n, c, *spatial = choice.split.degrees
            assert batch % n == 0 and shape[1] % c == 0
            assert all(size % d == 0 for size, d in zip(shape[2:], spatial))
            assert spatial == sorted(spatial, reverse=True) and (
                not spatial or spatial[0] <= 2 * spatial[-1])
            assert choice.split.replicas == 1 or not spatial


def test_balanced_degrees_give_one_spatial_split_per_number_of_spatial_ranks():
    from hpctrain.plan.segments import balanced_degrees

    found = balanced_degrees(64, (64, 64, 32, 32, 32))
    assert (4, 2, 2, 2, 2, 1) in found and (1, 1, 4, 4, 4, 1) in found
    assert (1, 1, 8, 4, 2, 1) not in found and (1, 1, 2, 4, 2, 1) not in found
    spatial = {}
    for n, c, *cut, _ in found:
        spatial.setdefault(64 // (n * c), set()).add(tuple(cut))
    assert all(len(cuts) == 1 for cuts in spatial.values())
    assert len(found) == 28  # C(6 + 2, 2): n, c and the spatial ranks
    assert (2, 8, 4) in balanced_degrees(64, (4, 16))  # linear: replicas, no spatial axes
    assert (2, 8, 4) not in balanced_degrees(64, (4, 10))  # 8 does not divide 10
    assert not [d for d in balanced_degrees(8, (3, 6, 7, 7)) if d[0] > 1 or d[2] > 1]


def test_the_whole_space_is_refused_where_it_is_too_large_naming_the_balanced_one():
    """At many ranks every split of every layer is too many pairs to price: refused at once,
    before any is priced, with the sizes and the balanced space named; that one answers."""
    import time

    from hpctrain.model.net import load_net

    model = CostModel(load_net("resnet50"), 4096, 4096, MACHINE, FlopModel(MACHINE.flops))
    started = time.perf_counter()
    with pytest.raises(PlannerError, match=r"--space axes: .* 4096 ranks .* pairs of them to "
                                           r"price.*use --space balanced"):
        plan_network(model, space="axes")
    assert time.perf_counter() - started < 30  # counted, not priced (a loose bound)
    # two 64×64 images of 2 channels on 512 ranks: no 1.5D plan, a balanced one
    wide = CostModel(parse_net(WIDE, "wide"), 2, 512, MACHINE, FlopModel(MACHINE.flops))
    with pytest.raises(PlannerError, match="--space balanced"):
        plan_network(wide)
    balanced = plan_network(wide, space="balanced")
    assert balanced.exact and balanced.plans[0].split.degrees[2:] in ((16, 16), (16, 8),
                                                                       (32, 16))


def test_large_images_of_one_sample_are_cut_in_height_and_width():
    """One 64×64 sample of 2 channels on 4 ranks: the batch cannot be cut and the channels
    only in 2, so the planner cuts the image, and over every axis it may cut both."""
    model = model_of(WIDE, 1, 4, MACHINE)
    planned = plan_network(model, space="axes")
    grids = plan_network(model)
    assert planned.iteration_time <= grids.iteration_time
    chosen = [p for p in planned.plans if p.mode != "follow"]
    assert any(p.mode in ("split", "domain") for p in chosen), format_plan(planned)


def test_a_cap_no_grid_plan_fits_is_met_by_splitting_more_axes():
    """A cap below every 1.5D plan's memory, above the leanest plan over every axis: the grids
    refuse, the axes plan fits."""
    model = model_of(WIDE, 1, 4, SLOW_NET)
    every = every_plan(model)
    grids_least = min(evaluate(model, list(combo)).memory for combo in itertools.product(
        *[model.choices(k) for k in range(len(model.segments))]))
    axes_least = min(p.memory for p in every)
    if axes_least >= grids_least:
        pytest.skip("no split is leaner than the leanest 1.5D plan here")
    cap = (axes_least + grids_least) / 2
    with pytest.raises(PlannerError):
        plan_network(model, cap)
    planned = plan_network(model, cap, space="axes")
    assert planned.memory <= cap
    assert planned.iteration_time == pytest.approx(
        min(p.iteration_time for p in every if p.memory <= cap), rel=1e-12)


def test_a_split_plan_goes_through_a_plan_file_and_the_table_shows_its_degrees(tmp_path):
    from hpctrain.plan.plans import PlanError, plan_from_spec, read_plan, write_plan

    net = parse_net(WIDE, "wide")
    plan = plan_from_spec("conv=h2w2,fc=4x1", net, 4)
    assert plan[0].describe() == "split n=1,c=1,h=2,w=2"
    write_plan(tmp_path / "wide.plan", net, plan)
    assert read_plan(tmp_path / "wide.plan", net, 4) == plan
    text = format_plan(evaluate(model_of(WIDE, 2, 4, MACHINE), [plan[0], plan[2], plan[-1]]))
    assert re.search(r"split +n1 c1 h2 w2", text)
    for bad, why in [("conv1 split n=1,h=2,w=3", "needs 6 processes"),
                     ("conv1 split n=1,h=2,h=2", "axis h is given twice"),
                     ("conv1 split n=1,d=4", "has no axis 'd'"),
                     ("conv1 split h=two", "is not a split")]:
        (tmp_path / "bad.plan").write_text(bad + "\n")
        with pytest.raises(PlanError, match=why):
            read_plan(tmp_path / "bad.plan", net, 4)
    # a kind's spec applies to every layer of that kind, and n takes what the others leave
    assert [p.split.degrees for p in plan_from_spec("conv=w2,fc=4x1", net, 4)
            if p.split is not None] == [(2, 1, 1, 2), (2, 1, 1, 2)]


@pytest.mark.parametrize("degrees", [(4, 1, 1), (2, 2, 1), (2, 2, 2), (1, 3, 2), (3, 1, 4)])
@pytest.mark.parametrize("kernel,pad", [(2, "same"), (3, "1"), (5, "2")])
def test_the_halo_the_cost_model_counts_is_the_surface_of_the_extended_block(degrees, kernel,
                                                                             pad):
    """Axis by axis, each exchange carrying what came before, a rank receives exactly its
    block extended by the halos minus the block: edges and corners once, no more."""
    import math

    from hpctrain.layout.layout import Layout, Split
    from hpctrain.model.kinds import KINDS
    from hpctrain.model.kinds.window import busiest_halo, halo_axes

    net = parse_net(f"input channels=2 size=24x20x28 targets=1\nconv out=2 kernel={kernel} "
                    f"pad={pad}\nflatten\nlinear out=1\n", "vol")
    spec = net.layers[0]
    layout = Layout.of_split((1, 2, 24, 20, 28), Split((1, 1, *degrees)), cut=(2, 3, 4))
    KINDS[spec.kind].check(spec, (layout,), layout)
    counted = sum(plane * max(sum(pair) for pair in received)
                  for _, plane, (received, _) in halo_axes(spec, layout))
    extended = list(layout.largest_block)
    for axis in layout.cut_axes:
        p = busiest_halo(spec, layout, axis)
        extended[axis] = p.need[1] - p.need[0]
    assert counted == math.prod(extended) - math.prod(layout.largest_block)


def test_plan_prices_a_given_grid_and_holds_it_to_the_cap(capsys):
    """``plan --grid`` prints the given plan's table (its degrees per axis) instead of
    searching; under ``--mem-per-rank`` a plan that does not fit is refused."""
    from hpctrain.commands import plan as plan_command
    from hpctrain.cost.memory import MemoryRefused

    common = ["--net", "cosmoflow", "--image-size", "32", "--batch", "2", "--procs", "8",
              "--machine", "perlmutter-gpu", "--compute", "flops"]
    assert plan_command.run([*common, "--grid", "conv=n2d2h2,fc=8x1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"split +n2 c1 d2 h2 w1", out) and "predicted iteration" in out
    with pytest.raises(MemoryRefused, match="--mem-per-rank"):
        plan_command.run([*common, "--grid", "conv=n2d2h2,fc=8x1", "--mem-per-rank", "1M"])


@pytest.mark.parametrize("space", ["balanced", "axes"])
@pytest.mark.parametrize("text,batch,procs", [(NET, 4, 4), (WIDE, 2, 4), (BRANCHED, 2, 4),
                                              (BRANCHED, 1, 8)])
@pytest.mark.parametrize("alpha, beta", [(2e-5, 1 / 1e9), (2e-6, 1 / 6e9), (1e-4, 1 / 1e8)])
def test_sums_that_may_hide_plan_a_wider_space_as_its_unbounded_searches_do(space, text, batch,
                                                                           procs, alpha, beta):
    """With sums in flight the wider spaces' second search (the hideable share counted free)
    is bounded by the first's plan instead of the grids' own search: the same plan and lower
    bound as both searches over the whole space unbounded, and no plan of the balanced space
    (by enumeration) below that bound. So too with the hopeful search first and unbounded, as
    a search beside the grids runs (``on_bound``), which hands over its first round's least
    additive time, then that bound."""
    from hpctrain.plan.planner import _search

    machine = Machine("hiding", alpha=alpha, beta=beta, flops=1e11, overlap=0.8)
    model = CostModel(parse_net(text, "t"), batch, procs, machine, FlopModel(machine.flops),
                      overlap=True)
    every = [model.choices(k) + model.split_choices(k, space)
             for k in range(len(model.segments))]
    counted = _search(model, every, None, "", 0.0)
    hopeful = _search(model, every, None, "", model.hidden_share)
    planned = plan_network(model, space=space)
    best = min(counted, hopeful, key=lambda p: p.iteration_time)
    assert (planned.plans, planned.iteration_time) == (best.plans, best.iteration_time)
    assert planned.lower_bound == hopeful.time_with_sums_hidden() > 0
    noted = []
    beside = plan_network(model, space=space, on_bound=noted.append)
    assert (beside.plans, beside.iteration_time) == (best.plans, best.iteration_time)
    first_round, optimum = noted  # each no more than any plan's time (enumerated below)
    assert first_round <= optimum == beside.lower_bound == planned.lower_bound
    if space == "balanced":  # every axis: too many plans to enumerate in a test
        assert planned.lower_bound <= min(
            p.iteration_time for p in every_plan(model, space)) * (1 + 1e-12)
