"""The cost model and the planner: exact search, memory cap, agreement with the executed moves."""

import itertools
import math
import random

import pytest

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine, Network, load_machine
from hpctrain.cost.work import LocalWork
from hpctrain.layout.layout import HEIGHT_AXIS, Layout, box_size
from hpctrain.layout.moves import (
    AllGatherMove,
    GeneralMove,
    _busiest_receiver_by_rank,
    _busiest_receiver_closed_form,
    move_between,
    transfer_pieces,
)
from hpctrain.layout.partition import SplitError, factorisations
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.planner import PlannerError, choices_of, evaluate, format_plan, plan_network
from hpctrain.plan.plans import LayerPlan, plan_from_spec
from hpctrain.plan.pricing import CostModel

MACHINE = Machine("test", alpha=2e-6, beta=1 / 6e9, flops=1e11)
SLOW_NET = Machine("slow", alpha=1e-4, beta=1 / 1e8, flops=1e12)
# two ranks per node, a network 20 times slower than the node's link, one NIC per node
LEVELS = Machine("levels", alpha=2e-6, beta=1 / 20e9, flops=1e11, ranks_per_node=2,
                 network=Network(1e-5, 1 / 1e9, 1))


def model_of(net, batch, procs, machine=MACHINE, **kw):
    return CostModel(net, batch, procs, machine, FlopModel(machine.flops), **kw)


def brute_force(model, cap=None):
    """The least predicted time over every combination of choices, by enumeration."""
    options = [model.choices(k) for k in range(len(model.segments))]
    best = None
    for combo in itertools.product(*options):
        planned = evaluate(model, list(combo))
        if cap is not None and planned.memory > cap:
            continue
        if best is None or planned.iteration_time < best.iteration_time:
            best = planned
    return best


CASES = [("smallcnn", 8, 4, MACHINE), ("smallcnn", 12, 6, SLOW_NET), ("mlp", 8, 4, SLOW_NET),
         ("mlp", 16, 8, MACHINE), ("smallcnn", 6, 3, SLOW_NET), ("smallcnn", 8, 4, LEVELS),
         ("smallcnn", 12, 6, LEVELS), ("mlp", 16, 8, LEVELS)]


@pytest.mark.parametrize("name,batch,procs,machine", CASES)
def test_dynamic_programming_finds_the_brute_force_optimum(name, batch, procs, machine):
    model = model_of(load_net(name), batch, procs, machine)
    planned = plan_network(model)
    best = brute_force(model)
    assert planned.iteration_time == pytest.approx(best.iteration_time, rel=1e-12)


@pytest.mark.parametrize("name,batch,procs,machine", CASES)
def test_memory_cap_is_exact_and_respected(name, batch, procs, machine):
    model = model_of(load_net(name), batch, procs, machine)
    free = plan_network(model)
    options = [evaluate(model, list(c)) for c in
               itertools.product(*[model.choices(k) for k in range(len(model.segments))])]
    smallest = min(p.memory for p in options)
    for cap in (smallest, (smallest + free.memory) / 2, free.memory * 2):
        capped = plan_network(model, cap)
        assert capped.memory <= cap
        assert capped.iteration_time == pytest.approx(brute_force(model, cap).iteration_time,
                                                      rel=1e-12)
    with pytest.raises(PlannerError, match="mem-per-rank"):
        plan_network(model, smallest * 0.99)


INPUT_FIRST = """input channels=3 size=8 classes=4
batchnorm
maxpool kernel=2
conv out=6 kernel=3 pad=1
relu
flatten
linear out=4
"""


