"""Local kernels against direct (loop) references and finite differences."""

import numpy as np
import pytest

from hpctrain.kernels.activations import dropout_mask, relu_backward, relu_forward
from hpctrain.kernels.conv import conv_backward, conv_forward
from hpctrain.kernels.counter_rng import stream_key, uniform_block
from hpctrain.kernels.linear import linear_backward, linear_forward
from hpctrain.kernels.loss import softmax_cross_entropy
from hpctrain.kernels.pool import maxpool_backward, maxpool_forward
from hpctrain.kernels.sliding import prefer_channels_last

rng = np.random.default_rng(0)


def direct_conv(x, w, b, stride, pads):
    sh, sw = stride
    xp = np.pad(x, ((0, 0), (0, 0), *pads))
    n, c, h, wd = xp.shape
    o, _, kh, kw = w.shape
    ho, wo = (h - kh) // sh + 1, (wd - kw) // sw + 1
    y = np.zeros((n, o, ho, wo))
    for p in range(ho):
        for q in range(wo):
            patch = xp[:, :, p * sh:p * sh + kh, q * sw:q * sw + kw]
            y[:, :, p, q] = np.einsum("nckl,ockl->no", patch, w)
    return y + b[None, :, None, None]


CONVS = [((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1))),
         ((1, 2, 9, 9), (3, 2, 5, 5), (2, 2), ((2, 2), (2, 2))),
         ((2, 1, 11, 10), (2, 1, 4, 4), (3, 3), ((0, 2), (1, 1))),
         ((1, 2, 5, 5), (2, 2, 1, 1), (1, 1), ((0, 0), (0, 0))),
         ((1, 3, 8, 7), (2, 3, 3, 3), (2, 2), ((1, 0), (1, 1))),
         # non-square: Inception's 1x7 and 7x1 "same" convolutions, a 3x1 with stride (2, 1), and
         # a row band of a height-split image (top != bottom) with both kernel and stride uneven
         ((2, 3, 6, 9), (4, 3, 1, 7), (1, 1), ((0, 0), (3, 3))),
         ((2, 3, 9, 6), (4, 3, 7, 1), (1, 1), ((3, 3), (0, 0))),
         ((1, 2, 9, 8), (3, 2, 3, 1), (2, 1), ((1, 0), (0, 0))),
         ((2, 2, 8, 11), (3, 2, 3, 5), (2, 3), ((1, 0), (2, 2))),
         ((1, 2, 7, 10), (2, 2, 2, 3), (1, 3), ((0, 1), (1, 1))),
         # TensorFlow's "same" for an even kernel: one more after than before, left != right
         ((2, 3, 6, 7), (2, 3, 2, 2), (1, 1), ((0, 1), (0, 1)))]


# both orders of the windows on every shape; None: the order the rule picks
ORDERS = [False, True, None]


@pytest.mark.parametrize("channels_last", ORDERS)
@pytest.mark.parametrize("xs,ws,stride,pads", CONVS)
def test_conv_forward_matches_direct(xs, ws, stride, pads, channels_last):
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    y, _ = conv_forward(np, x, w, b, stride, pads, channels_last)
    np.testing.assert_allclose(y, direct_conv(x, w, b, stride, pads), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("channels_last", ORDERS)
@pytest.mark.parametrize("xs,ws,stride,pads", CONVS)
def test_conv_backward_is_the_adjoint_of_forward(xs, ws, stride, pads, channels_last):
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    y, cache = conv_forward(np, x, w, b, stride, pads, channels_last)
    dy = rng.standard_normal(y.shape)
    dx, dw, db = conv_backward(np, dy, w, cache, stride)
    # the map is bilinear in (x, w): <dy, conv(x, w)> = <dx, x> = <dw, w>, and db = sum dy
    y0 = direct_conv(x, w, np.zeros_like(b), stride, pads)
    np.testing.assert_allclose((dy * y0).sum(), (dx * x).sum(), rtol=1e-10)
    np.testing.assert_allclose((dy * y0).sum(), (dw * w).sum(), rtol=1e-10)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 2, 3)), rtol=1e-12)


