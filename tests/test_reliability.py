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