@pytest.mark.parametrize("batch,procs", [(8, 4), (3, 4), (12, 6)])
def test_layers_before_the_first_weighted_one_are_planned_exactly(batch, procs):
    """A batch norm and a pooling of the input run where the first convolution reads it, so
    their layouts follow its choice: still exact, with and without a cap, and a batch smaller
    than P runs on the grids whose batch ranks it fills."""
    model = model_of(parse_net(INPUT_FIRST, "input-first"), batch, procs, SLOW_NET)
    assert model.segments[0][:3] == [0, 1, 2] and model.heads[0] == 2
    planned = plan_network(model)
    assert planned.iteration_time == pytest.approx(brute_force(model).iteration_time,
                                                   rel=1e-12)
    leanest = min(evaluate(model, list(c)).memory for c in
                  itertools.product(*[model.choices(k) for k in range(len(model.segments))]))
    capped = plan_network(model, leanest)
    assert capped.iteration_time == pytest.approx(brute_force(model, leanest).iteration_time,
                                                  rel=1e-12)
    for choice in model.choices(0):  # the batch is produced where the convolution reads it
        assert model.input_layout(choice).grid == choice.grid
        assert model.segment_layouts(0, choice)[0].input == model.input_layout(choice)


def test_planned_time_is_the_sum_of_its_layers():
    model = model_of(load_net("alexnet").with_image_size(127), 16, 4)
    planned = plan_network(model)
    parts = planned.totals()
    assert planned.iteration_time == pytest.approx(sum(parts.values()))
    assert "predicted iteration" in format_plan(planned)
    assert len(planned.plans) == len(model.net.layers)
    assert [c.layer for c in planned.layers] == [l.name for l in model.net.layers]


def test_slow_network_prefers_batch_parallel_convolutions_and_split_fc():
    """AlexNet on many ranks: convolutions have few weights and big activations, FC layers the
    reverse — the paper's reason for per-layer grids. The planner must split them differently."""
    model = model_of(load_net("alexnet"), 2048, 64, Machine("cori", 2e-6, 1 / 6e9, 1e12))
    planned = plan_network(model)
    modes = dict(zip((l.name for l in model.net.layers), planned.plans, strict=True))
    assert modes["conv2"].grid[0] < modes["fc6"].grid[0]
    batch_only = evaluate(model, [LayerPlan("batch", (1, 64))] * len(model.segments))
    assert planned.iteration_time < batch_only.iteration_time


def test_evaluate_agrees_with_plan_specs():
    net = load_net("smallcnn")
    model = model_of(net, 8, 4)
    plan = plan_from_spec("conv=domain:2x2,fc=4x1", net, 4)
    planned = evaluate(model, choices_of(model, plan))
    assert [p.describe() for p in planned.plans] == [p.describe() for p in plan]


def test_pooling_gathers_the_rows_where_a_split_would_leave_a_rank_empty():
    """smallcnn on 8 ranks: conv2 can take 8 row blocks of its 8x8 input, but the pooling
    after it halves the height to 4 rows, which cannot be cut 8 ways: the pooling gathers the
    rows first, and that gather is priced. A convolution itself is refused such a split."""
    model = model_of(load_net("smallcnn"), 8, 8)
    assert LayerPlan("domain", (8, 1)) in model.choices(0)
    assert LayerPlan("domain", (4, 2)) in model.choices(1)
    conv, pool = model.segment_layouts(1, LayerPlan("domain", (8, 1)))[:3:2]
    assert conv.output.split_axis == HEIGHT_AXIS and pool.input.split_axis is None
    cost = model.segment_cost(1, LayerPlan("domain", (8, 1)), timed=False)
    assert cost.layers[2].move is AllGatherMove and cost.layers[2].redistribution[0] > 0
    deep = model_of(load_net("smallcnn", 4), 8, 8)  # conv2's 2 input rows: not 8 blocks
    assert LayerPlan("domain", (8, 1)) not in deep.choices(1)


def test_too_many_processes_for_a_layer_is_a_clear_error():
    """smallcnn's convolutions have fewer channels and rows than 2048 model ranks; (an MLP
    runs, its layers replicated over the model ranks)."""
    model = model_of(load_net("smallcnn"), 2, 4096)
    with pytest.raises(PlannerError, match="raise --batch"):
        plan_network(model)


# -- the cost of a general move against its exact pieces -------------------------------------

