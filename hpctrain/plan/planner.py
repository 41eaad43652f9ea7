"""The per-layer plan of least predicted iteration time: exact by dynamic programming for a
chain, exact by variable elimination for a net with branches.

A chain (AlexNet, VGG) is a chain of segments (a conv or linear layer and the layers without
weights that follow it). The predicted iteration time is a sum of per-segment costs, which
depend on the segment's own choice of (mode, Pr×Pc), and of redistribution costs between
consecutive segments, which depend on both choices. Dynamic programming over the chain
therefore finds the minimum exactly: for each segment and choice, the cheapest way to reach it
from any choice of the previous segment. With S choices per segment (at most ~2·d(P) + 1, d(P)
the number of divisors of P) and L segments this costs O(L·S²) move costs, each O(1) after a
per-pair cache.

With a memory cap the per-rank peak memory is what every layer keeps (a sum over segments) plus
the largest of the layers' transients (a maximum over segments); the search then keeps, per
choice, every (time, kept, largest transient) triple no other triple beats in all three (a
Pareto front), which is still exact: both the sum and the maximum only grow as a prefix is
extended, so the optimum under the cap extends some non-dominated prefix. Candidates that do not
fit the cap on their own are dropped before any kernel is timed.

In a net with branches (ResNet, Inception) a move into an add's or concat's second input joins
segments that are not consecutive, which this dynamic programming does not cover. The time is
still a sum of tables over one or two segments' choices, minimised exactly by variable
elimination (``_exact_graph_plan``); under a memory cap the memory is a sum of such tables
plus the largest of their transients, and elimination keeps Pareto fronts of labels, as the
dynamic programming does. A net so densely connected that exact elimination would need a table
of more than 10⁷ entries gets the fastest plan with every weighted layer on one grid
(``_uniform_plan``), and says so.

One term of the time is not a sum over segments: the last bucket of gradient sums, the latency
of the slowest communicator the plan sums over (:mod:`hpctrain.plan.buckets`). The searches
above find the plan of least additive time; ``_search`` repeats them among the plans whose
communicators are all faster than that plan's slowest, until none can win, which keeps the
optimum exact with the term.
"""

from __future__ import annotations

import bisect
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from hpctrain.cost.memory import larger
from hpctrain.device.precision import PRECISIONS, Precision
from hpctrain.errors import UserError
from hpctrain.layout.layout import Layout
from hpctrain.layout.moves import Move
from hpctrain.layout.partition import SplitError, factorisations
from hpctrain.model.net import NetSpec
from hpctrain.plan.baselines import strategy_plan
from hpctrain.plan.buckets import least_with_last_buckets, slowest_latency
from hpctrain.plan.elimination import (
    MAX_ENTRIES,
    Table,
    TooLarge,
    largest_table,
    minimise,
    minimise_under_cap,
)
from hpctrain.plan.grouped import GroupedSpace
from hpctrain.plan.placement import LayerLayouts, input_layout, plan_layouts, schedule
from hpctrain.plan.plans import FOLLOW, LayerPlan, ranks_text
from hpctrain.plan.pricing import (
    CostModel,
    LayerCost,
    LayoutGrid,
    MovePrices,
    SegmentCost,
    time_with_free,
)
from hpctrain.plan.side_by_side import critical_path


class PlannerError(UserError):
    """No plan fits: every choice breaks a split or the memory cap."""


@dataclass
class PlannedNetwork:
    """A plan with its predicted per-layer costs; ``layers`` in network order plus the loss."""

    plans: list[LayerPlan]
    layers: list[LayerCost]
    loss: LayerCost
    data: LayerCost  # producing the input batch
    exact: bool = True  # False: the one-grid rule of a net too densely connected
    hidden_share: float = 0.0  # the cost model's: see :meth:`hidden_sums`
    # with sums that may hide: no plan is predicted faster than this (see plan_network)
    lower_bound: float | None = None
    precision: Precision = PRECISIONS["fp32"]  # the cost model's: what the bytes were priced in
    # layers on groups of ranks: the seconds their running side by side takes off the sum of
    # every step (:mod:`hpctrain.plan.side_by_side`), and which layers they are
    side_by_side: float = 0.0
    on_groups: frozenset[int] = frozenset()
    # the slowest communicator's last bucket, sent with the others when the backward ends
    # (:mod:`hpctrain.plan.buckets`): never hidden
    last_bucket: float = 0.0
    # under --space auto, which space was searched and why (hpctrain.plan.spaces)
    space_note: str = ""

    def __post_init__(self) -> None:
        for cost in (*self.layers, self.loss, self.data):
            cost.memory_found()  # a plan outlives the cost model that finds its memory

    @property
    def iteration_time(self) -> float:
        """Every layer's time, less what groups of ranks running side by side save and the
        gradient sums that hide behind the backward."""
        every = [*self.layers, self.loss, self.data]
        return (sum(layer.total for layer in every) + self.last_bucket - self.side_by_side
                - self.hidden_sums())

    def hidden_sums(self) -> float:
        """Seconds of gradient sums hidden behind the backward's compute, with sums in flight.

        The sums travel one after another, in the order the backward makes them (the
        reducer's buckets on one channel): layer j's backward (everything but its sum) drains
        what is queued, then its sum joins the queue. What is still queued when the backward
        ends, Q, is waited for, the rest was hidden:
        Q ← max(0, Q − b_j) + g_j over the layers from the last to the first, and the hidden
        time is the machine's share of Σ g_j − Q (share 0: every sum on the critical path,
        as where the ranks' own cores move the data). The sums of layers on groups of ranks
        are all counted: only the layers on every rank take part."""
        if not self.hidden_share:
            return 0.0
        queued = 0.0
        layers = self._on_every_rank()
        for c in reversed(layers):
            queued = max(0.0, queued - (c.compute[1] + c.comm[1] - c.grad_sum)) + c.grad_sum
            queued = max(0.0, queued - c.redistribution[1])  # the move below this layer
        return self.hidden_share * (sum(c.grad_sum for c in layers) - queued)

    def _on_every_rank(self) -> list[LayerCost]:
        return [c for k, c in enumerate(self.layers) if k not in self.on_groups]

    def time_with_sums_hidden(self) -> float:
        """The iteration time if the machine's share of every gradient sum (of the layers on
        every rank) were hidden: never more than :attr:`iteration_time`."""
        return self.time_with_free(self.hidden_share)

    def time_with_free(self, free: float) -> float:
        """The iteration time with ``free`` of each gradient sum of the layers on every rank
        counted free (what a search with ``free`` weighs)."""
        every = time_with_free([*self._on_every_rank(), self.loss, self.data], free)
        grouped = sum(c.total for k, c in enumerate(self.layers) if k in self.on_groups)
        return every + grouped + self.last_bucket - self.side_by_side

    @property
    def memory(self) -> float:
        """Peak bytes per rank — what every layer keeps, plus the largest transient."""
        every = [self.data, *self.layers, self.loss]
        return sum(c.memory for c in every) + max(c.peak for c in every)

    def biggest(self) -> tuple[str, str, float]:
        """(layer, what, bytes) of the largest single item of :attr:`memory`."""
        items = [(c.layer, what, n) for c in [self.data, *self.layers, self.loss]
                 for what, n in [*c.resident.items(), *c.transient.items()]]
        return max(items, key=lambda item: item[2])

    def totals(self) -> dict[str, float]:
        every = [*self.layers, self.loss, self.data]
        return {"compute": sum(sum(c.compute) for c in every),
                "communication": sum(sum(c.comm) for c in every) + self.last_bucket,
                "redistribution": sum(sum(c.redistribution) for c in every)}


@dataclass
class _Label:
    time: float
    memory: float  # bytes kept, summed over the segments so far
    peak: float  # the largest transient so far
    back: tuple[LayerPlan, int] | None  # (previous segment's choice, its label index)


def _pareto(labels: list[_Label], cap: float | None) -> list[_Label]:
    """The labels under the cap that no other label beats in time, memory and peak."""
    if cap is None:  # memory does not constrain: the fastest is all we need
        return [min(labels, key=lambda l: l.time)] if labels else []
    front: list[_Label] = []
    # the kept labels' (memory, peak) that no other kept label's beats in both: memory rising,
    # peak falling. Labels come in order of time, so a label is beaten iff the last step at or
    # below its memory has a peak at or below its own.
    memories: list[float] = []
    peaks: list[float] = []
    for label in sorted((l for l in labels if l.memory + l.peak <= cap),
                        key=lambda l: (l.time, l.memory, l.peak)):
        at = bisect.bisect_right(memories, label.memory)
        if at and peaks[at - 1] <= label.peak:
            continue
        front.append(label)
        end = at
        while end < len(memories) and peaks[end] >= label.peak:
            end += 1  # steps of more memory and no less peak: this label beats them
        memories[at:end], peaks[at:end] = [label.memory], [label.peak]
    return front


def _fed(model: CostModel, index: int, cost: LayerCost, moves: list[tuple[Layout, Layout]]
         ) -> LayerCost:
    """A copy of layer ``index``'s cost (the cached one stays clean) with the moves feeding it
    from other segments, (source, target) each: their time and their memory."""
    fed = cost.for_layer(cost.layer)
    for source, target in moves:
        move, *moved = model.move_cost(source, target)
        if move.moves_data or not fed.move.moves_data:  # the table shows a move that runs
            fed.move = type(move)
        fed.redistribution = tuple(a + b for a, b in zip(fed.redistribution, moved,
                                                          strict=True))
        resident, transient = model.move_memory(source, target, index)
        for name, size in resident.items():  # two moved inputs are two arrays
            fed.resident[name] = fed.resident.get(name, 0.0) + size
        fed.transient = larger(fed.transient, transient)
    return fed


