"""The planner's regions on groups of ranks against brute force: over every plan of the space
:mod:`hpctrain.plan.grouped` states (each segment's 1.5D grids on every rank; each qualifying
region on every rank or on its groups, each branch there with the choices that make its own time
least, found here by enumeration too), priced layer by layer as the network runs them
(:func:`~hpctrain.plan.planner.evaluate_placed`), the least time is the planner's."""

import itertools

import pytest

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine, load_machine
from hpctrain.layout.partition import SplitError
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.grouped import GroupedSpace, group_choices, grouped_regions
from hpctrain.plan.placement import plan_layouts
from hpctrain.plan.planner import evaluate_placed, plan_network
from hpctrain.plan.plans import LayerPlan
from hpctrain.plan.pricing import CostModel

# one region, branches of two and three convolutions with batch norm: on groups when the
# latency of the sums dominates. On 3 ranks the second branch takes the group of two, where
# its middle convolution has choices of its own; a third convolution in the first branch, on
# one rank, would only triple the serial plans the brute force prices
DEEP = parse_net("""
input channels=3 size=6 classes=5
conv name=stem out=4 kernel=3 pad=1
conv name=a1 out=4 kernel=3 pad=1 bias=0
batchnorm
relu
conv name=a2 out=4 kernel=3 pad=1 bias=0
batchnorm name=an
conv name=b1 in=stem out=4 kernel=1 bias=0
batchnorm
relu
conv name=b2 out=4 kernel=3 pad=1 bias=0
batchnorm
relu
conv name=b3 out=4 kernel=1 bias=0
batchnorm name=bn
add name=sum in=an,bn
flatten
linear name=fc out=5
""", "deep")

# two regions in a row, a concat of a 1x1 conv and a two-conv branch, then a residual block
# with a convolution on its shortcut
TWO = parse_net("""
input channels=3 size=8 classes=5
conv name=stem out=4 kernel=3 pad=1
conv name=a out=4 kernel=1 bias=0
batchnorm name=an
conv name=b1 in=stem out=2 kernel=1
relu name=b1r
conv name=b2 out=4 kernel=3 pad=1
concat name=cat in=an,b2
relu name=r
conv name=c out=8 kernel=3 pad=1 bias=0
batchnorm name=cn
conv name=d in=r out=8 kernel=1
add name=sum in=cn,d
flatten
linear name=fc out=5
""", "two")

LATENCY = Machine("latency", 2e-4, 1e-11, 1e12)  # sums cost their latency, little else


def brute_force(model):
    """The least predicted time over the stated space, by enumeration."""
    net, heads = model.net, model.heads
    candidates = [model.choices(s) for s in range(len(model.segments))]
    regions = GroupedSpace(model, candidates).regions
    best = float("inf")
    for modes in itertools.product([False, True], repeat=len(regions)):
        grouped = [r for r, on in zip(regions, modes, strict=True) if on]
        fixed = {s for r in grouped for s in r.inside}
        free = [s for s in range(len(candidates)) if s not in fixed]
        for combo in itertools.product(*[candidates[s] for s in free]):
            plan = [LayerPlan("follow") for _ in net.layers]
            for s, choice in zip(free, combo, strict=True):
                plan[heads[s]] = choice
            for r in grouped:
                for b, segments in enumerate(r.branches):
                    for s in segments:
                        plan[heads[s]] = group_choices(model, s, r.groups[b])[0]
            try:
                for r in grouped:
                    for b, segments in enumerate(r.branches):
                        least, pick = _best_branch(model, plan, r, b)
                        for s, choice in zip(segments, pick, strict=True):
                            plan[heads[s]] = choice
                best = min(best, evaluate_placed(model, plan).iteration_time)
            except SplitError:
                continue
    return best


def _best_branch(model, plan, region, b):
    """(own time, choices) of branch ``b`` of ``region`` whose own time is least."""
    segments = region.branches[b]
    found = []
    for pick in itertools.product(*[group_choices(model, s, region.groups[b])
                                     for s in segments]):
        trial = list(plan)
        for s, choice in zip(segments, pick, strict=True):
            trial[model.heads[s]] = choice
        try:
            found.append((_branch_time(model, trial, region, b), pick))
        except SplitError:
            continue
    if not found:
        raise SplitError("no choice runs")
    return min(found, key=lambda item: item[0])


