"""Measured time: seconds inside MPI data movement, and per-layer times of training steps.

The comm clock on the backend (:class:`~hpctrain.device.clock.CommClock`) adds up the seconds spent
inside the communication primitives (the MPI calls with the packing and host staging around
them). A :class:`StepTimer`
reads it together with ``perf_counter`` at each layer boundary of a step, so each layer's time
splits into compute (its wall time less the communication inside it) and its own communication
(ΔW all-reduce, halo exchange), and each redistribution feeding a layer is timed on its own.
These are the per-layer quantities the planner predicts, measured in real steps.

Summaries: :func:`median_times` over steps, :func:`max_over_ranks` (the slowest rank sets the
pace) and :func:`format_table`. All times are in seconds; the table prints milliseconds.
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


def median_times(steps: Sequence[StepTimes]) -> StepTimes:
    """The median over ``steps`` of every field (steps of one network: same rows)."""
    if not steps:
        raise ValueError("median_times needs at least one step")
    return steps[0].from_array(np.median([s.to_array() for s in steps], axis=0))


def over_ranks(times: StepTimes, comm: Any, op: str = "max") -> StepTimes:
    """The largest (``op="max"``) or smallest (``"min"``) value over the ranks of ``comm`` of
    every field: one ``Allreduce``. Collective: every rank passes a record of the same network.

    The largest is what a synchronous step pays: the slowest rank sets the pace. The smallest
    communication time is what the last rank to arrive at a collective sees: the transfer
    itself, without the wait for late ranks that an α–β model does not describe.
    """
    from mpi4py import MPI

    local = times.to_array()
    reduced = np.empty_like(local)
    comm.Allreduce(local, reduced, op={"max": MPI.MAX, "min": MPI.MIN}[op])
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


def summary_over_ranks(times: StepTimes, seconds: float, comm: Any,
                       root: int = 0) -> RanksSummary | None:
    """:class:`RanksSummary` of this step at ``root`` (None elsewhere); collective.

    Two reductions (MAX and SUM) of one flat record per rank: O(log P) messages of a fixed
    size, never P records at one rank.
    """
    from mpi4py import MPI

    comm_seconds = sum(row.forward_comm + row.backward_comm for row in times.rows)
    shares = [comm_seconds / seconds, times.data / seconds] if seconds else [0.0, 0.0]
    local = np.append(times.to_array(), [seconds, *shares])
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
    reading covers the time since the previous one. On a GPU every reading first waits for the
    queued device work (``backend.sync``), so each part is charged its own kernels.

    Parameters
    ----------
    backend : the backend whose clock the primitives add to.
    times : the record to fill; rows are addressed by layer index, or :data:`LOSS`.
    """

    def __init__(self, backend: Backend, times: StepTimes | None) -> None:
        self.backend, self.times = backend, times

    def __enter__(self) -> StepTimer:
        if self.times is not None:
            clock = self.backend.clock
            self._was_enabled, clock.enabled = clock.enabled, True
            self.backend.sync()
            self._start = self._wall = perf_counter()
            self._comm = clock.seconds
            self._bytes = clock.bytes_sent
            if clock.intervals:  # comm before this timer belongs to no span of it
                clock.intervals.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.times is not None:
            self.backend.clock.enabled = self._was_enabled

    def _lap(self, key: int | str, phase: int, category: int) -> tuple[float, float]:
        """Wall and comm-clock seconds since the previous reading; the bytes sent since then
        are added to row ``key``. With a timeline, the part is one span of ``category`` and,
        for a layer (``COMPUTE``), each communication inside it one more."""
        self.backend.sync()
        clock = self.backend.clock
        wall, comm = perf_counter(), clock.seconds
        lap = (wall - self._wall, comm - self._comm)
        self._row(key).bytes_sent += clock.bytes_sent - self._bytes
        spans = self.times.spans
        if spans is not None:
            row = len(self.times.layers) if key == LOSS else key
            spans.append((row, phase, category, self._wall, wall))
            if clock.intervals:
                if category == COMPUTE:
                    spans += [(row, phase, COMMUNICATION, *i) for i in clock.intervals]
                clock.intervals.clear()
        self._wall, self._comm, self._bytes = wall, comm, clock.bytes_sent
        return lap

    def _row(self, key: int | str) -> LayerTimes:
        return self.times.loss if key == LOSS else self.times.layers[key]

    def forward_move(self, key: int | str, move: Redistribute) -> None:
        """``move`` (feeding row ``key``) has just run forward; a move that moves nothing (the
        identity) is not timed."""
        if self.times is not None and move.move.moves_data:
            self._row(key).forward_redistribution += self._lap(key, 0, REDISTRIBUTION)[0]

    def backward_move(self, key: int | str, move: Redistribute) -> None:
        """``move`` (feeding row ``key``) has just run backward."""
        if self.times is not None and move.move.moves_data:
            self._row(key).backward_redistribution += self._lap(key, 1, REDISTRIBUTION)[0]

    def forward_layer(self, key: int | str) -> None:
        """Row ``key``'s forward has just run: its wall time less comm is compute."""
        if self.times is not None:
            wall, comm = self._lap(key, 0, COMPUTE)
            row = self._row(key)
            row.forward_compute += max(wall - comm, 0.0)  # never below 0 by rounding
            row.forward_layer_comm += comm

    def backward_layer(self, key: int | str) -> None:
        """Row ``key``'s backward has just run."""
        if self.times is not None:
            wall, comm = self._lap(key, 1, COMPUTE)
            row = self._row(key)
            row.backward_compute += max(wall - comm, 0.0)
            row.backward_layer_comm += comm

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Add the wall time of the ``with`` block, a read of the step's data, to ``data``.

        Queued device work is waited for at both ends, so the read is charged only its own.
        """
        if self.times is None:
            yield
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
        """Record the wall time since this timer was entered as the whole step."""
        if self.times is not None:
            self.backend.sync()
            self.times.step += perf_counter() - self._start
