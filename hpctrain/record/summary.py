"""The per-layer summary of a run log, ``/layers`` and ``/iteration``: predicted and measured
times per layer and per step, rewritten in place while the run goes and read back.

A training run writes the summary of the steps it has timed so far every few steps and again as
it ends (:meth:`~hpctrain.record.runlog.RunLog.timings`), so a run killed on the way keeps the
timings of its steps up to its last write. Every dataset and attribute of the summary is
created with the log (NaN: none written yet), and each write only overwrites
their values in place: no write of the summary adds or removes anything in the file, so a
crash in the middle of one cannot damage what else the log holds.

A write can still be cut short half-way. The summary therefore has a second copy,
``/layers/staged`` (the same datasets, with its own ``iteration`` group), and each write goes in
two phases, each ended by a flush::

    1. the new values into /layers/staged            (/layers still whole)
    2. /layers attribute writing = 1                   (/layers/staged whole)
    3. the new values into /layers and /iteration    (/layers/staged whole)
    4. /layers attribute writing = 0                   (/layers whole again)

so at any moment one of the two copies is whole and ``writing`` (one value rewritten in
place) says which: :func:`read_summary` reads ``/layers/staged`` while it is 1. This holds for a
process killed at any moment (SIGKILL included); the log is never synced to the disk, so a
power cut may lose the last writes, as it may lose the last steps.

A compare-plans log, and a log written before the summary was rewritten in place, hold one
plain copy (no ``writing``, ``last_step`` or ``staged``), written once at the end; it reads the
same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpctrain.record.timing import TIME_FIELDS

SOURCES = ("predicted", "measured", "measured_fastest_rank")
"""The groups under ``/layers``: the prediction, the slowest rank's times and the fastest's."""
STAGED = "staged"  # the second copy, under /layers


@dataclass(frozen=True)
class Summary:
    """One write of the summary: per source (:data:`SOURCES`) each time field of every row
    (the net's layers, then the loss); the predicted and measured seconds per step; the steps
    the times are the medians of, ``first_step`` to ``last_step`` (counted from 1; (0, 0) for a
    log that does not say); ``final``: written as the run ended (False: the run was going on,
    and may have been killed since)."""

    fields: dict[str, dict[str, np.ndarray]]
    iteration: tuple[float, float] | None  # (predicted, measured); None: the log has none
    first_step: int = 0
    last_step: int = 0
    final: bool = True


def create_summary(h5: Any, names: list[str]) -> None:
    """The summary's datasets and attributes in the open log ``h5``, for rows ``names``, with
    nothing written yet (NaN; ``last_step`` 0)."""
    empty = {source: {f: np.full(len(names), np.nan) for f in TIME_FIELDS}
             for source in SOURCES}
    _create_copy(h5, "layers", "iteration", Summary(empty, (np.nan, np.nan), 0, 0, False))
    h5.create_dataset("layers/name", data=np.array(names, dtype="S"))
    h5["layers"].attrs["writing"] = np.int64(0)
    h5["layers"].attrs["rows"] = "layers in network order, then loss"
    _create_copy(h5, f"layers/{STAGED}", f"layers/{STAGED}/iteration", read_copy(h5["layers"],
                                                                                 h5["iteration"]))


def require_summary(h5: Any, names: list[str]) -> None:
    """Make the summary of a log opened again (a resumed run's) one that :func:`write_summary`
    can write: finish a write that was cut short, and give a log from before the summary was
    rewritten in place (or a damaged summary) the layout of :func:`create_summary`, keeping the
    values it holds."""
    layers = h5.get("layers")
    if layers is not None and int(layers.attrs.get("writing", 0)) and _whole(
            layers.get(STAGED), len(names)):
        _fill(_Copy.of(layers, h5["iteration"]),
              read_copy(layers[STAGED], layers[STAGED]["iteration"]))
        layers.attrs.modify("writing", np.int64(0))
        h5.flush()
        return
    if _whole(layers, len(names)) and "iteration" in h5 and _whole(layers.get(STAGED),
                                                                     len(names)):
        return
    kept = (read_copy(layers, h5["iteration"])
            if _whole(layers, len(names)) and "iteration" in h5 else None)
    for name in ("layers", "iteration"):
        if name in h5:
            del h5[name]
    create_summary(h5, names)
    if kept is not None:
        write_summary(h5, kept)
    h5.flush()


class SummaryWriter:
    """The summary of the open log ``h5``, overwritten in place by
    :meth:`~hpctrain.record.summary.SummaryWriter.write`; its datasets are opened once, for
    the run."""

    def __init__(self, h5: Any) -> None:
        self.h5, self.layers = h5, h5["layers"]
        self.staged = _Copy.of(self.layers[STAGED], self.layers[STAGED]["iteration"])
        self.public = _Copy.of(self.layers, h5["iteration"])

    def write(self, summary: Summary) -> None:
        """Write ``summary`` in the two phases of the module doc: a process killed at any
        point leaves one whole copy for :func:`read_summary`."""
        _fill(self.staged, summary)
        self.h5.flush()
        self.layers.attrs.modify("writing", np.int64(1))
        self.h5.flush()
        _fill(self.public, summary)
        self.h5.flush()
        self.layers.attrs.modify("writing", np.int64(0))
        self.h5.flush()


def write_summary(h5: Any, summary: Summary) -> None:
    """Overwrite the summary of the open log ``h5`` in place (:meth:`SummaryWriter.write`)."""
    SummaryWriter(h5).write(summary)


def read_summary(group: Any) -> Summary | None:
    """The summary in ``group`` (a log's root, or a plan's group of a compare-plans log): the
    copy that is whole; None when it holds no timings (none written yet, or none at all)."""
    layers = group.get("layers")
    if layers is None:
        return None
    if int(layers.attrs.get("writing", 0)) and STAGED in layers:
        copy, iteration = layers[STAGED], layers[STAGED].get("iteration")
    else:
        copy, iteration = layers, group.get("iteration")
    if any(f"{source}/{f}" not in copy for source in SOURCES for f in TIME_FIELDS):
        return None
    summary = read_copy(copy, iteration)
    if summary.iteration is not None and np.isnan(summary.iteration[1]):
        return None  # created with the log, never written
    return summary


def read_copy(copy: Any, iteration: Any) -> Summary:
    """The values of one copy: its datasets, and the ``iteration`` group's attributes."""
    attrs = iteration.attrs if iteration is not None else {}
    seconds = ((float(attrs["predicted"]), float(attrs["measured"]))
               if "predicted" in attrs and "measured" in attrs else None)
    return Summary({source: {f: np.asarray(copy[f"{source}/{f}"][()], dtype=float)
                             for f in TIME_FIELDS} for source in SOURCES},
                   seconds, int(copy.attrs.get("first_step", 0)),
                   int(copy.attrs.get("last_step", 0)), bool(copy.attrs.get("final", True)))


def _create_copy(h5: Any, where: str, iteration: str, summary: Summary) -> None:
    for source in SOURCES:
        for f in TIME_FIELDS:
            values = np.asarray(summary.fields[source][f], dtype=np.float64)
            h5.create_dataset(f"{where}/{source}/{f}", data=values).attrs["units"] = "s"
    group = h5.require_group(iteration)
    group.attrs["units"] = "s"
    for key, value in zip(("predicted", "measured"), summary.iteration or (np.nan,) * 2,
                          strict=True):
        group.attrs[key] = np.float64(value)
    _stamp(h5[where], summary, create=True)


@dataclass
class _Copy:
    """One copy of the summary, opened: its group, its iteration group, its datasets."""

    group: Any
    iteration: Any
    datasets: dict[tuple[str, str], Any] = field(default_factory=dict)  # (source, field)
    rows: int = 0

    @classmethod
    def of(cls, group: Any, iteration: Any) -> _Copy:
        datasets = {(source, f): group[f"{source}/{f}"] for source in SOURCES
                    for f in TIME_FIELDS}
        return cls(group, iteration, datasets, len(next(iter(datasets.values()))))


def _fill(copy: _Copy, summary: Summary) -> None:
    """Overwrite one copy's values in place (same shapes and types: nothing is allocated)."""
    from h5py import h5s

    for (source, f), dataset in copy.datasets.items():
        values = np.ascontiguousarray(summary.fields[source][f], dtype=np.float64)
        if values.shape != (copy.rows,):
            raise ValueError(f"{values.shape} values of {source} {f} for a summary of "
                             f"{copy.rows} rows")
        dataset.id.write(h5s.ALL, h5s.ALL, values)  # the whole dataset: a tenth of ds[...] =
    for key, value in zip(("predicted", "measured"), summary.iteration or (np.nan,) * 2,
                          strict=True):
        copy.iteration.attrs.modify(key, np.float64(value))
    _stamp(copy.group, summary, create=False)


def _stamp(copy: Any, summary: Summary, create: bool) -> None:
    """The steps a copy's times come from, and whether the run had ended."""
    for key, value in (("first_step", summary.first_step), ("last_step", summary.last_step),
                       ("final", int(summary.final))):
        if create:
            copy.attrs[key] = np.int64(value)
        else:
            copy.attrs.modify(key, np.int64(value))


def _whole(copy: Any, rows: int) -> bool:
    """Whether ``copy`` (a group or None) holds every dataset of a copy, each of ``rows``."""
    return copy is not None and all(
        f"{source}/{f}" in copy and copy[f"{source}/{f}"].shape == (rows,)
        for source in SOURCES for f in TIME_FIELDS)
