"""Planning the forward pass alone: ``CostModel(..., inference=True)``, ``build_cost_model(...,
inference=True)`` and ``plan_memory(..., inference=True)``.

Under inference every layer's backward (compute, communication, redistribution, gradient sums,
the last bucket's latency) is zero and there is no optimizer update, while the forward is priced
as in training; a plan keeps its parameters alone (no gradients, no momentum) and nothing for a
backward, so it needs less memory than the same plan trained, and a memory cap between the two
is refused in training and planned in inference. The planner stays exact: against brute force
over every plan on small nets, with and without a cap. FLOP-rate compute, serial."""

import itertools
import math
import random

import pytest

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine, load_machine
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.planner import (
    PlannerError,
    choices_of,
    evaluate,
    plan_memory,
    plan_network,
)
from hpctrain.plan.pricing import build_cost_model
from tests.test_planner import (
    LEVELS,
    MACHINE,
    SLOW_NET,
    brute_force,
    model_of,
    random_graph_net,
)

NETS = [("alexnet", 127), ("resnet18", 64)]
BATCH, PROCS = 16, 4


def models(name, size, machine=None, **kw):
    """(training, inference) FLOP-rate cost models of ``name`` at image ``size`` on the
    cori-knl profile, as ``plan``/``predict`` build them."""
    net = load_net(name).with_image_size(size)
    machine = machine or load_machine("cori-knl")
    return (build_cost_model(net, BATCH, PROCS, machine, "flops", **kw),
            build_cost_model(net, BATCH, PROCS, machine, "flops", inference=True, **kw))


def every_choice(model):
    return [(k, c) for k in range(len(model.segments)) for c in model.choices(k)]


def some_plans(model, count=12, seed=0):
    """The all-batch plan and ``count`` random combinations of choices."""
    rng = random.Random(seed)
    options = [model.choices(k) for k in range(len(model.segments))]
    plans = [[found[0] for found in options]]
    plans += [[rng.choice(found) for found in options] for _ in range(count)]
    return plans


def forward_seconds(planned):
    """The forward's share of a plan's time in evaluation: every layer's, the loss's and the
    data's, but dropout's compute (off) and batch norm's sums (the running statistics)."""
    every = [*planned.layers, planned.loss, planned.data]

    def evaluated(c, part: str) -> bool:
        kind = KINDS.get(c.kind)
        return kind is None or getattr(kind, f"{part}_in_evaluation")

    return sum(c.compute[0] * evaluated(c, "computes") + c.comm[0] * evaluated(c, "communicates")
               + c.redistribution[0] for c in every)


def backward_items(cost):
    return (cost.compute[1], cost.comm[1], cost.redistribution[1], cost.grad_sum,
            cost.bucket_latency)


# -- the costs --------------------------------------------------------------------------------


@pytest.mark.parametrize("name,size", NETS)
def test_inference_layers_have_no_backward_and_the_forward_of_training(name, size):
    """Every layer of every segment under every candidate: the backward is zero, the forward
    (compute, communication, the move into it) and the layouts those of training, and no
    update is priced; training has a backward, so the comparison means something. A kind that
    does not compute in evaluation (dropout) costs nothing, and one whose forward does not
    communicate there (batch norm, by its running statistics) no communication."""
    training, inference = models(name, size)
    assert inference.inference and not training.inference
    assert training.choices(0) == inference.choices(0)
    trained_backward = 0.0
    for k, choice in every_choice(training):
        trained, forward = training.segment_cost(k, choice), inference.segment_cost(k, choice)
        assert forward.layouts == trained.layouts
        for t, f in zip(trained.layers, forward.layers, strict=True):
            what = f"{name} {f.layer} under {choice.describe()}"
            assert backward_items(f) == (0.0,) * 5, what
            assert f.update is None, what
            kind = KINDS[f.kind]
            computes, communicates = (kind.computes_in_evaluation,
                                      kind.communicates_in_evaluation)
            assert f.compute[0] == (t.compute[0] if computes else 0.0), what
            assert f.comm[0] == (t.comm[0] if communicates else 0.0), what
            assert f.redistribution[0] == t.redistribution[0], what
            assert f.move is t.move and f.work == (t.work if computes else None), what
            trained_backward += sum(backward_items(t))
    assert trained_backward > 0
    assert any(c.update is not None for k, choice in every_choice(training)
               for c in training.segment_cost(k, choice).layers)


