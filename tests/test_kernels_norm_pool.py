"""Average pooling and batch normalisation kernels: direct references, finite differences,
adjoints, and batch statistics split over parts exactly as a distributed layer splits them; the
statistics per group of samples ("ghost" batch norm) against each group alone, cut across
simulated ranks; and the fused statistics' accuracy far from zero."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hpctrain.kernels.norm import (
    batchnorm_backward,
    batchnorm_forward,
    batchnorm_inference,
    batchnorm_inference_backward,
)
from hpctrain.kernels.pool import avgpool_backward, avgpool_forward

rng = np.random.default_rng(1)


# ---- average pooling ------------------------------------------------------------------------

def direct_avgpool(x, k, s, pads):
    (kh, kw), (sh, sw) = k, s
    xp = np.pad(x, ((0, 0), (0, 0), *pads))  # zeros, counted in the mean
    ho, wo = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    y = np.zeros(x.shape[:2] + (ho, wo))
    for p in range(ho):
        for q in range(wo):
            y[:, :, p, q] = xp[:, :, p * sh:p * sh + kh, q * sw:q * sw + kw].mean(axis=(2, 3))
    return y


POOLS = [((2, 2), (2, 2), ((0, 0), (0, 0))), ((3, 3), (2, 2), ((1, 1), (1, 1))),
         ((3, 3), (1, 1), ((1, 0), (1, 1))), ((1, 7), (1, 1), ((0, 0), (3, 3))),
         ((7, 1), (1, 1), ((3, 3), (0, 0))), ((3, 1), (2, 1), ((1, 0), (0, 0))),
         ((2, 3), (3, 2), ((0, 1), (1, 1))), ((3, 2), (1, 2), ((2, 1), (1, 1))),
         ((2, 2), (1, 1), ((0, 1), (1, 0)))]


@pytest.mark.parametrize("k,s,pads", POOLS)
def test_avgpool_forward_matches_direct(k, s, pads):
    x = rng.standard_normal((2, 3, 9, 8))
    y, _ = avgpool_forward(np, x, k, s, pads)
    np.testing.assert_allclose(y, direct_avgpool(x, k, s, pads), rtol=1e-12, atol=1e-14)


def test_avgpool_counts_padding_in_the_divisor():
    x = np.ones((1, 1, 2, 2))
    # each 2x2 window holds one input and 3 pads
    y, _ = avgpool_forward(np, x, (2, 2), (2, 2), ((1, 1), (1, 1)))
    np.testing.assert_array_equal(y, np.full((1, 1, 2, 2), 0.25))
    # 1x3 windows hold 2 inputs and 1 pad
    y, _ = avgpool_forward(np, x, (1, 3), (1, 1), ((0, 0), (1, 1)))
    np.testing.assert_array_equal(y, np.full((1, 1, 2, 2), 2 / 3))


@pytest.mark.parametrize("k,s,pads", POOLS)
def test_avgpool_backward_is_the_adjoint_of_forward(k, s, pads):
    x = rng.standard_normal((2, 3, 10, 9))
    y, cache = avgpool_forward(np, x, k, s, pads)
    dy = rng.standard_normal(y.shape)
    dx = avgpool_backward(np, dy, k, s, cache)
    assert dx.shape == x.shape
    np.testing.assert_allclose((y * dy).sum(), (x * dx).sum(), rtol=1e-12)


def test_avgpool_keeps_float32_and_caches_no_input():
    x = rng.standard_normal((2, 2, 7, 6)).astype(np.float32)
    y, cache = avgpool_forward(np, x, (3, 2), (2, 1), ((1, 0), (1, 1)))
    assert y.dtype == np.float32
    assert avgpool_backward(np, np.ones_like(y), (3, 2), (2, 1), cache).dtype == np.float32
    assert not any(isinstance(v, np.ndarray) for v in vars(cache).values())


# ---- batch normalisation --------------------------------------------------------------------

def identity(a):
    return a


def direct_batchnorm(x, gamma, beta, eps):
    axes = (0, *range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = x.mean(axis=axes), x.var(axis=axes)  # biased, as PyTorch normalises with
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * gamma.reshape(
        shape) + beta.reshape(shape), mean, var


def batch(shape, gen=rng):
    """Channels with distinct, far-from-zero means and spreads, as after a conv layer."""
    c = shape[1]
    offset = (10 * gen.standard_normal(c)).reshape((1, c) + (1,) * (len(shape) - 2))
    spread = gen.uniform(0.5, 3, c).reshape((1, c) + (1,) * (len(shape) - 2))
    return offset + spread * gen.standard_normal(shape)


def params(c):
    return rng.uniform(0.5, 2, c), rng.standard_normal(c)


def count_of(x):
    return x.size // x.shape[1]


def group_counts(x, sizes):
    """(k, 1): the values per channel of each group of ``sizes`` samples of X's shape."""
    spatial = count_of(x) // x.shape[0]
    return np.array([[n * spatial] for n in sizes], dtype=x.dtype)


