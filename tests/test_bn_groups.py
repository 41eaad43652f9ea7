"""Batch-norm statistics over groups of samples ("ghost" batch norm): the groups of a
``--bn-group`` / ``group=`` choice, their nesting with the sample blocks, the net-file key and
the flag, the cost model's price of the statistics, and ``verify`` on 1 to 4 (and 6) ranks
against one process computing the same groups, under batch, model, domain and mixed plans."""

import argparse
import re

import numpy as np
import pytest

from hpctrain.commands.flags import load_net_for, statistics_group
from hpctrain.layout.partition import SplitError
from hpctrain.layout.statistics import (
    check_nesting,
    groups_for,
    held_groups,
    sharing_blocks,
)
from hpctrain.model.net import parse_net
from hpctrain.model.options import NetError
from tests.test_training_app import launch, mpiexec

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")

# every batch norm's key in turn: global, rank, a number of ranks, and none (the run's flag)
MIXED_NET = """# a residual net on 8x8 images whose batch norms take their statistics differently
input channels=1 size=8 classes=10
conv name=conv1 out=8 kernel=3 pad=1 bias=0
batchnorm name=bn1 group=global
relu name=relu1
conv name=conv2 out=8 kernel=3 pad=1 bias=0
batchnorm name=bn2 group=rank
add name=add1 in=bn2,relu1
relu name=relu2
conv name=conv3 out=16 kernel=3 stride=2 pad=1 bias=0
batchnorm name=bn3
relu name=relu3
conv name=conv4 out=16 kernel=3 pad=1 bias=0
batchnorm name=bn4 group=2
relu name=relu4
avgpool kernel=global
flatten
linear name=fc out=10
"""


def batchnorm_groups(net):
    """Each batch norm's number of sample groups, by name."""
    return {spec.name: spec.options.groups for spec in net.layers if spec.kind == "batchnorm"}


# -- groups_for: a choice made a number of sample groups ----------------------------------------

@pytest.mark.parametrize("choice,procs,groups", [
    ("global", 4, 1), ("rank", 4, 4), ("rank", 1, 1), ("rank", 3, 3), (2, 4, 2), (4, 4, 1),
    (1, 6, 6), (3, 6, 2), (6, 6, 1)])
def test_groups_for_a_choice(choice, procs, groups):
    assert groups_for(choice, procs, "layer bn1") == groups


def test_groups_for_refuses_a_group_that_does_not_divide_the_ranks():
    with pytest.raises(SplitError) as err:
        groups_for(3, 4, "layer bn7")
    assert str(err.value) == ("layer bn7: batch-norm groups of 3 ranks do not divide 4 ranks; "
                              "give a divisor of 4, rank or global")
    with pytest.raises(SplitError, match="do not divide 4 ranks"):
        groups_for(8, 4, "layer bn7")  # larger than P: no divisor either


@pytest.mark.parametrize("choice", [0, -2, "ranks", "Global", 2.0])
def test_groups_for_refuses_what_is_not_a_choice(choice):
    with pytest.raises(SplitError) as err:
        groups_for(choice, 4, "layer bn1")
    message = str(err.value)
    assert message.startswith("layer bn1: batch-norm group ") and repr(choice) in message
    assert message.endswith("give global, rank or a number of ranks")


# -- which groups a sample block holds, and nesting ----------------------------------------------

def test_held_groups_of_a_block_inside_one_group():
    held = held_groups(8, 2, 4, 6)  # groups 0..3 and 4..7; the block holds half of group 1
    assert (held.first, held.ranges, held.sizes, held.whole) == (1, ((0, 2),), (4,), False)


def test_held_groups_of_a_block_of_whole_uneven_groups():
    # 10 samples 4 ways by the block rule k·n//parts: 0..1, 2..4, 5..6, 7..9
    held = held_groups(10, 4, 5, 10)
    assert (held.first, held.ranges, held.sizes, held.whole) == (2, ((0, 2), (2, 5)), (2, 3),
                                                                 True)
    held = held_groups(10, 4, 0, 10)
    assert held.ranges == ((0, 2), (2, 5), (5, 7), (7, 10)) and held.sizes == (2, 3, 2, 3)


def test_held_groups_refuses_part_of_a_group_and_more():
    with pytest.raises(SplitError, match=r"samples 2\.\.3 hold part of batch-norm group 0 "
                                         r"\(samples 0\.\.2\) and more"):
        held_groups(6, 2, 2, 4)  # groups 0..2 and 3..5


