"""Input splits (the reduction): the split's spelling, the layouts and weight blocks they give,
the hand-on with no move down an alternating chain, their prices, and the planner over the
space that holds them (exact against brute force, and the only plans under a memory cap)."""

import itertools
import math

import pytest

from hpctrain.cost.collectives import (
    allgather_time,
    allreduce_time,
    gradient_sum_seconds,
    reduce_scatter_time,
)
from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine
from hpctrain.layout.layout import CHANNEL_AXIS, Layout, Split
from hpctrain.layout.reduction import InputSplit, common_mesh
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.placement import input_layout, move_pairs, plan_layouts
from hpctrain.plan.planner import PlannerError, evaluate, plan_network
from hpctrain.plan.plans import LayerPlan, PlanError, parse_plan, parse_split, plan_from_spec
from hpctrain.plan.pricing import CostModel

MACHINE = Machine("test", alpha=2e-6, beta=1 / 6e9, flops=1e11)
SLOW_NET = Machine("slow", alpha=1e-4, beta=1 / 1e8, flops=1e12)

MLP = """input features=12 classes=6
linear out=20
relu
linear out=9
relu
linear out=6
"""

ALTERNATING = "linear1 split c=2,i=2\nlinear2 split i=2,c=2\nlinear3 split c=2,i=2\n"


# -- the split's spelling ---------------------------------------------------------------------

@pytest.mark.parametrize("text,procs,split", [
    ("c=4,i=8", 32, Split((1, 4), 1, 8)),
    ("i=8,c=4", 32, Split((1, 4), 1, 8, inputs_outer=True)),
    ("n=2,c=4,s=8", 64, Split((2, 4), 1, 8, scatter=True)),
    ("n2i2", 4, Split((2, 1), 1, 2)),
    ("i=2,n=2", 4, Split((2, 1), 1, 2)),  # with one channel block the order says nothing
])
def test_an_input_split_reads_and_writes_back(text, procs, split):
    parsed = parse_split(text, 2, procs, "--grid", "fc")
    assert parsed == split
    assert parse_split(parsed.text(), 2, procs, "--grid", "fc") == split
    assert parsed.procs == procs and parsed.mode == "split"


@pytest.mark.parametrize("text,words", [
    ("c=2,i=2,s=2", "both i= and s="),
    ("s=2,c=2", "write c= before s="),
    ("c=2,i=3", "needs 6 processes"),
])
def test_a_bad_input_split_is_refused_in_one_line(text, words):
    with pytest.raises(PlanError, match=words) as err:
        parse_split(text, 2, 4, "--grid fc=x", "fc")
    assert "\n" not in str(err.value)


def test_the_mesh_puts_the_input_digit_beside_the_channels():
    assert Split((2, 4), 1, 8).mesh() == ((2, 4, 8, 1), (0, 1, -2, -1))
    assert Split((2, 4), 1, 8, inputs_outer=True).mesh() == ((2, 8, 4, 1), (0, -2, 1, -1))


# -- layouts and blocks ---------------------------------------------------------------------------

def test_the_docstring_example_holds_its_blocks():
    """A linear layer of 6 inputs and 4 outputs on 4 ranks as c=2,i=2 (rank = 2·o + i)."""
    split = Split((1, 2), 1, 2)
    x = Layout.of_split((3, 6), split, (), CHANNEL_AXIS)
    y = Layout.of_split((3, 4), split)
    found = InputSplit.of(x, y, (4, 6))
    assert [x.box(r)[1] for r in range(4)] == [(0, 3), (3, 6), (0, 3), (3, 6)]
    assert [found.weight.box(r) for r in range(4)] == [
        ((0, 2), (0, 3)), ((0, 2), (3, 6)), ((2, 4), (0, 3)), ((2, 4), (3, 6))]
    assert [found.bias.box(r) for r in range(4)] == [((0, 2),)] * 2 + [((2, 4),)] * 2
    assert found.parts == 2 and not found.scatter and found.partial_channels == 2
    assert found.sum_group.size == 2 and found.sum_group.stride == 1


