"""A segmentation net (convolutions that keep the size, a 1x1 head of K classes) under batch,
model and domain plans on every Pr×Pc grid trains as one process: three SGD steps with class
weights and ignored pixels give the serial losses and weights (float64, relative error 1e-9),
and the held-out sums (weighted loss, pixel accuracy, each class's intersection and union)
are one process's.

The height is odd (9) and the batch 7, so 2-, 3- and 4-way splits of either are uneven. Under a
domain split the loss keeps the rows cut: each rank scores its own block of pixels.
"""

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.comm.gather import gather_to_root
from hpctrain.comm.grid import GridSet
from hpctrain.commands.verify import relative_error
from hpctrain.data.synthetic import SyntheticData
from hpctrain.layout.layout import HEIGHT_AXIS
from hpctrain.layout.partition import factorisations
from hpctrain.model.net import parse_net
from hpctrain.plan.plans import LayerPlan
from hpctrain.run.network import Network
from hpctrain.run.optimizer import SGD

TOL = 1e-9
BATCH, STEPS = 7, 3
SEGMENT = parse_net("""
input channels=2 height=9 width=7 classes=3
conv out=6 kernel=3 pad=1
relu
conv out=6 kernel=3 pad=1
relu
conv name=head out=3 kernel=1
""", "segment").with_class_weights((1.0, 2.5, 0.5))


class Unlabelled:
    """``source`` with the pixels whose row + column is a multiple of 4 labelled −1 (not
    counted), by their place in the whole image: the same pixels on every grid."""

    def __init__(self, source):
        self.source, self.nonfinite = source, None

    def images(self, step, box):
        return self.source.images(step, box)

    def labels(self, step, box):
        labels = self.source.labels(step, box).copy()
        (h0, h1), (w0, w1) = box[1:]
        rows, columns = np.arange(h0, h1)[:, None], np.arange(w0, w1)[None, :]
        labels[:, (rows + columns) % 4 == 0] = -1
        return labels


def plan_of(mode, grid):
    """Every conv in ``mode`` on ``grid``; the head of 3 classes in domain mode where a model
    split would leave a rank no class."""
    plan = [LayerPlan(mode, grid) if layer.kind == "conv" else LayerPlan("follow")
            for layer in SEGMENT.layers]
    if mode == "model" and grid[0] > SEGMENT.classes:
        plan[-1] = LayerPlan("domain", grid)
    return plan


def plans(procs):
    """Batch, model and domain on every grid of ``procs`` ranks (domain where the 9 rows give
    each of Pr ranks at least one), and a mixed plan."""
    found = [plan_of("batch", (1, procs))]
    for grid in factorisations(procs):
        found.append(plan_of("model", grid))
        found.append(plan_of("domain", grid))
    if procs > 1:
        mixed = plan_of("domain", (procs, 1))
        mixed[2] = LayerPlan("model", (procs, 1))
        found.append(mixed)
    return found


def train(plan, comm, backend):
    """Losses and accuracies of three steps, the held-out sums of one batch after them, and
    every parameter, whole on rank 0; and the layout the loss reads."""
    with GridSet(comm) as grids:
        network = Network(SEGMENT, plan, BATCH, grids, backend, seed=5)
        data = Unlabelled(SyntheticData.for_net(backend, SEGMENT, BATCH, seed=5))
        optimizer = SGD(network.params, lr=0.1, momentum=0.9)
        steps = []
        for step in range(STEPS):
            steps.append(network.train_step(data, step))
            optimizer.step()
        held_out = network.evaluate_pixels(data, STEPS)
        weights = {p.name: gather_to_root(backend, comm, p.value, p.shape, p.box, "copy")
                   for p in network.params}
    return steps, held_out, weights, network.loss_layout


_serial: dict = {}


@pytest.fixture
def reference(backend):
    """The serial run, made once per module."""
    if "run" not in _serial:
        _serial["run"] = train(plan_of("batch", (1, 1)), MPI.COMM_SELF, backend)
    return _serial["run"]


@pytest.mark.parametrize("index", range(8))
def test_segmentation_trains_like_one_process(comm, backend, reference, index):
    procs = comm.Get_size()
    every = plans(procs)
    if index >= len(every):
        pytest.skip(f"{len(every)} plans on {procs} ranks")
    plan = every[index]
    steps, held_out, weights, loss_layout = train(plan, comm, backend)
    want_steps, want_held_out, want_weights, _ = reference
    what = ", ".join(f"{layer.name} {p.describe()}"
                     for layer, p in zip(SEGMENT.layers, plan, strict=True) if p.mode != "follow")
    errors = [(relative_error(np.array(steps), np.array(want_steps)), "losses and accuracies"),
              (relative_error(held_out.vector(), want_held_out.vector()), "held-out sums")]
    if comm.Get_rank() == 0:
        errors += [(relative_error(weights[n], want_weights[n]), n) for n in want_weights]
    worst, name = comm.bcast(max(errors) if comm.Get_rank() == 0 else None, root=0)
    assert worst <= TOL, f"{name} under {what}: error {worst:.2e}"
    assert comm.allreduce(max(errors)[0], op=MPI.MAX) <= TOL
    last = plan[-1]
    if last.mode == "domain" and last.grid[0] > 1:  # the rows stay cut for the loss
        assert loss_layout.parts[HEIGHT_AXIS] == last.grid[0]
    assert held_out.counted > 0 and 0.0 <= held_out.mean_iou <= 1.0