@pytest.mark.parametrize("xs,ws,stride,pads", CONVS)
def test_conv_orders_give_the_same_gradients(xs, ws, stride, pads):
    """Channels-last windows against channel-major: the same Y, dX, dW and db (up to the
    order of the sums), with and without dX, into a kept dW buffer or a fresh one."""
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    (y0, major), (y1, last) = (conv_forward(np, x, w, b, stride, pads, order)
                               for order in (False, True))
    assert not major.channels_last and last.channels_last
    np.testing.assert_allclose(y1, y0, rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(y0.shape)
    for need_dx in (True, False):
        kept = np.full(w.shape, np.nan)
        want = conv_backward(np, dy, w, major, stride, need_dx)
        got = conv_backward(np, dy, w, last, stride, need_dx, dw_out=kept)
        assert np.shares_memory(got[1], kept) and got[1].flags.c_contiguous
        for g, e in zip(got, want, strict=True):
            if e is None:
                assert g is None
            else:
                np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


def test_the_windows_go_channels_last_for_deep_small_images_only():
    # AlexNet at 127²: conv1 (3 channels, 11×11, 31 wide) channel-major, conv2–conv5 last
    assert not prefer_channels_last(3, (11, 11), 31)
    assert all(prefer_channels_last(c, (k, k), wo) for c, k, wo in
               [(64, 5, 15), (192, 3, 7), (384, 3, 7), (256, 3, 7)])
    # ResNet: 64 channels 56 wide, and a 1×1 kernel, channel-major
    assert not prefer_channels_last(64, (3, 3), 56)
    assert not prefer_channels_last(256, (1, 1), 14)
    x, w = rng.standard_normal((2, 8, 4, 4)), rng.standard_normal((4, 8, 3, 3))
    assert conv_forward(np, x, w, None, (1, 1), ((1, 1), (1, 1)))[1].channels_last
    x = rng.standard_normal((2, 3, 9, 9))
    assert not conv_forward(np, x, w[:, :3], None, (1, 1), ((1, 1), (1, 1)))[1].channels_last


def direct_pool(x, k, s, pads):
    (kh, kw), (sh, sw) = k, s
    xp = np.pad(x, ((0, 0), (0, 0), *pads), constant_values=-np.inf)
    ho, wo = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    return np.array([[[[xp[n, c, p * sh:p * sh + kh, q * sw:q * sw + kw].max()
                        for q in range(wo)] for p in range(ho)]
                      for c in range(x.shape[1])] for n in range(x.shape[0])])


@pytest.mark.parametrize("k,s,pads", [
    ((2, 2), (2, 2), ((0, 0), (0, 0))), ((3, 3), (2, 2), ((0, 0), (0, 0))),
    ((3, 3), (2, 2), ((1, 0), (1, 1))), ((3, 3), (1, 1), ((1, 1), (1, 1))),
    ((1, 7), (1, 1), ((0, 0), (3, 3))), ((7, 1), (1, 1), ((3, 3), (0, 0))),
    ((3, 1), (2, 1), ((1, 0), (0, 0))), ((2, 3), (2, 3), ((0, 1), (1, 1))),
    ((3, 2), (1, 2), ((1, 1), (0, 0))), ((2, 2), (1, 1), ((0, 1), (0, 1)))])
def test_maxpool_forward_and_backward(k, s, pads):
    x = rng.standard_normal((2, 3, 9, 8))
    y, cache = maxpool_forward(np, x, k, s, pads)
    np.testing.assert_array_equal(y, direct_pool(x, k, s, pads))
    dy = rng.standard_normal(y.shape)
    dx = maxpool_backward(np, dy, k, s, cache)
    # finite difference: max-pooling is piecewise linear, so a small step is exact
    eps = 1e-7
    v = rng.standard_normal(x.shape)
    y2, _ = maxpool_forward(np, x + eps * v, k, s, pads)
    np.testing.assert_allclose(((y2 - y) * dy).sum() / eps, (dx * v).sum(), rtol=1e-6)


def test_window_arguments_name_one_entry_per_spatial_axis():
    x, w = rng.standard_normal((1, 2, 9, 8)), rng.standard_normal((3, 2, 3, 3))
    with pytest.raises(ValueError, match="stride"):
        conv_forward(np, x, w, None, (2,), ((1, 0), (1, 1)))
    with pytest.raises(ValueError, match="pads"):
        conv_forward(np, x, w, None, (2, 2), (1, 0, 1))
    with pytest.raises(ValueError, match="kernel"):
        maxpool_forward(np, x, 3, (2, 2), ((1, 1), (1, 1)))
    with pytest.raises(ValueError, match="pads"):
        maxpool_forward(np, x, (3, 3), (2, 2), ((1, 1, 1), (1, 1)))


def test_maxpool_ties_send_each_gradient_to_the_first_maximum_once():
    x = np.zeros((1, 1, 4, 4))  # every window is all ties
    y, cache = maxpool_forward(np, x, (3, 3), (1, 1), ((0, 0), (0, 0)))
    dy = np.arange(1.0, 1 + y.size).reshape(y.shape)
    dx = maxpool_backward(np, dy, (3, 3), (1, 1), cache)
    want = np.zeros_like(x)
    want[0, 0, :2, :2] = dy[0, 0]  # each window's first entry is its top-left corner
    np.testing.assert_array_equal(dx, want)
    # the same for a non-square kernel and stride: window order is row-major within (kh, kw)
    x = np.zeros((1, 1, 5, 7))
    y, cache = maxpool_forward(np, x, (2, 3), (3, 2), ((0, 0), (0, 0)))
    dy = np.arange(1.0, 1 + y.size).reshape(y.shape)
    dx = maxpool_backward(np, dy, (2, 3), (3, 2), cache)
    want = np.zeros_like(x)
    want[0, 0, 0:6:3, 0:6:2] = dy[0, 0]  # Ho = 2 rows of windows, Wo = 3 columns
    np.testing.assert_array_equal(dx, want)


def test_linear():
    x, w, b = rng.standard_normal((5, 4)), rng.standard_normal((3, 4)), rng.standard_normal(3)
    y = linear_forward(np, x, w, b)
    np.testing.assert_allclose(y, x @ w.T + b)
    dy = rng.standard_normal(y.shape)
    dx, dw, db = linear_backward(np, x, w, dy)
    np.testing.assert_allclose(dx, dy @ w)
    np.testing.assert_allclose(dw, dy.T @ x)
    np.testing.assert_allclose(db, dy.sum(0))


def test_softmax_cross_entropy_value_and_gradient():
    z, labels = rng.standard_normal((6, 5)), np.array([0, 4, 2, 2, 1, 3])
    loss, correct, grad = softmax_cross_entropy(np, z, labels, 1.0)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    np.testing.assert_allclose(loss, -np.log(p[np.arange(6), labels]).sum())
    assert correct == (z.argmax(1) == labels).sum()
    eps, v = 1e-6, rng.standard_normal(z.shape)
    plus = softmax_cross_entropy(np, z + eps * v, labels, 1.0)[0]
    minus = softmax_cross_entropy(np, z - eps * v, labels, 1.0)[0]
    np.testing.assert_allclose((plus - minus) / (2 * eps), (grad * v).sum(), rtol=1e-6)


def test_counter_rng_blocks_agree_with_the_whole():
    shape, key = (4, 3, 5, 6), stream_key(7, 1)
    whole = uniform_block(np, key, shape, tuple((0, n) for n in shape), np.float64)
    box = ((1, 3), (0, 3), (2, 5), (1, 6))
    np.testing.assert_array_equal(uniform_block(np, key, shape, box, np.float64),
                                  whole[1:3, :, 2:5, 1:6])
    assert 0 <= whole.min() and whole.max() < 1 and abs(whole.mean() - 0.5) < 0.1
    assert not np.array_equal(whole, uniform_block(np, stream_key(7, 2), shape,
                                                   tuple((0, n) for n in shape), np.float64))


def test_relu_passes_the_gradient_where_the_unit_was_on():
    x = rng.standard_normal((3, 4, 5, 6)).astype(np.float32)
    x[0, 0, 0, :3] = [0.0, -0.0, np.float32(1e-40)]  # zeros and a denormal: off, off, on
    y, dy = relu_forward(np, x), rng.standard_normal(x.shape).astype(np.float32)
    dx = relu_backward(np, y, dy)
    assert dx.dtype == np.float32
    np.testing.assert_array_equal(dx, np.where(x > 0, dy, 0))
    np.testing.assert_array_equal(dx[0, 0, 0, :3], [0, 0, dy[0, 0, 0, 2]])


def test_dropout_mask_is_grid_independent_and_keeps_the_right_share():
    shape, key, p = (64, 8, 16, 16), stream_key(3, 2, 5), 0.3
    whole = dropout_mask(np, key, p, shape, tuple((0, n) for n in shape), np.float64)
    assert abs((whole > 0).mean() - (1 - p)) < 0.01
    np.testing.assert_allclose(whole[whole > 0], 1 / (1 - p))
    block = dropout_mask(np, key, p, shape, ((10, 20), (4, 8), (3, 9), (0, 16)), np.float64)
    np.testing.assert_array_equal(block, whole[10:20, 4:8, 3:9])


def test_weight_gradients_go_into_the_buffer_given():
    """The layers keep one gradient array across steps: dW written into it equals a fresh dW,
    whatever the buffer held before."""
    x, w = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3))
    y, cache = conv_forward(np, x, w, None, (1, 1), ((1, 1), (1, 1)))
    dy = rng.standard_normal(y.shape)
    kept = np.full(w.shape, np.nan)
    _, fresh, _ = conv_backward(np, dy, w, cache, (1, 1))
    _, into, _ = conv_backward(np, dy, w, cache, (1, 1), dw_out=kept)
    assert np.shares_memory(into, kept)
    np.testing.assert_array_equal(into, fresh)
    x, w = rng.standard_normal((5, 4)), rng.standard_normal((3, 4))
    dy, kept = rng.standard_normal((5, 3)), np.full((3, 4), np.nan)
    _, into, _ = linear_backward(np, x, w, dy, dw_out=kept)
    assert np.shares_memory(into, kept)
    np.testing.assert_array_equal(into, linear_backward(np, x, w, dy)[1])
