"""Measured time: seconds inside MPI data movement, and per-layer times of training steps.

The comm clock on the backend (:class:`~hpctrain.device.clock.CommClock`) adds up the seconds spent
inside the communication primitives (the MPI calls with the packing and host staging around
them). A :class:`StepTimer`
reads it together with ``perf_counter`` at each layer boundary of a step, so each layer's time
splits into compute (its wall time less the communication inside it) and its own communication
(ΔW all-reduce, halo exchange), and each redistribution feeding a layer is timed on its own.
These are the per-layer quantities the planner predicts, measured in real steps. On a GPU the
boundaries are device events instead, read once at the end of the step (see :class:`StepTimer`),
so timing adds no wait for the device inside a step.

Summaries: :func:`median_times` over steps (:class:`StepRecords` keeps a run's steps for
them), :func:`max_over_ranks` (the slowest rank sets the pace), :func:`measured_over_ranks`
(both, as a run reports them) and :func:`format_table`. All times are in seconds; the table
prints milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from hpctrain.comm.redistribute import Redistribute
    from hpctrain.device.backend import Backend
    from hpctrain.device.clock import CommClock, DeviceEvents

LOSS = "loss"  #: the key of the loss row in a StepTimer

# A timeline span: (row, phase, category, start, end), the row a layer's index (len(layers) for
# the loss), phase and category indices into these, start and end perf_counter seconds.
PHASES = ("forward", "backward")
CATEGORIES = ("compute", "communication", "redistribution", "gradient sum in flight")
COMPUTE, COMMUNICATION, REDISTRIBUTION, IN_FLIGHT = range(4)


@dataclass
class LayerTimes:
    """One layer's seconds in one step (or a summary of several), split as the planner predicts.

    ``*_redistribution`` is the move feeding the layer (forward: all-gather, slice or
    exchange; backward: its adjoint). ``*_layer_comm`` is communication inside the layer: halo
    waits forward, the ΔW all-reduce and halo gradients backward. ``*_compute`` is the layer's
    wall time less its own communication. For the loss row: the move to the loss layout, the
    softmax, and the all-reduce of loss and accuracy.

    ``bytes_sent``: what this rank handed to MPI as send buffers for the layer and the move
    feeding it, both directions (its block of an all-gather, the whole buffer of a
    reduce-scatter or all-reduce, its outgoing pieces of an exchange, its halo rows).
    """

    name: str
    forward_compute: float = 0.0
    forward_redistribution: float = 0.0
    forward_layer_comm: float = 0.0
    backward_compute: float = 0.0
    backward_layer_comm: float = 0.0
    backward_redistribution: float = 0.0
    bytes_sent: float = 0.0

    @property
    def forward_comm(self) -> float:
        """The move feeding the layer plus the communication inside its forward."""
        return self.forward_redistribution + self.forward_layer_comm

    @property
    def backward_comm(self) -> float:
        """The communication inside the layer's backward plus the move's backward."""
        return self.backward_layer_comm + self.backward_redistribution

    @property
    def redistribution(self) -> float:
        return self.forward_redistribution + self.backward_redistribution

    @property
    def total(self) -> float:
        return self.forward_compute + self.forward_comm + self.backward_compute + self.backward_comm


TIME_FIELDS = tuple(f.name for f in fields(LayerTimes) if f.name not in ("name", "bytes_sent"))
RECORD_FIELDS = (*TIME_FIELDS, "bytes_sent")  #: every number of a row, in field order
COMM_FIELDS = tuple(f for f in TIME_FIELDS if "compute" not in f)  # own comm + redistribution


@dataclass
class StepTimes:
    """Per-layer times of a step, in network order, with the loss row and the whole step.

    ``step`` is the wall time of the whole forward, loss and backward (data generation included,
    and the optimizer's updates when the network makes them during the backward, as training
    does); what the rows do not cover is the data and interpreter overhead. ``data`` is the
    part of the step spent waiting for the step's input block and labels: the whole read from
    the source, or, when a :class:`~hpctrain.data.prefetch.Prefetched` source read them during
    the step before, only the wait for that read to finish.
    """

    layers: list[LayerTimes]
    loss: LayerTimes = field(default_factory=lambda: LayerTimes(LOSS))
    step: float = 0.0
    spans: list[tuple[int, int, int, float, float]] | None = None  # a list: keep a timeline
    data: float = 0.0  # seconds spent in the source's images() and labels()
    # on a GPU, while a step is timed: the parts its device events bound, not yet read
    pending: DeviceLaps | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def blank(cls, names: Sequence[str]) -> StepTimes:
        """An all-zero record for layers ``names``."""
        return cls([LayerTimes(name) for name in names])

    @property
    def rows(self) -> list[LayerTimes]:
        return [*self.layers, self.loss]

    def to_array(self) -> np.ndarray:
        """Every number as one flat float64 array: the fields of each row in turn, then ``step``
        and ``data``."""
        values = [getattr(row, f) for row in self.rows for f in RECORD_FIELDS]
        return np.array([*values, self.step, self.data], dtype=np.float64)

    def from_array(self, values: np.ndarray) -> StepTimes:
        """A record with this one's names and the times of ``values`` (as :meth:`to_array`)."""
        values = np.asarray(values, dtype=np.float64)
        width = len(RECORD_FIELDS)
        if values.shape != (len(self.rows) * width + 2,):
            raise ValueError(f"{values.shape} values do not fit {len(self.rows)} rows of "
                             f"{width} numbers, the step and the data wait")
        rows = [LayerTimes(row.name, *map(float, values[k * width:(k + 1) * width]))
                for k, row in enumerate(self.rows)]
        return StepTimes(rows[:-1], rows[-1], float(values[-2]), data=float(values[-1]))

    def as_dict(self) -> dict[str, Any]:
        """``{"layers": {name: {field: s}}, "loss": {field: s}, "step": s, "data": s}`` in plain
        floats."""
        def row_dict(row: LayerTimes) -> dict[str, float]:
            return {f: float(getattr(row, f)) for f in RECORD_FIELDS}

        return {"layers": {row.name: row_dict(row) for row in self.layers},
                "loss": row_dict(self.loss), "step": float(self.step),
                "data": float(self.data)}


