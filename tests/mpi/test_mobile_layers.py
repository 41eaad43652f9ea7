"""The layers of mobile and grouped nets (grouped, depthwise and dilated convolutions, the
squeeze-excitation gate's ``mul``, sigmoid, silu, hardsigmoid, hardswish, relu6 and clip),
ConvNeXt's ``layernorm`` over the channels and ``gelu``, and resizing (``upsample``, bilinear ×2
and nearest to a size of its own) under every mode and Pr×Pc grid, and under mixed plans,
against one process in float64 (relative error 1e-9 in every output, gradient and running
statistic: ``check_plan`` of ``tests/mpi/test_graph_layers.py``).

Sizes are odd (height 9, width 7, batch 7) so that the 3- and 4-rank runs cut them unevenly;
the grouped layers have 12 groups, whole groups for a channel split 1, 2, 3 or 4 ways; the
dilated layers need halos of 2 rows, which every rank of a 4-way height split holds. A model
split of a depthwise layer fed by a model-split layer runs with no move at all.
"""

import pytest

from hpctrain.layout.partition import factorisations
from hpctrain.model.net import parse_net
from hpctrain.plan.plans import LayerPlan
from hpctrain.run.network import Network
from tests.mpi.test_graph_layers import BATCH, SEED, check_plan

MOBILE = parse_net("""
input channels=3 height=9 width=7 classes=4
conv name=stem out=12 kernel=3 pad=1 bias=0
batchnorm
relu6
conv name=dw out=12 kernel=3 pad=2 dilation=2 groups=12 bias=0
batchnorm
hardswish name=act
avgpool name=squeeze kernel=global
conv name=fc1 out=6 kernel=1
silu
conv name=fc2 out=12 kernel=1
hardsigmoid name=gate
mul in=act,gate
conv name=expand out=24 kernel=3 pad=1 groups=12
sigmoid
layernorm eps=1e-6
gelu
conv name=grouped out=24 kernel=3 pad=2x1 dilation=2x1 groups=12
clip min=-0.5 max=0.75
mul in=grouped,clip1
upsample name=up scale=2 mode=bilinear
conv name=down out=24 kernel=3 stride=2 pad=1 groups=12
upsample name=resize size=11x6
avgpool kernel=global
flatten
linear out=4
""", "mobile")


def mobile_plan(mode, grid, shift=0):
    """Every conv in ``mode`` on ``grid`` (model where the input has fewer rows than a height
    split needs: the gate's 1×1 convolutions), the linear layer model-parallel; with ``shift``
    the modes alternate from layer to layer."""
    plan = []
    for k, layer in enumerate(MOBILE.layers):
        if layer.kind == "conv":
            rows = MOBILE.in_shapes(k)[0][1]
            asked = ("model", "domain")[(("model", "domain").index(mode) + shift * k) % 2]
            plan.append(LayerPlan(asked if rows >= 2 * grid[0] else "model", grid))
        elif layer.kind == "linear":
            plan.append(LayerPlan("model", grid))
        else:
            plan.append(LayerPlan("follow"))
    return plan


@pytest.mark.parametrize("mode", ["model", "domain"])
def test_mobile_layers_under_every_mode_and_grid(comm, backend, grid_shape, mode):
    """Pr = 1 is batch mode; Pr > 1 cuts whole groups (model) or the rows with their dilated
    halos (domain), and the gate is moved onto the height split."""
    check_plan(comm, backend, MOBILE, mobile_plan(mode, grid_shape))


def test_mobile_layers_under_mixed_plans(comm, backend):
    """Neighbouring layers alternate between model and domain on every grid: the gate arrives
    channel-split on a height-split input, the grouped layers read inputs of other layouts."""
    reference = None
    for grid in factorisations(comm.Get_size()):
        reference = check_plan(comm, backend, MOBILE, mobile_plan("model", grid, shift=1),
                               reference=reference)


def test_a_depthwise_layer_after_a_model_split_moves_nothing(comm, backend, grids):
    """stem model Pr×1 leaves its output cut by channels, which is how the depthwise layer
    under the same split reads its input: the network plans no move between them."""
    p = comm.Get_size()
    plan = mobile_plan("model", (p, 1))
    network = Network(MOBILE, plan, BATCH, grids, backend, SEED)
    names = [layer.name for layer in MOBILE.layers]
    dw = network.layers[names.index("dw")]
    fed = network.layers[names.index("relu61")]
    assert dw.in_layout == fed.out_layout
    assert dw.in_layout.parts[1] == p
