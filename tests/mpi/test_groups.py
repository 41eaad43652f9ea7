"""Layers on groups of ranks, side by side, against one process in float64: every output,
gradient and running statistic of one step (``check_plan``, as for the graph kinds).

Plans put the weighted branches of each fork–join region on disjoint blocks of ranks
(:func:`tests.grouped_plans.grouped_plan`): on 3 ranks two branches take 1 rank and 2 (uneven
groups); with more branches than ranks a group runs several. Inside a group each weighted layer
cycles through the 1.5D modes on the group's grids; the layers outside the regions run batch- or
model-parallel on every rank, so the forks and joins move between layouts on different ranks.
"""

import re

import pytest

from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.placement import plan_layouts
from hpctrain.plan.plans import LayerPlan, PlanError, parse_plan
from tests.grouped_plans import grouped_plan
from tests.mpi.helpers import raises_everywhere
from tests.mpi.test_graph_layers import BATCH, check_plan

# four regions: branches of depth 1, 2 and 3 and a pool (concat); two branches, one of them
# empty (the identity), joined by an add; three branches with batch norm inside, one a max pool
# of a strided conv; then a linear head split by its input features
BRANCHES_NET = parse_net("""
input channels=3 size=9 classes=5
conv name=stem out=4 kernel=3 pad=1
conv name=a1 out=3 kernel=1 bias=0
conv name=b1 in=stem out=3 kernel=1
conv name=b2 out=4 kernel=3 pad=1
conv name=c1 in=stem out=2 kernel=1
relu name=c1r
conv name=c2 out=3 kernel=1x3 pad=0x1
conv name=c3 out=3 kernel=3x1 pad=1x0
avgpool name=d in=stem kernel=3 stride=1 pad=1
concat name=cat in=a1,b2,c3,d
relu name=r
conv name=e1 out=14 kernel=3 pad=1 bias=0
batchnorm name=e1n
add name=sum in=e1n,r
relu name=s
conv name=f1 out=4 kernel=1 bias=0
batchnorm name=f1n
relu name=f1r
conv name=g1 in=s out=3 kernel=3 pad=1 bias=0
batchnorm name=g1n
relu name=g1r
conv name=g2 out=5 kernel=3 pad=1
conv name=h1 in=s out=4 kernel=3 stride=2 pad=1
maxpool name=h2 kernel=3 stride=1 pad=1
conv name=f2 in=f1r out=4 kernel=3 stride=2 pad=1
conv name=g3 in=g2 out=3 kernel=3 stride=2 pad=1
concat name=join in=f2,g3,h2
avgpool kernel=global
flatten
linear name=fc out=5
""", "branches")


# a plan of BRANCHES_NET on 4 ranks with input-channel and multi-axis splits inside groups
ON_FOUR = """
        stem split n=2,c=2
        a1 split n=1,c=1,i=2 ranks 0-1
        b1 model 2x1 ranks 2-3
        b2 split n=1,h=2,w=1 ranks 2-3
        c1 split n=1,w=2 ranks 0-1
        c2 domain 2x1 ranks 0-1
        c3 batch 1x2 ranks 0-1
        e1 model 2x2
        f1 split n=1,i=2 ranks 0-1
        g1 batch 1x1 ranks 2-2
        g2 batch 1x1 ranks 2-2
        h1 batch 1x1 ranks 3-3
        f2 model 2x1 ranks 0-1
        g3 batch 1x1 ranks 2-2
        fc split n=2,i=2
"""


