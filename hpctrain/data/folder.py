"""Folders of image files, one sub-folder per class, decoded into a uint8 dataset file.

The layout is ImageNet's ``train/CLASS/*.JPEG``: the classes are the names of the sub-folders
of the folder, sorted (class k is the k-th name), and a class's samples are the files directly
in its sub-folder, sorted by name. Hidden names (starting with ".") are passed over.

Each image is decoded with Pillow, converted to RGB, and its centre square (side the shorter
side) resized to S x S with Pillow's antialiased bilinear filter: the shorter side resized to S,
then centre-cropped to S x S, in one resampling. A JPEG is first decoded at the smallest DCT
scale that keeps both sides at least S (``Image.draft``), which makes big photos several times
faster to decode. Samples are stored as uint8 (3, S, S) in
the format of :mod:`hpctrain.data.dataset` (version 3, with the training split's per-channel
mean and std).

Decoding runs on a pool of worker processes; results are written in file order, so the file is
the same, byte for byte, for any number of workers. At most a few batches of decoded images are
held at a time. A file Pillow cannot decode is listed and skipped (or, ``strict``, refused).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from hpctrain.data.dataset import DatasetError, write_batches

PILLOW_HINT = "pip install hpctrain[images]"
TASK_FILES = 16  # files per task handed to a worker
TASKS_AHEAD = 4  # tasks in flight per worker: bounds the decoded images held in memory
WRITE_IMAGES = 256  # decoded images handed to the file at a time (at least)
SHOWN_BAD = 5  # unreadable files named in the summary


def require_pillow() -> None:
    """Refuse, in one line, when Pillow is not installed."""
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        raise DatasetError(f"--image-folder needs Pillow to decode images; install it with "
                           f"'{PILLOW_HINT}'") from None


@dataclass(frozen=True)
class ImageFiles:
    """Image files and the class index of each, in the order they are written."""

    files: list[Path]
    labels: np.ndarray  # int64 (n,)

    def take(self, rows: np.ndarray) -> ImageFiles:
        """The files ``rows`` of these, in that order."""
        return ImageFiles([self.files[i] for i in rows], self.labels[rows])


def folder_classes(root: Path, flag: str) -> list[str]:
    """The sorted names of the sub-folders of ``root``, its classes."""
    if not root.is_dir():
        raise DatasetError(f"{flag} {root} is not a directory; give a folder with one "
                           f"sub-folder of images per class")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DatasetError(f"{flag} {root} has no sub-folders; give a folder with one "
                           f"sub-folder of images per class (ImageNet's train/CLASS/*.JPEG)")
    return classes


def folder_files(root: Path, classes: Sequence[str], flag: str) -> ImageFiles:
    """The files of ``root``'s class sub-folders, labelled by their index in ``classes``.

    A sub-folder whose name is not in ``classes`` is refused (a held-out folder must have the
    training folder's classes; it may lack some).
    """
    index = {name: k for k, name in enumerate(classes)}
    files: list[Path] = []
    labels: list[int] = []
    for name in folder_classes(root, flag):
        if name not in index:
            raise DatasetError(f"{flag} {root} has class '{name}', which is not a class of "
                               f"--image-folder; give the same class sub-folders in both")
        found = sorted(p for p in (root / name).iterdir()
                       if p.is_file() and not p.name.startswith("."))
        files += found
        labels += [index[name]] * len(found)
    if not files:
        raise DatasetError(f"{flag} {root} has no files in its class sub-folders")
    return ImageFiles(files, np.array(labels, np.int64))


def decode(path: str, size: int) -> np.ndarray | str:
    """The image at ``path`` as uint8 (3, size, size), or why it cannot be read.

    RGB; its centre square (side the shorter side) resized to size x size with the antialiased
    bilinear filter.
    """
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.draft("RGB", (size, size))  # JPEG: decode at a reduced scale, sides >= size
            rgb = image.convert("RGB")
        width, height = rgb.size
        side = min(width, height)
        box = ((width - side) / 2, (height - side) / 2, (width + side) / 2, (height + side) / 2)
        square = rgb.resize((size, size), Image.Resampling.BILINEAR, box=box)
        return np.asarray(square, np.uint8).transpose(2, 0, 1).copy()  # (H, W, 3) -> (3, H, W)
    except MemoryError:
        raise  # not the file's fault: stop the run
    except Exception as err:  # noqa: BLE001 -- any decoder failure marks the file unreadable
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _decode_task(paths: Sequence[str], size: int) -> list[np.ndarray | str]:
    return [decode(path, size) for path in paths]


def _ignore_interrupt() -> None:
    """Worker set-up: Ctrl-C reaches the parent, which stops the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def _interrupted_between_tasks(pool: Any) -> Iterator[list[bool]]:
    """While a pool runs, Ctrl-C is noted (the flag yielded) rather than raised: raised
    anywhere inside the pool's machinery, it can leave its result thread waiting forever and
    ``terminate`` hanging; :func:`_decoded` raises it between tasks instead."""
    noted = [False]
    if pool is None or threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(signum: int, frame: Any) -> None:
        noted[0] = True

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def available_cpus() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``), or all of the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Progress:
    """One progress line on ``stream``: images done, images/s and the time left.

    On a terminal the line is rewritten in place a few times a second; otherwise (a log file)
    a line is written every ``every`` seconds.
    """

    def __init__(self, stream: TextIO | None, total: int, every: float = 5.0) -> None:
        self.stream, self.total = stream, total
        self.tty = stream is not None and stream.isatty()
        self.every = 0.2 if self.tty else every
        self.start = self.last = time.monotonic()
        self.done, self.width = 0, 0

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.stream is None or now - self.last < self.every:
            return
        self.last = now
        self._show(now)

    def _show(self, now: float) -> None:
        if self.stream is None:
            return
        rate = self.done / max(now - self.start, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        line = (f"decoding images: {self.done}/{self.total}, {rate:.0f} images/s, "
                f"ETA {_clock(left)}")
        if self.tty:
            self.stream.write("\r" + line.ljust(self.width))
            self.width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> float:
        """End the line (on a terminal); the seconds since the start."""
        now = time.monotonic()
        if self.tty and self.stream is not None:
            self._show(now)
            self.stream.write("\n")
            self.stream.flush()
        return now - self.start


def _clock(seconds: float) -> str:
    """3725 -> '1:02:05'; 65 -> '1:05'."""
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass
class FolderReport:
    """What :func:`write_folder` did: images written per split, unreadable files, time."""

    written: dict[str, int] = field(default_factory=dict)
    bad: list[tuple[Path, str]] = field(default_factory=list)  # (file, why), in file order
    seconds: float = 0.0

    def bad_text(self) -> str:
        """'skipped 2 unreadable files: a/x.jpg (why), b/y.txt (why)', or ''."""
        if not self.bad:
            return ""
        shown = ", ".join(f"{path} ({why})" for path, why in self.bad[:SHOWN_BAD])
        more = f", and {len(self.bad) - SHOWN_BAD} more" if len(self.bad) > SHOWN_BAD else ""
        return f"skipped {len(self.bad)} unreadable file{'s' * (len(self.bad) > 1)}: {shown}{more}"


def write_folder(out: Path, splits: dict[str, ImageFiles], classes: int, size: int, *,
                 workers: int = 1, strict: bool = False, description: str = "",
                 progress: TextIO | None = sys.stderr) -> FolderReport:
    """Decode the images of ``splits`` ("train", optionally "val") and write them to ``out``.

    Parameters
    ----------
    out : the dataset file, written beside and renamed as every dataset
        (:func:`~hpctrain.data.dataset.write_batches`).
    splits : the files of each split and their labels, in the order to store them.
    classes : K, the number of classes.
    size : S, the side of the stored (3, S, S) images.
    workers : decoding processes; 1 decodes in this process.
    strict : refuse the first unreadable file instead of skipping it.
    progress : where the progress line goes (None: nowhere).

    Raises
    ------
    DatasetError
        ``strict`` and an unreadable file (named), or a split left with no readable image; no
        file is left at ``out`` (an older one stays as it was).
    """
    if size < 1:
        raise DatasetError(f"--size {size} must be at least 1")
    if workers < 1:
        raise DatasetError(f"--workers {workers} must be at least 1")
    report = FolderReport()
    meter = Progress(progress, sum(len(s.files) for s in splits.values()))

    def batches(pool: Any, interrupted: list[bool]
                ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        for name, split in splits.items():
            images: list[np.ndarray] = []
            labels: list[int] = []
            for start, paths, decoded in _decoded(pool, workers, split.files, size,
                                                  interrupted):
                meter.advance(len(decoded))
                for k, (path, result) in enumerate(zip(paths, decoded)):
                    if isinstance(result, str):
                        if strict:
                            raise DatasetError(f"{path} is not a readable image ({result}); "
                                               f"remove it, or convert without --strict to "
                                               f"skip such files")
                        report.bad.append((path, result))
                        continue
                    images.append(result)
                    labels.append(int(split.labels[start + k]))
                if len(images) >= WRITE_IMAGES:
                    yield name, np.stack(images), np.array(labels, np.int64)
                    report.written[name] = report.written.get(name, 0) + len(images)
                    images, labels = [], []
            if images:
                yield name, np.stack(images), np.array(labels, np.int64)
                report.written[name] = report.written.get(name, 0) + len(images)
            if not report.written.get(name):
                raise DatasetError(f"no file of the {name} split is a readable image; "
                                   f"{report.bad_text()}")

    pool = _pool(workers)
    try:
        with _interrupted_between_tasks(pool) as interrupted:
            write_batches(out, (3, size, size), {n: len(s.files) for n, s in splits.items()},
                          batches(pool, interrupted), classes=classes,
                          description=description, dtype=np.uint8, at_most=True)
    except BaseException:
        meter.finish()
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    report.seconds = meter.finish()
    return report


def _decoded(pool: Any, workers: int, files: list[Path], size: int,
             interrupted: list[bool]) -> Iterator[tuple[int, list[Path], list[np.ndarray | str]]]:
    """(start, paths, decoded images or reasons) per task of TASK_FILES files, in file order.

    ``start`` is the index of the task's first file. With a pool, at most TASKS_AHEAD tasks per
    worker are in flight, which bounds the decoded images held in memory.
    """
    tasks = ((start, files[start:start + TASK_FILES])
             for start in range(0, len(files), TASK_FILES))
    if pool is None:
        for start, paths in tasks:
            yield start, paths, _decode_task([str(p) for p in paths], size)
        return
    waiting: deque = deque()

    def submit() -> None:
        for start, paths in tasks:  # at most one
            waiting.append((start, paths,
                            pool.apply_async(_decode_task, ([str(p) for p in paths], size))))
            return

    for _ in range(TASKS_AHEAD * workers):
        submit()
    while waiting:
        start, paths, result = waiting.popleft()
        while True:  # a task that never ends (a worker killed) must not hold Ctrl-C back
            try:
                decoded = result.get(timeout=0.5)
                break
            except multiprocessing.TimeoutError:
                if interrupted[0]:
                    raise KeyboardInterrupt from None
        if interrupted[0]:  # Ctrl-C, noted while the pool ran
            raise KeyboardInterrupt
        submit()
        yield start, paths, decoded


def _pool(workers: int) -> Any:
    """A pool of ``workers`` decoding processes, or None for 1 (decode in this process).

    Forked where the platform can (no interpreter start-up per worker), made before the output
    file is opened, so no worker holds it.
    """
    if workers == 1:
        return None
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    return context.Pool(workers, initializer=_ignore_interrupt)