def ranges_of(sizes):
    """Consecutive (start, stop) sample ranges of the given sizes: [2, 3] -> ((0, 2), (2, 5))."""
    stops = np.cumsum(sizes).tolist()
    return tuple(zip([0, *stops[:-1]], stops))


def parameter_grads(total):
    """(dγ, dβ) from the (2, k, C) sums [Σ dY, Σ dY·x̂] per group: summed over the groups."""
    return total[1].sum(axis=0), total[0].sum(axis=0)


@pytest.mark.parametrize("shape", [(5, 3, 4, 6), (7, 4)])
def test_batchnorm_forward_matches_direct(shape):
    x, (gamma, beta), eps = batch(shape), params(shape[1]), 1e-5
    y, _, mean, var = batchnorm_forward(np, x, gamma, beta, eps, count_of(x), identity)
    want, want_mean, want_var = direct_batchnorm(x, gamma, beta, eps)
    assert mean.shape == var.shape == (1, shape[1])  # one group
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mean[0], want_mean, rtol=1e-13)
    np.testing.assert_allclose(var[0], want_var, rtol=1e-12)


@pytest.mark.parametrize("shape", [(4, 3, 3, 5), (6, 4)])
def test_batchnorm_backward_matches_finite_differences(shape):
    x, (gamma, beta), eps = batch(shape), params(shape[1]), 1e-3
    r = rng.standard_normal(shape)  # loss = Σ Y·r, so dY = r

    def loss(x, gamma, beta):
        return (batchnorm_forward(np, x, gamma, beta, eps, count_of(x), identity)[0] * r).sum()

    _, cache, _, _ = batchnorm_forward(np, x, gamma, beta, eps, count_of(x), identity)
    dx, local, total = batchnorm_backward(np, r, cache, count_of(x), identity)
    assert local.shape == total.shape == (2, 1, shape[1])
    dgamma, dbeta = parameter_grads(total)
    h = 1e-6
    for arg, grad in enumerate((dx, dgamma, dbeta)):
        v = rng.standard_normal(grad.shape)
        plus, minus = [x, gamma, beta], [x, gamma, beta]
        plus[arg], minus[arg] = plus[arg] + h * v, minus[arg] - h * v
        slope = (loss(*plus) - loss(*minus)) / (2 * h)
        np.testing.assert_allclose(slope, (grad * v).sum(), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("sizes", [None, (2, 3, 2, 3)])
def test_batchnorm_is_linear_in_dy_and_reduces_once_each_way(sizes):
    x, (gamma, beta) = batch((10, 3, 5, 5)), params(3)
    groups = None if sizes is None else ranges_of(sizes)
    counts = count_of(x) if sizes is None else group_counts(x, sizes)
    k = 1 if sizes is None else len(sizes)
    calls = []

    def recording(a):
        calls.append(a.shape)
        return a

    shift = x.mean(axis=(0, 2, 3))  # as the layer passes its running mean
    _, cache, _, _ = batchnorm_forward(np, x, gamma, beta, 1e-5, counts, recording, shift,
                                       groups)
    assert calls == [(2, k, 3)]  # one reduce of the stacked [Σ X, shifted squares] per group
    dy1, dy2 = rng.standard_normal(x.shape), rng.standard_normal(x.shape)
    calls.clear()
    both = batchnorm_backward(np, dy1 + dy2, cache, counts, recording)
    assert calls == [(2, k, 3)]  # one reduce of the stacked [Σ dY, Σ dY·x̂] per group
    one = batchnorm_backward(np, dy1, cache, counts, identity)
    two = batchnorm_backward(np, dy2, cache, counts, identity)
    for got, a, b in zip(both, one, two, strict=True):
        np.testing.assert_allclose(got, a + b, rtol=1e-10, atol=1e-12)


class LockStepSum:
    """An in-process all-reduce: each part's thread calls ``reduce`` in the same order, and
    every call returns the sum over the parts (in part order, so all parts get the same bits)."""

    def __init__(self, parts: int) -> None:
        self.barrier = threading.Barrier(parts, timeout=10)  # a failing part breaks, not hangs
        self.slots = [None] * parts

    def for_part(self, part):
        def reduce(a):
            self.slots[part] = a
            self.barrier.wait()
            total = self.slots[0]
            for s in self.slots[1:]:
                total = total + s
            self.barrier.wait()  # nobody overwrites a slot before every part has read it
            return total
        return reduce


def run_parts(work, parts):
    """``work(reduce, part)`` for every part at once, each in its own thread, in lock step."""
    return run_teams(work, [parts])[0]


def run_teams(work, teams):
    """``work(reduce, part)`` for every part of every team at once, each in its own thread; a
    team's parts sum with one another only (the ranks of one statistics group). The results,
    team by team."""
    locks = [LockStepSum(len(team)) for team in teams]
    jobs = [(lock.for_part(i), part) for lock, team in zip(locks, teams, strict=True)
            for i, part in enumerate(team)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = [f.result() for f in [pool.submit(work, *job) for job in jobs]]
    out, at = [], 0
    for team in teams:
        out.append(results[at:at + len(team)])
        at += len(team)
    return out


@pytest.mark.parametrize("shape,axis,cuts", [((7, 3, 4, 5), 0, [2, 3]), ((9, 4), 0, [4, 5]),
                                             ((3, 4, 7, 5), 2, [3, 4])])
def test_batchnorm_split_into_uneven_parts_equals_the_whole_batch(shape, axis, cuts):
    x, (gamma, beta), eps = batch(shape), params(shape[1]), 1e-5
    dy = rng.standard_normal(shape)
    count = count_of(x)  # the global count: every part normalises by the whole batch
    y, cache, mean, var = batchnorm_forward(np, x, gamma, beta, eps, count, identity)
    dx, _, total = batchnorm_backward(np, dy, cache, count, identity)

    def part(reduce, xy):
        x_part, dy_part = xy
        y_part, cache_part, mean_part, var_part = batchnorm_forward(
            np, x_part, gamma, beta, eps, count, reduce)
        return (y_part, mean_part, var_part,
                *batchnorm_backward(np, dy_part, cache_part, count, reduce))

    results = run_parts(part, list(zip(np.split(x, cuts, axis), np.split(dy, cuts, axis))))
    assert [r[0].shape[axis] for r in results] == [cuts[0], cuts[1] - cuts[0],
                                                   shape[axis] - cuts[1]]
    close = dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([r[0] for r in results], axis), y, **close)
    np.testing.assert_allclose(np.concatenate([r[3] for r in results], axis), dx, **close)
    for _, mean_part, var_part, _, _, total_part in results:
        np.testing.assert_allclose(mean_part, mean, **close)
        np.testing.assert_allclose(var_part, var, **close)
        np.testing.assert_allclose(total_part, total, **close)
    # the parts' own sums add up to the whole: what a caller sums for dγ, dβ under groups
    np.testing.assert_allclose(sum(r[4] for r in results), total, **close)


# ---- batch normalisation over groups of samples ("ghost" batch norm) -------------------------

# (shape, sizes of the groups): equal sizes, and the block rule's k·n//parts cuts of 10 samples
# 4 ways (2, 3, 2, 3) and of 7 samples 3 ways (2, 2, 3)
GROUPED = [((8, 3, 4, 5), (2, 2, 2, 2)), ((10, 3, 3, 4), (2, 3, 2, 3)), ((10, 4), (2, 3, 2, 3)),
           ((7, 2, 3, 3), (2, 2, 3)), ((6, 3, 2, 2), (6,))]


def test_the_grouped_cases_are_the_block_rule():
    from hpctrain.layout.partition import block_ranges

    for shape, sizes in GROUPED:
        assert ranges_of(sizes) == tuple(block_ranges(shape[0], len(sizes)))


@pytest.mark.parametrize("shape,sizes", GROUPED)
def test_grouped_batchnorm_equals_each_group_alone(shape, sizes):
    """Statistics per group equal one process normalising each group as a batch of its own:
    forward against the NumPy definition, backward against the one-group kernel (itself checked
    by finite differences above) on that group's samples."""
    # data of their own: a group of 2 or 3 values (the flat case) may by chance have a
    # variance so far below (μ_g − K)² that the fused sums lose digits (see the far-from-zero
    # tests below); with this seed every σ_g² is at least a quarter of (μ_g − K)²
    x, (gamma, beta), eps = batch(shape, np.random.default_rng(3)), params(shape[1]), 1e-5
    dy = rng.standard_normal(shape)
    groups, counts = ranges_of(sizes), group_counts(x, sizes)
    # shifted by the batch's mean, as the layer shifts by the running mean
    shift = x.mean(axis=(0, *range(2, x.ndim)))
    y, cache, mean, var = batchnorm_forward(np, x, gamma, beta, eps, counts, identity, shift,
                                            groups)
    dx, local, total = batchnorm_backward(np, dy, cache, counts, identity)
    k = len(sizes)
    assert mean.shape == var.shape == (k, shape[1]) and total.shape == (2, k, shape[1])
    np.testing.assert_array_equal(local, total)  # one process: its sums are the group's
    close = dict(rtol=1e-12, atol=1e-12)
    for g, (a, b) in enumerate(groups):
        want, want_mean, want_var = direct_batchnorm(x[a:b], gamma, beta, eps)
        np.testing.assert_allclose(y[a:b], want, **close)
        np.testing.assert_allclose(mean[g], want_mean, rtol=1e-13)
        np.testing.assert_allclose(var[g], want_var, rtol=1e-12)
        _, alone, _, _ = batchnorm_forward(np, x[a:b], gamma, beta, eps, count_of(x[a:b]),
                                           identity, shift)
        dx_alone, _, total_alone = batchnorm_backward(np, dy[a:b], alone, count_of(x[a:b]),
                                                      identity)
        np.testing.assert_allclose(dx[a:b], dx_alone, **close)
        np.testing.assert_allclose(total[:, g], total_alone[:, 0], **close)


def test_grouped_batchnorm_backward_matches_finite_differences():
    shape, sizes, eps = (10, 3, 3, 4), (2, 3, 2, 3), 1e-3
    x, (gamma, beta) = batch(shape), params(shape[1])
    groups, counts = ranges_of(sizes), group_counts(x, sizes)
    r = rng.standard_normal(shape)

    def loss(x, gamma, beta):
        return (batchnorm_forward(np, x, gamma, beta, eps, counts, identity, None, groups)[0]
                * r).sum()

    _, cache, _, _ = batchnorm_forward(np, x, gamma, beta, eps, counts, identity, None, groups)
    dx, _, total = batchnorm_backward(np, r, cache, counts, identity)
    h = 1e-6
    for arg, grad in enumerate((dx, *parameter_grads(total))):
        v = rng.standard_normal(grad.shape)
        plus, minus = [x, gamma, beta], [x, gamma, beta]
        plus[arg], minus[arg] = plus[arg] + h * v, minus[arg] - h * v
        slope = (loss(*plus) - loss(*minus)) / (2 * h)
        np.testing.assert_allclose(slope, (grad * v).sum(), rtol=1e-6, atol=1e-8)


def test_groups_cut_across_ranks_by_samples_equal_the_whole():
    """12 samples in 2 groups (0..5, 6..11) on 4 simulated ranks holding 2, 4, 3 and 3
    samples: the first two share group 0, the last two group 1, and each pair sums only with
    itself."""
    shape, eps = (12, 3, 3, 2), 1e-5
    x, (gamma, beta), dy = batch(shape), params(shape[1]), rng.standard_normal(shape)
    groups, counts = ranges_of((6, 6)), group_counts(x, (6, 6))
    y, cache, mean, var = batchnorm_forward(np, x, gamma, beta, eps, counts, identity, None,
                                            groups)
    dx, _, total = batchnorm_backward(np, dy, cache, counts, identity)
    blocks = [[(0, 2), (2, 6)], [(6, 9), (9, 12)]]  # team g: the ranks of group g

    def rank(reduce, block):
        (a, b), g = block
        own = counts[g:g + 1]  # the whole group's count: the rank holds part of one group
        y_r, cache_r, mean_r, var_r = batchnorm_forward(
            np, x[a:b], gamma, beta, eps, own, reduce, None, ((0, b - a),))
        return (y_r, mean_r, var_r, *batchnorm_backward(np, dy[a:b], cache_r, own, reduce))

    teams = run_teams(rank, [[(block, g) for block in team] for g, team in enumerate(blocks)])
    close = dict(rtol=1e-12, atol=1e-12)
    for g, (team, ranks) in enumerate(zip(teams, blocks, strict=True)):
        for (y_r, mean_r, var_r, dx_r, _, total_r), (a, b) in zip(team, ranks, strict=True):
            np.testing.assert_allclose(y_r, y[a:b], **close)
            np.testing.assert_allclose(dx_r, dx[a:b], **close)
            np.testing.assert_allclose(mean_r, mean[g:g + 1], **close)
            np.testing.assert_allclose(var_r, var[g:g + 1], **close)
            np.testing.assert_allclose(total_r, total[:, g:g + 1], **close)
        np.testing.assert_allclose(team[0][4] + team[1][4], total[:, g:g + 1], **close)


def test_groups_cut_across_ranks_by_rows_equal_the_whole():
    """10 samples in 4 groups (2, 3, 2, 3) on 2 simulated ranks holding rows 0..1 and 2..5 of
    every sample: each rank holds every group and sums a (2, 4, C) array with the other."""
    shape, sizes, eps = (10, 3, 6, 5), (2, 3, 2, 3), 1e-5
    x, (gamma, beta), dy = batch(shape), params(shape[1]), rng.standard_normal(shape)
    groups, counts = ranges_of(sizes), group_counts(x, sizes)  # whole counts: 6 rows
    y, cache, mean, var = batchnorm_forward(np, x, gamma, beta, eps, counts, identity, None,
                                            groups)
    dx, _, total = batchnorm_backward(np, dy, cache, counts, identity)

    def rank(reduce, rows):
        x_r, dy_r = x[:, :, rows[0]:rows[1]], dy[:, :, rows[0]:rows[1]]
        y_r, cache_r, mean_r, var_r = batchnorm_forward(np, x_r, gamma, beta, eps, counts,
                                                        reduce, None, groups)
        return (y_r, mean_r, var_r, *batchnorm_backward(np, dy_r, cache_r, counts, reduce))

    results = run_parts(rank, [(0, 2), (2, 6)])
    close = dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([r[0] for r in results], 2), y, **close)
    np.testing.assert_allclose(np.concatenate([r[3] for r in results], 2), dx, **close)
    for _, mean_r, var_r, _, _, total_r in results:
        np.testing.assert_allclose(mean_r, mean, **close)
        np.testing.assert_allclose(var_r, var, **close)
        np.testing.assert_allclose(total_r, total, **close)
    np.testing.assert_allclose(results[0][4] + results[1][4], total, **close)


