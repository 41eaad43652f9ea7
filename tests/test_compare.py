"""compare-plans' choices that need no MPI: the median round and its option checks."""

from types import SimpleNamespace

import pytest

from hpctrain.commands import compare_plans as compare_plans_command
from hpctrain.commands.compare_plans import median_round
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
        compare_plans_command.run(["--net", "smallcnn", "--rounds", rounds], OneRank())
