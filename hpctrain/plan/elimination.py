"""Exact minimisation of a sum of small cost tables by variable elimination (pure; NumPy).

A plan of a net with branches is one choice per segment; its predicted time is a sum of tables:
one per segment (its own cost under each choice) and one per move between segments (its cost
under each pair of choices). Eliminating the variables one by one — combine every table that
mentions a variable, keep the minimum over it for each choice of the others, remember the
argmin — finds the exact minimum. The work is set by the largest table made on the way: on a
series-parallel graph (ResNet, Inception), eliminating a variable of degree ≤ 2 first makes
tables of at most three variables, S³ entries for S choices per segment; on any other graph the
greedy min-degree order still gives the exact minimum, with tables that can grow exponentially
(a net whose every segment reads every earlier one): their size is known before any work, and
past a limit :func:`minimise` refuses.

Example: three variables a, b, c with costs t(a) + m(a, b) + m(a, c) + m(b, c) (a triangle):
eliminating c makes a table over (a, b), eliminating b one over a, and the minimum over a is the
optimum; walking back the argmins gives the choices.

Under a memory cap (:func:`minimise_under_cap`) every table also gives, per combination, bytes
kept (summed over tables) and bytes held for a moment (the largest over tables counts), and the
total kept plus the largest moment must fit the cap. One number per combination no longer
suffices: eliminating a variable keeps, for each choice of the others, every (time, kept,
moment) triple that no other beats in all three — a Pareto front of labels. That is still exact,
since the sum and the maximum only grow as tables are added: the optimum under the cap extends a
label of every front. Labels that cannot fit even if every table not yet added took its least
memory, or cannot beat a known plan even at every such table's least time, are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass
class Table:
    """Cost of every combination of choices of ``variables``: ``values[i, j, …]`` for choice i
    of the first variable, j of the second, …; under a cap also the bytes it keeps
    (``memory``, summed over tables) and holds for a moment (``moment``, the largest counts)."""

    variables: tuple[int, ...]
    values: np.ndarray
    memory: np.ndarray | float = 0.0
    moment: np.ndarray | float = 0.0


def _aligned(table: Table, scope: tuple[int, ...]) -> np.ndarray:
    """``table.values`` with its axes ordered as ``scope`` and broadcastable over it."""
    positions = [scope.index(v) for v in table.variables]
    values = np.asarray(table.values)
    if positions != sorted(positions):
        values = np.transpose(values, sorted(range(len(positions)), key=positions.__getitem__))
        positions.sort()
    shape = [1] * len(scope)
    for axis, position in enumerate(positions):
        shape[position] = values.shape[axis]
    return values.reshape(shape)


class TooLarge(ValueError):
    """Eliminating in any order found would make a table of more entries than allowed."""


def elimination_order(sizes: list[int], scopes: list[tuple[int, ...]]
                      ) -> list[tuple[int, tuple[int, ...]]]:
    """The greedy min-degree order for tables over ``scopes``: (variable, the other variables
    of the table its elimination makes), in order. Symbolic: no table is touched."""
    return list(_order_of(len(sizes), tuple(scopes)))


@lru_cache(maxsize=256)
def _order_of(count: int, scopes: tuple[tuple[int, ...], ...]
              ) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """:func:`elimination_order` of ``count`` variables, found once per set of scopes: a
    search solves the same net's tables at every round of the last buckets."""
    neighbours: list[set[int]] = [set() for _ in range(count)]
    for scope in scopes:
        for v in scope:
            neighbours[v] |= set(scope) - {v}
    remaining = set(range(count))
    order = []
    while remaining:
        variable = min(remaining, key=lambda v: (len(neighbours[v]), v))
        remaining.discard(variable)
        rest = tuple(sorted(neighbours[variable]))
        for v in rest:  # the new table joins every pair of the variable's neighbours
            neighbours[v] |= set(rest) - {v}
            neighbours[v].discard(variable)
        order.append((variable, rest))
    return tuple(order)


