"""What verify measures a parameter gradient or buffer against: the magnitude of the sum it is
(each kind's :meth:`~hpctrain.model.kinds.base.Kind.magnitudes`), checked here against sums of
|terms| written out by loop; that a correct plan whose bias gradients cancel to rounding noise
passes; and that a real error still fails."""

import itertools

import numpy as np
import pytest

from hpctrain.commands.verify import _worst
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import parse_net
from tests.test_training_app import launch, mpiexec

RNG = np.random.default_rng(5)


def spec_of(text):
    """The one layer of a net ``text`` (its input line first)."""
    return parse_net(text, "one").layers[0]


def test_conv_magnitudes_are_the_sums_of_absolute_terms():
    spec = spec_of("input channels=2 size=5 classes=3\nconv out=3 kernel=3 stride=2 pad=1\n"
                   "flatten\nlinear out=3")
    x, dy = RNG.standard_normal((2, 2, 5, 5)), RNG.standard_normal((2, 3, 3, 3))
    got = KINDS["conv"].magnitudes(spec, [x], dy)
    xp = np.pad(np.abs(x), ((0, 0), (0, 0), (1, 1), (1, 1)))
    weight = np.zeros((3, 2, 3, 3))
    for n, o, c, a, e, p, q in itertools.product(range(2), range(3), range(2), range(3),
                                                 range(3), range(3), range(3)):
        weight[o, c, a, e] += abs(dy[n, o, p, q]) * xp[n, c, 2 * p + a, 2 * q + e]
    np.testing.assert_allclose(got["weight"], weight, rtol=1e-12)
    np.testing.assert_allclose(got["bias"], np.abs(dy).sum(axis=(0, 2, 3)), rtol=1e-12)


def test_linear_and_batchnorm_magnitudes():
    linear = spec_of("input features=4 classes=3\nlinear out=3")
    x, dy = RNG.standard_normal((5, 4)), RNG.standard_normal((5, 3))
    got = KINDS["linear"].magnitudes(linear, [x], dy)
    want = [[sum(abs(dy[n, o] * x[n, i]) for n in range(5)) for i in range(4)] for o in range(3)]
    np.testing.assert_allclose(got["weight"], want, rtol=1e-12)
    np.testing.assert_allclose(got["bias"], np.abs(dy).sum(axis=0), rtol=1e-12)
    norm = spec_of("input channels=3 size=2 classes=12\nbatchnorm momentum=0.25\nflatten")
    x, dy = RNG.standard_normal((4, 3, 2, 2)) + 3.0, RNG.standard_normal((4, 3, 2, 2))
    got = KINDS["batchnorm"].magnitudes(norm, [x], dy)
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    x_hat = (x - mean) / np.sqrt(x.var(axis=(0, 2, 3), keepdims=True) + 1e-5)
    np.testing.assert_allclose(got["gamma"], np.abs(dy * x_hat).sum(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(got["beta"], np.abs(dy).sum(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(got["running_mean"], 0.25 * np.abs(x).mean(axis=(0, 2, 3)))
    assert KINDS["relu"].magnitudes(spec_of("input features=3 classes=3\nrelu"), [x], dy) == {}


def test_a_cancelled_sum_is_measured_against_its_terms_and_a_real_error_still_fails():
    # a bias gradient before a batch norm: per channel the terms sum to zero in exact
    # arithmetic, and two summation orders differ by rounding alone
    dy = RNG.standard_normal((16, 8, 32, 32))
    dy -= dy.mean(axis=(0, 2, 3), keepdims=True)
    in_order = dy.sum(axis=(0, 2, 3))
    by_rank = sum(part.sum(axis=(0, 2, 3)) for part in np.split(dy, 4))  # four batch shards
    magnitude = {"b": np.abs(dy).sum(axis=(0, 2, 3))}
    assert _worst({"b": by_rank}, {"b": in_order}, magnitude) < 1e-14
    assert _worst({"b": by_rank}, {"b": in_order}, {}) > 1e-3  # against itself: noise
    dropped = sum(part.sum(axis=(0, 2, 3)) for part in np.split(dy, 4)[:3])  # a shard missing
    assert _worst({"b": dropped}, {"b": in_order}, magnitude) > 1e-3


POOLED = """input channels=3 size=64 classes=10
conv out=8 kernel=3 pad=1 bias=0
avgpool kernel=global
conv out=16 kernel=1
batchnorm
flatten
linear out=10
"""


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_verify_passes_a_correct_plan_whose_bias_gradient_cancels(tmp_path):
    """conv(bias) -> batch norm on globally pooled features, 4 ranks, 1x4, batch 16: the bias
    gradient is zero in exact arithmetic; measured against a thousandth of the layer's largest
    gradient its rounding read 1.2e-9 and failed this correct plan."""
    (tmp_path / "pooled.net").write_text(POOLED)
    result = launch(4, "verify", "--net", "pooled.net", "--grid", "1x4", "--batch", "16",
                    "--seed", "1", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.endswith("PASS")
    assert float(verdict.split("largest relative error ")[1].split()[0]) < 1e-12


BATCHNORM_FIRST = """input channels=3 size=8 classes=10
batchnorm
conv out=8 kernel=3 pad=1
relu
flatten
linear out=10
"""


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
@pytest.mark.parametrize("grid,batch", [("4x1", "3"), ("conv=domain:2x2,fc=4x1", "2")])
def test_a_net_whose_first_layer_has_no_weights_runs_where_its_first_conv_reads(tmp_path,
                                                                               grid, batch):
    """The batch norm of the input ran batch-parallel over all 4 ranks, so 4x1 (one batch
    rank) refused batch 3 as if it had 4; it now runs on the layout the convolution reads
    (replicated over 4x1, the height split under domain 2x2)."""
    (tmp_path / "bn.net").write_text(BATCHNORM_FIRST)
    result = launch(4, "verify", "--net", "bn.net", "--grid", grid, "--batch", batch,
                    tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("PASS")
    first = next(line for line in result.stdout.splitlines() if line.startswith("batchnorm1"))
    assert ("4x1 batch/1 replicated" if grid == "4x1" else "2x2 batch/2 height/2") in first
