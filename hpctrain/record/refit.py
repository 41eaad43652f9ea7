"""A profile refitted to measured plans (:mod:`hpctrain.plan.stepfit` on the plans of logs).

Each measured plan is priced again on the profile being refitted: its communication as the
four columns of that profile's links, its compute as the run predicted it before any compute
scale (the same kernels, timed on this machine, or FLOPs); it is measured as the slowest rank's
whole time per layer and direction. The fit's factors then apply to that profile, whatever
profile the run itself was predicted with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine
from hpctrain.model.kinds import compute_factors_for, shape_class
from hpctrain.plan.stepfit import (
    LayerSample,
    StepFit,
    columns_of,
    evaluated_per_column,
    fit,
    fit_cache_bytes,
    samples_of_run,
)
from hpctrain.record.measured import MeasuredPlan
from hpctrain.record.runlog import communication

DIRECTION_FIELDS = (("forward_compute", "forward_layer_comm", "forward_redistribution"),
                    ("backward_compute", "backward_layer_comm", "backward_redistribution"))
"""The measured fields that make a layer's time in each direction."""


@dataclass
class PricedPlan:
    """A measured plan's samples, and its iteration as the model on one profile sees it."""

    plan: MeasuredPlan
    samples: list[LayerSample]
    rest: float  # predicted iteration beyond the rows (the input batch, hidden sums), s

    def predicted(self, machine: Machine, step_fit: StepFit | None = None) -> float:
        """The iteration predicted on ``machine``, with ``step_fit``'s factors when given."""
        scale = dict(machine.compute_scale)
        links, cache = (1.0, 1.0, 1.0, 1.0), machine.cache_bytes
        if step_fit is not None:
            scale.update(step_fit.compute)
            links, cache = step_fit.links, step_fit.cache_bytes
        total = self.rest
        for s in self.samples:
            factors = compute_factors_for(scale, s.kind, s.touched, cache)
            total += s.predicted * factors[int(s.backward)]
            total += float(np.dot(s.columns, links))
        return total


def priced(plan: MeasuredPlan, machine: Machine, apart: bool = False) -> PricedPlan:
    """``plan``'s samples priced on ``machine`` (see the module's text); ``apart``: each
    layer and direction as two samples, its compute against the measured compute and its
    communication against the measured communication and redistribution."""
    from hpctrain.plan.pricing import CostModel

    def model_of(links: Machine) -> CostModel:
        return CostModel(plan.net, plan.batch, plan.procs, links, FlopModel(links.flops),
                         plan.itemsize)

    evaluated = evaluated_per_column(model_of, plan.plans, machine)
    columns = columns_of(evaluated)
    # each layer's local work is the plan's, whatever the links: any of the evaluations has it
    works = [c.work for c in [*evaluated[0].layers, evaluated[0].loss]]
    # a convolution by the shape of its window, the rest by kind: what the factors are fitted to
    kinds = [shape_class(kind, *((work.kernel, work.groups) if work is not None else ()))
             for kind, work in zip([layer.kind for layer in plan.net.layers]
                                   + [plan.net.loss.name], works, strict=True)]
    then = plan.profile if plan.profile is not None else Machine("none", 1.0, 1.0, 1.0)
    recorded = np.stack([plan.predicted["forward_compute"], plan.predicted["backward_compute"]],
                        axis=1)
    touched = [w.touched_elements() * plan.itemsize if w is not None else 0 for w in works]
    base = recorded / np.array([compute_factors_for(then.compute_scale, kind, size,
                                                    then.cache_bytes)
                                for kind, size in zip(kinds, touched, strict=True)])
    measured = np.stack([sum(plan.measured[f] for f in DIRECTION_FIELDS[d]) for d in (0, 1)],
                        axis=1)
    samples = samples_of_run(kinds, base, columns, measured, touched)
    if apart:
        compute = np.stack([plan.measured["forward_compute"], plan.measured["backward_compute"]],
                           axis=1).ravel()  # in the samples' order: each row, both directions
        samples = [part for whole, spent in zip(samples, compute, strict=True) for part in (
            replace(whole, columns=(0.0,) * len(whole.columns), measured=float(spent)),
            replace(whole, predicted=0.0, measured=whole.measured - float(spent)))]
    rows = float(recorded.sum() + communication(plan.predicted).sum())
    return PricedPlan(plan, samples, plan.iteration[0] - rows)


