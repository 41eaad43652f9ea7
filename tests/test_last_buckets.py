"""The last bucket of every communicator that sums gradients: priced whole, searched exactly,
and no plan predicted below the latency of its gradient sums."""

import itertools

import pytest

from hpctrain.cost.collectives import allreduce_time, bucket_latency
from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine, load_machine
from hpctrain.io.locations import shipped_names
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import load_net
from hpctrain.plan import planner
from hpctrain.plan.buckets import least_with_last_buckets
from hpctrain.plan.placement import plan_layouts
from hpctrain.plan.planner import choices_of, evaluate, plan_network
from hpctrain.plan.plans import LayerPlan
from hpctrain.plan.pricing import CostModel

SLOW_NET = Machine("slow", alpha=1e-4, beta=1 / 1e8, flops=1e12)


def model_of(net, batch, procs, machine, **kw):
    return CostModel(net, batch, procs, machine, FlopModel(machine.flops), **kw)


def gradient_latencies(model, plan):
    """One all-reduce's latency on each group of ranks a layer of ``plan`` sums parameter
    gradients over, from the layouts the network runs on."""
    net, found = model.net, []
    for spec, where in zip(net.layers, plan_layouts(net, plan, model.batch, model.procs),
                           strict=True):
        for group, _ in KINDS[spec.kind].gradient_sums(spec, where.inputs, where.output,
                                                        model.itemsize):
            if group.size > 1:
                found.append(allreduce_time(model.machine, group, 1.0))
    return found


def test_a_net_smaller_than_a_bucket_pays_its_slowest_communicators_latency_whole():
    """mlp's three layers on two communicators (every rank, and pairs of ranks): each layer
    pays its bytes and its byte share of a latency, and the step the slowest latency whole."""
    net, machine = load_net("mlp"), load_machine("dgx-h100")
    model = model_of(net, 16, 4, machine)
    planned = evaluate(model, [LayerPlan("batch", (1, 4)), LayerPlan("model", (2, 2)),
                               LayerPlan("batch", (1, 4))])
    latencies = gradient_latencies(model, planned.plans)
    assert len(set(latencies)) == 2  # the world's and the pairs'
    assert planned.last_bucket == pytest.approx(max(latencies), rel=1e-12)
    counted = sum(c.total for c in [*planned.layers, planned.loss, planned.data])
    assert planned.iteration_time == pytest.approx(counted + max(latencies), rel=1e-12)
    # the layers' own sums (their bytes, their shares of a latency) are a sliver of one
    assert 0 < sum(c.grad_sum for c in planned.layers) < 0.1 * max(latencies)


@pytest.mark.parametrize("name,batch,procs", [("mlp", 16, 8), ("mlp", 8, 4)])
def test_the_last_bucket_changes_the_plan_and_the_search_stays_exact(name, batch, procs):
    """The plan of least additive time is not the fastest once the last bucket counts; the
    planner finds the fastest, as enumerating every plan does."""
    model = model_of(load_net(name), batch, procs, SLOW_NET)
    options = [model.choices(k) for k in range(len(model.segments))]
    every = [evaluate(model, list(combo)) for combo in itertools.product(*options)]
    fastest = min(p.iteration_time for p in every)
    additive = planner._additive_search(model, options, None, "", 0.0)
    planned = plan_network(model)
    assert planned.iteration_time == pytest.approx(fastest, rel=1e-12)
    assert evaluate(model, choices_of(model, additive.plans)).iteration_time > fastest * 1.01


def test_the_search_over_the_slowest_latency_stops_where_nothing_left_can_win():
    """Plans given as (additive time, slowest latency): each round keeps the plans faster in
    latency than the last one found, and the least total wins."""
    plans = [(10.0, 5.0), (11.0, 3.0), (12.5, 1.0), (14.0, 0.0), (11.5, 4.0)]
    searched = []

    def search(below, under):
        searched.append((below, under))
        left = [p for p in plans if p[1] < below]
        return min(left) if left else None

    best = least_with_last_buckets(search, lambda p: p[0], lambda p: p[1])
    assert best == (12.5, 1.0) == min(plans, key=sum)
    # each search is told the best total so far; (14, 0): its additive time loses
    assert searched == [(float("inf"), float("inf")), (5.0, 15.0), (3.0, 14.0), (1.0, 13.5)]


@pytest.mark.parametrize("groups", [False, True])
def test_a_graph_search_that_cannot_beat_the_best_lays_out_no_plan(monkeypatch, groups):
    """Under an ``upper`` below its optimum, a net with branches is refused before its plan is
    laid out and priced (a round of the last buckets that cannot win); at the optimum, with
    or without regions on groups, the plan is the one found without a bound."""
    model = model_of(load_net("minibranch"), 64, 16, load_machine("cori-knl"))
    options = [model.choices(k) for k in range(len(model.segments))]
    free = planner._additive_search(model, options, None, "", 0.0, groups)
    least = free.time_with_free(0.0) - free.last_bucket
    bound = planner._additive_search(model, options, None, "", 0.0, groups, upper=least)
    assert bound.plans == free.plans
    monkeypatch.setattr(planner, "evaluate", None)  # laying out a plan would raise
    monkeypatch.setattr(planner, "evaluate_placed", None)
    with pytest.raises(planner.PlannerError, match="faster than the one known"):
        planner._additive_search(model, options, None, "", 0.0, groups, upper=least * 0.999)


NETS = shipped_names("nets", ".net")
MACHINES = shipped_names("machines", ".toml")


@pytest.mark.parametrize("procs", [2, 64, 4096, 65536])
@pytest.mark.parametrize("name", NETS)
def test_no_shipped_net_is_predicted_below_the_latency_of_its_gradient_sums(name, procs):
    """On every shipped profile, data parallelism on every rank and the planner's plan (for the
    nets it plans in a blink at this size) take no less than the slowest all-reduce's latency
    of their gradient sums, and no plan is bounded below it."""
    net, batch = load_net(name), max(procs, 64)
    plan_it = name in ("mlp", "smallcnn", "shapes", "resdigits") or procs <= 64
    for machine in map(load_machine, MACHINES):
        model = model_of(net, batch, procs, machine, overlap=True)
        plans = [[LayerPlan("batch", (1, procs))] * len(model.segments)]
        for choices in plans:
            planned = evaluate(model, choices)
            floor = max(gradient_latencies(model, planned.plans))
            assert planned.iteration_time >= floor, machine.name
        if plan_it:
            planned = plan_network(model)
            floor = max(gradient_latencies(model, planned.plans), default=0.0)
            assert planned.iteration_time >= floor, machine.name
            assert planned.lower_bound is None or planned.lower_bound >= floor, machine.name


def test_bucket_latency_is_an_all_reduce_of_one_byte():
    machine = load_machine("dgx-h100")
    assert bucket_latency(machine, 4096) == allreduce_time(machine, 4096, 1.0) > 0
