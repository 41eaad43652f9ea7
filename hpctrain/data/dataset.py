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
scikit-learn's handwritten digits (:mod:`hpctrain.commands.convert`).

A net with flat input of F features reads a dataset of (C, H, W) samples with C·H·W = F
flattened, in row-major order: the shipped ``mlp`` (64 features) trains on the 1×8×8 digits.

Reading (:class:`H5Data`): epoch e of the training split is the permutation
``numpy.random.default_rng([seed, e]).permutation(N)``, the same on every rank and for every
number of processes; an epoch is ``N // batch`` batches (the remainder is dropped). Each rank
reads only its own hyperslab of a batch: its samples, and only the channels, rows and columns
(or features) of its block. The held-out split is read in order, unshuffled, in
``ceil(N / batch)`` batches; the last is padded with zero images labelled -1.

Every block read is checked for NaN and Inf (one pass over the rank's own slab). The reader does
not raise: the bad value may sit on one rank's slab only, so it notes the first bad sample in
``H5Data.nonfinite`` and the network raises on every rank at the loss all-reduce of that
step (see :meth:`hpctrain.run.network.Network.loss`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpctrain.device.backend import Backend
from hpctrain.errors import UserError
from hpctrain.io.files import replace_atomically
from hpctrain.io.seeds import check_seed
from hpctrain.layout.layout import Box

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

    replace_atomically(path, write, ours=is_dataset)


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


def feeds_flat(sample_shape: tuple[int, ...], input_shape: tuple[int, ...]) -> bool:
    """Whether samples of ``sample_shape`` feed a net of flat ``input_shape`` (F,) flattened:
    (C, H, W) with C·H·W = F.

    >>> feeds_flat((1, 8, 8), (64,)), feeds_flat((1, 8, 8), (1, 8, 8)), feeds_flat((3, 4), (10,))
    (True, False, False)
    """
    return (len(input_shape) == 1 and len(sample_shape) > 1
            and math.prod(sample_shape) == input_shape[0])


def check_fits(info: DatasetInfo, input_shape: tuple[int, ...], classes: int,
               batch: int) -> None:
    """Refuse a dataset whose samples, classes or size do not fit a net and a batch.

    Samples fit when their shape is ``input_shape``, or when the net takes F flat features and
    each sample holds F values (:func:`feeds_flat`; the reader flattens them).

    Raises
    ------
    DatasetError
        The sample shape differs from ``input_shape`` (for images with the same channels and
        square samples the message suggests ``--image-size``), the class counts differ, or
        the training split holds fewer than ``batch`` samples.
    """
    sample, want = tuple(info.sample_shape), tuple(input_shape)
    if sample != want and not feeds_flat(sample, want):
        hint = "convert the data to the net's input shape or choose a net that takes it"
        if len(sample) == 3 and len(want) == 3 and sample[0] == want[0] and sample[1] == sample[2]:
            hint = f"pass --image-size {sample[1]} to size the net's input to the data"
        elif len(want) == 1:
            hint = (f"a flat-input net reads samples of {math.prod(sample)} values; choose a "
                    f"net with features={math.prod(sample)}")
        raise DatasetError(f"dataset '{info.path}' holds samples of shape {shape_text(sample)} "
                           f"but the net takes {shape_text(want)}; {hint}")
    if info.classes != classes:
        raise DatasetError(f"dataset '{info.path}' has {info.classes} classes but the net has "
                           f"{classes}; use a net whose input line says classes={info.classes}")
    if info.train_size < batch:
        raise DatasetError(f"dataset '{info.path}' has {info.train_size} training samples, "
                           f"fewer than --batch {batch}; lower --batch")


# --- reading -----------------------------------------------------------------------------------


def flat_cover(shape: tuple[int, ...], lo: int, hi: int) -> tuple[tuple[slice, ...], int]:
    """The smallest hyperslab of a sample of ``shape`` that holds its flat (row-major) entries
    ``lo`` to ``hi - 1``, and the flat index of the hyperslab's first entry.

    The hyperslab fixes the leading indices the range shares, spans one axis, and takes the
    axes after it whole. Worked example, shape (2, 8, 8), entries 70..89: both lie in channel
    1 (entries 64..127), in its rows 0..3, so the hyperslab is [1:2, 0:4, 0:8], entries 64..95,
    and the range is its flat entries 6..25:

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
    block ``box`` of batch ``step`` (batch axis relative to the batch, then C, H, W or F) and
    ``labels(step, (lo, hi))`` the labels of samples lo..hi-1 of that batch.

    ``split="train"``: batch ``step`` is batch ``step % steps_per_epoch`` of epoch
    ``step // steps_per_epoch``, whose order is ``default_rng([seed, epoch]).permutation(N)``.
    ``split="val"``: batch k holds samples k·B .. (k+1)·B - 1 in file order; positions past N
    are padding, with zero images and label -1. Worked example, N = 10, B = 4::

        train: steps_per_epoch = 2; steps 0, 1 are epoch 0; step 2 starts epoch 1
        val:   batches = 3; batch 2 holds samples 8, 9 and two padding positions

    ``flatten`` (see :func:`feeds_flat`): the file's (C, H, W) samples are given as (C·H·W,)
    vectors, ``sample_shape`` says so, and ``box`` ranges over the flat features; each rank
    still reads only the smallest hyperslab holding its features (:func:`flat_cover`).

    The file stays open read-only until :meth:`close` (or the end of a ``with`` block).
    ``info``, the file's :func:`inspect_dataset` already made (by rank 0), spares every reader
    on every rank checking it again, which reads every label.

    ``nonfinite`` is None until a block read holds NaN or Inf; then it names the file, the split
    and the first such sample by its index in the split, e.g. ``dataset 'd.h5': /train/images
    sample 1234 holds NaN; …``.
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
            info = info or _describe(self._file, self.path)
            self.sample_shape, self.classes = info.sample_shape, info.classes
            self._stored_shape = info.sample_shape  # (C, H, W) in the file
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
        self._labels = self._file[f"{split}/labels"]  # (N,)
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
        inner = tuple(slice(a, b) for a, b in box[1:])  # channels, rows, cols (or features)
        cut = None
        if self.sample_shape != self._stored_shape:  # flattened: read a cover, then cut
            (lo, hi), = box[1:]
            inner, first = flat_cover(self._stored_shape, lo, hi)
            cut = slice(lo - first, hi - first)
        block = np.zeros((len(index), *(s.stop - s.start for s in inner)), self._images.dtype)
        real = np.flatnonzero(index >= 0)  # val padding stays zero
        if real.size:
            block[real] = self._read(self._images, index[real], inner)
        if cut is not None:
            block = block.reshape(len(index), -1)[:, cut]
        if self.nonfinite is None and not np.isfinite(block).all():  # one pass over the slab
            self.nonfinite = self._describe_nonfinite(block, index)
        return self.backend.xp.asarray(block.astype(self.backend.dtype, copy=False))

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
