"""Variable elimination against enumeration of every combination (serial)."""

import itertools

import numpy as np
import pytest

from hpctrain.elimination import Table, TooLarge, elimination_order, minimise


def total(tables, choice):
    return sum(float(t.values[tuple(choice[v] for v in t.variables)]) for t in tables)


@pytest.mark.parametrize("seed", range(40))
def test_the_minimum_and_its_choices_equal_enumeration(seed):
    """Random tables of 0 to 3 variables over 1 to 6 variables: series-parallel or not
    (three-variable tables and random pairs make cycles and cliques)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    sizes = [int(rng.integers(1, 4)) for _ in range(n)]
    tables = []
    for _ in range(int(rng.integers(0, 10))):
        k = int(rng.integers(0, min(3, n) + 1))
        variables = tuple(int(v) for v in rng.choice(n, size=k, replace=False))
        tables.append(Table(variables, rng.random([sizes[v] for v in variables])))
    best, choice = minimise(sizes, tables)
    brute = min(total(tables, c) for c in itertools.product(*map(range, sizes)))
    assert best == pytest.approx(brute, rel=1e-12, abs=1e-12)
    assert total(tables, choice) == pytest.approx(brute, rel=1e-12, abs=1e-12)


def test_a_chain_of_many_variables_stays_small():
    """200 variables of 27 choices in a chain with a shortcut every 3 (a ResNet's shape): the
    tables never exceed three variables, so this is quick."""
    rng = np.random.default_rng(1)
    n, s = 200, 27
    tables = [Table((v,), rng.random(s)) for v in range(n)]
    tables += [Table((v, v + 1), rng.random((s, s))) for v in range(n - 1)]
    tables += [Table((v, v + 3), rng.random((s, s))) for v in range(0, n - 3, 3)]
    order = elimination_order([s] * n, [t.variables for t in tables])
    assert max(len(rest) for _, rest in order) <= 2  # tables of at most three variables
    best, choice = minimise([s] * n, tables)
    assert total(tables, choice) == pytest.approx(best, rel=1e-12)
    # a single change of one variable never beats the optimum
    for v in range(0, n, 17):
        for c in range(s):
            other = list(choice)
            other[v] = c
            assert total(tables, other) >= best - 1e-9


def test_a_densely_connected_graph_is_refused_before_any_work():
    """Every variable tied to every other: eliminating any one makes a table over all the
    rest, 10**12 entries here; refused from the sizes alone."""
    n, s = 12, 10
    tables = [Table((a, b), np.zeros((s, s))) for a in range(n) for b in range(a + 1, n)]
    with pytest.raises(TooLarge, match="entries"):
        minimise([s] * n, tables)
