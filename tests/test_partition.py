"""Block splits, factorisations and halo plans, checked against brute force."""

import pytest

from hpctrain.layout.partition import (
    SplitError,
    Window,
    block_range,
    block_ranges,
    check_split,
    factorisations,
    halo_plans,
    halo_row_counts,
)


@pytest.mark.parametrize("n,parts", [(10, 4), (7, 7), (5, 1), (100, 6), (3, 2)])
def test_blocks_cover_in_order_and_balance(n, parts):
    blocks = block_ranges(n, parts)
    assert blocks[0][0] == 0 and blocks[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    sizes = [hi - lo for lo, hi in blocks]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("n", [1, 7, 10, 13, 64, 101])
@pytest.mark.parametrize("coarse,fine", [(2, 4), (3, 6), (2, 6), (4, 8), (1, 5)])
def test_coarse_blocks_are_unions_of_fine_blocks(n, coarse, fine):
    m = fine // coarse
    for j in range(coarse):
        assert block_range(n, coarse, j) == (block_range(n, fine, j * m)[0],
                                             block_range(n, fine, (j + 1) * m - 1)[1])


@pytest.mark.parametrize("n,parts", [(10, 4), (7, 7), (5, 1), (100, 6), (4096, 4096), (3, 5)])
def test_block_ranges_are_the_tuple_of_their_blocks(n, parts):
    """Made on demand, yet indexed, sliced, compared and hashed as the tuple of blocks."""
    blocks = block_ranges(n, parts)
    whole = tuple(block_range(n, parts, k) for k in range(parts))
    assert tuple(blocks) == whole and len(blocks) == parts
    assert blocks == whole and whole == blocks and hash(blocks) == hash(whole)
    assert blocks[-1] == whole[-1] and blocks[1:3] == whole[1:3]
    assert blocks.largest() == max(hi - lo for lo, hi in whole)
    assert blocks == block_ranges(n, parts) and blocks != block_ranges(n + 1, parts)
    assert blocks != whole[:-1] and blocks != list(whole)
    with pytest.raises(IndexError):
        blocks[parts]


def test_factorisations():
    assert factorisations(6) == [(1, 6), (2, 3), (3, 2), (6, 1)]
    assert factorisations(1) == [(1, 1)]
    assert all(r * c == 12 for r, c in factorisations(12))
    for p in (16, 36, 97, 360, 4096):  # by divisor pairs, as by trying every Pr
        assert factorisations(p) == [(r, p // r) for r in range(1, p + 1) if p % r == 0]


def test_empty_split_is_refused_with_sizes():
    with pytest.raises(SplitError, match="conv1.*batch of size 3.*4 ways"):
        check_split(3, 4, "batch", "conv1")


# the last two pad more after than before (TensorFlow's same for even kernels, and more)
WINDOWS = [Window(3, 1, 1), Window(5, 1, 2), Window(3, 2, 1), Window(11, 4, 2), Window(2, 2, 0),
           Window(3, 2, 0), Window(1, 1, 0), Window(4, 3, 1), Window(2, 1, 0, 1),
           Window(4, 1, 1, 2)]


def plans_or_skip(n_in: int, parts: int, window: Window) -> list:
    """The halo plans, or the test skipped where the split is refused (checked separately)."""
    try:
        return halo_plans(n_in, parts, window, "layer")
    except SplitError:
        pytest.skip("split refused (checked separately)")


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("n_in,parts", [(8, 2), (13, 3), (27, 4), (55, 3), (9, 1)])
def test_halo_plans_supply_exactly_the_rows_each_window_reads(window, n_in, parts):
    plans = plans_or_skip(n_in, parts, window)
    n_out = window.out_size(n_in)
    assert [p.out for p in plans] == list(block_ranges(n_out, parts))
    for k, p in enumerate(plans):
        # brute force: the image rows read by the rank's outputs
        rows = {o * window.stride - window.before + t for o in range(*p.out)
                for t in range(window.kernel)}
        rows = {r for r in rows if 0 <= r < n_in}
        assert set(range(*p.need)) == rows
        have = set(range(*p.recv_top)) | set(range(*p.own)) | set(range(*p.recv_bottom))
        assert rows <= have
        # what I send is what my neighbours receive from me
        if k > 0:
            assert p.send_top == plans[k - 1].recv_bottom
        if k + 1 < parts:
            assert p.send_bottom == plans[k + 1].recv_top
        # interior outputs read only owned rows (or image padding)
        for o in range(*p.interior):
            read = {o * window.stride - window.before + t for t in range(window.kernel)}
            assert {r for r in read if 0 <= r < n_in} <= set(range(*p.own))


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("n_in,parts", [(8, 2), (13, 3), (27, 4), (55, 3), (64, 16)])
def test_halo_row_counts_are_those_of_the_plans(window, n_in, parts):
    plans = plans_or_skip(n_in, parts, window)
    received, sent = halo_row_counts(n_in, parts, window, "layer")
    assert received == {(p.recv_top[1] - p.recv_top[0], p.recv_bottom[1] - p.recv_bottom[0])
                        for p in plans}
    assert sent == {(p.send_top[1] - p.send_top[0], p.send_bottom[1] - p.send_bottom[0])
                    for p in plans}


def test_a_refusal_names_each_layer_of_the_same_shape():
    """Plans are made once per shape and window, but every layer's refusal names it."""
    for layer in ("conv9", "conv10"):
        with pytest.raises(SplitError, match=f"layer {layer}: row block"):
            halo_plans(12, 6, Window(7, 1, 3), layer)
        with pytest.raises(SplitError, match=f"layer {layer}: row block"):
            halo_row_counts(12, 6, Window(7, 1, 3), layer)


def test_halo_wider_than_neighbour_is_refused():
    # 12 rows over 6 ranks: 2 rows each; a 7-row window needs 3 rows from a neighbour
    with pytest.raises(SplitError, match="conv9.*needs 3 halo rows.*holds 2"):
        halo_plans(12, 6, Window(7, 1, 3), "conv9")


def test_too_few_rows_is_refused():
    with pytest.raises(SplitError, match="output height of size 2 cannot be split 3 ways"):
        halo_plans(6, 3, Window(3, 3, 0), "pool")
