"""Machines with levels: where groups lie on nodes, how the levels price each collective, and
what the planner does with them (no MPI)."""

import itertools
import math
from dataclasses import replace

import pytest

from hpctrain.cost import collectives as cost
from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import (
    Fit,
    Machine,
    MachineError,
    Network,
    format_machine,
    load_machine,
    parse_machine,
)
from hpctrain.cost.nodes import Group, Span, halo_crossings, span
from hpctrain.layout.layout import Layout
from hpctrain.layout.moves import GeneralMove, move_between, transfer_pieces
from hpctrain.layout.partition import factorisations
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.planner import evaluate, plan_network
from hpctrain.plan.pricing import CostModel


def levelled(per_node=2, nics=1.0, node=(1e-6, 1 / 50e9), network=(1e-5, 1 / 2e9), **kw):
    return Machine("levels", *node, 1e11, ranks_per_node=per_node,
                   network=Network(*network, nics), **kw)


# -- where groups lie -----------------------------------------------------------------------

def span_by_enumeration(group: Group, per_node: int) -> Span:
    """The definition of Span, rank by rank over every group."""
    k, nodes, crossing = 1, 1, {}
    for ranks in group.members():
        on = [r // per_node for r in ranks]
        counts = {n: on.count(n) for n in on}
        k, nodes = max(k, *counts.values()), max(nodes, len(counts))
        if len(counts) > 1:
            for n, c in counts.items():
                crossing[n] = crossing.get(n, 0) + c
    return Span(k, nodes, max(crossing.values(), default=0))


@pytest.mark.parametrize("procs", [2, 4, 6, 8, 12, 16, 24, 32, 64])
@pytest.mark.parametrize("per_node", [1, 2, 3, 4, 8])
def test_the_span_of_every_group_is_its_definition(procs, per_node):
    for pr, pc in factorisations(procs):
        layout = Layout((pc, 1), (pr, pc))
        for group in (layout.model_group, layout.batch_group, layout.world):
            if group.size > 1:
                assert span(group, per_node) == span_by_enumeration(group, per_node), group


def test_model_groups_stay_inside_a_node_and_batch_groups_cross():
    """8 ranks per node, 64 ranks: the mapping the docs state."""
    layout = Layout((64, 1), (4, 16))
    assert span(layout.model_group, 8) == Span(4, 1, 0)  # ranks 4j … 4j+3: one node
    assert span(layout.batch_group, 8) == Span(2, 8, 8)  # i, i+4, …: 2 per node on 8 nodes
    wide = Layout((64, 1), (16, 4))
    assert span(wide.model_group, 8) == Span(8, 2, 8)  # 16 consecutive ranks: two nodes
    assert span(wide.batch_group, 8) == Span(1, 4, 8)  # every 16th rank: one per node


def test_halos_cross_nodes_only_where_a_chain_does():
    assert halo_crossings(4, 16, 8) == 0  # chains of 4 inside nodes of 8
    assert halo_crossings(16, 64, 8) == 1  # ranks 7 and 8 of each chain of 16
    assert halo_crossings(24, 48, 8) == 2  # the middle node of a chain of 24: both ends
    assert halo_crossings(2, 2, 1) == 1


def test_the_halo_crossings_are_those_of_every_chain_walked_through():
    """Counted from one period of the chains and the nodes, against every pair of neighbours
    of every chain counted one by one: chains of any stride, nodes of any size, in tilings of
    one or more periods and of part of one."""
    def walked(parts, procs, per_node, stride):
        crossing = {}
        for ranks in Group(parts, stride, procs).members():
            for a, b in zip(ranks, ranks[1:]):
                if a // per_node != b // per_node:
                    for node in (a // per_node, b // per_node):
                        crossing[node] = crossing.get(node, 0) + 1
        return max(crossing.values(), default=0)

    for parts in (2, 3, 4, 6, 16, 24):
        for stride in (1, 2, 3, 8):
            for per_node in (1, 3, 4, 6, 8, 16):
                for tilings in (1, 2, 3):
                    procs = parts * stride * tilings
                    assert halo_crossings(parts, procs, per_node, stride) == walked(
                        parts, procs, per_node, stride), (parts, procs, per_node, stride)


@pytest.mark.parametrize("procs", [4, 6, 8, 12])
def test_a_general_moves_peers_lie_in_the_aligned_block_of_the_larger_model_group(procs):
    """What exchange_time assumes of a general move's messages, checked piece by piece."""
    shapes = [(12, 6, 8, 8), (12, 12)]
    for shape, (a, b) in itertools.product(shapes, itertools.product(
            factorisations(procs), repeat=2)):
        for src_split, dst_split in itertools.product([None, 1], repeat=2):
            src, dst = Layout(shape, a, src_split), Layout(shape, b, dst_split)
            if not isinstance(move_between(src, dst), GeneralMove):
                continue
            g = max(a[0], b[0])
            for piece in transfer_pieces(src, dst):
                if procs % g == 0 and all(n % g == 0 or g % n == 0 for n in (a[0], b[0])):
                    assert piece.sender // g == piece.receiver // g, (src, dst, piece)


# -- pricing ----------------------------------------------------------------------------------

COLLECTIVE_TIMES = {"allgather": cost.allgather_time, "reduce_scatter": cost.reduce_scatter_time,
                    "allreduce": cost.allreduce_time}


@pytest.mark.parametrize("collective", COLLECTIVE_TIMES)
@pytest.mark.parametrize("per_node,procs", [(2, 4), (4, 16), (8, 64), (8, 4096)])
def test_equal_levels_without_sharing_price_as_the_flat_machine(collective, per_node, procs):
    """The hierarchical algorithm moves the same bytes in the same number of steps as the flat
    one (powers of two): with the network's link equal to the node's and a NIC per rank, the
    levels change nothing."""
    link = (2e-6, 1e-10)
    flat = Machine("flat", *link, 1e11)
    both = levelled(per_node, per_node, link, link)
    time = COLLECTIVE_TIMES[collective]
    for pr, pc in factorisations(procs):
        layout = Layout((pc, 1), (pr, pc))
        for group in (layout.model_group, layout.batch_group, layout.world):
            assert time(both, group, 1e6) == pytest.approx(time(flat, group.size, 1e6),
                                                           rel=1e-12)


def test_an_allreduce_across_nodes_is_the_hierarchical_algorithm():
    """4 ranks on 2 nodes of 2, the world group: reduce-scatter inside (2 ranks), all-reduce of
    half the bytes between the 2 nodes with both ranks of a node on its one NIC, all-gather
    inside; by hand."""
    (a, b), (an, bn) = (1e-6, 1e-11), (1e-5, 1e-9)
    machine = levelled(2, 1, (a, b), (an, bn))
    n = 8e6
    inside = a * 1 + b * n / 2  # reduce-scatter or all-gather on 2 ranks
    across = 2 * an * 1 + bn * 2 * (1 / 2) * (n / 2) * 2  # NIC shared by 2 ranks
    assert cost.allreduce_time(machine, Group(4, 1, 4), n) == pytest.approx(
        2 * inside + across, rel=1e-12)
    # a batch group of the 2×2 grid (ranks 0 and 2): one rank per node, both ranks of each
    # node across at once
    assert cost.allreduce_time(machine, Group(2, 2, 4), n) == pytest.approx(
        2 * an + bn * n * 2, rel=1e-12)
    # a model group (ranks 0 and 1) never leaves its node
    assert cost.allreduce_time(machine, Group(2, 1, 4), n) == pytest.approx(
        2 * a + b * n, rel=1e-12)
    assert cost.halo_time(machine, n, crossing=1) == pytest.approx(an + bn * n, rel=1e-12)
    assert cost.halo_time(machine, n) == pytest.approx(a + b * n, rel=1e-12)


def test_more_nics_share_less():
    slow, fast = levelled(8, 1), levelled(8, 8)
    batch = Layout((64, 1), (2, 32)).batch_group  # 4 ranks per node on 8 nodes
    assert cost.allreduce_time(slow, batch, 1e8) > 2 * cost.allreduce_time(fast, batch, 1e8)


def test_a_shape_calibrate_measured_is_priced_by_its_own_fit():
    """The world on 2 nodes of 2: measured whole, it is one collective on 4 ranks with the
    shape's α and β (so is any group of 2 ranks on each of 2 nodes); any other shape is still
    composed from the levels."""
    measured = Fit(7e-6, 3e-10)
    plain = levelled(2, 1)
    shaped = Machine("shaped", plain.alpha, plain.beta, plain.flops, ranks_per_node=2,
                     network=Network(plain.network.alpha, plain.network.beta, 1,
                                     shapes={"allreduce": {(2, 2): measured}}))
    n = 1e6
    assert cost.allreduce_time(shaped, Group(4, 1, 4), n) == pytest.approx(
        2 * 2 * 7e-6 + 2 * (3 / 4) * n * 3e-10, rel=1e-12)
    assert cost.allgather_time(shaped, Group(4, 1, 4), n) == cost.allgather_time(
        plain, Group(4, 1, 4), n)  # no all-gather measured: composed
    assert cost.allreduce_time(shaped, Group(8, 1, 8), n) == cost.allreduce_time(
        plain, Group(8, 1, 8), n)  # another shape: 2 ranks on each of 4 nodes


def test_network_fits_are_looked_up_by_nodes():
    fit = Fit(3e-6, 4e-10)
    machine = levelled(1, 1, network=(1e-5, 1e-9))
    fitted = levelled(1, 1, network=(1e-5, 1e-9))
    fitted = Machine(fitted.name, fitted.alpha, fitted.beta, fitted.flops, ranks_per_node=1,
                     network=Network(1e-5, 1e-9, 1, {"allreduce": {2: fit}}))
    assert cost.allreduce_time(fitted, Group(2, 1, 2), 1e6) == pytest.approx(
        2 * 3e-6 + 4e-10 * 1e6, rel=1e-12)
    assert cost.allreduce_time(machine, Group(2, 1, 2), 1e6) == pytest.approx(
        2 * 1e-5 + 1e-9 * 1e6, rel=1e-12)


# -- profiles -----------------------------------------------------------------------------------

def test_a_levelled_profile_reads_back_what_was_written(tmp_path):
    machine = Machine("two", 1e-6, 2e-11, 5e12, "gpu", {"allgather": {4: Fit(2e-6, 3e-11)}},
                      ranks_per_node=4, network=Network(6e-6, 4e-11, 2.5, {
                          "allreduce": {2: Fit(7e-6, 5e-11, 1e6, 9e-11)}},
                          {"allreduce": {(4, 2): Fit(8e-6, 6e-11)},
                           "allgather": {(2, 8): Fit(1e-5, 7e-11)}}))
    back = parse_machine(format_machine(machine, "a comment"), "two.toml")
    assert back.ranks_per_node == 4 and back.network == machine.network
    assert back.fits == machine.fits and back.levelled
    assert "between nodes" in back.describe()


@pytest.mark.parametrize("text,message", [
    ("[network]\nalpha = 1e-6\nbeta = 1e-9\n", "needs ranks_per_node"),
    ("ranks_per_node = 2\n[network]\nalpha = 1e-6\nbeta = 1e-9\nspeed = 3\n", "unknown key"),
    ("ranks_per_node = 2\n[network]\nalpha = 1e-6\nbeta = 1e-9\nnics = 0\n", "'nics'"),
    ("ranks_per_node = 2\n[network]\nalpha = 1e-6\n", "'beta' is missing"),
    ("ranks_per_node = -1\n", "ranks_per_node"),
    ("ranks_per_node = 2\nnetwork = 3\n", "network must be a table"),
    ("ranks_per_node = 2\n[network]\nalpha = 1e-6\nbeta = 1e-9\n[network.fits.scan]\n",
     "unknown collective"),
    ('ranks_per_node = 2\n[network]\nalpha = 1e-6\nbeta = 1e-9\n[network.shapes.allreduce]\n'
     '"2x1" = { alpha = 1e-6, beta = 1e-9 }\n', "a shape is KxM"),
    ('ranks_per_node = 2\n[network]\nalpha = 1e-6\nbeta = 1e-9\n[network.shapes.halo]\n'
     '"2x2" = { alpha = 1e-6, beta = 1e-9 }\n', "unknown collective"),
])
def test_a_bad_levelled_profile_is_refused_in_one_line(text, message):
    head = 'name = "m"\nalpha = 1e-6\nbeta = 1e-10\nflops = 1e11\n'
    with pytest.raises(MachineError, match=message) as err:
        parse_machine(head + text, "m.toml")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("table,first,second", [
    ("network.shapes.allreduce", '"8x2"', '"08x2"'),
    ("network.shapes.allgather", '"2x2"', '"2x002"'),
    ("network.fits.allreduce", "4", '"04"'),
    ("fits.halo", "2", "002"),
])
def test_two_keys_naming_one_group_are_refused_naming_the_file_and_both(table, first, second):
    """TOML sees two keys; read as one group, the later fit would silently replace the
    earlier."""
    text = ('name = "m"\nalpha = 1e-6\nbeta = 1e-10\nflops = 1e11\nranks_per_node = 2\n'
            '[network]\nalpha = 1e-6\nbeta = 1e-9\n'
            f"[{table}]\n{first} = {{ alpha = 1e-6, beta = 1e-9 }}\n"
            f"{second} = {{ alpha = 2e-6, beta = 2e-9 }}\n")
    with pytest.raises(MachineError) as err:
        parse_machine(text, "two-nodes.toml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("two-nodes.toml")
    assert f"'{first.strip(chr(34))}'" in message and f"'{second.strip(chr(34))}'" in message


def test_the_flattened_machine_is_the_network_everywhere():
    machine = levelled(8, 4)
    flat = machine.flattened()
    assert not flat.levelled and (flat.alpha, flat.beta) == (1e-5, 1 / 2e9)
    assert load_machine("cori-knl").flattened() == load_machine("cori-knl")


# -- planning ---------------------------------------------------------------------------------

def model_of(net, batch, procs, machine):
    return CostModel(net, batch, procs, machine, FlopModel(machine.flops))


WIDE_IMAGES = """input channels=3 size=64 classes=10
conv out=16 kernel=3 pad=1
relu
conv out=16 kernel=3 pad=1
relu
maxpool kernel=2
conv out=16 kernel=3 pad=1
relu
flatten
linear out=10
"""


def test_the_planner_keeps_model_groups_inside_a_node_when_that_is_faster():
    """Convolutions on 64×64 images, batch 2 on 8 ranks (so every grid has Pr ≥ 4), 2 ranks per
    node, a network 20× slower than the node's link. Priced as if every link were the node's,
    the plan splits the convolutions' channels over model groups of 4, which cross nodes: every
    output is all-gathered over the network. On the levelled machine no convolution keeps a
    model group wider than a node (it splits the image instead: only halo rows cross), and
    that plan is faster there than the one the flat model chose."""
    net, batch, procs = parse_net(WIDE_IMAGES, "wide-images"), 2, 8
    node = (2e-6, 1 / 20e9)
    # every layer's gradients summed alone (no buckets): each pays its all-reduce's latency
    machine = replace(levelled(2, 2, node, (10e-6, 1 / 1e9)), bucket_bytes=0)
    flat_model = model_of(net, batch, procs, Machine("node everywhere", *node, 1e11,
                                                     bucket_bytes=0))
    flat = [plan for plan in plan_network(flat_model).plans if plan.mode != "follow"]
    model = model_of(net, batch, procs, machine)
    convs = [k for k, head in enumerate(model.heads) if net.layers[head].kind == "conv"]
    assert all(flat[k].mode == "model" and flat[k].grid[0] > 2 for k in convs)
    planned = [plan for plan in plan_network(model).plans if plan.mode != "follow"]
    assert not any(planned[k].mode == "model" and planned[k].grid[0] > 2 for k in convs)
    assert evaluate(model, planned).iteration_time < 0.95 * evaluate(model, flat).iteration_time


def test_the_shipped_cluster_profiles_have_levels():
    for name in ("dgx-h100", "perlmutter-gpu"):
        machine = load_machine(name)
        assert machine.levelled and machine.device == "gpu"
        assert machine.network.beta > 5 * machine.beta  # the network is far slower
    assert not load_machine("cori-knl").levelled


def test_pricing_a_plan_at_4096_ranks_stays_finite_on_every_level():
    model = model_of(load_net("resnet50"), 2048, 4096, levelled(8, 8))
    planned = plan_network(model)
    assert math.isfinite(planned.iteration_time) and planned.iteration_time > 0