# ---- the fused statistics far from zero ------------------------------------------------------
#
# X = 1e4 + N(0, 1) per channel, float64 (ε = 2.2e-16), n = 256 values per channel. The
# reference is NumPy's two-pass mean and variance. The sum of n values carries a rounding error
# of at most ~log2(n)·ε·|μ| (pairwise summation): |δμ| ≲ 8 · 2.2e-16 · 1e4 ≈ 2e-11, the same
# in both. A two-pass variance is insensitive to δμ to first order (it adds δμ², 1e-22), and
# its sum of squares of O(1) deviations rounds to a relative ~n·ε ≈ 6e-14 at worst.
# The one-pass formula E[X²] − μ² instead loses ε·μ²/σ² ≈ 2e-8 to cancellation.

FAR_SHAPE, FAR_MEAN = (16, 3, 4, 4), 1e4


def far_from_zero():
    x = FAR_MEAN + np.random.default_rng(7).standard_normal(FAR_SHAPE)
    axes = (0, 2, 3)
    mean = x.mean(axis=axes)
    var = ((x - mean.reshape(1, -1, 1, 1)) ** 2).mean(axis=axes)
    return x, mean, var


def far_forward(x, shift, reduce=identity):
    ones = np.ones(x.shape[1])
    count = FAR_SHAPE[0] * FAR_SHAPE[2] * FAR_SHAPE[3]  # the whole batch's, on every part
    return batchnorm_forward(np, x, ones, 0 * ones, 1e-5, count, reduce, shift)


