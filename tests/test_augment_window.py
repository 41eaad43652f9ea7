"""A net smaller than its images reads windows of them: random ones under ``--augment``, the
centre otherwise and for held-out data; block by block equal to NumPy's whole batch."""

import numpy as np
import pytest

from hpctrain.data.augment import Augmented, augment
from hpctrain.data.dataset_fit import check_fits, crops_images
from hpctrain.data.dataset_format import DatasetInfo
from hpctrain.errors import UserError
from tests.test_augment import SEED, random_box, synthetic

SOURCE, WINDOW, BATCH = (3, 9, 8), (5, 6), 5


def reference(source, step, mode, pad):
    """The batch by NumPy: pad each image, cut the drawn h x w window, flip."""
    flip, dy, dx = Augmented(source, mode, SEED, pad, size=WINDOW).draws(step, (0, BATCH))
    x = source.images(step, ((0, BATCH), *((0, n) for n in SOURCE)))
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    h, w = WINDOW
    out = np.stack([x[n, :, dy[n]:dy[n] + h, dx[n]:dx[n] + w] for n in range(BATCH)])
    out[flip] = out[flip][..., ::-1]
    return out


@pytest.mark.parametrize("mode", ["none", "flip", "crop", "standard"])
@pytest.mark.parametrize("pad", [0, 2])
def test_windows_of_larger_images_match_numpy_block_by_block(mode, pad):
    source = synthetic(shape=SOURCE)
    augmented = augment(source, mode, SEED, pad, size=WINDOW)
    assert augmented.sample_shape == (3, *WINDOW)
    rng = np.random.default_rng(1)
    for step in (0, 3):
        full = augmented.images(step, ((0, BATCH), (0, 3), (0, WINDOW[0]), (0, WINDOW[1])))
        np.testing.assert_array_equal(full, reference(source, step, mode, pad))
        for _ in range(100):
            box = random_box(rng, BATCH, (3, *WINDOW))
            np.testing.assert_array_equal(augmented.images(step, box),
                                          full[tuple(slice(a, b) for a, b in box)])


def test_without_augmentation_the_window_is_the_centre_and_crops_span_the_image():
    source = synthetic(shape=SOURCE)
    flip, dy, dx = Augmented(source, "none", SEED, 0, size=WINDOW).draws(0, (0, BATCH))
    assert not flip.any() and set(dy) == {(9 - 5) // 2} and set(dx) == {(8 - 6) // 2}
    _, dy, dx = Augmented(source, "crop", SEED, 0, size=WINDOW).draws(0, (0, 400))
    assert set(dy) == set(range(5)) and set(dx) == set(range(3))


def test_a_window_larger_than_the_padded_image_is_refused():
    with pytest.raises(UserError, match="a 12x6 net input cannot be cut from 9x8 images"):
        augment(synthetic(shape=SOURCE), "crop", SEED, 1, size=(12, 6))


def test_the_dataset_check_takes_nets_smaller_than_the_images():
    info = DatasetInfo("d.h5", (3, 256, 256), 10, 100, 0)
    check_fits(info, (3, 224, 224), 10, 8)  # a window: no refusal
    with pytest.raises(UserError, match="holds samples of shape 3x256x256 but the net takes "
                                        "3x288x288"):
        check_fits(info, (3, 288, 288), 10, 8)
    assert not crops_images((3, 256, 256), (1, 224, 224))
    assert not crops_images((4, 64, 64, 64), (4, 32, 32, 32))  # volumes: no windows


def test_a_prefetcher_can_clear_the_note_of_a_dropped_read_through_augmentation():
    source = synthetic(shape=SOURCE)
    augmented = augment(source, "flip", SEED, 0)
    source.nonfinite = "sample 3 holds NaN"
    assert augmented.nonfinite == "sample 3 holds NaN"
    augmented.nonfinite = None  # what Prefetched does when it drops a read-ahead
    assert source.nonfinite is None
