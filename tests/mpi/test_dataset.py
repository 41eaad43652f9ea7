"""Training from a dataset file under several plans equals one process; each rank reads only
its own block of the file (its samples, and its rows under a domain-parallel first layer)."""

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.comm.grid import GridSet
from hpctrain.commands.verify import serial_plan
from hpctrain.data.dataset_reader import H5Data
from hpctrain.data.dataset_writer import write_dataset
from hpctrain.layout.layout import HEIGHT_AXIS
from hpctrain.layout.partition import factorisations
from hpctrain.plan.plans import LayerPlan
from hpctrain.run.network import Network
from tests.mpi.helpers import all_agree, check_close
from tests.mpi.test_training import (
    BATCH,
    NET,  # the mixed-plan test net
)
from tests.mpi.test_training import train as train_network

# 31 samples in batches of 9: 3 steps per epoch (4 samples dropped), so 5 steps cross into a
# second, reshuffled epoch
SAMPLES, STEPS, SEED = 31, 5, 5  # BATCH is 9; SEED is the seed train_network builds with


@pytest.fixture(scope="module")
def dataset():
    """A random 2x12x12, 5-class dataset written by rank 0 into a directory every rank sees."""
    comm = MPI.COMM_WORLD
    folder = None
    if comm.Get_rank() == 0:
        folder = tempfile.mkdtemp(prefix="hpctrain-dataset-")
        rng = np.random.default_rng(11)
        labels = rng.integers(0, NET.classes, SAMPLES)
        # learnable: a per-class offset plus noise
        images = rng.standard_normal((SAMPLES, *NET.input_shape)) * 0.5 + labels[:, None, None,
                                                                                None] * 0.2
        write_dataset(Path(folder) / "d.h5", images, labels, NET.classes,
                      description="MPI test data")
    folder = comm.bcast(folder, root=0)
    yield Path(folder) / "d.h5"
    comm.Barrier()  # every rank has closed the file
    if comm.Get_rank() == 0:
        shutil.rmtree(folder)


def make_backend():
    from hpctrain.device.backend import make_backend

    return make_backend(os.environ.get("HPCTRAIN_DEVICE", "cpu"), "float64")


def train(plan, comm, path):
    """Losses of STEPS steps from the file, and every parameter gathered on rank 0."""
    readers = []

    def from_file(backend):
        readers.append(H5Data(backend, path, BATCH, SEED))
        return readers[-1]

    try:
        return train_network(NET, plan, comm, data=from_file, steps=STEPS)
    finally:
        for reader in readers:
            reader.close()


def uniform_plan(first_conv, rest):
    """The first conv on ``first_conv`` (mode, grid), every other weighted layer on ``rest``."""
    plan = []
    for layer in NET.layers:
        if layer.kind not in ("conv", "linear"):
            plan.append(LayerPlan("follow"))
        elif layer.name == "conv1":
            plan.append(LayerPlan(*first_conv))
        else:
            plan.append(LayerPlan(*rest))
    return plan


def mixed_plan(p, offset):
    """Modes and grids cycling over the weighted layers, starting at ``offset``."""
    shapes, plan, k = factorisations(p), [], offset
    for layer in NET.layers:
        if layer.kind in ("conv", "linear"):
            mode = "domain" if layer.kind == "conv" and k % 2 else "model"
            plan.append(LayerPlan(mode, shapes[k % len(shapes)]))
            k += 1
        else:
            plan.append(LayerPlan("follow"))
    return plan


def plans(p):
    """Pure batch; a domain-parallel first conv on every grid; mixed plans. No duplicates."""
    found = [uniform_plan(("batch", (1, p)), ("batch", (1, p)))]
    for grid in factorisations(p):
        found.append(uniform_plan(("domain", grid), ("model", grid[::-1])))
    found += [mixed_plan(p, offset) for offset in range(len(factorisations(p)))]
    unique = []
    for plan in found:
        if plan not in unique:
            unique.append(plan)
    return unique


def test_training_from_a_file_matches_one_process(comm, dataset):
    reference = None
    if comm.Get_rank() == 0:
        reference = train(serial_plan(plans(1)[0]), MPI.COMM_SELF, dataset)
    for plan in plans(comm.Get_size()):
        losses, params = train(plan, comm, dataset)
        what = ", ".join(f"{layer.name} {p.describe()}"
                         for layer, p in zip(NET.layers, plan, strict=True) if p.mode != "follow")
        check_close(comm, np.array(losses), reference and np.array(reference[0]),
                    f"losses under {what}", tol=1e-9)
        for k, got in enumerate(params):
            check_close(comm, got, reference and reference[1][k], f"parameter {k} under {what}",
                        tol=1e-9)
    if comm.Get_rank() == 0:
        assert np.isfinite(reference[0]).all()


def test_each_rank_reads_only_its_block(comm, dataset, grid_shape, reads):
    """Under a domain-parallel first conv a rank reads its batch shard's rows only."""
    backend = make_backend()
    rank = comm.Get_rank()
    with GridSet(comm) as grids, H5Data(backend, dataset, BATCH, SEED) as data:
        plan = uniform_plan(("domain", grid_shape), ("batch", (1, comm.Get_size())))
        network = Network(NET, plan, BATCH, grids, backend, seed=SEED)
        box = network.input_layout.box(rank)
        for step in (0, 4):
            reads.clear()
            network.train_step(data, step)
            image_reads = [shape for name, shape in reads if name == "/train/images"]
            ok = image_reads == [network.input_layout.local_shape(rank)]
            if grid_shape[0] > 1:  # rows are split: fewer than the image's
                ok = ok and network.input_layout.split_axis == HEIGHT_AXIS
                ok = ok and box[HEIGHT_AXIS][1] - box[HEIGHT_AXIS][0] < NET.input_shape[1]
            ok = ok and box[0][1] - box[0][0] <= -(-BATCH // grid_shape[1])
            assert all_agree(comm, ok), f"rank {rank} read {image_reads}, its block is {box}"
