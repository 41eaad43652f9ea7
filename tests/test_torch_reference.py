"""hpctrain on one process against an independent PyTorch model (no torchvision), float64:
ResNet-18 and one InceptionA module; logits, loss, every gradient, the parameters after each SGD
update (two steps, so momentum is used) and the running statistics."""

import pytest

pytest.importorskip("torch")

from mpi4py import MPI  # noqa: E402

from hpctrain.plan.plans import plan_from_spec  # noqa: E402
from tests.torch_reference import (  # noqa: E402
    BATCH,
    MODELS,
    STEPS,
    TOLERANCE,
    compare,
    failures,
    hpctrain_steps,
    torch_steps,
)


@pytest.mark.parametrize("case", MODELS)
def test_one_process_matches_pytorch(case):
    make_net, make_model, make_names = MODELS[case]
    net = make_net()
    run = hpctrain_steps(net, plan_from_spec("1x1", net, 1), MPI.COMM_SELF, BATCH, STEPS)
    reference = torch_steps(make_model(net), make_names(), run)
    errors = compare(run.steps, reference)
    assert not failures(errors, TOLERANCE), failures(errors, TOLERANCE)
    # the test compares something: the step changed the weights and the statistics
    first, after = run.initial_params, run.steps[0].params
    assert all((first[name] != after[name]).any() for name in first)
    assert any((run.initial_buffers[n] != run.steps[0].buffers[n]).any()
               for n in run.initial_buffers)


def test_the_name_maps_pair_every_tensor():
    """Each map covers all of hpctrain's parameters and buffers, one to one (also checked in
    :func:`torch_steps`, here without a training step)."""
    for make_net, _, make_names in MODELS.values():
        net, names = make_net(), make_names()
        assert set(names.params) == set(net.param_shapes())
        assert set(names.buffers) == set(net.buffer_shapes())
        assert len(set(names.params.values())) == len(names.params)
