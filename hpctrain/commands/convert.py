"""``python -m hpctrain convert``: write a dataset file (:mod:`hpctrain.data.dataset`) from arrays.

Two forms, both without MPI::

    python -m hpctrain convert --images X.npy --labels Y.npy --out data.h5 [--val-fraction 0.2]
    python -m hpctrain convert --digits --out inputs/digits.h5

Arrays come from ``.npy`` files or from ``.npz`` archives as ``file.npz:key``. Images (N, H, W)
get a channel axis; (N, C, H, W) and (N, F) are kept. Without ``--val-images``,
``--val-fraction`` holds out that share of the samples, picked by a permutation seeded with
``--seed``. ``--digits`` writes scikit-learn's 1797 handwritten digits (8x8, 10 classes) scaled
to [0, 1], with a seeded 80/20 train/val split.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from hpctrain.data.dataset import (
    DatasetError,
    inspect_dataset,
    is_dataset,
    shape_text,
    write_dataset,
)
from hpctrain.errors import ArgumentParser
from hpctrain.io.files import check_output
from hpctrain.io.seeds import parse_seed

DIGITS_VAL_FRACTION = 0.2


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m hpctrain convert",
        description="Write an hpctrain dataset (HDF5: /train and optional /val images and "
                    "labels) from .npy/.npz arrays, or from scikit-learn's handwritten digits. "
                    "Runs without MPI.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", metavar="FILE",
                        help="training images: X.npy or X.npz:KEY, shaped (N, H, W), "
                             "(N, C, H, W) or (N, F)")
    source.add_argument("--digits", action="store_true",
                        help="scikit-learn's handwritten digits (1797 8x8 images, 10 classes), "
                             "scaled to [0, 1] (needs scikit-learn)")
    parser.add_argument("--labels", metavar="FILE",
                        help="training labels: Y.npy or Y.npz:KEY, integers shaped (N,)")
    parser.add_argument("--val-images", metavar="FILE", help="held-out images (optional)")
    parser.add_argument("--val-labels", metavar="FILE", help="held-out labels (optional)")
    parser.add_argument("--val-fraction", type=float, default=None,
                        help="hold out this share of the samples when no --val-images are "
                             "given (default: 0 for arrays, 0.2 for --digits)")
    parser.add_argument("--seed", type=parse_seed, default=0,
                        help="seed of the held-out permutation, in [0, 2**63) (default: 0)")
    parser.add_argument("--classes", type=int, default=None,
                        help="number of classes (default: largest label + 1)")
    parser.add_argument("--scale", type=_number, default=None, metavar="S",
                        help="multiply the images by S, a number or a fraction such as 1/255")
    parser.add_argument("--description", default=None,
                        help="where the data came from, stored in the file")
    parser.add_argument("--out", required=True, metavar="FILE", help="the dataset to write (.h5)")
    return parser


def _number(text: str) -> float:
    """A float, or a fraction 'A/B' (argparse type)."""
    top, sep, bottom = text.partition("/")
    try:
        value = float(top) / float(bottom) if sep else float(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"'{text}' is not a number or fraction A/B") from None
    return value


def run(argv: list[str]) -> int:
    """Write the dataset the options describe and print one line saying what; 0 on success.

    Bad input raises :class:`~hpctrain.data.dataset.DatasetError` (a ``UserError``).
    """
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    if out.is_dir():
        raise DatasetError(f"--out {out} is a directory; give a file path such as {out}/data.h5")
    inputs = [(f"--{flag.replace('_', '-')}", _array_file(getattr(args, flag)))
              for flag in ("images", "labels", "val_images", "val_labels")
              if getattr(args, flag) is not None]
    check_output(out, "--out", is_dataset, "an hpctrain dataset", inputs)
    if args.val_fraction is not None and not 0 <= args.val_fraction < 1:
        raise DatasetError(f"--val-fraction {args.val_fraction} must be in [0, 1)")
    if args.digits:
        for flag in ("labels", "val_images", "val_labels", "scale", "classes"):
            if getattr(args, flag) is not None:
                raise DatasetError(f"--{flag.replace('_', '-')} does not apply to --digits")
        images, labels, description = _digits()
        fraction = DIGITS_VAL_FRACTION if args.val_fraction is None else args.val_fraction
        if fraction > 0:
            description += (f"; seeded {1 - fraction:.0%}/{fraction:.0%} train/val split "
                            f"(--seed {args.seed})")
    else:
        if args.labels is None:
            raise DatasetError("--images needs --labels (one integer class per image)")
        images, labels = _images(args.images, args.scale), _labels(args.labels)
        fraction = args.val_fraction or 0.0
        description = f"converted from {args.images} and {args.labels}"
    if args.description is not None:
        description = args.description

    val_images = val_labels = None
    if args.val_images is not None or args.val_labels is not None:
        if args.val_images is None or args.val_labels is None:
            raise DatasetError("give both --val-images and --val-labels, or neither")
        if fraction > 0:
            raise DatasetError("--val-fraction splits the training arrays; it cannot be "
                               "combined with --val-images")
        val_images, val_labels = _images(args.val_images, args.scale), _labels(args.val_labels)
    elif fraction > 0:
        if len(images) != len(labels):
            raise DatasetError(f"{len(labels)} labels for {len(images)} images; give one label "
                               f"per image")
        train, val = split_indices(len(images), fraction, args.seed)
        images, labels, val_images, val_labels = (
            images[train], labels[train], images[val], labels[val])

    write_dataset(out, images, labels, args.classes, val_images, val_labels, description)
    info = inspect_dataset(out)
    print(f"wrote {out}: {info.train_size} train / {info.val_size} val samples of shape "
          f"{shape_text(info.sample_shape)}, {info.classes} classes")
    return 0


def split_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) sample indices: ``round(fraction * n)`` held out by a seeded permutation.

    Each part is sorted, so both keep the file's order.
    """
    n_val = round(fraction * n)
    if n_val < 1 or n_val >= n:
        raise DatasetError(f"--val-fraction {fraction} of {n} samples leaves an empty split; "
                           f"choose a fraction that keeps both splits non-empty")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def _array_file(spec: str) -> Path:
    """The file of an array spec: ``X.npy``, or ``X.npz`` of ``X.npz:KEY``."""
    head, sep, _ = spec.rpartition(":")
    return Path(head if sep and head.endswith(".npz") else spec)


