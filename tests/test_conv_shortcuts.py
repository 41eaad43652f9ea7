"""The convolution's two shortcuts (hpctrain.kernels.conv) against its general path and against
PyTorch: taps that read only padding dropped, and pointwise (1×1) products on the samples as
they lie; average-pooling on small images as one product, and max-pooling of windows that
tile the input or do not overlap (hpctrain.kernels.pool)."""

import numpy as np
import pytest

from hpctrain.kernels.conv import POINTWISE_POSITIONS, conv_backward, conv_forward
from hpctrain.kernels.sliding import live_taps

rng = np.random.default_rng(3)


def test_live_taps_keep_the_taps_that_read_the_input():
    # a 1×1 image under a 3×3 kernel padded by 1: the middle tap alone, no padding left
    assert live_taps((1, 1), (3, 3), (1, 1), ((1, 1), (1, 1))) == (
        (slice(1, 2), slice(1, 2)), ((0, 0), (0, 0)))
    # 2×2 at stride 2 (ResNet's first block of a stage at a 2×2 image): taps 1 and 2 of 3
    assert live_taps((2, 2), (3, 3), (2, 2), ((1, 1), (1, 1))) == (
        (slice(1, 3), slice(1, 3)), ((0, 1), (0, 1)))
    # Inception's 1×7 at a 3-wide image padded by 3: taps 1-5, two columns of padding each side
    assert live_taps((3, 3), (1, 7), (1, 1), ((0, 0), (3, 3))) == (
        (slice(None), slice(1, 6)), ((0, 0), (2, 2)))
    # a dilated 3×3 (D = 4) over a 3×3 image padded by 4: the middle tap
    assert live_taps((3, 3), (3, 3), (1, 1), ((4, 4), (4, 4)), (4, 4)) == (
        (slice(1, 2), slice(1, 2)), ((0, 0), (0, 0)))
    # every tap reads the input somewhere: nothing to drop
    assert live_taps((8, 8), (3, 3), (1, 1), ((1, 1), (1, 1))) is None
    assert live_taps((5, 5), (1, 1), (2, 2), ((0, 0), (0, 0))) is None


def general(x, w, b, stride, pads, dilation=None, groups=1):
    """The convolution on an input padded beforehand: no padding left, so every tap reads the
    input and the general path runs; dX with the padding cut off again."""
    xpad = np.pad(x, ((0, 0), (0, 0), *pads))
    y, cache = conv_forward(np, xpad, w, b, stride, ((0, 0),) * len(pads), None, dilation,
                            groups)
    assert cache.taps is None

    def backward(dy, need_dx=True):
        dx, dw, db = conv_backward(np, dy, w, cache, stride, need_dx)
        inside = tuple(slice(lo, n - hi) for (lo, hi), n in zip(pads, xpad.shape[2:]))
        return (None if dx is None else dx[(slice(None), slice(None), *inside)]), dw, db

    return y, backward


# (x, w, stride, pads, dilation, groups): each drops taps
DROPPED = [((3, 8, 1, 1), (6, 8, 3, 3), (1, 1), ((1, 1), (1, 1)), None, 1),
           ((2, 5, 2, 2), (4, 5, 3, 3), (2, 2), ((1, 1), (1, 1)), None, 1),
           ((2, 4, 3, 3), (5, 4, 1, 7), (1, 1), ((0, 0), (3, 3)), None, 1),
           ((2, 4, 3, 3), (5, 4, 7, 1), (1, 1), ((3, 3), (0, 0)), None, 1),
           ((2, 3, 3, 3), (4, 3, 3, 3), (1, 1), ((4, 4), (4, 4)), (4, 4), 1),
           ((2, 4, 1, 1), (4, 1, 3, 3), (1, 1), ((1, 1), (1, 1)), None, 4),  # depthwise
           ((2, 6, 1, 1), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), None, 2),  # grouped
           ((2, 3, 1, 2, 1), (4, 3, 3, 3, 3), (1, 1, 1), ((1, 1),) * 3, None, 1)]  # a volume


@pytest.mark.parametrize("xs,ws,stride,pads,dilation,groups", DROPPED)
def test_dropped_taps_give_the_general_path_s_numbers(xs, ws, stride, pads, dilation, groups):
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    y, cache = conv_forward(np, x, w, b, stride, pads, None, dilation, groups)
    assert cache.taps is not None
    want_y, want_backward = general(x, w, b, stride, pads, dilation, groups)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    for need_dx in (True, False):
        kept = np.full(w.shape, np.nan)  # the layer's gradient buffer, holding anything
        got = conv_backward(np, dy, w, cache, stride, need_dx, dw_out=kept)
        assert np.shares_memory(got[1], kept)
        for g, e in zip(got, want_backward(dy, need_dx), strict=True):
            if e is None:
                assert g is None
            else:
                np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