@pytest.mark.parametrize("batch,groups,parts", [
    (8, 2, 4), (8, 4, 2), (8, 4, 4), (8, 1, 4), (10, 4, 2), (10, 2, 4), (7, 3, 3),
    (4, 2, 3)])  # neither divides the other, yet blocks 0, 1, 2..3 lie in groups 0..1, 2..3
def test_nesting_cuts_are_accepted(batch, groups, parts):
    check_nesting(batch, groups, parts, "bn1")


@pytest.mark.parametrize("batch,groups,parts", [(6, 2, 3), (12, 2, 3), (12, 3, 2), (7, 3, 2),
                                                (12, 6, 4), (10, 4, 3)])
def test_cuts_that_do_not_nest_are_refused_naming_the_layer(batch, groups, parts):
    with pytest.raises(SplitError) as err:
        check_nesting(batch, groups, parts, "layer2.bn1")
    message = str(err.value)
    assert message.startswith("layer layer2.bn1: samples ") and "\n" not in message
    assert f"split the batch {groups} ways or a multiple of it" in message


def test_more_groups_than_samples_are_refused():
    with pytest.raises(SplitError, match="layer bn2: 4 batch-norm groups need at least 4 samples"):
        check_nesting(3, 4, 1, "bn2")


@pytest.mark.parametrize("batch,groups,parts,sharing", [
    (8, 2, 4, 2), (8, 4, 2, 1), (8, 1, 4, 4), (8, 4, 4, 1), (4, 2, 3, 2), (8, 2, 8, 4)])
def test_sharing_blocks(batch, groups, parts, sharing):
    assert sharing_blocks(batch, groups, parts) == sharing


# -- the group= key of a net file, and the --bn-group flag ----------------------------------------

def bn_line(key):
    return parse_net("input channels=1 size=4 classes=3\nconv out=4 kernel=3 pad=1\n"
                     f"batchnorm name=bn1 {key}\nflatten\nlinear out=3\n", "t.net")


@pytest.mark.parametrize("key,group", [("group=global", "global"), ("group=rank", "rank"),
                                       ("group=8", 8), ("group=1", 1), ("", None)])
def test_the_group_key(key, group):
    assert bn_line(key).layers[1].options.group == group


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", "Rank"])
def test_a_bad_group_key_is_one_clear_line(value):
    with pytest.raises(NetError) as err:
        bn_line(f"group={value}")
    assert str(err.value) == (f"t.net, line 3: group='{value}' must be global, rank or a "
                              f"number of ranks such as 8")


@pytest.mark.parametrize("text,value", [("global", "global"), ("rank", "rank"), ("8", 8),
                                        ("1", 1)])
def test_the_flag(text, value):
    assert statistics_group(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "abc", "", "2.5", "GLOBAL"])
def test_a_bad_flag_is_refused_naming_it(text):
    with pytest.raises(argparse.ArgumentTypeError) as err:
        statistics_group(text)
    assert str(err.value) == f"'{text}' is not global, rank or a number of ranks such as 8"


@pytest.mark.parametrize("command", ["plan", "verify", "compare_plans", "train"])
def test_every_net_command_takes_the_flag(command):
    import importlib

    parser = importlib.import_module(f"hpctrain.commands.{command}").build_parser()
    needed = ["--procs", "4", "--batch", "8"] if command == "plan" else []
    assert parser.parse_args(needed).bn_group == "global"
    assert parser.parse_args([*needed, "--bn-group", "rank"]).bn_group == "rank"
    assert parser.parse_args([*needed, "--bn-group", "4"]).bn_group == 4


# -- NetSpec.with_statistics: the net's key wins over the flag -----------------------------------

