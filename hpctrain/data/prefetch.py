"""Reading the next batch while the current one trains: a source that reads one step ahead.

:class:`Prefetched` wraps any :class:`~hpctrain.data.source.DataSource`. When the network asks
for block ``box`` of batch ``step``, it hands back that block and at once asks one background
thread to read block ``box`` of batch ``step + 1``, with the labels of the samples asked for
last, so the read (HDF5 hyperslab, NaN check, conversion to the backend's dtype, copy to the
device) runs while step ``step`` computes. The next call finds the block ready, or waits only
for the rest of its read. A call for any other block (the box or the samples changed, a step
was skipped) drops the block read ahead and reads the one asked for: the numbers are always
those of the wrapped source.

Once wrapped, the source is read by the background thread only, one read at a time, so a
source that is not safe to read from two threads at once (an h5py file) never is. Worked
example of one step on a rank, B = 16, two ranks splitting the batch::

    images(7, ((0, 8), (0, 3), (0, 127), (0, 127)))  -> batch 7's block, read during step 6;
                                                        thread starts batch 8's block
    labels(7, (0, 8))                                -> batch 7's labels, read with its block
    images(8, ...)                                   -> waits for the rest of batch 8's read

On a GPU the thread makes its device copies on the stream and device the network uses, so
they are ordered before every kernel that reads them and memory handed back to CuPy's pool
is reused in order; only the host read overlaps the step's kernels.

An error raised by a read (a ``UserError``) is raised, unchanged, by the call that asks for
that block, as the wrapped source would raise it; ``nonfinite`` (a NaN or Inf, or a damaged
part of the file, noted by the reader) becomes set when the block or the labels that held it
are handed out, as without prefetching.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import weakref
from typing import Any

from hpctrain.data.source import DataSource, is_map_box
from hpctrain.layout.layout import Box

_IMAGES, _LABELS = "images", "labels"
_open_sources: weakref.WeakSet[Prefetched] = weakref.WeakSet()  # closed at interpreter exit


class _Read:
    """One read by the thread: images of ``box`` and labels of ``samples`` of batch ``step``.

    ``results`` maps "images" and "labels" to (value, error) once read; a part not read
    (not asked for, or skipped after the images failed) is absent.
    """

    def __init__(self, step: int, box: Box | None, samples: tuple[int, int] | None,
                 nonfinite_before: str | None) -> None:
        self.step, self.box, self.samples = step, box, samples
        self.nonfinite_before = nonfinite_before  # the source's note before this read
        self.nonfinite_after: str | None = None
        self.labels_note: str | None = None  # the note the labels' read made (a damaged file)
        self.results: dict[str, tuple[Any, BaseException | None]] = {}
        self.done = threading.Event()

    def holds(self, part: str, step: int, key: Any) -> bool:
        """Whether this read asked for ``part`` of batch ``step`` at ``key`` (box or samples)."""
        asked = self.box if part == _IMAGES else self.samples
        return self.step == step and asked is not None and asked == key


class Prefetched:
    """``source``, with the next step's block read by a background thread during each step.

    Parameters
    ----------
    source : the source to read; read by the thread alone from here on, until :meth:`close`.
    cycle : for a held-out split read in ``cycle`` batches in order and then again from the
        first (:class:`~hpctrain.data.source.HeldOutSource`): after the last batch, the first
        is read ahead. None: after batch ``step``, batch ``step + 1``.

    Use as a context manager, or call :meth:`close`: the thread ends and is joined (the
    wrapped source stays open; its owner closes it). A source left open is closed at
    interpreter exit; the thread is a daemon, so it never holds the interpreter up.

    ``hits`` and ``misses`` count the blocks and labels handed out from a read ahead and
    those read on demand. Any other attribute (``batches``, ``sample_shape``, ...) is the
    wrapped source's.

    >>> import numpy as np
    >>> from hpctrain.data.synthetic import SyntheticData
    >>> from hpctrain.device.backend import make_backend
    >>> source = SyntheticData(make_backend("cpu"), (1, 4, 4), classes=3, batch=4)
    >>> with Prefetched(source) as data:
    ...     box = ((0, 2), (0, 1), (0, 4), (0, 4))
    ...     same = [np.array_equal(data.images(s, box), source.images(s, box)) for s in range(3)]
    ...     print(same, data.hits, data.misses)
    [True, True, True] 2 1
    """

    def __init__(self, source: DataSource, cycle: int | None = None) -> None:
        if cycle is not None and cycle < 1:
            raise ValueError(f"cycle {cycle}: give the number of batches (at least 1) or None")
        self.source, self.cycle = source, cycle
        self.nonfinite: str | None = source.nonfinite
        self.hits = self.misses = 0
        self._reads: list[_Read] = []  # asked of the thread and not handed out, in order
        self._served: _Read | None = None  # the read whose images were handed out last
        self._samples: tuple[int, int] | None = None  # the labels asked for last
        self._requests: queue.SimpleQueue[_Read | None] = queue.SimpleQueue()
        self._device = _device_of(source)
        self._thread: threading.Thread | None = threading.Thread(
            target=self._work, name="hpctrain-prefetch", daemon=True)
        self._thread.start()
        _open_sources.add(self)

    # --- the main thread ---------------------------------------------------------------------

    def images(self, step: int, box: Box) -> Any:
        """Block ``box`` of batch ``step`` (see :class:`~hpctrain.data.source.DataSource`);
        starts the read of the same block of the next batch."""
        box = _frozen(box)
        value = self._take(_IMAGES, step, box)
        self._drop_reads(keep=step)
        self._start(self._next(step), box, self._samples)
        return value

    def labels(self, step: int, samples: Any) -> Any:
        """The labels, or targets, of samples lo..hi-1 of batch ``step`` (or block ``samples``
        of its label maps)."""
        samples = (_frozen(samples) if is_map_box(samples)
                   else (int(samples[0]), int(samples[1])))
        self._samples = samples
        value = self._take(_LABELS, step, samples)
        ahead = self._reads[-1] if self._reads else None
        if ahead is not None and ahead.step == self._next(step) and ahead.samples != samples:
            self._start(ahead.step, None, samples)  # its read began before these were known
        return value

    def close(self) -> None:
        """End the thread and join it (after the read under way); idempotent."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._requests.put(None)
            thread.join()
        _open_sources.discard(self)

    def __enter__(self) -> Prefetched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        if name == "source":  # not set yet: no recursion while constructing
            raise AttributeError(name)
        return getattr(self.source, name)

    def _next(self, step: int) -> int:
        return (step + 1) % self.cycle if self.cycle else step + 1

    def _take(self, part: str, step: int, key: Any) -> Any:
        """``part`` of batch ``step`` at ``key``: from a read ahead when one holds it, else
        read now; the read's error, if it failed, is raised here."""
        for read in [self._served, *self._reads]:
            if read is not None and read.holds(part, step, key):
                read.done.wait()
                if part in read.results:
                    self.hits += 1
                    return self._hand_out(part, read)
        self.misses += 1
        if self._thread is None:  # closed: no thread reads the source any more
            value = (self.source.images(step, key) if part == _IMAGES
                     else self.source.labels(step, key))
            self.nonfinite = self.nonfinite or self.source.nonfinite
            return value
        if part == _IMAGES:  # with the labels asked for last, likely the same samples
            self._drop_reads()
            read = self._start(step, key, self._samples)
        else:  # after the reads under way, which are kept
            read = self._start(step, None, key)
        read.done.wait()
        return self._hand_out(part, read)

    def _hand_out(self, part: str, read: _Read) -> Any:
        """``part`` of a finished ``read``, which is forgotten once nothing more of it can be
        asked for: its labels may follow its images."""
        if read in self._reads:
            self._reads.remove(read)
        if part == _IMAGES:
            self._served = read if _LABELS in read.results else None
            self.nonfinite = self.nonfinite or read.nonfinite_after
        else:  # a labels-only read's note is handed out with the labels it struck
            self.nonfinite = self.nonfinite or read.labels_note
            if read is self._served:
                self._served = None
        value, error = read.results[part]
        if error is not None:
            raise error
        return value

    def _start(self, step: int, box: Box | None, samples: tuple[int, int] | None) -> _Read:
        """Ask the thread to read, after the reads already asked for."""
        read = _Read(step, box, samples, self.source.nonfinite)
        if self._thread is not None:
            self._reads.append(read)
            self._requests.put(read)
        return read

    def _drop_reads(self, keep: int | None = None) -> None:
        """Wait for the reads asked for and forget them, all but those of batch ``keep``; a
        NaN noted in images never handed out is forgotten too, so ``nonfinite`` names only
        blocks the network was given."""
        if self._served is not None and self._served.step != keep:
            self._served = None
        dropped = [read for read in self._reads if read.step != keep]
        if not dropped:
            return
        self._reads = [read for read in self._reads if read.step == keep]
        for read in dropped:
            read.done.wait()
        imaged = [read for read in dropped if _IMAGES in read.results]
        if imaged and imaged[0].nonfinite_before is None and not self._reads:  # thread idle
            with contextlib.suppress(AttributeError):  # a source whose note is read-only
                self.source.nonfinite = None

    # --- the thread --------------------------------------------------------------------------

    def _work(self) -> None:
        with self._device():
            while (read := self._requests.get()) is not None:
                try:
                    self._read(read)
                finally:
                    read.nonfinite_after = self.source.nonfinite
                    read.done.set()

    def _read(self, read: _Read) -> None:
        if read.box is not None:
            try:
                read.results[_IMAGES] = (self.source.images(read.step, read.box), None)
            except BaseException as err:  # handed to the main thread, raised there
                read.results[_IMAGES] = (None, err)
                return
        if read.samples is not None:
            before = self.source.nonfinite
            try:
                read.results[_LABELS] = (self.source.labels(read.step, read.samples), None)
                read.labels_note = None if before else self.source.nonfinite
            except BaseException as err:
                read.results[_LABELS] = (None, err)


def _frozen(box: Box) -> Box:
    """``box`` as a tuple of (lo, hi) int tuples, so two equal boxes compare equal."""
    return tuple((int(lo), int(hi)) for lo, hi in box)


def _device_of(source: DataSource) -> Any:
    """A context factory putting the thread on the device and stream the caller uses now.

    CuPy's current device and stream are per thread: the thread's copies go to the same
    stream as the network's kernels, so they are ordered with them.
    """
    backend = getattr(source, "backend", None)
    if backend is None or getattr(backend, "device", "cpu") != "gpu":
        return contextlib.nullcontext
    cuda = backend.xp.cuda
    device, stream = cuda.Device(), cuda.get_current_stream()

    def on_device() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(cuda.Device(device.id))
        stack.enter_context(stream)
        return stack

    return on_device


@atexit.register
def _close_all() -> None:
    """End every thread still reading ahead (a source never closed) before the interpreter
    shuts down."""
    for source in list(_open_sources):
        source.close()