def largest_table(sizes: list[int], scopes: list[tuple[int, ...]]) -> int:
    """Entries of the largest table eliminating in :func:`elimination_order` makes."""
    return max((math.prod(sizes[v] for v in (*rest, variable))
                for variable, rest in elimination_order(sizes, scopes)), default=0)


def _checked_order(sizes: list[int], tables: list[Table], max_entries: float
                   ) -> list[tuple[int, tuple[int, ...]]]:
    """:func:`elimination_order`, refused (:class:`TooLarge`) before any work when it would
    make a table of more than ``max_entries`` entries."""
    order = elimination_order(sizes, [t.variables for t in tables])
    largest = max((math.prod(sizes[v] for v in (*rest, variable)) for variable, rest in order),
                  default=0)
    if largest > max_entries:
        raise TooLarge(f"exact elimination needs a table of {largest:.3g} entries "
                       f"(at most {max_entries:.3g})")
    return order


MAX_ENTRIES = 1e7
"""The largest table exact elimination makes (80 MB of float64)."""


def minimise(sizes: list[int], tables: list[Table], max_entries: float = MAX_ENTRIES
             ) -> tuple[float, list[int]]:
    """(least total cost, the choice of each variable reaching it) over ``sizes[v]`` choices of
    each variable v, the total being the sum of every table at the choices.

    Raises :class:`TooLarge` before any work when the order found would make a table of more
    than ``max_entries`` entries (a densely connected graph: every segment reading every
    earlier one)."""
    if len(sizes) == 1 and tables and all(t.variables == (0,) for t in tables):
        # one variable (a branch of one segment, hundreds of times per search): the same
        # sum in the same order, its first least entry, without the elimination's steps
        total = np.asarray(tables[0].values, dtype=float)
        for table in tables[1:]:
            total = total + table.values
        at = int(np.argmin(total))
        return 0.0 + float(total[at]), [at]
    order = _checked_order(sizes, tables, max_entries)
    pending, mentioning = _pending(tables, len(sizes))
    steps: list[tuple[int, tuple[int, ...], np.ndarray]] = []  # (variable, rest, argmin)
    constant = 0.0
    for variable, rest in order:
        touching = [pending.pop(n) for n in mentioning[variable] if n in pending]
        scope = (*rest, variable)
        total = _summed(touching, scope, [sizes[v] for v in scope])
        argmin = np.argmin(total, axis=-1)
        steps.append((variable, rest, argmin))
        best = _at(total, argmin)  # the minimum
        if rest:
            number = len(tables) + len(steps)
            pending[number] = Table(rest, best)
            for v in rest:
                mentioning[v].append(number)
        else:
            constant += float(best)
    for table in pending.values():  # tables over no variable
        constant += float(table.values)
    choice = [0] * len(sizes)
    for variable, rest, argmin in reversed(steps):
        choice[variable] = int(argmin[tuple(choice[v] for v in rest)])
    return constant, choice


def _pending(tables: list[Table], count: int) -> tuple[dict[int, Table], list[list[int]]]:
    """The tables not yet combined, by number in the order they came (the given ones; the
    elimination numbers each one it makes after them), and the numbers of those that mention
    each of ``count`` variables."""
    mentioning: list[list[int]] = [[] for _ in range(count)]
    for number, table in enumerate(tables):
        for v in table.variables:
            mentioning[v].append(number)
    return dict(enumerate(tables)), mentioning


