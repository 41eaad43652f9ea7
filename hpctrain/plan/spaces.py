"""What ``--space`` searches: one of the planner's spaces, or ``auto``, the balanced space where
searching it costs little and the 1.5D grids elsewhere.

:func:`~hpctrain.plan.spaces.predict` is what a command asks of the planner: a plan given,
priced, or the plan of the space ``--space`` names, found.

The balanced space (:data:`~hpctrain.plan.planner.SPACES`: the grids, and a degree for several
axes of a layer's output at once, and input-channel splits) holds every 1.5D plan, so its plan is
never predicted slower; measured, it was 0.4–13 % faster (docs/benchmarks.md). What it costs is
planning: arithmetic alone when compute is priced from FLOPs (seconds at 65,536 ranks), but with
measured compute also the timing of every kernel its splits add, from seconds to minutes on a
cold compute cache (a whole-batch convolution of a large image can take seconds a call). So
``auto``:

1. searches the grids first, exactly as ``--space grids`` (their kernels are timed);
2. estimates the seconds that timing the kernels balanced adds would take
   (:meth:`~hpctrain.cost.compute.MeasuredCompute.seconds_to_time`: zero for those in the
   cache, FLOPs at the rate the grids' kernels just ran at for the others);
3. searches balanced when that is at most :data:`AUTO_SECONDS`, or at most
   :data:`AUTO_SHARE` of the run being planned (its steps at the grids plan's predicted time);
   otherwise keeps the grids plan, whose note says what ``--space balanced`` would cost.

The plan is the faster of the two searches: the grids search may run a region's branches on
groups of ranks, which the balanced search does not weigh. With compute from FLOPs balanced is
always searched; where the grids search weighs groups too and a fork may run
(:func:`~hpctrain.plan.beside.may_fork`), on a second core, beside the grids. There only a
balanced plan that beats the grids' is wanted. The child begins, with sums that may hide, with
the search whose optimum bounds every plan's time from below, and hands that bound over at once
(:func:`~hpctrain.plan.planner.plan_network`'s ``on_bound``): where it does not beat the grids'
plan, this process goes on without waiting for the rest. Otherwise the child hands back its
plan's time with the plan, and a plan that does not beat the grids' is not priced again here.
Every rank decides alike, since the cache and the timings it reads are the same on every rank.

**Choices that survive the noise.** Each kernel is timed once, and a timing is not repeatable:
timed twice, the probe nets' kernels differed by a time-weighted mean ``|log|`` of the ratio of
about 0.1 (``bench/kernel_timing.py``). So where another plan the search met (the other space's,
pure batch) is predicted within :data:`CLOSE` of the chosen one, their order is within that
noise: with measured compute, the kernels of those plans are timed :data:`RETIMINGS` more times,
at other moments, and the plan best at the median of the timings is kept
(:func:`settled`), within the same budget as the balanced space's timing. The plan's note says
so, and which plan the first timing had preferred where they differ.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hpctrain.cost.compute import MedianCompute
from hpctrain.plan.beside import Beside, may_fork
from hpctrain.plan.grouped import grouped_regions
from hpctrain.plan.planner import (
    SPACES,
    PlannedNetwork,
    PlannerError,
    evaluate,
    evaluate_plan,
    fitting_apart,
    plan_network,
)
from hpctrain.plan.plans import LayerPlan
from hpctrain.plan.pricing import CostModel, works_of

SPACE_CHOICES = ("auto", *SPACES)
"""What ``--space`` takes: a space of :data:`~hpctrain.plan.planner.SPACES`, or ``auto``."""

AUTO_SECONDS = 10.0
"""Seconds of kernel timing that searching the balanced space is always worth (less than a
minute's training of any net worth planning)."""

AUTO_SHARE = 0.02
"""The share of a run's predicted time that timing the balanced space's kernels may take (the
balanced plan is 0.4–13 % faster where it differs, so it pays back at once on most runs)."""


def predict(model: CostModel, plan: list[LayerPlan] | None,
            mem_per_rank: float | None = None, cap_source: str = "--mem-per-rank",
            space: str = "auto", groups: bool = False, steps: int | None = None
            ) -> PlannedNetwork:
    """``plan`` with its predicted costs, or (``plan`` None) the plan of :func:`plan_over`."""
    if plan is None:
        return plan_over(model, mem_per_rank, cap_source, space, groups, steps)
    return evaluate_plan(model, plan)


def plan_over(model: CostModel, mem_per_rank: float | None = None,
              cap_source: str = "--mem-per-rank", space: str = "auto", groups: bool = False,
              steps: int | None = None) -> PlannedNetwork:
    """The planner's plan (:func:`~hpctrain.plan.planner.plan_network`) over ``space``, one of
    :data:`SPACE_CHOICES`: ``auto`` as the module says, for a run of ``steps`` steps (None: not
    known, :data:`AUTO_SECONDS` alone); with ``groups``, regions on groups of ranks."""
    others: list[PlannedNetwork] = []
    with _no_cycle_collection():
        if space == "auto":
            chosen = plan_over_auto_space(model, mem_per_rank, cap_source, groups, steps,
                                          others)
        else:
            chosen = plan_network(model, mem_per_rank, cap_source, space, groups)
        return settled(model, chosen, [*others, *pure_batch_plan(model)], mem_per_rank,
                       steps)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's collector of reference cycles paused while a search runs, and every object
    alive when it ends (the model's prices and tables among them) set aside from the
    collector's later walks (``gc.freeze``): such an object is still freed when its last
    reference goes, as the model and all it holds are; only a cycle among them would stay.
    A search makes tens of thousands of layouts, prices and tables, nearly all alive until it
    ends and none of them in cycles: the collector walked them again and again, 10 to 17 % of
    a plan's time at 4096 and 65,536 ranks, and one walk of them all when it resumed took
    0.15 s more. Without it a plan keeps the same memory (ResNet-50 at 65,536 ranks,
    Inception-v3 at 4096, DeepCAM: peak resident size within 1 %)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # what lives on (the model's prices) would otherwise be walked once more
        if enabled:
            gc.enable()


def plan_over_auto_space(model: CostModel, mem_per_rank: float | None, cap_source: str,
                         groups: bool, steps: int | None,
                         others: list[PlannedNetwork] | None = None) -> PlannedNetwork:
    """The plan of :func:`~hpctrain.plan.planner.plan_network` over the space the module's rule
    picks for a run of ``steps`` steps (None: not known, :data:`AUTO_SECONDS` alone), with a
    note that says which space and why; the plan of the other space searched, if any, is
    appended to ``others``."""
    others = [] if others is None else others
    with _balanced_search(model, mem_per_rank, cap_source, groups) as balanced_plan:
        try:
            grids = plan_network(model, mem_per_rank, cap_source, "grids", groups)
        except PlannerError:  # no 1.5D plan at all: the splits are the only way to one
            planned = balanced_plan(math.inf)
            planned.space_note = ("--space auto searched balanced: no plan of the 1.5D grids "
                                  "runs here")
            return planned
        cost = balanced_timing_seconds(model, mem_per_rank)
        budget, budget_text = timing_budget(grids.iteration_time, steps)
        if cost > budget:
            grids.space_note = (f"--space auto searched the grids only: timing the kernels the "
                                f"balanced space adds would take about {_seconds(cost)}, over "
                                f"{budget_text}; give --space balanced to search it anyway")
            return grids
        try:
            balanced = balanced_plan(grids.iteration_time)
        except PlannerError as err:  # too large a space for an exact search here
            grids.space_note = f"--space auto searched the grids only: {err}"
            return grids
        why = ("compute from FLOPs, nothing to time" if cost == 0.0 and not _measured(model)
               else "the kernels it adds are cached" if cost == 0.0
               else f"timing the kernels it adds, estimated at {_seconds(cost)}, is within "
                    f"{budget_text}")
        if balanced is not None and balanced.iteration_time < grids.iteration_time:
            balanced.space_note = f"--space auto searched balanced ({why})"
            others.append(grids)
            return balanced
        if balanced is not None:
            others.append(balanced)
        grids.space_note = (f"--space auto searched balanced ({why}); no plan of it beats the "
                            f"1.5D plan")
        return grids


@contextmanager
def _balanced_search(model: CostModel, mem_per_rank: float | None, cap_source: str,
                     groups: bool) -> Iterator[Callable[[float], PlannedNetwork | None]]:
    """The balanced space's plan, as a call given the time it has to beat: the plan, or None
    where it is known not to beat that time without being priced here. With compute from
    FLOPs (balanced is then searched whatever the grids give), where the grids search weighs
    regions on groups of ranks (and takes about as long as balanced's: without them it takes
    a fraction, and a child would price again the grids the balanced search finds priced here)
    and where a fork is safe (:func:`~hpctrain.plan.beside.may_fork`), the search starts at
    once in a child on a second core, and the call takes its plan; the child is ended on
    leaving if the plan was never asked for. With no cap, the lower bounds on its plans' time
    that the child notes as it goes spare the wait where one does not beat the time given."""
    if _measured(model) or not (groups and grouped_regions(model)) or not may_fork():
        yield lambda beat: plan_network(model, mem_per_rank, cap_source, "balanced")
        return
    if mem_per_rank is not None:
        beside = Beside(lambda: _sent(plan_network(model, mem_per_rank, cap_source,
                                                   "balanced")))
    else:
        beside = Beside(lambda note: _sent(plan_network(
            model, None, cap_source, "balanced", on_bound=note)), noting=True)

    def received(beat: float) -> PlannedNetwork | None:
        while beside.noting and (bound := beside.noted()) is not None:
            if bound > beat * (1 + 1e-9):  # the slack: sums in another order
                return None  # no plan of the space beats it
        return _received(model, beside.result(), beat)

    try:
        yield received
    finally:
        beside.close()


def _sent(planned: PlannedNetwork) -> tuple[list[LayerPlan], bool, float | None, float]:
    """What a search run beside hands back of its plan: the plan of every layer, what its
    search alone knows (whether it is exact, its lower bound), and its predicted time."""
    return planned.plans, planned.exact, planned.lower_bound, planned.iteration_time


def _received(model: CostModel, sent: tuple[list[LayerPlan], bool, float | None, float],
              beat: float) -> PlannedNetwork | None:
    """The plan :func:`_sent` handed back, priced here as its search priced it; None where
    its time there (the same floats: the child prices from a copy of this model) does not
    beat ``beat``, which leaves it unpriced here."""
    plans, exact, lower_bound, time = sent
    if time >= beat:
        return None
    planned = evaluate_plan(model, plans)
    planned.exact, planned.lower_bound = exact, lower_bound
    return planned


CLOSE = 0.1
"""Plans predicted within this share of each other are within the noise of one timing of their
kernels (the module's notes), and are timed again before one is chosen."""

RETIMINGS = 2
"""The timings of close plans' kernels beyond the first. The median of three sets aside one
slow moment of the machine."""


def settled(model: CostModel, chosen: PlannedNetwork, others: list[PlannedNetwork],
            mem_per_rank: float | None, steps: int | None) -> PlannedNetwork:
    """``chosen``, or the plan of ``others`` (and of ``chosen``) predicted within :data:`CLOSE`
    of it that is fastest when their kernels are timed :data:`RETIMINGS` more times and each
    takes its median (see the module's notes); as it was with compute from FLOPs, where no
    other plan is close, or where timing them again would take longer than the budget of
    :func:`timing_budget`. The same on every rank: the timings are the slowest rank's."""
    if not (_measured(model) and hasattr(model.compute, "again")) or chosen.on_groups:
        return chosen
    limit = chosen.iteration_time * (1 + CLOSE)
    close, seen = [chosen], {tuple(chosen.plans)}
    for other in others:
        if (tuple(other.plans) not in seen and not other.on_groups
                and other.iteration_time <= limit
                and (mem_per_rank is None or other.memory <= mem_per_rank)):
            close.append(other)
            seen.add(tuple(other.plans))
    if len(close) == 1:
        return chosen
    # a kernel every close plan runs adds the same to each: only the others are timed again
    each = [set(works_of(plan.layers)) for plan in close]
    shared = set.intersection(*each)
    works = sorted(set.union(*each) - shared, key=lambda w: w.key())
    cost = RETIMINGS * model.compute.seconds_spent(works)
    budget, budget_text = timing_budget(chosen.iteration_time, steps)
    count = f"{len(close)} plans predicted within {CLOSE:.0%} of each other"
    if cost > budget:
        chosen.space_note = _joined(chosen.space_note, (
            f"{count}: not timed again (about {_seconds(cost)}, over {budget_text}); "
            f"compare-plans times them in rounds"))
        return chosen
    median = model.timed_by(MedianCompute([model.compute, *(
        _ApartFrom(shared, model.compute, model.compute.again()) for _ in range(RETIMINGS))]))
    again = [evaluate_plan(median, plan.plans) for plan in close]
    best = min(range(len(again)), key=lambda k: (again[k].iteration_time, k))
    found = again[best]
    found.space_note = _joined(chosen.space_note, (
        f"{count}: their kernels timed {RETIMINGS + 1} times, and the plan fastest at the "
        f"median kept" + ("" if best == 0 else
                          f" (the first timing preferred one predicted "
                          f"{again[0].iteration_time * 1e3:.4g} ms at the median, against "
                          f"{found.iteration_time * 1e3:.4g} ms)")))
    return found


class _ApartFrom:
    """Times of the kernels of ``shared`` from ``first``, of the others from ``again``."""

    def __init__(self, shared: set, first, again) -> None:
        self.shared, self.first, self.again = shared, first, again

    def times(self, works):
        mine = [w for w in works if w in self.shared]
        found = self.first.times(mine) if mine else {}
        others = [w for w in works if w not in self.shared]
        return {**found, **(self.again.times(others) if others else {})}


def _joined(note: str | None, more: str) -> str:
    return f"{note}; {more}" if note else more


def pure_batch_plan(model: CostModel) -> list[PlannedNetwork]:
    """The pure batch plan (1×P on every layer) priced, or nothing where it cannot run."""
    from hpctrain.plan.baselines import pure_batch

    try:
        return [evaluate(model, pure_batch(model.segment_kinds, model.procs))]
    except (PlannerError, ValueError):
        return []


def balanced_timing_seconds(model: CostModel, mem_per_rank: float | None) -> float:
    """About how long timing the kernels the balanced space adds to the grids would take: those
    of every split that may fit under ``mem_per_rank`` (the others are never timed) and not
    among the grids' kernels or in the cache; zero with compute from FLOPs."""
    if not _measured(model):
        return 0.0
    segments = range(len(model.segments))
    grids = [model.choices(k) for k in segments]
    wider = [model.split_choices(k, "balanced") for k in segments]
    if mem_per_rank is not None:
        _, wider = fitting_apart(model, grids, wider, mem_per_rank)
    timed = _kernels(model, grids)
    known = set(timed)
    added = [w for w in _kernels(model, wider) if w not in known]
    return model.compute.seconds_to_time(added, timed)


def timing_budget(iteration: float, steps: int | None) -> tuple[float, str]:
    """The seconds of kernel timing that searching balanced may take before a run of ``steps``
    steps of ``iteration`` seconds each, and how to say it."""
    if steps is None:
        return AUTO_SECONDS, f"{AUTO_SECONDS:g} s"
    share = AUTO_SHARE * steps * iteration
    if share <= AUTO_SECONDS:
        return AUTO_SECONDS, (f"{AUTO_SECONDS:g} s (more than {AUTO_SHARE:.0%} of {steps} "
                              f"steps at {_seconds(iteration)})")
    return share, f"{AUTO_SHARE:.0%} of {steps} steps at {_seconds(iteration)}"


def _kernels(model: CostModel, choices: list[list]) -> list:
    """The kernels timed to price every choice of ``choices`` (arithmetic: nothing timed)."""
    return list(dict.fromkeys(
        w for k, found in enumerate(choices) for c in found
        for w in works_of(model.segment_cost(k, c, timed=False).layers)))


def _measured(model: CostModel) -> bool:
    """Whether the model's compute times are measured (timing a kernel costs time)."""
    return hasattr(model.compute, "seconds_to_time")


def _seconds(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds < 60 else f"{seconds / 60:.1f} min"