def check_far(y, mean, var, want_mean, want_var, var_rtol, x):
    np.testing.assert_allclose(mean[0], want_mean, rtol=1e-14)  # ~log2(n)·ε, see above
    np.testing.assert_allclose(var[0], want_var, rtol=var_rtol)
    want_y = (x - want_mean.reshape(1, -1, 1, 1)) / np.sqrt(want_var.reshape(1, -1, 1, 1) + 1e-5)
    # x − μ is exact where both are ~1e4 (Sterbenz) but for δμ ≈ 2e-11: Y within ~1e-10, while
    # the one-pass variance's 2e-8 would move Y by ~1e-8
    np.testing.assert_allclose(y, want_y, rtol=0, atol=1e-10)


def test_fused_statistics_far_from_zero_with_a_close_shift_on_one_process():
    """K = the running mean, half a standard deviation off μ: on one process the local mean is
    the mean, the shifted terms n(μ − K)² cancel to rounding of (μ − K)² ≤ σ², so the variance
    is as accurate as the two-pass reference: within a relative 1e-13 (~n·ε, see above)."""
    x, mean, var = far_from_zero()
    y, _, got_mean, got_var = far_forward(x, mean + 0.5)
    check_far(y, got_mean, got_var, mean, var, 1e-13, x)


def test_fused_statistics_far_from_zero_with_a_close_shift_over_two_ranks():
    """Two simulated ranks holding 5 and 11 samples, K half a standard deviation off μ. Chan's
    combination Σ_r [S_r + n_r(μ_r − K)²] − m(μ − K)² is sensitive to each mean's rounding δμ
    to first order, by 2|μ_r − K|/σ² ≲ 1/σ: a variance within ~δμ/σ ≈ 2e-11 relative (1.3e-12
    measured); checked within 1e-10, where the one-pass formula (K = 0) is 4e-8 off."""
    x, mean, var = far_from_zero()
    shift = mean + 0.5
    results = run_parts(lambda reduce, part: far_forward(part, shift, reduce),
                        np.split(x, [5], axis=0))
    y = np.concatenate([r[0] for r in results])
    for _, _, got_mean, got_var in results:
        check_far(y, got_mean, got_var, mean, var, 1e-10, x)


