"""The planner over every axis (``space="axes"``): a degree for each axis of a weighted
layer's output and replicas, searched exactly — against brute force over the whole space, never
worse than the 1.5D plan, and under a memory cap that no 1.5D plan fits."""

import itertools

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


def every_plan(model):
    options = [model.choices(k) + model.split_choices(k) for k in range(len(model.segments))]
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