def _branch_time(model, plan, region, b):
    """Branch ``b``'s own time: its layers, the moves between them, into it and out of it."""
    net = model.net
    layouts = plan_layouts(net, plan, model.batch, model.procs)
    members = {k for s in region.branches[b] for k in model.segments[s]
               if k in region.region.inside}
    seconds = 0.0
    for k in members:
        cost = model.layer_cost(k, plan[k].mode, layouts[k], None)
        model.time_layers([cost])
        seconds += sum(cost.compute) + sum(cost.comm)
        for e, p in enumerate(net.producers(k)):
            seconds += sum(model.move_cost(layouts[p].output, layouts[k].inputs[e])[1:])
    join = region.region.join
    for e, p in enumerate(net.producers(join)):
        if p in members:
            seconds += sum(model.move_cost(layouts[p].output, layouts[join].inputs[e])[1:])
    return seconds


@pytest.mark.parametrize("net,machine,procs", [
    (DEEP, LATENCY, 2), (DEEP, LATENCY, 3), (TWO, LATENCY, 2),
    (TWO, "gpu-like", 3)])
def test_the_planner_finds_the_least_plan_with_regions_on_groups(net, machine, procs):
    machine = load_machine(machine) if isinstance(machine, str) else machine

    def model():
        return CostModel(net, 8, procs, machine, FlopModel(machine.flops))

    planned = plan_network(model(), groups=True)
    assert planned.iteration_time == pytest.approx(brute_force(model()), rel=1e-9)
    if net is DEEP and machine is LATENCY:  # where it pays, the plan has groups
        assert planned.on_groups and planned.side_by_side > 0
        assert planned.iteration_time < plan_network(model()).iteration_time


def test_the_regions_that_qualify():
    def regions(name, procs=4):
        net = load_net(name, {"inception_v3": 75}.get(name, 64))
        model = CostModel(net, 8, procs, load_machine("dgx-h100"), FlopModel(1e13))
        return grouped_regions(model)

    inception = regions("inception_v3")
    assert len(inception) == 11  # every module; 7b's and 7c's inner pairs lie inside them
    assert [len(r.branches) for r in inception] == [4, 4, 4, 2, 4, 4, 4, 4, 2, 4, 4]
    assert inception[0].groups == ((0, 1), (1, 1), (2, 1), (3, 1))
    assert regions("inception_v3", 2)[0].groups == ((0, 1), (1, 1), (0, 1), (1, 1))
    resnet = regions("resnet50")  # the blocks with a convolution on the shortcut
    assert len(resnet) == 4 and all(len(r.branches) == 2 for r in resnet)
    assert regions("alexnet") == [] and regions("resnet50", 1) == []


def test_a_net_without_branches_plans_as_without_groups():
    net = load_net("alexnet")
    machine = load_machine("dgx-h100")
    for procs in (4, 64):
        models = [CostModel(net, 256, procs, machine, FlopModel(machine.flops)) for _ in "ab"]
        assert plan_network(models[0], groups=True) == plan_network(models[1])


def test_under_a_memory_cap_groups_are_kept_when_the_fastest_plan_with_them_fits():
    def model():
        return CostModel(DEEP, 8, 2, LATENCY, FlopModel(LATENCY.flops))

    free = plan_network(model(), groups=True)
    assert free.on_groups
    assert plan_network(model(), free.memory, groups=True).plans == free.plans
    tight = plan_network(model(), free.memory * (1 - 1e-9), groups=True)
    assert not tight.on_groups and tight.memory < free.memory
    assert tight.plans == plan_network(model(), free.memory * (1 - 1e-9)).plans


def test_regions_whose_layers_interleave_with_others_do_not_qualify():
    """Two towers from the input, each with a region, written interleaved: on groups their
    steps would share the groups' clocks and the regions' times would not add up, so neither
    qualifies; the same regions written one after the other do."""
    def towers(order):
        lines = {"t1": "conv name=t1 out=4 kernel=1", "t2": "conv name=t2 in=input out=4 kernel=1",
                 "a1": "conv name=a1 in=t1 out=4 kernel=3 pad=1",
                 "b1": "conv name=b1 in=t1 out=4 kernel=1",
                 "a2": "conv name=a2 in=a1 out=4 kernel=1",
                 "s1": "add name=s1 in=a2,b1",
                 "c1": "conv name=c1 in=t2 out=4 kernel=3 pad=1",
                 "d1": "conv name=d1 in=t2 out=4 kernel=1",
                 "d2": "conv name=d2 in=d1 out=4 kernel=1",
                 "s2": "add name=s2 in=c1,d2"}
        body = "\n".join(lines[name] for name in order.split())
        net = parse_net(f"input channels=2 size=5 classes=3\n{body}\nconcat name=cat in=s1,s2\n"
                        f"flatten\nlinear name=fc out=3\n", "towers")
        return grouped_regions(CostModel(net, 8, 4, LATENCY, FlopModel(LATENCY.flops)))

    assert towers("t1 t2 a1 c1 b1 d1 a2 d2 s1 s2") == []
    assert [r.region.join for r in towers("t1 a1 b1 a2 s1 t2 c1 d1 d2 s2")] == [4, 9]
