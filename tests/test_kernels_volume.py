"""Sliding-window kernels over 1, 2 and 3 spatial axes (volumes mainly): convolution, max- and
average-pooling against plain loop references, adjoint identities, finite differences, and
PyTorch's conv3d / max_pool3d / avg_pool3d where PyTorch imports."""

from itertools import product

import numpy as np
import pytest

from hpctrain.kernels import conv
from hpctrain.kernels.conv import conv_backward, conv_forward
from hpctrain.kernels.pool import (
    avgpool_backward,
    avgpool_forward,
    maxpool_backward,
    maxpool_forward,
)
from hpctrain.kernels.sliding import out_size, position_dtype, prefer_channels_last

rng = np.random.default_rng(3)


# ---- loop references: one output entry at a time --------------------------------------------

def out_shape(size, kernel, stride, pads):
    return tuple(out_size(n, k, s, *pad) for n, k, s, pad in zip(size, kernel, stride, pads,
                                                                  strict=True))


def window(xpad, corner, kernel, stride):
    """Xpad[:, :, p·s : p·s + K] for output position p = ``corner``."""
    return xpad[(slice(None), slice(None),
                 *(slice(p * s, p * s + k) for p, s, k in zip(corner, stride, kernel,
                                                              strict=True)))]


def loop_conv(x, w, b, stride, pads):
    xpad = np.pad(x, ((0, 0), (0, 0), *pads))
    kernel, d = w.shape[2:], x.ndim - 2
    out = out_shape(x.shape[2:], kernel, stride, pads)
    y = np.zeros((x.shape[0], w.shape[0], *out))
    for p in product(*map(range, out)):
        patch = window(xpad, p, kernel, stride)
        # Σ over c and the d kernel axes of patch[n, c, a] · w[o, c, a]
        y[(slice(None), slice(None), *p)] = np.tensordot(
            patch, w, axes=([1, *range(2, 2 + d)], [1, *range(2, 2 + d)]))
    return y + b.reshape(1, -1, *(1,) * d)


def loop_maxpool(x, kernel, stride, pads, dy=None):
    """Y, and with ``dy`` the gradient: each dY entry to its window's first maximum (row-major
    order within the window)."""
    xpad = np.pad(x, ((0, 0), (0, 0), *pads), constant_values=-np.inf)
    out = out_shape(x.shape[2:], kernel, stride, pads)
    y = np.zeros((*x.shape[:2], *out))
    dxpad = np.zeros_like(xpad)
    for n, c in product(range(x.shape[0]), range(x.shape[1])):
        for p in product(*map(range, out)):
            patch = window(xpad, p, kernel, stride)[n, c]
            y[(n, c, *p)] = patch.max()
            if dy is not None:
                a = np.unravel_index(np.argmax(patch), kernel)  # the first maximum
                dxpad[(n, c, *(pi * s + ai for pi, s, ai in zip(p, stride, a,
                                                                 strict=True)))] += dy[(n, c, *p)]
    inside = tuple(slice(before, before + m) for (before, _), m in zip(pads, x.shape[2:],
                                                                       strict=True))
    return y, dxpad[(slice(None), slice(None), *inside)]


def loop_avgpool(x, kernel, stride, pads):
    xpad = np.pad(x, ((0, 0), (0, 0), *pads))  # zeros, counted in the mean
    out = out_shape(x.shape[2:], kernel, stride, pads)
    y = np.zeros((*x.shape[:2], *out))
    for p in product(*map(range, out)):
        y[(slice(None), slice(None), *p)] = window(xpad, p, kernel, stride).mean(
            axis=tuple(range(2, x.ndim)))
    return y


# ---- convolution ---------------------------------------------------------------------------

