"""compare-plans' choices that need no MPI: the median round and its option checks."""

from types import SimpleNamespace

import numpy as np
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


def test_spearman_rank_correlation_of_predicted_and_measured_order():
    from hpctrain.commands.compare_plans import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share their mean rank: ranks (1.5, 1.5, 3) against (1, 2, 3)
    assert spearman([5, 5, 7], [1, 2, 3]) == pytest.approx(np.corrcoef([1.5, 1.5, 3],
                                                                      [1, 2, 3])[0, 1])
    assert spearman([1, 1, 1], [1, 2, 3]) == 0.0
    # no ties: 1 - 6 Σd² / (n (n² - 1)), two neighbours swapped: 1 - 6·2 / 120
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
