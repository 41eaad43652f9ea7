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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class Table:
    """Cost of every combination of choices of ``variables``: ``values[i, j, …]`` for choice i
    of the first variable, j of the second, …"""

    variables: tuple[int, ...]
    values: np.ndarray


def _aligned(table: Table, scope: tuple[int, ...]) -> np.ndarray:
    """``table.values`` with its axes ordered as ``scope`` and broadcastable over it."""
    order = sorted(range(len(table.variables)), key=lambda a: scope.index(table.variables[a]))
    values = np.transpose(table.values, order)
    shape = [1] * len(scope)
    for axis, variable in enumerate(sorted(table.variables, key=scope.index)):
        shape[scope.index(variable)] = values.shape[axis]
    return values.reshape(shape)


class TooLarge(ValueError):
    """Eliminating in any order found would make a table of more entries than allowed."""


def elimination_order(sizes: list[int], scopes: list[tuple[int, ...]]
                      ) -> list[tuple[int, tuple[int, ...]]]:
    """The greedy min-degree order for tables over ``scopes``: (variable, the other variables
    of the table its elimination makes), in order. Symbolic: no table is touched."""
    neighbours: list[set[int]] = [set() for _ in sizes]
    for scope in scopes:
        for v in scope:
            neighbours[v] |= set(scope) - {v}
    remaining = set(range(len(sizes)))
    order = []
    while remaining:
        variable = min(remaining, key=lambda v: (len(neighbours[v]), v))
        remaining.discard(variable)
        rest = tuple(sorted(neighbours[variable]))
        for v in rest:  # the new table joins every pair of the variable's neighbours
            neighbours[v] |= set(rest) - {v}
            neighbours[v].discard(variable)
        order.append((variable, rest))
    return order


def minimise(sizes: list[int], tables: list[Table], max_entries: float = 1e7
             ) -> tuple[float, list[int]]:
    """(least total cost, the choice of each variable reaching it) over ``sizes[v]`` choices of
    each variable v, the total being the sum of every table at the choices.

    Raises :class:`TooLarge` before any work when the order found would make a table of more
    than ``max_entries`` entries (a densely connected graph: every segment reading every
    earlier one)."""
    order = elimination_order(sizes, [t.variables for t in tables])
    largest = max((math.prod(sizes[v] for v in (*rest, variable)) for variable, rest in order),
                  default=0)
    if largest > max_entries:
        raise TooLarge(f"exact elimination needs a table of {largest:.3g} entries "
                       f"(at most {max_entries:.3g})")
    pending = list(tables)
    steps: list[tuple[int, tuple[int, ...], np.ndarray]] = []  # (variable, rest, argmin)
    constant = 0.0
    for variable, rest in order:
        touching = [t for t in pending if variable in t.variables]
        pending = [t for t in pending if variable not in t.variables]
        scope = (*rest, variable)
        total = np.zeros([sizes[v] for v in scope])
        for table in touching:
            total = total + _aligned(table, scope)
        steps.append((variable, rest, np.argmin(total, axis=-1)))
        best = np.min(total, axis=-1)
        if rest:
            pending.append(Table(rest, best))
        else:
            constant += float(best)
    for table in pending:  # tables over no variable
        constant += float(table.values)
    choice = [0] * len(sizes)
    for variable, rest, argmin in reversed(steps):
        choice[variable] = int(argmin[tuple(choice[v] for v in rest)])
    return constant, choice