def _plans(net, procs, batch):
    """Grouped plans of ``net``: the groups' splits from two offsets of the cycle, the layers
    outside the regions batch-parallel, then model-parallel where the ranks make a grid."""
    plans = [grouped_plan(net, procs, batch, offset) for offset in (0, 1)]
    if procs > 2 and procs % 2 == 0:
        plans.append(grouped_plan(net, procs, batch, 2, LayerPlan("model", (2, procs // 2))))
    return plans


def test_branches_of_every_depth_on_groups(comm, backend):
    procs = comm.Get_size()
    if procs == 1:
        pytest.skip("groups need two ranks at least")
    reference = None
    for plan in _plans(BRANCHES_NET, procs, BATCH):
        assert any(entry.ranks for entry in plan)
        reference = check_plan(comm, backend, BRANCHES_NET, plan, reference)


def test_groups_take_input_splits_and_several_axes(comm, backend):
    """A group of 2 ranks splits a convolution's input channels and another's height and
    width; the head splits its input features on every rank."""
    if comm.Get_size() != 4:
        pytest.skip("the plan names 4 ranks")
    plan = parse_plan(ON_FOUR, "t", BRANCHES_NET, 4)
    check_plan(comm, backend, BRANCHES_NET, plan)


# branches that end flattened (the join concatenates features), so a flatten runs on a group
FLAT_NET = parse_net("""
input channels=2 size=5 classes=3
conv name=stem out=4 kernel=3 pad=1
conv name=a1 out=3 kernel=3 pad=1 bias=0
batchnorm name=an
flatten name=af
conv name=b1 in=stem out=2 kernel=1
flatten name=bf
concat name=cat in=af,bf
linear name=fc out=3
""", "flat")


def test_groups_from_any_rank_take_input_splits_and_flatten(comm, backend):
    """Input-channel splits and a flatten on a group that does not start at rank 0."""
    if comm.Get_size() != 4:
        pytest.skip("the plans name 4 ranks")
    plan = parse_plan("""
        stem batch 1x4
        a1 split n=1,c=1,i=2 ranks 2-3
        b1 split n=1,i=2 ranks 0-1
        fc split n=2,i=2
    """, "t", FLAT_NET, 4)
    check_plan(comm, backend, FLAT_NET, plan)
    # the same splits with the groups swapped: input splits on ranks 2-3
    swap = {"0-1": "2-3", "2-3": "0-1", "2-2": "0-0", "3-3": "1-1"}
    mirrored = parse_plan(re.sub(r"ranks (\S+)", lambda m: f"ranks {swap[m.group(1)]}",
                                 ON_FOUR), "t", BRANCHES_NET, 4)
    check_plan(comm, backend, BRANCHES_NET, mirrored)


def test_resnet_shortcut_and_main_path_on_different_groups(comm, backend):
    procs = comm.Get_size()
    if procs not in (2, 3):
        pytest.skip("one small run is enough")  # 12 s at 4 ranks for the same code
    net = load_net("resnet18", 32)
    plan = grouped_plan(net, procs, BATCH)
    assert sum(entry.ranks is not None and "downsample" in spec.name
               for entry, spec in zip(plan, net.layers, strict=True)) == 3
    check_plan(comm, backend, net, plan)


def test_inception_modules_on_groups(comm, backend):
    if comm.Get_size() != 3:
        pytest.skip("one run at the smallest image is enough (10 s)")
    net = load_net("inception_v3", 75)
    check_plan(comm, backend, net, grouped_plan(net, 3, BATCH, offset=1))


def test_bad_groups_are_refused_on_every_rank_naming_the_layer(comm):
    procs = comm.Get_size()
    if procs < 2:
        pytest.skip("groups need two ranks at least")

    first_on_a_group = grouped_plan(BRANCHES_NET, procs, BATCH)
    first_on_a_group[0] = LayerPlan("batch", (1, 1), ranks=(0, 1))
    raises_everywhere(comm, lambda: parse_plan(f"b1 batch 1x2 ranks 0-{procs}", "p.plan",
                                               BRANCHES_NET, procs),
                      "layer b1", f"ranks 0-{procs}", error=PlanError)
    raises_everywhere(comm, lambda: parse_plan("b1 batch 1x2 ranks 1-1", "p.plan",
                                               BRANCHES_NET, procs),
                      "1x2", "ranks 1-1 are 1", error=PlanError)
    raises_everywhere(comm, lambda: plan_layouts(BRANCHES_NET, first_on_a_group, BATCH, procs),
                      "layer stem",
                      "input batch", error=PlanError)
