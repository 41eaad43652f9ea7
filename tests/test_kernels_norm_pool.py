"""Average pooling and batch normalisation kernels: direct references, finite differences,
adjoints, and batch statistics split over parts exactly as a distributed layer splits them."""

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


def batch(shape):
    """Channels with distinct, far-from-zero means and spreads, as after a conv layer."""
    c = shape[1]
    offset = (10 * rng.standard_normal(c)).reshape((1, c) + (1,) * (len(shape) - 2))
    spread = rng.uniform(0.5, 3, c).reshape((1, c) + (1,) * (len(shape) - 2))
    return offset + spread * rng.standard_normal(shape)


def params(c):
    return rng.uniform(0.5, 2, c), rng.standard_normal(c)


def count_of(x):
    return x.size // x.shape[1]


@pytest.mark.parametrize("shape", [(5, 3, 4, 6), (7, 4)])
def test_batchnorm_forward_matches_direct(shape):
    x, (gamma, beta), eps = batch(shape), params(shape[1]), 1e-5
    y, _, mean, var = batchnorm_forward(np, x, gamma, beta, eps, count_of(x), identity)
    want, want_mean, want_var = direct_batchnorm(x, gamma, beta, eps)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-13)
    np.testing.assert_allclose(var, want_var, rtol=1e-12)


@pytest.mark.parametrize("shape", [(4, 3, 3, 5), (6, 4)])
def test_batchnorm_backward_matches_finite_differences(shape):
    x, (gamma, beta), eps = batch(shape), params(shape[1]), 1e-3
    r = rng.standard_normal(shape)  # loss = Σ Y·r, so dY = r

    def loss(x, gamma, beta):
        return (batchnorm_forward(np, x, gamma, beta, eps, count_of(x), identity)[0] * r).sum()

    _, cache, _, _ = batchnorm_forward(np, x, gamma, beta, eps, count_of(x), identity)
    dx, dgamma, dbeta = batchnorm_backward(np, r, cache, count_of(x), identity)
    h = 1e-6
    for arg, grad in enumerate((dx, dgamma, dbeta)):
        v = rng.standard_normal(grad.shape)
        plus, minus = [x, gamma, beta], [x, gamma, beta]
        plus[arg], minus[arg] = plus[arg] + h * v, minus[arg] - h * v
        slope = (loss(*plus) - loss(*minus)) / (2 * h)
        np.testing.assert_allclose(slope, (grad * v).sum(), rtol=1e-6, atol=1e-8)


def test_batchnorm_backward_is_linear_in_dy_and_reduces_once():
    x, (gamma, beta) = batch((4, 3, 5, 5)), params(3)
    calls = []

    def recording(a):
        calls.append(a.shape)
        return a

    _, cache, _, _ = batchnorm_forward(np, x, gamma, beta, 1e-5, count_of(x), recording)
    assert calls == [(3,), (3,)]  # two passes: the mean, then the squared deviations
    dy1, dy2 = rng.standard_normal(x.shape), rng.standard_normal(x.shape)
    calls.clear()
    both = batchnorm_backward(np, dy1 + dy2, cache, count_of(x), recording)
    assert calls == [(2, 3)]  # one reduce of the stacked [Σ dY, Σ dY·x̂]
    one = batchnorm_backward(np, dy1, cache, count_of(x), identity)
    two = batchnorm_backward(np, dy2, cache, count_of(x), identity)
    for got, a, b in zip(both, one, two):
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
    lock = LockStepSum(len(parts))
    with ThreadPoolExecutor(len(parts)) as pool:
        futures = [pool.submit(work, lock.for_part(i), p) for i, p in enumerate(parts)]
        return [f.result() for f in futures]


@pytest.mark.parametrize("shape,axis,cuts", [((7, 3, 4, 5), 0, [2, 3]), ((9, 4), 0, [4, 5]),
                                             ((3, 4, 7, 5), 2, [3, 4])])
def test_batchnorm_split_into_uneven_parts_equals_the_whole_batch(shape, axis, cuts):
    x, (gamma, beta), eps = batch(shape), params(shape[1]), 1e-5
    dy = rng.standard_normal(shape)
    count = count_of(x)  # the global count: every part normalises by the whole batch
    y, cache, mean, var = batchnorm_forward(np, x, gamma, beta, eps, count, identity)
    dx, dgamma, dbeta = batchnorm_backward(np, dy, cache, count, identity)

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
    for _, mean_part, var_part, _, dgamma_part, dbeta_part in results:
        np.testing.assert_allclose(mean_part, mean, **close)
        np.testing.assert_allclose(var_part, var, **close)
        np.testing.assert_allclose(dgamma_part, dgamma, **close)
        np.testing.assert_allclose(dbeta_part, dbeta, **close)


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
    dx, dgamma, dbeta = batchnorm_backward(np, np.ones_like(y), cache, count_of(x), identity)
    assert {a.dtype for a in (y, mean, var, dx, dgamma, dbeta)} == {np.dtype(np.float32)}
    z = batchnorm_inference(np, x, gamma, beta, 1e-5, np.zeros(3), np.ones(3))
    assert z.dtype == np.float32
    assert batchnorm_inference_backward(z, gamma, 1e-5, np.ones(3)).dtype == np.float32
