"""Folders of image files, one sub-folder per class, decoded into a uint8 dataset file.

The layout is ImageNet's ``train/CLASS/*.JPEG``: the classes are the names of the sub-folders
of the folder, sorted (class k is the k-th name), and a class's samples are the files directly
in its sub-folder, sorted by name. Hidden names (starting with ".") are passed over.

Each image is decoded with Pillow, converted to RGB, and its centre square (side the shorter
side) resized to S x S with Pillow's antialiased bilinear filter: the shorter side resized to S,
then centre-cropped to S x S, in one resampling. A JPEG is first decoded at the smallest DCT
scale that keeps both sides at least S (``Image.draft``), which makes big photos several times
faster to decode. Samples are stored as uint8 (3, S, S) in
the format of :mod:`hpctrain.data.dataset_format` (version 3, with the training split's per-channel
mean and std).

Decoding runs on worker processes, each with a pipe of its own (``_Workers``); results
are written in file order, so the file is the same, byte for byte, for any number of workers.
At most a few batches of decoded images are held at a time, fitted to the memory available
(:func:`plan_pipeline`). A file Pillow cannot decode is listed and skipped (or, ``strict``,
refused); names are shown escaped (:func:`~hpctrain.errors.shown_path`). A worker that dies
ends the run with a :class:`~hpctrain.errors.Failure`; Ctrl-C and SIGTERM stop it between
tasks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing
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

from hpctrain.cost.memory import available_bytes
from hpctrain.data.dataset_format import DatasetError
from hpctrain.data.dataset_writer import write_batches
from hpctrain.errors import (
    STOPS,
    Failure,
    Terminated,
    one_line,
    shown,
    shown_path,
    stop_if_terminated,
    stops_held_for_a_fork,
    take_held_stops,
)
from hpctrain.io.units import format_bytes

PILLOW_HINT = "pip install hpctrain[images]"
TASK_FILES = 16  # files per task handed to a worker (fewer for big images: TASK_BYTES)
TASK_BYTES = 16 << 20  # decoded pixels per task, at most (but one image at least)
TASKS_AHEAD = 4  # tasks in flight per worker: bounds the decoded images held in memory
WRITE_IMAGES = 256  # decoded images handed to the file at a time (fewer for big images)
WRITE_BYTES = 64 << 20  # decoded pixels handed to the file at a time (one image at least)
DECODE_COPIES = 3  # S x S x 3 images a worker holds while making one (resized, array, (3, S, S))
SHOWN_BAD = 5  # unreadable files named in the summary
WAIT_SECONDS = 0.5  # how often a wait for a task looks for a signal or a lost worker
CLOSE_SECONDS = 10.0  # how long closing waits for the workers before it kills them
# Pillow modes of pixels wider than 8 bits with no range to scale by: 32-bit floats and
# integers (TIFF, FITS, ...); uint8 storage would clip them to black or white
UNSCALED_MODES = {"F": "32-bit floating-point", "I": "32-bit integer"}



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
    """The sorted names of the sub-folders of ``root``, its classes.

    A name need not be UTF-8 (Python keeps its bytes as surrogate escapes): a class is its
    index, and a message or the file's description shows the name escaped.
    """
    if not root.is_dir():
        raise DatasetError(f"{flag} {shown_path(root)} is not a directory; give a folder with "
                           f"one sub-folder of images per class")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DatasetError(f"{flag} {shown_path(root)} has no sub-folders; give a folder with "
                           f"one sub-folder of images per class (ImageNet's train/CLASS/*.JPEG)")
    return classes


def folder_files(root: Path, classes: Sequence[str], flag: str,
                 allow_empty: bool = True) -> ImageFiles:
    """The files of ``root``'s class sub-folders, labelled by their index in ``classes``.

    A sub-folder whose name is not in ``classes`` is refused (a held-out folder must have the
    training folder's classes; it may lack some). Without ``allow_empty`` a class sub-folder
    with no file is refused too, naming it: it would be a class the net is asked to tell apart
    but never sees (a download that failed, a typo in a folder's name).
    """
    index = {name: k for k, name in enumerate(classes)}
    files: list[Path] = []
    labels: list[int] = []
    empty: list[str] = []
    for name in folder_classes(root, flag):
        if name not in index:
            raise DatasetError(f"{flag} {shown_path(root)} has class {shown(name)}, which is "
                               f"not a class of --image-folder; give the same class sub-folders "
                               f"in both")
        found = sorted(p for p in (root / name).iterdir()
                       if p.is_file() and not p.name.startswith("."))
        if not found:
            empty.append(name)
        files += found
        labels += [index[name]] * len(found)
    if not files:
        raise DatasetError(f"{flag} {shown_path(root)} has no files in its class sub-folders")
    if empty and not allow_empty:
        more = f" and {len(empty) - 1} more" if len(empty) > 1 else ""
        raise DatasetError(f"{flag} {shown_path(root)} has {len(empty)} empty class "
                           f"sub-folder{'s' * (len(empty) > 1)}, {shown(empty[0])}{more}: a "
                           f"class with no image; remove {'them' if more else 'it'}, or pass "
                           f"--allow-empty to keep such classes")
    return ImageFiles(files, np.array(labels, np.int64))


@dataclass(frozen=True)
class Pipeline:
    """How many decoded images a conversion holds at once: ``workers`` decoding processes,
    ``task_files`` files per task, ``tasks_ahead`` tasks in flight per worker and
    ``write_images`` images handed to the file at a time, for images of ``image_bytes``."""

    workers: int
    task_files: int
    tasks_ahead: int
    write_images: int
    image_bytes: int

    @property
    def peak_bytes(self) -> int:
        """The most bytes of decoded pixels held at once.

        Each worker's tasks in flight (their images waiting to be written) and the images it
        is making (DECODE_COPIES), and the images of one write, twice (gathered, then stacked
        into one array).
        """
        per_worker = (self.tasks_ahead * self.task_files + DECODE_COPIES) * self.image_bytes
        return self.workers * per_worker + 2 * self.write_images * self.image_bytes


def plan_pipeline(size: int, files: int, workers: int | None,
                  available: float | None = None) -> Pipeline:
    """The :class:`Pipeline` for ``files`` images of side ``size``, sized to the memory.

    ``workers`` is ``--workers`` (None: the default, every CPU this process may use, fewer
    where memory is short). No more workers are started than there are tasks. Big images get
    fewer images per task and per write, so that what is held stays near TASK_BYTES per task
    and WRITE_BYTES per write; then fewer tasks ahead and fewer workers, until it fits in
    ``available`` bytes (default: MemAvailable, :func:`~hpctrain.cost.memory.available_bytes`).

    Raises
    ------
    DatasetError
        More ``workers`` than this process may use CPUs, or than fit in memory, or a ``size``
        of which even one image at a time does not fit, naming what one image needs.
    """
    cpus = available_cpus()
    if workers is not None and workers > cpus:
        raise DatasetError(f"--workers {workers}: this process may use {cpus} "
                           f"CPU{'s' * (cpus > 1)} (its CPU affinity), so more decoding "
                           f"processes only compete for them; give --workers {cpus} or fewer")
    available = available_bytes() if available is None else available
    image_bytes = 3 * size * size
    task_files = max(1, min(TASK_FILES, TASK_BYTES // image_bytes))
    tasks = max(1, -(-files // task_files))
    chosen = min(cpus if workers is None else workers, tasks)
    pipeline = Pipeline(chosen, task_files, TASKS_AHEAD,
                        max(1, min(WRITE_IMAGES, WRITE_BYTES // image_bytes)), image_bytes)
    smallest = Pipeline(1, 1, 1, 1, image_bytes)
    if smallest.peak_bytes > available:
        copies = smallest.peak_bytes // image_bytes
        fits = math.isqrt(int(available // (3 * copies)))
        raise DatasetError(f"--size {size}: one {size} x {size} image needs "
                           f"{format_bytes(image_bytes)} (3 bytes a pixel), held about {copies} "
                           f"times over while it is decoded and written, "
                           f"{format_bytes(smallest.peak_bytes)} in all: more than the "
                           f"{format_bytes(available)} of memory available; choose --size "
                           f"{fits} or less")
    for fewer in (dict(tasks_ahead=1), dict(write_images=1), dict(task_files=1)):
        if pipeline.peak_bytes <= available:
            break
        pipeline = dataclasses.replace(pipeline, **fewer)
    writer = 2 * pipeline.write_images * image_bytes
    per_worker = (pipeline.peak_bytes - writer) // pipeline.workers
    fitting = max(1, int((available - writer) // per_worker))
    if pipeline.workers > fitting:
        if workers is not None:
            raise DatasetError(f"--workers {workers} with --size {size}: each worker holds "
                               f"about {format_bytes(per_worker)} of "
                               f"{format_bytes(image_bytes)} images, and {pipeline.workers} "
                               f"need more than the {format_bytes(available)} of memory "
                               f"available; give --workers {fitting} or fewer, or a smaller "
                               f"--size")
        pipeline = dataclasses.replace(pipeline, workers=fitting)
    return pipeline


def decode(path: str, size: int) -> np.ndarray | str:
    """The image at ``path`` as uint8 (3, size, size), or why it cannot be read.

    RGB; its centre square (side the shorter side) resized to size x size with the antialiased
    bilinear filter.
    """
    from PIL import Image

    try:
        with Image.open(path) as image:
            wide = UNSCALED_MODES.get(image.mode)
            # a PNG holds at most 16 bits, clipped as torchvision does (see the docs)
            if wide is not None and image.format != "PNG":
                return (f"mode {image.mode} ({wide} pixels), which 8-bit storage would clip "
                        f"to black or white; convert it to 8 bits first")
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
    """Worker set-up: Ctrl-C reaches the parent, which stops the workers; SIGTERM, which the
    parent sends them then (``_Workers.close``), ends a worker at once (the parent's handler,
    inherited by the fork, would raise in it instead); then the stops held across the fork
    (:func:`~hpctrain.errors.stops_held_for_a_fork`)."""
    take_held_stops(signal.SIG_IGN, signal.SIG_DFL)


@contextlib.contextmanager
def _interrupted_between_tasks(pool: _Workers | None) -> Iterator[list[int]]:
    """While a pool runs, Ctrl-C and SIGTERM are noted (the signal's number, in the list
    yielded) rather than raised: raised anywhere inside the pool's machinery, they can leave
    its result thread waiting forever and ``terminate`` hanging; :func:`_decoded` raises them
    between tasks instead (:func:`_stop`)."""
    noted = [0]
    if pool is None or threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(signum: int, frame: Any) -> None:
        noted[0] = noted[0] or signum

    previous = {sig: signal.signal(sig, note) for sig in STOPS}
    try:
        yield noted
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop(signum: int) -> KeyboardInterrupt:
    """What a noted signal raises: ``KeyboardInterrupt`` for Ctrl-C, ``Terminated`` (one) for
    SIGTERM."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def available_cpus() -> int:
    """How many CPUs this process may run on."""
    from hpctrain.device.cpus import affinity

    return len(affinity())


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
    workers: int = 1  # decoding processes used (1: this one)

    def bad_text(self) -> str:
        """'skipped 2 unreadable files: a/x.jpg (why), b/y.txt (why)', or ''; on one line
        whatever the names hold (:func:`~hpctrain.errors.shown_path`)."""
        if not self.bad:
            return ""
        shown = ", ".join(f"{shown_path(path)} ({one_line(why, 120)})"
                          for path, why in self.bad[:SHOWN_BAD])
        more = f", and {len(self.bad) - SHOWN_BAD} more" if len(self.bad) > SHOWN_BAD else ""
        return f"skipped {len(self.bad)} unreadable file{'s' * (len(self.bad) > 1)}: {shown}{more}"


def write_folder(out: Path, splits: dict[str, ImageFiles], classes: int, size: int, *,
                 workers: int | None = 1, strict: bool = False, description: str = "",
                 progress: TextIO | None = sys.stderr) -> FolderReport:
    """Decode the images of ``splits`` ("train", optionally "val") and write them to ``out``.

    Parameters
    ----------
    out : the dataset file, written beside and renamed as every dataset
        (:func:`~hpctrain.data.dataset_writer.write_batches`).
    splits : the files of each split and their labels, in the order to store them.
    classes : K, the number of classes.
    size : S, the side of the stored (3, S, S) images.
    workers : decoding processes; 1 decodes in this process; None: every CPU this process
        may use, as memory allows (:func:`plan_pipeline`, which also bounds ``size``).
    strict : refuse the first unreadable file instead of skipping it.
    progress : where the progress line goes (None: nowhere).

    Raises
    ------
    DatasetError
        ``strict`` and an unreadable file (named), or a split left with no readable image; no
        file is left at ``out`` (an older one stays as it was). Before any work: ``size`` or
        ``workers`` beyond what this process may use (:func:`plan_pipeline`).
    Failure
        A decoding process was lost (killed), or decoding ran out of memory.
    """
    if size < 1:
        raise DatasetError(f"--size {size} must be at least 1")
    if workers is not None and workers < 1:
        raise DatasetError(f"--workers {workers} must be at least 1")
    total = sum(len(s.files) for s in splits.values())
    pipeline = plan_pipeline(size, total, workers)
    report = FolderReport(workers=pipeline.workers)
    meter = Progress(progress, total)

    def batches(pool: _Workers | None, interrupted: list[int]
                ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        for name, split in splits.items():
            images: list[np.ndarray] = []
            labels: list[int] = []
            for start, paths, decoded in _decoded(pool, pipeline, split.files, size,
                                                  interrupted):
                meter.advance(len(decoded))
                for k, (path, result) in enumerate(zip(paths, decoded)):
                    if isinstance(result, str):
                        if strict:
                            raise DatasetError(f"{shown_path(path)} is not a readable image "
                                               f"({one_line(result, 120)}); remove it, or "
                                               f"convert without --strict to skip such files")
                        report.bad.append((path, result))
                        continue
                    images.append(result)
                    labels.append(int(split.labels[start + k]))
                if len(images) >= pipeline.write_images:
                    yield name, np.stack(images), np.array(labels, np.int64)
                    report.written[name] = report.written.get(name, 0) + len(images)
                    images, labels = [], []
            if images:
                yield name, np.stack(images), np.array(labels, np.int64)
                report.written[name] = report.written.get(name, 0) + len(images)
            if not report.written.get(name):
                raise DatasetError(f"no file of the {name} split is a readable image; "
                                   f"{report.bad_text()}")

    # 1: decode in this process
    pool = _Workers(pipeline.workers) if pipeline.workers > 1 else None
    finished = False
    try:
        with _interrupted_between_tasks(pool) as interrupted:
            write_batches(out, (3, size, size), {n: len(s.files) for n, s in splits.items()},
                          batches(pool, interrupted), classes=classes,
                          description=description, dtype=np.uint8, at_most=True)
        finished = True
    except BaseException:
        meter.finish()
        raise
    finally:
        if pool is not None:
            pool.close(finished)
    report.seconds = meter.finish()
    return report


def _decoded(pool: _Workers | None, pipeline: Pipeline, files: list[Path], size: int,
             interrupted: list[int]) -> Iterator[tuple[int, list[Path], list[np.ndarray | str]]]:
    """(start, paths, decoded images or reasons) per task of ``pipeline.task_files`` files, in
    file order.

    ``start`` is the index of the task's first file. With a pool, at most
    ``pipeline.tasks_ahead`` tasks per worker are in flight, which bounds the decoded images
    held in memory. A worker that dies (killed, or by the out-of-memory killer) fails the
    tasks in flight, and a ``MemoryError`` in decoding ends the run too: either raises
    :class:`~hpctrain.errors.Failure`.
    """
    step = pipeline.task_files
    tasks = ((start, files[start:start + step]) for start in range(0, len(files), step))
    if pool is None:
        for start, paths in tasks:
            stop_if_terminated()  # between tasks, as with a pool, not after a batch of them
            try:
                decoded = _decode_task([str(p) for p in paths], size)
            except MemoryError:
                raise _out_of_memory(size) from None
            yield start, paths, decoded
        return
    # task k goes to worker k % n, and each worker answers its tasks in order, so the results
    # come back in file order by reading the workers in turn
    waiting: deque = deque()

    def send() -> None:
        for start, paths in tasks:  # at most one
            worker = pool.send([str(p) for p in paths], size)
            waiting.append((start, paths, worker))
            return

    for _ in range(pipeline.tasks_ahead * pipeline.workers):
        send()
    while waiting:
        start, paths, worker = waiting.popleft()
        decoded = pool.receive(worker, interrupted)
        if interrupted[0]:  # Ctrl-C or SIGTERM, noted while the pool ran
            raise _stop(interrupted[0])
        send()
        yield start, paths, decoded


def _out_of_memory(size: int) -> Failure:
    return Failure(f"decoding {size} x {size} images ran out of memory (other processes took "
                   f"what was available when the run began); run again with fewer --workers "
                   f"or a smaller --size")


class _Workers:
    """``workers`` decoding processes, each with a pipe of its own.

    Not a ``multiprocessing.Pool`` or a ``concurrent.futures`` pool: their workers share one
    queue of tasks and one of results, so a worker killed (SIGKILL, the out-of-memory killer)
    while it holds the queue's lock, or half-way through writing a result, leaves the pool
    waiting for good, and ``terminate`` too. With a pipe per worker, a dead worker's pipe
    reads as closed: its loss is seen at once, and ending the others is safe.

    Task k goes to worker k % n (:meth:`send`), which answers its tasks in order
    (:meth:`receive`). Forked where the platform can (no interpreter start-up per worker), and
    all started here, before the output file is opened, so no worker holds it.
    """

    def __init__(self, workers: int) -> None:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        self.processes: list[Any] = []
        self.pipes: list[Any] = []
        self.sent = 0
        try:
            for k in range(workers):
                ours, theirs = context.Pipe()
                # the worker closes the parent's ends it inherits (its own and earlier
                # workers'), so that each pipe reads as closed once the parent is gone
                process = context.Process(target=_work, args=(theirs, [*self.pipes, ours]),
                                          daemon=True, name=f"hpctrain-decode-{k}")
                with stops_held_for_a_fork():
                    process.start()
                theirs.close()  # the worker's end is the worker's alone: closed when it dies
                self.processes.append(process)
                self.pipes.append(ours)
        except BaseException:
            self.close(finished=False)
            raise

    def send(self, paths: list[str], size: int) -> int:
        """Hand the task of decoding ``paths`` to the next worker in turn; that worker."""
        worker = self.sent % len(self.processes)
        self.sent += 1
        try:
            self.pipes[worker].send((paths, size))
        except OSError:  # its pipe is closed: the worker died
            raise self.lost(worker) from None
        return worker

    def receive(self, worker: int, interrupted: list[int]) -> list[np.ndarray | str]:
        """The answer of ``worker`` to the oldest task it holds. While waiting, a noted signal
        is raised (:func:`_stop`); a worker that died raises :meth:`lost`, a ``MemoryError``
        in it :func:`_out_of_memory`."""
        pipe = self.pipes[worker]
        while True:
            if interrupted[0]:
                raise _stop(interrupted[0])
            try:
                if not pipe.poll(WAIT_SECONDS):
                    continue
                ok, answer = pipe.recv()
            except (EOFError, OSError):  # closed: the worker died, perhaps mid-answer
                if interrupted[0]:  # SIGTERM to the process group kills the workers too
                    raise _stop(interrupted[0]) from None
                raise self.lost(worker) from None
            if not ok:
                raise _out_of_memory(answer)
            return answer

    def lost(self, worker: int) -> Failure:
        """The error that ends a run whose ``worker`` died, saying how (e.g. 'pid 123 killed by
        SIGKILL')."""
        process = self.processes[worker]
        process.join(timeout=1)
        code = process.exitcode
        how = f"pid {process.pid} ended"
        if code is not None and code < 0 and -code in signal.valid_signals():
            how = f"pid {process.pid} killed by {signal.Signals(-code).name}"
        elif code:
            how = f"pid {process.pid} ended with status {code}"
        return Failure(f"a decoding worker process was lost ({how}), perhaps to the "
                       f"out-of-memory killer; nothing was written; run again, with fewer "
                       f"--workers or a smaller --size if memory is short")

    def close(self, finished: bool) -> None:
        """Tell the workers to exit when ``finished``; otherwise end them at once (SIGTERM)
        rather than wait for the tasks they hold. Then wait for each, :data:`CLOSE_SECONDS`
        in all: one still running then (stopped, or stuck in a read) is killed, so that
        closing never waits for good."""
        for pipe, process in zip(self.pipes, self.processes, strict=True):
            if finished:
                with contextlib.suppress(OSError):
                    pipe.send(None)
            elif process.exitcode is None:
                process.terminate()
        deadline = time.monotonic() + CLOSE_SECONDS
        for pipe, process in zip(self.pipes, self.processes, strict=True):
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.kill()
                process.join(CLOSE_SECONDS)
            pipe.close()


def _work(pipe: Any, parents: list[Any]) -> None:
    """A decoding worker: answer each task from ``pipe`` with ``(True, decoded)``, or
    ``(False, size)`` after a ``MemoryError``, until None or a closed pipe (the parent gone).

    ``parents`` are the parent's ends of the pipes, which a forked worker inherits: closed
    here, or this worker's pipe would never read as closed when the parent dies.
    """
    _ignore_interrupt()
    for end in parents:
        end.close()
    try:
        while (task := pipe.recv()) is not None:
            paths, size = task
            try:
                answer = (True, _decode_task(paths, size))
            except MemoryError:
                answer = (False, size)
            pipe.send(answer)
    except (EOFError, OSError):  # the parent is gone: nothing to answer
        pass
