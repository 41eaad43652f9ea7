"""``--space auto`` (hpctrain.plan.spaces): balanced where searching it costs little, grids
elsewhere, never slower than either space's plan; the estimate of what timing the balanced
kernels costs; and, under a memory cap, no kernel of a choice that cannot fit is ever timed."""

import math

import numpy as np
import pytest

from hpctrain.commands import simulate as simulate_command
from hpctrain.cost.compute import (
    MIN_SAMPLES,
    SAMPLE_BUDGET,
    WARM_UPS,
    FlopModel,
    MeasuredCompute,
)
from hpctrain.device.backend import Backend
from hpctrain.errors import UserError
from hpctrain.model.net import parse_net
from hpctrain.plan import spaces
from hpctrain.plan.planner import fitting_choices, format_plan, plan_network
from hpctrain.plan.pricing import CostModel, works_of
from hpctrain.plan.spaces import plan_over
from tests.test_planner_axes import MACHINE, WIDE  # few samples, large images: balanced pays


class Recorded(FlopModel):
    """FLOP-rate times that remember every kernel asked for."""

    def __init__(self, rate: float) -> None:
        super().__init__(rate)
        self.asked: set = set()

    def times(self, works):
        self.asked.update(works)
        return super().times(works)


class Estimated(Recorded):
    """FLOP-rate times, and a fixed estimate of what timing balanced's kernels would take:
    a measured compute model, as the rule sees one."""

    def __init__(self, rate: float, seconds: float) -> None:
        super().__init__(rate)
        self.seconds = seconds

    def seconds_to_time(self, works, timed):
        return self.seconds if works else 0.0


def wide_model(compute, procs=4, batch=2):
    return CostModel(parse_net(WIDE, "wide"), batch, procs, MACHINE, compute)


def test_auto_with_flop_times_is_the_better_of_both_spaces():
    model = wide_model(FlopModel(MACHINE.flops))
    grids = plan_network(model, space="grids")
    balanced = plan_network(wide_model(FlopModel(MACHINE.flops)), space="balanced")
    auto = plan_over(wide_model(FlopModel(MACHINE.flops)), space="auto")
    assert balanced.iteration_time < grids.iteration_time * (1 - 1e-6)  # the case where it pays
    assert auto.iteration_time == pytest.approx(balanced.iteration_time, rel=1e-12)
    assert [p.describe() for p in auto.plans] == [p.describe() for p in balanced.plans]
    assert "--space auto searched balanced (compute from FLOPs, nothing to time)" in (
        format_plan(auto))


@pytest.mark.parametrize("seconds,steps,searched", [
    (spaces.AUTO_SECONDS * 0.9, None, "balanced"),
    (spaces.AUTO_SECONDS * 1.1, None, "grids"),
    (spaces.AUTO_SECONDS * 1.1, 10**9, "balanced"),  # small against a long run
    (0.0, None, "balanced")])  # every kernel cached
def test_auto_weighs_the_timing_against_its_budget(seconds, steps, searched):
    planned = plan_over(wide_model(Estimated(MACHINE.flops, seconds)), space="auto",
                        steps=steps)
    alone = plan_network(wide_model(FlopModel(MACHINE.flops)), space=searched)
    assert planned.iteration_time == pytest.approx(alone.iteration_time, rel=1e-12)
    if searched == "grids":
        assert planned.space_note.startswith(
            "--space auto searched the grids only: timing the kernels the balanced space adds "
            "would take about 11 s, over 10 s")
        assert planned.space_note.endswith("give --space balanced to search it anyway")
    elif seconds == 0.0:
        assert planned.space_note == ("--space auto searched balanced (the kernels it adds are "
                                      "cached)")
    else:
        budget = "2% of 1000000000 steps" if steps else "10 s"
        assert (f"searched balanced (timing the kernels it adds, estimated at "
                f"{seconds:.2g} s, is within {budget}") in planned.space_note


def test_the_budget_grows_with_the_run():
    assert spaces.timing_budget(1.0, None)[0] == spaces.AUTO_SECONDS
    assert spaces.timing_budget(1.0, 10)[0] == spaces.AUTO_SECONDS
    seconds, text = spaces.timing_budget(2.0, 10_000)
    assert seconds == pytest.approx(spaces.AUTO_SHARE * 20_000)
    assert text == "2% of 10000 steps at 2 s"


def test_the_estimate_counts_what_is_not_cached_at_the_rate_the_cached_ran():
    """Each uncached kernel, per direction: two warm-up calls and samples filling the budget,
    each call its FLOPs at the rate of the kernels already timed."""
    compute = MeasuredCompute(Backend(np, np.float32))
    model = wide_model(compute)
    works = list(dict.fromkeys(w for k in range(len(model.segments))
                               for c in model.choices(k)
                               for w in works_of(model.segment_cost(k, c, timed=False).layers)))
    timed, untimed = works[:3], works[3:]
    for work in timed:  # as if each ran at 1 GFLOP/s
        compute.known[compute.prefix + work.key()] = [f / 1e9 for f in work.flops()]
    expected = 0.0
    for work in untimed:
        for flops in work.flops():
            call = flops / 1e9
            expected += WARM_UPS * call + min(5 * call, max(SAMPLE_BUDGET, MIN_SAMPLES * call))
    assert compute.seconds_to_time(untimed + timed, timed) == pytest.approx(expected)
    assert compute.seconds_to_time(timed, timed) == 0.0
    assert compute.seconds_to_time(untimed, []) == math.inf  # no rate: never cheap
    # where the cache holds what timing each took, three times what its calls alone take
    # (set-up, first calls, evictions), the others are estimated three times as long
    for work in timed:
        entry = compute.known[compute.prefix + work.key()]
        calls = sum(WARM_UPS * t + min(5 * t, max(SAMPLE_BUDGET, MIN_SAMPLES * t))
                    for t in entry)
        entry.append(3 * calls)
    assert compute.seconds_to_time(untimed, timed) == pytest.approx(3 * expected)


