"""The ``python -m hpctrain convert`` command, which writes a dataset file from arrays.

Six forms, all without MPI (the format is :mod:`hpctrain.data.dataset_format`)::

    python -m hpctrain convert --images X.npy --labels Y.npy --out data.h5 [--val-fraction 0.2]
    python -m hpctrain convert --images V.npy --targets P.npy --out volumes.h5
    python -m hpctrain convert --digits --out inputs/digits.h5
    python -m hpctrain convert --universe 256 --size 32 --out universe.h5
    python -m hpctrain convert --climate 64 --size 96 --out climate.h5
    python -m hpctrain convert --image-folder train/ --val-folder val/ --size 224 --out in.h5

Arrays come from ``.npy`` files, memory-mapped and written one batch of samples at a time so
that a set bigger than memory converts, or from ``.npz`` archives as ``file.npz:key`` (read
whole; :mod:`hpctrain.data.arrays`). Images (N, H, W) get a channel axis; (N, C, H, W),
(N, C, D, H, W) volumes and (N, F) are kept; with ``--volumes`` a 4-D array is (N, D, H, W)
volumes and gets a channel axis.
``--labels`` gives one integer class per sample, or label maps (N, H, W) (volumes:
(N, D, H, W)) of one class per pixel for a segmentation net, checked to match the images' count
and spatial size, −1 (or the ``--ignore`` value) marking a pixel not counted; ``--targets`` one
or more real values per sample, (N,) or (N, T), for a regression. Without ``--val-images``,
``--val-fraction`` holds out that share of the samples, picked by a permutation seeded with
``--seed``. ``--digits`` writes
scikit-learn's 1797 handwritten digits (8x8, 10 classes) scaled to [0, 1], with a seeded 80/20
train/val split. ``--universe N`` writes N synthetic cosmology-like volumes with their
parameters as targets (:mod:`hpctrain.data.universe`), the last 20% held out. ``--climate N``
writes N synthetic climate-like samples (16 fields of S x S, ``--channels`` to change) with label
maps of DeepCAM's three classes (:mod:`hpctrain.data.climate`), the last 20% held out.
``--image-folder DIR`` decodes a folder of image files, one sub-folder per class (ImageNet's
``train/CLASS/*.JPEG``), into uint8 RGB (3, S, S) images with the training split's per-channel
mean and std, on ``--workers`` processes (:mod:`hpctrain.data.folder`); the held-out split is
``--val-folder`` (the same classes) or ``--val-fraction`` of the files. Files Pillow cannot
read are listed and skipped, or with ``--strict`` refused; an empty class sub-folder is refused
unless ``--allow-empty``; ``--size`` and ``--workers`` are bounded by the memory and the CPUs
this process may use (:func:`~hpctrain.data.folder.plan_pipeline`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpctrain.data.arrays import (
    array_file,
    load_digits,
    load_images,
    load_labels,
    load_targets,
    split_indices,
    take_rows,
)
from hpctrain.data.climate import CLASSES as CLIMATE_CLASSES
from hpctrain.data.climate import climate_set
from hpctrain.data.dataset_format import (
    HDF5_SIGNATURE,
    DatasetError,
    inspect_dataset,
    is_dataset,
)
from hpctrain.data.dataset_writer import write_dataset
from hpctrain.data.folder import (
    ImageFiles,
    available_cpus,
    folder_classes,
    folder_files,
    require_pillow,
    write_folder,
)
from hpctrain.data.universe import PARAMETERS, Universe, write_universe
from hpctrain.errors import ArgumentParser, shown_path
from hpctrain.io.files import check_output, remove_abandoned
from hpctrain.io.seeds import parse_seed
from hpctrain.io.units import shape_text

DIGITS_VAL_FRACTION = UNIVERSE_VAL_FRACTION = 0.2
UNIVERSE_DEFAULTS = {"size": 32, "channels": 4, "targets_count": len(PARAMETERS)}
CLIMATE_DEFAULTS = {"size": 96, "channels": 16}
CLIMATE_LARGEST = 2048  # fields' side: a sample of 16 x 2048² float32 is 256 MiB
ARRAY_FLAGS = ("images", "labels", "targets", "val_images", "val_labels", "val_targets")
FOLDER_FLAGS = ("val_folder", "strict", "workers", "allow_empty")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m hpctrain convert",
        description="Write an hpctrain dataset (HDF5: /train and optional /val images with "
                    "labels or targets) from .npy/.npz arrays, from scikit-learn's handwritten "
                    "digits, or as synthetic cosmology-like volumes. Runs without MPI.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", metavar="FILE",
                        help="training samples: X.npy or X.npz:KEY, shaped (N, H, W), "
                             "(N, C, H, W), (N, C, D, H, W) or (N, F); .npy files are "
                             "memory-mapped and converted a batch of samples at a time")
    source.add_argument("--digits", action="store_true",
                        help="scikit-learn's handwritten digits (1797 8x8 images, 10 classes), "
                             "scaled to [0, 1] (needs scikit-learn)")
    source.add_argument("--image-folder", metavar="DIR",
                        help="a folder of image files with one sub-folder per class (ImageNet's "
                             "train/CLASS/*.JPEG; classes are the sorted sub-folder names), "
                             "decoded with Pillow to RGB, the shorter side resized to --size and "
                             "centre-cropped, stored as uint8 with the per-channel mean and std "
                             "the reader normalises with (needs 'pip install hpctrain[images]')")
    source.add_argument("--universe", type=int, metavar="N",
                        help="N synthetic cosmology-like volumes: 3-D Gaussian random fields "
                             "with power spectrum A k^-n, whose parameters (slope, amplitude, "
                             "cut-off, log-normal strength) are the targets; see --size, "
                             "--channels, --targets-count")
    source.add_argument("--climate", type=int, metavar="N",
                        help="N synthetic climate-like samples for a segmentation net: smooth "
                             "fields with atmospheric rivers and tropical cyclones in them, and "
                             "label maps of the 3 classes (background, river, cyclone), "
                             "DeepCAM's; see --size, --channels")
    answers = parser.add_mutually_exclusive_group()
    answers.add_argument("--labels", metavar="FILE",
                         help="training labels for a classifier: Y.npy or Y.npz:KEY, integers "
                              "shaped (N,); or label maps for a segmentation net, one class "
                              "per pixel, shaped (N, H, W) (volumes: (N, D, H, W)) as the "
                              "images, -1 for a pixel not counted")
    answers.add_argument("--targets", metavar="FILE",
                         help="training targets for a regression: Y.npy or Y.npz:KEY, finite "
                              "real values shaped (N,) or (N, T)")
    parser.add_argument("--volumes", action="store_true",
                        help="the images are 3-D volumes: a 4-D array is (N, D, H, W) and gets "
                             "a channel axis (5-D arrays are (N, C, D, H, W) without it)")
    order = parser.add_mutually_exclusive_group()
    order.add_argument("--channels-last", dest="channel_order", action="store_const",
                       const="last", default="auto",
                       help="the arrays are stored channels-last, (N, H, W, C) or "
                            "(N, D, H, W, C) as NumPy and TensorFlow images often are: the "
                            "channels are moved first as they are read (default: channels "
                            "first, and an array whose last axis is 1, 3 or 4 and whose "
                            "first spatial axis is larger is refused as ambiguous)")
    order.add_argument("--channels-first", dest="channel_order", action="store_const",
                       const="first",
                       help="the arrays are (N, C, H, W) or (N, C, D, H, W), even where the "
                            "last axis looks like colour channels")
    parser.add_argument("--val-images", metavar="FILE", help="held-out images (optional)")
    parser.add_argument("--val-labels", metavar="FILE", help="held-out labels (with --labels)")
    parser.add_argument("--val-targets", metavar="FILE",
                        help="held-out targets (with --targets)")
    parser.add_argument("--val-fraction", type=float, default=None, metavar="F",
                        help="hold out this share of the samples when no --val-images (or "
                             "--val-folder) are given (default: 0 for arrays and image "
                             "folders, 0.2 for --digits and --universe)")
    parser.add_argument("--seed", type=parse_seed, default=0,
                        help="seed of the held-out permutation, or of the --universe samples, "
                             "in [0, 2**63) (default: 0)")
    parser.add_argument("--classes", type=int, default=None, metavar="K",
                        help="number of classes (default: largest label + 1)")
    parser.add_argument("--ignore", type=int, default=None, metavar="I",
                        help="in label maps, the label of pixels not counted by the loss or "
                             "the metrics (e.g. 255, VOC's border); stored as -1")
    parser.add_argument("--scale", type=_number, default=None, metavar="S",
                        help="multiply the images by S, a number or a fraction such as 1/255")
    parser.add_argument("--description", default=None,
                        help="where the data came from, stored in the file")
    parser.add_argument("--out", required=True, metavar="FILE", help="the dataset to write (.h5)")
    folder = parser.add_argument_group("image folders (with --image-folder)")
    folder.add_argument("--val-folder", metavar="DIR",
                        help="held-out images, laid out like --image-folder, with its classes "
                             "(it may lack some)")
    folder.add_argument("--strict", action="store_true",
                        help="refuse a file that is not a readable image instead of listing and "
                             "skipping it")
    folder.add_argument("--workers", type=int, default=None, metavar="N",
                        help=f"decoding processes, at most the CPUs this process may use "
                             f"(default: all of them, here {available_cpus()}, as memory "
                             f"allows)")
    folder.add_argument("--allow-empty", action="store_true",
                        help="keep a class sub-folder of --image-folder that holds no file, as "
                             "a class with no training image (refused otherwise)")
    universe = parser.add_argument_group("synthetic universes and climate (with --universe, "
                                         "--climate)")
    universe.add_argument("--size", type=int, default=None, metavar="S",
                          help=f"voxels per side of each volume (default: "
                               f"{UNIVERSE_DEFAULTS['size']}); with --climate, the side of its "
                               f"S x S fields (default: {CLIMATE_DEFAULTS['size']}); with "
                               f"--image-folder, the side of the stored S x S images (required)")
    universe.add_argument("--channels", type=int, default=None, metavar="C",
                          help=f"channels per volume, the field at C growth stages like "
                               f"CosmoFlow's redshifts (default: {UNIVERSE_DEFAULTS['channels']}; "
                               f"--climate: fields per sample, default "
                               f"{CLIMATE_DEFAULTS['channels']}, DeepCAM's)")
    universe.add_argument("--targets-count", type=int, default=None, metavar="T",
                          help=f"targets per volume: the first T of "
                               f"{', '.join(p.name for p in PARAMETERS)} vary and are learned "
                               f"(default: {UNIVERSE_DEFAULTS['targets_count']})")
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

    Bad input raises :class:`~hpctrain.data.dataset_format.DatasetError` (a ``UserError``).
    """
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    if out.is_dir():
        raise DatasetError(f"--out {shown_path(out)} is a directory; give a file path such as "
                           f"{shown_path(out / 'data.h5')}")
    inputs = [(_flag(name), array_file(getattr(args, name)))
              for name in ARRAY_FLAGS if getattr(args, name) is not None]
    check_output(out, "--out", is_dataset, "an hpctrain dataset", inputs)
    if args.val_fraction is not None and not 0 <= args.val_fraction < 1:
        raise DatasetError(f"--val-fraction {args.val_fraction} must be in [0, 1)")
    if args.image_folder is None:
        _refuse(args, FOLDER_FLAGS, "applies only to --image-folder")
    if args.universe is None:
        shared = (("size",) if args.image_folder is not None else  # the images' side
                  tuple(CLIMATE_DEFAULTS) if args.climate is not None else ())
        _refuse(args, tuple(n for n in UNIVERSE_DEFAULTS if n not in shared),
                "applies only to --universe")
    made = (args.digits or args.universe is not None or args.image_folder is not None
            or args.climate is not None)
    if made:
        form = ("--digits" if args.digits else "--universe" if args.universe is not None
                else "--climate" if args.climate is not None else "--image-folder")
        _refuse(args, (*ARRAY_FLAGS[1:], "scale", "classes", "volumes", "ignore"),
                f"does not apply to {form}")
        if args.channel_order != "auto":
            raise DatasetError(f"--channels-{args.channel_order} describes --images arrays; it "
                               f"does not apply to {form}")
    # what a run to this path killed while writing left beside it (never a live run's)
    remove_abandoned(out, HDF5_SIGNATURE)
    if args.universe is not None:
        _write_universe(args, out)
    elif args.climate is not None:
        _write_climate(args, out)
    elif args.image_folder is not None:
        _write_folder(args, out)
    else:
        _write_arrays(args, out)
    info = inspect_dataset(out)
    answers = (f"{info.targets} targets" if info.targets else
               f"{info.classes} classes{', a label map per sample' if info.label_maps else ''}")
    print(f"wrote {shown_path(out)}: {info.train_size} train / {info.val_size} val samples of "
          f"shape "
          f"{shape_text(info.sample_shape)}, {answers}"
          f"{f'; images {info.normalisation}' if info.mean is not None else ''}")
    return 0