def load_array(spec: str, what: str) -> np.ndarray:
    """The array in ``X.npy``, or array KEY of ``X.npz:KEY`` (the only one of ``X.npz``)."""
    path, key = spec, None
    head, sep, tail = spec.rpartition(":")
    if sep and head.endswith(".npz"):
        path, key = head, tail
    if not Path(path).is_file():
        raise DatasetError(f"{what} file '{path}' does not exist")
    try:
        loaded = np.load(path, allow_pickle=False)
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


def _images(spec: str, scale: float | None) -> np.ndarray:
    """float32 images from ``spec``, (N, H, W) given a channel axis, multiplied by ``scale``."""
    images = load_array(spec, "images")
    if not (np.issubdtype(images.dtype, np.floating) or np.issubdtype(images.dtype, np.integer)):
        raise DatasetError(f"images '{spec}' have dtype {images.dtype}; give real numbers")
    if images.ndim == 3:
        images = images[:, None]  # (N, H, W) -> (N, 1, H, W)
    if images.ndim not in (2, 4):
        raise DatasetError(f"images '{spec}' have shape {images.shape}; give (N, H, W), "
                           f"(N, C, H, W) or (N, F)")
    images = images.astype(np.float32)
    if scale is not None:
        images *= np.float32(scale)
    return images


def _labels(spec: str) -> np.ndarray:
    """int64 labels from ``spec``; whole-valued floats are accepted."""
    labels = load_array(spec, "labels")
    if labels.ndim != 1:
        raise DatasetError(f"labels '{spec}' have shape {labels.shape}; give one integer per "
                           f"sample, shaped (N,)")
    if np.issubdtype(labels.dtype, np.floating):
        if not (np.isfinite(labels).all() and (labels == np.round(labels)).all()):
            raise DatasetError(f"labels '{spec}' are not whole numbers; give class indices "
                               f"0..K-1")
        labels = labels.astype(np.int64)
    elif not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"labels '{spec}' have dtype {labels.dtype}; give integer classes")
    return labels.astype(np.int64)


def _digits() -> tuple[np.ndarray, np.ndarray, str]:
    """scikit-learn's digits: (1797, 1, 8, 8) float32 in [0, 1], int64 labels, a description."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise DatasetError("--digits needs scikit-learn; install it with 'pip install "
                           "scikit-learn' (it is in hpctrain's test extras)") from err
    digits = load_digits()  # bundled with scikit-learn: no download
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # pixel values are 0..16
    description = ("handwritten digits from scikit-learn (sklearn.datasets.load_digits, the UCI "
                   "ML optical recognition of handwritten digits test set): 8x8 images, "
                   "0..16 scaled to [0, 1], classes 0-9")
    return images, digits.target.astype(np.int64), description