def evaluate(model: CostModel, choices: list[LayerPlan], timed: bool = True) -> PlannedNetwork:
    """Predicted costs of the plan that gives segment k the choice ``choices[k]``; ``timed``
    False: memory and moves only, no kernel timed (compute left at zero)."""
    net = model.net
    costs: dict[int, LayerCost] = {}
    layouts: dict[int, LayerLayouts] = {}
    for segment, choice in enumerate(choices):
        cost = model.segment_cost(segment, choice, timed)
        costs.update(zip(model.segments[segment], cost.layers, strict=True))
        layouts.update(zip(model.segments[segment], cost.layouts, strict=True))
    source = model.input_layout(choices[0])
    data = model.input_cost(source, timed)
    moves: dict[int, list[tuple[Layout, Layout]]] = {}
    for k, e, p in model.joins:
        moves.setdefault(k, []).append((source if p < 0 else layouts[p].output,
                                        layouts[k].inputs[e]))
    layers = [_fed(model, k, costs[k], moves[k]) if k in moves else costs[k]
              for k in range(len(net.layers))]
    loss = model.loss_cost(layouts[len(net.layers) - 1].output)
    return PlannedNetwork(_layer_plans(model, choices), layers, loss, data,
                          hidden_share=model.hidden_share, precision=model.precision,
                          last_bucket=slowest_latency(layers))


def evaluate_plan(model: CostModel, plan: list[LayerPlan], timed: bool = True
                  ) -> PlannedNetwork:
    """Predicted costs of the per-layer ``plan`` (:func:`evaluate`, or for a plan that puts
    layers on groups of ranks :func:`evaluate_placed`)."""
    if any(entry.ranks is not None for entry in plan):
        return evaluate_placed(model, plan, timed)
    return evaluate(model, choices_of(model, plan), timed)


def evaluate_placed(model: CostModel, plan: list[LayerPlan], timed: bool = True
                    ) -> PlannedNetwork:
    """Predicted costs of the per-layer ``plan`` from the layouts the network runs on
    (:func:`~hpctrain.plan.placement.plan_layouts`), layer by layer, each layer with the moves
    into it; the time the critical path of the schedule's steps on their ranks
    (:mod:`hpctrain.plan.side_by_side`). Any plan, with or without groups of ranks: without,
    the same costs as :func:`evaluate`."""
    net, procs = model.net, model.procs
    layouts = plan_layouts(net, plan, model.batch, procs)
    source = input_layout(net, plan, model.batch, procs)

    def fed(k: int) -> list[Layout]:
        return [source if p < 0 else layouts[p].output for p in net.producers(k)]

    costs = []
    for k, (entry, where) in enumerate(zip(plan, layouts, strict=True)):
        sources = fed(k)
        cost = model.layer_cost(k, entry.mode, where, sources[0])
        if len(sources) > 1:
            cost = _fed(model, k, cost, list(zip(sources[1:], where.inputs[1:], strict=True)))
        costs.append(cost)
    if timed:
        model.time_layers(costs)
    data, loss = model.input_cost(source, timed), model.loss_cost(layouts[-1].output)
    steps = []
    for step in schedule(net, layouts, source):
        k = step.layer
        if step.input is None:
            c = costs[k]
            steps.append((_blocks(layouts[k].output), c.compute[0] + c.comm[0],
                          c.compute[1] + c.comm[1]))
        else:
            src, dst = fed(k)[step.input], layouts[k].inputs[step.input]
            _, forward, backward = model.move_cost(src, dst)
            steps.append((_blocks(src) + _blocks(dst), forward, backward))
    every = sum(f + b for _, f, b in steps)
    forward, backward = critical_path(steps, procs)
    on_groups = frozenset(k for k, where in enumerate(layouts) if where.output.on_group)
    return PlannedNetwork(list(plan), costs, loss, data, hidden_share=model.hidden_share,
                          precision=model.precision,
                          side_by_side=max(0.0, every - forward - backward),
                          on_groups=on_groups, last_bucket=slowest_latency(costs))


def _blocks(layout: Layout) -> tuple[tuple[int, int], ...]:
    """The block of ranks ``layout`` lies on, as :func:`critical_path` takes it."""
    return ((layout.first, layout.size),)


def _layer_plans(model: CostModel, choices: list[LayerPlan]) -> list[LayerPlan]:
    by_layer = dict(zip(model.heads, choices, strict=True))
    return [by_layer.get(k, FOLLOW) for k in range(len(model.net.layers))]


def choices_of(model: CostModel, plans: list[LayerPlan]) -> list[LayerPlan]:
    """The segment choices a per-layer plan makes (Pr = 1 in any mode is batch)."""
    return [plans[head] for head in model.heads]


def serial_layers(net: NetSpec, batch: int) -> list[LayerCost]:
    """Every layer of ``net`` on one process at the whole ``batch``: its work (shapes) and its
    memory, priced by FLOPs (P = 1 has one choice per layer, batch on 1×1)."""
    from hpctrain.cost.compute import FlopModel
    from hpctrain.cost.machine import Machine

    model = CostModel(net, batch, 1, Machine("flops", 1.0, 1.0, 1.0), FlopModel(1.0))
    return evaluate(model, [LayerPlan("batch", (1, 1))] * len(model.segments)).layers


def iteration_flops(net: NetSpec, batch: int, kinds: tuple[str, ...] | None = None) -> float:
    """FLOPs of one iteration's kernels at the whole ``batch`` (forward and backward, without
    the optimizer's update); only layers of ``kinds`` when given (e.g. the GEMM ones)."""
    return sum(sum(c.work.flops()) for c in serial_layers(net, batch)
               if c.work is not None and (kinds is None or c.work.op.name in kinds))


def plan_memory(net: NetSpec, plan: list[LayerPlan], batch: int, procs: int,
                precision: Precision = PRECISIONS["fp32"], inference: bool = False,
                optimizer: str = "sgd", accumulate: int = 1) -> PlannedNetwork:
    """``plan``'s memory per rank (and its moves) in ``precision``, arithmetic only: no kernel
    is timed, so it is safe at any size. Its times are zero. ``inference``: a forward pass
    alone; ``optimizer`` and ``accumulate``: the run's, whose state each parameter keeps."""
    from hpctrain.cost.compute import FlopModel
    from hpctrain.cost.machine import Machine

    model = CostModel(net, batch, procs, Machine("memory", 0.0, 0.0, 1.0), FlopModel(1.0),
                      precision, inference=inference, optimizer=optimizer,
                      accumulate=accumulate)
    return evaluate_plan(model, plan, timed=False)


def _fits(model: CostModel, candidates: list[list[LayerPlan]], cap: float,
          cap_source: str) -> list[list[LayerPlan]]:
    """The candidates that may be part of a plan under ``cap`` (:func:`fitting_choices`);
    refuses at once when a segment has none, or when no combination can fit."""
    for k, found in enumerate(candidates):
        if not found:  # nothing of this space runs there (another space may)
            raise PlannerError(f"layer {model.net.layers[model.heads[k]].name} has no plan "
                               f"in this space")
    kept = fitting_choices(model, candidates, cap)
    if not all(kept):  # the leanest plan of all says what the cap would need
        _refuse_cap(model, cap, _leanest(model, candidates), cap_source)
    leanest = _leanest(model, kept)
    if sum(model.segment_cost(k, c, timed=False).memory for k, c in enumerate(leanest)) > cap:
        _refuse_cap(model, cap, leanest, cap_source)  # none fits together
    return kept


def leanest_fitting(model: CostModel, cap: float, space: str = "grids"
                    ) -> PlannedNetwork | None:
    """A plan of ``space`` that fits under ``cap``, found by arithmetic alone (nothing timed):
    each segment's leanest choice among those that may fit (:func:`fitting_choices`), when
    that plan's peak is within the cap; None otherwise (no choice fits some segment, or the
    leanest together do not). Some plan fits whenever it gives one, so the planner's search
    under ``cap`` finds a plan; it may give None where a plan of other choices would fit."""
    candidates = [model.choices(k) for k in range(len(model.segments))]
    if space != "grids":
        candidates = [found + model.split_choices(k, space)
                      for k, found in enumerate(candidates)]
    kept = fitting_choices(model, candidates, cap)
    if not all(kept):
        return None
    planned = evaluate(model, _leanest(model, kept), timed=False)
    return planned if planned.memory <= cap else None


def fitting_choices(model: CostModel, candidates: list[list[LayerPlan]], cap: float
                    ) -> list[list[LayerPlan]]:
    """Per segment, the candidates whose own memory and peak, with the least memory of the
    segments before, fit under ``cap``: no plan through another fits. Arithmetic only, nothing
    timed, so it goes before any kernel is (a whole-batch kernel may not fit in memory at
    all); a segment may be left with none."""
    base = 0.0
    kept = []
    for k, found in enumerate(candidates):
        costs = {c: model.segment_cost(k, c, timed=False) for c in found}
        fitting = [c for c in found if base + costs[c].memory + costs[c].peak <= cap]
        kept.append(fitting)
        base += min((costs[c].memory for c in fitting), default=0.0)
    return kept


def fitting_apart(model: CostModel, grids: list[list[LayerPlan]], wider: list[list[LayerPlan]],
                  cap: float) -> tuple[list[list[LayerPlan]], list[list[LayerPlan]]]:
    """``grids`` and ``wider`` less the choices no plan under ``cap`` can take
    (:func:`fitting_choices` over both together); a segment may keep none."""
    every = [a + b for a, b in zip(grids, wider, strict=True)]
    kept = [set(found) for found in fitting_choices(model, every, cap)]
    return ([[c for c in found if c in fit] for found, fit in zip(grids, kept, strict=True)],
            [[c for c in found if c in fit] for found, fit in zip(wider, kept, strict=True)])