@dataclass
class DeviceLaps:
    """The parts of one step bounded by device events (indices into ``events``), read at the
    step's end.

    ``laps``: (row key, phase, category, start, end, comm blocks) of each part, the blocks the
    (start, end) pairs the comm clock marked inside it; ``reads``: (start, end) of each read
    of the step's data; ``origin``: the event recorded when the step's first timer was entered,
    at ``host_origin`` (``perf_counter`` seconds), which places a timeline's spans.
    """

    events: DeviceEvents
    origin: int
    host_origin: float
    laps: list[tuple[int | str, int, int, int, int, list[tuple[int, int]]]] = field(
        default_factory=list)
    reads: list[tuple[int, int]] = field(default_factory=list)


def median_times(steps: Sequence[StepTimes]) -> StepTimes:
    """The median over ``steps`` of every field (steps of one network: same rows)."""
    if not steps:
        raise ValueError("median_times needs at least one step")
    return steps[0].from_array(np.median([s.to_array() for s in steps], axis=0))


class StepRecords:
    """Every step's record (:meth:`StepTimes.to_array`) and wall seconds, a row per step of
    one growing array: the medians over the steps so far are one pass over numbers, however
    often they are taken while the run goes on."""

    def __init__(self) -> None:
        self._rows = np.empty((0, 0))
        self.count = 0

    def add(self, record: np.ndarray, seconds: float) -> None:
        """The next step's row: ``record`` (as :meth:`StepTimes.to_array`), then ``seconds``."""
        if self.count == len(self._rows):  # full: double it
            grown = np.empty((max(64, 2 * self.count), record.size + 1))
            if self.count:
                grown[:self.count] = self._rows
            self._rows = grown
        self._rows[self.count, :-1] = record
        self._rows[self.count, -1] = seconds
        self.count += 1

    def median(self) -> np.ndarray:
        """Each column's median over the steps after the first, which pays one-off
        allocation and warm-up (the only step when there is one)."""
        if self.count == 0:
            raise ValueError("StepRecords.median needs at least one step")
        return np.median(self._rows[1 if self.count > 1 else 0:self.count], axis=0)


def measured_over_ranks(template: StepTimes, records: StepRecords, comm: Any,
                        runs: list[bool] | None = None) -> tuple[StepTimes, StepTimes, float]:
    """The per-layer times of the steps ``records`` holds, as a run reports them: each field's
    median over the steps after the first, then the largest over the ranks of ``comm`` and the
    smallest (``runs`` as for :func:`over_ranks`), and the median wall seconds of a step, the
    largest over ranks. ``template`` names the rows. Collective: two ``Allreduce`` of one record.
    """
    from mpi4py import MPI

    typical = records.median()
    slowest = np.empty_like(typical)
    comm.Allreduce(typical, slowest, op=MPI.MAX)
    fastest = over_ranks(template.from_array(typical[:-1]), comm, "min", runs)
    return template.from_array(slowest[:-1]), fastest, float(slowest[-1])


