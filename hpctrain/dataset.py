"""Datasets on disk: the HDF5 format, its writer and checker, and a rank-local reader.

Format (version 1), readable with plain h5py::

    /train/images   float32 (N, C, H, W), or (N, F) for flat-input nets; chunked by sample
    /train/labels   int64 (N,), each in [0, classes)
    /val/images     optional held-out split, same sample shape as /train/images
    /val/labels     optional, int64 (N_val,)
    root attributes
        format        "hpctrain-dataset"
        version       1
        classes       number of classes K (int)
        description   where the data came from (str)

A chunk holds one sample (a few when samples are tiny), so reading a random sample costs one
chunk. ``python -m hpctrain convert`` writes this format from ``.npy``/``.npz`` arrays or from
scikit-learn's handwritten digits (:mod:`hpctrain.convert`).

Reading (:class:`H5Data`): epoch e of the training split is the permutation
``numpy.random.default_rng([seed, e]).permutation(N)``, the same on every rank and for every
number of processes; an epoch is ``N // batch`` batches (the remainder is dropped). Each rank
reads only its own hyperslab of a batch: its samples, and only the channels, rows and columns
(or features) of its block. The held-out split is read in order, unshuffled, in
``ceil(N / batch)`` batches; the last is padded with zero images labelled -1.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpctrain.backend import Backend
from hpctrain.errors import UserError
from hpctrain.files import output_error, replace_atomically
from hpctrain.layout import Box

FORMAT, VERSION = "hpctrain-dataset", 1
SPLITS = ("train", "val")
CHUNK_BYTES = 16 << 10  # samples smaller than this share a chunk
CONVERT = "python -m hpctrain convert"


class DatasetError(UserError):
    """A dataset file that cannot be read or does not fit the net; the message names the fix."""


def shape_text(shape: tuple[int, ...]) -> str:
    """(1, 8, 8) -> '1x8x8'."""
    return "x".join(str(n) for n in shape)


# --- writing -----------------------------------------------------------------------------------


def write_dataset(path: str | Path, images: np.ndarray, labels: np.ndarray,
                  classes: int | None = None, val_images: np.ndarray | None = None,
                  val_labels: np.ndarray | None = None, description: str = "") -> None:
    """Check the arrays and write them as a dataset file, atomically.

    Parameters
    ----------
    path : where to write; an existing file is replaced only once the new one is complete.
    images : (N, C, H, W) or (N, F) training images, any real dtype; stored as float32.
    labels : (N,) integer class labels in [0, classes).
    classes : number of classes; default max label (over both splits) + 1.
    val_images, val_labels : an optional held-out split with the same sample shape.
    description : where the data came from, stored as an attribute.

    Raises
    ------
    DatasetError
        Mismatched lengths or sample shapes, non-integer or out-of-range labels, non-finite
        images.
    OutputError
        A file that cannot be written, or something at ``path`` hpctrain did not write.
    """
    path = Path(path)
    if (val_images is None) != (val_labels is None):
        raise DatasetError("give both val_images and val_labels, or neither")
    splits = {"train": _checked_split("train", images, labels)}
    if val_images is not None:
        splits["val"] = _checked_split("val", val_images, val_labels)
        if splits["val"][0].shape[1:] != splits["train"][0].shape[1:]:
            raise DatasetError(
                f"val samples have shape {shape_text(splits['val'][0].shape[1:])} but train "
                f"samples {shape_text(splits['train'][0].shape[1:])}; both splits must match")
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

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as h5:
            h5.attrs["format"] = FORMAT
            h5.attrs["version"] = VERSION
            h5.attrs["classes"] = classes
            h5.attrs["description"] = description
            for name, (x, y) in splits.items():
                group = h5.create_group(name)
                group.create_dataset("images", data=x, chunks=_chunks(x.shape))
                group.create_dataset("labels", data=y)

    try:
        replace_atomically(path, write, ours=is_dataset)
    except OSError as err:
        raise output_error(path, err) from err


def is_dataset(path: str | Path) -> bool:
    """Whether ``path`` is a dataset hpctrain wrote (its ``format`` attribute says so)."""
    try:
        with h5py.File(path, "r", locking=False) as h5:
            return h5.attrs.get("format") == FORMAT
    except (OSError, ValueError):
        return False


def _checked_split(name: str, images: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """(float32 images, int64 labels) of one split, or a DatasetError naming the problem."""
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim not in (2, 4):
        raise DatasetError(f"{name} images have shape {images.shape}; give (N, C, H, W) images "
                           f"or (N, F) feature vectors")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DatasetError(f"{name} labels have shape {labels.shape} but there are "
                           f"{len(images)} {name} images; give one label per image")
    if len(images) == 0:
        raise DatasetError(f"the {name} split is empty; give at least one sample")
    if not (np.issubdtype(images.dtype, np.floating) or np.issubdtype(images.dtype, np.integer)):
        raise DatasetError(f"{name} images have dtype {images.dtype}; give real numbers")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"{name} labels have dtype {labels.dtype}; give integer class labels")
    with np.errstate(over="ignore"):  # overflow becomes inf, refused just below
        x = np.ascontiguousarray(images, dtype=np.float32)
    if not np.isfinite(x).all():  # after the cast: float64 beyond float32's range becomes inf
        raise DatasetError(f"{name} images hold NaN or infinite values (or values beyond "
                           f"float32); clean or rescale them")
    return x, labels.astype(np.int64)


def _chunks(shape: tuple[int, ...]) -> tuple[int, ...]:
    """One sample per chunk, or as many tiny samples as fit in CHUNK_BYTES."""
    sample_bytes = 4 * math.prod(shape[1:])
    return (max(1, min(shape[0], CHUNK_BYTES // max(sample_bytes, 1))), *shape[1:])


# --- checking ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset file holds: per-sample shape, classes, and the size of each split."""

    path: Path
    sample_shape: tuple[int, ...]
    classes: int
    train_size: int
    val_size: int  # 0 when the file has no held-out split


