"""``train --replan-after``'s decision, on times made from a profile the run's was not: kept
while the prediction holds, refitted and switched when another plan is predicted faster."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from hpctrain.commands.replan import REPLAN_GAIN, decide
from hpctrain.commands.setup import Setup, SetupRequest
from hpctrain.cost.machine import load_machine, scaled_links
from hpctrain.device.backend import Backend
from hpctrain.device.threads import ThreadChoice
from hpctrain.model.net import load_net
from hpctrain.plan.planner import choices_of, evaluate, plan_network
from hpctrain.plan.pricing import build_cost_model
from hpctrain.plan.spaces import plan_over
from hpctrain.record.timing import LayerTimes, StepTimes

PROCS, BATCH, STEPS = 2, 8, 5


class TwoRanks:
    """What the decision asks of a communicator, with ``--compute flops`` and a memory cap."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return PROCS


def setup_on(machine):
    net = load_net("smallcnn")
    planned = plan_network(build_cost_model(net, BATCH, PROCS, machine, "flops"))
    threads = ThreadChoice(1, "test", PROCS, "none", "as it is")
    return Setup(net, planned.plans, Backend(np, np.float32), threads, planned, machine,
                 planned.memory)


def run_measured_on(machine, setup):
    """The result of STEPS steps of ``setup``'s plan where ``machine`` is the truth."""
    model = build_cost_model(setup.net, BATCH, PROCS, machine, "flops")
    truth = evaluate(model, choices_of(model, setup.plan))
    rows = [LayerTimes(c.layer, forward_compute=c.compute[0], backward_compute=c.compute[1],
                       forward_layer_comm=c.comm[0], backward_layer_comm=c.comm[1],
                       forward_redistribution=c.redistribution[0],
                       backward_redistribution=c.redistribution[1]) for c in truth.layers]
    loss = truth.loss
    times = StepTimes(rows, LayerTimes("loss", forward_compute=loss.compute[0],
                                       backward_compute=loss.compute[1],
                                       forward_layer_comm=loss.comm[0],
                                       backward_layer_comm=loss.comm[1]))
    return SimpleNamespace(iteration=truth.iteration_time, layer_times=times,
                           fastest_rank_times=times, losses=[1.0] * STEPS, first_step=0,
                           last_step=STEPS), truth


REQUEST = SetupRequest("auto", BATCH, compute="flops", mem_per_rank=1e12)


def test_a_prediction_that_holds_keeps_the_plan_unrefitted():
    machine = load_machine("default")
    setup = setup_on(machine)
    result, _ = run_measured_on(machine, setup)
    decision = decide(setup, REQUEST, STEPS, result, 0.1, TwoRanks())
    assert not decision.switched and not decision.refitted
    assert decision.planned is setup.planned and decision.machine is machine
    assert "within --replan-threshold 10%: plan kept" in decision.reason


def test_a_profile_off_by_a_hundred_in_bandwidth_is_refitted_and_the_plan_switched():
    """The run's profile says the links are 100 times faster than they are: the planner
    split every layer's model over 2 ranks; refitted to the steps, the links' β is found and
    the plan the true profile picks (the convolutions batch-parallel) replaces it. Each
    layer's gradients are summed alone (no buckets), so the cheap links' plan splits."""
    machine = replace(load_machine("default"), bucket_bytes=0)
    truth = scaled_links(machine, (1.0, 100.0), (1.0, 100.0))
    setup = setup_on(machine)
    result, running = run_measured_on(truth, setup)
    best = plan_over(build_cost_model(setup.net, BATCH, PROCS, truth, "flops"),
                     space=REQUEST.space)
    assert best.plans != setup.plan and best.iteration_time < 0.9 * running.iteration_time
    decision = decide(setup, REQUEST, STEPS, result, 0.1, TwoRanks())
    assert decision.switched and decision.refitted
    assert decision.planned.plans == best.plans
    # the running plan's layers pin its step (but for the input batch's share, which no
    # layer's row holds), another plan's to a few per cent
    refitted = build_cost_model(setup.net, BATCH, PROCS, decision.machine, "flops")
    again = evaluate(refitted, choices_of(refitted, setup.plan))
    assert again.iteration_time == pytest.approx(running.iteration_time, rel=0.02)
    assert decision.planned.iteration_time == pytest.approx(best.iteration_time, rel=0.1)
    assert "this run" in decision.machine.sources["links"]
    assert f"after step {STEPS}: measured" in decision.reason and "switched" in decision.reason


def test_a_gain_under_the_threshold_keeps_the_plan_on_the_refitted_profile():
    """Every kernel and every link 30 % slower than predicted: the prediction is off, the
    refit finds it, but no other plan gains: the plan running goes on, priced on the
    refitted profile."""
    from dataclasses import replace

    machine = load_machine("default")
    truth = replace(scaled_links(machine, (1.3, 1.3), (1.3, 1.3)),
                    compute_scale={"(gemm)": (1.3, 1.3), "(memory)": (1.3, 1.3)})
    setup = setup_on(machine)
    result, running = run_measured_on(truth, setup)
    decision = decide(setup, REQUEST, STEPS, result, 0.1, TwoRanks())
    assert decision.refitted and not decision.switched
    assert decision.planned.plans == setup.plan
    assert decision.machine.compute_scale["conv"] == pytest.approx((1.3, 1.3))
    assert decision.planned.iteration_time == pytest.approx(running.iteration_time, rel=0.05)
    assert decision.reason.endswith(": plan kept")
    assert REPLAN_GAIN > 0