def over_ranks(times: StepTimes, comm: Any, op: str = "max",
               runs: list[bool] | None = None) -> StepTimes:
    """The largest (``op="max"``) or smallest (``"min"``) value over the ranks of ``comm`` of
    every field: one ``Allreduce``. Collective: every rank passes a record of the same network.

    The largest is what a synchronous step pays: the slowest rank sets the pace. The smallest
    communication time is what the last rank to arrive at a collective sees: the transfer
    itself, without the wait for late ranks that an α–β model does not describe. ``runs``
    says, per layer row, whether this rank runs the layer (one on a group of ranks it is not
    in: its zeros count in neither extreme).
    """
    from mpi4py import MPI

    local = times.to_array()
    width = len(RECORD_FIELDS)
    if runs is not None and op == "min":
        for k, running in enumerate(runs):
            if not running:
                local[k * width:(k + 1) * width] = np.inf
    reduced = np.empty_like(local)
    comm.Allreduce(local, reduced, op={"max": MPI.MAX, "min": MPI.MIN}[op])
    reduced[np.isinf(reduced)] = 0.0
    return times.from_array(reduced)


@dataclass
class RanksSummary:
    """One step over all ranks, as rank 0 logs it.

    ``largest`` and ``mean``: (rows, fields) arrays, each field of :data:`RECORD_FIELDS` of
    each row, the largest and the mean over ranks; ``seconds``: the slowest rank's step (it
    sets the pace); ``comm_fraction``: the mean over ranks of the share of its step each rank
    spent communicating; ``data_seconds``: the longest wait for the step's data over the ranks
    (:attr:`StepTimes.data`); ``data_fraction``: the mean over ranks of the share of its step
    each rank spent waiting for its data.
    """

    largest: np.ndarray
    mean: np.ndarray
    seconds: float
    comm_fraction: float
    data_seconds: float = 0.0
    data_fraction: float = 0.0


def summary_over_ranks(times: StepTimes, seconds: float, comm: Any, root: int = 0,
                       record: np.ndarray | None = None) -> RanksSummary | None:
    """:class:`RanksSummary` of this step at ``root`` (None elsewhere); collective.
    ``record``: ``times.to_array()`` when the caller has it already.

    Two reductions (MAX and SUM) of one flat record per rank: O(log P) messages of a fixed
    size, never P records at one rank.
    """
    from mpi4py import MPI

    comm_seconds = sum(row.forward_comm + row.backward_comm for row in times.rows)
    shares = [comm_seconds / seconds, times.data / seconds] if seconds else [0.0, 0.0]
    local = np.append(times.to_array() if record is None else record, [seconds, *shares])
    largest = np.empty_like(local) if comm.Get_rank() == root else None
    total = np.empty_like(local) if comm.Get_rank() == root else None
    comm.Reduce(local, largest, op=MPI.MAX, root=root)
    comm.Reduce(local, total, op=MPI.SUM, root=root)
    if comm.Get_rank() != root:
        return None
    mean = total / comm.Get_size()
    rows, width = len(times.rows), len(RECORD_FIELDS)

    def table(values: np.ndarray) -> np.ndarray:
        return values[:rows * width].reshape(rows, width)

    return RanksSummary(table(largest), table(mean), float(largest[-3]), float(mean[-2]),
                        float(largest[-4]), float(mean[-1]))


def max_over_ranks(times: StepTimes, comm: Any) -> StepTimes:
    """:func:`over_ranks` with ``op="max"``."""
    return over_ranks(times, comm, "max")


