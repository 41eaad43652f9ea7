"""Datasets on disk in HDF5, with their writer, their checker and a rank-local reader.

Format (version 2, or 3 for uint8 images), readable with plain h5py::

    /train/images   float32 (N, *sample): a sample is (C, H, W) images, (C, D, H, W) volumes,
                    or (F,) feature vectors for flat-input nets; chunked by sample or by slab;
                    or uint8 (N, C, H, W) / (N, C, D, H, W) pixels 0..255 (version 3)
    /train/labels   int64 (N,), each in [0, classes)          (a labels dataset), or
    /train/targets  float32 (N, T), every value finite        (a targets dataset)
    /val/...        optional held-out split: images, and labels or targets as in /train
                    (every chunk of these datasets carries a Fletcher-32 checksum; files
                    written before, without, are read alike)
    root attributes
        format        "hpctrain-dataset"
        version       2, or 3 when the images are uint8 (version 1 files, which hold labels
                      only, are read alike)
        classes       number of classes K (int), in a labels dataset
        targets       number of real-valued targets T (int), in a targets dataset
        description   where the data came from (str)
        mean, std     float64 (C,), only with uint8 images: the per-channel mean and standard
                      deviation of the training split's pixels, over every sample and
                      position, in stored pixel units [0, 255] (population std, ddof 0)

uint8 images (``python -m hpctrain convert --image-folder``) are a quarter of the float32
size; the reader gives the network ``(x - mean[c]) / std[c]`` in the backend's float dtype
(a channel whose std is 0 is only centred). Version 2 readers refuse version 3 files by their
version rather than misreading them; float32 files are still written as version 2.

A labels dataset trains a classifier (softmax cross-entropy, a net whose input line says
``classes=K``); a targets dataset trains a regression (mean squared error, ``targets=T``), such
as CosmoFlow's four cosmological parameters per 3-D volume.

Chunks (:func:`chunk_shape`): a sample under 16 KiB shares its chunk with the next few; a sample
up to 1 MiB is one chunk; a bigger one is cut into slabs of about 1 MiB: all its channels (or
one, when a plane of all channels is already bigger) and a few planes of its first spatial axis
(depth D of a volume, rows H of an image). HDF5 reads whole chunks, so a rank that reads the
depth slab d0..d1 of a 4 x 512^3 volume, chunked (1, 1, 1, 512, 512), reads only the chunks of
its own planes, never the whole 2 GiB sample.

``python -m hpctrain convert`` writes this format from ``.npy``/``.npz`` arrays, from
scikit-learn's handwritten digits, or as synthetic Gaussian random fields
(:mod:`hpctrain.commands.convert`, :mod:`hpctrain.data.universe`). :func:`write_batches` writes
one batch of samples at a time, so a set bigger than memory is written in O(one batch).

A net with flat input of F features reads a dataset of (C, H, W) samples with C·H·W = F
flattened, in row-major order: the shipped ``mlp`` (64 features) trains on the 1×8×8 digits.

Reading (:class:`H5Data`): epoch e of the training split is the permutation
``numpy.random.default_rng([seed, e]).permutation(N)``, the same on every rank and for every
number of processes; an epoch is ``N // batch`` batches (the remainder is dropped). Each rank
reads only its own hyperslab of a batch: its samples, and only the channels, depth planes, rows
and columns (or features) of its block. The held-out split is read in order, unshuffled, in
``ceil(N / batch)`` batches; the last is padded with zero images labelled -1 (targets: rows of
NaN).

Every block read is checked for NaN and Inf (one pass over the rank's own slab). The reader does
not raise: the bad value may sit on one rank's slab only, so it notes the first bad sample in
``H5Data.nonfinite`` and the network raises on every rank at the loss all-reduce of that
step (see :meth:`hpctrain.run.network.Network.loss`). Targets are checked whole, when the file
is inspected. A read that meets damage is noted there alike, naming the sample, and reads as
zeros until every rank stops: a chunk whose Fletcher-32 checksum does not match (every chunk
:func:`write_batches` writes has one; older files without are still read), or a chunk past the
end of a file cut short since it was opened, which HDF5 itself would read as zeros.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpctrain.device.backend import Backend
from hpctrain.errors import UserError
from hpctrain.io.files import replace_atomically
from hpctrain.io.seeds import check_seed
from hpctrain.io.units import shape_text
from hpctrain.layout.layout import Box

FORMAT, VERSION = "hpctrain-dataset", 2
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # the first bytes of an HDF5 file (no user block)
PIXELS_VERSION = 3  # files whose images are uint8 pixels, normalised by their mean and std
READABLE_VERSIONS = (1, 2, 3)
IMAGE_DTYPES = (np.dtype(np.float32), np.dtype(np.uint8))  # what write_batches stores
SPLITS = ("train", "val")
SAMPLE_RANKS = (1, 3, 4)  # axes of a sample: (F,), (C, H, W) or (C, D, H, W)
CHUNK_BYTES = 16 << 10  # samples smaller than this share a chunk
SLAB_BYTES = 1 << 20  # samples bigger than this are chunked in slabs of about this size
WRITE_BYTES = 64 << 20  # write_dataset hands this much of an array to the file at a time
CONVERT = "python -m hpctrain convert"


class DatasetError(UserError):
    """A dataset file that cannot be read or does not fit the net; the message names the fix."""


# --- writing -----------------------------------------------------------------------------------


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
    labels : (N,) integer class labels in [0, classes).
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
                  classes=classes, targets=width, description=description)


def write_batches(path: str | Path, sample_shape: tuple[int, ...], sizes: Mapping[str, int],
                  batches: Iterable[tuple[str, Any, Any]], *, classes: int | None = None,
                  targets: int = 0, description: str = "", dtype: Any = np.float32,
                  at_most: bool = False) -> None:
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
                           group.create_dataset("labels", (size,), np.int64,
                                                maxshape=(size,) if at_most else None,
                                                fletcher32=True))
                stored[name] = images, answers
            filled = dict.fromkeys(sizes, 0)
            top = -1  # the largest label written
            # exact integer sums of the training pixels and of their squares, per channel
            pixel_sum, square_sum, pixel_count = [0] * channels, [0] * channels, 0
            for name, x, y in batches:
                start = filled[name]
                x = (_checked_pixels(name, x, start, sample_shape) if pixels
                     else _checked_images(name, x, start, sample_shape))
                y = (_checked_targets(name, y, start, targets) if targets
                     else _checked_labels(name, y, start, classes))
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


def chunk_shape(shape: tuple[int, ...], itemsize: int = 4) -> tuple[int, ...]:
    """The HDF5 chunk shape of an images dataset of ``shape``, which is ``(N, *sample)``.

    HDF5 reads whole chunks, so the chunk decides what a rank's read of its block costs.

    A sample under CHUNK_BYTES (16 KiB) shares its chunk with the next few; one up to SLAB_BYTES
    (1 MiB) is one chunk; a bigger one is cut into slabs of about SLAB_BYTES: all its channels,
    or one when a plane of all channels is already bigger, and as many planes of the first
    spatial axis (depth D, or rows H of an image) as fit, at least one. Flat samples (F,) are
    cut into runs of features. ``itemsize`` is the bytes per value: 4 for float32, 1 for uint8.

    >>> chunk_shape((100, 1, 8, 8)), chunk_shape((10, 3, 224, 224))
    ((64, 1, 8, 8), (1, 3, 224, 224))
    >>> chunk_shape((10, 4, 128, 128, 128)), chunk_shape((10, 4, 512, 512, 512))
    ((1, 4, 4, 128, 128), (1, 1, 1, 512, 512))
    >>> chunk_shape((100, 3, 32, 32), itemsize=1)
    (5, 3, 32, 32)
    """
    sample = tuple(shape[1:])
    sample_bytes = itemsize * math.prod(sample)
    if sample_bytes <= CHUNK_BYTES:
        return (max(1, min(shape[0], CHUNK_BYTES // max(sample_bytes, 1))), *sample)
    if sample_bytes <= SLAB_BYTES:
        return (1, *sample)
    if len(sample) == 1:
        return (1, SLAB_BYTES // itemsize)
    channels, planes, *rest = sample
    plane_bytes = itemsize * math.prod(rest)  # one plane of one channel
    if channels * plane_bytes > SLAB_BYTES:
        channels = 1
    return (1, channels, max(1, min(planes, SLAB_BYTES // (channels * plane_bytes))), *rest)


def is_dataset(path: str | Path) -> bool:
    """Whether ``path`` is a dataset hpctrain wrote (its ``format`` attribute says so)."""
    try:
        with h5py.File(path, "r", locking=False) as h5:
            return h5.attrs.get("format") == FORMAT
    except (OSError, ValueError):
        return False


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
    if answers.ndim != (2 if regression else 1) or len(answers) != images.shape[0]:
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
        if y.min() < 0:
            raise DatasetError(f"{name} label {int(y.min())} is negative; labels are class "
                               f"indices 0..K-1")
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
    with np.errstate(over="ignore"):
        y = targets.astype(np.float32)
    finite = np.isfinite(y).all(axis=1)
    if not finite.all():
        bad = start + int(np.flatnonzero(~finite)[0])
        raise DatasetError(f"{name} targets of sample {bad} hold NaN or infinite values (or "
                           f"values beyond float32); every target must be a finite number")
    return y


def _checked_labels(name: str, labels: Any, start: int, classes: int | None) -> np.ndarray:
    """A batch of labels as int64, or a DatasetError naming the bad label."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"{name} labels from sample {start} have shape {labels.shape} and "
                           f"dtype {labels.dtype}; give one integer class label per sample")
    bad = (labels < 0) | (labels >= (classes if classes is not None else np.inf))
    if bad.any():
        value = int(labels[bad][0])
        valid = f"0..{classes - 1}" if classes is not None else "0..K-1"
        raise DatasetError(f"{name} label {value} is outside {valid}; labels are class "
                           f"indices {valid}")
    return labels.astype(np.int64)


