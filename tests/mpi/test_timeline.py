"""A timeline window records every rank's spans consistently and gathers them at rank 0."""

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.comm.grid import GridSet
from hpctrain.data.synthetic import SyntheticData
from hpctrain.device.backend import Backend
from hpctrain.record.timeline import TimelineWindow
from hpctrain.record.timing import COMMUNICATION, COMPUTE, IN_FLIGHT
from hpctrain.run.network import Network
from hpctrain.run.optimizer import SGD
from tests.mpi.helpers import all_agree
from tests.mpi.test_training import NET, mixed_plans

STEPS, WINDOW = 4, (2, 3)


def problems(spans: np.ndarray, layers: int, summing: bool, overlap: bool) -> list[str]:
    """How this rank's spans (row, phase, category, start, end) of two steps disagree with
    what two steps of a network of ``layers`` layers must show."""
    found = []
    if not np.all(spans[:, 4] >= spans[:, 3]) or not np.all(spans[:, 3] >= 0):
        found.append("a span ends before it starts, or starts before the origin")
    compute = spans[spans[:, 2] == COMPUTE]
    for row in range(layers + 1):
        for phase in (0, 1):
            want = 0 if (row == layers and phase == 1) else 2  # the loss has no backward row
            got = int(np.sum((compute[:, 0] == row) & (compute[:, 1] == phase)))
            if got != want:
                found.append(f"row {row} phase {phase}: {got} compute spans, not {want}")
    for row, phase, _, start, end in spans[spans[:, 2] == COMMUNICATION]:
        inside = ((compute[:, 0] == row) & (compute[:, 1] == phase)
                  & (compute[:, 3] <= start + 1e-9) & (compute[:, 4] >= end - 1e-9))
        if not inside.any():
            found.append(f"communication of row {int(row)} outside its layer's span")
    # the buckets left when the backward ends go in flight together, with overlap or not
    flights = int(np.sum(spans[:, 2] == IN_FLIGHT))
    if (flights > 0) != summing:
        found.append(f"{flights} sums in flight (overlap {overlap}, sums {summing})")
    return found


@pytest.mark.parametrize("overlap", [True, False])
def test_a_window_records_two_steps_of_every_rank(overlap):
    comm = MPI.COMM_WORLD
    backend = Backend(np, np.float64)
    plan = mixed_plans(comm.Get_size())[-1]
    with GridSet(comm) as grids:
        network = Network(NET, plan, 9, grids, backend, seed=5, overlap=overlap)
        data = SyntheticData(backend, NET.input_shape, NET.classes, 9, seed=5)
        optimizer = SGD(network.params, lr=0.05, momentum=0.9)
        window = TimelineWindow(WINDOW, comm, backend)
        for step in range(STEPS):
            times = network.step_times()
            window.begin(step, times)
            network.train_step(data, step, times=times, update=lambda p: optimizer.step(None, p))
            window.end(step, times)
        summing = any(layer.params and layer.grad_comm is not None
                      and layer.grad_comm.Get_size() > 1 for layer in network.layers)
        mine = np.array(window.spans)
        found = problems(mine, len(network.layers), summing, overlap)
        gathered = window.gather()
    assert all_agree(comm, not found), found
    assert all_agree(comm, window.done and window.recorded == [2, 3])
    counts = comm.gather(len(mine), root=0)
    if comm.Get_rank() == 0:
        ranks = gathered[:, 0].astype(int)
        assert np.bincount(ranks, minlength=comm.Get_size()).tolist() == counts
        assert np.all(gathered[:, 4] >= 0)  # from the origin, the barrier before step 2