def test_fused_statistics_far_from_zero_without_a_shift_on_one_process():
    """No shift (the first step's, a running mean still at 0) on one process, the mean 1e4 σ
    from it: past FAR_SHIFT the variance is recomputed from a second pass, within a relative
    1e-13 as with a close shift."""
    x, mean, var = far_from_zero()
    y, _, got_mean, got_var = far_forward(x, None)
    check_far(y, got_mean, got_var, mean, var, 1e-13, x)


def test_fused_statistics_far_from_zero_keep_the_variance_in_float32():
    """The same in float32, whose one-message variance would cancel to nothing (1e8 against
    1 in a 24-bit significand): the second pass keeps it, within the 1e-3 that float32 samples
    of 1e4 + N(0, 1) themselves resolve."""
    x, _, _ = far_from_zero()
    x = x.astype(np.float32)
    want = x.astype(np.float64).var(axis=(0, 2, 3))
    _, _, _, var = batchnorm_forward(np, x, np.ones(x.shape[1], np.float32),
                                     np.zeros(x.shape[1], np.float32), 1e-5,
                                     FAR_SHAPE[0] * FAR_SHAPE[2] * FAR_SHAPE[3], identity)
    np.testing.assert_allclose(var[0], want, rtol=1e-2)


@pytest.mark.parametrize("shape", [(3, 4, 5, 2), (6, 4)])
def test_batchnorm_inference_and_its_adjoint(shape):
    x, (gamma, beta), eps = batch(shape), params(shape[1]), 1e-5
    running_mean, running_var = rng.standard_normal(shape[1]), rng.uniform(0.5, 4, shape[1])
    y = batchnorm_inference(np, x, gamma, beta, eps, running_mean, running_var)
    cs = (1, -1) + (1,) * (len(shape) - 2)
    want = ((x - running_mean.reshape(cs)) / np.sqrt(running_var.reshape(cs) + eps)
            * gamma.reshape(cs) + beta.reshape(cs))
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    # the map is affine: its linear part, Y(X) − Y(0), is adjoint to the backward
    linear = y - batchnorm_inference(np, np.zeros_like(x), gamma, beta, eps, running_mean,
                                     running_var)
    dy = rng.standard_normal(shape)
    dx = batchnorm_inference_backward(dy, gamma, eps, running_var)
    np.testing.assert_allclose((linear * dy).sum(), (x * dx).sum(), rtol=1e-11)


def test_batchnorm_keeps_float32():
    x = batch((4, 3, 3, 3)).astype(np.float32)
    gamma, beta = params(3)  # float64 parameters: outputs still follow X
    y, cache, mean, var = batchnorm_forward(np, x, gamma, beta, 1e-5, count_of(x), identity)
    dx, local, total = batchnorm_backward(np, np.ones_like(y), cache, count_of(x), identity)
    assert {a.dtype for a in (y, mean, var, dx, local, total)} == {np.dtype(np.float32)}
    z = batchnorm_inference(np, x, gamma, beta, 1e-5, np.zeros(3), np.ones(3))
    assert z.dtype == np.float32
    assert batchnorm_inference_backward(z, gamma, 1e-5, np.ones(3)).dtype == np.float32