def test_under_a_cap_no_kernel_of_a_choice_that_cannot_fit_is_timed():
    """The balanced search prices every split's kernels for its bounds; under a cap those of a
    split no plan under it can take (a whole-batch convolution of a large image, say) must not
    be run, since they may not fit in memory at all."""
    probe = wide_model(FlopModel(MACHINE.flops))
    every = [probe.choices(k) + probe.split_choices(k, "balanced")
             for k in range(len(probe.segments))]
    need = [[probe.segment_cost(k, c, timed=False).memory + probe.segment_cost(
        k, c, timed=False).peak for c in found] for k, found in enumerate(every)]
    cap = 1.3 * max(min(row) for row in need)  # some plans fit, the largest choices do not
    kept = fitting_choices(probe, every, cap)
    kept_works = {w for k, found in enumerate(kept) for c in found
                  for w in works_of(probe.segment_cost(k, c, timed=False).layers)}
    over = {w for k, found in enumerate(every) for c in found if c not in kept[k]
            for w in works_of(probe.segment_cost(k, c, timed=False).layers)} - kept_works
    assert over  # the cap leaves kernels out
    compute = Recorded(MACHINE.flops)
    planned = plan_network(wide_model(compute), cap, space="balanced")
    assert planned.memory <= cap
    assert compute.asked and not compute.asked & over


def test_simulate_takes_space_for_the_volumes_study_alone(tmp_path):
    with pytest.raises(UserError, match="--space belongs to the --volumes study"):
        simulate_command.run(["--space", "grids", "--out", str(tmp_path / "s.h5")])
    assert not (tmp_path / "s.h5").exists()


def test_auto_finds_a_plan_where_no_1_5d_plan_runs():
    """64 ranks, a batch of 2: no 1.5D grid runs smallcnn's first convolution (its 8 × 8
    image and 16 channels cannot take 32 model or domain ranks), the splits of several axes
    can."""
    from hpctrain.model.net import load_net
    from hpctrain.plan.planner import PlannerError

    def model():
        return CostModel(load_net("smallcnn", None), 2, 64, MACHINE, FlopModel(MACHINE.flops))

    with pytest.raises(PlannerError, match="raise --batch"):
        plan_network(model(), space="grids")
    planned = plan_over(model(), space="auto")
    assert planned.space_note == ("--space auto searched balanced: no plan of the 1.5D grids "
                                  "runs here")
    assert any(p.mode == "split" for p in planned.plans)


class Rounds(Recorded):
    """Measured compute whose first timing finds batch-split kernels (half the batch of 2)
    ``first`` times their FLOP time and every later timing ``later`` times it: a first timing
    taken at a slow moment."""

    def __init__(self, first: float, later: float, rounds: list) -> None:
        super().__init__(MACHINE.flops)
        self.factor, self.later, self.rounds = first, later, rounds
        rounds.append(self)

    def times(self, works):
        found = super().times(works)
        return {w: tuple(t * (self.factor if w.x[0] == 1 else 1.0) for t in found[w])
                for w in works}

    def seconds_to_time(self, works, timed):
        return 0.0

    def seconds_spent(self, works):
        return 0.01 * len(works)

    def again(self):
        return Rounds(self.later, self.later, self.rounds)


def test_plans_within_the_noise_are_timed_again_and_the_median_decides(monkeypatch):
    """Where another plan is predicted close to the chosen one (here pure batch), their kernels
    are timed again and the plan fastest at the median is kept, saying the first timing
    preferred another; where the timings agree the choice stands; with FLOP times nothing is
    timed again."""
    monkeypatch.setattr(spaces, "CLOSE", 100.0)  # every plan the search met is close

    def model(compute):
        return wide_model(compute, procs=2, batch=2)

    def described(planned):
        return [p.describe() for p in planned.plans]

    rounds: list = []
    slow_first = plan_over(model(Rounds(50.0, 1.0, rounds)), space="grids")
    assert len(rounds) == 1 + spaces.RETIMINGS
    pure = described(spaces.pure_batch_plan(model(FlopModel(MACHINE.flops)))[0])
    alone = plan_network(model(Rounds(50.0, 50.0, [])), space="grids")
    assert described(alone) != pure  # the slow first timing's choice
    assert described(slow_first) == pure  # the median's
    assert "the first timing preferred one predicted" in slow_first.space_note
    steady = plan_over(model(Rounds(50.0, 50.0, [])), space="grids")
    assert described(steady) == described(alone)
    assert "timed 3 times, and the plan fastest at the median kept" in steady.space_note
    assert "preferred" not in steady.space_note
    assert "timed 3 times" not in (plan_over(model(FlopModel(MACHINE.flops)),
                                             space="grids").space_note or "")
