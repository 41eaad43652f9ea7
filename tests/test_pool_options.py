"""The pooling options ``avgpool ... count_pad=0`` and ``maxpool ... ceil=1``.

``count_pad=0`` averages over a window's own input entries only, as PyTorch's
``count_include_pad=False``: held against ``avg_pool2d``/``avg_pool3d`` (float64, backward by
autograd with a random upstream gradient), and against a direct loop where the padding is
uneven, which PyTorch cannot express. ``ceil=1`` counts the windows rounding up, as PyTorch's
``ceil_mode=True``, by growing the padding after each axis: held against ``max_pool2d``/
``max_pool3d`` through the layer kind (a net's shapes, the kernels run with the layer's resolved
padding), and ``ceil_windows``/``ceil_padding`` against brute force. Windows that would hold
only padding are refused in one line naming the layer."""

import itertools
import math

import numpy as np
import pytest

from hpctrain.kernels.pool import avgpool_backward, avgpool_forward
from hpctrain.kernels.sliding import out_size
from hpctrain.model.kinds import KINDS
from hpctrain.model.kinds.maxpool import ceil_padding, ceil_windows
from hpctrain.model.net import NetError, parse_net


def pool_net(line, size, channels=2):
    """A net of one pooling ``line`` (named pool) over inputs of ``size`` (``N``, ``HxW`` or
    ``DxHxW``), then a classifier."""
    return parse_net(f"input channels={channels} size={size} classes=3\n{line} name=pool\n"
                     f"flatten\nlinear out=3\n", "pools.net")


def same_as_torch(net, x, t_x, t_y, rng) -> np.ndarray:
    """The net's one pool forward and backward (a random output gradient) equal PyTorch's
    output ``t_y`` of input ``t_x`` and its input gradient, shapes and values; the output."""
    torch = pytest.importorskip("torch")
    assert net.out_shapes[0] == tuple(t_y.shape[1:])
    dy = rng.standard_normal(tuple(t_y.shape))
    t_y.backward(torch.tensor(dy))
    y, dx = run_pool(net, x, dy)
    close(y, t_y.detach().numpy(), "output")
    close(dx, t_x.grad.numpy(), "input gradient")
    return y


def run_pool(net, x, dy=None):
    """The pool layer's forward (and backward of ``dy``) by the kernels its kind gives, with
    its resolved kernel, stride and padding."""
    spec = net.layers[0]
    forward, backward = KINDS[spec.kind].pool_kernels(spec.options)
    o = spec.options
    y, cache = forward(np, x, o.kernel, o.stride, o.pad)
    return y, (None if dy is None else backward(np, dy, o.kernel, o.stride, cache))


def real_entries(n, k, s, before, after):
    """Per window along one axis, the range of input entries it holds (clipped to the
    input)."""
    return [range(max(0, p * s - before), min(n, p * s - before + k))
            for p in range(out_size(n, k, s, before, after))]


def direct_avgpool_without_padding(x, dy, kernel, stride, pads):
    """Y: the mean of each window's input entries; dX: each dY entry shared evenly among
    them. Loops, one window at a time."""
    per_axis = [real_entries(n, k, s, b, a) for n, k, s, (b, a)
                in zip(x.shape[2:], kernel, stride, pads, strict=True)]
    y = np.zeros(x.shape[:2] + tuple(map(len, per_axis)))
    dx = np.zeros_like(x)
    for p in itertools.product(*(range(len(r)) for r in per_axis)):
        box = (slice(None), slice(None), *(slice(r[i].start, r[i].stop)
                                           for r, i in zip(per_axis, p, strict=True)))
        count = np.prod([len(r[i]) for r, i in zip(per_axis, p, strict=True)])
        assert count > 0, "a window of padding alone"
        y[(slice(None), slice(None), *p)] = x[box].sum(axis=tuple(range(2, x.ndim))) / count
        dx[box] += (dy[(slice(None), slice(None), *p)] / count).reshape(
            x.shape[:2] + (1,) * (x.ndim - 2))
    return y, dx


def close(got, want, what):
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=what)


# -- count_pad=0 against PyTorch ------------------------------------------------------------