def _leanest(model: CostModel, candidates: list[list[LayerPlan]]) -> list[LayerPlan]:
    """The plan of ``candidates`` (one choice per segment) that needs the least memory per rank,
    what a refusal reports. A plan needs what its layers keep plus the largest transient of
    any, so the least is found over every bound T on the transient: the plan keeping least
    with no transient above T, plus T, is at least that plan's need and, at T the leanest
    plan's largest transient, at most the leanest plan's: the least over T is the leanest.
    On a chain the plan keeping least under T is found exactly, by dynamic programming over the
    segments (a segment's first layer carries the move from the one before); elsewhere each
    segment's choice keeping least, its moves priced as the plan is evaluated. Choosing by
    what each segment keeps alone named plans whose one large transient (a whole-batch GEMM
    result) made them 3 times the leanest."""
    if model.net.is_chain():
        return _leanest_chain(model, candidates)
    costs = [{c: model.segment_cost(k, c, timed=False) for c in found}
             for k, found in enumerate(candidates)]
    tried: dict[tuple, float] = {}
    for bound in sorted({cost.peak for found in costs for cost in found.values()}):
        choices = []
        for found in costs:
            under = [c for c, cost in found.items() if cost.peak <= bound]
            if not under:
                break
            choices.append(min(under, key=lambda c, found=found: found[c].memory))
        else:
            tried.setdefault(tuple(choices), evaluate(model, choices, timed=False).memory)
    return list(min(tried, key=tried.get))


def _leanest_chain(model: CostModel, candidates: list[list[LayerPlan]]) -> list[LayerPlan]:
    """:func:`_leanest` on a chain, exactly: per bound on the transient, the least kept by
    dynamic programming over the segments, as the search prices them (input, moves, loss),
    arithmetic only (nothing is timed). Bounds are tried from the least up, and stop where the
    bound alone, with the least any plan keeps, reaches the leanest found."""
    last = len(candidates) - 1
    whole = [[model.segment_cost(k, c, timed=False) for c in found]
             for k, found in enumerate(candidates)]
    data = [model.input_cost(model.input_layout(c), timed=False) for c in candidates[0]]
    loss = [model.loss_cost(cost.out_layout, timed=False) for cost in whole[last]]
    # per segment: the memory and peak of its choices, apart from its first layer after the
    # first segment (that layer carries the move from the one before: per pair, in ``fed``)
    kept = [np.array([d.memory + c.memory for d, c in zip(data, whole[0], strict=True)])]
    peak = [np.array([max(d.peak, c.peak) for d, c in zip(data, whole[0], strict=True)])]
    fed_kept, fed_peak = [None], [None]
    for k in range(1, len(candidates)):
        kept.append(np.array([sum(x.memory for x in c.layers[1:]) for c in whole[k]]))
        peak.append(np.array([max((x.peak for x in c.layers[1:]), default=0.0)
                              for c in whole[k]]))
        pairs = [[_fed(model, model.heads[k], c.layers[0], [(b.out_layout, c.in_layout)])
                  for c in whole[k]] for b in whole[k - 1]]
        fed_kept.append(np.array([[x.memory for x in row] for row in pairs]))
        fed_peak.append(np.array([[x.peak for x in row] for row in pairs]))
    loss_kept = np.array([x.memory for x in loss])
    loss_peak = np.array([x.peak for x in loss])

    def least_kept(bound: float) -> tuple[np.ndarray, list[np.ndarray]]:
        """Per last choice, the least kept with no transient above ``bound``, and per segment
        the choice before each (for the way back)."""
        front = np.where(peak[0] <= bound, kept[0], np.inf)
        back = []
        for k in range(1, len(candidates)):
            ways = np.where(fed_peak[k] <= bound, front[:, None] + fed_kept[k], np.inf)
            back.append(np.argmin(ways, axis=0))
            front = np.where(peak[k] <= bound, ways.min(axis=0) + kept[k], np.inf)
        return np.where(loss_peak <= bound, front + loss_kept, np.inf), back

    floor = float(least_kept(math.inf)[0].min())
    bounds = np.unique(np.concatenate([p.ravel() for p in (*peak, *fed_peak[1:], loss_peak)]))
    best, best_need = None, math.inf
    for bound in bounds:
        if floor + bound >= best_need:
            break  # no plan with a transient this large needs less
        totals, back = least_kept(float(bound))
        choice = int(np.argmin(totals))
        if totals[choice] + bound < best_need:
            best_need, path = float(totals[choice] + bound), [choice]
            for k in range(len(candidates) - 1, 0, -1):
                path.append(int(back[k - 1][path[-1]]))
            best = [candidates[k][c] for k, c in enumerate(path[::-1])]
    if best is None:  # no plan at all: each segment's choice keeping least
        return [found[int(np.argmin([c.memory for c in costs]))]
                for found, costs in zip(candidates, whole, strict=True)]
    return best


def _refuse_cap(model: CostModel, cap: float, choices: list[LayerPlan], cap_source: str) -> None:
    _refuse(evaluate(model, choices, timed=False), cap, cap_source)


def _refuse(planned: PlannedNetwork, cap: float, cap_source: str) -> None:
    """Refuse a cap that even ``planned``, the leanest plan found, does not fit."""
    from hpctrain.io.units import format_bytes

    layer, what, size = planned.biggest()
    raise PlannerError(f"no plan fits in {cap_source} = {format_bytes(cap)} per rank: even "
                       f"the leanest needs {format_bytes(planned.memory)}, {layer} {what} alone "
                       f"{format_bytes(size)}; use a smaller --batch or --image-size, more "
                       f"processes, or raise --mem-per-rank if the memory is there")


SPACES = ("grids", "balanced", "axes")
"""What the planner can search, smallest first. ``grids`` (the 1.5D modes on every Pr×Pc grid
alone), ``balanced`` (those and the balanced splits of every axis,
:func:`~hpctrain.plan.segments.balanced_degrees`) and ``axes`` (those and every split: a degree
for every axis of each weighted layer's output, and replicas)."""


WHOLE_SPACE_PAIRS = 6_000_000
"""The most pairs of choices at the two ends of the net's joins that ``--space axes`` takes on
(about 10 µs each to price, a few seconds per million on one core); beyond, the whole space
would take minutes to hours and the planner refuses it, naming ``balanced``."""


def plan_network(model: CostModel, mem_per_rank: float | None = None,
                 cap_source: str = "--mem-per-rank", space: str = "grids",
                 groups: bool = False, on_bound: Callable[[float], None] | None = None
                 ) -> PlannedNetwork:
    """The plan of least predicted iteration time (under ``mem_per_rank`` bytes of peak memory
    per rank, if given; ``cap_source`` says where the cap came from, for the refusal), over the
    search ``space`` (:data:`SPACES`; ``--space auto`` chooses one:
    :mod:`hpctrain.plan.spaces`).

    Over ``balanced`` or ``axes`` the 1.5D plans are searched first, exactly; their optimum t*
    bounds the rest. A split c of segment s enters the search only if a lower bound on every
    plan through it (``_lower_bounds``) does not exceed t*. The search over what is left is
    exact as before, so the plan is the optimum over the space (a tie may keep the 1.5D plan).
    The second search, with sums that may hide (below), is bounded so by the first's plan, a
    plan of the same space, instead. Under a memory cap that no 1.5D plan fits, nothing
    bounds the rest and every split that fits on its own enters. A space whose search would
    price too many pairs or build too large a table is refused before anything is priced,
    naming a smaller one.

    Where gradient sums may hide behind the backward (``--overlap`` on a machine whose
    network moves data by itself), the time is no longer a sum over segments: how much of a
    sum hides depends on the layers below it. Two exact searches bracket the optimum then:
    one counting every sum, one counting the hideable share of every sum as free. Each plan
    found is priced as executed (:meth:`PlannedNetwork.hidden_sums`) and the faster kept; the
    second search's optimum is a lower bound on every plan's time (hiding never beats free),
    kept in ``lower_bound``, so the plan's distance from the best is known.

    With ``groups`` the search also weighs running each qualifying fork–join region's branches
    side by side on groups of ranks (:mod:`hpctrain.plan.grouped`), exactly with the rest, over
    the 1.5D grids (not the wider spaces: the bounds that prune them know nothing of groups).
    Under a memory cap the fastest plan with groups is kept when it fits the cap, which makes it
    the optimum under the cap too; when it does not, every branch runs on every rank (the
    memory labels know nothing of groups either).

    ``on_bound``, over a wider space with no cap, for a search wanted only where its plan beats
    one found elsewhere (run beside the 1.5D grids with groups: :mod:`hpctrain.plan.spaces`):
    the 1.5D search is left out, every split enters the first search (at scale t* prunes few:
    at 4096 ranks 1 of Inception-v3's 3,149 candidates on dgx-h100, 142 of ResNet-50's 2,912
    on cori-knl), and the first search's plan bounds the second as ever. With sums that may
    hide, the search counting their hideable share free goes first, and lower bounds on every
    plan's time are handed to ``on_bound`` as soon as they are found (where exact): its first
    round's least time without the last bucket, then its optimum. The caller need not wait for
    the rest to know that no plan of the space beats its own.
    """
    if space not in SPACES:
        raise ValueError(f"search space {space!r}; choose one of {', '.join(SPACES)}")
    candidates = [model.choices(k) for k in range(len(model.segments))]
    if space == "axes":
        _refuse_whole_space_if_too_many_pairs(model, candidates)
    wider = ([model.split_choices(k, space) for k in range(len(model.segments))]
             if space != "grids" else [[] for _ in candidates])
    if space != "grids":
        _refuse_space_if_too_large(model, [a + b for a, b in zip(candidates, wider,
                                                                 strict=True)], space)
    for k, found in enumerate(candidates):
        if not found and not wider[k]:
            raise PlannerError(_no_choice(model, k, space))

    def best(free: float, known: tuple[PlannedNetwork, ...] = (),
             on_first: Callable[[float], None] | None = None) -> PlannedNetwork:
        """The optimum over the space with ``free`` of each gradient sum counted free;
        ``known``: plans of the space found before (with another share counted free), whose
        times with ``free`` counted free bound it as the 1.5D plans' optimum would. Where
        they give the bound of a wider space with no cap, or ``on_bound`` leaves it out, the
        1.5D search is left out here."""
        found = None
        if any(wider) and mem_per_rank is None and (known or on_bound is not None):
            bound = min((p.time_with_free(free) for p in known), default=math.inf)
        else:
            try:
                grids = candidates
                if not all(grids):  # a layer no 1.5D mode splits: the splits alone may
                    raise PlannerError("a layer has no 1.5D plan")
                if mem_per_rank is not None:
                    grids = _fits(model, candidates, mem_per_rank, cap_source)
                found = _search(model, grids, mem_per_rank, cap_source, free,
                                groups and space == "grids")
            except PlannerError:
                if not any(wider):
                    raise
            if not any(wider):
                return found
            bound = math.inf if found is None else found.time_with_free(free)
        grids, more = candidates, wider
        if mem_per_rank is not None:  # time no kernel of a choice that cannot fit
            grids, more = fitting_apart(model, candidates, wider, mem_per_rank)
            if not all(a or b for a, b in zip(grids, more, strict=True)):
                _refuse_cap(model, mem_per_rank, _leanest(model, [
                    a + b for a, b in zip(candidates, wider, strict=True)]), cap_source)
        widened = _bounded(model, grids, more, bound, free)
        if widened == grids and found is not None:
            return found
        if mem_per_rank is not None:
            widened = _fits(model, widened, mem_per_rank, cap_source)
        return _search(model, widened, mem_per_rank, cap_source, free, upper=bound,
                       on_first=on_first)

    if on_bound is not None and model.hidden_share:
        hopeful = best(model.hidden_share, on_first=on_bound)
        if hopeful.exact:
            on_bound(hopeful.time_with_sums_hidden())
        counted = best(0.0, (hopeful,))
    else:
        counted = best(0.0)
        if not model.hidden_share:
            return counted
        hopeful = best(model.hidden_share, (counted,))
    best = min(counted, hopeful, key=lambda p: p.iteration_time)
    if counted.exact and hopeful.exact:
        best.lower_bound = hopeful.time_with_sums_hidden()
    return best


