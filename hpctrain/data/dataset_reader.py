"""Reading a dataset file (:mod:`hpctrain.data.dataset_format`), each rank only its own block
of a batch: :class:`~hpctrain.data.dataset_reader.H5Data`.

Epoch e of the training split is the permutation
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
:func:`~hpctrain.data.dataset_writer.write_batches` writes has one; older files without are
still read), or a chunk past the end of a file cut short since it was opened, which HDF5 itself
would read as zeros.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpctrain.data.dataset_format import (
    CONVERT,
    SPLITS,
    DatasetError,
    DatasetInfo,
    describe_dataset,
    hdf5_reason,
    open_dataset,
)
from hpctrain.data.source import is_map_box
from hpctrain.device.backend import Backend
from hpctrain.io.seeds import check_seed
from hpctrain.layout.layout import Box


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
    ``split="val"`` (or any split ``in_order``, as ``predict`` reads it): batch k holds samples
    k·B .. (k+1)·B - 1 in file order; positions past N are padding, with zero images and label
    -1 (targets: a row of NaN). Worked example, N = 10, B = 4::

        train: steps_per_epoch = 2; steps 0, 1 are epoch 0; step 2 starts epoch 1
        val:   batches = 3; batch 2 holds samples 8, 9 and two padding positions

    A box is read as one HDF5 hyperslab per batch, so HDF5 reads only the chunks the box meets
    (:func:`~hpctrain.data.dataset_format.chunk_shape`): a rank holding depth planes d0..d1 of
    volumes chunked ``dc`` planes deep reads chunk planes d0 // dc .. (d1 - 1) // dc of its own
    samples, never a whole sample.

    ``flatten`` (see :func:`~hpctrain.data.dataset_fit.feeds_flat`): the file's samples are
    given as flat vectors, ``sample_shape`` says so, and ``box`` ranges over the flat features;
    each rank still reads only the smallest hyperslab holding its features
    (:func:`flat_cover`).

    The file stays open read-only until :meth:`close` (or the end of a ``with`` block).
    ``info``, the file's :func:`~hpctrain.data.dataset_format.inspect_dataset` already made
    (by rank 0), spares every reader on every rank checking it again, which reads every
    label.

    ``nonfinite`` is None until a block read holds NaN or Inf, or meets a damaged part of the
    file (``_checked_read``); then it names the file, the split and the first such sample
    by its index in the split, e.g. ``dataset 'd.h5': /train/images sample 1234 holds NaN; …``.
    """

    def __init__(self, backend: Backend, path: str | Path, batch: int, seed: int = 0,
                 split: str = "train", info: DatasetInfo | None = None,
                 flatten: bool = False, in_order: bool = False) -> None:
        if split not in SPLITS:
            raise DatasetError(f"unknown split {split!r}; choose train or val")
        if batch < 1:
            raise DatasetError(f"--batch {batch} must be at least 1")
        self.backend, self.path, self.batch, self.seed, self.split = (
            backend, Path(path), batch, check_seed(seed), split)
        self.in_order = in_order or split == "val"  # batches in file order, the last padded
        self._file = open_dataset(self.path)
        try:
            # the file's size now, to see it cut short while it is read (:meth:`_cut_short`);
            # None where the driver has no single file descriptor
            self._handle: int | None = _descriptor(self._file)
            self._opened_bytes = os.fstat(self._handle).st_size if self._handle is not None else 0
            info = info or describe_dataset(self._file, self.path)
            self.sample_shape, self.classes, self.targets = (
                info.sample_shape, info.classes, info.targets)
            self.label_maps = info.label_maps  # one label per pixel (N, *spatial)
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
            if not self.in_order and self.size < batch:
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
        if self.in_order:
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

    def labels(self, step: int, samples: Any) -> Any:
        """The answers of positions lo..hi-1 of batch ``step``, on the device.

        A labels dataset gives int64 labels (n,), -1 for val padding; a targets dataset gives
        (n, T) targets in the backend's dtype, a row of NaN for val padding. A dataset of
        label maps is asked for a block, ``samples`` = ((lo, hi), (h0, h1), (w0, w1)) (see
        :func:`~hpctrain.data.source.is_map_box`), and gives those pixels of those samples'
        maps, (n, h, w), read as one hyperslab; −1 throughout for val padding.
        """
        inner: tuple[slice, ...] = ()
        if is_map_box(samples):
            if not self.label_maps:
                raise DatasetError(f"dataset '{self.path}' holds one label per sample, but "
                                   f"the net scores every pixel; give a dataset of label maps "
                                   f"({CONVERT} --labels with (N, H, W) maps)")
            samples, *pixels = samples
            inner = tuple(slice(a, b) for a, b in pixels)
        index = self.indices(step, samples)
        if self.targets:
            answers = np.full((len(index), self.targets), np.nan, self.backend.dtype)
        else:
            answers = np.full((len(index), *(s.stop - s.start for s in inner)), -1, np.int64)
        real = np.flatnonzero(index >= 0)
        rows = self._checked_read(self._answers, index[real], inner) if real.size else None
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
                why = (sample, f"HDF5: {hdf5_reason(err)}"
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
