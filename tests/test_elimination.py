"""Variable elimination against enumeration of every combination (serial)."""

import itertools

import numpy as np
import pytest

from hpctrain.plan.elimination import (
    Table,
    TooLarge,
    _undominated,
    elimination_order,
    minimise,
    minimise_each,
    minimise_under_cap,
)


def at(table, what, choice):
    """``table``'s ``what`` (values, memory or moment) at the variables' choices."""
    value = np.asarray(getattr(table, what))
    return float(value[tuple(choice[v] for v in table.variables)] if value.ndim else value)


def total(tables, choice, what="values"):
    return sum(at(t, what, choice) for t in tables)


def memory(tables, choice):
    """Bytes kept, summed over the tables, plus the largest moment."""
    return total(tables, choice, "memory") + max((at(t, "moment", choice) for t in tables),
                                                 default=0.0)


def random_tables(seed, weighed=False):
    """Random tables of 0 to 3 variables over 1 to 6 variables: series-parallel or not
    (three-variable tables and random pairs make cycles and cliques); ``weighed``: with
    whole-byte memory and moments, which make ties."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    sizes = [int(rng.integers(1, 4)) for _ in range(n)]
    tables = []
    for _ in range(int(rng.integers(0, 10))):
        k = int(rng.integers(0, min(3, n) + 1))
        variables = tuple(int(v) for v in rng.choice(n, size=k, replace=False))
        shape = [sizes[v] for v in variables]
        if weighed:
            tables.append(Table(variables, rng.random(shape),
                                rng.integers(0, 6, shape).astype(float),
                                rng.integers(0, 9, shape).astype(float)))
        else:
            tables.append(Table(variables, rng.random(shape)))
    return sizes, tables


@pytest.mark.parametrize("seed", range(40))
def test_the_minimum_and_its_choices_equal_enumeration(seed):
    sizes, tables = random_tables(seed)
    best, choice = minimise(sizes, tables)
    brute = min(total(tables, c) for c in itertools.product(*map(range, sizes)))
    assert best == pytest.approx(brute, rel=1e-12, abs=1e-12)
    assert total(tables, choice) == pytest.approx(brute, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("seed", range(60))
def test_the_minimum_under_a_cap_equals_enumeration(seed):
    """Every cap from the leanest combination's memory to the largest: the least time among
    the combinations that fit, and choices that fit and reach it; None where nothing fits."""
    sizes, tables = random_tables(seed, weighed=True)
    combos = list(itertools.product(*map(range, sizes)))
    needs = sorted({memory(tables, c) for c in combos})
    for cap in [needs[0] - 1, *needs]:
        fitting = [total(tables, c) for c in combos if memory(tables, c) <= cap]
        found = minimise_under_cap(sizes, tables, cap)
        if not fitting:
            assert found is None
            continue
        best, choice = found
        assert best == pytest.approx(min(fitting), rel=1e-12, abs=1e-12)
        assert total(tables, choice) == pytest.approx(best, rel=1e-12, abs=1e-12)
        assert memory(tables, choice) <= cap
        # a known plan's time as the bound changes nothing but the work
        assert minimise_under_cap(sizes, tables, cap, bound=best + 1e-9)[0] == (
            pytest.approx(best, rel=1e-12, abs=1e-12))
        assert minimise_under_cap(sizes, tables, cap, bound=best - 1e-6) is None


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


def test_fronts_that_grow_past_the_budget_under_a_cap_are_refused():
    """A chain whose every choice trades time for memory keeps every label undominated: the
    fronts grow by a factor of its choices at each step. Past ``max_entries`` labels the
    search stops with :class:`TooLarge` (the planner then falls back to one grid), where it
    would otherwise exhaust the machine's memory."""
    n, s = 9, 4  # 4**9 = 262,144 labels at the end, all undominated
    time = np.arange(s, dtype=float)[::-1] * 1.0  # the faster choice needs more memory
    kept = np.arange(s, dtype=float)
    tables = [Table((v,), time * 4.0 ** v, kept * 4.0 ** v, np.zeros(s)) for v in range(n)]
    tables += [Table((v, v + 1), np.zeros((s, s))) for v in range(n - 1)]
    cap = float(sum((s - 1) * 4.0 ** v for v in range(n))) / 2
    found = minimise_under_cap([s] * n, tables, cap)  # the budget holds this one
    assert found is not None and memory(tables, found[1]) <= cap
    with pytest.raises(TooLarge, match="labels"):
        minimise_under_cap([s] * n, tables, cap, max_entries=1000)