def test_a_reduce_scatter_leaves_each_rank_a_sub_block_of_its_rows():
    split = Split((1, 2), 1, 3, scatter=True)
    x = Layout.of_split((2, 9), split, (), CHANNEL_AXIS)
    y = Layout.of_split((2, 13), split, reduction=CHANNEL_AXIS)
    found = InputSplit.of(x, y, (13, 9))
    assert found.scatter and y.parts[CHANNEL_AXIS] == 6
    for rank in range(6):
        rows = found.weight.box(rank)[0]
        lo, hi = y.box(rank)[1]
        assert rows[0] <= lo < hi <= rows[1]  # its part of the sum lies in its own rows
    # the bias is cut as the output is, and shared by no two ranks here
    assert found.bias_group.size == 1 and found.weight_group.size == 1


def test_the_common_mesh_refines_both_layouts():
    split = Split((2, 2), 3, 2)
    x = Layout.of_split((4, 8), split, (), CHANNEL_AXIS)
    y = Layout.of_split((4, 6), split)
    sizes, in_x, in_y = common_mesh(x, y)
    assert math.prod(sizes) == 24
    assert sizes == (2, 2, 2, 3) and in_x == (0, -1, 1, -1) and in_y == (0, 1, -1, -1)


def test_an_alternating_chain_hands_on_with_no_move():
    net = parse_net(MLP, "t")
    plan = parse_plan(ALTERNATING, "t", net, 4)
    layouts = plan_layouts(net, plan, 4, 4)
    pairs = move_pairs(net, layouts, input_layout(net, plan, 4, 4))
    linears = [k for k, layer in enumerate(net.layers) if layer.kind == "linear"]
    # into linear2 and linear3 (through their ReLUs): the layout each sum leaves
    for k in linears[1:]:
        src, dst = pairs[k]
        assert src == dst, (net.layers[k].name, src, dst)
    # while the output-split (1.5D) chain gathers before every layer
    model = plan_layouts(net, plan_from_spec("4x1", net, 4), 4, 4)
    gathered = move_pairs(net, model, input_layout(net, plan_from_spec("4x1", net, 4), 4, 4))
    assert all(gathered[k][0] != gathered[k][1] for k in linears[1:])


# -- prices ---------------------------------------------------------------------------------------

def test_an_input_split_is_priced_as_its_sum_and_its_blocks():
    """linear2 (20 → 9) as c=2,i=2 on 4 ranks, batch 8: the weight block is |W|/4, the sum an
    all-reduce of the partial block over 2 ranks each way, and the gradients summed over the
    ranks holding the same blocks."""
    net = parse_net(MLP, "t")
    plan = parse_plan(ALTERNATING, "t", net, 4)
    layouts = plan_layouts(net, plan, 8, 4)
    k = 2
    kind, spec = KINDS["linear"], net.layers[k]
    inputs, output = layouts[k].inputs, layouts[k].output
    split = kind.input_split(spec, inputs, output)
    assert kind.local_parameters(spec, inputs, output) == 5 * 10 + 5
    work = kind.work(spec, inputs, output, True)
    assert work.x == (8, 10) and work.out == 5
    partial = 8 * 5 * 8  # 8 samples by 5 rows, float64
    sums = allreduce_time(MACHINE, inputs[0].group((CHANNEL_AXIS,)), partial)
    forward, backward = kind.comm_time(spec, inputs, output, MACHINE, 8)
    grads = kind.gradient_sum_time(spec, inputs, output, MACHINE, 8)
    assert forward == pytest.approx(sums) and backward == pytest.approx(sums + grads)
    # each weight block on one rank; the bias added after the sum, so its gradient (made from
    # the partial output gradient) is summed over the 2 ranks of the sum
    assert split.weight_group.size == 1 and split.bias_group.size == 2
    assert grads == pytest.approx(gradient_sum_seconds(MACHINE, split.bias_group, 5 * 8))
    # as one part of a bucket: its bytes in full, its share of the bucket's latency
    alone = allreduce_time(MACHINE, split.bias_group, 5 * 8)
    latency = allreduce_time(MACHINE, split.bias_group, 1)
    share = 5 * 8 / MACHINE.bucket_bytes
    assert grads == pytest.approx(alone - latency + share * latency)
    assert grads < alone / 100