AVG_CASES = [  # (size, kernel, stride, pad): 2-D and 3-D, padded and not
    ("9x8", 3, 2, 1), ("9x8", 3, 1, 1), ("7x10", 2, 2, 0), ("7x10", 3, 3, 0),
    ("8x8", 5, 2, 2), ("6x11", "3x5", "2x1", "1x2"), ("5x6x7", 3, 2, 1), ("4x6x5", 2, 2, 1),
    ("6x5x4", 2, 1, 0), ("5x7x6", "3x1x3", "1x2x2", "1x0x1")]


def torch_sizes(text, axes):
    parts = [int(v) for v in str(text).split("x")]
    return tuple(parts * axes if len(parts) == 1 else parts)


@pytest.mark.reference
@pytest.mark.parametrize("size,kernel,stride,pad", AVG_CASES)
def test_avgpool_without_padding_in_the_divisor_matches_pytorch(size, kernel, stride, pad):
    """Forward and backward of ``count_pad=0`` equal PyTorch's ``count_include_pad=False`` in
    float64, and, where there is padding, differ from ``count_pad=1`` (so the option is read)."""
    torch = pytest.importorskip("torch")
    axes = len(size.split("x"))
    line = f"avgpool kernel={kernel} stride={stride} pad={pad}"
    net = pool_net(f"{line} count_pad=0", size)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, *net.input_shape))
    t_x = torch.tensor(x, requires_grad=True)
    pool = (torch.nn.functional.avg_pool2d if axes == 2 else torch.nn.functional.avg_pool3d)
    t_y = pool(t_x, torch_sizes(kernel, axes), torch_sizes(stride, axes),
               torch_sizes(pad, axes), count_include_pad=False)
    y = same_as_torch(net, x, t_x, t_y, rng)
    counted, _ = run_pool(pool_net(f"{line} count_pad=1", size), x)
    if any(torch_sizes(pad, axes)):
        assert not np.allclose(counted, y)
    else:
        close(counted, y, "count_pad=1 without padding")


ASYMMETRIC = [  # (size, kernel, stride, pad): padding PyTorch's pools cannot take
    ("9x8", 3, 2, "0+1x1+0"), ("7x7", 3, 1, "2+0x0+2"), ("8x9", "2x3", "2x2", "1+1x0+2"),
    ("10x6", 4, 3, "1+2x3+0"), ("5x6x7", 3, 2, "0+1x1+1x2+0"), ("4x5x6", 2, 1, "1+0x0+1x1+1")]


@pytest.mark.parametrize("size,kernel,stride,pad", ASYMMETRIC)
def test_avgpool_without_padding_in_the_divisor_under_uneven_padding(size, kernel, stride, pad):
    """Uneven padding (before ≠ after), as a band of a split axis or ``same`` padding has it:
    forward and backward of ``count_pad=0`` equal a direct loop over the windows."""
    net = pool_net(f"avgpool kernel={kernel} stride={stride} pad={pad} count_pad=0", size)
    o = net.layers[0].options
    assert any(b != a for b, a in o.pad)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, *net.input_shape))
    dy = rng.standard_normal((2, *net.out_shapes[0]))
    y, dx = run_pool(net, x, dy)
    want_y, want_dx = direct_avgpool_without_padding(x, dy, o.kernel, o.stride, o.pad)
    assert y.shape == want_y.shape
    close(y, want_y, "output")
    close(dx, want_dx, "input gradient")


def test_avgpool_count_pad_kernels_directly():
    """The kernels' own ``count_pad`` argument: a constant input averages to itself at every
    window without the padding in the divisor, and to the share of input entries with it;
    the backward of ones gives each entry the sum of 1/count over the windows holding it."""
    x = np.ones((1, 1, 5, 4))
    kernel, stride, pads = (3, 2), (2, 1), ((1, 1), (0, 1))
    y, cache = avgpool_forward(np, x, kernel, stride, pads, count_pad=False)
    np.testing.assert_array_equal(y, np.ones_like(y))
    with_pad, _ = avgpool_forward(np, x, kernel, stride, pads)
    counts = np.outer(*(list(map(len, real_entries(n, k, s, b, a))) for n, k, s, (b, a)
                        in zip(x.shape[2:], kernel, stride, pads, strict=True)))
    close(with_pad[0, 0], counts / math.prod(kernel), "count_pad=1")
    dx = avgpool_backward(np, np.ones_like(y), kernel, stride, cache)
    _, want = direct_avgpool_without_padding(x, np.ones_like(y), kernel, stride, pads)
    close(dx, want, "input gradient")


