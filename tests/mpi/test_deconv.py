"""Transposed convolutions (``deconv``: stride, padding, output padding, groups, dilation, 2-D
and 3-D) under every mode and Pr×Pc grid, under splits of several axes at once and under mixed
plans, against one process in float64 (relative error 1e-9 in every output, gradient and
running statistic: ``check_plan`` of ``tests/mpi/test_graph_layers.py``).

Sizes are odd (height 9, width 7, batch 7) so that the 3- and 4-rank runs cut them unevenly.
The decoder's layers read the input rows around their output rows: a stride-2 kernel-3 layer
one halo row, a stride-1 kernel-4 layer three, an output padding an output row no input row
reaches.
"""

import pytest

from hpctrain.layout.layout import Split
from hpctrain.layout.partition import factorisations
from hpctrain.model.net import parse_net
from hpctrain.plan.plans import LayerPlan
from tests.mpi.test_graph_layers import check_plan

DECODER = parse_net("""
input channels=3 height=9 width=7 classes=4
conv name=down out=12 kernel=3 stride=2 pad=1
relu
deconv name=up out=12 kernel=3 stride=2 pad=1 outpad=1 bias=0
batchnorm
relu name=act
deconv name=grouped out=24 kernel=4 stride=1 pad=1 groups=12
deconv name=dilated out=6 kernel=3 stride=2 pad=2+1 dilation=2 outpad=1 bias=0
maxpool kernel=2
conv name=head out=4 kernel=3 pad=1
avgpool kernel=global
flatten
linear out=4
""", "decoder")

VOLUME = parse_net("""
input channels=2 depth=5 height=6 width=4 classes=4
conv name=down out=6 kernel=3 stride=2 pad=1
tanh
deconv name=up out=4 kernel=3x2x3 stride=2x2x1 pad=1x0x1 outpad=1x0x0
avgpool kernel=global
flatten
linear out=4
""", "volume decoder")

WEIGHTED = ("conv", "deconv")


def uniform(net, mode, grid):
    """Every conv and deconv in ``mode`` on ``grid``, where the rows allow it (model else),
    the linear layer model-parallel."""
    plan = []
    for k, layer in enumerate(net.layers):
        if layer.kind in WEIGHTED:
            rows = min(net.in_shapes(k)[0][1], net.out_shapes[k][1])
            plan.append(LayerPlan(mode if rows >= 2 * grid[0] else "model", grid))
        elif layer.kind == "linear":
            plan.append(LayerPlan("model", grid))
        else:
            plan.append(LayerPlan("follow"))
    return plan


@pytest.mark.parametrize("mode", ["model", "domain"])
@pytest.mark.parametrize("net", [DECODER, VOLUME], ids=["image", "volume"])
def test_deconv_under_every_mode_and_grid(comm, backend, grid_shape, mode, net):
    """Pr = 1 is batch mode; Pr > 1 cuts the weight's columns (model; the grouped layer whole
    groups) or the output rows with the input rows that reach them (domain)."""
    check_plan(comm, backend, net, uniform(net, mode, grid_shape))


def test_deconv_under_mixed_plans(comm, backend):
    """Neighbouring layers alternate between model and domain on every grid."""
    reference = None
    for grid in factorisations(comm.Get_size()):
        plan = []
        for k, layer in enumerate(DECODER.layers):
            entry = uniform(DECODER, ("model", "domain")[k % 2], grid)[k]
            plan.append(entry if layer.kind in WEIGHTED else
                        uniform(DECODER, "model", grid)[k])
        reference = check_plan(comm, backend, DECODER, plan, reference=reference)


def test_deconv_under_splits_of_several_axes(comm, backend):
    """Height and width cut at once (halos on both axes, corners through the first), and
    the samples with the channels."""
    p = comm.Get_size()
    splits = {1: [(1, 1, 1, 1)], 2: [(1, 1, 1, 2), (1, 2, 1, 1)],
              3: [(1, 1, 1, 3), (1, 3, 1, 1)], 4: [(1, 1, 2, 2), (2, 2, 1, 1), (1, 2, 1, 2)]}[p]
    reference = None
    for degrees in splits:
        plan = [LayerPlan("split", split=Split(degrees)) if layer.kind in WEIGHTED
                else LayerPlan("model", (p, 1)) if layer.kind == "linear"
                else LayerPlan("follow") for layer in DECODER.layers]
        reference = check_plan(comm, backend, DECODER, plan, reference=reference)
