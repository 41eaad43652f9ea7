"""The comm clock: seconds and bytes inside MPI data movement, summed while enabled.

A leaf module (it imports nothing from hpctrain): the backend carries a clock to every
communication primitive, and :mod:`hpctrain.record.timing` reads it at layer boundaries.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter


class CommClock:
    """Seconds spent inside communication, summed while ``enabled``.

    Each primitive wraps its data movement in ``with clock.comm(): ...``. Nested blocks count
    once (only the outermost is timed). While disabled a block costs one attribute test, so the
    clock can stay on the backend of untimed runs. ``sync``, when set (on a GPU), runs at the
    start and end of each outermost block so the clock measures the movement itself rather than
    compute still queued on the device. ``intervals``, when a list, gets the (start, end)
    ``perf_counter`` readings of each outermost block (for a timeline; each
    :class:`~hpctrain.record.timing.StepTimer` lap takes them and clears the list).

    Examples
    --------
    >>> clock = CommClock()
    >>> clock.enabled = True
    >>> with clock.comm():
    ...     pass
    >>> clock.seconds >= 0.0
    True
    """

    __slots__ = ("enabled", "seconds", "bytes_sent", "sync", "intervals", "_depth", "_start")

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.enabled = False
        self.seconds = 0.0
        self.bytes_sent = 0
        self.sync = sync
        self.intervals: list[tuple[float, float]] | None = None
        self._depth = 0
        self._start = 0.0

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
                if self.sync is not None:
                    self.sync()
                self._start = perf_counter()
            self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        if self._depth:  # entered while enabled, even if disabled since
            self._depth -= 1
            if self._depth == 0:
                if self.sync is not None:
                    self.sync()
                end = perf_counter()
                self.seconds += end - self._start
                if self.intervals is not None:
                    self.intervals.append((self._start, end))
