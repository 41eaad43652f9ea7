"""A small network trained several steps under mixed per-layer plans equals one process."""

import os

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.comm.gather import gather_to_root
from hpctrain.comm.grid import GridSet
from hpctrain.commands.verify import relative_error, serial_plan
from hpctrain.data.synthetic import SyntheticData
from hpctrain.layout.partition import factorisations
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.plans import LayerPlan, plan_from_spec
from hpctrain.run.network import Network
from hpctrain.run.optimizer import SGD
from tests.mpi.helpers import check_close

NET = parse_net("""
input channels=2 size=12 classes=5
conv out=6 kernel=3 pad=1
relu
maxpool kernel=2
conv out=7 kernel=3 stride=1 pad=1
relu
maxpool kernel=3 stride=2 pad=1
flatten
dropout p=0.2
linear out=11
relu
linear out=5
""", "mixed")
BATCH, STEPS = 9, 4


def train(net, plan, comm, data=None, steps=STEPS):
    """Losses of ``steps`` steps and every parameter gathered on rank 0, in float64.

    ``data(backend)`` makes the batches (default: synthetic data of seed 5).
    """
    from hpctrain.device.backend import make_backend

    backend = make_backend(os.environ.get("HPCTRAIN_DEVICE", "cpu"), "float64")
    with GridSet(comm) as grids:
        network = Network(net, plan, BATCH, grids, backend, seed=5)
        data = (data or (lambda be: SyntheticData(be, net.input_shape, net.classes, BATCH,
                                                  seed=5)))(backend)
        optimizer = SGD(network.params, lr=0.05, momentum=0.9, weight_decay=1e-3)
        losses = []
        for step in range(steps):
            losses.append(network.train_step(data, step)[0])
            optimizer.step()
        params = [gather_to_root(backend, comm, p.value, p.shape, p.box, "copy")
                  for p in network.params]
    return losses, params


def mixed_plans(p):
    """Per-layer plans that mix modes and grids: one grid per weighted layer, cycling."""
    shapes = factorisations(p)
    plans = []
    for offset in range(len(shapes)):
        plan, k = [], offset
        for layer in NET.layers:
            if layer.kind == "conv":
                mode = "domain" if k % 2 else "model"
                plan.append(LayerPlan(mode, shapes[k % len(shapes)]))
                k += 1
            elif layer.kind == "linear":
                plan.append(LayerPlan("model", shapes[k % len(shapes)]))
                k += 1
            else:
                plan.append(LayerPlan("follow"))
        plans.append(plan)
    return plans


def test_mixed_plans_train_like_one_process(comm):
    reference = None
    if comm.Get_rank() == 0:
        reference = train(NET, serial_plan(mixed_plans(1)[0]), MPI.COMM_SELF)
    for plan in mixed_plans(comm.Get_size()):
        losses, params = train(NET, plan, comm)
        what = ", ".join(p.describe() for p in plan if p.mode != "follow")
        check_close(comm, np.array(losses), reference and np.array(reference[0]),
                    f"losses under {what}", tol=1e-9)
        for k, got in enumerate(params):
            check_close(comm, got, reference and reference[1][k], f"parameter {k} under {what}",
                        tol=1e-9)
    if comm.Get_rank() == 0:
        assert reference[0][-1] < reference[0][0]  # it learns


@pytest.mark.parametrize("spec", ["conv=domain:{p}x1,fc=1x{p}", "conv=1x{p},fc={p}x1"])
def test_smallcnn_grid_specs_match_serial(comm, spec):
    p = comm.Get_size()
    net = load_net("smallcnn").with_image_size(12)
    plan = plan_from_spec(spec.format(p=p), net, p)
    losses, params = train(net, plan, comm)
    reference = train(net, serial_plan(plan), MPI.COMM_SELF) if comm.Get_rank() == 0 else None
    err = relative_error(np.array(losses), np.array(reference[0])) if reference else 0.0
    check_close(comm, np.array([err]), np.array([0.0]) if reference else None, "losses", 1e-9)
