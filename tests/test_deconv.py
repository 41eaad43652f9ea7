"""Transposed convolutions (``deconv``): the kernel against PyTorch's ``conv_transpose``, the
rows a band of outputs reads, the net file's options and refusals, and its layouts and prices.
Its splits against one process are in ``tests/mpi/test_deconv.py``; a decoder of them against
PyTorch in ``tests/mpi/test_torch_reference.py``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hpctrain.kernels.deconv import deconv_backward, deconv_forward
from hpctrain.layout.layout import Layout, Split
from hpctrain.layout.partition import SplitError, TransposedWindow, halo_plans
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import NetError, parse_net
from hpctrain.model.net_text import net_text

TOLERANCE = 1e-12


def net_of(body: str, size: int = 8, channels: int = 4):
    return parse_net(f"input channels={channels} size={size} classes=3\n{body}\n"
                     f"avgpool kernel=global\nflatten\nlinear out=3\n", "test.net")


def full_crop(size, kernel, stride, pad, outpad, dilation):
    """PyTorch's output: the full output less ``pad`` before and ``pad − outpad`` after."""
    return tuple((p, (m - 1) * s - 2 * p + d * (k - 1) + q + 1)
                 for m, k, s, p, q, d in zip(size, kernel, stride, pad, outpad, dilation,
                                             strict=True))


