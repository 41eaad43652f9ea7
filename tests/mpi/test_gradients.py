"""Gradient sums in buckets, blocking or in flight, equal one blocking all-reduce per layer,
and updating each layer as its sum arrives trains bit for bit as an optimizer step after."""

from functools import partial

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.comm.gradients import GradientReducer
from hpctrain.device.backend import Backend
from hpctrain.layers.base import Parameter
from tests.mpi.helpers import all_agree
from tests.mpi.test_training import NET, mixed_plans, train


def _params(rank: int, sizes: list[tuple[int, ...]], seed: int) -> list[Parameter]:
    """Parameters whose gradient differs on every rank."""
    rng = np.random.default_rng([seed, rank])
    params = []
    for k, shape in enumerate(sizes):
        p = Parameter(f"p{k}", np.zeros(shape), shape)
        p.grad = rng.standard_normal(shape)
        params.append(p)
    return params


@pytest.mark.parametrize("bucket_bytes,in_flight", [(1, True), (200, True), (1 << 20, True),
                                                    (0, False), (200, False), (1 << 20, False)])
def test_sums_in_buckets_equal_blocking_all_reduces(bucket_bytes, in_flight):
    """Layers on two communicators (the world and halves of it), added in turn with progress
    between: every gradient ends as the blocking all-reduce's sum, and every parameter is
    handed over once, after its sum is in place."""
    world = MPI.COMM_WORLD
    half = world.Split(world.Get_rank() % 2, world.Get_rank())
    layers = [(world, [(3, 4), (3,)]), (half, [(5,)]), (world, [(7, 2, 2)]), (half, [(2, 9)]),
              (None, [(4,)]), (world, [(1,)])]
    reducer = GradientReducer(Backend(np, np.float64), bucket_bytes, in_flight)
    for step in range(2):  # the second step reuses the buffers of the first
        handed: list[str] = []
        expected: dict[str, np.ndarray] = {}

        def on_reduced(params, expected=expected, handed=handed):
            for p in params:
                assert np.array_equal(p.grad, expected[p.name]), p.name
                handed.append(p.name)

        reducer.start(on_reduced)
        names = []
        for k, (comm, shapes) in enumerate(layers):
            params = _params(world.Get_rank(), shapes, 10 * step + k)
            for p in params:
                p.name = f"{k}.{p.name}"
                names.append(p.name)
                expected[p.name] = (p.grad.copy() if comm is None else
                                    comm.allreduce(p.grad.copy(), op=MPI.SUM))
            reducer.add(comm, params)
            reducer.progress()
        reducer.finish()
        assert all_agree(world, sorted(handed) == sorted(names))
    half.Free()


@pytest.mark.parametrize("in_flight", [True, False])
def test_the_buckets_left_at_the_end_of_the_backward_go_together(in_flight):
    """Whether or not full buckets go in flight, the buckets still open when the backward ends
    are all started before any is waited for (the step pays the slowest latency of them, as the
    cost model prices it): each shows in the flights, one per communicator."""
    world = MPI.COMM_WORLD
    other = world.Dup()  # a second communicator of every rank: a bucket of its own
    reducer = GradientReducer(Backend(np, np.float64), 1 << 20, in_flight)
    reducer.start()
    reducer.flights = []
    for k, comm in enumerate((world, other, world)):
        reducer.add(comm, _params(world.Get_rank(), [(3, 2)], k), label=k)
    assert not reducer.flights
    reducer.finish()
    expected = [0, 1] if world.Get_size() > 1 else []
    assert all_agree(world, sorted(label for label, _, _ in reducer.flights) == expected)
    other.Free()


@pytest.mark.parametrize("overlap", [True, False])
def test_updating_as_sums_arrive_equals_a_step_after(overlap):
    """The training loop's way (each layer updated when its sum arrives, inside the backward)
    gives the same parameters, bit for bit, as an optimizer step after the backward, with the
    sums in flight or not."""
    from hpctrain.comm.gather import gather_to_root
    from hpctrain.comm.grid import GridSet
    from hpctrain.data.synthetic import SyntheticData
    from hpctrain.run.network import Network
    from hpctrain.run.optimizer import SGD

    comm = MPI.COMM_WORLD
    plan = mixed_plans(comm.Get_size())[-1]
    after = train(NET, plan, comm)
    backend = Backend(np, np.float64)
    with GridSet(comm) as grids:
        network = Network(NET, plan, 9, grids, backend, seed=5, overlap=overlap)
        data = SyntheticData(backend, NET.input_shape, NET.classes, 9, seed=5)
        optimizer = SGD(network.params, lr=0.05, momentum=0.9, weight_decay=1e-3)
        losses = [network.train_step(data, step, update=partial(optimizer.step, 0.05))[0]
                  for step in range(len(after[0]))]
        params = [gather_to_root(backend, comm, p.value, p.shape, p.box, "copy")
                  for p in network.params]
    same = losses == after[0]
    if comm.Get_rank() == 0:
        same &= all(np.array_equal(a, b) for a, b in zip(params, after[1], strict=True))
    assert all_agree(comm, same)
