"""ConvNeXt's layers under every mode and Pr×Pc grid against one process, and a ConvNeXt block
against an independent PyTorch model under a domain plan.

The layer scale (``layerscale``) on an image and on flat features, in a ConvNeXt block (a
depthwise convolution, ``layernorm`` over the channels, two 1×1 convolutions with ``gelu``
between, the layer scale, the input added), under batch (Pr = 1), model (the channels cut:
each rank holds its channels' γ) and domain (the rows cut: γ on every rank, its gradient summed
over them) plans: every output, gradient and the loss equal one process in float64 to 1e-9
(``check_plan`` of ``tests/mpi/test_graph_layers.py``). Sizes are odd (height 9, width 7, batch
7, the layer scales' 7 channels) so that the 2-, 3- and 4-rank runs cut them unevenly; the
depthwise convolution has 12 channels, whole groups for a channel split 1, 2, 3 or 4 ways.

Then the block, with a 7×7 depthwise convolution, trained two SGD steps under a domain plan on
every rank count (13 rows: 4, 3, 3, 3 on 4 ranks, each holding the 3 rows of halo its
neighbours need), against plain PyTorch (no torchvision) written as torchvision's CNBlock is,
``Linear`` layers on the channels-last tensor: logits, loss, every gradient and every parameter
after each update, to 1e-9.
"""

import pytest

from hpctrain.model.net import parse_net
from hpctrain.plan.plans import LayerPlan
from tests.mpi.test_graph_layers import check_plan

NET = parse_net("""
input channels=3 height=9 width=7 classes=4
conv name=stem out=7 kernel=3 pad=1
layerscale name=stem_scale init=0.5
conv name=expand out=12 kernel=3 pad=1
conv name=dw out=12 kernel=3 pad=1 groups=12
layernorm name=norm eps=1e-6
conv name=pw1 out=14 kernel=1
gelu
conv name=pw2 out=7 kernel=1
layerscale name=layer_scale init=0.75
add in=layer_scale,stem_scale
avgpool kernel=global
flatten
layerscale name=flat_scale init=2
linear out=4
""", "convnext-layers")


def layer_plan(net, mode, grid):
    """Every conv in ``mode`` on ``grid`` (model where its output has fewer rows than a
    height split needs), the linear layer model-parallel, the rest following their input."""
    plan = []
    for layer, shape in zip(net.layers, net.out_shapes, strict=True):
        if layer.kind == "conv":
            plan.append(LayerPlan(mode if mode == "model" or shape[1] >= 2 * grid[0]
                                  else "model", grid))
        elif layer.kind == "linear":
            plan.append(LayerPlan("model", grid))
        else:
            plan.append(LayerPlan("follow"))
    return plan


@pytest.mark.parametrize("mode", ["model", "domain"])
def test_the_layer_scale_under_every_mode_and_grid(comm, backend, grid_shape, mode):
    """Pr = 1 is batch mode; Pr > 1 cuts the channels (the layer scales' 7 over 4 ranks: 2, 2,
    2, 1) or the rows (9 over 4: 3, 2, 2, 2), and the flat layer scale reads features cut as
    the channels were."""
    check_plan(comm, backend, NET, layer_plan(NET, mode, grid_shape))


# -- a ConvNeXt block against PyTorch ------------------------------------------------------------

@pytest.mark.reference
def test_a_convnext_block_under_a_domain_plan_matches_pytorch(comm):
    """Every conv split by rows over all the ranks (the 7×7 depthwise one with halos of 3
    rows), the classifier by its outputs; two SGD steps with momentum and weight decay."""
    pytest.importorskip("torch")
    from tests.convnext_reference import BLOCK_NET, ConvNeXtBlock, block_names
    from tests.mpi.test_torch_reference import on_root
    from tests.torch_reference import (
        BATCH,
        STEPS,
        TOLERANCE,
        compare,
        failures,
        hpctrain_steps,
        torch_steps,
    )

    procs = comm.Get_size()
    net = parse_net(BLOCK_NET, "convnext-block")
    plan = [LayerPlan("domain", (procs, 1)) if layer.kind == "conv"
            else LayerPlan("model", (procs, 1)) if layer.kind == "linear"
            else LayerPlan("follow") for layer in net.layers]
    run = hpctrain_steps(net, plan, comm, BATCH, STEPS)

    def check() -> str:
        return failures(compare(run.steps, torch_steps(ConvNeXtBlock(), block_names(), run)),
                        TOLERANCE)

    problem = on_root(comm, check)
    assert not problem, problem