# (x, w): P = 1, P below POINTWISE_POSITIONS (the general path's products) and at or above it
POINTWISE = [((5, 6, 1, 1), (7, 6, 1, 1)), ((3, 4, 4, 4), (5, 4, 1, 1)),
             ((3, 4, 7, 7), (5, 4, 1, 1)), ((2, 3, 9, 10), (4, 3, 1, 1)),
             ((2, 3, 2, 5, 6), (4, 3, 1, 1, 1))]


@pytest.mark.parametrize("xs,ws", POINTWISE)
def test_pointwise_products_give_the_general_path_s_numbers(xs, ws):
    """A 1×1 kernel at stride 1 against the general path's columns (channels-last windows,
    which it never leaves), with and without dX, into a kept dW buffer."""
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    d = len(xs) - 2
    stride, pads = (1,) * d, ((0, 0),) * d
    positions = int(np.prod(xs[2:]))
    y, cache = conv_forward(np, x, w, b, stride, pads)
    assert cache.pointwise == (positions == 1 or positions >= POINTWISE_POSITIONS)
    want_y, want = conv_forward(np, x, w, b, stride, pads, channels_last=True)
    assert not want.pointwise
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    assert y.flags.c_contiguous and y.shape == want_y.shape
    dy = rng.standard_normal(y.shape)
    for need_dx in (True, False):
        kept = np.full(w.shape, np.nan)
        got = conv_backward(np, dy, w, cache, stride, need_dx, dw_out=kept)
        assert np.shares_memory(got[1], kept)
        for g, e in zip(got, conv_backward(np, dy, w, want, stride, need_dx), strict=True):
            if e is None:
                assert g is None
            else:
                np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


def test_pointwise_keeps_a_16_bit_dtype():
    x = rng.standard_normal((2, 4, 8, 8)).astype(np.float16)
    w = rng.standard_normal((3, 4, 1, 1)).astype(np.float16)
    y, cache = conv_forward(np, x, w, None, (1, 1), ((0, 0), (0, 0)))
    assert y.dtype == np.float16 and cache.pointwise
    dx, dw, db = conv_backward(np, np.ones_like(y), w, cache, (1, 1))
    assert dx.dtype == dw.dtype == db.dtype == np.float16


TORCH_CASES = [((3, 8, 1, 1), (6, 8, 3, 3), (1, 1), (1, 1), (1, 1)),
               ((2, 5, 2, 2), (4, 5, 3, 3), (2, 2), (1, 1), (1, 1)),
               ((2, 4, 3, 3), (5, 4, 1, 7), (1, 1), (0, 3), (1, 1)),
               ((2, 3, 3, 3), (4, 3, 3, 3), (1, 1), (4, 4), (4, 4)),
               ((5, 6, 1, 1), (7, 6, 1, 1), (1, 1), (0, 0), (1, 1)),
               ((2, 3, 9, 10), (4, 3, 1, 1), (1, 1), (0, 0), (1, 1))]


@pytest.mark.parametrize("xs,ws,stride,pad,dilation", TORCH_CASES)
def test_shortcuts_against_pytorch(xs, ws, stride, pad, dilation):
    torch = pytest.importorskip("torch")
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    pads = tuple((p, p) for p in pad)
    y, cache = conv_forward(np, x, w, b, stride, pads, None, dilation)
    assert cache.taps is not None or cache.pointwise
    dy = rng.standard_normal(y.shape)
    dx, dw, db = conv_backward(np, dy, w, cache, stride)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride, pad, dilation)
    ty.backward(torch.tensor(dy))
    for got, want in ((y, ty), (dx, tx.grad), (dw, tw.grad), (db, tb.grad)):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-10, atol=1e-12)


# (x, kernel, stride, pads): small images whose average-pooling is one product
POOLS = [((2, 3, 7, 7), (3, 3), (1, 1), ((1, 1), (1, 1))),
         ((2, 4, 3, 3), (3, 3), (1, 1), ((1, 1), (1, 1))),
         ((2, 4, 1, 1), (3, 3), (1, 1), ((1, 1), (1, 1))),
         ((1, 2, 8, 7), (3, 2), (2, 3), ((1, 0), (0, 1))),
         ((2, 2, 3, 4, 5), (2, 2, 2), (1, 2, 1), ((1, 0), (0, 0), (1, 1)))]


