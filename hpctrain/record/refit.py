"""A profile refitted to measured plans (:mod:`hpctrain.plan.stepfit` on the plans of logs).

Each measured plan is priced again on the profile being refitted: its communication as the
four columns of that profile's links, its compute as the run predicted it before any compute
scale (the same kernels, timed on this machine, or FLOPs); it is measured as the slowest rank's
whole time per layer and direction. The fit's factors then apply to that profile, whatever
profile the run itself was predicted with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine
from hpctrain.model.kinds import compute_factors
from hpctrain.plan.stepfit import LayerSample, StepFit, communication_columns, fit, samples_of_run
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
        links = (1.0, 1.0, 1.0, 1.0)
        if step_fit is not None:
            scale.update(step_fit.compute)
            links = step_fit.links
        total = self.rest
        for s in self.samples:
            total += s.predicted * compute_factors(scale, s.kind)[int(s.backward)]
            total += float(np.dot(s.columns, links))
        return total


def priced(plan: MeasuredPlan, machine: Machine) -> PricedPlan:
    """``plan``'s samples priced on ``machine`` (see the module's text)."""
    from hpctrain.plan.pricing import CostModel

    def model_of(links: Machine) -> CostModel:
        return CostModel(plan.net, plan.batch, plan.procs, links, FlopModel(links.flops),
                         plan.itemsize)

    columns = communication_columns(model_of, plan.plans, machine)
    kinds = [layer.kind for layer in plan.net.layers] + [plan.net.loss.name]
    before = plan.profile.compute_scale if plan.profile is not None else {}
    recorded = np.stack([plan.predicted["forward_compute"], plan.predicted["backward_compute"]],
                        axis=1)
    base = recorded / np.array([compute_factors(before, kind) for kind in kinds])
    measured = np.stack([sum(plan.measured[f] for f in DIRECTION_FIELDS[d]) for d in (0, 1)],
                        axis=1)
    samples = samples_of_run(kinds, base, columns, measured)
    rows = float(recorded.sum() + communication(plan.predicted).sum())
    return PricedPlan(plan, samples, plan.iteration[0] - rows)


def refit(plans: list[MeasuredPlan], machine: Machine, source: str
          ) -> tuple[Machine, StepFit, list[PricedPlan]]:
    """``machine`` refitted to ``plans`` (``source`` names them in the profile), the fit, and
    each plan priced (to compare its iteration before and after)."""
    found = [priced(p, machine) for p in plans]
    step_fit = fit([s for p in found for s in p.samples], plans=len(plans))
    return step_fit.applied_to(machine, source), step_fit, found


def errors(found: list[PricedPlan], machine: Machine, step_fit: StepFit | None = None
           ) -> list[float]:
    """Each plan's iteration prediction error, predicted / measured − 1."""
    return [p.predicted(machine, step_fit) / p.plan.iteration[1] - 1 for p in found]
