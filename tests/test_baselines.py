"""The whole-network strategies, defined once: what each puts where, and that the --grid value
compare-plans runs for a strategy is the plan the study and the planner evaluate for it."""

import pytest

from hpctrain.layout.partition import factorisations
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import load_net
from hpctrain.plan.baselines import (
    STRATEGIES,
    grid_spec,
    pure_batch,
    strategy_plan,
    weird_trick,
)
from hpctrain.plan.plans import LayerPlan, plan_from_spec


def weighted(net):
    return [KINDS[layer.kind] for layer in net.layers if KINDS[layer.kind].weighted]


def test_the_baselines_people_know():
    kinds = weighted(load_net("alexnet"))  # five convolutions, three fully connected layers
    assert pure_batch(kinds, 8) == [LayerPlan("batch", (1, 8))] * 8
    assert weird_trick(kinds, 8) == [LayerPlan("batch", (1, 8))] * 5 + [
        LayerPlan("model", (8, 1))] * 3


def test_each_strategy_on_one_grid():
    kinds = weighted(load_net("alexnet"))
    assert strategy_plan(kinds, "1.5d", (2, 4)) == [LayerPlan("model", (2, 4))] * 8
    assert strategy_plan(kinds, "conv-batch", (2, 4)) == (
        [LayerPlan("batch", (1, 8))] * 5 + [LayerPlan("model", (2, 4))] * 3)
    assert strategy_plan(kinds, "integrated", (2, 4)) == (
        [LayerPlan("domain", (2, 4))] * 5 + [LayerPlan("model", (2, 4))] * 3)
    for strategy in STRATEGIES:  # one model rank: every strategy is pure batch
        assert strategy_plan(kinds, strategy, (1, 8)) == pure_batch(kinds, 8)
    with pytest.raises(ValueError, match="unknown strategy 'pipeline'"):
        strategy_plan(kinds, "pipeline", (2, 4))


@pytest.mark.parametrize("procs", [4, 6, 12])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_grid_spec_of_a_strategy_is_its_plan(procs, strategy):
    net = load_net("alexnet", 127)
    kinds = weighted(net)
    for grid in factorisations(procs):
        ran = [p for layer, p in zip(net.layers, plan_from_spec(grid_spec(strategy, grid), net,
                                                                procs), strict=True)
               if KINDS[layer.kind].weighted]
        want = strategy_plan(kinds, strategy, grid)
        # --grid runs a convolution too short to cut R ways in model mode on the same grid
        fell_back = [w == LayerPlan("domain", grid) and r == LayerPlan("model", grid)
                     for r, w in zip(ran, want, strict=True)]
        assert all(r == w or back for r, w, back in zip(ran, want, fell_back, strict=True))
        if strategy == "integrated" and 1 < grid[0] <= 4:  # conv1's 127 rows cut R ways
            assert ran[0] == LayerPlan("domain", grid), grid
