"""hpctrain on one process against an independent PyTorch model (no torchvision), float64:
ResNet-18, one InceptionA module and CosmoFlow (3-D, a regression on the mean squared error);
logits, loss, every gradient, the parameters after each SGD update (two steps, so momentum is
used) and the running statistics."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.reference

from mpi4py import MPI  # noqa: E402

from hpctrain.plan.plans import plan_from_spec  # noqa: E402
from tests.torch_reference import (  # noqa: E402
    BATCH,
    MODELS,
    STEPS,
    TOLERANCE,
    compare,
    cosmoflow_model,
    cosmoflow_names,
    cosmoflow_volume_net,
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
    assert not run.initial_buffers or any(
        (run.initial_buffers[n] != run.steps[0].buffers[n]).any() for n in run.initial_buffers)


# a PyTorch CosmoFlow unlike cosmoflow.net in one respect each
COSMOFLOW_MISTAKES = {
    "the padding zero before, not after": {"pad": (1, 0)},
    "PyTorch's default LeakyReLU slope": {"slope": 0.01},
    "no output scale": {"scale": 1.0},
    "Keras's channels-last flatten": {"keras_flatten": True},
}


def test_the_cosmoflow_comparison_catches_one_mistake():
    """On 64x32x32 volumes (2x1x1 left after the pools, so that the flatten order matters),
    one step of batch 2: the reference matches hpctrain, and each model with one mistake, or
    started from a first-layer weight off by one part in 10^4, gives outputs well outside the
    tolerance."""
    net = cosmoflow_volume_net(64, 32)
    run = hpctrain_steps(net, plan_from_spec("1x1", net, 1), MPI.COMM_SELF, 2, 1)
    errors = compare(run.steps, torch_steps(cosmoflow_model(net), cosmoflow_names(), run))
    assert not failures(errors, TOLERANCE), failures(errors, TOLERANCE)
    for mistake, changes in COSMOFLOW_MISTAKES.items():
        wrong = torch_steps(cosmoflow_model(net, **changes), cosmoflow_names(), run)
        off = compare(run.steps, wrong)["step 0 logits"]
        assert off > 1e3 * TOLERANCE, f"{mistake}: outputs off by only {off:.1e}"
    # one weight of the first conv, its largest, off by one part in 10^4
    name = "block1.conv1.weight"
    weight = run.initial_params[name].copy()
    weight[np.unravel_index(np.abs(weight).argmax(), weight.shape)] *= 1 + 1e-4
    nudged = dataclasses.replace(run, initial_params={**run.initial_params, name: weight})
    errors = compare(run.steps, torch_steps(cosmoflow_model(net), cosmoflow_names(), nudged))
    assert errors["step 0 logits"] > 10 * TOLERANCE, errors["step 0 logits"]
    assert errors["step 0 loss"] > TOLERANCE, errors["step 0 loss"]


def test_the_name_maps_pair_every_tensor():
    """Each map covers all of hpctrain's parameters and buffers, one to one (also checked in
    :func:`torch_steps`, here without a training step)."""
    for make_net, _, make_names in MODELS.values():
        net, names = make_net(), make_names()
        assert set(names.params) == set(net.param_shapes())
        assert set(names.buffers) == set(net.buffer_shapes())
        assert len(set(names.params.values())) == len(names.params)
