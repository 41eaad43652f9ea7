"""Whether a dataset's samples fit a net's input: as they are, as windows of larger images, or
flattened.

A net with flat input of F features reads a dataset of (C, H, W) samples with C·H·W = F
flattened, in row-major order: the shipped ``mlp`` (64 features) trains on the 1×8×8 digits.
"""

from __future__ import annotations

import math

from hpctrain.data.dataset_format import CONVERT, DatasetError, DatasetInfo
from hpctrain.io.units import shape_text


def feeds_flat(sample_shape: tuple[int, ...], input_shape: tuple[int, ...]) -> bool:
    """Whether samples of ``sample_shape`` feed a net of flat ``input_shape`` (F,), flattened.

    They do when the samples are (C, H, W) or (C, D, H, W) and hold F values.

    >>> feeds_flat((1, 8, 8), (64,)), feeds_flat((1, 8, 8), (1, 8, 8)), feeds_flat((3, 4), (10,))
    (True, False, False)
    """
    return (len(input_shape) == 1 and len(sample_shape) > 1
            and math.prod(sample_shape) == input_shape[0])


def crops_images(sample_shape: tuple[int, ...], input_shape: tuple[int, ...]) -> bool:
    """Whether a net of ``input_shape`` (C, h, w) reads windows of (C, H, W) images larger
    than it: a 224² net on 256² images (random crops under ``--augment``, else the centre).

    >>> crops_images((3, 256, 256), (3, 224, 224)), crops_images((3, 256, 256), (3, 256, 256))
    (True, False)
    """
    return (len(sample_shape) == len(input_shape) == 3 and sample_shape[0] == input_shape[0]
            and sample_shape != input_shape
            and all(h <= s for h, s in zip(input_shape[1:], sample_shape[1:], strict=True)))


def dataset_image_size(sample_shape: tuple[int, ...], input_shape: tuple[int, ...]) -> int | None:
    """The side along every spatial axis that a dataset's samples give a net's input, or None
    when they leave it as it is.

    Images (or volumes) with the net's channels, as many axes and equal spatial sides set the
    size of a net that takes another (a run without ``--image-size`` resizes the net to them).

    >>> dataset_image_size((3, 32, 32), (3, 224, 224)), dataset_image_size((1, 8, 8), (64,))
    (32, None)
    >>> dataset_image_size((3, 32, 24), (3, 224, 224)), dataset_image_size((1, 8, 8), (1, 8, 8))
    (None, None)
    """
    if (len(sample_shape) == len(input_shape) >= 3 and len(set(sample_shape[1:])) == 1
            and sample_shape != input_shape and sample_shape[0] == input_shape[0]):
        return sample_shape[1]
    return None


def check_fits(info: DatasetInfo, input_shape: tuple[int, ...], classes: int, batch: int,
               regression: bool = False) -> None:
    """Refuse a dataset whose samples, answers or size do not fit a net and a batch.

    Samples fit when their shape is ``input_shape``, when they are (C, H, W) images at least
    as large as a (C, h, w) net's input (:func:`crops_images`: the net reads a window, see
    :mod:`hpctrain.data.augment`), or when the net takes F flat features and each sample holds
    F values (:func:`feeds_flat`; the reader flattens them). A classifier
    (``regression=False``, ``classes`` = K) needs a labels dataset of K classes; a regression
    (``regression=True``, ``classes`` = T, the width of the net's output) a targets dataset of
    T targets per sample.

    Raises
    ------
    DatasetError
        The sample shape differs from ``input_shape`` (for images or volumes with the same
        channels and equal spatial sides the message suggests ``--image-size``), labels where
        the net wants targets or the reverse, the class or target counts differ, or the
        training split holds fewer than ``batch`` samples.
    """
    sample, want = tuple(info.sample_shape), tuple(input_shape)
    if sample != want and not feeds_flat(sample, want) and not crops_images(sample, want):
        hint = "convert the data to the net's input shape or choose a net that takes it"
        if (len(sample) == len(want) >= 3 and sample[0] == want[0]
                and len(set(sample[1:])) == 1):
            hint = f"pass --image-size {sample[1]} to size the net's input to the data"
        elif len(want) == 1:
            hint = (f"a flat-input net reads samples of {math.prod(sample)} values; choose a "
                    f"net with features={math.prod(sample)}")
        raise DatasetError(f"dataset '{info.path}' holds samples of shape {shape_text(sample)} "
                           f"but the net takes {shape_text(want)}; {hint}")
    if regression and not info.targets:
        raise DatasetError(f"dataset '{info.path}' holds class labels ({info.classes} classes) "
                           f"but the net regresses {classes} targets; use a targets dataset "
                           f"({CONVERT} --targets) or a net whose input line says "
                           f"classes={info.classes}")
    if not regression and info.targets:
        raise DatasetError(f"dataset '{info.path}' holds {info.targets} real-valued targets "
                           f"per sample but the net classifies into {classes} classes; use a net "
                           f"whose input line says targets={info.targets}")
    if info.classes != classes:
        what = "targets" if regression else "classes"
        raise DatasetError(f"dataset '{info.path}' has {info.classes} {what} but the net has "
                           f"{classes}; use a net whose input line says {what}={info.classes}")
    if info.train_size < batch:
        raise DatasetError(f"dataset '{info.path}' has {info.train_size} training samples, "
                           f"fewer than --batch {batch}; lower --batch")


def check_label_maps(info: DatasetInfo, per_pixel: bool, net_name: str) -> None:
    """Refuse a dataset of label maps for a net that scores each sample, or one label per
    sample for a segmentation net (``per_pixel``: a class score per pixel)."""
    if info.label_maps and not per_pixel:
        raise DatasetError(f"dataset '{info.path}' holds label maps (a class per pixel) but net "
                           f"{net_name} gives one score per sample; use a segmentation net, "
                           f"whose last layer gives (classes, H, W)")
    if per_pixel and not info.label_maps:
        raise DatasetError(f"net {net_name} scores every pixel (segmentation) but dataset "
                           f"'{info.path}' holds one label per sample; convert label maps with "
                           f"{CONVERT} --labels MAPS.npy, shaped (N, H, W)")