PULLS = (0.0, 0.1, 1.0, 10.0, 100.0)
"""The pulls towards 1 (:func:`~hpctrain.plan.stepfit.fit`) that :func:`pulled_fit` tries:
from none to factors that barely leave the microbenchmarks."""


def refit(plans: list[MeasuredPlan], machine: Machine, source: str, apart: bool = False,
          cache_bytes: int | None = None) -> tuple[Machine, StepFit, list[PricedPlan]]:
    """``machine`` refitted to ``plans`` (``source`` names them in the profile), the fit, and
    each plan priced (to compare its iteration before and after).

    ``apart``: the compute factors fitted to the measured compute and the links' to the
    measured communication (:func:`priced`), not both to their sum. Plans of different
    layouts tell the two apart in their sums; one plan cannot, as each of its layers computes
    and sends together (fitted to their sums, a 30 % slower machine came out as convolutions
    7 % faster and links 7.6 times slower per byte).

    ``cache_bytes``: the size past which work takes the factors beyond the cache, fitted
    with them when None (:func:`~hpctrain.plan.stepfit.fit_cache_bytes`).

    The factors are pulled towards 1 as far as predicting each net's plans from the others'
    says (:func:`pulled_fit`)."""
    found = [priced(p, machine, apart) for p in plans]
    samples, weights = _rows(found)

    def fitted(pull: float) -> StepFit:
        return (fit_cache_bytes(samples, len(plans), weights, pull) if cache_bytes is None else
                fit(samples, len(plans), weights, cache_bytes, pull))

    step_fit = pulled_fit(found, machine, fitted)
    return step_fit.applied_to(machine, source), step_fit, found


def _rows(found: list[PricedPlan]) -> tuple[list[LayerSample], list[float]]:
    """The samples of ``found``'s plans, and each one's weight in the fit."""
    # each plan weighs the same, whatever its step: its rows' squared errors over its
    # iteration's square (fitted on absolute times, the long steps of one probe pulled the
    # links' factors to fit themselves and the short plans' errors doubled)
    weights = [p.plan.iteration[1] ** -2 for p in found for _ in p.samples]
    return [s for p in found for s in p.samples], weights


def pulled_fit(found: list[PricedPlan], machine: Machine,
               fitted: Callable[[float], StepFit]) -> StepFit:
    """``fitted(pull)``, the fit to all of ``found`` under the pull of :data:`PULLS` (its
    ``pull``) under which factors fitted to all nets of ``found`` but one predict that one's
    plans best.

    Best: the least mean squared relative error of the iterations, each net left out in turn
    (on a tie the stronger pull). Each pull's fit to all nets fixes the size past which work
    leaves the cache (its ``cache_bytes``); the nets left in refit the factors under it. A net
    is its name: a net run at two sizes is left out at both. The plans of fewer than 3 nets
    leave too few to fit when one is out: no pull.

    A factor fitted to some nets is worth as much as it predicts the others: the kernels of a
    net the fit never saw are timed apart from the probes', in shapes of their own. Left out
    in turn under a free fit, the branched probe net was predicted 69 % off, its factors
    beyond the cache taken from nets with few rows there."""
    nets = sorted({p.plan.net.name for p in found})
    if len(nets) < 3:
        return fitted(0.0)
    folds = []  # per net left out: its plans, the others' count and rows (alike for every pull)
    for left_out in nets:
        rest = [p for p in found if p.plan.net.name != left_out]
        folds.append(([p for p in found if p.plan.net.name == left_out], len(rest), *_rows(rest)))
    tried = []
    for pull in PULLS:
        whole = fitted(pull)
        squares = []
        for out, plans, samples, weights in folds:
            step_fit = fit(samples, plans, weights, whole.cache_bytes, pull)
            squares += [e * e for e in errors(out, machine, step_fit)]
        tried.append((float(np.mean(squares)), whole))
    # the least error; of errors equal to rounding, the strongest pull (the fewest claims
    # beyond the timing)
    least = min(score for score, _ in tried)
    return max((whole for score, whole in tried if score <= least * (1 + 1e-9) + 1e-20),
               key=lambda whole: whole.pull)


def errors(found: list[PricedPlan], machine: Machine, step_fit: StepFit | None = None
           ) -> list[float]:
    """Each plan's iteration prediction error, predicted / measured − 1."""
    return [p.predicted(machine, step_fit) / p.plan.iteration[1] - 1 for p in found]
