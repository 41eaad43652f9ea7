"""Synthetic data of any sample shape, for classifiers and for regressions (one process)."""

import numpy as np
import pytest

from hpctrain.data.synthetic import REGRESSION_PATTERNS, SyntheticData
from hpctrain.device.backend import make_backend

BATCH, SEED = 6, 3
VOLUME = (2, 8, 4, 5)  # (C, D, H, W)


@pytest.fixture
def backend():
    return make_backend("cpu", "float64")


def whole_box(shape, batch=BATCH):
    return ((0, batch), *((0, n) for n in shape))


@pytest.mark.parametrize("shape", [(10,), (3, 6, 5), VOLUME])
def test_any_block_equals_that_block_of_the_whole_batch(backend, shape):
    data = SyntheticData(backend, shape, 4, BATCH, SEED)
    whole = data.images(2, whole_box(shape))
    assert whole.shape == (BATCH, *shape) and np.isfinite(whole).all()
    for axis in range(len(shape) + 1):  # split each axis in three uneven parts, as ranks do
        n = BATCH if axis == 0 else shape[axis - 1]
        for lo, hi in ((0, n // 3), (n // 3, n - 1), (n - 1, n)):
            box = list(whole_box(shape))
            box[axis] = (lo, hi)
            got = data.images(2, tuple(box))
            np.testing.assert_array_equal(got, whole[tuple(slice(*r) for r in box)])


def test_a_depth_slab_of_a_volume_is_drawn_alone(backend):
    data = SyntheticData(backend, VOLUME, 4, BATCH, SEED)
    whole = data.images(1, whole_box(VOLUME))
    slabs = [data.images(1, ((0, BATCH), (0, 2), (d, d + 2), (0, 4), (0, 5)))
             for d in range(0, 8, 2)]
    np.testing.assert_array_equal(np.concatenate(slabs, axis=2), whole)


def test_classifier_labels_are_the_hidden_pattern(backend):
    data = SyntheticData(backend, VOLUME, 5, BATCH, SEED)
    labels = data.labels(4, (0, BATCH))
    assert labels.dtype == np.int64 and labels.shape == (BATCH,)
    assert ((labels >= 0) & (labels < 5)).all()
    np.testing.assert_array_equal(labels, data.hidden(4, (0, BATCH)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_regression_targets_are_drawn_per_sample_by_global_index(dtype):
    backend = make_backend("cpu", dtype)
    data = SyntheticData(backend, VOLUME, 4, BATCH, SEED, regression=True)
    targets = data.labels(3, (0, BATCH))
    assert targets.shape == (BATCH, 4) and targets.dtype == np.dtype(dtype)
    assert (targets >= -1).all() and (targets < 1).all()
    parts = [data.labels(3, (0, 1)), data.labels(3, (1, 4)), data.labels(3, (4, BATCH))]
    np.testing.assert_array_equal(np.concatenate(parts), targets)
    # batch 3 of a batch of 6 is samples 18..23 of the stream, whatever the batch size
    other = SyntheticData(backend, VOLUME, 4, 2, SEED, regression=True)
    np.testing.assert_array_equal(other.labels(9, (0, 2)), targets[0:2])
    assert not np.array_equal(
        SyntheticData(backend, VOLUME, 4, BATCH, SEED + 1, regression=True).labels(3, (0, BATCH)),
        targets)


def test_regression_targets_follow_from_the_images(backend):
    """Without noise, samples have equal images exactly when they have equal targets."""
    data = SyntheticData(backend, VOLUME, 3, 64, SEED, noise=0.0, regression=True)
    images = data.images(0, whole_box(VOLUME, 64)).reshape(64, -1)
    targets = data.labels(0, (0, 64))
    hidden = data.hidden(0, (0, 64))
    assert hidden.max() < REGRESSION_PATTERNS and len(set(hidden.tolist())) > 8
    for i in range(64):
        same_image = (images == images[i]).all(axis=1)
        same_targets = (targets == targets[i]).all(axis=1)
        np.testing.assert_array_equal(same_image, same_targets)
    # a least-squares fit from the noisy images predicts the targets of new samples
    noisy = SyntheticData(backend, VOLUME, 3, 256, SEED, regression=True)
    x = noisy.images(0, whole_box(VOLUME, 256)).reshape(256, -1)
    y = noisy.labels(0, (0, 256))
    coef, *_ = np.linalg.lstsq(np.c_[x, np.ones(256)], y, rcond=None)
    x_new = noisy.images(1, whole_box(VOLUME, 256)).reshape(256, -1)
    error = np.c_[x_new, np.ones(256)] @ coef - noisy.labels(1, (0, 256))
    assert (error ** 2).mean() < 0.1 * noisy.labels(1, (0, 256)).var(axis=0).mean()


def test_the_classifier_stream_is_the_one_it_always_was():
    """Runs and tests recorded before regression existed see the same data."""
    data = SyntheticData(make_backend("cpu", "float32"), (1, 8, 8), 10, 8, 0)
    assert data.labels(0, (0, 8)).tolist() == [2, 5, 1, 2, 1, 0, 4, 8]
    images = data.images(0, whole_box((1, 8, 8), 8)).astype(np.float64)
    assert images.sum() == pytest.approx(6.679206967353821, abs=1e-5)
