"""compare-plans' choices that need no MPI: the median round and its option checks."""


import numpy as np
import pytest

from hpctrain.commands import compare_plans as compare_plans_command
from hpctrain.commands.compare_plans import median_round
from hpctrain.errors import UserError
from tests.test_calibrate import OneRank


def test_each_plan_keeps_its_median_round_and_every_round_time():
    from hpctrain.commands.compare_plans import Outcome

    runs = [Outcome(f"round {k}", None, t, None, None) for k, t in enumerate((0.5, 0.2, 0.3))]
    assert median_round(runs).spec == "round 2"
    assert median_round(runs).rounds == (0.5, 0.2, 0.3)
    assert median_round(runs).spread == (0.2, 0.5)
    assert median_round(runs[:2]).spec == "round 1"  # of two, the faster
    assert median_round(runs[:1]).spread == (0.5, 0.5)


def test_plans_whose_rounds_overlap_rank_as_predicted():
    from hpctrain.commands.compare_plans import ranks_within_noise, spearman

    measured = [1.00, 1.02, 1.50, 2.00]
    predicted = [1.1, 1.0, 1.6, 1.9]  # swaps the first two, which noise cannot tell apart
    apart = [(m, m) for m in measured]
    overlapping = [(0.95, 1.05), (0.98, 1.08), (1.45, 1.55), (1.9, 2.1)]
    assert ranks_within_noise(predicted, measured, apart) == [0, 1, 2, 3]
    assert ranks_within_noise(predicted, measured, overlapping) == [1, 0, 2, 3]
    assert spearman(predicted, measured) == pytest.approx(0.8)
    assert spearman(predicted, ranks_within_noise(predicted, measured, overlapping)) == 1.0
    # a swap the measurements do tell apart still counts against the prediction
    wrong = [1.0, 1.1, 2.0, 1.9]
    assert spearman(wrong, ranks_within_noise(wrong, measured, overlapping)) == \
        pytest.approx(0.8)
    # a group holds plans whose rounds all overlap: the third reaches the second's rounds but
    # not the first's, so it starts a group of its own and the first two keep their order
    chain = [(0.9, 1.01), (1.0, 1.2), (1.15, 1.6), (1.9, 2.1)]
    assert ranks_within_noise([3, 2, 1, 4], measured, chain) == [1, 0, 2, 3]
    everywhere = [(0.9, 1.6), (1.0, 1.1), (1.15, 1.6), (1.9, 2.1)]
    assert ranks_within_noise([3, 2, 1, 4], measured, everywhere) == [1, 0, 2, 3]  # 3 ≁ 2
    wide = [(0.9, 1.6), (1.0, 1.6), (1.15, 1.6), (1.9, 2.1)]
    assert ranks_within_noise([3, 2, 1, 4], measured, wide) == [2, 1, 0, 3]


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


def test_pairs_the_rounds_tell_apart_and_the_auto_plans_rank_beyond_noise():
    from hpctrain.commands.compare_plans import pairs_apart, rank_beyond_noise

    spreads = [(1.0, 1.2), (1.1, 1.3), (2.0, 2.1), (3.0, 3.5)]  # 0 and 1 overlap
    # apart: (0,2) (0,3) (1,2) (1,3) (2,3); the prediction swaps 2 and 3
    assert pairs_apart([1.0, 0.9, 5.0, 4.0], spreads) == (5, 4)
    assert pairs_apart([1.0, 2.0, 3.0, 4.0], spreads) == (5, 5)
    assert pairs_apart([1.0, 2.0], [(1.0, 2.0), (1.5, 2.5)]) == (0, 0)
    assert rank_beyond_noise((2.0, 2.1), [(1.0, 1.2), (1.1, 1.3), (3.0, 3.5)]) == (2, 0)
    assert rank_beyond_noise((1.1, 1.3), [(1.0, 1.2), (2.0, 2.1), (3.0, 3.5)]) == (0, 1)


def test_a_layer_whose_gradient_sum_is_timed_elsewhere_has_no_error():
    from types import SimpleNamespace

    from hpctrain.commands.compare_plans import Outcome, layer_comm_table
    from hpctrain.record.runlog import TIME_FIELDS

    def predicted(name, backward_comm):
        return SimpleNamespace(layer=name, compute=(1e-3, 1e-3), comm=(0.0, backward_comm),
                               redistribution=(0.0, 0.0))

    def measured(backward_comm):
        return SimpleNamespace(**{**{f: 0.0 for f in TIME_FIELDS},
                                  "backward_layer_comm": backward_comm})

    # conv2's gradient went out in the bucket that conv1's backward filled
    planned = SimpleNamespace(layers=[predicted("conv1", 2e-3), predicted("conv2", 1e-3)],
                              loss=predicted("loss", 0.0))
    fastest = SimpleNamespace(layers=[measured(4e-3), measured(0.0)], loss=measured(0.0))
    table = layer_comm_table(Outcome("auto", planned, 0.1, None, fastest))
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:-1]}
    assert rows == {"conv1": ["2.000", "4.000", "-50.0%"], "conv2": ["1.000", "0.000", "-"]}
    assert table.splitlines()[-1] == ("per-layer communication error: median 50.0%, largest "
                                      "50.0%; 1 layer(s) measured none (a gradient bucket is "
                                      "timed where it is sent)")
    alone = SimpleNamespace(layers=planned.layers[1:], loss=planned.loss)
    table = layer_comm_table(Outcome("auto", alone, 0.1, None, SimpleNamespace(
        layers=fastest.layers[1:], loss=fastest.loss)))
    assert table.splitlines()[-1] == ("per-layer communication error: 1 layer(s) measured none "
                                      "(a gradient bucket is timed where it is sent)")