# (X shape, W shape, stride, pads): d = 1, 2 and mostly 3; odd and even kernels, strides 1 and 2,
# TensorFlow's "same" for an even kernel (one more after), and pads that differ per side
CONVS = [((2, 3, 9), (4, 3, 3), (2,), ((1, 0),)),
         ((1, 2, 8), (3, 2, 2), (1,), ((0, 1),)),
         ((2, 2, 6, 7), (3, 2, 2, 3), (1, 2), ((0, 1), (1, 0))),
         ((2, 3, 5, 6, 4), (4, 3, 2, 2, 2), (1, 1, 1), ((0, 1), (0, 1), (0, 1))),
         ((1, 2, 6, 5, 7), (3, 2, 3, 3, 3), (2, 2, 2), ((1, 1), (1, 0), (0, 1))),
         ((2, 2, 5, 6, 5), (3, 2, 2, 3, 1), (2, 1, 2), ((0, 1), (1, 0), (0, 1))),
         ((1, 3, 7, 5, 6), (2, 3, 3, 2, 2), (2, 1, 2), ((0, 0), (2, 1), (0, 1))),
         ((2, 4, 3, 4, 4), (5, 4, 1, 1, 1), (1, 1, 1), ((0, 0), (0, 0), (0, 0)))]
ORDERS = [False, True]


@pytest.fixture(params=[None, 1, 700], ids=["whole", "plane", "planes"])
def slabs(request, monkeypatch):
    """The input gradient of a volume goes a slab of output planes at a time: as many as fit
    the default budget (the whole of these small volumes), one plane, and a few planes."""
    if request.param is not None:
        monkeypatch.setattr(conv, "SLAB_BYTES", request.param)


def conv_case(xs, ws):
    return rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])


@pytest.mark.parametrize("channels_last", ORDERS)
@pytest.mark.parametrize("xs,ws,stride,pads", CONVS)
def test_conv_forward_matches_the_loop(xs, ws, stride, pads, channels_last):
    x, w, b = conv_case(xs, ws)
    y, cache = conv_forward(np, x, w, b, stride, pads, channels_last)
    assert cache.channels_last == channels_last and y.flags.c_contiguous
    want = loop_conv(x, w, b, stride, pads)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("channels_last", ORDERS)
@pytest.mark.parametrize("xs,ws,stride,pads", CONVS)
def test_conv_backward_is_the_adjoint_of_forward(xs, ws, stride, pads, channels_last, slabs):
    x, w, b = conv_case(xs, ws)
    y, cache = conv_forward(np, x, w, b, stride, pads, channels_last)
    dy = rng.standard_normal(y.shape)
    dx, dw, db = conv_backward(np, dy, w, cache, stride)
    assert dx.shape == x.shape and dw.shape == w.shape
    # bilinear in (x, w): <conv(x; w), dy> = <x, dx> = <w, dw> with the bias off
    inner = (loop_conv(x, w, np.zeros_like(b), stride, pads) * dy).sum()
    np.testing.assert_allclose((x * dx).sum(), inner, rtol=1e-10)
    np.testing.assert_allclose((w * dw).sum(), inner, rtol=1e-10)
    np.testing.assert_allclose(db, dy.sum(axis=(0, *range(2, dy.ndim))), rtol=1e-12)