def test_the_net_key_wins_over_the_flag():
    net = parse_net(MIXED_NET, "mixed.net")
    assert batchnorm_groups(net) == {"bn1": 1, "bn2": 1, "bn3": 1, "bn4": 1}  # not yet resolved
    assert batchnorm_groups(net.with_statistics("rank", 4)) == {"bn1": 1, "bn2": 4, "bn3": 4,
                                                                "bn4": 2}
    assert batchnorm_groups(net.with_statistics("global", 4)) == {"bn1": 1, "bn2": 4, "bn3": 1,
                                                                  "bn4": 2}
    assert batchnorm_groups(net.with_statistics(2, 8)) == {"bn1": 1, "bn2": 8, "bn3": 4,
                                                           "bn4": 4}
    assert batchnorm_groups(net.with_statistics("rank", 2)) == {"bn1": 1, "bn2": 2, "bn3": 2,
                                                                "bn4": 1}
    # everything but the batch norms' groups is kept
    resolved = net.with_statistics("rank", 4)
    assert (resolved.name, resolved.input_shape, resolved.classes, resolved.out_shapes) == (
        net.name, net.input_shape, net.classes, net.out_shapes)


def test_with_statistics_refuses_naming_the_layer():
    net = parse_net(MIXED_NET, "mixed.net")
    with pytest.raises(NetError, match="^layer bn3: batch-norm groups of 3 ranks do not divide 4 "
                                       "ranks"):
        net.with_statistics(3, 4)  # the flag, for bn3
    with pytest.raises(NetError, match="^layer bn4: batch-norm groups of 2 ranks do not divide 3 "
                                       "ranks"):
        net.with_statistics("rank", 3)  # bn4's own group=2


def test_load_net_for_takes_the_flag(tmp_path):
    path = tmp_path / "mixed.net"
    path.write_text(MIXED_NET)
    args = argparse.Namespace(net=str(path), image_size=None, bn_group=2)
    assert batchnorm_groups(load_net_for(args, 4)) == {"bn1": 1, "bn2": 4, "bn3": 2, "bn4": 2}
    args = argparse.Namespace(net="resdigits", image_size=None, bn_group="rank")
    assert set(batchnorm_groups(load_net_for(args, 2)).values()) == {2}


# -- the cost model prices the statistics ---------------------------------------------------------

def batchnorm_costs(choice, grid, procs=4, batch=8):
    """Each batch norm's predicted LayerCost on ``procs`` ranks under ``grid``, with ``choice``
    as --bn-group; and the plan's iteration time. As ``plan --grid GRID --compute flops``."""
    from hpctrain.cost.machine import load_machine
    from hpctrain.device.backend import Backend
    from hpctrain.model.net import load_net
    from hpctrain.plan.plans import plan_from_spec
    from hpctrain.plan.pricing import build_cost_model
    from hpctrain.plan.spaces import predict

    net = load_net("resdigits").with_statistics(choice, procs)
    model = build_cost_model(net, batch, procs, load_machine("default"), "flops",
                             Backend(np, np.float32))
    planned = predict(model, plan_from_spec(grid, net, procs))
    costs = [c for c in planned.layers if c.kind == "batchnorm"]
    assert len(costs) == 6  # bn1 and two residual blocks of two (and a downsample)
    return costs, planned.iteration_time


def test_per_rank_statistics_under_a_batch_plan_sum_only_the_gradients():
    """1x4: each rank holds its group whole, so no statistics move; γ and β's gradients are
    still summed over the 4 ranks, as every other parameter's."""
    costs, _ = batchnorm_costs("rank", "1x4")
    for cost in costs:
        assert cost.comm[0] == 0.0, cost
        assert cost.grad_sum > 0.0 and cost.comm[1] == pytest.approx(cost.grad_sum, rel=1e-12)


def test_global_statistics_cost_more_than_groups_and_groups_more_than_per_rank():
    """1x4: global statistics sum over 4 ranks each way (and γ, β need no further sum); groups
    of 2 ranks sum over 2; per rank over none."""
    (glob, glob_time), (pairs, pairs_time), (own, own_time) = (
        batchnorm_costs(choice, "1x4") for choice in ("global", 2, "rank"))
    for g, p, o in zip(glob, pairs, own, strict=True):
        assert g.grad_sum == 0.0 and g.comm[0] > 0.0
        assert g.comm[0] > p.comm[0] > o.comm[0] == 0.0, (g, p, o)
        assert sum(g.comm) > sum(p.comm) > sum(o.comm), (g, p, o)
    assert glob_time > pairs_time > own_time


