"""The arrays a dataset is converted from: ``.npy`` files, ``.npz`` archives and scikit-learn's
handwritten digits, and the seeded split of their samples into training and held-out.

An array spec is ``X.npy`` (memory-mapped, so that a set bigger than memory is read one batch of
samples at a time) or ``X.npz:KEY``, array KEY of an archive (read whole; ``X.npz`` alone names
its only array). Images (N, H, W) get a channel axis; (N, C, H, W), (N, C, D, H, W) volumes and
(N, F) are kept; with ``volumes`` a 4-D array is (N, D, H, W) volumes and gets a channel axis.
Labels are one integer class per sample; targets one or more finite real values per sample.
``python -m hpctrain convert`` (:mod:`hpctrain.commands.convert`) writes them with
:func:`~hpctrain.data.dataset_writer.write_dataset`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpctrain.data.dataset_format import DatasetError, as_finite_float32
from hpctrain.io.units import shape_text


def split_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The (train, val) sample indices, ``round(fraction * n)`` held out by a permutation.

    The permutation is seeded with ``seed``; each part is sorted, so both keep the file's order.

    >>> split_indices(5, 0.4, seed=0)[1].size, split_indices(5, 0.4, seed=0)[0].size
    (2, 3)

    Raises
    ------
    DatasetError
        A fraction that leaves either split empty.
    """
    n_val = round(fraction * n)
    if n_val < 1 or n_val >= n:
        raise DatasetError(f"--val-fraction {fraction} of {n} samples leaves an empty split; "
                           f"choose a fraction that keeps both splits non-empty")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def array_file(spec: str) -> Path:
    """The file that the array spec ``spec`` names, an ``.npy`` file or an ``.npz`` archive.

    >>> array_file("x.npz:images"), array_file("x.npy")
    (PosixPath('x.npz'), PosixPath('x.npy'))
    """
    head, sep, _ = spec.rpartition(":")
    return Path(head if sep and head.endswith(".npz") else spec)


def load_array(spec: str, what: str) -> np.ndarray:
    """The array that ``spec`` names, memory-mapped from an ``.npy`` file or read whole.

    ``X.npy`` is memory-mapped; ``X.npz:KEY`` is array KEY of the archive, read whole, and
    ``X.npz`` alone names the archive's only array. ``what`` names the array in errors.

    Raises
    ------
    DatasetError
        A missing or unreadable file, a key that the file lacks (or a key of an ``.npy`` file),
        an archive of several arrays with no key, or an array that needs pickle.
    """
    path, key = spec, None
    head, sep, tail = spec.rpartition(":")
    if sep and head.endswith(".npz"):
        path, key = head, tail
    if not Path(path).is_file():
        raise DatasetError(f"{what} file '{path}' does not exist")
    try:
        # mmap_mode: a .npy file is read only where it is sliced; an .npz archive ignores it
        loaded = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DatasetError(f"{what} file '{path}' is not a readable .npy or .npz file "
                           f"({err})") from err
    if isinstance(loaded, np.ndarray):
        if key is not None:
            raise DatasetError(f"{what} file '{path}' is a .npy file; drop ':{key}'")
        return loaded
    with loaded:
        keys = list(loaded.keys())
        if key is None and len(keys) == 1:
            key = keys[0]
        if key is None:
            raise DatasetError(f"{what} file '{path}' holds arrays {', '.join(keys)}; pick one "
                               f"with {path}:KEY")
        if key not in keys:
            raise DatasetError(f"{what} file '{path}' has no array '{key}'; it has "
                               f"{', '.join(keys) or 'none'}")
        try:
            return loaded[key]
        except ValueError as err:  # an object array, which needs pickle
            raise DatasetError(f"{what} array '{spec}' cannot be read without pickle "
                               f"({err}); save it as a numeric array") from err