def _write_climate(args: argparse.Namespace, out: Path) -> None:
    """``--climate N`` synthetic fields with their label maps (:mod:`hpctrain.data.climate`),
    the last :data:`DIGITS_VAL_FRACTION` (or ``--val-fraction``) held out."""
    size = CLIMATE_DEFAULTS["size"] if args.size is None else args.size
    channels = CLIMATE_DEFAULTS["channels"] if args.channels is None else args.channels
    if args.climate < 2:
        raise DatasetError(f"--climate {args.climate}: give at least 2 samples (one to train "
                           f"on, one held out)")
    if not 8 <= size <= CLIMATE_LARGEST:
        raise DatasetError(f"--size {size}: --climate's fields are 8 to {CLIMATE_LARGEST} a "
                           f"side")
    if channels < 3:
        raise DatasetError(f"--channels {channels}: --climate needs at least 3 fields (moisture, "
                           f"pressure, wind)")
    fraction = DIGITS_VAL_FRACTION if args.val_fraction is None else args.val_fraction
    held = max(1, round(args.climate * fraction)) if fraction > 0 else 0
    images, labels = climate_set(args.climate, channels, size, size, args.seed)
    train = args.climate - held
    description = args.description or (
        f"synthetic climate-like fields, {channels} x {size} x {size}, with atmospheric rivers "
        f"and tropical cyclones labelled per pixel (--climate {args.climate} --seed "
        f"{args.seed}); the last {held} held out")
    write_dataset(out, images[:train], labels[:train], len(CLIMATE_CLASSES),
                  images[train:] if held else None, labels[train:] if held else None,
                  description)