def undominated_by_pairs(group, time, memory, moment):
    """The definition: in (group, time, memory, moment) order, the labels that no label before
    them in their group beats or equals in memory and moment."""
    order = np.lexsort((moment, memory, time, group))
    return np.array([i for k, i in enumerate(order)
                     if not any(group[j] == group[i] and memory[j] <= memory[i]
                                and moment[j] <= moment[i] for j in order[:k])], dtype=int)


@pytest.mark.parametrize("seed", range(300))
def test_the_undominated_labels_are_those_of_the_definition(seed):
    """Small value ranges make ties and dominance common; few or many distinct moments against
    small or large groups take each of the two ways of finding them."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    group = rng.integers(0, int(rng.integers(1, 5)), n)
    time, memory = (rng.integers(0, 6, n).astype(float) for _ in range(2))
    moment = rng.integers(0, int(rng.integers(1, 12)), n).astype(float)
    np.testing.assert_array_equal(_undominated(group, time, memory, moment),
                                  undominated_by_pairs(group, time, memory, moment))


@pytest.mark.parametrize("seed", range(60))
def test_the_sum_made_in_one_array_is_the_sum_from_zero_and_leaves_the_tables(seed):
    """Each step's sum of the tables that mention its variable, added into one array made
    once (in place where the shapes allow) and its least read at the argmin, against the
    plain sum from a zero array and a second reduction, to the bit; no table is written."""
    from hpctrain.plan.elimination import _aligned, _at, _summed

    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, 5)) for _ in range(4)]
    tables = []
    for _ in range(int(rng.integers(1, 6))):
        variables = tuple(rng.permutation(4)[:int(rng.integers(0, 4))].tolist())
        shape = [sizes[v] for v in variables]
        values = rng.random(shape) * 10.0 ** int(rng.integers(-6, 3))
        if rng.random() < 0.3:  # whole numbers make ties; an integer table joins a float sum
            values = np.floor(values * 4).astype(np.int64 if rng.random() < 0.5 else float)
        tables.append(Table(variables, values))
    scope = tuple(rng.permutation(4).tolist())
    copies = [np.array(t.values, copy=True) for t in tables]
    shape = [sizes[v] for v in scope]
    plain = np.zeros(shape)
    for table in tables:
        plain = plain + _aligned(table, scope)
    found = _summed(tables, scope, shape)
    assert found.shape == plain.shape and found.tobytes() == plain.tobytes()
    argmin = np.argmin(found, axis=-1)
    assert np.array_equal(argmin, np.argmin(plain, axis=-1))
    assert _at(found, argmin).tobytes() == np.min(plain, axis=-1).tobytes()
    for table, before in zip(tables, copies, strict=True):
        assert np.array_equal(table.values, before)


def test_one_variable_is_the_sum_of_its_rows_first_least_as_the_elimination_finds_it():
    """A problem of one variable (a branch of one segment) is solved without the elimination's
    steps: the same least sum and the same first choice reaching it, ties and infinities
    included, as the general steps give it with a second variable of one choice beside."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        tables = [Table((0,), rng.choice([0.5, 1.0, 2.0, np.inf], size=n) * rng.integers(1, 3))
                  for _ in range(int(rng.integers(1, 5)))]
        alone = minimise([n], tables)
        least, chosen = minimise([n, 1], [*tables, Table((1,), np.zeros(1))])
        assert alone == (least, chosen[:1])


@pytest.mark.parametrize("seed", range(60))
def test_many_sums_differing_in_some_tables_are_each_solved_as_alone(seed):
    """Sums over the same scopes whose tables of one variable differ between them (a branch
    under each layout of its fork) get, solved at once, each the choices :func:`minimise`
    gives it alone: ties (values of few distinct sizes) and infinities included."""
    sizes, shared = random_tables(seed)
    rng = np.random.default_rng(1000 + seed)
    count = int(rng.integers(1, 6))
    levels = np.array([0.25, 0.5, 1.0, np.inf])
    shared = [Table(t.variables, levels[rng.integers(0, 3, np.shape(t.values))])
              if seed % 2 else t for t in shared]
    differing = [(v, levels[rng.integers(0, 4, (count, sizes[v]))])
                 for v in rng.integers(0, len(sizes), int(rng.integers(0, 4)))]
    each = minimise_each(sizes, [*shared, *(Table((int(v),), values)
                                            for v, values in differing)], count)
    for i, chosen in enumerate(each):
        alone = [*shared, *(Table((int(v),), values[i]) for v, values in differing)]
        assert chosen == minimise(sizes, alone)[1]