def inspect_dataset(path: str | Path) -> DatasetInfo:
    """Open ``path``, check it is a valid dataset file, and describe it.

    Reads the attributes, the shapes and the labels (to check their range), never the images.

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
    """HDF5's reason from an h5py error, e.g. 'truncated file: eof = 4768, …' or 'file
    signature not found': the last parenthesised part of the message."""
    match = re.search(r"\(([^()]*)\)\s*$", str(err))
    return match.group(1) if match else str(err)


def _describe(h5: h5py.File, path: Path) -> DatasetInfo:
    """Check an open dataset file and describe it (OSError from a corrupt file included)."""
    try:
        return _check_contents(h5, path)
    except OSError as err:  # structure that opened but whose data cannot be read
        raise DatasetError(f"dataset '{path}' is not a readable HDF5 file ({_reason(err)}); "
                           f"rewrite it with {CONVERT}") from err


def _check_contents(h5: h5py.File, path: Path) -> DatasetInfo:
    fmt = h5.attrs.get("format")
    if isinstance(fmt, bytes):
        fmt = fmt.decode()
    if fmt != FORMAT:
        raise DatasetError(f"'{path}' is not an hpctrain dataset (no format attribute "
                           f"'{FORMAT}'); convert your data with {CONVERT}")
    version = h5.attrs.get("version")
    if version != VERSION:
        raise DatasetError(f"dataset '{path}' has format version {version}; this hpctrain reads "
                           f"version {VERSION}; rewrite it with {CONVERT}")
    classes = h5.attrs.get("classes")
    if not isinstance(classes, int | np.integer) or classes < 1:
        raise DatasetError(f"dataset '{path}' has classes attribute {classes!r}; it must be a "
                           f"positive integer")
    classes = int(classes)
    sizes, shapes = {}, {}
    for split in SPLITS:
        if split not in h5 and split == "val":
            sizes[split] = 0
            continue
        missing = [f"/{split}/{k}" for k in ("images", "labels")
                   if not isinstance(h5.get(f"{split}/{k}"), h5py.Dataset)]
        if missing:
            raise DatasetError(f"dataset '{path}' lacks {' and '.join(missing)}; rewrite it "
                               f"with {CONVERT}")
        images, labels = h5[f"{split}/images"], h5[f"{split}/labels"]
        if images.ndim not in (2, 4):
            raise DatasetError(f"dataset '{path}': /{split}/images has shape "
                               f"{shape_text(images.shape)}; it must be N x C x H x W or N x F")
        if not np.issubdtype(images.dtype, np.floating):
            raise DatasetError(f"dataset '{path}': /{split}/images has dtype {images.dtype}; "
                               f"it must be floating point (float32)")
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise DatasetError(f"dataset '{path}': /{split}/labels has shape "
                               f"{shape_text(labels.shape)} and dtype {labels.dtype}; it must "
                               f"be one integer per sample")
        if len(labels) != len(images):
            raise DatasetError(f"dataset '{path}': /{split}/labels has {len(labels)} entries "
                               f"but /{split}/images {len(images)}; they must match")
        y = labels[()]
        if y.size and (y.min() < 0 or y.max() >= classes):
            bad = int(y[(y < 0) | (y >= classes)][0])
            raise DatasetError(f"dataset '{path}': /{split}/labels holds {bad}, outside "
                               f"[0, {classes}) for classes = {classes}")
        sizes[split], shapes[split] = len(images), tuple(images.shape[1:])
    if "val" in shapes and shapes["val"] != shapes["train"]:
        raise DatasetError(f"dataset '{path}': val samples are {shape_text(shapes['val'])} but "
                           f"train samples {shape_text(shapes['train'])}; they must match")
    return DatasetInfo(path, shapes["train"], classes, sizes["train"], sizes["val"])