def minimise_each(sizes: list[int], tables: list[Table], count: int) -> list[list[int]]:
    """:func:`minimise`'s choice of each variable for each of ``count`` sums over the same
    variables and scopes that differ in some tables: a table whose values have one axis more
    than its variables (first, of ``count`` entries) gives each sum its own entry along it, the
    others are shared. Each sum's entries are added in the order :func:`minimise` adds them,
    and the first least taken as it takes it, so the choices are its choices, found for all
    the sums at once: a region prices each branch under tens of layouts of its fork."""
    own = [np.ndim(t.values) > len(t.variables) for t in tables]
    # every table with the sums' axis first, 1 long where it is shared
    batched = [Table(t.variables, np.asarray(t.values, dtype=float) if mine
                     else np.asarray(t.values, dtype=float)[None])
               for t, mine in zip(tables, own, strict=True)]
    if len(sizes) == 1 and tables and all(t.variables == (0,) for t in tables):
        total = batched[0].values  # minimise's one-variable sum, row by row
        for table in batched[1:]:
            total = total + table.values
        at = np.argmin(np.broadcast_to(total, (count, sizes[0])), axis=-1)
        return [[int(a)] for a in at]
    order = _checked_order(sizes, tables, MAX_ENTRIES)
    pending, mentioning = _pending(batched, len(sizes))
    steps: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    for variable, rest in order:
        touching = [pending.pop(n) for n in mentioning[variable] if n in pending]
        scope = (*rest, variable)
        total = _summed_each(touching, scope, [count, *(sizes[v] for v in scope)])
        argmin = np.argmin(total, axis=-1)
        steps.append((variable, rest, argmin))
        if rest:
            number = len(tables) + len(steps)
            pending[number] = Table(rest, np.take_along_axis(total, argmin[..., None],
                                                             axis=-1)[..., 0])
            for v in rest:
                mentioning[v].append(number)
    chosen = []
    for each in range(count):
        choice = [0] * len(sizes)
        for variable, rest, argmin in reversed(steps):
            choice[variable] = int(argmin[(each, *(choice[v] for v in rest))])
        chosen.append(choice)
    return chosen


def _summed_each(tables: list[Table], scope: tuple[int, ...], shape: list[int]) -> np.ndarray:
    """:func:`_summed` of tables whose values lead with the sums' axis (``shape[0]`` long, or
    1 where shared), in their order."""
    total = None
    for table in tables:
        values = table.values
        aligned = _aligned(Table((-1, *table.variables), values), (-1, *scope))
        total = aligned if total is None else total + aligned
    return np.broadcast_to(np.zeros(shape) if total is None else total, shape)


@dataclass
class _Front:
    """A table whose every combination holds labels (time, kept, moment), flat: label i belongs
    to combination ``key[i]`` (its index in C order over ``variables``), keys ascending.
    ``least``: the least time and the least memory of the given tables inside it, summed (what
    the bounds take off). ``made``: how its labels were made (None for a given table): the
    eliminated variable, its choice per label, and per joined front the label taken."""

    variables: tuple[int, ...]
    key: np.ndarray
    time: np.ndarray
    memory: np.ndarray
    moment: np.ndarray
    least: tuple[float, float]
    made: tuple[int, np.ndarray, list[tuple[_Front, np.ndarray]]] | None = None


def _summed(tables: list[Table], scope: tuple[int, ...], shape: list[int]) -> np.ndarray:
    """The sum of ``tables`` over ``scope`` (of ``shape``), added in their order as a sum
    from zero would be (adding to 0.0 changes no value), into one array made once."""
    if not tables:
        return np.zeros(shape)
    total = _aligned(tables[0], scope).astype(float, copy=False)
    for table in tables[1:]:
        values = _aligned(table, scope)
        if total.base is None and all(a == b or b == 1 for a, b in zip(total.shape,
                                                                      values.shape)):
            total += values  # an array of this sum's own, as large: in place
        else:
            total = np.add(total, values, order="C")
    if list(total.shape) != shape:
        total = np.broadcast_to(total, shape)
    return total


def _at(total: np.ndarray, argmin: np.ndarray) -> np.ndarray:
    """``total``'s entries at ``argmin`` along its last axis: its minimum there, read at
    the argmin found (a second reduction costs several times as much)."""
    if not total.flags.c_contiguous:
        return np.take_along_axis(total, argmin[..., None], axis=-1)[..., 0]
    rows = total.reshape(-1, total.shape[-1])
    return rows[np.arange(len(rows)), np.ravel(argmin)].reshape(np.shape(argmin))


