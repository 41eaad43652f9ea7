"""What a planner's refusal names: the binding constraint of a layer no mode can split, and the
leanest plan of all under a memory cap (not of those the cap left)."""

import pytest

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine, load_machine
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.planner import PlannerError, plan_network
from hpctrain.plan.pricing import CostModel, build_cost_model

MACHINE = Machine("test", alpha=2e-6, beta=1 / 6e9, flops=1e11)

THIN = """# two samples of 8x8 with 4 channels on 64 ranks: no single axis has 32 parts
input channels=2 size=8 classes=3
conv out=4 kernel=3 pad=1
relu
flatten
linear out=3
"""


def test_a_layer_no_mode_can_split_is_named_with_each_modes_reason():
    model = CostModel(parse_net(THIN, "thin"), 2, 64, MACHINE, FlopModel(MACHINE.flops))
    with pytest.raises(PlannerError) as refused:
        plan_network(model)
    message = str(refused.value)
    assert "layer conv1 (conv) has no plan on 64 ranks at batch 2" in message
    assert "model 32x2: output channels of size 4 cannot be split 32 ways" in message
    assert "domain 32x2: input height of size 8 cannot be split 32 ways" in message
    assert "--space balanced" in message and "raise --batch" in message
    # and over every axis the same layer has a plan: 2 x 4 x 8 (channels, height, width)
    planned = plan_network(model, space="axes")
    assert planned.plans[0].mode == "split"


def test_the_leanest_plan_a_refusal_names_is_the_same_under_every_cap():
    """Under 400 and 600 MiB the refusal names the same leanest plan of all: before, the first
    cap's message came from the plans its pre-filter had left and said 2.56 GiB."""
    model = build_cost_model(load_net("vgg16"), 64, 64, load_machine("dgx-h100"), "flops")
    messages = []
    for cap in (400 * 2**20, 600 * 2**20):
        with pytest.raises(PlannerError) as refused:
            plan_network(model, cap)
        messages.append(str(refused.value).split("even the leanest needs ")[1].split(",")[0])
    assert messages[0] == messages[1] == "715 MiB"


@pytest.mark.parametrize("space", ["grids", "balanced"])
def test_the_leanest_plan_is_the_least_memory_of_every_plan_brute_force(space):
    """On a small net every combination of the segments' choices is evaluated: the leanest
    plan a refusal names needs exactly the least memory of them all (choosing each segment by
    what it keeps alone named plans up to 3 times that, their one transient the largest)."""
    import itertools

    from hpctrain.plan.planner import _leanest, evaluate
    from tests.test_planner_axes import MACHINE, NET, WIDE

    for text, procs, batch in ((NET, 4, 8), (WIDE, 4, 2)):
        model = CostModel(parse_net(text, "net"), batch, procs, MACHINE, FlopModel(1e11))
        candidates = [model.choices(k) + (model.split_choices(k, space)
                                          if space != "grids" else [])
                      for k in range(len(model.segments))]
        least = min(evaluate(model, list(choices), timed=False).memory
                    for choices in itertools.product(*candidates))
        found = evaluate(model, _leanest(model, candidates), timed=False).memory
        assert found == pytest.approx(least, rel=1e-12)
        with pytest.raises(PlannerError, match="even the leanest needs"):
            plan_network(model, least * 0.99, space=space)
        assert plan_network(model, least * 1.0001, space=space).memory <= least * 1.0001