@pytest.mark.parametrize("name,size", NETS)
def test_an_inference_plan_costs_the_forward_of_the_same_plan_trained(name, size):
    """Whole plans, with the moves at joins, the loss and the data: no backward anywhere, no
    last bucket, nothing hidden, and the time the training plan's forward."""
    training, inference = models(name, size)
    for choices in some_plans(training):
        trained, forward = evaluate(training, choices), evaluate(inference, choices)
        for c in [*forward.layers, forward.loss, forward.data]:
            assert backward_items(c) == (0.0,) * 5, c.layer
        assert forward.last_bucket == 0.0 and forward.hidden_sums() == 0.0
        assert forward.iteration_time == pytest.approx(forward_seconds(trained), rel=1e-12)
        assert forward.iteration_time < trained.iteration_time
        assert forward_seconds(forward) == pytest.approx(forward_seconds(trained), rel=1e-12)


def test_a_model_timed_again_stays_an_inference_model():
    _, inference = models("alexnet", 127)
    again = inference.timed_by(FlopModel(2 * inference.machine.flops))
    assert again.inference
    choice = again.choices(0)[-1]
    assert backward_items(again.segment_cost(0, choice).layers[0]) == (0.0,) * 5


def test_gradient_sums_in_flight_change_nothing_in_inference():
    """With sums in flight on a machine that hides them all, a forward has none to hide: the
    plan and its time are those without."""
    machine = load_machine("cori-knl")
    hiding = Machine(machine.name, machine.alpha, machine.beta, machine.flops, overlap=1.0)
    _, plain = models("resnet18", 64)
    _, overlapped = models("resnet18", 64, hiding, overlap=True)
    a, b = plan_network(plain), plan_network(overlapped)
    assert b.hidden_sums() == 0.0
    assert b.iteration_time == pytest.approx(a.iteration_time, rel=1e-12)


# -- memory -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,size", NETS)
def test_inference_keeps_parameters_alone_and_less_than_training(name, size):
    """For the same plans: each layer keeps its parameters (one copy, no gradient or momentum)
    and a fork's output, nothing saved for a backward; the plan's peak memory is below
    training's, and plan_memory says the same as the cost model."""
    training, inference = models(name, size)
    itemsize = inference.itemsize
    net = training.net
    plans = some_plans(training) + [choices_of(training, plan_network(training).plans),
                                    choices_of(inference, plan_network(inference).plans)]
    for choices in plans:
        trained, forward = evaluate(training, choices), evaluate(inference, choices)
        assert forward.memory < trained.memory
        for t, f in zip(trained.layers, forward.layers, strict=True):
            assert set(f.resident) <= {"parameters", "output held for its other readers"}, (
                f.layer, f.resident)
            assert f.memory <= t.memory, f.layer
            if "parameters" in f.resident:
                params = f.resident["parameters"] / itemsize
                assert params == int(params) and params > 0
                assert sum(t.resident.values()) > f.resident["parameters"], f.layer
        plan = forward.plans
        for inference_flag, planned in ((False, trained), (True, forward)):
            memory = plan_memory(net, plan, BATCH, PROCS, inference=inference_flag).memory
            assert memory == pytest.approx(planned.memory, rel=1e-12)
    # the parameters kept are the net's, split as the plan splits them: on one rank, all
    one = build_cost_model(net, BATCH, 1, load_machine("cori-knl"), "flops", inference=True)
    whole = evaluate(one, [found[0] for found in (one.choices(k)
                                                  for k in range(len(one.segments)))])
    assert sum(c.resident.get("parameters", 0) for c in whole.layers) == (
        net.parameter_count() * itemsize)


def test_the_loss_keeps_no_gradient_in_inference():
    training, inference = models("alexnet", 127)
    choices = [found[0] for found in (inference.choices(k)
                                      for k in range(len(inference.segments)))]
    forward = evaluate(inference, choices)
    assert not [what for what in forward.loss.resident if "gradient" in what]


