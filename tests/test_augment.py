"""Flips and crops of training images: block by block equal to the whole batch, and to NumPy."""

import numpy as np
import pytest

from hpctrain.data.augment import AUGMENT_MODES, Augmented, augment
from hpctrain.data.dataset_reader import H5Data
from hpctrain.data.dataset_writer import write_dataset
from hpctrain.data.synthetic import SyntheticData
from hpctrain.device.backend import make_backend
from hpctrain.errors import UserError

SHAPE, CLASSES, BATCH, SEED = (3, 7, 6), 4, 5, 3  # odd H, W: uneven splits and a middle column


def synthetic(batch=BATCH, shape=SHAPE):
    return SyntheticData(make_backend("cpu", "float64"), shape, CLASSES, batch, seed=1)


def whole(source, step, batch=BATCH, shape=SHAPE):
    return source.images(step, ((0, batch), *((0, n) for n in shape)))


def reference(source, step, mode, pad, batch=BATCH, shape=SHAPE):
    """The augmented batch by NumPy: pad each image, cut the window, flip."""
    flip, dy, dx = Augmented(source, mode, SEED, pad).draws(step, (0, batch))
    _, height, width = shape
    x = np.pad(whole(source, step, batch, shape), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.stack([x[n, :, dy[n]:dy[n] + height, dx[n]:dx[n] + width] for n in range(batch)])
    out[flip] = out[flip][..., ::-1]
    return out


def random_box(rng, batch=BATCH, shape=SHAPE):
    def cut(n):
        lo = int(rng.integers(0, n))
        return lo, int(rng.integers(lo + 1, n + 1))

    return (cut(batch), *(cut(n) for n in shape))


@pytest.mark.parametrize("mode", ["flip", "crop", "standard"])
@pytest.mark.parametrize("pad", [0, 2, 4, 9])
def test_whole_batch_matches_numpy(mode, pad):
    source = synthetic()
    augmented = augment(source, mode, SEED, pad)
    for step in (0, 1, 7):
        got = whole(augmented, step)
        np.testing.assert_array_equal(got, reference(source, step, mode, pad))


@pytest.mark.parametrize("mode", ["flip", "crop", "standard"])
def test_every_block_is_cut_from_the_whole_batch(mode):
    rng = np.random.default_rng(0)
    augmented = augment(synthetic(), mode, SEED, pad=3)
    for step in (0, 2):
        full = whole(augmented, step)
        for _ in range(200):
            box = random_box(rng)
            want = full[tuple(slice(a, b) for a, b in box)]
            np.testing.assert_array_equal(augmented.images(step, box), want, err_msg=str(box))


def test_row_splits_and_channel_splits_tile_the_batch():
    """Uneven row blocks (7 rows over 2, 3 and 4 ranks) and channel blocks put back together."""
    augmented = augment(synthetic(), "standard", SEED, pad=4)
    full = whole(augmented, 3)
    _, height, width = SHAPE
    for parts in (2, 3, 4):
        edges = np.linspace(0, height, parts + 1).astype(int)
        rows = [augmented.images(3, ((0, BATCH), (0, 3), (a, b), (0, width)))
                for a, b in zip(edges[:-1], edges[1:], strict=True)]
        np.testing.assert_array_equal(np.concatenate(rows, axis=2), full)
    channels = [augmented.images(3, ((1, 4), (c, c + 1), (0, height), (0, width)))
                for c in range(3)]
    np.testing.assert_array_equal(np.concatenate(channels, axis=1), full[1:4])


class Recording:
    """A source that records the boxes read from it."""

    def __init__(self, source):
        self.source, self.reads = source, []
        self.backend, self.batch = source.backend, source.batch
        self.sample_shape, self.nonfinite = source.sample_shape, None

    def images(self, step, box):
        self.reads.append(box)
        return self.source.images(step, box)

    def labels(self, step, samples):
        return self.source.labels(step, samples)


def test_a_block_reads_only_the_rows_its_window_needs():
    recording = Recording(synthetic(shape=(2, 16, 16)))
    augmented = augment(recording, "standard", SEED, pad=4)
    flip, dy, dx = augmented.draws(0, (0, BATCH))
    h0, h1 = 8, 12
    augmented.images(0, ((0, BATCH), (0, 2), (h0, h1), (0, 16)))
    assert len(recording.reads) <= BATCH
    for (lo, hi), channels, (a0, a1), (b0, b1) in recording.reads:
        assert hi == lo + 1 and channels == (0, 2)
        assert (a0, a1) == (max(h0 + dy[lo] - 4, 0), min(h1 + dy[lo] - 4, 16))
        assert b1 - b0 == 16 - abs(int(dx[lo]) - 4)  # the window's columns, padding not read


def test_draws_are_fair_and_keyed_by_sample():
    augmented = Augmented(synthetic(batch=4000), "standard", SEED, pad=2)
    flip, dy, dx = augmented.draws(0, (0, 4000))
    assert 0.45 < flip.mean() < 0.55
    for offsets in (dy, dx):
        counts = np.bincount(offsets, minlength=5)
        assert len(counts) == 5 and counts.min() > 700
    # the same sample, asked for from another block or step numbering, draws the same
    small = Augmented(synthetic(batch=1000), "standard", SEED, pad=2)
    again = small.draws(2, (10, 20))  # samples 2010..2019 of the stream
    for got, want in zip(again, (flip, dy, dx), strict=True):
        np.testing.assert_array_equal(got, want[2010:2020])
    other = Augmented(synthetic(batch=4000), "standard", SEED + 1, pad=2).draws(0, (0, 4000))
    assert (other[1] != dy).mean() > 0.5


def test_flip_alone_and_crop_alone():
    source = synthetic()
    flip, dy, dx = Augmented(source, "flip", SEED, 4).draws(0, (0, BATCH))
    assert (dy == 4).all() and (dx == 4).all() and flip.any()
    flip, dy, dx = Augmented(source, "crop", SEED, 4).draws(0, (0, BATCH))
    assert not flip.any()


def test_none_is_the_source_and_labels_pass_through():
    source = synthetic()
    assert augment(source, "none", SEED) is source
    augmented = augment(source, "standard", SEED)
    np.testing.assert_array_equal(augmented.labels(4, (1, 3)), source.labels(4, (1, 3)))
    assert augmented.nonfinite is None
    assert AUGMENT_MODES == ("none", "flip", "crop", "standard")


def test_dataset_samples_keep_their_draws_whatever_the_batch(tmp_path):
    """Keyed by dataset index and epoch: batches of 4 and of 8 augment each sample alike."""
    rng = np.random.default_rng(2)
    path = tmp_path / "d.h5"
    write_dataset(path, rng.standard_normal((16, *SHAPE)), rng.integers(0, CLASSES, 16),
                  CLASSES, rng.standard_normal((3, *SHAPE)), rng.integers(0, CLASSES, 3))
    backend = make_backend("cpu", "float64")
    with H5Data(backend, path, 4, seed=7) as four, H5Data(backend, path, 8, seed=7) as eight:
        a4, a8 = augment(four, "standard", SEED), augment(eight, "standard", SEED)
        for epoch in (0, 1):
            by_eight = whole(a8, 2 * epoch, 8)
            by_four = np.concatenate([whole(a4, 4 * epoch + k, 4) for k in (0, 1)])
            np.testing.assert_array_equal(by_four, by_eight)
        # another epoch draws afresh: the same sample is augmented differently somewhere
        e0 = a8.draws(0, (0, 8)), eight.indices(0, (0, 8))
        e1 = a8.draws(2, (0, 8)), eight.indices(2, (0, 8))
        order0, order1 = np.argsort(e0[1]), np.argsort(e1[1])
        assert any((e0[0][k][order0] != e1[0][k][order1]).any() for k in range(3))
        np.testing.assert_array_equal(whole(a8, 1, 8), reference(eight, 1, "standard", 4, 8))
    with H5Data(backend, path, 2, seed=7, split="val") as val:
        with pytest.raises(UserError, match="held-out"):
            augment(val, "standard", SEED)


def test_bad_options_name_the_fix():
    with pytest.raises(UserError, match="choose one of none, flip, crop, standard"):
        augment(synthetic(), "mirror", SEED)
    with pytest.raises(UserError, match="padding -1"):
        augment(synthetic(), "crop", SEED, pad=-1)
    with pytest.raises(UserError, match=r"\(C, H, W\) images"):
        augment(synthetic(shape=(12,)), "flip", SEED)