def _write_folder(args: argparse.Namespace, out: Path) -> None:
    """Decode ``--image-folder`` (and ``--val-folder``) into ``out``; report skipped files."""
    require_pillow()
    if args.size is None:
        raise DatasetError("--image-folder needs --size S, the side of the stored S x S images "
                           "(e.g. --size 224)")
    if args.size < 1:
        raise DatasetError(f"--size {args.size} must be at least 1")
    if args.workers is not None and args.workers < 1:
        raise DatasetError(f"--workers {args.workers} must be at least 1")
    if args.val_folder is not None and args.val_fraction:
        raise DatasetError("--val-fraction splits --image-folder; it cannot be combined with "
                           "--val-folder")
    root = Path(args.image_folder)
    classes = folder_classes(root, "--image-folder")
    splits: dict[str, ImageFiles] = {
        "train": folder_files(root, classes, "--image-folder", args.allow_empty)}
    if args.val_folder is not None:
        splits["val"] = folder_files(Path(args.val_folder), classes, "--val-folder")
    elif args.val_fraction:
        train, val = split_indices(len(splits["train"].files), args.val_fraction, args.seed)
        splits = {"train": splits["train"].take(train), "val": splits["train"].take(val)}
    description = args.description or (
        f"images of {root} ({len(classes)} classes: sub-folders "
        f"{', '.join(classes[:3])}{', ...' if len(classes) > 3 else ''})"
        f"{f' held out: {args.val_folder}' if args.val_folder else ''}; RGB, shorter side "
        f"resized to {args.size} (bilinear, antialiased) and centre-cropped to "
        f"{args.size}x{args.size}, uint8")
    report = write_folder(out, splits, len(classes), args.size, workers=args.workers,
                          strict=args.strict, description=description)
    total = sum(report.written.values()) + len(report.bad)
    rate = total / max(report.seconds, 1e-9)
    workers = report.workers
    print(f"decoded {total} files in {report.seconds:.1f} s ({rate:.0f} images/s) with "
          f"{workers} worker{'s' * (workers > 1)}", file=sys.stderr)
    if report.bad:
        print(report.bad_text(), file=sys.stderr)


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _refuse(args: argparse.Namespace, names: tuple[str, ...], why: str) -> None:
    """Refuse the first option of ``names`` given on the command line, saying ``why``."""
    for name in names:
        if getattr(args, name) not in (None, False):
            raise DatasetError(f"{_flag(name)} {why}")


