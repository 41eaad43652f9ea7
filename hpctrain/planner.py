"""The per-layer plan of least predicted iteration time, found exactly by dynamic programming.

The network is a chain of segments (a conv or linear layer and the layers without weights that
follow it). The predicted iteration time is a sum of per-segment costs, which depend on the
segment's own choice of (mode, Pr×Pc), and of redistribution costs between consecutive segments,
which depend on both choices. Dynamic programming over the chain therefore finds the minimum
exactly: for each segment and choice, the cheapest way to reach it from any choice of the
previous segment. With S choices per segment (at most ~2·d(P) + 1, d(P) the number of divisors
of P) and L segments this costs O(L·S²) move costs, each O(1) after a per-pair cache.

With a memory cap the per-rank memory is a second sum over segments; the search then keeps, per
choice, every (time, memory) pair no other pair beats in both (a Pareto front), which is still
exact: the optimum under the cap extends some non-dominated prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpctrain.cost.model import Choice, CostModel, LayerCost
from hpctrain.errors import UserError
from hpctrain.net import WEIGHTED, NetSpec
from hpctrain.plan import LayerPlan


class PlannerError(UserError):
    """No plan fits: every choice breaks a split or the memory cap."""


@dataclass
class PlannedNetwork:
    """A plan with its predicted per-layer costs; ``layers`` in network order plus the loss."""

    plans: list[LayerPlan]
    layers: list[LayerCost]
    loss: LayerCost
    data: LayerCost  # producing the input batch

    @property
    def iteration_time(self) -> float:
        return sum(layer.total for layer in [*self.layers, self.loss, self.data])

    @property
    def memory(self) -> float:
        return sum(layer.memory for layer in self.layers)

    def totals(self) -> dict[str, float]:
        every = [*self.layers, self.loss, self.data]
        return {"compute": sum(sum(c.compute) for c in every),
                "communication": sum(sum(c.comm) for c in every),
                "redistribution": sum(sum(c.redistribution) for c in every)}


@dataclass
class _Label:
    time: float
    memory: float
    back: tuple[Choice, int] | None  # (previous segment's choice, its label index)


def _pareto(labels: list[_Label], cap: float | None) -> list[_Label]:
    """The labels under the cap that no other label beats in both time and memory."""
    if cap is None:  # memory does not constrain: the fastest is all we need
        return [min(labels, key=lambda l: l.time)] if labels else []
    front: list[_Label] = []
    for label in sorted((l for l in labels if l.memory <= cap), key=lambda l: (l.time, l.memory)):
        if not front or label.memory < front[-1].memory:
            front.append(label)
    return front


def evaluate(model: CostModel, choices: list[Choice]) -> PlannedNetwork:
    """Predicted costs of the plan that gives segment k the choice ``choices[k]``."""
    layers = model.prelude_costs()
    previous = model.prelude_layout()
    data = model.input_cost(model.input_layout(choices[0]))
    for segment, choice in enumerate(choices):
        cost = model.segment_cost(segment, choice)
        first = replace(cost.layers[0])  # a copy: the cached one stays clean
        if previous is not None:
            first.move, *moved = model.move_cost(previous, cost.in_layout)
            first.redistribution = tuple(moved)
        layers += [first, *cost.layers[1:]]
        previous = cost.out_layout
    kind, forward, backward = model.loss_cost(previous)
    loss = LayerCost("loss", "softmax", "follow", previous.grid, redistribution=(forward,
                                                                                backward),
                     move=kind)
    return PlannedNetwork(_layer_plans(model, choices), layers, loss, data)


def _layer_plans(model: CostModel, choices: list[Choice]) -> list[LayerPlan]:
    by_layer = {model.segments[k][0]: c for k, c in enumerate(choices)}
    return [LayerPlan(l.name, by_layer[k].mode, by_layer[k].grid) if k in by_layer
            else LayerPlan(l.name, "follow") for k, l in enumerate(model.net.layers)]


def choices_of(model: CostModel, plans: list[LayerPlan]) -> list[Choice]:
    """The segment choices a per-layer plan makes (Pr = 1 in any mode is batch)."""
    return [Choice(plans[seg[0]].mode, plans[seg[0]].grid) for seg in model.segments]


def iteration_flops(net: NetSpec, batch: int, kinds: tuple[str, ...] | None = None) -> float:
    """FLOPs of one iteration's kernels at the whole ``batch`` (forward and backward, without
    the optimizer's update); only layers of ``kinds`` when given (e.g. the GEMM ones)."""
    from hpctrain.cost.compute import FlopModel
    from hpctrain.cost.machine import Machine

    # P = 1 has one choice per layer, batch on 1×1: every kernel at the whole batch
    model = CostModel(net, batch, 1, Machine("flops", 1.0, 1.0, 1.0), FlopModel(1.0))
    planned = evaluate(model, [Choice("batch", (1, 1))] * len(model.segments))
    return sum(sum(c.work.flops()) for c in planned.layers
               if c.work is not None and (kinds is None or c.work.kind in kinds))