@pytest.mark.reference
@pytest.mark.parametrize("axes", [1, 2, 3])
def test_transposed_convolution_equals_pytorchs(axes):
    """Every case of channels and groups, kernel, stride, padding, output padding and
    dilation: Y, dX, dW and db as PyTorch's ``conv_transpose`` gives them."""
    torch = pytest.importorskip("torch")
    functional = {1: torch.nn.functional.conv_transpose1d,
                  2: torch.nn.functional.conv_transpose2d,
                  3: torch.nn.functional.conv_transpose3d}[axes]
    rng = np.random.default_rng(axes)
    cases = [(4, 6, 1), (4, 6, 2), (6, 6, 6)]  # (channels, outputs, groups)
    for (c, o, g), k, s, p, d in itertools.product(cases, (1, 2, 3), (1, 2), (0, 1), (1, 2)):
        q = max(s, d) - 1  # the largest output padding PyTorch allows
        size = (5, 4, 3)[:axes]
        kernel, stride = (k,) * axes, (s,) * axes
        x = rng.standard_normal((2, c, *size))
        w = rng.standard_normal((c, o // g, *kernel))
        b = rng.standard_normal(o)
        crop = full_crop(size, kernel, stride, (p,) * axes, (q,) * axes, (d,) * axes)
        if min(n for _, n in crop) < 1:
            continue
        y, cache = deconv_forward(np, x, w, b, stride, crop, (d,) * axes, g)
        dy = rng.standard_normal(y.shape)
        dx, dw, db = deconv_backward(np, dy, w, cache)
        tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (x, w, b))
        ty = functional(tx, tw, tb, stride=s, padding=p, output_padding=q, groups=g, dilation=d)
        ty.backward(torch.tensor(dy))
        case = f"C={c} O={o} G={g} k={k} s={s} p={p} q={q} d={d}"
        for name, got, want in (("Y", y, ty), ("dX", dx, tx.grad), ("dW", dw, tw.grad),
                                ("db", db, tb.grad)):
            want = want.detach().numpy()
            assert got.shape == want.shape, f"{case}: {name} shape"
            error = np.abs(got - want).max() / np.abs(want).max()
            assert error < TOLERANCE, f"{case}: {name} off by {error:.1e}"


def test_a_band_of_outputs_equals_its_rows_of_the_whole():
    """A band of output rows made from the input rows that reach it (a domain split's share)
    equals those rows of the whole output, and the bands' input gradients add up to the
    whole's: what the halo exchange and its adjoint rely on."""
    rng = np.random.default_rng(3)
    window = TransposedWindow(3, 2, 1, 0)  # kernel 3, stride 2, pad 1, output padding 1
    x = rng.standard_normal((2, 3, 7, 5))
    w = rng.standard_normal((3, 4, 3, 3))
    width = full_crop((5,), (3,), (2,), (1,), (1,), (1,))[0]
    n_out = window.out_size(7)
    y, cache = deconv_forward(np, x, w, None, (2, 2), ((1, n_out), width))
    dy = rng.standard_normal(y.shape)
    dx, _, _ = deconv_backward(np, dy, w, cache)
    summed = np.zeros_like(dx)
    for plan in halo_plans(7, 3, window, "up"):
        (r0, r1), (o0, o1) = plan.need, plan.out
        crop = ((o0 - (r0 * 2 - 1), o1 - o0), width)
        band, band_cache = deconv_forward(np, x[:, :, r0:r1], w, None, (2, 2), crop)
        assert np.abs(band - y[:, :, o0:o1]).max() < TOLERANCE
        band_dx, _, _ = deconv_backward(np, dy[:, :, o0:o1], w, band_cache)
        summed[:, :, r0:r1] += band_dx
    assert np.abs(summed - dx).max() < TOLERANCE


def test_a_transposed_window_reads_every_row_that_reaches_its_outputs():
    """Against a count of which input rows reach which outputs, for every kernel, stride,
    padding, output padding and dilation of a few rows (dilated, the rows between two taps
    that reach none are read too: the range is contiguous)."""
    for k, s, before, after, d in itertools.product((1, 2, 3, 4), (1, 2, 3), (0, 1, 2),
                                                    (-1, 0, 1, 2), (1, 2)):
        window = TransposedWindow(k, s, before, after, d)
        for n in range(1, 6):
            for o0 in range(window.out_size(n)):
                for o1 in range(o0 + 1, window.out_size(n) + 1):
                    lo, hi = window.rows_needed(o0, o1)
                    reach = [i for i in range(-4, n + 4)
                             if any(o0 <= i * s - before + a * d < o1 for a in range(k))]
                    assert all(lo <= i < hi for i in reach), (window, o0, o1)
                    if d == 1 and reach:  # undilated, the rows are exactly those that reach
                        assert (lo, hi) == (reach[0], reach[-1] + 1), (window, o0, o1)


def test_a_decoder_upsampling_by_two_needs_one_halo_row():
    plans = halo_plans(8, 4, TransposedWindow(3, 2, 1, 0), "up")
    assert [p.out for p in plans] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    # output 3 = 2·2 − 1 is the first tap of input row 2: one row from below, none from above
    assert [p.need for p in plans] == [(0, 3), (2, 5), (4, 7), (6, 8)]
    assert [p.recv_bottom for p in plans] == [(2, 3), (4, 5), (6, 7), (8, 8)]
    assert all(p.recv_top[0] == p.recv_top[1] for p in plans)


# -- the net file ------------------------------------------------------------------------------


def test_deconv_shapes_as_pytorch():
    net = net_of("deconv name=up out=6 kernel=3 stride=2 pad=1 outpad=1\n"
                 "deconv name=g out=12 kernel=4 stride=2 pad=1 groups=6 bias=0\n"
                 "deconv name=d out=4 kernel=3 dilation=2 pad=2")
    assert net.out_shapes[:3] == ((6, 16, 16), (12, 32, 32), (4, 32, 32))
    params = net.param_shapes()
    assert params["up.weight"] == (4, 6, 3, 3) and params["up.bias"] == (6,)
    assert params["g.weight"] == (6, 2, 4, 4) and "g.bias" not in params
    assert parse_net(net_text(net), "again.net").layers == net.layers
    text = net_text(net)
    assert "outpad=1x1" in text and "groups=1 " not in text and "dilation=1" not in text


@pytest.mark.parametrize("line,fragment", [
    ("deconv out=4 kernel=3 pad=same", "pad= crops the output"),
    ("deconv out=4 kernel=3 stride=2 outpad=2", "outpad=2 must be smaller than the stride (2)"),
    ("deconv out=6 kernel=3 groups=4", "groups=4 must divide its 4 input and 6 output"),
    ("deconv out=4 kernel=2 pad=3", "too small for its window"),
    ("deconv out=4 kernel=3 outpad=1x1x1", "outpad"),
])
def test_a_bad_deconv_is_refused_in_one_line(line, fragment):
    with pytest.raises(NetError) as caught:
        net_of(line, size=2)
    assert "\n" not in str(caught.value)
    assert fragment in str(caught.value)


# -- layouts and prices -------------------------------------------------------------------------


def deconv_layouts(body: str, split: Split, batch: int = 4):
    net = net_of(body)
    spec = net.layers[0]
    kind = KINDS[spec.kind]
    fed = (Layout((batch, *net.in_shapes(0)[0]), (1, 1)),)
    inputs, output = kind.layouts(spec, fed, (batch, *net.out_shapes[0]), split)
    return spec, kind, inputs, output


def test_a_model_split_cuts_the_weights_columns():
    """Each of 2 ranks computes 3 of 6 output channels from every input channel; the weight's
    columns (axis 1, PyTorch's order) are cut, and its work is half the whole's."""
    body = "deconv out=6 kernel=3 stride=2 pad=1 outpad=1"
    spec, kind, (x,), y = deconv_layouts(body, Split((1, 2, 1, 1)))
    kind.check(spec, (x,), y)
    assert x.parts[1] == 1 and y.parts[1] == 2
    weight = kind.weight_layout(spec, (4, 6, 3, 3), y)
    assert {weight.box(r)[1] for r in range(2)} == {(0, 3), (3, 6)}
    assert kind.local_parameters(spec, (x,), y) == 3 * (4 * 9 + 1)
    whole = deconv_layouts(body, Split((1, 1, 1, 1)))
    half = kind.work(spec, (x,), y, True)
    assert 2 * kind.flops(half)[0] == kind.flops(kind.work(spec, whole[2], whole[3], True))[0]
    assert half.out_sizes() == (16, 16)
    assert half.key().endswith("|transposed")


def test_a_domain_split_reads_its_rows_with_a_halo():
    spec, kind, (x,), y = deconv_layouts("deconv out=6 kernel=3 stride=2 pad=1 outpad=1",
                                         Split((1, 1, 4, 1)))
    kind.check(spec, (x,), y)
    work = kind.work(spec, (x,), y, True)
    assert work.x[2] == 3  # 2 rows of its own, one from below
    assert work.out_sizes() == (4, 16)
    resident, transient = kind.memory(spec, _footprint(work))
    assert resident == {} and transient["columns"] == 4 * 6 * 9 * 3 * 8 * 8


def _footprint(work):
    from hpctrain.cost.memory import Footprint

    return Footprint(x=8 * np.prod(work.x), y=8 * 4 * 6 * 64, work=work, itemsize=8,
                     loose_input={}, height_split=True)


@pytest.mark.parametrize("split,fragment", [
    (Split((1, 3, 1, 1)), "its 4 groups cannot be cut into 3 blocks"),
    (Split((1, 1, 1, 1), inputs=2), "does not split its input channels"),
])
def test_splits_a_deconv_cannot_take_are_refused(split, fragment):
    with pytest.raises(SplitError, match=fragment):
        spec, kind, inputs, output = deconv_layouts("deconv out=12 kernel=3 pad=1 groups=4",
                                                    split)
        kind.check(spec, inputs, output)


def test_a_net_with_deconv_plans_and_splits_it_by_the_conv_key():
    """``--grid conv=`` sets a transposed convolution's grid too; the planner prices one."""
    from hpctrain.plan.plans import plan_from_spec

    net = net_of("conv out=8 kernel=3 stride=2 pad=1\ndeconv out=4 kernel=3 stride=2 pad=1 "
                 "outpad=1", size=16)
    plan = plan_from_spec("conv=domain:2x1,fc=1x2", net, 2)
    assert [entry.mode for entry in plan[:2]] == ["domain", "domain"]