@pytest.mark.parametrize("procs,shape", [(2, (16, 8, 8, 8)), (4, (16, 8, 8, 8)),
                                         (8, (16, 8, 8, 8)), (6, (24, 12, 12, 6)),
                                         (12, (24, 12, 12, 6))])
def test_general_move_volume_is_the_busiest_receiver(procs, shape):
    """With sizes that divide evenly, the model's busiest receiver gets the bytes and the
    messages of the exact pieces: in closed form on 2^k ranks, rank by rank on others."""
    # 1/4 s per byte: 1 s per float32 entry
    model = model_of(load_net("smallcnn"), 16, procs, Machine("bytes", 1e-30, 0.25, 1e9))
    latency = model_of(load_net("smallcnn"), 16, procs, Machine("messages", 1.0, 1e-30, 1e9))
    layouts = [Layout(shape, g, a) for g in factorisations(procs) for a in (None, 1, 2)]
    for src in layouts:
        for dst in layouts:
            if not isinstance(move_between(src, dst), GeneralMove):
                continue
            received, messages = [0] * procs, [0] * procs
            for piece in transfer_pieces(src, dst):
                if piece.sender != piece.receiver:
                    received[piece.receiver] += box_size(piece.box)
                    messages[piece.receiver] += 1
            move, forward, _ = model.move_cost(src, dst)
            assert isinstance(move, GeneralMove)
            assert forward == pytest.approx(max(received), rel=1e-9), (src, dst)
            _, forward, _ = latency.move_cost(src, dst)
            assert forward == pytest.approx(max(messages), rel=1e-9), (src, dst)


@pytest.mark.parametrize("procs", [1, 2, 8, 64, 1024])
def test_the_busiest_receiver_in_closed_form_is_the_one_found_rank_by_rank(procs):
    """Bit for bit: on 2^k ranks every fraction of a block is exact in floating point."""
    grids = factorisations(procs)
    for src_grid, dst_grid in itertools.product(grids, grids):
        for src_split, dst_split in itertools.product((None, 1, 2), repeat=2):
            src_split = src_split if src_grid[0] > 1 else None  # as Layout drops it
            dst_split = dst_split if dst_grid[0] > 1 else None
            by_rank = _busiest_receiver_by_rank((src_grid, src_split), (dst_grid, dst_split))
            assert _busiest_receiver_closed_form(src_grid[0], src_split, dst_grid[0],
                                                 dst_split) == by_rank


def each_its_own(model):
    """``model`` with every layer and segment unlike any other: nothing is laid out or priced
    once for several."""
    model._alike_layer = list(range(len(model.net.layers)))
    model._first_alike = list(range(len(model.segments)))
    return model


@pytest.mark.parametrize("name,batch,procs", [("resnet50", 64, 64), ("inception_v3", 32, 16),
                                              ("resnet18", 12, 6)])
def test_blocks_alike_cost_what_each_costs_alone(name, batch, procs):
    net = load_net(name)
    shared, alone = model_of(net, batch, procs), each_its_own(model_of(net, batch, procs))
    assert len(set(shared._first_alike)) < len(shared.segments)  # the net repeats its blocks
    for k in range(len(shared.segments)):
        assert shared.choices(k) == alone.choices(k)
        for choice in shared.choices(k):
            ours, theirs = shared.segment_cost(k, choice), alone.segment_cost(k, choice)
            assert ours.layouts == theirs.layouts and ours.layers == theirs.layers
    assert format_plan(plan_network(shared)) == format_plan(plan_network(alone))


def test_a_refused_choice_names_the_segments_own_layer():
    """Segments alike are laid out once, but a refusal names the layer asked about."""
    model = model_of(load_net("resnet50"), 64, 64)
    twin = next(s for s, first in enumerate(model._first_alike) if first != s)
    own, other = (model.net.layers[model.segments[s][0]].name
                  for s in (twin, model._first_alike[twin]))
    choice = LayerPlan("domain", (64, 1))  # 64 row blocks: more than any feature map has rows
    assert model.segment_layouts(twin, choice) is None
    with pytest.raises(SplitError, match=f"^layer {own} cannot run domain 64x1: layer {own}:"):
        model.runnable_layouts(twin, choice)
    with pytest.raises(SplitError, match=f"^layer {other} cannot run"):
        model.runnable_layouts(model._first_alike[twin], choice)