@pytest.mark.parametrize("channels_last", ORDERS)
@pytest.mark.parametrize("xs,ws,stride,pads", [CONVS[1], CONVS[3], CONVS[6]])
def test_conv_backward_matches_finite_differences(xs, ws, stride, pads, channels_last, slabs):
    x, w, b = conv_case(xs, ws)
    y, cache = conv_forward(np, x, w, b, stride, pads, channels_last)
    dy = rng.standard_normal(y.shape)
    grads = conv_backward(np, dy, w, cache, stride)

    def loss(args):
        return (conv_forward(np, *args, stride, pads, channels_last)[0] * dy).sum()

    h = 1e-4  # the loss is linear in each argument: a central difference is exact but for rounding
    for arg, grad in enumerate(grads):
        flat = grad.reshape(-1)
        for entry in (0, flat.size // 2, flat.size - 1):  # a corner, the middle, the far corner
            plus, minus = [x.copy(), w.copy(), b.copy()], [x.copy(), w.copy(), b.copy()]
            plus[arg].reshape(-1)[entry] += h
            minus[arg].reshape(-1)[entry] -= h
            np.testing.assert_allclose((loss(plus) - loss(minus)) / (2 * h), flat[entry],
                                       rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("xs,ws,stride,pads", CONVS)
def test_conv_orders_agree_with_and_without_dx_into_a_kept_buffer(xs, ws, stride, pads,
                                                                  slabs):
    x, w, b = conv_case(xs, ws)
    (y0, major), (y1, last) = (conv_forward(np, x, w, b, stride, pads, order)
                               for order in ORDERS)
    np.testing.assert_allclose(y1, y0, rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(y0.shape)
    for need_dx in (True, False):
        want = conv_backward(np, dy, w, major, stride, need_dx)
        kept = np.full(w.shape, np.nan)
        got = conv_backward(np, dy, w, last, stride, need_dx, dw_out=kept)
        assert np.shares_memory(got[1], kept) and (got[0] is None) == (not need_dx)
        kept_major = np.full(w.shape, np.nan)
        again = conv_backward(np, dy, w, major, stride, need_dx, dw_out=kept_major)
        assert np.shares_memory(again[1], kept_major)
        for g, a, e in zip(got, again, want, strict=True):
            if e is not None:
                np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)
                np.testing.assert_array_equal(a, e)


def test_conv_keeps_float32_on_a_volume():
    x = rng.standard_normal((1, 4, 6, 6, 6)).astype(np.float32)
    w = rng.standard_normal((3, 4, 2, 2, 2)).astype(np.float32)
    pads = ((0, 1),) * 3
    for order in ORDERS:
        y, cache = conv_forward(np, x, w, None, (1, 1, 1), pads, order)
        assert y.shape == (1, 3, 6, 6, 6) and y.dtype == np.float32
        dx, dw, db = conv_backward(np, np.ones_like(y), w, cache, (1, 1, 1))
        assert {a.dtype for a in (dx, dw, db)} == {np.dtype(np.float32)}


def test_the_rule_and_the_position_type_read_every_axis():
    assert not prefer_channels_last(16, (2, 2, 2), 64)  # CosmoFlow's 64³ layer: channel-major
    assert not prefer_channels_last(32, (2, 2, 2), 32)  # and its 32³ layer
    # a volume needs eight times as many channels as an output row's entries, an image twice
    assert not prefer_channels_last(64, (2, 2, 2), 16) and prefer_channels_last(64, (2, 2), 16)
    assert prefer_channels_last(128, (2, 2, 2), 16) and prefer_channels_last(64, (3, 3, 3), 8)
    assert not prefer_channels_last(512, (1, 1, 1), 4)  # a 1×1×1 kernel never
    assert position_dtype((6, 6, 7)) == np.uint8  # 252 positions
    assert position_dtype((7, 7, 7)) == np.int32  # 343


# ---- pooling -------------------------------------------------------------------------------

# (X shape, kernel, stride, pads)
POOLS = [((2, 3, 9), (3,), (2,), ((1, 0),)),
         ((1, 2, 7, 8), (2, 3), (2, 1), ((0, 1), (1, 1))),
         ((2, 3, 6, 7, 5), (2, 2, 2), (2, 2, 2), ((0, 0), (0, 1), (0, 1))),
         ((1, 2, 7, 6, 6), (3, 3, 3), (2, 2, 1), ((1, 1), (1, 0), (0, 1))),
         ((2, 2, 5, 6, 7), (3, 1, 2), (1, 2, 2), ((0, 1), (0, 0), (1, 0))),
         ((1, 2, 8, 7, 6), (7, 7, 6), (1, 1, 1), ((0, 1), (0, 0), (0, 0)))]  # 294: int32 positions


@pytest.mark.parametrize("xs,kernel,stride,pads", POOLS)
def test_maxpool_matches_the_loop_forward_and_backward(xs, kernel, stride, pads):
    x = rng.standard_normal(xs)
    y, cache = maxpool_forward(np, x, kernel, stride, pads)
    dy = rng.standard_normal(y.shape)
    want_y, want_dx = loop_maxpool(x, kernel, stride, pads, dy)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_allclose(maxpool_backward(np, dy, kernel, stride, cache), want_dx,
                               rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("xs,kernel,stride,pads", POOLS[2:5])
def test_maxpool_ties_go_to_the_first_maximum_of_a_volume_window(xs, kernel, stride, pads):
    x = rng.integers(0, 2, xs).astype(np.float64)  # many ties
    y, cache = maxpool_forward(np, x, kernel, stride, pads)
    dy = np.arange(1.0, 1 + y.size).reshape(y.shape)
    want_y, want_dx = loop_maxpool(x, kernel, stride, pads, dy)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(maxpool_backward(np, dy, kernel, stride, cache), want_dx)


@pytest.mark.parametrize("xs,kernel,stride,pads", POOLS)
def test_avgpool_matches_the_loop_and_its_backward_is_the_adjoint(xs, kernel, stride, pads):
    x = rng.standard_normal(xs)
    y, cache = avgpool_forward(np, x, kernel, stride, pads)
    np.testing.assert_allclose(y, loop_avgpool(x, kernel, stride, pads), rtol=1e-12,
                               atol=1e-14)
    dy = rng.standard_normal(y.shape)
    dx = avgpool_backward(np, dy, kernel, stride, cache)
    assert dx.shape == x.shape
    np.testing.assert_allclose((y * dy).sum(), (x * dx).sum(), rtol=1e-12)


def test_avgpool_backward_matches_the_loop_on_a_volume():
    """The adjoint column by column: dX[i] = <avgpool(e_i), dY> for the unit volume e_i."""
    xs, kernel, stride, pads = (1, 1, 4, 3, 5), (2, 2, 3), (1, 2, 2), ((0, 1), (1, 0), (1, 1))
    y, cache = avgpool_forward(np, np.zeros(xs), kernel, stride, pads)
    dy = rng.standard_normal(y.shape)
    dx = avgpool_backward(np, dy, kernel, stride, cache)
    want = np.zeros(xs)
    for i in np.ndindex(xs):
        unit = np.zeros(xs)
        unit[i] = 1.0
        want[i] = (loop_avgpool(unit, kernel, stride, pads) * dy).sum()
    np.testing.assert_allclose(dx, want, rtol=1e-12, atol=1e-15)


# ---- PyTorch -------------------------------------------------------------------------------

def torch_pad(pads):
    """F.pad's order: the last axis first, (before, after) each."""
    return tuple(v for pad in reversed(pads) for v in pad)


@pytest.mark.reference
@pytest.mark.parametrize("channels_last", ORDERS)
@pytest.mark.parametrize("xs,ws,stride,pads", [c for c in CONVS if len(c[0]) == 5])
def test_conv3d_matches_torch(xs, ws, stride, pads, channels_last):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    x, w, b = conv_case(xs, ws)
    y, cache = conv_forward(np, x, w, b, stride, pads, channels_last)
    dy = rng.standard_normal(y.shape)
    dx, dw, db = conv_backward(np, dy, w, cache, stride)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = functional.conv3d(functional.pad(tx, torch_pad(pads)), tw, tb, stride=stride)
    ty.backward(torch.tensor(dy))
    close = dict(rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(y, ty.detach().numpy(), **close)
    for got, want in ((dx, tx), (dw, tw), (db, tb)):
        np.testing.assert_allclose(got, want.grad.numpy(), **close)


@pytest.mark.reference
@pytest.mark.parametrize("xs,kernel,stride,pads", [p for p in POOLS if len(p[0]) == 5])
def test_pool3d_matches_torch(xs, kernel, stride, pads):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    x = rng.standard_normal(xs)
    for ours, backward, theirs, fill in (
            (maxpool_forward, maxpool_backward, functional.max_pool3d, -np.inf),
            (avgpool_forward, avgpool_backward, functional.avg_pool3d, 0.0)):
        y, cache = ours(np, x, kernel, stride, pads)
        dy = rng.standard_normal(y.shape)
        tx = torch.tensor(x, requires_grad=True)
        ty = theirs(functional.pad(tx, torch_pad(pads), value=fill), kernel, stride)
        ty.backward(torch.tensor(dy))
        np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(backward(np, dy, kernel, stride, cache), tx.grad.numpy(),
                                   rtol=1e-12, atol=1e-14)
