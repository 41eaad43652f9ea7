"""A run's first step that overflows: what overflowed is named, and --lr is not blamed (no
update has happened before it). The launch on 2 ranks is in ``tests/test_reliability.py``."""

import numpy as np
import pytest

from hpctrain.model.net import parse_net
from hpctrain.run.loop import TrainingError, _refuse_first_overflow
from hpctrain.run.network import Overflow

NET = parse_net("input features=4 classes=2\nlinear out=3\nscale factor=1e30\nlinear out=2\n",
                "big.net")


def test_the_watch_keeps_the_first_layer_of_each_pass():
    watch = Overflow(np)
    for k, y in enumerate([np.ones(3), np.array([1.0, np.inf]), np.array([np.nan])]):
        watch.see_output(k, y)
    for k, grads in [(2, [np.ones(2), None]), (1, [None, [np.ones(1), np.array([-np.inf])]]),
                     (0, [np.array([np.nan])])]:  # the backward runs from the loss down
        watch.see_gradients(k, grads)
    assert (watch.forward, watch.backward) == (1, 1)


def test_a_first_step_with_finite_values_goes_on():
    _refuse_first_overflow(NET, 0.69, (None, None), 10)


@pytest.mark.parametrize("loss,where,named", [
    (float("nan"), (1, 2), "the output of layer 'scale1' (scale, big.net, line 3) holds NaN or "
                           "Inf in the forward pass (loss nan)"),
    (float("inf"), (None, None), "the loss became inf from finite outputs of every layer"),
    (3.6e37, (None, 2), "the gradients of layer 'linear2' (linear, big.net, line 4) hold NaN or "
                        "Inf in the backward pass (loss 3.6e+37)"),
])
def test_what_overflowed_is_named_and_lr_is_not_blamed(loss, where, named):
    with pytest.raises(TrainingError) as err:
        _refuse_first_overflow(NET, loss, where, 10)
    message = str(err.value)
    assert message.startswith("step 1 (of 10) overflowed before any update, so --lr is not the "
                              "cause: ")
    assert named in message and "lower --lr" not in message and "\n" not in message