def format_table(times: StepTimes) -> str:
    """A plain-text table of ``times`` in milliseconds, one row per layer, then loss and sums.

    The comm columns include the redistribution, which the last column shows on its own
    (forward and backward together). The last line gives the whole step: on one rank's record
    the rows add up to less (data generation and interpreter overhead are in no row); on a
    summary taken field by field (median, or largest over ranks) they may add up to more.
    """
    width = max(len(row.name) for row in [*times.rows, LayerTimes("total")])
    header = (f"{'layer':<{width}} {'fwd compute':>11} {'fwd comm':>9} {'bwd compute':>11} "
              f"{'bwd comm':>9} {'redistribution':>14}")

    def line(name: str, cells: tuple[float, ...]) -> str:
        a, b, c, d, e = (v * 1e3 for v in cells)
        return f"{name:<{width}} {a:11.3f} {b:9.3f} {c:11.3f} {d:9.3f} {e:14.3f}"

    def cells(row: LayerTimes) -> tuple[float, ...]:
        return (row.forward_compute, row.forward_comm, row.backward_compute, row.backward_comm,
                row.redistribution)

    table = [header] + [line(row.name, cells(row)) for row in times.rows]
    sums = tuple(sum(column) for column in zip(*(cells(row) for row in times.rows)))
    table.append(line("total", sums))
    covered = sum(sums[:4])
    table.append(f"whole step {times.step * 1e3:.3f} ms; the rows add up to "
                 f"{covered * 1e3:.3f} ms; waiting for data {times.data * 1e3:.3f} ms; comm "
                 f"includes redistribution")
    return "\n".join(table)