def _front_of(table: Table, sizes: list[int]) -> _Front:
    shape = [sizes[v] for v in table.variables]
    values = np.broadcast_to(np.asarray(table.values, float), shape).ravel()
    memory = np.broadcast_to(np.asarray(table.memory, float), shape).ravel()
    moment = np.broadcast_to(np.asarray(table.moment, float), shape).ravel()
    return _Front(table.variables, np.arange(values.size), values, memory, moment,
                  (float(values.min()), float(memory.min())))


def _join(scope: tuple[int, ...], sizes: list[int], fronts: list[_Front], cap: float,
          bound: float, least: tuple[float, float], max_entries: float = MAX_ENTRIES
          ) -> tuple[np.ndarray, ...]:
    """Every combination of one label of each front, per combination of ``scope``: (key over
    scope, time, memory, moment, the label taken from each front), without the labels that
    cannot fit ``cap`` or beat ``bound`` whatever the tables outside (``least``: their least
    time and memory, summed over all tables) add.

    :class:`TooLarge` before a join of more than ``max_entries`` combinations is made: under a
    cap that binds, fronts of undominated labels can grow with every variable eliminated (a
    DeepCAM of 150 segments at P = 512 asked for 183 M labels, 24 GB), where the tables of
    :func:`minimise` stay bounded by the order."""
    dims = [sizes[v] for v in scope]
    key = np.arange(math.prod(dims))
    time, memory, moment = np.zeros(key.size), np.zeros(key.size), np.zeros(key.size)
    taken: list[np.ndarray] = []
    outside_time, outside_memory = least
    coords = dict(zip(scope, np.unravel_index(key, dims) if dims else [], strict=True))
    for front in fronts:
        sub = np.zeros(key.size, dtype=np.int64)
        for v in front.variables:  # the front's key of each label's combination
            sub = sub * sizes[v] + coords[v]
        start = np.searchsorted(front.key, sub, "left")
        count = np.searchsorted(front.key, sub, "right") - start
        combinations = int(count.sum())
        if combinations > max_entries:
            raise TooLarge(f"the plans under the memory cap need {combinations:.3g} labels "
                           f"in one step of the elimination, over {max_entries:.3g}")
        repeat = np.repeat(np.arange(key.size), count)
        picked = start[repeat] + np.arange(repeat.size) - np.repeat(np.cumsum(count) - count,
                                                                     count)
        outside_time -= front.least[0]
        outside_memory -= front.least[1]
        time = time[repeat] + front.time[picked]
        memory = memory[repeat] + front.memory[picked]
        moment = np.maximum(moment[repeat], front.moment[picked])
        keep = ((memory + moment + outside_memory <= cap)
                & (time + outside_time <= bound))
        key, time, memory, moment = key[repeat][keep], time[keep], memory[keep], moment[keep]
        taken = [t[repeat][keep] for t in taken] + [picked[keep]]
        coords = {v: c[repeat][keep] for v, c in coords.items()}
    return key, time, memory, moment, taken


def _undominated(group: np.ndarray, time: np.ndarray, memory: np.ndarray,
                 moment: np.ndarray) -> np.ndarray:
    """Indices, sorted by (group, time, memory, moment), of the labels that no other label of
    their group beats or equals in all three (of equal labels, one is kept).

    In that order a label can only be beaten by one before it: one of its group with no more
    memory and no larger moment. Two exact ways find them, the cheaper for the labels at hand:
    comparing each label with the one ``shift`` places before it, for every shift up to the
    largest group (O(labels × group)); or, per distinct moment u, a running minimum of the
    memory of the labels with moment ≤ u, read by the labels whose moment is u (O(labels ×
    moments)). Fronts have few distinct moments (a moment is one layer's transient memory)
    but, on a machine with levels, groups of thousands of labels.
    """
    order = np.lexsort((moment, memory, time, group))
    if order.size == 0:
        return order
    group, memory, moment = group[order], memory[order], moment[order]
    starts = np.r_[True, group[1:] != group[:-1]]
    largest = int(np.diff(np.flatnonzero(np.r_[starts, True])).max(initial=1))
    moments, moment_rank = np.unique(moment, return_inverse=True)
    if moments.size < largest:
        return order[~_beaten_by_running_minimum(np.cumsum(starts) - 1, memory, moment_rank,
                                                 moments.size)]
    beaten = np.zeros(order.size, dtype=bool)
    for shift in range(1, largest):
        same = group[shift:] == group[:-shift]
        beaten[shift:] |= (same & (memory[:-shift] <= memory[shift:])
                           & (moment[:-shift] <= moment[shift:]))
    return order[~beaten]