def test_per_rank_statistics_still_sum_over_a_split_image():
    """conv=h4: every rank holds every sample and a quarter of the rows; per-rank statistics
    are 4 groups of samples, each summed over the 4 row blocks, as global ones are: the same
    ranks, a message 4 times longer (2 sums of C channels for each group held)."""
    own, _ = batchnorm_costs("rank", "conv=h4,fc=4x1")
    glob, _ = batchnorm_costs("global", "conv=h4,fc=4x1")
    for o, g in zip(own, glob, strict=True):
        assert o.comm[0] > g.comm[0] > 0.0, (o, g)


# -- verify on ranks: the same sample groups under every plan as on one process -----------------

LOSS = re.compile(r"^loss (\S+) \(serial (\S+)\); largest relative error (\S+) <= tolerance "
                  r"\S+: PASS$")


def verified_loss(tmp_path, procs, net, grid, group, batch=8, *extra):
    """``verify`` on ``procs`` ranks passes below 1e-12; its loss (printed to 12 digits)."""
    result = launch(procs, "verify", "--net", net, "--grid", grid, "--batch", str(batch),
                    "--bn-group", str(group), *extra, tmp_path=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    match = LOSS.match(last)
    assert match, last
    loss, serial, error = match.groups()
    assert loss == serial and float(error) < 1e-12, last
    return loss


# (ranks, --grid, --bn-group, --batch): batch, model, domain and mixed plans; per rank and K
# ranks a group; uneven groups on 3 ranks (7 samples: 2, 2, 3); several groups on one rank
# under a height split
PLANS = [
    (2, "1x2", "rank", 8), (2, "2x1", "rank", 8), (2, "conv=h2,fc=2x1", "rank", 8),
    (3, "conv=1x3,fc=3x1", "rank", 6), (3, "1x3", "rank", 7),
    (4, "1x4", 2, 8), (4, "4x1", 2, 8), (4, "conv=n2h2,fc=1x4", 2, 8),
    (4, "conv=domain:2x2,fc=4x1", "rank", 8),
]


@needs_mpiexec
@pytest.mark.parametrize("procs,grid,group,batch", PLANS,
                         ids=[f"{p}-{g}-{k}" for p, g, k, _ in PLANS])
def test_ghost_batch_norm_verifies(tmp_path, procs, grid, group, batch):
    verified_loss(tmp_path, procs, "resdigits", grid, group, batch)


# per-layer plans of resdigits in which batch norms whose samples are cut and batch norms whose
# rows are cut lie on the same mesh of ranks: (2,) on 2 ranks, (4,) on 4
MIXED_ON_2 = """conv1 batch 1x2
layer1.conv1 domain 2x1
layer1.conv2 model 2x1
layer2.conv1 batch 1x2
layer2.conv2 domain 2x1
layer2.downsample model 2x1
fc batch 1x2
"""
MIXED_ON_4 = """conv1 batch 1x4
layer1.conv1 domain 4x1
layer1.conv2 model 2x2
layer2.conv1 batch 1x4
layer2.conv2 domain 2x2
layer2.downsample model 4x1
fc batch 1x4
"""

@needs_mpiexec
@pytest.mark.parametrize("procs,plan,group", [(2, MIXED_ON_2, "rank"), (4, MIXED_ON_4, 2)])
def test_ghost_batch_norm_verifies_under_per_layer_plans(tmp_path, procs, plan, group):
    path = tmp_path / "mixed.plan"
    path.write_text(plan)
    verified_loss(tmp_path, procs, "resdigits", str(path), group)


@needs_mpiexec
def test_global_statistics_verify_under_the_same_per_layer_plans(tmp_path):
    path = tmp_path / "mixed.plan"
    path.write_text(MIXED_ON_4)
    verified_loss(tmp_path, 4, "resdigits", str(path), "global")


@needs_mpiexec
def test_the_sample_groups_decide_the_numbers_not_the_ranks(tmp_path):
    """Two groups of 4 samples are the same on 2 ranks (one each) as on 4 (two each), under
    batch or mixed plans; one group is global statistics; and the groups do change the loss
    (else verify could pass with the groups ignored on both sides)."""
    one_rank = verified_loss(tmp_path, 1, "resdigits", "1x1", "rank")
    global_on_4 = verified_loss(tmp_path, 4, "resdigits", "conv=n2h2,fc=1x4", "global")
    two_on_2 = verified_loss(tmp_path, 2, "resdigits", "1x2", "rank")
    two_on_4 = verified_loss(tmp_path, 4, "resdigits", "conv=n2h2,fc=1x4", 2)
    four_on_4 = verified_loss(tmp_path, 4, "resdigits", "1x4", "rank")
    assert one_rank == global_on_4
    assert two_on_2 == two_on_4
    assert len({one_rank, two_on_2, four_on_4}) == 3


@needs_mpiexec
@pytest.mark.parametrize("procs,grid,group,batch", [
    (4, "conv=n2h2,fc=1x4", 2, 8), (4, "1x4", "global", 8), (3, "conv=1x3,fc=3x1", "global", 6)])
def test_a_net_mixing_global_and_per_rank_statistics_verifies(tmp_path, procs, grid, group,
                                                              batch):
    path = tmp_path / "mixed.net"
    path.write_text(MIXED_NET.replace("group=2", "group=rank") if procs == 3 else MIXED_NET)
    verified_loss(tmp_path, procs, str(path), grid, group, batch)


@needs_mpiexec
def test_groups_that_do_not_nest_with_the_plan_are_refused_at_once(tmp_path):
    """6 ranks: groups of 3 ranks' samples (2 groups of 3) against a batch cut 3 ways (blocks
    of 2): samples 2..3 straddle the groups. One line, naming the batch norm, before any step."""
    result = launch(6, "verify", "--net", "resdigits", "--grid", "2x3", "--batch", "6",
                    "--bn-group", "3", tmp_path=tmp_path, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("hpctrain: error: ") and "layer bn1: samples 2..3 hold part of " \
        "batch-norm group 0" in lines[0], lines[0]


def test_groups_that_do_not_nest_are_refused_by_plan_too(capsys):
    from hpctrain.cli import main

    code = main(["plan", "--net", "resdigits", "--procs", "6", "--batch", "6", "--bn-group",
                 "3", "--grid", "2x3", "--compute", "flops"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "layer bn1: samples 2..3 hold part of batch-norm group 0" in \
        lines[0], lines


@needs_mpiexec
def test_a_group_that_does_not_divide_the_ranks_is_refused_naming_the_layer(tmp_path):
    path = tmp_path / "mixed.net"
    path.write_text(MIXED_NET)
    result = launch(3, "verify", "--net", str(path), "--grid", "1x3", "--batch", "6",
                    "--bn-group", "rank", tmp_path=tmp_path, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert lines == ["hpctrain: error: layer bn4: batch-norm groups of 2 ranks do not divide 3 "
                     "ranks; give a divisor of 3, rank or global"], lines


@pytest.mark.parametrize("groups", [((0, 3), (3, 6)), ((0, 2), (2, 5), (5, 7))])
def test_grouped_kernels_run_on_device_arrays(standin_cupy, groups):
    """The grouped statistics on the strict CuPy stand-in (device arrays, no implicit host
    copy, no scalar read), both forward paths, equal the same kernels on NumPy."""
    from hpctrain.kernels.norm import batchnorm_backward, batchnorm_forward
    from tests.gpu_standin import SCALAR

    cp = standin_cupy
    rng = np.random.default_rng(3)
    n = groups[-1][1]
    x, dy = rng.standard_normal((n, 4, 3, 2)), rng.standard_normal((n, 4, 3, 2))
    gamma, beta, shift = rng.uniform(0.5, 2, 4), rng.standard_normal(4), rng.standard_normal(4)
    counts = np.array([[(b - a) * 6] for a, b in groups], dtype=float)
    for k in (None, shift):
        want = batchnorm_forward(np, x, gamma, beta, 1e-5, counts, lambda a: a, k, groups)
        got = batchnorm_forward(cp, cp.asarray(x), cp.asarray(gamma), cp.asarray(beta), 1e-5,
                                cp.asarray(counts), lambda a: a,
                                None if k is None else cp.asarray(k), groups)
        for g, w in zip((got[0], got[2], got[3]), (want[0], want[2], want[3]), strict=True):
            np.testing.assert_allclose(cp.asnumpy(g), w, rtol=1e-12, atol=1e-12)
        back = batchnorm_backward(cp, cp.asarray(dy), got[1], cp.asarray(counts), lambda a: a)
        ref = batchnorm_backward(np, dy, want[1], counts, lambda a: a)
        for g, w in zip(back, ref, strict=True):
            np.testing.assert_allclose(cp.asnumpy(g), w, rtol=1e-12, atol=1e-12)
    assert standin_cupy.counters.events[SCALAR] == 0