# --- checking ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset file holds, its sample shape, its labels or targets and its split sizes.

    ``classes`` is the width of the net output the dataset trains, as in
    :class:`~hpctrain.model.net.NetSpec`: K classes of a labels dataset, or T of a targets
    dataset. ``targets`` is T for a targets dataset and 0 for a labels dataset. ``dtype`` is how
    the images are stored, "float32" or "uint8"; uint8 pixels come with the per-channel
    ``mean`` and ``std`` (in pixel units) the reader normalises them with, None otherwise.
    """

    path: Path
    sample_shape: tuple[int, ...]
    classes: int
    train_size: int
    val_size: int  # 0 when the file has no held-out split
    targets: int = 0
    dtype: str = "float32"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def normalisation(self) -> str:
        """How the reader turns stored images into the network's input, in words.

        'as stored (float32)', or for pixels e.g. 'uint8 pixels, (x - mean) / std per channel,
        mean 124.1, 116.3, 103.5, std 58.4, 57.1, 57.4'.
        """
        if self.mean is None or self.std is None:
            return f"as stored ({self.dtype})"
        return (f"{self.dtype} pixels, (x - mean) / std per channel, mean "
                f"{', '.join(f'{m:.1f}' for m in self.mean)}, std "
                f"{', '.join(f'{s:.1f}' for s in self.std)}")

    @property
    def answers(self) -> str:
        """The name of the dataset of what each sample is trained towards, labels or targets."""
        return "targets" if self.targets else "labels"


def inspect_dataset(path: str | Path) -> DatasetInfo:
    """Open ``path``, check it is a valid dataset file, and describe it.

    Reads the attributes, the shapes and the labels or targets (to check their range, or that
    they are finite), never the images.

    Raises
    ------
    DatasetError
        A missing or unreadable file, a file not in this format, or inconsistent contents; the
        message names the file and what to do.
    """
    with _open(path) as h5:
        return _describe(h5, Path(path))


def _open(path: str | Path) -> h5py.File:
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"dataset '{path}' does not exist; create one with {CONVERT}")
    if path.is_dir():
        raise DatasetError(f"dataset '{path}' is a directory; give the path of an .h5 file")
    try:
        # no file locking: files are only ever replaced by an atomic rename, never written in
        # place, and locking fails on some parallel file systems
        return h5py.File(path, "r", locking=False)
    except OSError as err:
        raise DatasetError(f"dataset '{path}' is not a readable HDF5 file ({_reason(err)}); "
                           f"rewrite it with {CONVERT}") from err


def _reason(err: OSError) -> str:
    """HDF5's reason from an h5py error, the last parenthesised part of its message.

    For example 'truncated file: eof = 4768, …' or 'file signature not found'.
    """
    match = re.search(r"\(([^()]*)\)\s*$", str(err))
    return match.group(1) if match else str(err)


def _describe(h5: h5py.File, path: Path) -> DatasetInfo:
    """Check an open dataset file and describe it (OSError from a corrupt file included)."""
    try:
        return _check_contents(h5, path)
    except OSError as err:  # structure that opened but whose data cannot be read
        raise DatasetError(f"dataset '{path}' is not a readable HDF5 file ({_reason(err)}); "
                           f"rewrite it with {CONVERT}") from err


def _count_attribute(h5: h5py.File, path: Path, name: str) -> int:
    value = h5.attrs.get(name)
    if not isinstance(value, int | np.integer) or value < 1:
        shown = int(value) if isinstance(value, int | np.integer) else repr(value)
        raise DatasetError(f"dataset '{path}' has {name} attribute {shown}; it must be a "
                           f"positive integer")
    return int(value)


def _check_contents(h5: h5py.File, path: Path) -> DatasetInfo:
    fmt = h5.attrs.get("format")
    if isinstance(fmt, bytes):
        fmt = fmt.decode()
    if fmt != FORMAT:
        raise DatasetError(f"'{path}' is not an hpctrain dataset (no format attribute "
                           f"'{FORMAT}'); convert your data with {CONVERT}")
    version = h5.attrs.get("version")
    if version not in READABLE_VERSIONS:
        raise DatasetError(f"dataset '{path}' has format version {version}; this hpctrain reads "
                           f"versions {', '.join(map(str, READABLE_VERSIONS[:-1]))} and "
                           f"{READABLE_VERSIONS[-1]}; rewrite it "
                           f"with {CONVERT}")
    if "targets" in h5.attrs:
        width = targets = _count_attribute(h5, path, "targets")
        answers, other = "targets", "labels"
    else:
        width, targets = _count_attribute(h5, path, "classes"), 0
        answers, other = "labels", "targets"
    sizes, shapes, dtypes = {}, {}, set()
    for split in SPLITS:
        if split not in h5 and split == "val":
            sizes[split] = 0
            continue
        missing = [f"/{split}/{k}" for k in ("images", answers)
                   if not isinstance(h5.get(f"{split}/{k}"), h5py.Dataset)]
        if missing:
            raise DatasetError(f"dataset '{path}' lacks {' and '.join(missing)}; rewrite it "
                               f"with {CONVERT}")
        if f"{split}/{other}" in h5:
            attribute = "a targets" if targets else "no targets"
            raise DatasetError(f"dataset '{path}' holds /{split}/{other} but has {attribute} "
                               f"attribute; a dataset holds labels or targets, rewrite it with "
                               f"{CONVERT}")
        images = h5[f"{split}/images"]
        if images.ndim - 1 not in SAMPLE_RANKS:
            raise DatasetError(f"dataset '{path}': /{split}/images has shape "
                               f"{shape_text(images.shape)}; it must be N x C x H x W, "
                               f"N x C x D x H x W or N x F")
        if not (np.issubdtype(images.dtype, np.floating)
                or (images.dtype == np.uint8 and version == PIXELS_VERSION)):
            raise DatasetError(f"dataset '{path}': /{split}/images has dtype {images.dtype}; "
                               f"it must be floating point (float32), or uint8 in a version "
                               f"{PIXELS_VERSION} file; rewrite it with {CONVERT}")
        dtypes.add(str(images.dtype))
        check = _check_targets if targets else _check_labels
        length = check(h5[f"{split}/{answers}"], path, split, width)
        if length != len(images):
            raise DatasetError(f"dataset '{path}': /{split}/{answers} has {length} entries "
                               f"but /{split}/images {len(images)}; they must match")
        sizes[split], shapes[split] = len(images), tuple(images.shape[1:])
    if "val" in shapes and shapes["val"] != shapes["train"]:
        raise DatasetError(f"dataset '{path}': val samples are {shape_text(shapes['val'])} but "
                           f"train samples {shape_text(shapes['train'])}; they must match")
    if len(dtypes) > 1:
        raise DatasetError(f"dataset '{path}': the splits' images have dtypes "
                           f"{' and '.join(sorted(dtypes))}; they must match")
    dtype = dtypes.pop()
    if dtype != "uint8":
        return DatasetInfo(path, shapes["train"], width, sizes["train"], sizes["val"], targets,
                           dtype)
    mean, std = (_stats_attribute(h5, path, name, shapes["train"]) for name in ("mean", "std"))
    if min(std) < 0:
        raise DatasetError(f"dataset '{path}' has a negative std attribute; rewrite it with "
                           f"{CONVERT}")
    return DatasetInfo(path, shapes["train"], width, sizes["train"], sizes["val"], targets,
                       dtype, mean, std)


def _stats_attribute(h5: h5py.File, path: Path, name: str,
                     sample_shape: tuple[int, ...]) -> tuple[float, ...]:
    """The per-channel ``mean`` or ``std`` attribute of a uint8 dataset, checked finite."""
    channels = sample_shape[0]
    value = np.asarray(h5.attrs.get(name, np.empty(0)))
    if (value.shape != (channels,) or not np.issubdtype(value.dtype, np.floating)
            or not np.isfinite(value).all()):
        raise DatasetError(f"dataset '{path}' holds uint8 images but its {name} attribute is "
                           f"{value.tolist() if value.size < 10 else value.shape}; it must be "
                           f"{channels} finite numbers, one per channel; rewrite it with "
                           f"{CONVERT}")
    return tuple(float(v) for v in value)


def _check_labels(labels: h5py.Dataset, path: Path, split: str, classes: int) -> int:
    """Refuse labels that are not one integer in [0, classes) per sample; their count."""
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"dataset '{path}': /{split}/labels has shape "
                           f"{shape_text(labels.shape)} and dtype {labels.dtype}; it must "
                           f"be one integer per sample")
    y = labels[()]
    if y.size and (y.min() < 0 or y.max() >= classes):
        bad = int(y[(y < 0) | (y >= classes)][0])
        raise DatasetError(f"dataset '{path}': /{split}/labels holds {bad}, outside "
                           f"[0, {classes}) for classes = {classes}")
    return len(y)


def _check_targets(targets: h5py.Dataset, path: Path, split: str, width: int) -> int:
    """Refuse targets that are not T finite reals per sample; their count."""
    if (targets.ndim != 2 or targets.shape[1] != width
            or not np.issubdtype(targets.dtype, np.floating)):
        raise DatasetError(f"dataset '{path}': /{split}/targets has shape "
                           f"{shape_text(targets.shape)} and dtype {targets.dtype}; it must be "
                           f"N x {width} floating point (targets = {width})")
    y = targets[()]
    finite = np.isfinite(y).all(axis=1)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        value = "NaN" if np.isnan(y[bad]).any() else "Inf"
        raise DatasetError(f"dataset '{path}': /{split}/targets sample {bad} holds {value}; "
                           f"replace the value or drop the sample, then rewrite the file with "
                           f"{CONVERT}")
    return len(y)


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


# --- reading -----------------------------------------------------------------------------------


def flat_cover(shape: tuple[int, ...], lo: int, hi: int) -> tuple[tuple[slice, ...], int]:
    """The smallest hyperslab of a sample of ``shape`` that holds its flat entries lo..hi-1.

    Returns the hyperslab and the flat (row-major) index of its first entry. The hyperslab
    fixes the leading indices the range shares, spans one axis, and takes the axes after it
    whole. Worked example, shape (2, 8, 8), entries 70..89: both lie in channel 1 (entries
    64..127), in its rows 0..3, so the hyperslab is [1:2, 0:4, 0:8], entries 64..95, and the
    range is its flat entries 6..25:

    >>> flat_cover((2, 8, 8), 70, 90)
    ((slice(1, 2, None), slice(0, 4, None), slice(0, 8, None)), 64)
    """
    slices: list[slice] = []
    first_entry = 0
    for axis in range(len(shape)):
        stride = math.prod(shape[axis + 1:])
        first, last = (lo - first_entry) // stride, (hi - 1 - first_entry) // stride
        slices.append(slice(first, last + 1))
        first_entry += first * stride
        if first != last:
            slices.extend(slice(0, m) for m in shape[axis + 1:])
            break
    return tuple(slices), first_entry


class H5Data:
    """Batches of a dataset file, each rank reading only its own block.

    Same interface as :class:`~hpctrain.data.synthetic.SyntheticData`: ``images(step, box)`` is
    block ``box`` of batch ``step`` (batch axis relative to the batch, then C, H, W; C, D, H, W;
    or F) and ``labels(step, (lo, hi))`` the labels, or targets, of samples lo..hi-1 of that
    batch (see :class:`~hpctrain.data.source.DataSource`).

    ``split="train"``: batch ``step`` is batch ``step % steps_per_epoch`` of epoch
    ``step // steps_per_epoch``, whose order is ``default_rng([seed, epoch]).permutation(N)``.
    ``split="val"``: batch k holds samples k·B .. (k+1)·B - 1 in file order; positions past N
    are padding, with zero images and label -1 (targets: a row of NaN). Worked example, N = 10,
    B = 4::

        train: steps_per_epoch = 2; steps 0, 1 are epoch 0; step 2 starts epoch 1
        val:   batches = 3; batch 2 holds samples 8, 9 and two padding positions

    A box is read as one HDF5 hyperslab per batch, so HDF5 reads only the chunks the box meets
    (:func:`chunk_shape`): a rank holding depth planes d0..d1 of volumes chunked ``dc`` planes
    deep reads chunk planes d0 // dc .. (d1 - 1) // dc of its own samples, never a whole
    sample.

    ``flatten`` (see :func:`feeds_flat`): the file's samples are given as flat vectors,
    ``sample_shape`` says so, and ``box`` ranges over the flat features; each rank still reads
    only the smallest hyperslab holding its features (:func:`flat_cover`).

    The file stays open read-only until :meth:`close` (or the end of a ``with`` block).
    ``info``, the file's :func:`inspect_dataset` already made (by rank 0), spares every reader
    on every rank checking it again, which reads every label.

    ``nonfinite`` is None until a block read holds NaN or Inf, or meets a damaged part of the
    file (``_checked_read``); then it names the file, the split and the first such sample
    by its index in the split, e.g. ``dataset 'd.h5': /train/images sample 1234 holds NaN; …``.
    """

    def __init__(self, backend: Backend, path: str | Path, batch: int, seed: int = 0,
                 split: str = "train", info: DatasetInfo | None = None,
                 flatten: bool = False) -> None:
        if split not in SPLITS:
            raise DatasetError(f"unknown split {split!r}; choose train or val")
        if batch < 1:
            raise DatasetError(f"--batch {batch} must be at least 1")
        self.backend, self.path, self.batch, self.seed, self.split = (
            backend, Path(path), batch, check_seed(seed), split)
        self._file = _open(self.path)
        try:
            # the file's size now, to see it cut short while it is read (:meth:`_cut_short`);
            # None where the driver has no single file descriptor
            self._handle: int | None = _descriptor(self._file)
            self._opened_bytes = os.fstat(self._handle).st_size if self._handle is not None else 0
            info = info or _describe(self._file, self.path)
            self.sample_shape, self.classes, self.targets = (
                info.sample_shape, info.classes, info.targets)
            self._stored_shape = info.sample_shape  # (C, H, W) or (C, D, H, W) in the file
            self._pixels = info.mean is not None and info.std is not None  # uint8, normalised
            if self._pixels:  # per channel, in the network's dtype; std 0: centre only
                std = np.asarray(info.std)
                self._mean = np.asarray(info.mean).astype(backend.dtype)
                self._std = np.where(std > 0, std, 1.0).astype(backend.dtype)
            if flatten:
                self.sample_shape = (math.prod(info.sample_shape),)
            self.size = info.train_size if split == "train" else info.val_size
            if split == "val" and self.size == 0:
                raise DatasetError(f"dataset '{self.path}' has no held-out split (/val); "
                                   f"convert it with --val-fraction or --val-images")
            if split == "train" and self.size < batch:
                raise DatasetError(f"dataset '{self.path}' has {self.size} training samples, "
                                   f"fewer than --batch {batch}; lower --batch")
        except BaseException:
            self._file.close()
            raise
        self._images = self._file[f"{split}/images"]  # (N, *sample_shape)
        self._answers = self._file[f"{split}/{info.answers}"]  # labels (N,) or targets (N, T)
        self.steps_per_epoch = self.size // batch  # train: whole batches per epoch
        self.batches = math.ceil(self.size / batch)  # val: batches incl. the padded last one
        self._epoch: tuple[int, np.ndarray] | None = None  # (epoch, its permutation)
        self.nonfinite: str | None = None  # the first NaN or Inf read (see the class doc)

    def indices(self, step: int, samples: tuple[int, int]) -> np.ndarray:
        """Dataset indices of positions lo..hi-1 of batch ``step``; -1 marks val padding."""
        lo, hi = samples
        if self.split == "val":
            k = np.arange(step * self.batch + lo, step * self.batch + hi, dtype=np.int64)
            return np.where(k < self.size, k, -1)
        epoch, within = divmod(step, self.steps_per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.size)
            self._epoch = (epoch, order)
        first = within * self.batch
        return self._epoch[1][first + lo:first + hi]

    def images(self, step: int, box: Box) -> Any:
        """Block ``box`` of the ``(B, *sample_shape)`` input of batch ``step``, on the device."""
        index = self.indices(step, box[0])
        inner = tuple(slice(a, b) for a, b in box[1:])  # channels, (depth,) rows, cols or features
        cut = None
        if self.sample_shape != self._stored_shape:  # flattened: read a cover, then cut
            (lo, hi), = box[1:]
            inner, first = flat_cover(self._stored_shape, lo, hi)
            cut = slice(lo - first, hi - first)
        dtype = self.backend.dtype if self._pixels else self._images.dtype
        block = np.zeros((len(index), *(s.stop - s.start for s in inner)), dtype)
        real = np.flatnonzero(index >= 0)  # val padding stays zero
        rows = self._checked_read(self._images, index[real], inner) if real.size else None
        if rows is not None:
            block[real] = self._normalised(rows, inner[0]) if self._pixels else rows
        if cut is not None:
            block = block.reshape(len(index), -1)[:, cut]
        if (rows is not None and not self._pixels and self.nonfinite is None
                and not np.isfinite(block).all()):  # one pass over the slab
            self.nonfinite = self._describe_nonfinite(block, index)
        return self.backend.xp.asarray(block.astype(self.backend.dtype, copy=False))

    def _normalised(self, pixels: np.ndarray, channels: slice) -> np.ndarray:
        """uint8 ``pixels`` (n, c, ...) of channels ``channels`` as ``(x - mean[c]) / std[c]``.

        Element by element, so a rank's block equals the same block of the whole normalised
        array, bit for bit.
        """
        shape = (1, -1) + (1,) * (pixels.ndim - 2)  # broadcast along the channel axis
        x = pixels.astype(self.backend.dtype)
        x -= self._mean[channels].reshape(shape)
        x /= self._std[channels].reshape(shape)
        return x

    def _describe_nonfinite(self, block: np.ndarray, index: np.ndarray) -> str:
        """The line naming the first sample of ``block`` (rows: samples ``index``) that holds
        NaN or Inf."""
        rows = ~np.isfinite(block.reshape(len(block), -1))
        row = int(np.flatnonzero(rows.any(axis=1))[0])
        value = "NaN" if np.isnan(block[row]).any() else "Inf"
        return (f"dataset '{self.path}': /{self.split}/images sample {int(index[row])} holds "
                f"{value}; replace the value or drop the sample, then rewrite the file with "
                f"{CONVERT}")

    def labels(self, step: int, samples: tuple[int, int]) -> Any:
        """The answers of positions lo..hi-1 of batch ``step``, on the device.

        A labels dataset gives int64 labels (n,), -1 for val padding; a targets dataset gives
        (n, T) targets in the backend's dtype, a row of NaN for val padding.
        """
        index = self.indices(step, samples)
        if self.targets:
            answers = np.full((len(index), self.targets), np.nan, self.backend.dtype)
        else:
            answers = np.full(len(index), -1, np.int64)
        real = np.flatnonzero(index >= 0)
        rows = self._checked_read(self._answers, index[real], ()) if real.size else None
        if rows is not None:
            answers[real] = rows
        elif real.size:  # damaged, and noted: valid stand-ins until every rank stops
            answers[real] = 0
        return self.backend.xp.asarray(answers)

    def _checked_read(self, dataset: h5py.Dataset, index: np.ndarray,
                      inner: tuple[slice, ...]) -> np.ndarray | None:
        """``dataset[index, *inner]`` (:meth:`_read`), or None when the file is damaged there.

        Two checks, as neither alone sees every damage: HDF5 reads the part of a chunk past
        the end of a file cut short as zeros, with no error (and zeros pass a Fletcher-32
        checksum), so the file's size is compared with what the chunks read need whenever it
        has shrunk since it was opened; a chunk whose bytes changed fails its checksum (files
        written since checksums were added) and HDF5 raises. Damage does not raise here: it
        may strike one rank only, so it is noted in ``nonfinite`` (the first sample it struck,
        in one line) and rides on the step's loss all-reduce, which stops every rank.
        """
        why = self._cut_short(dataset, index, inner)
        if why is None:
            try:
                return self._read(dataset, index, inner)
            except OSError as err:
                sample = self._first_unreadable(dataset, index, inner)
                why = (sample, f"HDF5: {_reason(err)}"
                               f"{'; a checksum does not match' if _is_checksum(err) else ''}")
        if self.nonfinite is None:
            sample, reason = why
            self.nonfinite = (f"dataset '{self.path}': {dataset.name} sample {sample} cannot be "
                              f"read ({reason}); the file is damaged: rewrite it with "
                              f"{CONVERT}, or copy it again")
        return None

    def _cut_short(self, dataset: h5py.Dataset, index: np.ndarray,
                   inner: tuple[slice, ...]) -> tuple[int, str] | None:
        """(the first sample of ``index`` whose bytes lie past the end of the file, why), or
        None: when the file has not shrunk since it was opened (one ``fstat``), or when every
        chunk this read needs is still within it."""
        if self._handle is None:
            return None
        size = os.fstat(self._handle).st_size
        if size >= self._opened_bytes:
            return None
        for sample in np.sort(index):
            try:
                past = _stored_end(dataset, int(sample), inner) > size
            except (OSError, RuntimeError):  # its chunk index itself is past the end
                past = True
            if past:
                return int(sample), (f"the file is {size:,} bytes, cut short of the "
                                     f"{self._opened_bytes:,} it had when opened")
        return None

    @classmethod
    def _first_unreadable(cls, dataset: h5py.Dataset, index: np.ndarray,
                          inner: tuple[slice, ...]) -> int:
        """The first sample of ``index`` (by index) whose part ``inner`` HDF5 cannot read; the
        first of all when each reads alone (the damage was passing)."""
        for sample in np.sort(index):
            try:
                cls._read(dataset, np.array([sample]), inner)
            except OSError:
                return int(sample)
        return int(np.min(index))

    @staticmethod
    def _read(dataset: h5py.Dataset, index: np.ndarray, inner: tuple[slice, ...]) -> np.ndarray:
        """``dataset[index, *inner]`` reading only that hyperslab, rows in ``index`` order.

        h5py fancy indexing wants increasing indices: read in sorted order, then put the rows
        back where the batch wants them. Consecutive indices (val) read as one slice. HDF5's
        errors (``OSError``) pass through.
        """
        if index[-1] - index[0] == len(index) - 1 and (np.diff(index) == 1).all():
            return dataset[(slice(int(index[0]), int(index[-1]) + 1), *inner)]
        order = np.argsort(index)
        rows = dataset[(index[order], *inner)]  # row k is sample index[order[k]]
        out = np.empty_like(rows)
        out[order] = rows
        return out

    def close(self) -> None:
        self._file.close()
        self._handle = None


    def __enter__(self) -> H5Data:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _descriptor(h5: h5py.File) -> int | None:
    """The operating system's descriptor of an open file (HDF5's default sec2 driver), or
    None for a driver that has no single one."""
    if h5.driver != "sec2":
        return None
    return int(h5.id.get_vfd_handle())


def _stored_end(dataset: h5py.Dataset, sample: int, inner: tuple[slice, ...]) -> int:
    """The byte just past the last byte of the file that part ``inner`` of ``sample`` of
    ``dataset`` is stored in: the end of its last chunk (chunked), or of the sample (contiguous);
    0 when nothing is stored (compact, or chunks never written, which read as the fill value).

    Worked example: (N, 2, 8) float32 chunked (1, 1, 8), sample 3, channels 0..1: chunks
    (3, 0, 0) and (3, 1, 0), 32 bytes each; the end is the later one's offset + 32.
    """
    layout = dataset.id.get_create_plist().get_layout()
    if layout == h5py.h5d.CONTIGUOUS:
        offset = dataset.id.get_offset()
        row = dataset.dtype.itemsize * math.prod(dataset.shape[1:])
        return 0 if offset is None else offset + (sample + 1) * row
    if layout != h5py.h5d.CHUNKED:
        return 0
    chunk = dataset.chunks
    axes = [range(sample // chunk[0] * chunk[0], sample + 1, chunk[0])]
    for cut, size, n in zip(inner, chunk[1:], dataset.shape[1:], strict=False):
        first, stop = cut.start or 0, n if cut.stop is None else cut.stop
        axes.append(range(first // size * size, stop, size))
    axes += [range(0, n, size) for size, n in
             zip(chunk[1 + len(inner):], dataset.shape[1 + len(inner):], strict=True)]
    end = 0
    for coord in itertools.product(*axes):
        info = dataset.id.get_chunk_info_by_coord(coord)
        if info.byte_offset is not None:
            end = max(end, info.byte_offset + info.size)
    return end


def _is_checksum(err: OSError) -> bool:
    """Whether HDF5's error is a filter's failure, which for our files is Fletcher-32's."""
    return "filter returned failure" in str(err)
