"""The cost model under the paper's assumptions against Eq. 3, 4, 7, 8 and 9 written out by hand.

AlexNet's sizes are typed in here from the architecture (224×224 input), not taken from the
code under test, and each equation is written as the paper sums it.
"""

import math

import pytest

from hpctrain.cost.machine import load_machine
from hpctrain.model.net import load_net
from hpctrain.plan.paper import domain, paper_layers, strategy_comm

MACHINE = load_machine("cori-knl")
A, BETA, W = 2e-6, 1.6666667e-10, 4  # Table 1: α = 2 µs, 1/β = 6 GB/s; 4-byte words

# AlexNet, per sample: input entries d_{i-1}, output entries d_i, weights |W_i|
D_IN = [3 * 224 * 224, 64 * 27 * 27, 192 * 13 * 13, 384 * 13 * 13, 256 * 13 * 13,
        256 * 6 * 6, 4096, 4096]
D_OUT = [64 * 55 * 55, 192 * 27 * 27, 384 * 13 * 13, 256 * 13 * 13, 256 * 13 * 13,
         4096, 4096, 1000]
WEIGHTS = [64 * 3 * 11 * 11, 192 * 64 * 5 * 5, 384 * 192 * 3 * 3, 256 * 384 * 3 * 3,
           256 * 256 * 3 * 3, 9216 * 4096, 4096 * 4096, 4096 * 1000]
# conv layers: kernel, input width and channels, output width and channels
CONV = [(11, 224, 3, 55, 64), (5, 27, 64, 27, 192), (3, 13, 192, 13, 384),
        (3, 13, 384, 13, 256), (3, 13, 256, 13, 256)]
L = 8


def lg(p):
    return math.ceil(math.log2(p)) if p > 1 else 0


def eq3_model(b, p):
    forward = sum(A * lg(p) + BETA * b * (p - 1) / p * D_OUT[i] * W for i in range(L))
    backward = sum(2 * (A * lg(p) + BETA * b * (p - 1) / p * D_IN[i] * W) for i in range(1, L))
    return forward + backward


def eq4_batch(b, p):
    return sum(2 * (A * lg(p) + BETA * (p - 1) / p * WEIGHTS[i] * W) for i in range(L))


def eq8_one_five_d(b, pr, pc):
    gather = sum(A * lg(pr) + BETA * b / pc * (pr - 1) / pr * D_OUT[i] * W for i in range(L))
    dx = sum(2 * (A * lg(pr) + BETA * b / pc * (pr - 1) / pr * D_IN[i] * W) for i in range(1, L))
    dw = sum(2 * (A * lg(pc) + BETA * (pc - 1) / pc * WEIGHTS[i] / pr * W) for i in range(L))
    return gather + dx + dw


def eq7_domain_conv(b, pr, pc):
    """Eq. 7 at Pc = 1; with Pc > 1 the convolution part of Eq. 9 (batch B/Pc per rank)."""
    p = pr * pc
    total = 0.0
    for i, (k, xw, xc, yw, yc) in enumerate(CONV):
        if pr > 1:
            total += 2 * (A + BETA * b / pc * xw * xc * (k // 2) * W)
            if i > 0:
                total += 2 * (A + BETA * b / pc * yw * yc * (k // 2) * W)
        total += 2 * (A * lg(p) + BETA * (p - 1) / p * WEIGHTS[i] * W)
    return total


def eq9_integrated(b, pr, pc):
    fc = range(5, L)
    gather = sum(A * lg(pr) + BETA * b / pc * (pr - 1) / pr * D_OUT[i] * W for i in fc)
    dx = sum(2 * (A * lg(pr) + BETA * b / pc * (pr - 1) / pr * D_IN[i] * W) for i in fc)
    dw = sum(2 * (A * lg(pc) + BETA * (pc - 1) / pc * WEIGHTS[i] / pr * W) for i in fc)
    return eq7_domain_conv(b, pr, pc) + gather + dx + dw


def total(costs):
    return sum(f + b for f, b in costs)


NET = load_net("alexnet")
POINTS = [(2048, 8), (2048, 64), (2048, 512), (512, 4096), (256, 6)]


def test_sizes_match_the_architecture():
    layers = paper_layers(NET)
    assert [l.d_in for l in layers] == D_IN
    assert [l.d_out for l in layers] == D_OUT
    assert [l.weights for l in layers] == WEIGHTS


@pytest.mark.parametrize("b,p", POINTS)
def test_eq3_model_parallel(b, p):
    got = total(strategy_comm(NET, "1.5d", b, (p, 1), MACHINE))
    assert got == pytest.approx(eq3_model(b, p), rel=1e-12)


@pytest.mark.parametrize("b,p", POINTS)
def test_eq4_batch_parallel(b, p):
    got = total(strategy_comm(NET, "1.5d", b, (1, p), MACHINE))
    assert got == pytest.approx(eq4_batch(b, p), rel=1e-12)


@pytest.mark.parametrize("b,p", POINTS)
def test_eq8_one_five_d_on_every_grid(b, p):
    for pr in (r for r in range(1, p + 1) if p % r == 0):
        got = total(strategy_comm(NET, "1.5d", b, (pr, p // pr), MACHINE))
        assert got == pytest.approx(eq8_one_five_d(b, pr, p // pr), rel=1e-12)


@pytest.mark.parametrize("b,p", POINTS)
def test_eq7_domain_parallel(b, p):
    layers = [l for l in paper_layers(NET) if l.kind == "conv"]
    got = total(domain(l, k == 0, b, (p, 1), MACHINE) for k, l in enumerate(layers))
    assert got == pytest.approx(eq7_domain_conv(b, p, 1), rel=1e-12)


@pytest.mark.parametrize("b,p", POINTS)
def test_eq9_integrated_on_every_grid(b, p):
    for pr in (r for r in range(1, p + 1) if p % r == 0):
        got = total(strategy_comm(NET, "integrated", b, (pr, p // pr), MACHINE))
        assert got == pytest.approx(eq9_integrated(b, pr, p // pr), rel=1e-12)


def test_the_paper_finding_holds_one_five_d_beats_both_extremes():
    """At B = 2048 on 512 ranks some Pr×Pc grid communicates less than pure model and pure
    batch, the paper's headline result for AlexNet."""
    b, p = 2048, 512
    times = {pr: eq8_one_five_d(b, pr, p // pr) for pr in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)}
    best = min(times, key=times.get)
    assert 1 < best < p
    got = total(strategy_comm(NET, "1.5d", b, (best, p // best), MACHINE))
    assert got < min(times[1], times[p])


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="unknown strategy 'pipeline'"):
        strategy_comm(NET, "pipeline", 64, (2, 2), MACHINE)
