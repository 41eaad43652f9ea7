"""The comm clock: seconds and bytes inside MPI data movement, summed while enabled.

A leaf module (it imports nothing from hpctrain): the backend carries a clock to every
communication primitive, and :mod:`hpctrain.record.timing` reads it at layer boundaries. On a
GPU the clock marks each block with device events (:class:`DeviceEvents`) instead of reading
the host's clock, so timing never makes the host wait for the device.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any


class DeviceEvents:
    """Events recorded in order on the device's current stream, from a pool kept for the run.

    An event is done once the device has run everything queued on the stream before it was
    recorded, and the device notes when. The time between two events is therefore the device's
    time between those two points of the host's program: it includes any work queued before the
    first that was still running when the host recorded it (earlier layers' kernels, say), and
    any time the device sat idle waiting for the host to queue more.

    :meth:`record` takes the next event of the pool (made on first use, then reused step after
    step: a step records the same events every time) and returns its index; :meth:`wait` waits
    once, for the last event; :meth:`seconds` then gives the time of every event since the
    first; :meth:`clear` returns them all to the pool.

    Parameters
    ----------
    cuda : CuPy's ``cupy.cuda`` (``Event``, ``get_elapsed_time``).
    """

    __slots__ = ("_cuda", "_pool", "count")

    def __init__(self, cuda: Any) -> None:
        self._cuda = cuda
        self._pool: list[Any] = []
        self.count = 0  # events recorded since the last clear

    def record(self) -> int:
        """Record the next event on the current stream; its index."""
        if self.count == len(self._pool):
            self._pool.append(self._cuda.Event())
        self._pool[self.count].record()
        self.count += 1
        return self.count - 1

    def wait(self) -> None:
        """Wait for the device to reach the last event recorded (and so every earlier one: the
        stream runs in order)."""
        if self.count:
            self._pool[self.count - 1].synchronize()

    def seconds(self) -> list[float]:
        """Seconds from the first event recorded to each, in index order (``[]`` when none is
        recorded). Call after :meth:`wait`: the device knows an event's time once it is done."""
        if not self.count:
            return []
        first, elapsed = self._pool[0], self._cuda.get_elapsed_time
        return [0.0, *(elapsed(first, event) * 1e-3 for event in self._pool[1:self.count])]

    def clear(self) -> None:
        """Hand every event back to the pool (their times are no longer needed)."""
        self.count = 0


class CommClock:
    """Seconds spent inside communication, summed while ``enabled``.

    Each primitive wraps its data movement in ``with clock.comm(): ...``. Nested blocks count
    once (only the outermost is timed). While disabled a block costs one attribute test, so the
    clock can stay on the backend of untimed runs. ``sync``, when set, runs at the start and end
    of each outermost block so the clock measures the movement itself rather than compute still
    queued on a device. ``intervals``, when a list, gets the (start, end) ``perf_counter``
    readings of each outermost block (for a timeline; each
    :class:`~hpctrain.record.timing.StepTimer` lap takes them and clears the list).

    ``events``, when set (on a GPU), replaces both: each outermost block records a device event
    at its start and end and appends their indices to ``marks``, and neither ``seconds`` nor
    ``intervals`` changes until the :class:`~hpctrain.record.timing.StepTimer` of the step reads
    the events at its end, takes ``marks`` and adds their seconds. No block waits for the device
    then: where MPI is staged through the host the copy out waits anyway, and a collective
    queued on the stream (NCCL) is timed by the device between the two events. The span starts
    when the device has finished the work queued before the block (see :class:`DeviceEvents`).

    Examples
    --------
    >>> clock = CommClock()
    >>> clock.enabled = True
    >>> with clock.comm():
    ...     pass
    >>> clock.seconds >= 0.0
    True
    """

    __slots__ = ("enabled", "seconds", "bytes_sent", "sync", "intervals", "events", "marks",
                 "_depth", "_start", "_start_mark")

    def __init__(self, sync: Callable[[], None] | None = None,
                 events: DeviceEvents | None = None) -> None:
        self.enabled = False
        self.seconds = 0.0
        self.bytes_sent = 0
        self.sync = sync
        self.intervals: list[tuple[float, float]] | None = None
        self.events = events
        self.marks: list[tuple[int, int]] = []  # (start, end) event indices of each block
        self._depth = 0
        self._start = 0.0
        self._start_mark = 0

    def use_device_events(self, cuda: Any) -> None:
        """Mark blocks with device events of ``cuda`` (CuPy's ``cupy.cuda``) from now on; a
        clock that has them already keeps them (a backend copied with it shares its pool)."""
        if self.events is None:
            self.events = DeviceEvents(cuda)

    def comm(self) -> CommClock:
        """A context manager timing the communication inside it (the clock itself)."""
        return self

    def sent(self, nbytes: int) -> None:
        """Count ``nbytes`` this rank handed to MPI to send (while enabled)."""
        if self.enabled:
            self.bytes_sent += int(nbytes)

    def __enter__(self) -> CommClock:
        if self.enabled:
            if self._depth == 0:
                if self.events is not None:
                    self._start_mark = self.events.record()
                else:
                    if self.sync is not None:
                        self.sync()
                    self._start = perf_counter()
            self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        if self._depth:  # entered while enabled, even if disabled since
            self._depth -= 1
            if self._depth == 0:
                if self.events is not None:
                    self.marks.append((self._start_mark, self.events.record()))
                    return
                if self.sync is not None:
                    self.sync()
                end = perf_counter()
                self.seconds += end - self._start
                if self.intervals is not None:
                    self.intervals.append((self._start, end))