def predict(model: CostModel, plan: list[LayerPlan] | None,
            mem_per_rank: float | None = None) -> PlannedNetwork:
    """``plan`` with its predicted costs, or (``plan`` None) the plan the planner picks."""
    if plan is None:
        return plan_network(model, mem_per_rank)
    return evaluate(model, choices_of(model, plan))


def plan_network(model: CostModel, mem_per_rank: float | None = None) -> PlannedNetwork:
    """The plan of least predicted iteration time (under ``mem_per_rank`` bytes, if given)."""
    candidates = [model.choices(k) for k in range(len(model.segments))]
    for k, found in enumerate(candidates):
        if not found:
            name = model.net.layers[model.segments[k][0]].name
            raise PlannerError(f"layer {name} cannot be split on {model.procs} processes at "
                               f"batch {model.batch}; raise --batch or use fewer processes")
    model.prefetch(candidates)
    base_memory = sum(c.memory for c in model.prelude_costs())
    previous_layout = model.prelude_layout()
    fronts: list[dict[Choice, list[_Label]]] = []
    for segment, segment_choices in enumerate(candidates):
        front: dict[Choice, list[_Label]] = {}
        for choice in segment_choices:
            cost = model.segment_cost(segment, choice)
            labels = []
            if segment == 0:
                move = (model.move_cost(previous_layout, cost.in_layout)
                        if previous_layout is not None else ("identity", 0.0, 0.0))
                data = model.input_cost(model.input_layout(choice)).total
                labels.append(_Label(cost.total + move[1] + move[2] + data,
                                     base_memory + cost.memory, None))
            else:
                for before, before_labels in fronts[-1].items():
                    out = model.segment_cost(segment - 1, before).out_layout
                    _, forward, backward = model.move_cost(out, cost.in_layout)
                    for index, label in enumerate(before_labels):
                        labels.append(_Label(label.time + forward + backward + cost.total,
                                             label.memory + cost.memory, (before, index)))
            front[choice] = _pareto(labels, mem_per_rank)
        fronts.append(front)
    finals = []
    for choice, labels in fronts[-1].items():
        _, forward, backward = model.loss_cost(model.segment_cost(len(candidates) - 1,
                                                                  choice).out_layout)
        finals += [(label.time + forward + backward, choice, index)
                   for index, label in enumerate(labels)]
    if not finals:
        raise PlannerError(f"no plan fits in --mem-per-rank {mem_per_rank / 2**30:.3g} GiB; "
                           f"the smallest plan needs more: raise it or use more processes")
    _, choice, index = min(finals, key=lambda f: f[0])
    chosen = [choice]
    for segment in range(len(candidates) - 1, 0, -1):
        choice, index = fronts[segment][choice][index].back
        chosen.append(choice)
    return evaluate(model, chosen[::-1])


def format_plan(planned: PlannedNetwork) -> str:
    """The plan as a table: per layer, mode and grid, predicted ms and memory per rank."""
    header = (f"{'layer':<10} {'kind':<8} {'mode':<7} {'grid':<7} {'compute ms':>11} "
              f"{'comm ms':>9} {'redist ms':>10} {'fed by':<10} {'mem MiB':>9}")
    rows = [header]
    for c in [planned.data, *planned.layers, planned.loss]:
        grid = "" if c.mode == "follow" and c.kind not in WEIGHTED else f"{c.grid[0]}x{c.grid[1]}"
        rows.append(f"{c.layer:<10} {c.kind:<8} {c.mode:<7} {grid:<7} "
                    f"{sum(c.compute) * 1e3:>11.3f} {sum(c.comm) * 1e3:>9.3f} "
                    f"{sum(c.redistribution) * 1e3:>10.3f} {c.move:<10} {c.memory / 2**20:>9.1f}")
    t = planned.totals()
    rows.append(f"predicted iteration {planned.iteration_time * 1e3:.3f} ms = compute "
                f"{t['compute'] * 1e3:.3f} + communication {t['communication'] * 1e3:.3f} + "
                f"redistribution {t['redistribution'] * 1e3:.3f}; memory "
                f"{planned.memory / 2**20:.1f} MiB per rank")
    return "\n".join(rows)