class StepTimer:
    """Fills a :class:`StepTimes` while a network runs; does nothing when ``times`` is None.

    Use as a context manager around the timed code (it enables the backend's comm clock, and
    restores it after), and call the method for each part just after the part has run: each
    reading covers the time since the previous one. Timers nest (a step's, then its forward's,
    loss's and backward's) and fill the same record.

    On the CPU each reading is ``perf_counter`` and the comm clock's seconds. On a GPU (the
    comm clock has device events) waiting for the device at every reading would stop the host
    from queuing the next layer's kernels while the device runs this one; so each reading
    records an event on the stream instead, and the events are read once: in
    :meth:`finish_step`, after one wait for the last, or when the step's outermost timer exits.
    Each part is then the device's time between its two boundaries: its own kernels, any
    kernels queued before it that were still running when it began, and any time the device sat
    idle waiting for the host to queue the part's work (the Python cost of a layer too small to
    keep the device busy). The communication inside a part is the device's time between the
    events the comm clock records around each block: where MPI is staged through the host the
    copy out waits for the stream, so that is the movement itself; a collective queued on the
    stream (NCCL) is timed as the device runs it. A timeline's spans are placed on the host's
    clock from the event recorded as the step's first timer is entered, taken to be reached then
    (the device has caught up at the end of the step before).

    Parameters
    ----------
    backend : the backend whose clock the primitives add to.
    times : the record to fill; rows are addressed by layer index, or :data:`LOSS`.
    """

    def __init__(self, backend: Backend, times: StepTimes | None) -> None:
        self.backend, self.times = backend, times
        self._owner = False  # whether this timer began the record's device laps

    def __enter__(self) -> StepTimer:
        if self.times is not None:
            clock = self.backend.clock
            self._was_enabled, clock.enabled = clock.enabled, True
            if clock.events is not None:
                self._enter_on_device(clock, clock.events)
            else:
                self.backend.sync()
                self._start = self._wall = perf_counter()
                self._comm = clock.seconds
            self._bytes = clock.bytes_sent
            if clock.intervals:  # comm before this timer belongs to no span of it
                clock.intervals.clear()
        return self

    def _enter_on_device(self, clock: CommClock, events: DeviceEvents) -> None:
        self._owner = self.times.pending is None
        if self._owner:  # the step's first timer: its events start afresh
            events.clear()
        self._start = perf_counter()
        self._mark = events.record()
        if self._owner:
            self.times.pending = DeviceLaps(events, self._mark, self._start)
        clock.marks.clear()  # comm before this timer belongs to no part of it

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self.times is not None:
            clock = self.backend.clock
            clock.enabled = self._was_enabled
            if self._owner:
                if exc_type is None and (self.times.pending.laps or self.times.pending.reads):
                    clock.events.wait()
                    self._resolve()
                self.times.pending = None
                clock.events.clear()
                clock.marks.clear()

    def _lap(self, key: int | str, phase: int, category: int) -> None:
        """Charge row ``key`` the part since the previous reading (or, on a GPU, note it for the
        step's end), and the bytes sent since then."""
        clock = self.backend.clock
        self._row(key).bytes_sent += clock.bytes_sent - self._bytes
        self._bytes = clock.bytes_sent
        if clock.events is not None:
            end = clock.events.record()
            self.times.pending.laps.append((key, phase, category, self._mark, end, clock.marks))
            clock.marks = []
            self._mark = end
            return
        self.backend.sync()
        wall, comm = perf_counter(), clock.seconds
        self._charge(key, phase, category, wall - self._wall, comm - self._comm, self._wall,
                     wall, clock.intervals or ())
        if self.times.spans is not None and clock.intervals:
            clock.intervals.clear()
        self._wall, self._comm = wall, comm

    def _charge(self, key: int | str, phase: int, category: int, wall: float, comm: float,
                start: float, end: float, intervals: Sequence[tuple[float, float]]) -> None:
        """Add a part of ``wall`` seconds, ``comm`` of them communication, to row ``key``: all
        of it to the redistribution, or the comm to the layer's comm and the rest to its
        compute. With a timeline, the part is one span (``start``, ``end``) of ``category`` and,
        for a layer (``COMPUTE``), each communication inside it (``intervals``) one more."""
        row = self._row(key)
        if category == REDISTRIBUTION:
            if phase == 0:
                row.forward_redistribution += wall
            else:
                row.backward_redistribution += wall
        elif phase == 0:
            row.forward_compute += max(wall - comm, 0.0)  # never below 0 by rounding
            row.forward_layer_comm += comm
        else:
            row.backward_compute += max(wall - comm, 0.0)
            row.backward_layer_comm += comm
        spans = self.times.spans
        if spans is not None:
            index = len(self.times.layers) if key == LOSS else key
            spans.append((index, phase, category, start, end))
            if category == COMPUTE:
                spans += [(index, phase, COMMUNICATION, *i) for i in intervals]

    def _resolve(self) -> None:
        """Charge every part noted since the events were last read (call after their wait):
        each its device time, the comm blocks inside it its comm."""
        pending, clock = self.times.pending, self.backend.clock
        seconds = pending.events.seconds()
        shift = pending.host_origin - seconds[pending.origin]  # device seconds to perf_counter
        timeline = self.times.spans is not None
        for key, phase, category, start, end, blocks in pending.laps:
            comm = sum(seconds[e] - seconds[s] for s, e in blocks)
            clock.seconds += comm
            intervals = [(seconds[s] + shift, seconds[e] + shift) for s, e in blocks
                         ] if timeline else []
            self._charge(key, phase, category, seconds[end] - seconds[start], comm,
                         seconds[start] + shift, seconds[end] + shift, intervals)
        for start, end in pending.reads:
            self.times.data += seconds[end] - seconds[start]
        pending.laps, pending.reads = [], []

    def _row(self, key: int | str) -> LayerTimes:
        return self.times.loss if key == LOSS else self.times.layers[key]

    def forward_move(self, key: int | str, move: Redistribute) -> None:
        """``move`` (feeding row ``key``) has just run forward; a move that moves nothing (the
        identity) is not timed."""
        if self.times is not None and move.move.moves_data:
            self._lap(key, 0, REDISTRIBUTION)

    def backward_move(self, key: int | str, move: Redistribute) -> None:
        """``move`` (feeding row ``key``) has just run backward."""
        if self.times is not None and move.move.moves_data:
            self._lap(key, 1, REDISTRIBUTION)

    def forward_layer(self, key: int | str) -> None:
        """Row ``key``'s forward has just run: its wall time less comm is compute."""
        if self.times is not None:
            self._lap(key, 0, COMPUTE)

    def backward_layer(self, key: int | str) -> None:
        """Row ``key``'s backward has just run."""
        if self.times is not None:
            self._lap(key, 1, COMPUTE)

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Add the time of the ``with`` block, a read of the step's data, to ``data``.

        On the CPU, queued device work is waited for at both ends, so the read is charged only
        its own. On a GPU the read is bounded by events: what it adds is the time the device
        spent waiting for it (and for its copy to the device), none where the read overlapped
        kernels queued before it.
        """
        if self.times is None:
            yield
            return
        clock = self.backend.clock
        if clock.events is not None:
            start = clock.events.record()
            try:
                yield
            finally:
                self._mark = clock.events.record()  # the next part starts after the read
                self.times.pending.reads.append((start, self._mark))
                clock.marks.clear()
            return
        self.backend.sync()
        start = perf_counter()
        try:
            yield
        finally:
            self.backend.sync()
            self.times.data += perf_counter() - start
            # the next lap (the first layer's, or the loss's) starts after the read
            self._wall, self._comm = perf_counter(), self.backend.clock.seconds

    def finish_step(self) -> None:
        """Record the wall time since this timer was entered as the whole step; on a GPU, wait
        once, for an event recorded now (after everything the step queued), and read every
        part's time."""
        if self.times is not None:
            events = self.backend.clock.events
            if events is None:
                self.backend.sync()
            else:
                events.record()  # the step's end: in no part
                events.wait()
            self.times.step += perf_counter() - self._start
            if events is not None:
                self._resolve()