def test_flop_model_counts_a_convolution():
    work = LocalWork(KINDS["conv"], (2, 3, 8, 8), out=4, kernel=(3, 3), stride=(1, 1),
                     pads=((1, 1), (1, 1)))
    forward, backward = work.flops()
    assert forward == 2 * 2 * 4 * 8 * 8 * 3 * 9
    assert backward == 2 * forward
    assert math.isclose(FlopModel(1e9).times([work])[work][0], forward / 1e9)
    first = LocalWork(KINDS["conv"], (2, 3, 8, 8), 4, (3, 3), (1, 1), ((1, 1), (1, 1)),
                      need_dx=False)
    assert first.flops()[1] == forward


def random_graph_net(seed: int) -> str:
    """A small net with branches: convolutions, batch norm, ReLU, pooling, adds and concats
    over 8x8 images, every tensor read (the unread ones concatenated at the end)."""
    rng = random.Random(seed)
    lines, shapes, unread = ["input channels=2 size=8 classes=3"], {"input": 2}, ["input"]
    for k in range(rng.randint(3, 5)):
        name, source = f"t{k}", rng.choice(list(shapes))
        same = [n for n in shapes if n != source and shapes[n] == shapes[source]]
        op = rng.choice(["conv", "conv", "conv", "add", "concat", "relu", "maxpool", "bn"])
        if op == "add" and same:
            other = rng.choice(same)
            lines.append(f"add name={name} in={source},{other}")
            channels = shapes[source]
            unread = [n for n in unread if n not in (source, other)]
        elif op == "concat":
            other = rng.choice([n for n in shapes if n != source] or [source])
            lines.append(f"concat name={name} in={source},{other}")
            channels = shapes[source] + shapes[other]
            unread = [n for n in unread if n not in (source, other)]
        else:
            channels = rng.choice([3, 4, 6]) if op in ("conv", "add") else shapes[source]
            kernel = rng.choice(["1", "3 pad=1", "1x3 pad=0x1"])
            lines.append({"conv": f"conv name={name} in={source} out={channels} kernel={kernel}",
                          "add": f"conv name={name} in={source} out={channels} kernel=1",
                          "relu": f"relu name={name} in={source}",
                          "maxpool": f"maxpool name={name} in={source} kernel=3 stride=1 pad=1",
                          "bn": f"batchnorm name={name} in={source}"}[op])
            unread = [n for n in unread if n != source]
        shapes[name] = channels
        unread.append(name)
    if len(unread) > 1:
        lines.append(f"concat name=joined in={','.join(unread)}")
    # a wide classifier, which a slow network would rather split than all-reduce
    lines += ["conv out=8 kernel=1", "flatten", "linear out=512", "relu", "linear out=3"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("machine", [MACHINE, SLOW_NET, LEVELS],
                         ids=["fast-net", "slow-net", "levels"])
def test_graph_plans_are_exact_against_brute_force(seed, machine):
    """Without a cap and under caps from the leanest plan's memory to the fastest plan's."""
    net = parse_net(random_graph_net(seed), f"random{seed}")
    model = model_of(net, 8, 4, machine)
    options = [model.choices(k) for k in range(len(model.segments))]
    if net.is_chain() or math.prod(map(len, options)) > 1000:
        pytest.skip("a chain, or too many plans to enumerate")
    every = [evaluate(model, list(combo)) for combo in itertools.product(*options)]
    planned = plan_network(model)
    assert planned.iteration_time == pytest.approx(min(p.iteration_time for p in every),
                                                   rel=1e-12)
    needs = sorted({p.memory for p in every if p.memory < planned.memory})
    for cap in needs[::max(1, len(needs) // 6)]:
        capped = plan_network(model, cap)
        assert capped.memory <= cap
        assert capped.iteration_time == pytest.approx(
            min(p.iteration_time for p in every if p.memory <= cap), rel=1e-12)
    smallest = min(p.memory for p in every)
    with pytest.raises(PlannerError, match="mem-per-rank"):
        plan_network(model, smallest * 0.99)


def test_a_densely_connected_net_falls_back_to_one_grid():
    """Each concat reads its newest conv first and every earlier conv after: all segments
    are tied to all others, too many for exact elimination; the plan is still valid."""
    lines = ["input channels=2 size=8 classes=3", "conv name=c0 out=4 kernel=1"]
    for k in range(1, 9):
        lines.append(f"conv name=c{k} in={'c0' if k == 1 else f'j{k - 1}'} out=4 kernel=1")
        lines.append(f"concat name=j{k} in={','.join(f'c{i}' for i in range(k, -1, -1))}")
    lines += ["avgpool kernel=global", "flatten", "linear out=3"]
    net = parse_net("\n".join(lines) + "\n", "dense")
    model = model_of(net, 64, 64)
    for cap in (None, 2.0**50):
        planned = plan_network(model, cap)
        grids = {p.grid for p in planned.plans if p.mode != "follow"}
        assert len(grids) == 1 and planned.iteration_time > 0 and not planned.exact
        assert "not exact" in format_plan(planned)


@pytest.mark.parametrize("machine", ["cori-knl", "gpu-like"])
def test_inception_v3_on_32_ranks_is_planned_as_the_published_planners_found(machine):
    """PaSE (Elango, IPDPS 2021, Table II) finds Inception-v3 on 32 GPUs best with modules
    A-D batch-parallel, module E hybrid batch x channel and the classifier split both ways;
    the exact plan at PaSE's default batch of 128 agrees, on both profiles."""
    net = load_net("inception_v3")
    chosen = plan_network(model_of(net, 128, 32, load_machine(machine))).plans
    split = {l.name: p.grid for l, p in zip(net.layers, chosen, strict=True) if p.mode == "model"}
    assert not [name for name in split if not name.startswith(("Mixed_7", "fc"))]
    for module in ("Mixed_7b", "Mixed_7c"):  # E: channels over Pr > 1, batch over Pc > 1
        assert [g for name, g in split.items() if name.startswith(module)
                and min(g) > 1], module
    assert min(split["fc"]) > 1


@pytest.mark.parametrize("machine", ["cori-knl", "gpu-like"])
def test_resnet50_on_16_ranks_is_data_parallel_but_the_classifier(machine):
    """FlexFlow and OptCNN find ResNet on 16 GPUs best data-parallel except the last fully
    connected layer; so does the planner on both profiles: every convolution batch-parallel
    and the classifier model-parallel."""
    net = load_net("resnet50")
    chosen = plan_network(model_of(net, 512, 16, load_machine(machine))).plans
    split = [l.name for l, p in zip(net.layers, chosen, strict=True)
             if p.mode != "batch" and p.mode != "follow"]
    assert split[-1] == "fc"
    assert split == ["fc"]


def channel_by_events(layers):
    """Seconds of gradient sums hidden, by stepping through the backward: each layer computes,
    its sum waits for the channel to be free and then takes its time, the move below follows."""
    now = free_at = 0.0
    for c in reversed(layers):
        now += c.compute[1] + c.comm[1] - c.grad_sum
        free_at = max(free_at, now) + c.grad_sum
        now += c.redistribution[1]
    return sum(c.grad_sum for c in layers) - max(0.0, free_at - now)


def overlapping(machine, share):
    return Machine(machine.name, machine.alpha, machine.beta, machine.flops, overlap=share)


@pytest.mark.parametrize("name,batch,procs,machine", CASES)
def test_hidden_gradient_sums_are_those_of_one_channel_stepped_through(name, batch, procs,
                                                                        machine):
    for share in (0.0, 0.5, 1.0):
        model = model_of(load_net(name), batch, procs, overlapping(machine, share),
                         overlap=True)
        for combo in itertools.islice(itertools.product(
                *[model.choices(k) for k in range(len(model.segments))]), 40):
            planned = evaluate(model, list(combo))
            hidden = planned.hidden_sums()
            assert hidden == pytest.approx(share * channel_by_events(planned.layers),
                                           rel=1e-12, abs=1e-15)
            counted = (sum(c.total for c in [*planned.layers, planned.loss, planned.data])
                       + planned.last_bucket)
            assert planned.iteration_time == pytest.approx(counted - hidden, rel=1e-12)
            assert planned.time_with_sums_hidden() <= planned.iteration_time * (1 + 1e-12)


def test_without_overlap_or_on_a_machine_that_hides_nothing_every_sum_counts():
    net = load_net("alexnet").with_image_size(127)
    plain = plan_network(model_of(net, 16, 4))
    for machine, overlap in ((overlapping(MACHINE, 1.0), False), (MACHINE, True)):
        planned = plan_network(model_of(net, 16, 4, machine, overlap=overlap))
        assert planned.hidden_sums() == 0.0 and planned.lower_bound is None
        assert planned.iteration_time == pytest.approx(plain.iteration_time, rel=1e-12)
    hiding = plan_network(model_of(net, 16, 4, overlapping(MACHINE, 1.0), overlap=True))
    assert 0 < hiding.hidden_sums() and hiding.iteration_time < plain.iteration_time
    assert "gradient sums hidden" in format_plan(hiding)
    assert "of the best" in format_plan(hiding)


@pytest.mark.parametrize("name,batch,procs,machine", CASES)
def test_a_plan_with_hidden_sums_is_bracketed_by_the_brute_force_optimum(name, batch, procs,
                                                                        machine):
    """The chosen plan is no slower than the plan that counts every sum, and no plan at all
    (by enumeration) beats the lower bound it reports."""
    for share in (0.5, 1.0):
        model = model_of(load_net(name), batch, procs, overlapping(machine, share),
                         overlap=True)
        planned = plan_network(model)
        best = brute_force(model)
        counting = plan_network(model_of(load_net(name), batch, procs, machine))
        assert planned.lower_bound <= best.iteration_time * (1 + 1e-12)
        assert best.iteration_time <= planned.iteration_time * (1 + 1e-12)
        assert planned.iteration_time <= evaluate(
            model, choices_of(model, counting.plans)).iteration_time * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(0, 12, 3))
def test_graph_plans_with_hidden_sums_are_bracketed_too(seed):
    net = parse_net(random_graph_net(seed), f"random{seed}")
    model = model_of(net, 8, 4, overlapping(SLOW_NET, 1.0), overlap=True)
    options = [model.choices(k) for k in range(len(model.segments))]
    if net.is_chain() or math.prod(map(len, options)) > 1000:
        pytest.skip("a chain, or too many plans to enumerate")
    best = min(evaluate(model, list(c)).iteration_time for c in itertools.product(*options))
    planned = plan_network(model)
    assert planned.lower_bound <= best * (1 + 1e-12) <= planned.iteration_time * (1 + 2e-12)


def test_the_front_of_labels_is_every_label_no_other_beats():
    """The chain search keeps, per choice, the partial plans no other beats in time, memory and
    peak: the staircase it keeps them with gives the same front as comparing every pair."""
    from hpctrain.plan.planner import _Label, _pareto

    rng = random.Random(5)
    for _ in range(200):
        labels = [_Label(*(float(rng.randint(0, 5)) for _ in range(3)), None)
                  for _ in range(rng.randint(1, 40))]
        cap = float(rng.randint(4, 12))
        under = [l for l in labels if l.memory + l.peak <= cap]
        order = sorted(under, key=lambda l: (l.time, l.memory, l.peak))
        want = [l for i, l in enumerate(order) if not any(
            k.time <= l.time and k.memory <= l.memory and k.peak <= l.peak
            for k in order[:i])]
        assert _pareto(labels, cap) == want