def least_memory(model):
    """The least peak memory per rank of any plan: the planner, exact under a cap, asked again
    for a byte less than each plan it returns until it refuses. Returns (memory, choices)."""
    planned = plan_network(model)
    while True:
        try:
            leaner = plan_network(model, planned.memory - 1)
        except PlannerError as err:
            assert "mem-per-rank" in str(err)
            return planned.memory, choices_of(model, planned.plans)
        assert leaner.memory < planned.memory
        planned = leaner


@pytest.mark.parametrize("name,size", NETS)
def test_a_cap_no_training_plan_fits_is_planned_for_inference(name, size):
    """The cap midway between the leanest training plan's memory and the same plan's in
    inference: training is refused in one line naming the cap, inference planned under it."""
    training, inference = models(name, size)
    least, choices = least_memory(training)
    lean_forward = evaluate(inference, choices).memory
    assert lean_forward < least
    cap = (lean_forward + least) / 2
    with pytest.raises(PlannerError, match="no plan fits in --mem-per-rank") as err:
        plan_network(training, cap)
    assert "\n" not in str(err.value)
    planned = plan_network(inference, cap)
    assert planned.memory <= cap
    free = plan_network(inference)
    assert planned.iteration_time >= free.iteration_time * (1 - 1e-12)
    assert all(backward_items(c) == (0.0,) * 5 for c in planned.layers)


# -- the planner is exact ------------------------------------------------------------------------

CASES = [("smallcnn", 8, 4, MACHINE), ("mlp", 8, 4, SLOW_NET), ("smallcnn", 6, 3, SLOW_NET),
         ("smallcnn", 8, 4, LEVELS)]


def every_plan(model):
    options = [model.choices(k) for k in range(len(model.segments))]
    return [evaluate(model, list(combo)) for combo in itertools.product(*options)]


@pytest.mark.parametrize("name,batch,procs,machine", CASES)
def test_the_inference_plan_is_the_brute_force_optimum(name, batch, procs, machine):
    """On small chains: without a cap, and under caps from the leanest plan's memory to the
    fastest's, the inference planner's time is the least of every plan's (by enumeration), and
    a cap below every plan is refused."""
    model = model_of(load_net(name), batch, procs, machine, inference=True)
    every = every_plan(model)
    planned = plan_network(model)
    assert planned.iteration_time == pytest.approx(brute_force(model).iteration_time,
                                                   rel=1e-12)
    assert planned.iteration_time == pytest.approx(min(p.iteration_time for p in every),
                                                   rel=1e-12)
    smallest = min(p.memory for p in every)
    needs = sorted({p.memory for p in every if p.memory < planned.memory})
    for cap in [smallest, *needs[::max(1, len(needs) // 4)], (smallest + planned.memory) / 2]:
        capped = plan_network(model, cap)
        assert capped.memory <= cap
        assert capped.iteration_time == pytest.approx(
            min(p.iteration_time for p in every if p.memory <= cap), rel=1e-12)
    with pytest.raises(PlannerError, match="mem-per-rank"):
        plan_network(model, smallest * 0.99)


@pytest.mark.parametrize("seed", [1, 3, 6, 10])
def test_inference_graph_plans_are_exact_against_brute_force(seed):
    """Nets with branches (adds, concats, forks whose outputs are held for other readers)."""
    net = parse_net(random_graph_net(seed), f"random{seed}")
    model = model_of(net, 8, 4, SLOW_NET, inference=True)
    options = [model.choices(k) for k in range(len(model.segments))]
    assert not net.is_chain() and math.prod(map(len, options)) <= 1000  # seeds that are
    assert any(len(readers) > 1 for readers in net.consumers.values())  # and that fork
    every = every_plan(model)
    planned = plan_network(model)
    assert planned.iteration_time == pytest.approx(min(p.iteration_time for p in every),
                                                   rel=1e-12)
    smallest = min(p.memory for p in every)
    capped = plan_network(model, smallest)
    assert capped.iteration_time == pytest.approx(
        min(p.iteration_time for p in every if p.memory <= smallest), rel=1e-12)