def _beaten_by_running_minimum(group: np.ndarray, memory: np.ndarray, moment: np.ndarray,
                               moments: int) -> np.ndarray:
    """Which labels (sorted as in :func:`_undominated`; ``group`` numbered 0, 1, … in order,
    ``moment`` a rank among ``moments``) an earlier label of their group beats.

    Each label gets one integer key that orders groups backwards and memories forwards:
    ``(last group − group)·M + memory rank``. A running minimum of the keys then never carries
    a value from an earlier group into a later one's labels below that group's own keys, so
    label i is beaten iff the minimum over the labels before it (with moment ≤ its own) is at
    most its own key."""
    ranks, memory_rank = np.unique(memory, return_inverse=True)
    span = ranks.size
    key = (int(group[-1]) - group).astype(np.int64) * span + memory_rank
    beaten = np.zeros(group.size, dtype=bool)
    never = np.iinfo(np.int64).max
    # the keys of the labels with moment ≤ u, the others never; grown one moment at a time
    allowed = np.full(group.size, never)
    before = np.empty(group.size + 1, dtype=np.int64)  # before[i]: the minimum over labels < i
    before[0] = never
    by_moment = np.argsort(moment, kind="stable")
    bounds = np.searchsorted(moment[by_moment], np.arange(moments + 1))
    for u in range(moments):
        here = by_moment[bounds[u]:bounds[u + 1]]
        allowed[here] = key[here]
        np.minimum.accumulate(allowed, out=before[1:])
        beaten[here] = before[here] <= key[here]
    return beaten


def minimise_under_cap(sizes: list[int], tables: list[Table], cap: float,
                       bound: float = math.inf, max_entries: float = MAX_ENTRIES
                       ) -> tuple[float, list[int]] | None:
    """(least total time, the choice of each variable reaching it) among the choices whose
    total memory (every table's ``memory`` summed, plus the largest ``moment``) is at most
    ``cap``; None if none fits, or none fitting is faster than ``bound`` (a known plan's
    time: labels that cannot beat it are dropped early). :class:`TooLarge` as
    :func:`minimise`."""
    order = _checked_order(sizes, tables, max_entries)
    pending = [_front_of(t, sizes) for t in tables]
    least = (sum(f.least[0] for f in pending), sum(f.least[1] for f in pending))
    for variable, rest in order:
        touching = [f for f in pending if variable in f.variables]
        pending = [f for f in pending if variable not in f.variables]
        key, time, memory, moment, taken = _join((*rest, variable), sizes, touching, cap,
                                                  bound, least, max_entries)
        group, choice = np.divmod(key, sizes[variable])
        kept = _undominated(group, time, memory, moment)
        inside = tuple(sum(f.least[i] for f in touching) for i in range(2))
        pending.append(_Front(rest, group[kept], time[kept], memory[kept], moment[kept],
                              inside, (variable, choice[kept],
                                       [(f, t[kept]) for f, t in zip(touching, taken,
                                                                     strict=True)])))
    _, time, memory, moment, taken = _join((), sizes, pending, cap, bound, least, max_entries)
    if time.size == 0:
        return None
    best = int(np.argmin(time))
    choice = [0] * len(sizes)
    stack = [(f, int(t[best])) for f, t in zip(pending, taken, strict=True)]
    while stack:  # walk back through the labels the best one was made of
        front, label = stack.pop()
        if front.made is not None:
            variable, choices, joined = front.made
            choice[variable] = int(choices[label])
            stack += [(f, int(t[label])) for f, t in joined]
    return float(time[best]), choice