@pytest.mark.parametrize("count_pad", [True, False])
@pytest.mark.parametrize("xs,kernel,stride,pads", POOLS)
def test_small_average_pools_give_the_general_path_s_numbers(xs, kernel, stride, pads,
                                                             count_pad, monkeypatch):
    from hpctrain.kernels import pool

    x = rng.standard_normal(xs)
    assert pool._window_members(np, x, kernel, stride, pads) is not None
    y, cache = pool.avgpool_forward(np, x, kernel, stride, pads, count_pad)
    dy = rng.standard_normal(y.shape)
    dx = pool.avgpool_backward(np, dy, kernel, stride, cache)
    monkeypatch.setattr(pool, "SMALL_POOL_PRODUCT", 0)  # the general path: a sum per tap
    assert pool._window_members(np, x, kernel, stride, pads) is None
    want_y, want_cache = pool.avgpool_forward(np, x, kernel, stride, pads, count_pad)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, pool.avgpool_backward(np, dy, kernel, stride, want_cache),
                               rtol=1e-12, atol=1e-12)
    assert dx.shape == x.shape and y.flags.c_contiguous


@pytest.mark.parametrize("count_pad", [True, False])
def test_small_average_pools_against_pytorch(count_pad):
    torch = pytest.importorskip("torch")
    from hpctrain.kernels.pool import avgpool_backward, avgpool_forward

    for xs in ((2, 3, 7, 7), (2, 4, 3, 3), (2, 4, 1, 1)):
        x = rng.standard_normal(xs)
        y, cache = avgpool_forward(np, x, (3, 3), (1, 1), ((1, 1), (1, 1)), count_pad)
        dy = rng.standard_normal(y.shape)
        dx = avgpool_backward(np, dy, (3, 3), (1, 1), cache)
        tx = torch.tensor(x, requires_grad=True)
        ty = torch.nn.functional.avg_pool2d(tx, 3, 1, 1, count_include_pad=count_pad)
        ty.backward(torch.tensor(dy))
        np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-12, atol=1e-12)


class GeneralPath:
    """NumPy under another name: the kernels' NumPy-only shortcuts (``xp is np``) do not run,
    so a kernel called with it takes its general path."""

    def __getattr__(self, name):
        return getattr(np, name)


# (x, kernel, stride, pads): max-pools whose windows tile the input (stride = kernel) or do not
# overlap (stride > kernel): odd sizes that leave entries out, padding, uneven kernels, 2-D and 3-D
SEPARATE_POOLS = [((2, 3, 8, 8), (2, 2), (2, 2), ((0, 0), (0, 0))),
                  ((2, 3, 7, 9), (2, 3), (2, 3), ((0, 0), (0, 0))),
                  ((1, 2, 7, 6), (3, 2), (3, 2), ((1, 1), (0, 1))),
                  ((2, 2, 6, 6, 6), (2, 2, 2), (2, 2, 2), ((0, 0),) * 3),
                  ((2, 3, 5, 7, 4), (2, 3, 1), (2, 3, 1), ((0, 1), (1, 1), (0, 0))),
                  ((1, 2, 9, 8, 7), (2, 2, 2), (3, 3, 2), ((0, 0), (1, 0), (0, 1))),
                  ((1, 2, 8, 7), (2, 2), (3, 4), ((1, 1), (0, 0)))]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("xs,kernel,stride,pads", SEPARATE_POOLS)
def test_separate_max_pools_give_the_general_path_s_numbers(xs, kernel, stride, pads, ties):
    from hpctrain.kernels.pool import maxpool_backward, maxpool_forward

    # integers tie often: the first maximum in window order must win on both paths
    x = rng.integers(0, 3, xs).astype(np.float64) if ties else rng.standard_normal(xs)
    y, cache = maxpool_forward(np, x, kernel, stride, pads)
    want_y, want_cache = maxpool_forward(GeneralPath(), x, kernel, stride, pads)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(cache.first, want_cache.first)
    assert cache.first.dtype == want_cache.first.dtype and y.flags.c_contiguous
    dy = rng.standard_normal(y.shape)
    dx = maxpool_backward(np, dy, kernel, stride, cache)
    np.testing.assert_array_equal(dx, maxpool_backward(GeneralPath(), dy, kernel, stride,
                                                       want_cache))
    assert dx.shape == x.shape and dx.dtype == dy.dtype


def test_separate_max_pools_keep_float32():
    from hpctrain.kernels.pool import maxpool_backward, maxpool_forward

    x = rng.standard_normal((2, 4, 6, 6, 6)).astype(np.float32)
    y, cache = maxpool_forward(np, x, (2, 2, 2), (2, 2, 2), ((0, 0),) * 3)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx = maxpool_backward(np, dy, (2, 2, 2), (2, 2, 2), cache)
    assert y.dtype == dx.dtype == np.float32
    want_y, want_cache = maxpool_forward(GeneralPath(), x, (2, 2, 2), (2, 2, 2), ((0, 0),) * 3)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(dx, maxpool_backward(GeneralPath(), dy, (2, 2, 2),
                                                       (2, 2, 2), want_cache))


