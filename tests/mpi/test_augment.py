"""Training on flipped and cropped dataset images under several plans equals one process, and
each rank reads only the rows its block's windows need."""

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.comm.grid import GridSet
from hpctrain.commands.verify import serial_plan
from hpctrain.data.augment import augment
from hpctrain.data.dataset_reader import H5Data
from hpctrain.data.dataset_writer import write_dataset
from hpctrain.layout.layout import HEIGHT_AXIS
from hpctrain.model.net import load_net
from hpctrain.plan.plans import LayerPlan
from hpctrain.run.network import Network
from tests.mpi.helpers import all_agree, check_close
from tests.mpi.test_training import BATCH  # 9, the batch train_network builds with
from tests.mpi.test_training import train as train_network

NET = load_net("smallcnn").with_image_size(12)  # 1x12x12 images, 10 classes
# 20 samples in batches of 9: 2 steps per epoch, so step 2 draws a second epoch's crops
SAMPLES, STEPS, SEED, PAD = 20, 3, 5, 3


@pytest.fixture(scope="module")
def dataset():
    """A random 1x12x12, 10-class dataset written by rank 0 into a directory every rank sees."""
    comm = MPI.COMM_WORLD
    folder = None
    if comm.Get_rank() == 0:
        folder = tempfile.mkdtemp(prefix="hpctrain-augment-")
        rng = np.random.default_rng(12)
        labels = rng.integers(0, NET.classes, SAMPLES)
        images = rng.standard_normal((SAMPLES, *NET.input_shape)) + labels[:, None, None,
                                                                           None] * 0.2
        write_dataset(Path(folder) / "d.h5", images, labels, NET.classes,
                      description="MPI augmentation test data")
    folder = comm.bcast(folder, root=0)
    comm.Barrier()
    yield Path(folder) / "d.h5"
    comm.Barrier()  # every rank has closed the file
    if comm.Get_rank() == 0:
        shutil.rmtree(folder)


def make_backend():
    import os

    from hpctrain.device.backend import make_backend

    return make_backend(os.environ.get("HPCTRAIN_DEVICE", "cpu"), "float64")


def train(plan, comm, path, mode="standard"):
    """Losses of STEPS steps on augmented batches, and every parameter gathered on rank 0."""
    readers = []

    def from_file(backend):
        readers.append(H5Data(backend, path, BATCH, SEED))
        return augment(readers[-1], mode, SEED, PAD)

    try:
        return train_network(NET, plan, comm, data=from_file, steps=STEPS)
    finally:
        for reader in readers:
            reader.close()


def weighted_plan(conv, linear):
    """Every conv on ``conv`` (mode, grid), every linear layer on ``linear``."""
    return [LayerPlan(*conv) if layer.kind == "conv" else LayerPlan(*linear)
            if layer.kind == "linear" else LayerPlan("follow") for layer in NET.layers]


def plans(p):
    """Batch 1xP, model Px1, and conv split by rows (domain Px1) with batch-parallel linears."""
    return [weighted_plan(("batch", (1, p)), ("batch", (1, p))),
            weighted_plan(("model", (p, 1)), ("model", (p, 1))),
            weighted_plan(("domain", (p, 1)), ("batch", (1, p))),
            weighted_plan(("domain", (p, 1)), ("model", (p, 1)))]


def test_augmented_training_matches_one_process(comm, dataset):
    reference = plain = None
    if comm.Get_rank() == 0:
        reference = train(serial_plan(plans(1)[0]), MPI.COMM_SELF, dataset)
        plain = train(serial_plan(plans(1)[0]), MPI.COMM_SELF, dataset, mode="none")
        assert np.isfinite(reference[0]).all()
        assert reference[0][0] != plain[0][0]  # the augmentation changed what was trained on
    for plan in plans(comm.Get_size()):
        losses, params = train(plan, comm, dataset)
        what = ", ".join(f"{layer.name} {p.describe()}"
                         for layer, p in zip(NET.layers, plan, strict=True) if p.mode != "follow")
        check_close(comm, np.array(losses), reference and np.array(reference[0]),
                    f"losses under {what}", tol=1e-9)
        for k, got in enumerate(params):
            check_close(comm, got, reference and reference[1][k],
                        f"parameter {k} under {what}", tol=1e-9)


class Recording:
    """An H5Data whose image reads are recorded as boxes."""

    def __init__(self, data):
        self.data, self.reads = data, []
        self.backend, self.batch, self.sample_shape = data.backend, data.batch, data.sample_shape
        self.steps_per_epoch = data.steps_per_epoch

    @property
    def nonfinite(self):
        return self.data.nonfinite

    def indices(self, step, samples):
        return self.data.indices(step, samples)

    def images(self, step, box):
        self.reads.append(box)
        return self.data.images(step, box)

    def labels(self, step, samples):
        return self.data.labels(step, samples)


def test_each_rank_reads_only_the_rows_its_windows_need(comm, dataset):
    """Under a row split of the first conv a rank reads, per sample, only the source rows its
    own rows of the cropped image come from."""
    p, rank = comm.Get_size(), comm.Get_rank()
    backend = make_backend()
    height = NET.input_shape[1]
    with GridSet(comm) as grids, H5Data(backend, dataset, BATCH, SEED) as data:
        recording = Recording(data)
        augmented = augment(recording, "standard", SEED, PAD)
        network = Network(NET, plans(p)[2], BATCH, grids, backend, seed=SEED)
        box = network.input_layout.box(rank)
        ok = network.input_layout.split_axis == HEIGHT_AXIS or p == 1
        for step in (0, 2):
            recording.reads.clear()
            network.train_step(augmented, step)
            (lo, hi), (h0, h1) = box[0], box[HEIGHT_AXIS]
            _, dy, _ = augmented.draws(step, (lo, hi))
            for (s0, s1), _, rows, _ in recording.reads:
                want = (max(h0 + int(dy[s0 - lo]) - PAD, 0),
                        min(h1 + int(dy[s0 - lo]) - PAD, height))
                ok = ok and s1 == s0 + 1 and rows == want
            ok = ok and len(recording.reads) <= hi - lo
        assert all_agree(comm, ok), f"rank {rank} block {box} read {recording.reads}"
