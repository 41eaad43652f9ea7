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
