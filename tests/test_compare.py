"""compare-plans' choices that need no MPI: the median round and its option checks."""

from types import SimpleNamespace

import pytest

from hpctrain.compare import median_round, run_compare
from hpctrain.errors import UserError
from tests.test_calibrate import OneRank


def test_each_plan_keeps_its_median_round():
    runs = [SimpleNamespace(measured_iteration=t) for t in (0.5, 0.2, 0.3)]
    assert median_round(runs) is runs[2]
    assert median_round(runs[:2]) is runs[1]  # of two, the faster
    assert median_round(runs[:1]) is runs[0]


@pytest.mark.parametrize("rounds", ["0", "101"])
def test_rounds_out_of_range_are_refused(rounds):
    with pytest.raises(UserError, match=f"--rounds {rounds} must be between 1 and 100"):
        run_compare(["--net", "smallcnn", "--rounds", rounds], OneRank())
