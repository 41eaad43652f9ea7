"""Layouts: coordinates, blocks and the Pr = 1 normalisation (pure maths)."""

import pickle

import numpy as np
import pytest

from hpctrain.layout.layout import (
    CHANNEL_AXIS,
    HEIGHT_AXIS,
    Layout,
    box_size,
    grid_coords,
    largest_block,
    relative_slices,
)


def test_rank_coordinates_worked_example():
    # ranks 0..5 on a 2x3 grid: model groups {0,1} {2,3} {4,5}
    assert [grid_coords(r, (2, 3)) for r in range(6)] == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]


def layouts(shape, p):
    out = []
    for pr in [d for d in range(1, p + 1) if p % d == 0]:
        for axis in (None, CHANNEL_AXIS, HEIGHT_AXIS):
            if axis is None or shape[axis] >= pr:
                out.append(Layout(shape, (pr, p // pr), axis))
    return out


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_blocks_tile_the_tensor_once_per_replica(p):
    shape = (7, 5, 6, 3)
    for layout in layouts(shape, p):
        count = np.zeros(shape, int)
        for r in range(p):
            count[relative_slices(layout.box(r), tuple((0, n) for n in shape))] += 1
        replicas = p // len({layout.box(r) for r in range(p)})
        assert (count == replicas).all(), layout


def test_pr_one_has_no_split():
    layout = Layout((4, 6, 8, 8), (1, 4), CHANNEL_AXIS)
    assert layout.split_axis is None and layout == Layout((4, 6, 8, 8), (1, 4))
    assert box_size(layout.box(3)) == 1 * 6 * 8 * 8


def test_explicit_ranges_equal_to_the_block_rule_give_an_equal_layout():
    """Block ranges are made on demand, yet a layout given the same ranges explicitly (a
    flattened channel split whose blocks happen to match) is equal and hashes alike."""
    rule = Layout((4, 72), (4, 1), CHANNEL_AXIS)
    given = Layout((4, 72), (4, 1), CHANNEL_AXIS, ((0, 18), (18, 36), (36, 54), (54, 72)))
    other = Layout((4, 72), (4, 1), CHANNEL_AXIS, ((0, 20), (20, 36), (36, 54), (54, 72)))
    assert rule == given and hash(rule) == hash(given) and len({rule: 1, given: 2}) == 1
    assert rule != other
    assert largest_block(rule) == largest_block(given) == (4, 18)
    assert largest_block(other) == (4, 20)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_largest_block_is_the_largest_rank_block(p):
    shape = (7, 5, 6, 3)
    for layout in layouts(shape, p):
        assert largest_block(layout) == tuple(
            max(hi - lo for lo, hi in axis)
            for axis in zip(*(layout.box(r) for r in range(p)), strict=True))


def test_a_pickled_layout_is_equal_and_hashes_alike():
    layout = Layout((8, 4, 6, 6), (2, 2), HEIGHT_AXIS)
    copy = pickle.loads(pickle.dumps(layout))
    assert copy == layout and hash(copy) == hash(layout) and copy.box(3) == layout.box(3)


def test_a_derived_layout_is_made_once_and_equals_one_made_anew():
    """A layout moved onto a group, reshaped or with cuts made replicas is shared between
    askers, and is the layout made from its fields; a layout's facts cannot be set."""
    layout = Layout((8, 4, 6, 6), mesh=(2, 2, 2), axes=(0, 1, 2))
    moved = layout.on_ranks(8, 32)
    assert moved is layout.on_ranks(8, 32)
    assert moved == Layout((8, 4, 6, 6), mesh=(2, 2, 2), axes=(0, 1, 2), first=8, procs=32)
    assert (moved.size, moved.parts, moved.replicas) == (8, (2, 2, 2, 1), 1)
    replicated = layout.without((HEIGHT_AXIS,))
    assert replicated is layout.without((HEIGHT_AXIS,))
    assert (replicated.parts, replicated.replicas, replicated.spatial_cuts) == (
        (2, 2, 1, 1), 2, ())
    assert layout.spatial_cuts == (HEIGHT_AXIS,) and layout.cut_axes == (CHANNEL_AXIS, HEIGHT_AXIS)
    reshaped = layout.with_shape((8, 4, 12, 6))
    assert reshaped is layout.with_shape((8, 4, 12, 6))
    assert reshaped == Layout((8, 4, 12, 6), mesh=(2, 2, 2), axes=(0, 1, 2))
    assert reshaped.largest_block == (4, 2, 6, 6)
    with pytest.raises(AttributeError):
        layout.size = 4


def test_explicit_ranges_given_as_lists_key_as_tuples():
    """Ranges given as lists are kept as tuples: the layout equals itself moved away and back,
    and equals the layout given the same ranges as tuples."""
    layout = Layout((4, 12), (2, 1), CHANNEL_AXIS, [[0, 5], [5, 12]])
    assert layout == Layout((4, 12), (2, 1), CHANNEL_AXIS, ((0, 5), (5, 12)))
    assert layout.on_ranks(0, 4).on_ranks(0, 2) == layout
    assert layout.largest_block == (4, 7)