# -- ceil=1 against PyTorch -------------------------------------------------------------------

CEIL_CASES = [  # (size, kernel, stride, pad, whether rounding up adds a window on some axis)
    # (11 with kernel 3, stride 3, pad 1: the window rounding up adds would start in the
    # padding after, and is dropped)
    ("112", 3, 2, 0, True), ("111", 3, 2, 0, False), ("12x9", 3, 2, 0, True),
    ("7x8", 2, 2, 0, True), ("8x8", 2, 2, 0, False), ("9x11", 3, 2, 1, False),
    ("10x12", 3, 2, 1, True), ("11x14", 3, 3, 1, False), ("11x12", 3, 3, 1, True),
    ("17x15", 3, 2, 1, False),
    ("9x10", "3x2", "2x3", "1x0", True), ("7x9x6", 2, 2, 0, True), ("5x6x9", 3, 2, 1, True),
    ("5x7x9", 3, 2, 0, False)]


@pytest.mark.reference
@pytest.mark.parametrize("size,kernel,stride,pad,adds", CEIL_CASES)
def test_maxpool_ceil_matches_pytorch_ceil_mode(size, kernel, stride, pad, adds):
    """The net's output shape is PyTorch's with ``ceil_mode=True``, and the kernels run with
    the layer's resolved (ceil-grown) padding give its forward and backward; the cases
    cover sizes where rounding up adds a window and where it does not."""
    torch = pytest.importorskip("torch")
    axes = len(size.split("x")) if "x" in size else 2
    net = pool_net(f"maxpool kernel={kernel} stride={stride} pad={pad} ceil=1", size)
    floor = pool_net(f"maxpool kernel={kernel} stride={stride} pad={pad}", size)
    assert (net.out_shapes[0] != floor.out_shapes[0]) == adds
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, *net.input_shape))
    t_x = torch.tensor(x, requires_grad=True)
    pool = torch.nn.functional.max_pool2d if axes == 2 else torch.nn.functional.max_pool3d
    t_y = pool(t_x, torch_sizes(kernel, axes), torch_sizes(stride, axes), torch_sizes(pad, axes),
               ceil_mode=True)
    same_as_torch(net, x, t_x, t_y, rng)


