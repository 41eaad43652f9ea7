"""One plan at one point of a study, under the implementation-faithful model: its costs or why it
has none, and how a study's tables describe it (every weighted layer's mode and grid, and a count
per kind and kernel)."""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.layout.partition import SplitError
from hpctrain.model.net import NetSpec
from hpctrain.plan.planner import PlannedNetwork, evaluate
from hpctrain.plan.plans import LayerPlan
from hpctrain.plan.pricing import CostModel


@dataclass(frozen=True)
class Outcome:
    """One plan at one (B, P) under the implementation model: its costs, or why it has none."""

    planned: PlannedNetwork | None
    why_not: str = ""


def cost_choices(model: CostModel, choices: list[LayerPlan]) -> Outcome:
    """:func:`~hpctrain.plan.planner.evaluate` of ``choices``, or the first segment's reason it
    cannot run."""
    try:
        return Outcome(evaluate(model, choices))
    except SplitError as err:
        return Outcome(None, str(err))


def describe_plan(planned: PlannedNetwork) -> str:
    """``conv1=batch 1x512, conv2=model 2x256, …``: every weighted layer's mode and grid."""
    return ", ".join(f"{c.layer}={p.describe()}" for c, p in zip(planned.layers, planned.plans,
                                                                     strict=True)
                     if p.mode != "follow")


def summarise_plan(net: NetSpec, planned: PlannedNetwork) -> str:
    """How many weighted layers of each kind (convolutions per kernel shape, since a 1×1
    kernel needs no halo) chose each mode and grid, e.g. ``conv 1x1: 30 domain 8x512, 6 model
    8x512; conv 3x3: 16 domain 8x512; linear: 1 model 8x512``."""
    counts: dict[str, dict[str, int]] = {}
    for spec, plan in zip(net.layers, planned.plans, strict=True):
        if plan.mode == "follow":
            continue
        kernel = getattr(spec.options, "kernel", None)
        group = spec.kind if kernel is None else f"{spec.kind} {'x'.join(map(str, kernel))}"
        chosen = counts.setdefault(group, {})
        chosen[plan.describe()] = chosen.get(plan.describe(), 0) + 1
    return "; ".join(f"{group}: " + ", ".join(f"{n} {what}" for what, n in sorted(
        chosen.items(), key=lambda item: -item[1])) for group, chosen in counts.items())

