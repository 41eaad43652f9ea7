"""The HDF5 dataset format: what a file holds, how its images are chunked, and the checks
that a file is one (every refusal names the file and the fix).

Format (version 2, or 3 for uint8 images), readable with plain h5py::

    /train/images   float32 (N, *sample): a sample is (C, H, W) images, (C, D, H, W) volumes,
                    or (F,) feature vectors for flat-input nets; chunked by sample or by slab;
                    or uint8 (N, C, H, W) / (N, C, D, H, W) pixels 0..255 (version 3)
    /train/labels   int64 (N,), each in [0, classes)          (a labels dataset), or
                    int64 (N, H, W) or (N, D, H, W) label maps, one class per pixel of the
                    images' spatial size, each in [0, classes) or −1 (not counted), or
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
``classes=K``); a dataset of label maps a segmentation net (a class score per pixel, the
per-pixel softmax cross-entropy; see :mod:`hpctrain.model.net`); a targets dataset trains a
regression (mean squared error, ``targets=T``), such as CosmoFlow's four cosmological
parameters per 3-D volume. Label maps are chunked as the images' planes are, so a rank reading
its rows of a domain split reads only the chunks of those rows.

Chunks (:func:`chunk_shape`): a sample under 16 KiB shares its chunk with the next few; a sample
up to 1 MiB is one chunk; a bigger one is cut into slabs of about 1 MiB: all its channels (or
one, when a plane of all channels is already bigger) and a few planes of its first spatial axis
(depth D of a volume, rows H of an image). HDF5 reads whole chunks, so a rank that reads the
depth slab d0..d1 of a 4 x 512^3 volume, chunked (1, 1, 1, 512, 512), reads only the chunks of
its own planes, never the whole 2 GiB sample.

:func:`inspect_dataset` checks a file against this format and describes it
(:class:`DatasetInfo`); :mod:`hpctrain.data.dataset_writer` writes it and
:mod:`hpctrain.data.dataset_reader` reads it, each rank its own block.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from hpctrain.errors import UserError
from hpctrain.io.files import is_hdf5_of
from hpctrain.io.units import shape_text

FORMAT, VERSION = "hpctrain-dataset", 2
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # the first bytes of an HDF5 file (no user block)
PIXELS_VERSION = 3  # files whose images are uint8 pixels, normalised by their mean and std
READABLE_VERSIONS = (1, 2, 3)
IMAGE_DTYPES = (np.dtype(np.float32), np.dtype(np.uint8))  # what write_batches stores
SPLITS = ("train", "val")
SAMPLE_RANKS = (1, 3, 4)  # axes of a sample: (F,), (C, H, W) or (C, D, H, W)
CHUNK_BYTES = 16 << 10  # samples smaller than this share a chunk
SLAB_BYTES = 1 << 20  # samples bigger than this are chunked in slabs of about this size
CONVERT = "python -m hpctrain convert"


class DatasetError(UserError):
    """A dataset file that cannot be read or does not fit the net; the message names the fix."""


def as_finite_float32(targets: np.ndarray) -> tuple[np.ndarray, int | None]:
    """(``targets`` as float32, the first row holding NaN or an infinity after the cast, else
    None): a value beyond float32's range becomes infinite, so it is caught too.

    >>> as_finite_float32(np.array([[1.0], [1e39]]))[1]
    1
    """
    with np.errstate(over="ignore"):
        values = targets.astype(np.float32)
    finite = np.isfinite(values).all(axis=1)
    return values, None if finite.all() else int(np.flatnonzero(~finite)[0])


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
    return is_hdf5_of(path, FORMAT)


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset file holds, its sample shape, its labels or targets and its split sizes.

    ``classes`` is the width of the net output the dataset trains, as in
    :class:`~hpctrain.model.net.NetSpec`: K classes of a labels dataset, or T of a targets
    dataset. ``targets`` is T for a targets dataset and 0 for a labels dataset. ``dtype`` is how
    the images are stored, "float32" or "uint8"; uint8 pixels come with the per-channel
    ``mean`` and ``std`` (in pixel units) the reader normalises them with, None otherwise.
    ``label_maps``: the labels are maps, one class per pixel ``(N, *spatial)``, not one per sample.
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
    label_maps: bool = False

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
    with open_dataset(path) as h5:
        return describe_dataset(h5, Path(path))


def open_dataset(path: str | Path) -> h5py.File:
    """Open dataset file ``path`` read-only, or raise a DatasetError naming the fix."""
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
        raise DatasetError(f"dataset '{path}' is not a readable HDF5 file ({hdf5_reason(err)}); "
                           f"rewrite it with {CONVERT}") from err


def hdf5_reason(err: OSError) -> str:
    """HDF5's reason from an h5py error, the last parenthesised part of its message.

    For example 'truncated file: eof = 4768, …' or 'file signature not found'.
    """
    match = re.search(r"\(([^()]*)\)\s*$", str(err))
    return match.group(1) if match else str(err)


def describe_dataset(h5: h5py.File, path: Path) -> DatasetInfo:
    """Check an open dataset file and describe it (OSError from a corrupt file included)."""
    try:
        return _check_contents(h5, path)
    except OSError as err:  # structure that opened but whose data cannot be read
        raise DatasetError(f"dataset '{path}' is not a readable HDF5 file ({hdf5_reason(err)}); "
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
    sizes, shapes, dtypes, maps = {}, {}, set(), set()
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
        if targets:
            length = _check_targets(h5[f"{split}/{answers}"], path, split, width)
        else:
            length = _check_labels(h5[f"{split}/{answers}"], path, split, width,
                                   tuple(images.shape[2:]))
            maps.add(h5[f"{split}/{answers}"].ndim > 1)
        if length != len(images):
            raise DatasetError(f"dataset '{path}': /{split}/{answers} has {length} entries "
                               f"but /{split}/images {len(images)}; they must match")
        sizes[split], shapes[split] = len(images), tuple(images.shape[1:])
    if "val" in shapes and shapes["val"] != shapes["train"]:
        raise DatasetError(f"dataset '{path}': val samples are {shape_text(shapes['val'])} but "
                           f"train samples {shape_text(shapes['train'])}; they must match")
    if len(maps) > 1:
        raise DatasetError(f"dataset '{path}': one split holds label maps and the other one "
                           f"label per sample; they must match, rewrite it with {CONVERT}")
    label_maps = maps.pop() if maps else False
    if len(dtypes) > 1:
        raise DatasetError(f"dataset '{path}': the splits' images have dtypes "
                           f"{' and '.join(sorted(dtypes))}; they must match")
    dtype = dtypes.pop()
    if dtype != "uint8":
        return DatasetInfo(path, shapes["train"], width, sizes["train"], sizes["val"], targets,
                           dtype, label_maps=label_maps)
    mean, std = (_stats_attribute(h5, path, name, shapes["train"]) for name in ("mean", "std"))
    if min(std) < 0:
        raise DatasetError(f"dataset '{path}' has a negative std attribute; rewrite it with "
                           f"{CONVERT}")
    return DatasetInfo(path, shapes["train"], width, sizes["train"], sizes["val"], targets,
                       dtype, mean, std, label_maps)


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


MAP_CHECK_SAMPLES = 256  # label maps are checked this many samples at a time


def _check_labels(labels: h5py.Dataset, path: Path, split: str, classes: int,
                  spatial: tuple[int, ...] = ()) -> int:
    """Refuse labels that are not one integer in [0, classes) per sample, or label maps of
    the images' ``spatial`` size whose values are not in [0, classes) or −1; their count."""
    maps = labels.ndim > 1
    if (not np.issubdtype(labels.dtype, np.integer)
            or (maps and tuple(labels.shape[1:]) != spatial)):
        spatial_text = f" or N x {shape_text(spatial)} label maps" if spatial else ""
        raise DatasetError(f"dataset '{path}': /{split}/labels has shape "
                           f"{shape_text(labels.shape)} and dtype {labels.dtype}; it must "
                           f"be one integer per sample{spatial_text}")
    low = -1 if maps else 0
    for start in range(0, len(labels), MAP_CHECK_SAMPLES if maps else max(len(labels), 1)):
        y = labels[start:start + (MAP_CHECK_SAMPLES if maps else len(labels))]
        if y.size and (y.min() < low or y.max() >= classes):
            bad = int(y[(y < low) | (y >= classes)][0])
            raise DatasetError(f"dataset '{path}': /{split}/labels holds {bad}, outside "
                               f"[{low}, {classes}) for classes = {classes}")
    return len(labels)


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