def check_fits(info: DatasetInfo, input_shape: tuple[int, ...], classes: int,
               batch: int) -> None:
    """Refuse a dataset whose samples, classes or size do not fit a net and a batch.

    Raises
    ------
    DatasetError
        The sample shape differs from ``input_shape`` (for images with the same channels and
        square samples the message suggests ``--image-size``), the class counts differ, or
        the training split holds fewer than ``batch`` samples.
    """
    sample, want = tuple(info.sample_shape), tuple(input_shape)
    if sample != want:
        hint = "convert the data to the net's input shape or choose a net that takes it"
        if len(sample) == 3 and len(want) == 3 and sample[0] == want[0] and sample[1] == sample[2]:
            hint = f"pass --image-size {sample[1]} to size the net's input to the data"
        raise DatasetError(f"dataset '{info.path}' holds samples of shape {shape_text(sample)} "
                           f"but the net takes {shape_text(want)}; {hint}")
    if info.classes != classes:
        raise DatasetError(f"dataset '{info.path}' has {info.classes} classes but the net has "
                           f"{classes}; use a net whose input line says classes={info.classes}")
    if info.train_size < batch:
        raise DatasetError(f"dataset '{info.path}' has {info.train_size} training samples, "
                           f"fewer than --batch {batch}; lower --batch")


# --- reading -----------------------------------------------------------------------------------


class H5Data:
    """Batches of a dataset file, each rank reading only its own block.

    Same interface as :class:`~hpctrain.data.SyntheticData`: ``images(step, box)`` is block
    ``box`` of batch ``step`` (batch axis relative to the batch, then C, H, W or F) and
    ``labels(step, (lo, hi))`` the labels of samples lo..hi-1 of that batch.

    ``split="train"``: batch ``step`` is batch ``step % steps_per_epoch`` of epoch
    ``step // steps_per_epoch``, whose order is ``default_rng([seed, epoch]).permutation(N)``.
    ``split="val"``: batch k holds samples k·B .. (k+1)·B - 1 in file order; positions past N
    are padding, with zero images and label -1. Worked example, N = 10, B = 4::

        train: steps_per_epoch = 2; steps 0, 1 are epoch 0; step 2 starts epoch 1
        val:   batches = 3; batch 2 holds samples 8, 9 and two padding positions

    The file stays open read-only until :meth:`close` (or the end of a ``with`` block).
    ``info``, the file's :func:`inspect_dataset` already made (by rank 0), spares every reader
    on every rank checking it again, which reads every label.
    """

    def __init__(self, backend: Backend, path: str | Path, batch: int, seed: int = 0,
                 split: str = "train", info: DatasetInfo | None = None) -> None:
        if split not in SPLITS:
            raise DatasetError(f"unknown split {split!r}; choose train or val")
        if batch < 1:
            raise DatasetError(f"--batch {batch} must be at least 1")
        if seed < 0:  # numpy's SeedSequence takes non-negative integers only
            raise DatasetError(f"--seed {seed} must be >= 0 to shuffle a dataset")
        self.backend, self.path, self.batch, self.seed, self.split = (
            backend, Path(path), batch, seed, split)
        self._file = _open(self.path)
        try:
            info = info or _describe(self._file, self.path)
            self.sample_shape, self.classes = info.sample_shape, info.classes
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
        self._labels = self._file[f"{split}/labels"]  # (N,)
        self.steps_per_epoch = self.size // batch  # train: whole batches per epoch
        self.batches = math.ceil(self.size / batch)  # val: batches incl. the padded last one
        self._epoch: tuple[int, np.ndarray] | None = None  # (epoch, its permutation)

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
        """Block ``box`` of the (B, *sample_shape) input of batch ``step``, on the device."""
        index = self.indices(step, box[0])
        inner = tuple(slice(a, b) for a, b in box[1:])  # channels, rows, cols (or features)
        block = np.zeros((len(index), *(b - a for a, b in box[1:])), self._images.dtype)
        real = np.flatnonzero(index >= 0)  # val padding stays zero
        if real.size:
            block[real] = self._read(self._images, index[real], inner)
        return self.backend.xp.asarray(block.astype(self.backend.dtype, copy=False))

    def labels(self, step: int, samples: tuple[int, int]) -> Any:
        """int64 labels of positions lo..hi-1 of batch ``step``; -1 for val padding."""
        index = self.indices(step, samples)
        labels = np.full(len(index), -1, np.int64)
        real = np.flatnonzero(index >= 0)
        if real.size:
            labels[real] = self._read(self._labels, index[real], ())
        return self.backend.xp.asarray(labels)

    @staticmethod
    def _read(dataset: h5py.Dataset, index: np.ndarray, inner: tuple[slice, ...]) -> np.ndarray:
        """``dataset[index, *inner]`` reading only that hyperslab, rows in ``index`` order.

        h5py fancy indexing wants increasing indices: read in sorted order, then put the rows
        back where the batch wants them. Consecutive indices (val) read as one slice.
        """
        try:
            if index[-1] - index[0] == len(index) - 1 and (np.diff(index) == 1).all():
                return dataset[(slice(int(index[0]), int(index[-1]) + 1), *inner)]
            order = np.argsort(index)
            rows = dataset[(index[order], *inner)]  # row k is sample index[order[k]]
        except OSError as err:
            # not a UserError: a damaged chunk may strike one rank only, so the job aborts
            raise RuntimeError(f"reading {dataset.name} of dataset '{dataset.file.filename}' "
                               f"failed ({_reason(err)}); the file is damaged") from err
        out = np.empty_like(rows)
        out[order] = rows
        return out

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> H5Data:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