def _write_universe(args: argparse.Namespace, out: Path) -> None:
    """Write ``--universe N`` synthetic volumes to ``out``."""
    chosen = {name: default if getattr(args, name) is None else getattr(args, name)
              for name, default in UNIVERSE_DEFAULTS.items()}
    universe = Universe(chosen["size"], chosen["channels"], chosen["targets_count"], args.seed)
    fraction = UNIVERSE_VAL_FRACTION if args.val_fraction is None else args.val_fraction
    write_universe(out, args.universe, universe, fraction, args.description)


def _write_arrays(args: argparse.Namespace, out: Path) -> None:
    """Write the arrays (``--images`` or ``--digits``) the options name to ``out``."""
    regression = args.targets is not None
    answer = "targets" if regression else "labels"
    if args.digits:
        images, answers, description = load_digits()
        fraction = DIGITS_VAL_FRACTION if args.val_fraction is None else args.val_fraction
        if fraction > 0:
            description += (f"; seeded {1 - fraction:.0%}/{fraction:.0%} train/val split "
                            f"(--seed {args.seed})")
    else:
        if args.labels is None and not regression:
            raise DatasetError("--images needs --labels (one integer class per image) or "
                               "--targets (real values per image)")
        if regression and args.classes is not None:
            raise DatasetError("--classes applies to --labels; a targets dataset has as many "
                               "targets as the --targets array has columns")
        if regression and args.ignore is not None:
            raise DatasetError("--ignore applies to label maps (--labels); a targets dataset "
                               "counts every sample")
        images = load_images(args.images, args.scale, args.volumes, args.channel_order)
        answers = (load_targets(args.targets) if regression
                   else load_labels(args.labels, args.ignore))
        fraction = args.val_fraction or 0.0
        description = f"converted from {args.images} and {getattr(args, answer)}"
    if args.description is not None:
        description = args.description

    val_images = val_answers = None
    other = "val_labels" if regression else "val_targets"
    if getattr(args, other) is not None:
        raise DatasetError(f"{_flag(other)} goes with {_flag(other[4:])}; give --val-{answer} "
                           f"with --{answer}")
    given = getattr(args, f"val_{answer}")
    if args.val_images is not None or given is not None:
        if args.val_images is None or given is None:
            raise DatasetError(f"give both --val-images and --val-{answer}, or neither")
        if fraction > 0:
            raise DatasetError("--val-fraction splits the training arrays; it cannot be "
                               "combined with --val-images")
        val_images = load_images(args.val_images, args.scale, args.volumes,
                                 args.channel_order)
        val_answers = load_targets(given) if regression else load_labels(given, args.ignore)
    elif fraction > 0:
        if len(images) != len(answers):
            raise DatasetError(f"{len(answers)} {answer} for {len(images)} images; give one "
                               f"{'row of targets' if regression else 'label'} per image")
        train, val = split_indices(len(images), fraction, args.seed)
        images, answers, val_images, val_answers = (
            take_rows(images, train), answers[train], take_rows(images, val), answers[val])

    if regression:
        write_dataset(out, images, None, None, val_images, None, description, targets=answers,
                      val_targets=val_answers)
    else:
        write_dataset(out, images, answers, args.classes, val_images, val_answers, description)