class Samples:
    """Samples of an array, read and made float32 only a slice at a time.

    Rows ``rows`` of ``array`` (all when None), given a channel axis when ``channel``, and
    multiplied by ``scale``. :func:`~hpctrain.data.dataset_writer.write_dataset` slices it batch by
    batch, so a memory-mapped ``.npy`` file is read a batch at a time, never whole.

    >>> samples = Samples(np.arange(6).reshape(3, 2), 0.5, channel=True)
    >>> samples.shape, samples.take(np.array([2]))[0:1].tolist()
    ((3, 1, 2), [[[2.0, 2.5]]])
    """

    def __init__(self, array: np.ndarray, scale: float | None, channel: bool,
                 rows: np.ndarray | None = None, channels_last: bool = False) -> None:
        self.array, self.scale, self.channel, self.rows = array, scale, channel, rows
        self.channels_last = channels_last  # stored (N, ..., C): channels moved to axis 1
        n = len(array) if rows is None else len(rows)
        inner = array.shape[1:]
        if channels_last:
            inner = (inner[-1], *inner[:-1])
        self.shape = (n, *((1,) if channel else ()), *inner)
        self.dtype = np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, rows: np.ndarray) -> Samples:
        """The samples ``rows`` of these, still unread."""
        return Samples(self.array, self.scale, self.channel,
                       rows if self.rows is None else self.rows[rows], self.channels_last)

    def __getitem__(self, where: slice) -> np.ndarray:
        rows = where if self.rows is None else self.rows[where]
        with np.errstate(over="ignore"):  # overflow becomes inf, which the writer refuses
            x = np.asarray(self.array[rows], dtype=np.float32)
            if self.scale is not None:
                x = x * np.float32(self.scale)
        if self.channels_last:
            x = np.ascontiguousarray(np.moveaxis(x, -1, 1))
        return x[:, None] if self.channel else x


def take_rows(images: Samples | np.ndarray, rows: np.ndarray) -> Samples | np.ndarray:
    """The samples ``rows`` of ``images``, still unread when they are :class:`Samples`."""
    return images.take(rows) if isinstance(images, Samples) else images[rows]


COLOUR_CHANNELS = (1, 3, 4)
"""Channel counts that, last in an array whose first spatial axis is larger, mark it as stored
channels-last (grey, RGB, RGBA): (600, 16, 16, 3) is 16×16 RGB, not 16 channels of 16×3."""


def looks_channels_last(shape: tuple[int, ...]) -> bool:
    """Whether samples of ``shape`` (N, A, ..., Z) look stored channels-last: Z a colour
    channel count and A larger than 4, so that read channels-first they would be A channels of
    images Z wide."""
    return len(shape) >= 4 and shape[-1] in COLOUR_CHANNELS and shape[1] > max(COLOUR_CHANNELS)


def load_images(spec: str, scale: float | None, volumes: bool,
                channels: str = "auto") -> Samples:
    """The samples of ``spec``, read only when written, multiplied by ``scale``.

    (N, H, W) images get a channel axis, and so do (N, D, H, W) volumes with ``volumes``.
    ``channels``: ``first`` (the array is (N, C, ...)), ``last`` (it is (N, ..., C), and the
    channels are moved to axis 1 as it is read), or ``auto``: first, but an array that
    :func:`looks_channels_last` is refused, naming both flags.

    Raises
    ------
    DatasetError
        Samples that are not real numbers, or not shaped as one of the forms above.
    """
    images = load_array(spec, "images")
    if not (np.issubdtype(images.dtype, np.floating) or np.issubdtype(images.dtype, np.integer)):
        raise DatasetError(f"images '{spec}' have dtype {images.dtype}; give real numbers")
    if volumes and images.ndim not in (4, 5):
        raise DatasetError(f"images '{spec}' have shape {images.shape}; with --volumes give "
                           f"(N, D, H, W) or (N, C, D, H, W) volumes")
    if images.ndim not in (2, 3, 4, 5):
        raise DatasetError(f"images '{spec}' have shape {images.shape}; give (N, H, W), "
                           f"(N, C, H, W), (N, C, D, H, W) (or (N, D, H, W) with --volumes) or "
                           f"(N, F)")
    channel = images.ndim == 3 or (volumes and images.ndim == 4)
    has_channels = images.ndim >= 4 and not channel
    if channels == "last" and not has_channels:
        raise DatasetError(f"--channels-last: images '{spec}' of shape {images.shape} have no "
                           f"channel axis (give (N, H, W, C) or (N, D, H, W, C))")
    if channels == "auto" and has_channels and looks_channels_last(images.shape):
        moved = (images.shape[0], images.shape[-1], *images.shape[1:-1])
        raise DatasetError(f"images '{spec}' of shape {images.shape} look channels-last "
                           f"({images.shape[-1]} channels of {shape_text(images.shape[1:-1])}): "
                           f"pass --channels-last to read them as {moved}, or --channels-first "
                           f"if they are {images.shape[1]} channels of "
                           f"{shape_text(images.shape[2:])} (or save "
                           f"np.moveaxis(x, -1, 1))")
    return Samples(images, scale, channel, channels_last=channels == "last")