def test_a_reduce_scatter_is_priced_with_its_adjoint_gather():
    net = parse_net(MLP, "t")
    plan = parse_plan("linear1 split s=4\nlinear2 split s=4\nlinear3 split n=2,s=2\n", "t",
                      net, 4)
    layouts = plan_layouts(net, plan, 8, 4)
    kind, spec = KINDS["linear"], net.layers[2]
    inputs, output = layouts[2].inputs, layouts[2].output
    group, n = inputs[0].group((CHANNEL_AXIS,)), 8 * 9 * 8
    forward, backward = kind.comm_time(spec, inputs, output, MACHINE, 8)
    assert forward == pytest.approx(reduce_scatter_time(MACHINE, group, n))
    grads = kind.gradient_sum_time(spec, inputs, output, MACHINE, 8)
    assert backward == pytest.approx(allgather_time(MACHINE, group, n) + grads)


# -- the planner ----------------------------------------------------------------------------------

def model_of(text, batch, procs, machine):
    return CostModel(parse_net(text, "t"), batch, procs, machine, FlopModel(machine.flops))


@pytest.mark.parametrize("batch,procs,machine", [(4, 4, MACHINE), (2, 4, SLOW_NET),
                                                 (3, 3, SLOW_NET)])
def test_the_plan_with_input_splits_is_the_brute_force_optimum(batch, procs, machine):
    model = model_of(MLP, batch, procs, machine)
    options = [model.choices(k) + model.split_choices(k, "axes")
               for k in range(len(model.segments))]
    assert any(c.split is not None and c.split.inputs > 1 for c in options[1])
    best = min(evaluate(model, list(combo)).iteration_time
               for combo in itertools.product(*options))
    assert plan_network(model, space="axes").iteration_time == pytest.approx(best, rel=1e-12)


def test_under_a_memory_cap_only_input_splits_fit():
    """VGG-16 at 224² on 16 ranks, batch 16: the leanest 1.5D plan keeps 802 MiB per rank,
    its classifier output-split with each input gathered whole (fc6 reads 25088 features); an
    input split keeps only its slice of them, and fits in 700 MiB."""
    from hpctrain.cost.machine import load_machine

    machine = load_machine("dgx-h100")
    model = CostModel(load_net("vgg16", None), 16, 16, machine, FlopModel(machine.flops))
    cap = 700 * 2**20
    with pytest.raises(PlannerError, match="no plan fits"):
        plan_network(model, mem_per_rank=cap)
    planned = plan_network(model, mem_per_rank=cap, space="balanced")
    assert planned.memory <= cap
    assert any(p.split is not None and p.split.inputs > 1 for p in planned.plans)


def test_the_plan_entry_names_an_input_split():
    entry = LayerPlan("split", split=Split((1, 2), 1, 2))
    assert entry.mode == "split" and entry.describe() == "split n=1,c=2,i=2"


@pytest.mark.parametrize("name", ["resnet18", "convnext_tiny"])
def test_a_layers_communication_is_the_same_with_its_gradient_sums_given(name):
    """The cost model prices a layer's gradient sums apart and hands them to its kind's
    communication (``sums``): through every kind's override, the same seconds as the kind
    finds them itself, for every layer of the net under every split of the balanced space."""
    model = CostModel(load_net(name), 64, 16, SLOW_NET, FlopModel(SLOW_NET.flops))
    checked = 0
    for segment in range(len(model.segments)):
        for choice in model.choices(segment) + model.split_choices(segment, "balanced"):
            members = model.segments[segment]
            for k, where in zip(members, model.runnable_layouts(segment, choice), strict=True):
                spec = model.net.layers[k]
                kind = KINDS[spec.kind]
                args = (spec, where.inputs, where.output, SLOW_NET, 4)
                sums = kind.gradient_sum_time(*args)
                found = kind.comm_time(*args)
                assert kind.comm_time(*args, sums) == found
                if sums > 0:  # the seconds given are the ones counted
                    more = kind.comm_time(*args, sums + 1.0)
                    assert more[0] == found[0] and more[1] == pytest.approx(found[1] + 1.0)
                    checked += 1
    assert checked > 0