@pytest.mark.parametrize("xs,kernel,stride,pads", SEPARATE_POOLS)
def test_separate_max_pools_against_pytorch(xs, kernel, stride, pads):
    torch = pytest.importorskip("torch")
    from hpctrain.kernels.pool import maxpool_backward, maxpool_forward

    functional = torch.nn.functional
    x = rng.standard_normal(xs)
    y, cache = maxpool_forward(np, x, kernel, stride, pads)
    dy = rng.standard_normal(y.shape)
    dx = maxpool_backward(np, dy, kernel, stride, cache)
    tx = torch.tensor(x, requires_grad=True)
    padding = tuple(v for pad in reversed(pads) for v in pad)  # F.pad's order: last axis first
    pool = functional.max_pool2d if len(kernel) == 2 else functional.max_pool3d
    ty = pool(functional.pad(tx, padding, value=-np.inf), kernel, stride)
    ty.backward(torch.tensor(dy))
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_array_equal(dx, tx.grad.numpy())


# (x, w, stride, pads, dilation): channel-major columns of SAMPLE_POSITIONS or more positions a
# sample, multiplied a sample at a time: images and volumes, strides, uneven padding (a band of
# a split axis pads one side only), dilation, odd sizes
PER_SAMPLE = [((2, 3, 36, 36), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), None),
              ((3, 2, 67, 65), (5, 2, 5, 3), (2, 2), ((2, 0), (1, 1)), None),
              ((2, 3, 35, 37), (4, 3, 3, 3), (1, 1), ((2, 2), (0, 2)), (2, 2)),
              ((2, 2, 11, 11, 11), (3, 2, 2, 2, 2), (1, 1, 1), ((0, 1),) * 3, None),
              ((2, 3, 13, 12, 15), (2, 3, 3, 2, 3), (1, 1, 1), ((1, 0), (0, 1), (1, 1)), None)]


@pytest.mark.parametrize("need_dx", [True, False])
@pytest.mark.parametrize("xs,ws,stride,pads,dilation", PER_SAMPLE)
def test_per_sample_products_give_the_general_path_s_numbers(xs, ws, stride, pads, dilation,
                                                             need_dx, monkeypatch):
    from hpctrain.kernels import conv

    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    y, cache = conv_forward(np, x, w, b, stride, pads, False, dilation)
    assert conv._per_sample(np, 1, y.shape[2:]) and y.flags.c_contiguous
    dy = rng.standard_normal(y.shape)
    dw_out = np.empty_like(w)
    dx, dw, db = conv_backward(np, dy, w, cache, stride, need_dx, dw_out)
    assert dw is dw_out or np.shares_memory(dw, dw_out)
    monkeypatch.setattr(conv, "SAMPLE_POSITIONS", 10**9)  # one product over every sample
    want_y, want_cache = conv_forward(np, x, w, b, stride, pads, False, dilation)
    want_dx, want_dw, want_db = conv_backward(np, dy, w, want_cache, stride, need_dx)
    close = dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(y, want_y, **close)
    np.testing.assert_allclose(dw, want_dw, **close)
    np.testing.assert_allclose(db, want_db, **close)
    if need_dx:
        np.testing.assert_allclose(dx, want_dx, **close)
        assert dx.shape == x.shape
    else:
        assert dx is None


def test_per_sample_products_keep_16_bit_and_float32_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    xs, ws, stride, pads = (2, 3, 34, 34), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1))
    for dtype in (np.float32, ml_dtypes.bfloat16):
        x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
        y, cache = conv_forward(np, x, w, None, stride, pads, False)
        dx, dw, db = conv_backward(np, rng.standard_normal(y.shape).astype(dtype), w, cache,
                                   stride)
        assert y.dtype == dx.dtype == dw.dtype == db.dtype == dtype


@pytest.mark.parametrize("xs,ws,stride,pads,dilation", PER_SAMPLE)
def test_per_sample_products_against_pytorch(xs, ws, stride, pads, dilation):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    y, cache = conv_forward(np, x, w, b, stride, pads, False, dilation)
    dy = rng.standard_normal(y.shape)
    dx, dw, db = conv_backward(np, dy, w, cache, stride)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    padding = tuple(v for pad in reversed(pads) for v in pad)  # F.pad's order: last axis first
    convolve = functional.conv2d if len(pads) == 2 else functional.conv3d
    ty = convolve(functional.pad(tx, padding), tw, tb, stride=stride, dilation=dilation or 1)
    ty.backward(torch.tensor(dy))
    close = dict(rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(y, ty.detach().numpy(), **close)
    for got, want in ((dx, tx), (dw, tw), (db, tb)):
        np.testing.assert_allclose(got, want.grad.numpy(), **close)