def load_labels(spec: str, ignore: int | None = None) -> np.ndarray:
    """The int64 class labels of ``spec``, (N,), or its label maps, (N, H, W) or
    (N, D, H, W), one class per pixel; whole-valued floats are accepted. In label maps the
    value ``ignore`` (a pixel not counted, such as VOC's border 255) becomes −1.

    Raises
    ------
    DatasetError
        Labels that are not whole numbers shaped (N,) or (N, H, W) or (N, D, H, W), or an
        ``ignore`` with one label per sample.
    """
    labels = np.asarray(load_array(spec, "labels"))
    if labels.ndim not in (1, 3, 4):
        raise DatasetError(f"labels '{spec}' have shape {labels.shape}; give one integer per "
                           f"sample, shaped (N,), or label maps shaped (N, H, W) or "
                           f"(N, D, H, W)")
    if ignore is not None and labels.ndim == 1:
        raise DatasetError(f"--ignore {ignore} applies to label maps; labels '{spec}' are one "
                           f"per sample, shaped {labels.shape}")
    if np.issubdtype(labels.dtype, np.floating):
        if not (np.isfinite(labels).all() and (labels == np.round(labels)).all()):
            raise DatasetError(f"labels '{spec}' are not whole numbers; give class indices "
                               f"0..K-1")
        labels = labels.astype(np.int64)
    elif not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"labels '{spec}' have dtype {labels.dtype}; give integer classes")
    labels = labels.astype(np.int64)
    if ignore is not None:
        labels[labels == ignore] = -1  # not counted, as the loss reads −1
    return labels


def load_targets(spec: str) -> np.ndarray:
    """The float32 (N, T) targets of ``spec``; (N,) becomes (N, 1).

    Raises
    ------
    DatasetError
        Targets that are not real numbers, not shaped (N,) or (N, T), or not finite in
        float32 (the message names the first such sample).
    """
    targets = np.asarray(load_array(spec, "targets"))
    if not (np.issubdtype(targets.dtype, np.floating)
            or np.issubdtype(targets.dtype, np.integer)):
        raise DatasetError(f"targets '{spec}' have dtype {targets.dtype}; give real numbers")
    if targets.ndim == 1:
        targets = targets[:, None]
    if targets.ndim != 2 or targets.shape[1] == 0:
        raise DatasetError(f"targets '{spec}' have shape {targets.shape}; give (N,) or (N, T) "
                           f"real values, T >= 1")
    targets, bad = as_finite_float32(targets)
    if bad is not None:
        raise DatasetError(f"targets '{spec}' hold NaN or infinite values (or values beyond "
                           f"float32), first in sample {bad}; every target must be a finite "
                           f"number")
    return targets


def load_digits() -> tuple[np.ndarray, np.ndarray, str]:
    """The images, labels and description of scikit-learn's handwritten digits.

    The images are (1797, 1, 8, 8) float32 in [0, 1], the labels int64 classes 0-9.

    Raises
    ------
    DatasetError
        scikit-learn is not installed.
    """
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as err:
        raise DatasetError("--digits needs scikit-learn; install it with 'pip install "
                           "scikit-learn' (it is in hpctrain's test extras)") from err
    digits = sklearn_digits()  # bundled with scikit-learn: no download
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # pixel values are 0..16
    description = ("handwritten digits from scikit-learn (sklearn.datasets.load_digits, the UCI "
                   "ML optical recognition of handwritten digits test set): 8x8 images, "
                   "0..16 scaled to [0, 1], classes 0-9")
    return images, digits.target.astype(np.int64), description