def _joined_segments(model: CostModel) -> list[tuple[int, int]]:
    """(source segment, target segment) of every join between two segments."""
    owner = {k: s for s, members in enumerate(model.segments) for k in members}
    return [(owner[p], owner[k]) for k, _, p in model.joins if p >= 0 and owner[p] != owner[k]]


def _refuse_whole_space_if_too_many_pairs(model: CostModel, grids: list[list[LayerPlan]]
                                          ) -> None:
    """Refuse ``--space axes`` where its search would price more than
    :data:`WHOLE_SPACE_PAIRS` pairs of choices, counted from the splits' degrees alone
    (before any is laid out or priced)."""
    count = [len(found) + len(model.candidate_splits(k, "axes"))
             for k, found in enumerate(grids)]
    pairs = sum(count[a] * count[b] for a, b in _joined_segments(model))
    if pairs > WHOLE_SPACE_PAIRS:
        _refuse_space(model, "axes", sum(count), f"{pairs:.1e} pairs of them to price")


def _refuse_space_if_too_large(model: CostModel, choices: list[list[LayerPlan]], space: str
                               ) -> None:
    """Refuse ``space`` where exact elimination over ``choices`` would need a larger table
    than it makes (:data:`~hpctrain.plan.elimination.MAX_ENTRIES`): known before any pricing."""
    if model.net.is_chain():
        return  # dynamic programming: no table beyond pairs
    sizes = [len(found) for found in choices]
    table = largest_table(sizes, [*_joined_segments(model), *((s,) for s in range(len(sizes)))])
    if table > MAX_ENTRIES:
        _refuse_space(model, space, sum(sizes), f"a table of {table:.1e} of their "
                                                 f"combinations to search")


def _refuse_space(model: CostModel, space: str, choices: int, size: str) -> None:
    from hpctrain.plan.segments import balanced_degrees

    instead = "--space grids"
    if space == "axes":
        balanced = sum(len(model.choices(k)) + len(balanced_degrees(model.procs,
                                                                     model.output_shape(k)))
                       for k in range(len(model.segments)))
        instead = (f"--space balanced (at most {balanced:,} choices: even blocks, spatial "
                   f"degrees within a factor of 2, searched exactly) or " + instead)
    raise PlannerError(
        f"--space {space}: the splits of every layer of {model.net.name} on {model.procs} "
        f"ranks are {choices:,} choices and {size}, more than an exact search takes on; use "
        f"{instead}, or price a plan of your own with --grid")