@pytest.mark.reference
def test_ceil_windows_is_pytorchs_count_for_the_padding_it_takes():
    """Along one axis, every size, kernel, stride and symmetric padding PyTorch accepts
    (pad at most half the kernel)."""
    torch = pytest.importorskip("torch")
    for n, k, s in itertools.product(range(1, 16), range(1, 6), range(1, 5)):
        for p in range(k // 2 + 1):
            if n + 2 * p < k:
                continue
            want = torch.nn.functional.max_pool1d(torch.zeros(1, 1, n), k, s, p,
                                                  ceil_mode=True).shape[-1]
            assert ceil_windows(n, k, s, p, p) == want, (n, k, s, p)


def brute_ceil_windows(n, k, s, before, after):
    """Windows laid from the start of the padded axis: another is added while the one before
    left entries of the padded axis uncovered, but never one starting in the padding after."""
    count = 1
    while (count - 1) * s + k < n + before + after and count * s < n + before:
        count += 1
    return count


def padding_cases():
    """(n, k, s, before, after) along one axis, with the padding less than the kernel."""
    for n, k, s in itertools.product(range(1, 14), range(1, 7), range(1, 6)):
        for before, after in itertools.product(range(k), repeat=2):
            if n + before + after >= k:
                yield n, k, s, before, after


def test_ceil_windows_and_ceil_padding_against_brute_force():
    """ceil_windows counts what laying windows one by one counts, and ceil_padding is the
    least padding after whose windows, rounding down, are as many; none of them starts in the
    padding after."""
    cases = 0
    for n, k, s, before, after in padding_cases():
        count = ceil_windows(n, k, s, before, after)
        assert count == brute_ceil_windows(n, k, s, before, after), (n, k, s, before, after)
        assert count >= out_size(n, k, s, before, after)
        extra = ceil_padding(n, k, s, before, after)
        least = next(e for e in range(k + s) if out_size(n, k, s, before, after + e) == count)
        assert extra == least, (n, k, s, before, after)
        assert (count - 1) * s < n + before
        cases += 1
    assert cases > 1000


def test_with_image_size_derives_the_ceil_padding_again():
    """A net made at one size and resized grows its padding for the new size, from the file's
    padding: as if parsed at that size (112 grows one entry after; 111 none), and back."""
    text = "maxpool kernel=3 stride=2 pad={pad} ceil=1"
    for pad in ("0", "1", "0+1x1+0"):
        big = pool_net(text.format(pad=pad), "112")
        for size in (111, 112, 57, 56):
            resized = big.with_image_size(size)
            assert resized == pool_net(text.format(pad=pad), str(size)), (pad, size)
            o = resized.layers[0].options
            file_pads = pool_net(text.format(pad=pad).replace(" ceil=1", ""), str(size))
            for (b, a), (fb, fa), e, n in zip(o.pad, file_pads.layers[0].options.pad,
                                              o.ceil_pad, resized.input_shape[1:], strict=True):
                assert (b, a - e) == (fb, fa)
                assert e == ceil_padding(n, 3, 2, fb, fa)
        assert big.with_image_size(111).with_image_size(112) == big
    plain = pool_net(text.format(pad=0), "112")
    grown = ceil_padding(112, 3, 2, 0, 0)
    assert grown > 0 and ceil_padding(111, 3, 2, 0, 0) == 0
    assert plain.layers[0].options.pad == ((0, grown),) * 2
    assert plain.out_shapes[0] == (2, *(out_size(112, 3, 2, 0, 0) + 1,) * 2)
    assert plain.with_image_size(111).layers[0].options.pad == ((0, 0),) * 2
    assert plain.with_image_size(111).out_shapes[0] == (2, *(out_size(111, 3, 2, 0, 0),) * 2)


def test_maxpool_padding_is_accepted_while_every_window_holds_input():
    """Padding past half the kernel (which PyTorch refuses) runs when every window still holds
    an input entry: the maxima are all of input entries, never of padding."""
    net = pool_net("maxpool kernel=3 stride=2 pad=2", "7x8")
    assert net.layers[0].options.pad == ((2, 2), (2, 2))
    x = np.random.default_rng(3).standard_normal((2, *net.input_shape))
    y, _ = run_pool(net, x)
    assert y.shape[1:] == net.out_shapes[0]
    assert np.isin(y, x).all()


# -- refusals ---------------------------------------------------------------------------------

REFUSED = [  # (line, size, the axis named): windows of padding alone
    ("avgpool kernel=2 stride=2 pad=0+2 count_pad=0", "4", "first"),
    ("avgpool kernel=1 pad=1 count_pad=0", "5", "first"),
    ("avgpool kernel=3 stride=1 pad=0x3+0 count_pad=0", "6", "second"),
    ("avgpool kernel=2 stride=2 pad=0x0x0+2 count_pad=0", "4x4x4", "third"),
    ("maxpool kernel=2 stride=2 pad=0+2", "4", "first"),
    ("maxpool kernel=3 stride=2 pad=3", "9", "first"),
    ("maxpool kernel=2 stride=1 pad=0x2+0 ceil=1", "5", "second"),
]


@pytest.mark.parametrize("line,size,axis", REFUSED)
def test_windows_of_padding_alone_are_refused_in_one_line_naming_the_layer(line, size, axis):
    with pytest.raises(NetError) as err:
        pool_net(line, size).out_shapes  # noqa: B018
    text = str(err.value)
    assert "\n" not in text.strip(), text
    assert "layer pool (" in text and "hold only padding" in text, text
    assert f"the {axis} spatial axis" in text, text


def test_the_same_padding_is_accepted_when_it_counts_in_the_divisor():
    """An average whose divisor is the kernel has no window to refuse: a window of padding
    alone averages to 0."""
    for line in ("avgpool kernel=2 stride=2 pad=0+2", "avgpool kernel=1 pad=1"):
        net = pool_net(line, "4")
        y, _ = run_pool(net, np.ones((1, *net.input_shape)))
        assert (y == 0).any() and y.shape[1:] == net.out_shapes[0]


def test_global_average_pooling_takes_no_count_pad():
    with pytest.raises(NetError, match="kernel=global .* no stride, pad or count_pad") as err:
        pool_net("avgpool kernel=global count_pad=0", "5")
    assert "\n" not in str(err.value)
