"""The reliability suite: bad input on 2 ranks is one line, a non-zero exit from every rank
within seconds, and no change to any file that is not the run's own output."""

import pytest

from tests.reliability import assert_refused, changed_outside, launch, snapshot
from tests.test_training_app import mpiexec

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")


def test_an_unknown_net_changes_nothing(tmp_path):
    (tmp_path / "keep.txt").write_text("a user's file\n")
    before = snapshot(tmp_path)
    outcome = launch("--net", "resnet", "--log", "run.h5", cwd=tmp_path)
    assert_refused(outcome, "unknown net 'resnet'")
    assert changed_outside(before, snapshot(tmp_path), (tmp_path / "cache",)) == []


def test_a_net_that_overflows_in_its_first_step_is_told_which_layer_not_to_lower_lr(tmp_path):
    """``scale factor=1e38`` then x10 overflows in the first forward, before any update: the
    line names the layer whose output is not finite, and does not blame --lr."""
    (tmp_path / "overflow.net").write_text("input features=64 classes=10\nscale factor=1e38\n"
                                           "scale factor=10\nlinear out=10\n")
    outcome = launch("--net", "overflow.net", "--grid", "1x2", "--steps", "3", "--batch", "8",
                     "--compute", "flops", cwd=tmp_path)  # no kernel timing: 2 s, not 15
    assert_refused(outcome, "step 1 (of 3) overflowed before any update, so --lr is not the "
                            "cause: the output of layer 'scale2' (scale, overflow.net, line 3)")
    assert "lower --lr" not in outcome.stderr