def _no_choice(model: CostModel, segment: int, space: str) -> str:
    """Why segment ``segment`` has no plan at all in ``space``: the reason each mode fails on
    the grid with the most batch ranks the batch allows (the fewest ranks left to cut the
    rest), and what would give it one."""
    layer = model.net.layers[model.heads[segment]]
    procs, batch = model.procs, model.batch
    pc = max(c for _, c in factorisations(procs) if c <= batch)
    tries = [LayerPlan("batch", (1, procs))]
    if pc < procs:
        tries += [LayerPlan(mode, (procs // pc, pc)) for mode in model.segment_kinds[
            segment].modes]
    reasons = []
    for choice in tries:
        try:
            model.runnable_layouts(segment, choice)
        except SplitError as err:
            reasons.append(f"{choice.describe()}: {str(err).split(': ', 2)[-1]}")
    advice = "raise --batch, or use fewer processes"
    if space == "grids":
        advice = "cut several axes at once with --space balanced, " + advice
    return (f"layer {layer.name} ({layer.kind}) has no plan on {procs} ranks at batch {batch} "
            f"in any mode on any grid; with at most {pc} batch ranks, "
            + "; ".join(reasons) + f". To run it: {advice}")


def _bounded(model: CostModel, candidates: list[list[LayerPlan]],
             wider: list[list[LayerPlan]], bound: float, free: float
             ) -> list[list[LayerPlan]]:
    """``candidates`` and the splits of ``wider`` that may beat ``bound``: those whose lower
    bound (:func:`_lower_bounds`) is at most ``bound`` (every one, none priced here, where the
    bound is infinite)."""
    if bound == math.inf:
        return [found + more for found, more in zip(candidates, wider, strict=True)]
    model.prefetch(wider)
    every = [found + more for found, more in zip(candidates, wider, strict=True)]
    lower = _lower_bounds(model, every, free)
    slack = bound * (1 + 1e-9)  # sums in another order may differ in the last bits
    return [candidates[k] + [c for i, c in enumerate(wider[k], start=len(candidates[k]))
                             if lower[k][i] <= slack]
            for k in range(len(candidates))]


def _lower_bounds(model: CostModel, every: list[list[LayerPlan]], free: float
                  ) -> list[list[float]]:
    """For each segment's each candidate (``every[k]``), a time no plan that gives the segment
    that candidate can beat.

    A plan's time is the segments' own costs (the first's with the input batch) plus the moves
    of the joins plus the loss, all ≥ 0. Each segment's own cost is carried by one join it
    feeds, so the time is a sum of one term per join, t(x_a, x_b) = own(x_a) + move(x_a, x_b),
    plus the own costs no join carries. A join between two segments is bounded with its move
    counted free: min over x_a of own(x_a) for every x_b, and at least own(x_a) with x_a
    fixed; a join inside one segment, whose choice decides both ends, with its move. A
    candidate's bound adds its own joins' terms so, every other join's least term over any
    choice, and every other uncarried own cost's least.

    The moves between segments are left to the searches, which price only those that may
    decide a plan. Priced here too, they pruned few more candidates and cost more than they
    saved: in the default plans at 4096 ranks, 7 to 12 % more of AlexNet's and VGG-16's
    candidates at 1.4 to 2 times as many moves priced, and 5 of ResNet-50's 2,912 and 8 of
    Inception-v3's 3,148 on dgx-h100, at 0.3 to 0.5 s more of a plan."""
    owner = {k: s for s, members in enumerate(model.segments) for k in members}
    owns = []
    for k, found in enumerate(every):
        row = []
        for choice in found:
            time = model.segment_cost(k, choice).time_with_free(free)
            if k == 0:  # the input batch, produced where the first segment reads it
                time += model.input_cost(model.input_layout(choice)).total
            row.append(time)
        owns.append(row)
    carried: set[int] = set()
    # the loss's move and cost, and producing the batch where it is needed, are ≥ 0: left out
    per_candidate = [[0.0] * len(found) for found in every]
    fixed = 0.0  # what every candidate's bound adds: the least of the terms and costs apart
    lows: list[tuple[int, int, list[float], list[float]]] = []
    for k, e, p in model.joins:
        a, b = (0 if p < 0 else owner[p]), owner[k]
        carries = p >= 0 and a != b and a not in carried
        if carries:
            carried.add(a)
        carry = owns[a] if carries else [0.0] * len(every[a])
        if a != b:
            lows.append((a, b, carry, [min(carry)] * len(every[b])))  # the move counted free
            continue
        into = []  # one segment's choice decides both ends: its move with it
        for i, choice in enumerate(every[b]):
            where = dict(zip(model.segments[b], model.runnable_layouts(b, choice), strict=True))
            source = model.input_layout(choice) if p < 0 else where[p].output
            into.append(carry[i] + sum(model.move_cost(source, where[k].inputs[e])[1:]))
        lows.append((b, b, into, into))
    uncarried = [k for k in range(len(every)) if k not in carried]
    for a, b, out_of, into in lows:
        least = min(into)
        fixed += least
        for j, value in enumerate(into):
            per_candidate[b][j] += value - least
        if a != b:  # the source's own cost it carries, whatever it feeds
            for i, value in enumerate(out_of):
                per_candidate[a][i] += max(value, least) - least
    for k in uncarried:
        least = min(owns[k])
        fixed += least
        for i, value in enumerate(owns[k]):
            per_candidate[k][i] += value - least
    return [[fixed + extra for extra in row] for row in per_candidate]


def _search(model: CostModel, candidates: list[list[LayerPlan]], mem_per_rank: float | None,
            cap_source: str, free: float, groups: bool = False, upper: float = math.inf,
            on_first: Callable[[float], None] | None = None) -> PlannedNetwork:
    """The plan least in time with ``free`` of every gradient sum counted free (0: the
    predicted time itself), exactly, the last bucket included: :func:`_additive_search`,
    repeated among the plans whose communicators are all faster than the slowest of the plan
    found before (:func:`~hpctrain.plan.buckets.least_with_last_buckets`). ``upper``: the time
    of a plan among the candidates, which no plan worth finding exceeds (it prunes the search
    of a chain). ``on_first`` is handed the first round's least time without the last bucket,
    where that round is exact: no plan of the candidates has less."""
    latencies: list[list[float]] = []  # each candidate's, read once for all the rounds

    def search(below: float, under: float) -> PlannedNetwork | None:
        if below == math.inf:
            first = _additive_search(model, candidates, mem_per_rank, cap_source, free, groups,
                                     upper=upper)
            if on_first is not None and first.exact:
                on_first(first.time_with_free(free) - first.last_bucket)
            return first
        if not latencies:
            latencies.extend([model.segment_cost(k, c, timed=False).slowest_latency
                              for c in found] for k, found in enumerate(candidates))
        allowed = [[c for c, latency in zip(found, row, strict=True) if latency < below]
                   for found, row in zip(candidates, latencies, strict=True)]
        if not all(allowed):
            return None
        try:
            return _additive_search(model, allowed, mem_per_rank, cap_source, free, groups,
                                    below, min(upper, under))
        except PlannerError:  # none of them fits the memory cap
            return None

    return least_with_last_buckets(search, lambda p: p.time_with_free(free) - p.last_bucket,
                                   lambda p: p.last_bucket)


def _additive_search(model: CostModel, candidates: list[list[LayerPlan]],
                     mem_per_rank: float | None, cap_source: str, free: float,
                     groups: bool = False, below: float = math.inf, upper: float = math.inf
                     ) -> PlannedNetwork:
    """The plan least in time with ``free`` of every gradient sum counted free, without the
    last buckets (every layer's own price: a sum over segments), exactly (see the module's
    docstring); with ``groups``, regions on groups of ranks among the plans
    (:func:`_grouped_plan`), whose branches' communicators are faster than ``below`` too. Under a
    memory cap the fastest plan with groups is taken when it fits (then nothing under the cap
    beats it); otherwise every branch runs on every rank.

    A chain is searched by dynamic programming over the segments, keeping per choice the
    partial plans (labels) that no other beats in time, memory and peak. A label whose time,
    with the least each later segment can add, exceeds ``upper`` (a known plan's time), or
    whose memory, with the least each later segment keeps, exceeds the cap, can lead to no plan
    worth finding and is dropped: under a tight cap a wide space would otherwise keep thousands
    of labels per choice. A graph's elimination finds its least sum before it lays out and
    prices the plan: above ``upper`` there is no plan to evaluate (a round of the last buckets
    that cannot win, :mod:`~hpctrain.plan.buckets`). Either way :class:`PlannerError` where no
    plan is left. Every candidate is timed in the first round (``below`` infinite), which
    :func:`_search` always runs before the others."""
    upper *= 1 + 1e-9  # sums in another order may differ in the last bits
    if below == math.inf:  # a later round's candidates (below < inf: rounds 2 on of
        model.prefetch(candidates)  # _search) are among the first's, timed then
    if not model.net.is_chain():
        if groups:
            grouped = _grouped_plan(model, candidates, free, below, upper)
            if mem_per_rank is None or grouped.memory <= mem_per_rank:
                return grouped
        return _exact_graph_plan(model, candidates, mem_per_rank, cap_source, free, upper)
    later_time, later_memory = _least_after(model, candidates, free, mem_per_rank is not None)
    if mem_per_rank is None and _heads_fed_from_outside(model, candidates):
        return _fastest_chain(model, candidates, free, later_time, upper)
    fronts: list[dict[LayerPlan, list[_Label]]] = []
    for segment, segment_choices in enumerate(candidates):
        front: dict[LayerPlan, list[_Label]] = {}
        for choice in segment_choices:
            cost = model.segment_cost(segment, choice)
            rest_memory = sum(c.memory for c in cost.layers[1:])
            rest_peak = max((c.peak for c in cost.layers[1:]), default=0.0)
            own = cost.time_with_free(free)
            labels = []
            if segment == 0:  # everything up to its head is in it, fed where it reads
                data = model.input_cost(model.input_layout(choice))
                labels.append(_Label(own + data.total,
                                     data.memory + cost.memory, max(data.peak, cost.peak),
                                     None))
            else:
                for before, before_labels in fronts[-1].items():
                    if not before_labels or (before_labels[0].time + own
                                             + later_time[segment] > upper):
                        continue  # its fastest label (fronts are sorted by time) is too slow
                    first = _fed(model, model.heads[segment], cost.layers[0], [(
                        model.segment_cost(segment - 1, before).out_layout, cost.in_layout)])
                    moved = sum(first.redistribution) + own
                    for index, label in enumerate(before_labels):
                        labels.append(_Label(
                            label.time + moved,
                            label.memory + first.memory + rest_memory,
                            max(label.peak, first.peak, rest_peak), (before, index)))
            labels = [label for label in labels
                      if label.time + later_time[segment] <= upper
                      and (mem_per_rank is None or label.memory + label.peak
                           + later_memory[segment] <= mem_per_rank)]
            front[choice] = _pareto(labels, mem_per_rank)
        fronts.append(front)
    finals = []
    for choice, labels in fronts[-1].items():
        loss = model.loss_cost(model.segment_cost(len(candidates) - 1, choice).out_layout)
        for index, label in enumerate(labels):
            peak = label.memory + loss.memory + max(label.peak, loss.peak)
            if mem_per_rank is None or peak <= mem_per_rank:
                finals.append((label.time + loss.total, choice, index))
    if not finals and mem_per_rank is None:  # only ``upper`` can leave none
        raise PlannerError("no plan of these candidates is faster than the one known")
    if not finals:
        _refuse_cap(model, mem_per_rank, _leanest(model, candidates), cap_source)
    _, choice, index = min(finals, key=lambda f: f[0])
    chosen = [choice]
    for segment in range(len(candidates) - 1, 0, -1):
        choice, index = fronts[segment][choice][index].back
        chosen.append(choice)
    return evaluate(model, chosen[::-1])


def _heads_fed_from_outside(model: CostModel, candidates: list[list[LayerPlan]]) -> bool:
    """Whether every head after the first is priced with no move into it (the move from the
    segment before is added by the search): what :func:`_fastest_chain` takes for granted."""
    return all(model.segment_cost(k, c).layers[0].redistribution == (0.0, 0.0)
               for k in range(1, len(candidates)) for c in candidates[k])


def _fastest_chain(model: CostModel, candidates: list[list[LayerPlan]], free: float,
                   later_time: list[float], upper: float) -> PlannedNetwork:
    """The plan of a chain that the labels of :func:`_additive_search` find with no memory
    cap, the same one, ties included, with the same sums in the same order.

    With no cap a choice keeps one label, its fastest partial plan, and memory decides
    nothing, so a segment is a matrix: the time of reaching each choice (a column) from each
    choice before it (a row) is the row's time plus the move between their layouts plus the
    choice's own, and the column keeps its first least row, as ``min`` over the labels in
    order does. Many choices share a layout at either end, so the moves are priced per pair
    of distinct layouts (:func:`_move_grid`, once per model), and only where the labels would
    price them: a row whose time with the column's own and the least the later segments add
    already exceeds ``upper`` is never priced, and drops out as its labels do."""
    times: np.ndarray = np.empty(0)  # each choice's time before, inf: no label
    backs: list[np.ndarray] = []  # each choice's row in the segment before
    costs: list[SegmentCost] = []
    for segment, found in enumerate(candidates):
        before_costs, costs = costs, [model.segment_cost(segment, choice) for choice in found]
        own = np.array([cost.time_with_free(free) for cost in costs])
        if segment == 0:  # everything up to its head is in it, fed where it reads
            data = np.array([model.input_cost(model.input_layout(c)).total for c in found])
            reached = own + data
            fastest = np.where(reached + later_time[0] <= upper, reached, math.inf)
        else:
            src_of, srcs = _distinct_layouts([cost.out_layout for cost in before_costs])
            dst_of, dsts = _distinct_layouts([cost.in_layout for cost in costs])
            rows, cols = np.asarray(src_of), np.asarray(dst_of)
            # the pairs the labels would price: a finite row fast enough for the column
            priced = (np.isfinite(times)[:, None]
                      & ((times[:, None] + own[None, :]) + later_time[segment] <= upper))
            moves = np.full((len(srcs), len(dsts)), np.nan)
            price = partial(_move_grid, model, srcs, dsts, model.heads[segment], False)
            needed = _worth_pricing(times, own, priced, rows, cols, moves, later_time[segment],
                                    upper, price)
            reached = times[:, None] + (moves[np.ix_(rows, cols)] + own[None, :])
            reached = np.where(needed & (reached + later_time[segment] <= upper), reached,
                               math.inf)
            back = np.argmin(reached, axis=0)  # the first least row, as min over labels
            backs.append(back)
            fastest = reached[back, np.arange(len(found))]
        times = fastest
    last = len(candidates) - 1
    finals = [(time + model.loss_cost(model.segment_cost(last, choice).out_layout).total, i)
              for i, (choice, time) in enumerate(zip(candidates[last], times, strict=True))
              if np.isfinite(time)]
    if not finals:  # only ``upper`` can leave none
        raise PlannerError("no plan of these candidates is faster than the one known")
    _, index = min(finals, key=lambda f: f[0])
    chosen = [index]
    for back in reversed(backs):
        chosen.append(int(back[chosen[-1]]))
    return evaluate(model, [found[i] for found, i in zip(candidates, chosen[::-1], strict=True)])


def _worth_pricing(times: np.ndarray, own: np.ndarray, priced: np.ndarray, rows: np.ndarray,
                   cols: np.ndarray, moves: np.ndarray, later: float, upper: float,
                   price: Callable[[list[tuple[int, int]]], np.ndarray]) -> np.ndarray:
    """Of the (row, column) pairs ``priced`` of one segment of :func:`_fastest_chain`, those
    whose time may still be their column's least, with their moves priced into ``moves`` (by
    distinct layouts: ``rows`` and ``cols`` index its rows and columns): an exact bound, not a
    guess.

    A move costs ≥ 0 and floating-point addition is monotone, so reaching column c from row r
    takes at least ``times[r] + own[c]``, what it takes with the move counted free. The
    fastest rows are priced first (:data:`PROBED_ROWS` of them): the least they reach in each
    column bounds its least from above, and a row whose time with the column's own already
    exceeds that bound can be neither the least nor tied with it, so its move is never priced.
    The rows left give the column the same least, found at the same first row."""
    order = np.argsort(times, kind="stable")
    probe = np.zeros(len(times), dtype=bool)
    probe[order[:PROBED_ROWS]] = True
    first = priced & probe[:, None]
    _price_into(moves, rows, cols, first, price)
    reached = times[:, None] + (moves[np.ix_(rows, cols)] + own[None, :])
    reached = np.where(first & (reached + later <= upper), reached, math.inf)
    bound = reached.min(axis=0) if len(times) else np.full(len(own), math.inf)
    needed = priced & ((times[:, None] + own[None, :]) <= bound[None, :])
    _price_into(moves, rows, cols, needed & ~first, price)
    return needed


PROBED_ROWS = 8
"""The fastest rows whose moves a segment of a chain prices first, to bound each column's
least: enough that some probe usually reaches the column by a cheap move."""


def _price_into(moves: np.ndarray, rows: np.ndarray, cols: np.ndarray, pairs: np.ndarray,
                price: Callable[[list[tuple[int, int]]], np.ndarray]) -> None:
    """Price the distinct layout pairs behind the True entries of ``pairs`` not yet in
    ``moves`` (NaN: not priced), with ``price``, into ``moves``."""
    width = moves.shape[1]
    # marked, not np.unique: the distinct keys in order, without loading numpy.ma (13 ms)
    wanted = np.zeros(moves.size, dtype=bool)
    wanted[(rows[:, None] * width + cols[None, :])[pairs]] = True
    keys = np.flatnonzero(wanted & np.isnan(moves.ravel()))
    if len(keys):
        rows_at, cols_at = np.divmod(keys, width)
        moves.flat[keys] = price(list(zip(rows_at.tolist(), cols_at.tolist())))[:, 0]


def _least_after(model: CostModel, candidates: list[list[LayerPlan]], free: float,
                 weighed: bool) -> tuple[list[float], list[float]]:
    """Per segment of a chain, the least time (``free`` of each gradient sum counted free) and
    (``weighed``; else 0) the least memory kept that the segments after it add to any plan:
    each one's own least (the moves and the loss add more, never less)."""
    times = [min(model.segment_cost(k, c).time_with_free(free) for c in found)
             for k, found in enumerate(candidates)]
    kept = ([min(model.segment_cost(k, c, timed=False).memory for c in found)
             for k, found in enumerate(candidates)] if weighed else [0.0] * len(candidates))
    after_time, after_memory = [0.0] * len(candidates), [0.0] * len(candidates)
    for k in range(len(candidates) - 2, -1, -1):
        after_time[k] = after_time[k + 1] + times[k + 1]
        after_memory[k] = after_memory[k + 1] + kept[k + 1]
    return after_time, after_memory


def _exact_graph_plan(model: CostModel, candidates: list[list[LayerPlan]],
                      cap: float | None = None, cap_source: str = "", free: float = 0.0,
                      upper: float = math.inf) -> PlannedNetwork:
    """The plan of least predicted time of a net with branches (under ``cap`` bytes per rank,
    if given), exactly, by variable elimination (:mod:`hpctrain.plan.elimination`) over one
    variable per segment; :class:`PlannerError` when even the least sum of the tables exceeds
    ``upper`` (a known plan's time, slack included: :func:`_beyond`).

    The predicted time is a sum of tables: each segment's own cost, and each move between
    segments (into a weighted layer, or into an add's or concat's other inputs) under the
    choices at its two ends; the input batch, the moves from it and the loss add to the
    segments they depend on. These are exactly the terms :func:`evaluate` adds up, and the
    same tables give the memory it counts: bytes kept (summed) and transients (the largest).
    """
    tables = _plan_tables(model, candidates, cap is not None, free)
    sizes = [len(found) for found in candidates]

    def planned(chosen: list[int]) -> PlannedNetwork:
        return evaluate(model, [found[i] for found, i in zip(candidates, chosen, strict=True)])

    try:
        fastest = planned(_beyond(minimise(sizes, tables), upper))
        if cap is None or fastest.memory <= cap:
            return fastest
        try:  # a plan that fits: what any label must beat
            known = _uniform_plan(model, candidates, cap, cap_source)
        except PlannerError:
            known = None
        found = minimise_under_cap(sizes, tables, cap,
                                   known.iteration_time if known else math.inf)
    except TooLarge:  # densely connected: the one-grid rule, valid if not the best
        return replace(_uniform_plan(model, candidates, cap, cap_source), exact=False)
    if found is not None:
        return planned(found[1])
    if known is None:
        _refuse_cap(model, cap, _leanest(model, candidates), cap_source)
    return known  # nothing beats it


def _grouped_plan(model: CostModel, candidates: list[list[LayerPlan]], free: float,
                  below: float = math.inf, upper: float = math.inf) -> PlannedNetwork:
    """The plan of least predicted time of a net with branches where regions may run on groups
    of ranks: one exact elimination over every segment's choices on every rank and the values
    :class:`~hpctrain.plan.grouped.GroupedSpace` adds (a region on groups or not, its inside
    planned on the groups, on communicators whose latency is below ``below``). Without a
    region that qualifies, :func:`_exact_graph_plan`. :class:`PlannerError` as there, where
    no plan is worth finding under ``upper``."""
    space = GroupedSpace(model, candidates, free, below)
    if not any(space.extra):
        return _exact_graph_plan(model, candidates, None, "", free, upper)
    tables = _plan_tables(model, candidates, False, free, space)
    try:
        chosen = _beyond(minimise([space.size(s) for s in range(len(candidates))], tables),
                         upper)
    except TooLarge:
        return _exact_graph_plan(model, candidates, None, "", free, upper)
    plan = space.plan_of(chosen)
    if any(entry.ranks is not None for entry in plan):
        return evaluate_placed(model, plan)
    return evaluate(model, [plan[head] for head in model.heads])


def _beyond(least: tuple[float, list[int]], upper: float) -> list[int]:
    """The choices of :func:`~hpctrain.plan.elimination.minimise`'s least sum ``least``, or
    :class:`PlannerError` where that sum exceeds ``upper``: then no plan among the tables is
    worth finding, nor worth evaluating. The tables add up :func:`evaluate`'s terms in another
    order, so the two agree to the last few bits: ``upper`` carries a slack far wider."""
    total, chosen = least
    if total > upper:
        raise PlannerError("no plan of these candidates is faster than the one known")
    return chosen


def _plan_tables(model: CostModel, candidates: list[list[LayerPlan]], weighed: bool,
                 free: float = 0.0, space: GroupedSpace | None = None) -> list[Table]:
    """The tables whose sum over the segments' choices is :func:`evaluate`'s predicted time
    (with ``free`` of every gradient sum counted free) and, ``weighed``, its memory (kept
    bytes summed, the largest transient counted). With ``space``, over its values too (not
    weighed): a segment with no part in a move (inside a region on groups, which prices its
    moves itself) adds nothing to it, and the tables that keep the values consistent join."""
    if space is None:  # the rounds of the last buckets search subsets of one set of choices,
        # and a search with another share of the sums counted free the same moves
        made = sorted(model.search_tables.items(), key=lambda item: item[0][1] != free)
        for (was_weighed, was_free), sets in made:
            for known, tables in sets if was_weighed == weighed else ():
                picked = _picked(known, candidates)
                if picked is None:
                    continue
                found = [_sliced(table, picked) for table in tables]
                if was_free != free:  # only the segments' own costs count it; kept for the
                    # rounds after this one, which search subsets of these candidates
                    found[:len(candidates)] = [_own_table(model, s, choices, free, weighed)
                                               for s, choices in enumerate(candidates)]
                    _keep_tables(model, candidates, weighed, free, found)
                return found
    else:  # the rounds with another share counted free search the same values again
        for known, extra, extra_layouts, tables in model.grouped_tables.get(space.below, ()):
            if known == candidates and extra == space.extra and extra_layouts == space.layouts:
                return [*_own_tables(model, candidates, free, space),
                        *tables[len(candidates):], *space.tables]
    net, segments = model.net, model.segments
    owner = {k: s for s, members in enumerate(segments) for k in members}
    layouts = [[dict(zip(members, model.runnable_layouts(s, c), strict=True))
                for c in candidates[s]] for s, members in enumerate(segments)]
    if space is not None:
        layouts = [found + space.layouts[s] for s, found in enumerate(layouts)]
    tables = []

    def table(variables: tuple[int, ...], costs: object) -> Table:
        """The table of ``costs``, nested lists (one level per variable) of anything with a
        ``total``, ``memory`` and ``peak``."""
        items = np.array(costs, dtype=object)

        def field(what: str) -> np.ndarray:
            return np.vectorize(lambda c: getattr(c, what), otypes=[float])(items)

        if not weighed:
            return Table(variables, field("total"))
        return Table(variables, field("total"), field("memory"), field("peak"))

    if space is None:
        tables += [_own_table(model, s, found, free, weighed)
                   for s, found in enumerate(candidates)]
    else:
        tables += _own_tables(model, candidates, free, space)
    sources = [model.input_layout(c) for c in candidates[0]]  # where the batch is produced
    tables.append(table((0,), [model.input_cost(src) for src in sources]))

    def move_table(source_of: list[Layout], a: int | None, k: int, e: int) -> None:
        """The move into input ``e`` of layer ``k`` from ``source_of[choice of a]`` (a None:
        one fixed source). Many choices share a layout at one end (a convolution's input is
        its channels whole, whatever it cuts them into), so each distinct pair is priced
        once and the table gathered from those prices."""
        b = owner[k]
        targets = [where[k].inputs[e] if k in where else None for where in layouts[b]]
        (src_of, srcs), (dst_of, dsts) = _distinct_layouts(source_of), _distinct_layouts(targets)
        if a == b:  # one segment's choice decides both ends
            pairs = sorted(set(zip(src_of, dst_of)))
            priced = dict(zip(pairs, _move_grid(model, srcs, dsts, k, weighed, pairs),
                              strict=True))
            fields = [np.array([priced[pair][f] for pair in zip(src_of, dst_of)])
                      for f in range(3)]
            tables.append(Table((b,), *(fields if weighed else fields[:1])))
            return
        grid = _move_grid(model, srcs, dsts, k, weighed)
        rows = np.asarray(src_of)[:1] if a is None else np.asarray(src_of)
        picked = grid[np.ix_(rows, dst_of)]  # gathered once, every field at once
        chosen = [picked[..., f] for f in range(3 if weighed else 1)]
        if a is None:
            chosen = [field[0] for field in chosen]
        variables = (b,) if a is None else (a, b)
        tables.append(Table(variables, *chosen))

    for k, e, p in model.joins:
        if p < 0:
            move_table(sources, 0 if len(set(sources)) > 1 else None, k, e)
        else:
            move_table([where[p].output if p in where else None
                        for where in layouts[owner[p]]], owner[p], k, e)
    last = owner[len(net.layers) - 1]
    tables.append(table((last,), [model.loss_cost(where[len(net.layers) - 1].output)
                                  for where in layouts[last]]))
    if space is not None:
        model.grouped_tables.setdefault(space.below, []).append(
            (candidates, space.extra, space.layouts, tables))
        return tables + space.tables
    _keep_tables(model, candidates, weighed, free, tables)
    return tables


def _own_tables(model: CostModel, candidates: list[list[LayerPlan]], free: float,
                space: GroupedSpace) -> list[Table]:
    """Each segment's own seconds (``free`` of each gradient sum counted free) under each of
    its candidates, then under each value ``space`` adds to it."""
    return [Table((s,), np.array([*(model.segment_cost(s, c).time_with_free(free)
                                    for c in found), *space.own[s]], dtype=float))
            for s, found in enumerate(candidates)]


def _keep_tables(model: CostModel, candidates: list[list[LayerPlan]], weighed: bool,
                 free: float, tables: list[Table]) -> None:
    """Keep ``tables``, made for ``candidates``, for the searches after this one
    (:func:`_plan_tables`)."""
    index = [{choice: i for i, choice in enumerate(found)} for found in candidates]
    model.search_tables.setdefault((weighed, free), []).append((index, tables))


def _own_table(model: CostModel, segment: int, choices: list[LayerPlan], free: float,
               weighed: bool) -> Table:
    """The table of the segment's own cost under each of ``choices`` (``free`` of each gradient
    sum counted free) and, ``weighed``, the bytes it keeps and holds for a moment."""
    costs = [model.segment_cost(segment, c) for c in choices]
    seconds = np.array([cost.time_with_free(free) for cost in costs], dtype=float)
    if not weighed:
        return Table((segment,), seconds)
    return Table((segment,), seconds, np.array([c.memory for c in costs], dtype=float),
                 np.array([c.peak for c in costs], dtype=float))


def _picked(known: list[dict[LayerPlan, int]], candidates: list[list[LayerPlan]]
            ) -> list[np.ndarray] | None:
    """Per segment, where each of ``candidates`` stands among the choices ``known`` (each
    segment's choice → its index) that tables were made for; None unless all stand there."""
    picked = []
    for index, found in zip(known, candidates, strict=True):
        where = [index.get(choice, -1) for choice in found]
        if -1 in where:
            return None
        picked.append(np.array(where, dtype=np.int64))
    return picked


def _sliced(table: Table, picked: list[np.ndarray]) -> Table:
    """``table`` over the choices ``picked`` (per segment, the indices of its choices)."""
    at = np.ix_(*(picked[v] for v in table.variables))

    def cut(values: np.ndarray | float) -> np.ndarray | float:
        return values[at] if isinstance(values, np.ndarray) else values

    return Table(table.variables, cut(table.values), cut(table.memory), cut(table.moment))


def _distinct_layouts(layouts: list[Layout | None]
                      ) -> tuple[list[int], list[Layout | None]]:
    """(each entry's index among the distinct layouts, the distinct layouts in first order)."""
    index: dict[Layout | None, int] = {}
    return [index.setdefault(layout, len(index)) for layout in layouts], list(index)


def _move_grid(model: CostModel, srcs: list[Layout | None], dsts: list[Layout | None],
               index: int, weighed: bool, pairs: list[tuple[int, int]] | None = None
               ) -> np.ndarray:
    """(seconds, bytes kept, bytes for a moment) of the move from each of ``srcs`` into each
    of ``dsts`` for layer ``index``, as :func:`_move_fields` prices it, in an array of shape
    (sources, targets, 3); nothing where an end is None (a segment with no part in it). Given
    ``pairs`` (source, target), only those, in an array of shape (pairs, 3).

    The searches ask for the same moves many times over (once per search: with and without
    the sums that may hide, per round of the last buckets, per space), and the joins of
    repeated blocks for the same layouts: each move is priced once, into the model's
    :class:`~hpctrain.plan.pricing.MovePrices` of the shape moved (seconds alone, every new
    move of a table at once) or, ``weighed``, into a :class:`_MoveGrid` of the model's per
    shape and layer (its memory depends on the layer), and looked up by rows and columns
    after."""
    cross = pairs is None
    if cross:  # every pair, row by row
        si = np.repeat(np.arange(len(srcs)), len(dsts))
        di = np.tile(np.arange(len(dsts)), len(srcs))
    else:
        at = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        si, di = at[:, 0], at[:, 1]
    found = np.zeros((len(si), 3))
    shape = next((src.shape for src in srcs if src is not None), None)
    if shape is not None and any(dst is not None for dst in dsts):
        if weighed:
            grid = model.move_grids.get((shape, index))
            if grid is None:
                grid = model.move_grids[shape, index] = _MoveGrid()
        else:
            grid = model.move_prices.get(shape)
            if grid is None:
                grid = model.move_prices[shape] = MovePrices()
        rows = np.array(grid.rows_of(srcs), dtype=np.int64)[si]
        cols = np.array(grid.cols_of(dsts), dtype=np.int64)[di]
        known = (rows >= 0) & (cols >= 0)
        if known.any() and weighed:
            found[known] = grid.prices(model, si[known], di[known], rows[known], cols[known],
                                       srcs, dsts, index)
        elif known.any():
            found[known, 0] = grid.seconds(model, si[known], di[known], rows[known],
                                           cols[known], srcs, dsts)
    return found.reshape(len(srcs), len(dsts), 3) if cross else found


class _MoveGrid(LayoutGrid):
    """The prices (:func:`_move_fields`) of moves between layouts of one shape into one layer,
    with their memory, a row per source layout and a column per target layout met so far,
    each priced when first asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.fields = np.full((0, 0, 3), np.nan)  # NaN: not priced yet

    def prices(self, model: CostModel, si: np.ndarray, di: np.ndarray, rows: np.ndarray,
               cols: np.ndarray, srcs: list[Layout], dsts: list[Layout], index: int
               ) -> np.ndarray:
        """The (pairs, 3) prices of moving ``srcs[si[m]]`` (in row ``rows[m]``) into
        ``dsts[di[m]]`` (in column ``cols[m]``) for layer ``index``, each pair m."""
        have = self.fields.shape
        if len(self.rows) > have[0] or len(self.cols) > have[1]:
            grown = np.full((max(len(self.rows), 2 * have[0]),
                             max(len(self.cols), 2 * have[1]), 3), np.nan)
            grown[:have[0], :have[1]] = self.fields
            self.fields = grown
        found = self.fields[rows, cols]
        missing = np.flatnonzero(np.isnan(found[:, 0]))
        if len(missing):
            pairs = [(srcs[a], dsts[b])
                     for a, b in zip(si[missing].tolist(), di[missing].tolist(), strict=True)]
            costs = model.price_moves(pairs)  # each distinct pair's, in first order
            if len(costs) != len(pairs):  # a layout given twice (the searches give each once)
                costs = [model.move_cost(*pair) for pair in pairs]
            found[missing] = [_move_fields(model, src, dst, index, cost)
                              for (src, dst), cost in zip(pairs, costs, strict=True)]
            self.fields[rows[missing], cols[missing]] = found[missing]
        return found


def _move_fields(model: CostModel, src: Layout, dst: Layout, index: int,
                 cost: tuple[Move, float, float]) -> tuple[float, float, float]:
    """What moving ``src`` into ``dst`` for layer ``index`` (at ``cost``, its
    :meth:`~hpctrain.plan.pricing.CostModel.move_cost`) adds to :func:`evaluate`'s totals: its
    seconds, the bytes it keeps and the bytes it holds for a moment."""
    time = cost[1] + cost[2]
    resident, transient = model.move_memory(src, dst, index)
    return time, sum(resident.values()), sum(transient.values())


def _uniform_plan(model: CostModel, candidates: list[list[LayerPlan]],
                  mem_per_rank: float | None, cap_source: str) -> PlannedNetwork:
    """A net with branches under a memory cap (or too densely connected for exact
    elimination): the fastest predicted plan that fits and puts every weighted layer on one
    grid: the strategies ``1.5d`` and ``integrated`` on every grid
    (:mod:`hpctrain.plan.baselines`; on 1×P both are pure batch). Simple and always valid, not
    the best per-layer plan."""
    options = []
    for grid in factorisations(model.procs):
        for strategy in (("1.5d",) if grid[0] == 1 else ("1.5d", "integrated")):
            choices = strategy_plan(model.segment_kinds, strategy, grid)
            if all(c in found for c, found in zip(choices, candidates, strict=True)):
                options.append(choices)
    if not options:
        raise PlannerError(f"no grid of {model.procs} processes suits every layer of net "
                           f"{model.net.name} at batch {model.batch}; raise --batch or give "
                           f"a plan")
    model.prefetch([sorted(set(found), key=LayerPlan.describe) for found in zip(*options)])
    planned = [evaluate(model, choices) for choices in options]
    fitting = [p for p in planned if mem_per_rank is None or p.memory <= mem_per_rank]
    if not fitting:
        _refuse(min(planned, key=lambda p: p.memory), mem_per_rank, cap_source)
    return min(fitting, key=lambda p: p.iteration_time)


def describe_precision(precision: Precision) -> str:
    """What the model prices under ``precision``, in a line: 'precision bf16: 2-byte activations
    and gradients, float32 master weights'."""
    master = np.dtype(precision.master).name
    text = (f"precision {precision.name}: {precision.itemsize}-byte activations and gradients, "
            + (f"{master} master weights" if precision.mixed else f"{master} weights"))
    if precision.tensor_cores and not precision.mixed:
        text += ", products in TF32"
    if precision.loss_scaling:
        text += ", dynamic loss scaling"
    return text


# (name, unit, alignment) of each column of format_plan's table
_PLAN_COLUMNS = (("", "layer", "<"), ("", "kind", "<"), ("", "mode", "<"), ("", "grid", "<"),
                 ("compute", "ms", ">"), ("comm", "ms", ">"), ("redist", "ms", ">"),
                 ("", "fed by", "<"), ("mem", "MiB", ">"), ("+tmp", "MiB", ">"))
_COLUMN_GAP = "  "
_SHORTEST_NAME = 16  # a layer name is cut to fit a width, and no shorter than this


def grid_text(plan: LayerPlan | None, cost: LayerCost) -> str:
    """A layer's grid as the table shows it: ``2x4`` (Pr×Pc), a split's degree on every axis
    ``n8 c16 d4 h4 w2`` (its input split ``i2`` or ``s2`` and replicas ``r2`` too: a plan
    file's ``n=8,c=16,…`` without the punctuation), or nothing for a layer that follows."""
    on = f" {ranks_text(plan.ranks)}" if plan is not None and plan.ranks is not None else ""
    if plan is not None and plan.split is not None:
        return plan.split.text().replace("=", "").replace(",", " ") + on
    return "" if cost.mode == "follow" else f"{cost.grid[0]}x{cost.grid[1]}{on}"


def _shorten(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters: its middle cut to an ellipsis, so that both
    the block (``Mixed_6b.``) and the layer in it (``….conv``) stay readable."""
    if len(name) <= width:
        return name
    head = width // 2  # of the width - 1 characters kept, the larger half from the start
    return name[:head] + "…" + name[len(name) - (width - 1 - head):]


def _table(cells: list[list[str]], width: int | None) -> list[str]:
    """``cells`` (two header rows, then one row a layer) as lines whose columns each take their
    widest entry and start at the same offset on every line. Wider than ``width``, the layer
    names are cut (:func:`_shorten`) to fit it if that leaves them ``_SHORTEST_NAME``
    characters; otherwise the lines are left whole, wider than ``width``, and a terminal
    wraps them: names are cut only where that makes the table fit."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(_PLAN_COLUMNS))]
    total = sum(widths) + len(_COLUMN_GAP) * (len(widths) - 1)
    over = 0 if width is None else total - width
    if 0 < over <= widths[0] - _SHORTEST_NAME:
        widths[0] -= over
        cells = [[_shorten(row[0], widths[0]), *row[1:]] for row in cells]
    return [_COLUMN_GAP.join(f"{cell:{align}{w}}" for cell, (_, _, align), w
                             in zip(row, _PLAN_COLUMNS, widths, strict=True)).rstrip()
            for row in cells]


def format_plan(planned: PlannedNetwork, width: int | None = None) -> str:
    """The plan as a table: per layer, mode and grid (:func:`grid_text`), predicted ms and
    memory per rank, then the totals. Each column is as wide as its widest entry and starts at
    the same offset on every line. Given the terminal's ``width``, a table wider than it has
    the middle of its longest layer names cut to an ellipsis where that makes it fit, names
    kept to 16 characters at least (where it does not, the lines stay whole and the terminal
    wraps them), and the prose below is wrapped at ``width`` (:func:`wrap_line`)."""
    cells = [[name for name, _, _ in _PLAN_COLUMNS], [unit for _, unit, _ in _PLAN_COLUMNS]]
    entries = [None, *planned.plans, None]
    for c, entry in zip([planned.data, *planned.layers, planned.loss], entries, strict=True):
        cells.append([c.layer, c.kind, c.mode, grid_text(entry, c),
                      f"{sum(c.compute) * 1e3:.3f}", f"{sum(c.comm) * 1e3:.3f}",
                      f"{sum(c.redistribution) * 1e3:.3f}", c.move.method,
                      f"{c.memory / 2**20:.1f}", f"{c.peak / 2**20:.1f}"])
    rows = _table(cells, width)
    notes = []
    t = planned.totals()
    hidden = planned.hidden_sums()
    notes.append(f"predicted iteration {_ms(planned.iteration_time)} ms = compute "
                 f"{_ms(t['compute'])} + communication {_ms(t['communication'])} + "
                 f"redistribution {_ms(t['redistribution'])}"
                 + (f" - groups side by side {_ms(planned.side_by_side)}"
                    if planned.on_groups else "")
                 + (f" - gradient sums hidden {_ms(hidden)}" if hidden else "")
                 + f"; peak memory {planned.memory / 2**20:.1f} MiB per rank (kept + the "
                   "largest +tmp)")
    if planned.lower_bound:
        notes.append(f"no plan is predicted faster than {_ms(planned.lower_bound)} ms "
                     f"(every gradient sum hidden as far as the machine allows): this one is "
                     f"within {planned.iteration_time / planned.lower_bound - 1:.1%} of the best")
    if planned.space_note:
        notes.append(planned.space_note)
    if not planned.exact:
        notes.append("not exact: the net is too densely connected to search every layer's "
                     "grid; every weighted layer is on one grid")
    return "\n".join(rows + [wrap_line(note, width) for note in notes])


def _ms(seconds: float) -> str:
    """``seconds`` in milliseconds, three decimals or, below 1 ms, three significant digits
    (a step of a few microseconds is not shown as 0.000)."""
    ms = seconds * 1e3
    if ms <= 0 or ms >= 1:
        return f"{ms:.3f}"
    return f"{ms:.{2 - math.floor(math.log10(ms))}f}"


def wrap_line(line: str, width: int | None) -> str:
    """A line of prose broken between words to lines of at most ``width`` characters (as it
    is when ``width`` is None), so that a terminal does not break it inside a number."""
    return line if width is None else textwrap.fill(line, width, break_on_hyphens=False)
