"""Writing a dataset file (:mod:`hpctrain.data.dataset_format`): checked, atomically, and one
batch of samples at a time.

``python -m hpctrain convert`` writes this format from ``.npy``/``.npz`` arrays, from
scikit-learn's handwritten digits, or as synthetic Gaussian random fields
(:mod:`hpctrain.commands.convert`, :mod:`hpctrain.data.universe`). :func:`write_batches` writes
one batch of samples at a time, so a set bigger than memory is written in O(one batch).
Every chunk written carries a Fletcher-32 checksum, which HDF5 checks on every read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpctrain.data.dataset_format import (
    FORMAT,
    IMAGE_DTYPES,
    PIXELS_VERSION,
    SAMPLE_RANKS,
    SPLITS,
    VERSION,
    DatasetError,
    as_finite_float32,
    chunk_shape,
    is_dataset,
)
from hpctrain.errors import stop_if_terminated
from hpctrain.io.files import replace_atomically
from hpctrain.io.units import shape_text

WRITE_BYTES = 64 << 20  # write_dataset hands this much of an array to the file at a time


def write_dataset(path: str | Path, images: Any, labels: Any = None, classes: int | None = None,
                  val_images: Any = None, val_labels: Any = None, description: str = "", *,
                  targets: Any = None, val_targets: Any = None) -> None:
    """Check the arrays and write them as a dataset file, atomically.

    Give ``labels`` for a classifier's dataset, or ``targets`` for a regression's, not both.
    The images are read one batch of samples at a time (about 64 MiB), so a NumPy memory map
    (``numpy.load(..., mmap_mode="r")``) of a set bigger than memory can be written.

    Parameters
    ----------
    path : where to write; an existing file is replaced only once the new one is complete.
    images : (N, C, H, W), (N, C, D, H, W) or (N, F) training samples, any real dtype; stored
        as float32. Any array with ``shape``, ``dtype`` and slicing along the first axis.
    labels : (N,) integer class labels in [0, classes); or (N, H, W) (volumes: (N, D, H, W))
        label maps of the images' spatial size, one class per pixel, −1 for a pixel that is
        not counted (a segmentation's dataset).
    classes : number of classes; default max label (over both splits) + 1.
    val_images, val_labels, val_targets : an optional held-out split with the same sample shape
        (and as many targets per sample).
    description : where the data came from, stored as an attribute.
    targets : (N, T) real-valued targets, all finite; (N,) is one target per sample.

    Raises
    ------
    DatasetError
        Mismatched lengths or sample shapes, non-integer or out-of-range labels, non-finite
        images or targets, labels and targets both or neither.
    OutputError
        A file that cannot be written, or something at ``path`` hpctrain did not write.
    """
    regression = targets is not None
    if labels is None and not regression:
        raise DatasetError("give labels (class indices) or targets (real values), one per sample")
    if labels is not None and regression:
        raise DatasetError("give labels or targets, not both: a dataset trains a classifier or "
                           "a regression")
    answer, val_answer, other = (("targets", val_targets, "val_labels") if regression
                                 else ("labels", val_labels, "val_targets"))
    if (val_labels if regression else val_targets) is not None:
        raise DatasetError(f"{other} does not go with {answer}; give val_{answer}")
    if (val_images is None) != (val_answer is None):
        raise DatasetError(f"give both val_images and val_{answer}, or neither")
    splits = {"train": _checked_split("train", images, targets if regression else labels,
                                      regression)}
    if val_images is not None:
        splits["val"] = _checked_split("val", val_images, val_answer, regression)
        if splits["val"][1].ndim != splits["train"][1].ndim:
            raise DatasetError("train labels and val labels must both be label maps or both "
                               "one label per sample")
        train_shape, val_shape = splits["train"][0].shape[1:], splits["val"][0].shape[1:]
        if val_shape != train_shape:
            raise DatasetError(f"val samples have shape {shape_text(val_shape)} but train "
                               f"samples {shape_text(train_shape)}; both splits must match")
    width = 0
    if regression:
        widths = {y.shape[1] for _, y in splits.values()}
        if len(widths) > 1:
            raise DatasetError(f"train samples have {splits['train'][1].shape[1]} targets but "
                               f"val samples {splits['val'][1].shape[1]}; both splits must match")
        width = widths.pop()
    else:
        classes = _checked_classes(splits, classes)
    sample = tuple(splits["train"][0].shape[1:])
    per_write = max(1, WRITE_BYTES // (4 * math.prod(sample)))

    def batches() -> Iterable[tuple[str, Any, np.ndarray]]:
        for name, (x, y) in splits.items():
            for lo in range(0, len(y), per_write):
                yield name, x[lo:lo + per_write], y[lo:lo + per_write]

    write_batches(path, sample, {name: len(y) for name, (_, y) in splits.items()}, batches(),
                  classes=classes, targets=width, description=description,
                  label_shape=tuple(splits["train"][1].shape[1:]) if not regression else ())


def write_batches(path: str | Path, sample_shape: tuple[int, ...], sizes: Mapping[str, int],
                  batches: Iterable[tuple[str, Any, Any]], *, classes: int | None = None,
                  targets: int = 0, description: str = "", dtype: Any = np.float32,
                  at_most: bool = False, label_shape: tuple[int, ...] = ()) -> None:
    """Write a dataset file from batches of samples, holding one batch in memory at a time.

    Parameters
    ----------
    path : where to write, atomically as :func:`write_dataset`.
    sample_shape : (C, H, W), (C, D, H, W) or (F,).
    sizes : samples per split, e.g. ``{"train": 800, "val": 200}``; "train" is required.
    batches : ``(split, images, answers)`` triples that fill each split in order: images
        ``(n, *sample_shape)``, and answers (n,) integer labels or, when ``targets`` > 0, (n, T)
        real-valued targets. A generator that makes each batch when asked keeps memory to one
        batch.
    classes : number of classes of a labels dataset; default max label + 1.
    targets : T, the targets per sample of a targets dataset; 0 for a labels dataset.
    description : where the data came from, stored as an attribute.
    dtype : how the images are stored: float32 (any real batches, checked finite), or uint8
        (batches must be uint8; (C, H, W) or (C, D, H, W) samples), whose training split's
        per-channel mean and std are computed exactly as the batches pass and stored as the
        ``mean`` and ``std`` attributes (version 3).
    at_most : ``sizes`` are upper bounds: each split is cut to the samples its batches hold
        (used when some inputs may turn out unreadable); otherwise they must be filled exactly.
    label_shape : () for one label per sample; the spatial shape of the samples for label
        maps, ``(n, *label_shape)`` per batch, −1 at a pixel not counted.

    Raises
    ------
    DatasetError
        A batch of the wrong shape, a NaN or Inf (naming the split and sample), a label out of
        range, or splits not filled exactly (or left empty); the partly written file is removed.
    """
    sample_shape = tuple(int(n) for n in sample_shape)
    if len(sample_shape) not in SAMPLE_RANKS or min(sample_shape) < 1:
        raise DatasetError(f"samples of shape {shape_text(sample_shape)}; give (C, H, W) images, "
                           f"(C, D, H, W) volumes or (F,) feature vectors")
    if "train" not in sizes or set(sizes) - set(SPLITS):
        raise DatasetError(f"splits {', '.join(sizes)}; give train and optionally val")
    for name, size in sizes.items():
        if size < 1:
            raise DatasetError(f"the {name} split is empty; give at least one sample")
    if targets < 0 or (targets and classes is not None):
        raise DatasetError(f"targets {targets} with classes {classes}; a dataset holds labels "
                           f"(classes=K) or T > 0 targets per sample")
    dtype = np.dtype(dtype)
    if dtype not in IMAGE_DTYPES:
        raise DatasetError(f"images stored as {dtype}; choose float32 or uint8")
    pixels = dtype == np.uint8
    if pixels and len(sample_shape) == 1:
        raise DatasetError(f"uint8 samples of shape {shape_text(sample_shape)}; uint8 pixels "
                           f"need (C, H, W) images or (C, D, H, W) volumes")
    if pixels and sizes.get("train", 0) < 1:
        raise DatasetError("uint8 pixels are normalised by the training split's statistics; "
                           "give a training split of at least one sample")
    channels = sample_shape[0]
    label_shape = tuple(int(n) for n in label_shape)
    if label_shape and (targets or label_shape != sample_shape[1:]):
        raise DatasetError(f"label maps of shape {shape_text(label_shape)} for samples of "
                           f"shape {shape_text(sample_shape)}; give one label per pixel of the "
                           f"samples' spatial size {shape_text(sample_shape[1:])}")

    def write(tmp: Path) -> None:
        # no HDF5 file lock: replace_atomically holds one of its own (lock=True below)
        with h5py.File(tmp, "w", locking=False) as h5:
            h5.attrs["format"] = FORMAT
            h5.attrs["version"] = PIXELS_VERSION if pixels else VERSION
            h5.attrs["description"] = storable(description)
            if targets:
                h5.attrs["targets"] = targets
            stored: dict[str, tuple[h5py.Dataset, h5py.Dataset]] = {}
            for name, size in sizes.items():
                group = h5.create_group(name)
                shape = (size, *sample_shape)
                # Fletcher-32 on every chunk: HDF5 checks it on every read, so a flipped bit
                # or a chunk overwritten later is an error, not wrong numbers
                images = group.create_dataset(
                    "images", shape, dtype, chunks=chunk_shape(shape, dtype.itemsize),
                    maxshape=shape if at_most else None, fletcher32=True)
                answers = (group.create_dataset("targets", (size, targets), np.float32,
                                                maxshape=(size, targets) if at_most else None,
                                                fletcher32=True)
                           if targets else
                           group.create_dataset("labels", (size, *label_shape), np.int64,
                                                chunks=_map_chunks(size, label_shape),
                                                maxshape=((size, *label_shape) if at_most
                                                          else None),
                                                fletcher32=True))
                stored[name] = images, answers
            filled = dict.fromkeys(sizes, 0)
            top = -1  # the largest label written
            # exact integer sums of the training pixels and of their squares, per channel
            pixel_sum, square_sum, pixel_count = [0] * channels, [0] * channels, 0
            for name, x, y in batches:
                # SIGTERM waits for the next batch while the file is written (see
                # replace_atomically): raised at once, it would often land in the weakref
                # callback h5py runs for each object it frees, which swallows it
                stop_if_terminated()
                start = filled[name]
                x = (_checked_pixels(name, x, start, sample_shape) if pixels
                     else _checked_images(name, x, start, sample_shape))
                y = (_checked_targets(name, y, start, targets) if targets
                     else _checked_labels(name, y, start, classes, label_shape))
                if len(y) != len(x):
                    raise DatasetError(f"{name} batch from sample {start} has {len(x)} images "
                                       f"but {len(y)} answers; give one per image")
                if start + len(x) > sizes[name]:
                    raise DatasetError(f"the {name} batches hold more than {sizes[name]} samples")
                images, answers = stored[name]
                images[start:start + len(x)] = x
                answers[start:start + len(x)] = y
                filled[name] += len(x)
                if not targets and len(y):
                    top = max(top, int(y.max()))
                if pixels and name == "train" and len(x):
                    values = np.arange(256, dtype=np.int64)
                    for c in range(channels):  # a histogram per channel: exact, no wide copy
                        counts = np.bincount(x[:, c].ravel(), minlength=256)
                        pixel_sum[c] += int(counts @ values)
                        square_sum[c] += int(counts @ (values * values))
                    pixel_count += x[:, 0].size
            for name, size in sizes.items():
                if at_most and filled[name] == 0:
                    raise DatasetError(f"the {name} split is empty; give at least one sample")
                if at_most and filled[name] < size:
                    for dataset in stored[name]:
                        dataset.resize(filled[name], axis=0)
                elif filled[name] != size:
                    raise DatasetError(f"the {name} batches hold {filled[name]} samples, not "
                                       f"{size}")
            if not targets:
                h5.attrs["classes"] = top + 1 if classes is None else classes
            if pixels:
                mean, std = pixel_stats(pixel_sum, square_sum, pixel_count)
                h5.attrs["mean"], h5.attrs["std"] = mean, std

    # locked while written, so that the next run to ``path`` tells a temporary left by a killed
    # run (remove_abandoned) from one still being written
    replace_atomically(path, write, ours=is_dataset, lock=True)


def _map_chunks(size: int, label_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Chunks of label maps (``size``, *label_shape): as a one-channel image's of 8-byte
    values (:func:`~hpctrain.data.dataset_format.chunk_shape`), so a rank reading its rows of
    a domain split reads the chunks of those rows; None (h5py's choice) for one label per
    sample, as before."""
    if not label_shape:
        return None
    samples, _, *planes = chunk_shape((size, 1, *label_shape), 8)
    return (samples, *planes)


def storable(text: str) -> str:
    """``text`` as an HDF5 string (UTF-8) can hold it: bytes that are not UTF-8, which Python
    keeps as surrogate escapes (a file or folder name from a disk in another encoding), are
    written as ``\\xNN``.

    >>> storable("caf\\udce9/x")
    'caf\\\\xe9/x'
    """
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that no file name gave
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def pixel_stats(pixel_sum: list[int], square_sum: list[int],
                count: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std (ddof 0), float64, from exact integer sums over ``count`` pixels.

    The variance ``(count * Σx² - (Σx)²) / count²`` is formed in exact integers, so no
    cancellation: e.g. sums [6], [14] over 3 pixels (1, 2, 3) give mean 2 and std sqrt(2/3).
    """
    mean = np.array([s / count for s in pixel_sum], np.float64)
    var = [(count * q - s * s) / (count * count) for s, q in zip(pixel_sum, square_sum)]
    return mean, np.sqrt(np.array(var, np.float64))


def _checked_split(name: str, images: Any, answers: Any,
                   regression: bool) -> tuple[Any, np.ndarray]:
    """One split's images and its int64 labels or float32 (N, T) targets, checked.

    Raises a DatasetError naming the problem. The images are checked by shape and dtype only,
    their values as they are written, batch by batch.
    """
    if not (hasattr(images, "shape") and hasattr(images, "dtype")):
        images = np.asarray(images)
    answers = np.asarray(answers)
    if len(images.shape) - 1 not in SAMPLE_RANKS:
        raise DatasetError(f"{name} images have shape {tuple(images.shape)}; give (N, C, H, W) "
                           f"images, (N, C, D, H, W) volumes or (N, F) feature vectors")
    what = "targets" if regression else "labels"
    if regression and answers.ndim == 1:
        answers = answers[:, None]  # one target per sample
    spatial = tuple(images.shape[2:])
    if not regression and answers.ndim > 1:  # label maps: one label per pixel
        if tuple(answers.shape[1:]) != spatial or len(answers) != images.shape[0]:
            raise DatasetError(f"{name} label maps have shape {shape_text(answers.shape)} but "
                               f"the {name} images {shape_text(images.shape)}; give one "
                               f"{shape_text(spatial) if spatial else 'H x W'} label map per "
                               f"image, of the images' spatial size")
    elif answers.ndim != (2 if regression else 1) or len(answers) != images.shape[0]:
        one = "one row of targets, (N, T)," if regression else "one label"
        raise DatasetError(f"{name} {what} have shape {answers.shape} but there are "
                           f"{images.shape[0]} {name} images; give {one} per image")
    if images.shape[0] == 0:
        raise DatasetError(f"the {name} split is empty; give at least one sample")
    if not _is_real(images.dtype):
        raise DatasetError(f"{name} images have dtype {images.dtype}; give real numbers")
    if regression:
        if not _is_real(answers.dtype) or answers.shape[1] == 0:
            raise DatasetError(f"{name} targets have dtype {answers.dtype} and shape "
                               f"{answers.shape}; give real numbers, at least one per sample")
        return images, _checked_targets(name, answers, 0, answers.shape[1])
    if not np.issubdtype(answers.dtype, np.integer):
        raise DatasetError(f"{name} labels have dtype {answers.dtype}; give integer class labels")
    return images, answers.astype(np.int64)


def _checked_classes(splits: Mapping[str, tuple[Any, np.ndarray]], classes: int | None) -> int:
    """The class count of the labels of ``splits``, ``classes`` or else max label + 1.

    Refuses negative labels, and labels not below the class count.
    """
    for name, (_, y) in splits.items():
        low = -1 if y.ndim > 1 else 0  # a label map's −1: a pixel not counted
        if y.min() < low:
            raise DatasetError(f"{name} label {int(y.min())} is negative; labels are class "
                               f"indices 0..K-1{' (or -1 in a label map)' if low else ''}")
    top = max(int(y.max()) for _, y in splits.values())
    classes = top + 1 if classes is None else int(classes)
    if classes < 1:
        raise DatasetError(f"classes {classes} must be at least 1")
    for name, (_, y) in splits.items():
        if y.max() >= classes:
            raise DatasetError(f"{name} label {int(y.max())} is outside [0, {classes}); labels "
                               f"must be 0..{classes - 1} (or raise classes)")
    return classes


def _is_real(dtype: Any) -> bool:
    return np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)


def _checked_images(name: str, images: Any, start: int,
                    sample_shape: tuple[int, ...]) -> np.ndarray:
    """A batch of images as float32, or a DatasetError naming the first bad sample."""
    images = np.asarray(images)
    if images.shape[1:] != sample_shape or not _is_real(images.dtype):
        raise DatasetError(f"{name} batch from sample {start} has shape "
                           f"{shape_text(images.shape)} and dtype {images.dtype}; give real "
                           f"samples of shape {shape_text(sample_shape)}")
    with np.errstate(over="ignore"):  # overflow becomes inf, refused just below
        x = np.ascontiguousarray(images, dtype=np.float32)
    finite = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    if not finite.all():  # after the cast: float64 beyond float32's range becomes inf
        bad = start + int(np.flatnonzero(~finite)[0])
        raise DatasetError(f"{name} images hold NaN or infinite values (or values beyond "
                           f"float32), first in sample {bad}; clean or rescale them")
    return x


def _checked_pixels(name: str, images: Any, start: int,
                    sample_shape: tuple[int, ...]) -> np.ndarray:
    """A batch of uint8 images as given, or a DatasetError naming its shape and dtype."""
    images = np.asarray(images)
    if images.shape[1:] != sample_shape or images.dtype != np.uint8:
        raise DatasetError(f"{name} batch from sample {start} has shape "
                           f"{shape_text(images.shape)} and dtype {images.dtype}; give uint8 "
                           f"samples of shape {shape_text(sample_shape)}")
    return np.ascontiguousarray(images)


def _checked_targets(name: str, targets: Any, start: int, width: int) -> np.ndarray:
    """A batch of (n, T) targets as float32, or a DatasetError naming the first bad sample."""
    targets = np.asarray(targets)
    if targets.ndim != 2 or targets.shape[1] != width or not _is_real(targets.dtype):
        raise DatasetError(f"{name} targets from sample {start} have shape {targets.shape} and "
                           f"dtype {targets.dtype}; give real numbers shaped (n, {width})")
    y, bad = as_finite_float32(targets)
    if bad is not None:
        bad += start
        raise DatasetError(f"{name} targets of sample {bad} hold NaN or infinite values (or "
                           f"values beyond float32); every target must be a finite number")
    return y


def _checked_labels(name: str, labels: Any, start: int, classes: int | None,
                    label_shape: tuple[int, ...] = ()) -> np.ndarray:
    """A batch of labels (or of label maps of ``label_shape``) as int64, or a DatasetError
    naming the bad label."""
    labels = np.asarray(labels)
    if (labels.ndim != 1 + len(label_shape) or tuple(labels.shape[1:]) != label_shape
            or not np.issubdtype(labels.dtype, np.integer)):
        want = (f"one {shape_text(label_shape)} label map" if label_shape
                else "one integer class label")
        raise DatasetError(f"{name} labels from sample {start} have shape {labels.shape} and "
                           f"dtype {labels.dtype}; give {want} per sample")
    low = -1 if label_shape else 0
    bad = (labels < low) | (labels >= (classes if classes is not None else np.inf))
    if bad.any():
        value = int(labels[bad][0])
        valid = f"0..{classes - 1}" if classes is not None else "0..K-1"
        raise DatasetError(f"{name} label {value} is outside {valid}; labels are class "
                           f"indices {valid}")
    return labels.astype(np.int64)
