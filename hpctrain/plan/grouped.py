"""Regions on groups of ranks: the planner's option, beside running every branch on every rank
one after another, of running a fork–join region's branches side by side on disjoint groups.

The space, stated:

- A region qualifies when its fork is a layer (not the input batch), at least two of its
  branches hold weights, it lies inside no other qualifying region, its join's first input
  comes from inside it, and its layers are all the net's layers between its fork and its join
  (no other branch's layers interleave with them in net order, so the schedule runs one region
  at a time and the regions' times add up). On P ranks its m weighted branches take
  min(m, P) groups, the blocks of :func:`blocks` (contiguous, aligned to the nodes where P
  allows); branch b takes group b mod min(m, P), so with more branches than ranks a group runs
  several, one after another.
- On its group a branch's weighted layers take the 1.5D grids of the group's ranks
  (:meth:`~hpctrain.plan.segments.Segments.choices` on g ranks). Each branch takes, exactly (by
  variable elimination over its own segments), the choices that make its own time least: its
  layers, the moves between them, the move into it from the fork and the move out of it into the
  join.
- The join and the layers after it run on the fork's ranks and layout
  (:mod:`hpctrain.plan.placement`); the layers of a branch without weights (an Inception module's
  pooling) stay there too.

Such a region costs what the schedule's critical path makes of it
(:mod:`hpctrain.plan.side_by_side`): every rank moves the fork out to each group, the groups
run their branches at once (the slowest group's forward, then its backward, counts), and every
rank takes the join's inputs back. The planner (:mod:`hpctrain.plan.planner`) weighs this against
the region run on every rank, exactly, over every segment's choices at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from hpctrain.layout.layout import Layout
from hpctrain.layout.partition import SplitError, factorisations
from hpctrain.model.kinds import KINDS
from hpctrain.model.regions import Region, fork_join_regions
from hpctrain.plan.buckets import slowest_latency
from hpctrain.plan.elimination import Table, minimise_each
from hpctrain.plan.placement import LayerLayouts
from hpctrain.plan.plans import FOLLOW, LayerPlan
from hpctrain.plan.pricing import CostModel, LayerCost, time_with_free


def blocks(procs: int, count: int) -> list[tuple[int, int]]:
    """``min(count, procs)`` blocks (first, size) of consecutive ranks tiling ``procs``.

    Where the next power of two q ≥ the count divides ``procs``, the blocks are made of
    aligned pieces of P/q ranks, the first blocks two pieces and the rest one: 3 blocks of 64
    ranks are 0-31, 32-47 and 48-63. On nodes of R ranks (P and R powers of two) a block then
    lies inside one node or on whole nodes, never across a node's edge. Otherwise they are as
    even as they come: 3 ranks in 2 blocks are 0 and 1-2."""
    count = min(count, procs)
    pieces = 1 << (count - 1).bit_length()
    if procs % pieces == 0:
        piece = procs // pieces
        sizes = [2 * piece] * (pieces - count) + [piece] * (2 * count - pieces)
    else:
        sizes = [procs * (b + 1) // count - procs * b // count for b in range(count)]
    firsts = [sum(sizes[:b]) for b in range(count)]
    return list(zip(firsts, sizes, strict=True))


@dataclass(frozen=True)
class GroupedRegion:
    """A region that qualifies (the module's text), in the terms of the segments: the segment
    whose choice lays out the fork (``fork_segment``), the one holding the join (``carrier``:
    its layers from the join on run on the fork's layout), the segments whose heads are inside
    (``inside``, the carrier among them), and per weighted branch its segments and group."""

    region: Region
    fork_segment: int
    carrier: int
    inside: tuple[int, ...]
    branches: tuple[tuple[int, ...], ...]
    groups: tuple[tuple[int, int], ...]  # per branch, (first, size)

    @property
    def join(self) -> int:
        return self.region.join


def grouped_regions(model: CostModel) -> list[GroupedRegion]:
    """Every region of ``model``'s net that qualifies for groups (the module's text), by fork in
    net order; none on one rank."""
    net = model.net
    if model.procs < 2:
        return []
    owner = {k: s for s, members in enumerate(model.segments) for k in members}
    found: list[GroupedRegion] = []
    taken: set[int] = set()
    for region in fork_join_regions(net):
        weighted = [b for b in region.branches if any(KINDS[net.layers[k].kind].weighted
                                                      for k in b)]
        first = net.producers(region.join)[0]
        if (region.fork < 0 or len(weighted) < 2 or taken & set(region.inside)
                or first not in region.inside
                or len(region.inside) != region.join - region.fork - 1):
            continue
        inside = tuple(sorted({owner[k] for k in region.inside
                               if KINDS[net.layers[k].kind].weighted}))
        carrier = owner[first]
        if carrier not in inside:
            continue
        per_branch = blocks(model.procs, len(weighted))
        found.append(GroupedRegion(
            region, owner[region.fork], carrier, inside,
            tuple(tuple(sorted({owner[k] for k in b if KINDS[net.layers[k].kind].weighted}))
                  for b in weighted),
            tuple(per_branch[b % len(per_branch)] for b in range(len(weighted)))))
        taken |= set(region.inside)
    return found


def group_choices(model: CostModel, segment: int, group: tuple[int, int]) -> list[LayerPlan]:
    """The 1.5D choices of the segment's weighted layer on the ranks of ``group``."""
    first, size = group
    kind = KINDS[model.net.layers[model.heads[segment]].kind]
    found = [LayerPlan("batch", (1, size), ranks=(first, size))]
    found += [LayerPlan(mode, grid, ranks=(first, size)) for grid in factorisations(size)
              if grid[0] > 1 for mode in kind.modes]
    return found


_UNKNOWN = object()  # what a table holds for a key not yet looked into (None is a value)


@dataclass
class RegionPrices:
    """What running one region on groups costs for each layout of its fork: the seconds and the
    plan of every weighted layer inside (see :func:`region_costs`). Made once per region and fork
    layout."""

    model: CostModel
    grouped: GroupedRegion
    below: float = math.inf  # no layer inside sums over a communicator this slow or slower

    # kept on the model: every search (with and without the sums that may hide, each
    # round of the last buckets) asks for them again. Found once here: a region's key hashes
    # all its layers, and a search looks in these tables tens of thousands of times
    _pre_joins: dict = field(init=False, repr=False)
    """(segment, choice) → (layouts, costs) or None (:meth:`pre_join`)."""
    _every_choices: dict = field(init=False, repr=False)
    """branch → its _Branch over every choice that runs, or None (:meth:`_every_choice`),
    whatever ``below``."""
    _branches: dict = field(init=False, repr=False)
    """branch → its _Branch, or None (which depends on ``below``)."""
    on_groups: dict = field(init=False, repr=False)
    """What :func:`region_costs` found, by the layouts the region reads and the join's."""
    _untimed: list = field(init=False, repr=False)
    """The costs :meth:`pre_join` found and has not timed yet, timed in one batch."""
    _inside: frozenset = field(init=False, repr=False)  # the region's layers

    def __post_init__(self) -> None:
        found, grouped, below = self.model.region_layers, self.grouped, self.below
        self._inside = frozenset(grouped.region.inside)
        self._untimed = found.setdefault(("untimed", grouped), [])
        self._pre_joins = found.setdefault(grouped, {})
        self._every_choices = found.setdefault(("every choice", grouped), {})
        self._branches = found.setdefault((grouped, below), {})
        self.on_groups = found.setdefault(("on groups", grouped, below), {})

    def pre_join(self, segment: int, choice: LayerPlan, timed: bool = True
                 ) -> tuple[dict[int, LayerLayouts], list[LayerCost]] | None:
        """The layouts and timed costs of the segment's layers inside the region under
        ``choice`` (each fed by the one before it in the segment); None when it cannot run.
        ``timed`` False: their compute may be left unfilled until a call that asks for it,
        which times every cost left so at once (a branch's choices: one batch, not one each)."""
        key = (segment, choice)
        found = self._pre_joins.get(key, _UNKNOWN)
        if found is _UNKNOWN:
            found = self._pre_joins[key] = self._laid_out(segment, choice)
            if found is not None:
                self._untimed.extend(found[1])
        if timed and self._untimed:
            self.model.time_layers(self._untimed)
            self._untimed.clear()
        return found

    def _laid_out(self, segment: int, choice: LayerPlan
                  ) -> tuple[dict[int, LayerLayouts], list[LayerCost]] | None:
        """:meth:`pre_join`, made, untimed."""
        model, net = self.model, self.model.net
        layouts: dict[int, LayerLayouts] = {}
        known: dict[int, Layout] = {}  # each layer's output, as the next reads it
        costs: list[LayerCost] = []
        try:
            for k in model.segments[segment]:
                if k not in self._inside:
                    break
                first = net.producers(k)[0]
                layouts[k] = model.layer_layouts(k, model.fed(k, known), choice)
                known[k] = layouts[k].output
                mode = choice.mode if k == model.heads[segment] else "follow"
                costs.append(model.layer_cost(k, mode, layouts[k], layouts[first].output
                                              if first in layouts else None))
        except SplitError:
            return None
        return layouts, costs

    def _fast_enough(self, costs: list[LayerCost]) -> bool:
        return slowest_latency(costs) < self.below

    def _branch_tables(self, b: int) -> _Branch | None:
        """What branch ``b`` costs whatever the fork's layout: its segments' choices on its
        group whose communicators are faster than ``below``, their own tables and the tables
        of the moves between them; sliced from those of every choice (:meth:`_every_choice`),
        which each round of the last buckets would otherwise make again."""
        if b in self._branches:
            return self._branches[b]
        every = self._every_choice(b)
        found = None
        if every is not None:
            keep = [[i for i, c in enumerate(choices)
                     if self._fast_enough(self.pre_join(s, c)[1])]
                    for s, choices in zip(every.segments, every.choices, strict=True)]
            if all(keep):
                found = every.sliced(keep)
        self._branches[b] = found
        return found

    def _every_choice(self, b: int) -> _Branch | None:
        """:meth:`_branch_tables` over every choice that runs, made once per region."""
        if b in self._every_choices:
            return self._every_choices[b]
        model, net, grouped = self.model, self.model.net, self.grouped
        segments = grouped.branches[b]
        choices = [[c for c in group_choices(model, s, grouped.groups[b])
                    if self.pre_join(s, c, timed=False) is not None] for s in segments]
        if not all(choices):
            self._every_choices[b] = None
            return None
        laid = [[self.pre_join(s, c)[0] for c in found] for s, found in zip(
            segments, choices, strict=True)]
        variable = {s: i for i, s in enumerate(segments)}
        owner = {k: variable[s] for s in segments for k in laid[variable[s]][0]}
        parts = [[_split(self.pre_join(s, c)[1])[:2] for c in choices[i]]
                 for i, s in enumerate(segments)]
        tables = [Table((i,), np.array([f + w for f, w in rows]))
                  for i, rows in enumerate(parts)]
        inner, into, out = [], [], []  # moves between its segments, into it, out of it
        for k, e, p in _edges(net, grouped.join, set(owner)):
            if k == grouped.join:
                out.append((owner[p], e, [where[p].output for where in laid[owner[p]]]))
            elif p not in owner:
                into.append((owner[k], p, [where[k].inputs[e] for where in laid[owner[k]]]))
            else:
                a, c = owner[p], owner[k]
                model.price_moves((x[p].output, y[k].inputs[e]) for x in laid[a]
                                  for y in laid[c])
                moves = [[model.move_cost(x[p].output, y[k].inputs[e]) for y in laid[c]]
                         for x in laid[a]]
                tables.append(Table((a, c), np.array([[f + w for _, f, w in row]
                                                      for row in moves])))
                inner.append((a, c, moves))
        self._every_choices[b] = _Branch(tuple(segments), choices, parts, tables, inner, into, out)
        return self._every_choices[b]

    def branch_each(self, b: int, reads: list[tuple[Callable[[int], Layout], dict[int, Layout]]]
                    ) -> list[tuple[float, float, float, dict[int, LayerPlan]]] | None:
        """Branch ``b`` on its group, its own time least, under each of ``reads`` (``outside``,
        ``join_inputs``: ``outside(p)`` the layout of a layer p outside the branch that feeds
        it, the fork or a pooling beside it, and ``join_inputs[e]`` where the join reads its
        input e): (forward seconds, backward seconds of its layers and the moves between them,
        seconds of the moves into it and out of it, the choice of each of its segments) for
        each; None when no choice runs. Only the moves into it and out of it differ between
        them, so one elimination solves them all
        (:func:`~hpctrain.plan.elimination.minimise_each`)."""
        found = self._branch_tables(b)
        if found is None:
            return None
        model = self.model
        # priced with the region's other moves (GroupedSpace._add)
        moved_each = [[(i, [sum(model.move_cost(*pair)[1:]) for pair in row])
                       for i, row in _moves_in_and_out(found, outside, join_inputs)]
                      for outside, join_inputs in reads]
        tables = [*found.tables, *(Table((i,), np.array([moved[m][1] for moved in moved_each]))
                                   for m, (i, _) in enumerate(moved_each[0]))]
        chosen_each = minimise_each([len(c) for c in found.choices], tables, len(reads))
        branches = []
        for moved, chosen in zip(moved_each, chosen_each, strict=True):
            forward = sum(found.parts[i][chosen[i]][0] for i in range(len(chosen)))
            backward = sum(found.parts[i][chosen[i]][1] for i in range(len(chosen)))
            for a, c, moves in found.inner:
                _, f, w = moves[chosen[a]][chosen[c]]
                forward, backward = forward + f, backward + w
            seconds = sum(prices[chosen[i]] for i, prices in moved)
            plan = {model.heads[s]: found.choices[i][chosen[i]]
                    for i, s in enumerate(found.segments)}
            branches.append((forward, backward, seconds, plan))
        return branches

    def moves(self, outside: Callable[[int], Layout], join_inputs: dict[int, Layout]
              ) -> Iterator[tuple[Layout, Layout]]:
        """The pair of layouts of every move :func:`region_costs` prices for the region under
        ``outside`` and ``join_inputs`` (as it takes them): into and out of each branch under
        each choice, and into the join from beside the branches."""
        grouped, model = self.grouped, self.model
        for e, p in _beside(model, grouped):
            yield outside(p), join_inputs[e]
        for b in range(len(grouped.groups)):
            found = self._branch_tables(b)
            if found is not None:
                for _, row in _moves_in_and_out(found, outside, join_inputs):
                    yield from row


def _moves_in_and_out(found: _Branch, outside: Callable[[int], Layout],
                      join_inputs: dict[int, Layout]
                      ) -> list[tuple[int, list[tuple[Layout, Layout]]]]:
    """Per move into or out of a branch (``found``): its segment, and its pair of layouts
    under each choice of that segment."""
    pairs = [(i, [(outside(p), dst) for dst in targets]) for i, p, targets in found.into]
    pairs += [(i, [(src, join_inputs[e]) for src in sources]) for i, e, sources in found.out]
    return pairs


@dataclass(frozen=True)
class _Branch:
    """A branch's part of :meth:`RegionPrices.branch` that the fork's layout does not change:
    its segments and their choices, (forward, backward) of each choice's own layers, the
    tables of its segments' own seconds and of the moves between them, those moves (segment
    indices, the move's (method, forward, backward) per pair of choices), and per move into it
    (its segment, the producer, the target under each choice) and out of it (its segment, the
    join's input, the source under each choice)."""

    segments: tuple[int, ...]
    choices: list[list[LayerPlan]]
    parts: list[list[tuple[float, float]]]
    tables: list[Table]
    inner: list[tuple[int, int, list]]
    into: list[tuple[int, int, list[Layout]]]
    out: list[tuple[int, int, list[Layout]]]

    def sliced(self, keep: list[list[int]]) -> _Branch:
        """The branch with each segment's choices ``keep[i]`` (indices into its choices)
        alone: the same numbers, as if made from those choices."""
        def cut(rows: list, i: int) -> list:
            return [rows[j] for j in keep[i]]

        return _Branch(
            self.segments, [cut(found, i) for i, found in enumerate(self.choices)],
            [cut(found, i) for i, found in enumerate(self.parts)],
            [Table(t.variables, t.values[np.ix_(*(keep[v] for v in t.variables))])
             for t in self.tables],
            [(a, c, [cut(moves[x], c) for x in keep[a]]) for a, c, moves in self.inner],
            [(i, p, cut(targets, i)) for i, p, targets in self.into],
            [(i, e, cut(sources, i)) for i, e, sources in self.out])


def region_costs(prices: RegionPrices,
                 reads: list[tuple[Callable[[int], Layout], dict[int, Layout]]]
                 ) -> list[tuple[float, dict[int, LayerPlan]] | None]:
    """Under each of ``reads`` (the layouts outside the region that feed it, and where its join
    reads: :meth:`RegionPrices.branch_each`), the seconds the region on groups adds to the step
    beyond what its fork's and its carrier's layers on the fork's layout cost, and the choice of
    every weighted layer inside; None when some branch cannot run on its group. The moves into
    and out of the groups add up (every rank takes part in each), the groups' branches run at
    once: the slowest group's forward and the slowest group's backward count."""
    grouped, model = prices.grouped, prices.model
    branches = []
    for b in range(len(grouped.groups)):
        found = prices.branch_each(b, reads)
        if found is None:
            return [None] * len(reads)
        branches.append(found)
    beside = _beside(model, grouped)  # the join's inputs from beside the branches
    costs: list[tuple[float, dict[int, LayerPlan]] | None] = []
    for r, (outside, join_inputs) in enumerate(reads):
        forward: dict[tuple[int, int], float] = {}
        backward: dict[tuple[int, int], float] = {}
        moves, plan = 0.0, {}
        for e, p in beside:
            moves += sum(model.move_cost(outside(p), join_inputs[e])[1:])
        for b, group in enumerate(grouped.groups):
            f, w, m, chosen = branches[b][r]
            forward[group] = forward.get(group, 0.0) + f
            backward[group] = backward.get(group, 0.0) + w
            moves += m
            plan.update(chosen)
        costs.append((moves + max(forward.values()) + max(backward.values()), plan))
    return costs


def _outside_of(where: dict[int, LayerLayouts]) -> Callable[[int], Layout]:
    """The layout of a layer outside a region that feeds it, the fork's segment laid out on
    ``where``."""
    return lambda p: where[p].output


def _region_key(where: dict[int, LayerLayouts],
                after_join: tuple[dict[int, LayerLayouts], list[LayerCost]], join: int
                ) -> tuple:
    """What a region's cost on groups depends on: the layouts of the fork's segment and
    those the join reads in."""
    return tuple(where[p].output for p in sorted(where)), tuple(after_join[0][join].inputs)


def _beside(model: CostModel, grouped: GroupedRegion) -> list[tuple[int, int]]:
    """(input, producer) of each of the join's inputs that no branch on groups gives: from a
    branch without weights (an Inception module's pooling), or from the fork itself."""
    branched = {k for branch in grouped.region.branches for k in branch}
    return [(e, p) for e, p in enumerate(model.net.producers(grouped.join))
            if p not in branched or not _in_weighted_branch(model, grouped, p)]


def _in_weighted_branch(model: CostModel, grouped: GroupedRegion, k: int) -> bool:
    """Whether layer ``k`` belongs to one of the region's branches that run on groups: it is
    laid out by one of their segments."""
    segments = {s for branch in grouped.branches for s in branch}
    return any(k in model.segments[s] for s in segments)


def _split(costs: list[LayerCost]) -> tuple[float, float, float]:
    """(forward, backward, total) of the layers' compute, communication and moves inside."""
    forward = sum(c.compute[0] + c.comm[0] + c.redistribution[0] for c in costs)
    backward = sum(c.compute[1] + c.comm[1] + c.redistribution[1] for c in costs)
    return forward, backward, forward + backward


def _edges(net, join: int, members: set[int]) -> list[tuple[int, int, int]]:
    """(layer, input, producer) of every edge into the branch's ``members`` from outside them
    or between its segments (the first input of a member fed by the member before it in its
    segment is priced with the segment), and from them into the join."""
    found = []
    for k in sorted(members | {join}):
        for e, p in enumerate(net.producers(k)):
            if k == join:
                if p in members:
                    found.append((k, e, p))
            elif e > 0 or p not in members or KINDS[net.layers[k].kind].weighted:
                found.append((k, e, p))
    return found


def _shape(net, p: int) -> tuple[int, ...]:
    return net.input_shape if p < 0 else net.out_shapes[p]


@dataclass(frozen=True)
class Off:
    """The value of a segment inside ``region`` when that region runs on groups: it has no
    choice of its own (the region prices and plans it)."""

    region: int


@dataclass(frozen=True)
class OnGroups:
    """The value of a region's carrier when the region runs on groups, what it reads from the
    fork's segment laid out the ``layout``-th way of those that segment's values give."""

    region: int
    layout: int


class GroupedSpace:
    """The planner's variables extended by the regions on groups: per segment, values beyond
    its candidates (:class:`Off` inside a region, :class:`OnGroups` for a carrier), their
    layouts and own seconds, and the tables that keep a plan consistent (a region is on groups
    wholly or not at all, its carrier agrees with its fork).

    ``candidates[s]`` are segment s's choices on every rank; value ``len(candidates[s]) + j``
    is ``extra[s][j]``. A carrier takes one :class:`OnGroups` value per distinct layout of
    what its region reads from the fork's segment (the fork, a pooling beside the branches),
    not one per value of that segment: the region costs the same under values that agree.
    ``layouts[s][j]`` gives, for an extra value, the layouts of the segment's layers that run
    on the fork's layout (the join and after, for a carrier; none for :class:`Off`),
    ``own[s][j]`` its seconds (a carrier's: the region's, beyond its fork's segment, and its
    layers from the join on)."""

    def __init__(self, model: CostModel, candidates: list[list[LayerPlan]], free: float = 0.0,
                 below: float = math.inf) -> None:
        self.model, self.candidates, self.below = model, candidates, below
        self.regions = grouped_regions(model)
        count = len(model.segments)
        self.extra: list[list[object]] = [[] for _ in range(count)]
        self.layouts: list[list[dict[int, LayerLayouts]]] = [[] for _ in range(count)]
        self.own: list[list[float]] = [[] for _ in range(count)]
        self.tables: list[Table] = []
        self._plans: dict[tuple[int, int], dict[int, LayerPlan]] = {}
        off: set[int] = set()  # segments inside a region searched, its carrier's aside
        for r, grouped in enumerate(self.regions):
            if (grouped.fork_segment in off | set(grouped.inside) or 0 in grouped.inside
                    or set(grouped.inside) & off):
                continue  # laid out inside another region, or reading the input: not searched
            off |= set(grouped.inside) - {grouped.carrier}
            self._add(r, grouped, free)

    def size(self, segment: int) -> int:
        return len(self.candidates[segment]) + len(self.extra[segment])

    def value(self, segment: int, index: int) -> object:
        known = len(self.candidates[segment])
        return (self.candidates[segment][index] if index < known
                else self.extra[segment][index - known])

    def value_layouts(self, segment: int, index: int) -> dict[int, LayerLayouts]:
        known = len(self.candidates[segment])
        if index < known:
            model = self.model
            choice = self.candidates[segment][index]
            return dict(zip(model.segments[segment], model.runnable_layouts(segment, choice),
                            strict=True))
        return self.layouts[segment][index - known]

    def _add(self, r: int, grouped: GroupedRegion, free: float) -> None:
        model = self.model
        prices = RegionPrices(model, grouped, self.below)
        fork_segment, carrier, join = grouped.fork_segment, grouped.carrier, grouped.region.join
        members = model.segments[carrier]
        after = members[members.index(join):] if join in members else []
        inf = np.inf
        for s in grouped.inside:
            if s != carrier:
                self.extra[s].append(Off(r))
                self.layouts[s].append({})
                self.own[s].append(0.0)
        start, forks = self.size(carrier), self.size(fork_segment)
        feeding = sorted({p for branch in grouped.region.branches for k in (*branch, join)
                          for p in model.net.producers(k)
                          if p >= 0 and p in model.segments[fork_segment]})
        # one value per distinct layout of what the region reads from the fork's segment
        keys: dict[tuple, int] = {}
        key_of = []
        distinct = []  # the layouts of the fork's segment giving each key, in order
        for i in range(forks):
            where = self.value_layouts(fork_segment, i)
            if grouped.region.fork not in where:
                key_of.append(None)
                continue
            key = tuple(where[p].output for p in feeding)
            if key not in keys:
                keys[key] = len(keys)
                distinct.append(where)
            key_of.append(keys[key])
        after_join = [self._after_join(where[grouped.region.fork].output, after)
                      for where in distinct]
        # every move of the region under every key priced at once: a few calls of the
        # closed form over thousands of moves, not one over each branch's few dozen
        model.price_moves(pair for where, laid in zip(distinct, after_join, strict=True)
                          if laid is not None and _region_key(where, laid, join)
                          not in prices.on_groups
                          for pair in prices.moves(_outside_of(where),
                                                   dict(enumerate(laid[0][join].inputs))))
        reads: dict[tuple, tuple] = {}  # by the region's key, those not yet priced
        for where, laid in zip(distinct, after_join, strict=True):
            key = None if laid is None else _region_key(where, laid, join)
            if key is not None and key not in prices.on_groups:
                reads[key] = (_outside_of(where), dict(enumerate(laid[0][join].inputs)))
        if reads:  # every key at once: one elimination per branch
            prices.on_groups.update(zip(reads, region_costs(prices, list(reads.values())),
                                        strict=True))
        for j, (where, laid) in enumerate(zip(distinct, after_join, strict=True)):
            found = None if laid is None else self._on_groups(prices, where, laid, free)
            self.extra[carrier].append(OnGroups(r, j))
            self.layouts[carrier].append(found[0] if found else {})
            self.own[carrier].append(found[1] if found else inf)
            if found:
                self._plans[r, j] = found[2]
        # the carrier's value for a layout of the fork needs the fork's segment to give it
        agree = np.full((forks, self.size(carrier)), inf)
        agree[:, :start] = 0.0
        for i, j in enumerate(key_of):
            if j is not None:
                agree[i, start + j] = 0.0
        self.tables.append(Table((fork_segment, carrier), agree))
        forks = len(keys)
        for s in grouped.inside:  # every segment inside off exactly when the region is on groups
            if s == carrier:
                continue
            off = self.size(s) - 1
            both = np.zeros((self.size(s), self.size(carrier)))
            on_groups = np.zeros(self.size(carrier), dtype=bool)
            on_groups[start:start + forks] = True
            both[off, ~on_groups] = inf
            both[:off, on_groups] = inf
            self.tables.append(Table((s, carrier), both))

    def _after_join(self, fork: Layout, after: list[int]
                    ) -> tuple[dict[int, LayerLayouts], list[LayerCost]] | None:
        """For the fork on ``fork``: the layouts and timed costs of the carrier's layers from
        the join on (``after``), on the fork's layout; None when they cannot run, or sum over
        a communicator no faster than ``below``."""
        model, net = self.model, self.model.net
        join = after[0] if after else None  # the join leads them
        laid: dict[int, LayerLayouts] = {}
        costs = []
        try:
            for k in after:
                first = net.producers(k)[0]
                known = {first: fork.with_shape((model.batch, *_shape(net, first)))
                         if k == join else laid[first].output}
                laid[k] = model.layer_layouts(k, model.fed(k, known), FOLLOW)
                costs.append(model.layer_cost(k, "follow", laid[k],
                                              None if k == join else laid[first].output))
        except SplitError:
            return None
        if join is None or slowest_latency(costs) >= self.below:
            return None
        model.time_layers(costs)
        return laid, costs

    def _on_groups(self, prices: RegionPrices, where: dict[int, LayerLayouts],
                   after_join: tuple[dict[int, LayerLayouts], list[LayerCost]], free: float
                   ) -> tuple[dict[int, LayerLayouts], float, dict[int, LayerPlan]] | None:
        """For the fork's segment on ``where`` and the carrier's layers from the join on
        ``after_join`` (:meth:`_after_join`): those layers' layouts, the seconds of the region
        on groups and of those layers, and the plan of the weighted layers inside; None when
        some branch cannot run."""
        laid, costs = after_join
        join = prices.grouped.region.join
        # what the region reads decides its cost, whatever ``free`` is; priced in _add
        found = prices.on_groups[_region_key(where, after_join, join)]
        if found is None:
            return None
        seconds, plan = found
        return laid, seconds + time_with_free(costs, free), plan

    def plan_of(self, chosen: list[int]) -> list[LayerPlan]:
        """The per-layer plan of one value per segment."""
        model = self.model
        plan = [FOLLOW] * len(model.net.layers)
        for s, index in enumerate(chosen):
            value = self.value(s, index)
            if isinstance(value, LayerPlan):
                plan[model.heads[s]] = value
            elif isinstance(value, OnGroups):
                for head, entry in self._plans[value.region, value.layout].items():
                    plan[head] = entry
        return plan
