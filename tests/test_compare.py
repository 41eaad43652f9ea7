"""compare-plans' choices that need no MPI: the median round and its option checks."""


import numpy as np
import pytest

from hpctrain.commands import compare_plans as compare_plans_command
from hpctrain.commands.compare_plans import median_round
from hpctrain.cost.compute import FlopModel
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


class Drifting(FlopModel):
    """Compute times from FLOPs at a rate that moves from one timing to the next, as a machine
    whose speed drifts over a launch: each timing again runs at the next of ``rates``."""

    def __init__(self, rates):
        super().__init__(next(rates))
        self.rates = rates

    def again(self):
        return Drifting(self.rates)


@pytest.mark.parametrize("timing, rate", [("each-round", 2e9), ("once", 1e9)])
def test_every_plan_is_priced_at_each_kernels_median_over_the_rounds(monkeypatch, timing, rate):
    """Kernels timed before rounds 1, 2 and 3 at 1, 2 and 4 GFLOP/s: every plan, auto included,
    is priced as one timing at the median rate would price it (--kernel-timing each-round), not
    at the last or the mean, or as the first timing alone did (once)."""
    from hpctrain.cost.machine import load_machine
    from hpctrain.model.net import load_net
    from hpctrain.plan.planner import evaluate_plan

    outcomes, model = compare_under(monkeypatch, [1e9, 2e9, 4e9], "--kernel-timing", timing)
    net, machine = model.net, model.machine
    at_rate = model.timed_by(Drifting(iter([rate])))
    first = model.timed_by(Drifting(iter([1e9])))
    assert [o.spec for o in outcomes] == ["auto", "1x1"]
    for outcome in outcomes:
        expected = evaluate_plan(at_rate, outcome.planned.plans)
        assert outcome.planned.iteration_time == pytest.approx(expected.iteration_time,
                                                               rel=1e-12)
        assert len(outcome.rounds) == 3
    slower = evaluate_plan(first, outcomes[1].planned.plans).iteration_time
    assert (outcomes[1].planned.iteration_time < slower) == (timing == "each-round")
    # the first timing's prices stay beside them, for the report to show what the rounds changed
    if timing == "each-round":
        for outcome in outcomes:
            first_price = evaluate_plan(first, outcome.planned.plans).iteration_time
            assert outcome.first_timing == pytest.approx(first_price, rel=1e-12)
        assert outcomes[1].first_timing == pytest.approx(slower, rel=1e-12)
        assert "priced by the kernels' first timing alone" in compare_plans_command.report(
            outcomes)
    else:
        assert all(o.first_timing is None for o in outcomes)
    assert net == load_net("smallcnn", 16) and machine == load_machine("default")


def test_kernels_timed_alike_every_round_price_every_plan_as_the_planner_did(monkeypatch):
    outcomes, _ = compare_under(monkeypatch, [1e9, 1e9, 1e9])
    assert len(outcomes) == 2
    for outcome in outcomes:
        assert outcome.first_timing is not None
        assert outcome.planned.iteration_time == outcome.first_timing


@pytest.mark.parametrize("overlap, precision, space", [
    (False, "fp32", "grids"), (True, "fp32", "grids"), (True, "bf16", "balanced"),
    (True, "fp32", "auto")])
def test_a_plan_priced_again_under_the_same_times_is_the_planners_own(overlap, precision,
                                                                      space):
    """The planner's plan of a branched net on 16 ranks of a profile whose gradient sums hide
    behind the backward, priced again under the same times: its price bit for bit (the sums in
    flight, the precision's bytes and the last buckets kept), and what the planner said of it;
    priced as fp32 with nothing in flight, it would differ."""
    from hpctrain.commands.compare_plans import priced_again
    from hpctrain.cost.machine import load_machine
    from hpctrain.device.precision import PRECISIONS
    from hpctrain.model.net import load_net
    from hpctrain.plan.planner import evaluate_plan
    from hpctrain.plan.pricing import CostModel
    from hpctrain.plan.spaces import plan_over

    net, machine = load_net("minibranch", 32), load_machine("dgx-h100")
    model = CostModel(net, 32, 16, machine, FlopModel(1e12), PRECISIONS[precision], overlap)
    planned = plan_over(model, space=space)
    (again,) = priced_again(model.timed_by(FlopModel(1e12)), [planned])
    assert again.iteration_time == planned.iteration_time
    assert again.plans == planned.plans and again.space_note == planned.space_note
    assert (space == "auto") == bool(again.space_note)
    plain = CostModel(net, 32, 16, machine, FlopModel(1e12))
    if overlap or precision != "fp32":
        assert evaluate_plan(plain, planned.plans).iteration_time != planned.iteration_time


def compare_under(monkeypatch, rates, *extra):
    """compare-plans' outcomes (auto and 1x1, 3 rounds) on one rank, its kernels timed at
    ``rates`` in turn (:class:`Drifting`), and the cost model it planned with."""
    from mpi4py import MPI

    from hpctrain.plan import pricing
    from hpctrain.plan.pricing import CostModel

    models = []

    def drifting(net, batch, procs, machine, source, backend=None, comm=None, threads=None,
                 overlap=False, cached=True):
        models.append(CostModel(net, batch, procs, machine, Drifting(iter(rates)),
                                backend.precision, overlap))
        return models[-1]

    monkeypatch.setattr(pricing, "build_cost_model", drifting)
    args = compare_plans_command.build_parser().parse_args(
        ["--net", "smallcnn", "--image-size", "16", "--batch", "4", "--steps", "2", "--rounds",
         "3", "--plan", "auto", "--plan", "1x1", "--threads", "1", *extra])
    outcomes, _, _ = compare_plans_command.compare(args, MPI.COMM_SELF, quiet=True)
    (model,) = models
    return outcomes, model
