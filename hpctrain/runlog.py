"""HDF5 run logs: what was planned, what was predicted, what was measured, step by step.

One file per run, written by rank 0 only. :class:`RunLog` creates it before the first step and
extends and flushes it after every step, so a job killed at any moment (even by SIGKILL) keeps
every step it logged; its ``status`` attribute says "running" until the run ends. Readable with
plain h5py (``h5py.File("run.h5")["steps/loss"][:]``), also while the run goes on: the writer
takes no HDF5 file lock, so a reader is not refused, and sees the file as of the last flush.
Layout (units in each dataset's ``units`` attribute)::

    /                         attrs: command, config (JSON of every option), version,
                              git_commit, mpi_library, mpi_version, processes, net, batch,
                              dtype, device, machine, machine_profile (TOML text), plan (text),
                              predicted_iteration (s), status, started, finished
    /plan/layer               (L,)     layer names in network order
    /plan/mode, /plan/grid    (L,), (L, 2)  each layer's mode and Pr x Pc (0 x 0: follows)
    /steps/step               (n,)     the step's number: after it, that many steps are done
    /steps/loss, accuracy     (n,)     mean training loss and accuracy of the step's batch
    /steps/seconds            (n,)     wall time of the step, the slowest rank
    /steps/images_per_second  (n,)     batch / seconds
    /steps/lr                 (n,)     learning rate used
    /steps/comm_fraction      (n,)     communication seconds / step seconds, mean over ranks
    /steps/layers/name        (L+1,)   the rows: layers, then "loss"
    /steps/layers/F/max       (n, L+1) field F of each row in each step, largest over ranks
    /steps/layers/F/mean      (n, L+1) the same, mean over ranks
    /validation/step, loss, accuracy  (m,)  held-out evaluation after that many steps
    /layers/...               at the end: per layer the predicted and measured times
                              (:func:`write_timings`), as written by compare-plans
    /iteration                attrs: predicted, measured (s)

with F one of forward_compute, backward_compute, forward_layer_comm, backward_layer_comm,
forward_redistribution, backward_redistribution (seconds; see
:class:`hpctrain.timing.LayerTimes`) and bytes_sent (bytes).

A resumed run (``--resume`` with the same ``--log``) on the same P and plan opens the file
again, drops the rows after the checkpoint's step, and goes on appending: one log for the whole
training (``resumed`` lists each resume). Otherwise an existing file is never overwritten: it is
first renamed to ``NAME.1.h5`` (or the first free number), and a resume on another P or plan
starts a log of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.files import replace_atomically
from hpctrain.locations import checkout_root
from hpctrain.planner import PlannedNetwork
from hpctrain.timing import COMM_FIELDS, RECORD_FIELDS, TIME_FIELDS, StepTimes

STEP_SERIES = {"step": ("i8", "1"), "loss": ("f8", "1"), "accuracy": ("f8", "1"),
               "seconds": ("f8", "s"), "images_per_second": ("f8", "1/s"), "lr": ("f8", "1"),
               "comm_fraction": ("f8", "1")}
VALIDATION_SERIES = {"step": ("i8", "1"), "loss": ("f8", "1"), "accuracy": ("f8", "1")}


def predicted_fields(planned: PlannedNetwork) -> dict[str, np.ndarray]:
    """The prediction per layer (and the loss), in the measured fields' terms."""
    rows = [*planned.layers, planned.loss]
    return {
        "forward_compute": np.array([c.compute[0] for c in rows]),
        "backward_compute": np.array([c.compute[1] for c in rows]),
        "forward_layer_comm": np.array([c.comm[0] for c in rows]),
        "backward_layer_comm": np.array([c.comm[1] for c in rows]),
        "forward_redistribution": np.array([c.redistribution[0] for c in rows]),
        "backward_redistribution": np.array([c.redistribution[1] for c in rows]),
    }


def measured_fields(times: StepTimes) -> dict[str, np.ndarray]:
    rows = [*times.layers, times.loss]
    return {f: np.array([getattr(r, f) for r in rows]) for f in TIME_FIELDS}


def communication(fields: dict[str, np.ndarray]) -> np.ndarray:
    """Per layer: its own communication and the redistribution feeding it, both directions."""
    return sum(fields[f] for f in COMM_FIELDS)


def write_timings(group: Any, planned: PlannedNetwork, measured: StepTimes,
                  fastest_rank: StepTimes, iteration_measured: float) -> None:
    """Predicted and measured per-layer times into an open h5py group."""
    names = [c.layer for c in planned.layers] + ["loss"]
    group.create_dataset("layers/name", data=np.array(names, dtype="S"))
    for kind, values in (("predicted", predicted_fields(planned)),
                         ("measured", measured_fields(measured)),
                         ("measured_fastest_rank", measured_fields(fastest_rank))):
        for name, data in values.items():
            group.create_dataset(f"layers/{kind}/{name}", data=data).attrs["units"] = "s"
    iteration = group.require_group("iteration")
    iteration.attrs["predicted"] = planned.iteration_time
    iteration.attrs["measured"] = iteration_measured
    iteration.attrs["units"] = "s"


def write_hdf5(path: Path, fill: Callable[[Any], None]) -> None:
    """Create the HDF5 file ``path`` with ``fill(h5file)``; replace it only when complete."""
    import h5py

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as h5:
            fill(h5)

    replace_atomically(path, write)


def git_commit() -> str:
    """The commit of the source checkout hpctrain runs from ("+dirty" when modified), or
    "unknown": always outside a git checkout of hpctrain itself (an installed wheel, even one
    inside some other repository), without calling git."""
    root = checkout_root()
    if root is None or not (root / ".git").exists():  # .git is a file in a git worktree
        return "unknown"
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty=+dirty",
                              "--abbrev=40"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def free_name(path: Path) -> Path:
    """``run.h5`` → the first of ``run.1.h5``, ``run.2.h5``, … that does not exist."""
    number = 1
    while (candidate := path.with_name(f"{path.stem}.{number}{path.suffix}")).exists():
        number += 1
    return candidate


def _same_run(path: Path, attrs: dict[str, Any]) -> bool:
    """Whether the log at ``path`` is of a run on the same P, net and plan as ``attrs``."""
    import h5py

    if not path.exists():
        return False
    try:
        with h5py.File(path, "r", locking=False) as h5:
            return all(str(h5.attrs.get(k)) == str(attrs.get(k))
                       for k in ("processes", "net", "plan"))
    except OSError:  # not a readable log: keep it aside, start afresh
        return False


class RunLog:
    """The run's HDF5 log (rank 0 only), extended and flushed after every step.

    Parameters
    ----------
    path : the log file. Without ``resume_step`` an existing file is renamed aside first.
    attrs : root attributes (strings, numbers; dicts are stored as JSON).
    planned : the plan with its predictions.
    rows : the names of the per-layer rows: layers in network order, then "loss".
    resume_step : continue this file from this step (rows at or after it are dropped); a
        missing file is created.
    """

    def __init__(self, path: Path, attrs: dict[str, Any], planned: PlannedNetwork,
                 rows: list[str], resume_step: int | None = None) -> None:
        import h5py

        self.path, self.rows = Path(path), rows
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and _same_run(self.path, attrs):
            self.h5 = h5py.File(self.path, "a", locking=False)
            self._truncate(resume_step)
        else:
            if self.path.exists():
                os.replace(self.path, free_name(self.path))
            self.h5 = h5py.File(self.path, "w", locking=False)
            self._create(planned)
        for key, value in attrs.items():
            self.h5.attrs[key] = json.dumps(value) if isinstance(value, dict) else value
        self.h5.attrs["status"] = "running"
        now = datetime.now(UTC).isoformat(timespec="seconds")
        if "started" in self.h5.attrs:  # a resumed run: one log for the whole training
            earlier = self.h5.attrs.get("resumed", "")
            self.h5.attrs["resumed"] = f"{earlier}at step {resume_step}, {now}\n"
        else:
            self.h5.attrs["started"] = now
        self.h5.flush()

    def _create(self, planned: PlannedNetwork) -> None:
        h5 = self.h5
        names = [p.layer for p in planned.plans]
        h5.create_dataset("plan/layer", data=np.array(names, dtype="S"))
        h5.create_dataset("plan/mode", data=np.array([p.mode for p in planned.plans], dtype="S"))
        grids = [p.grid if p.mode != "follow" else (0, 0) for p in planned.plans]
        h5.create_dataset("plan/grid", data=np.array(grids, dtype="i8"))
        for name, values in predicted_fields(planned).items():
            h5.create_dataset(f"plan/predicted/{name}", data=values).attrs["units"] = "s"
        h5["plan"].attrs["rows"] = "predicted/*: layers in network order, then loss"
        for name, (dtype, units) in STEP_SERIES.items():
            self._series(f"steps/{name}", (), dtype, units)
        h5.create_dataset("steps/layers/name", data=np.array(self.rows, dtype="S"))
        for name in RECORD_FIELDS:
            for stat in ("max", "mean"):
                units = "bytes" if name == "bytes_sent" else "s"
                self._series(f"steps/layers/{name}/{stat}", (len(self.rows),), "f8", units)
        for name, (dtype, units) in VALIDATION_SERIES.items():
            self._series(f"validation/{name}", (), dtype, units)

    def _series(self, name: str, row_shape: tuple[int, ...], dtype: str, units: str) -> None:
        """An empty dataset that grows by one row at a time."""
        chunk = max(1, 4096 // max(1, int(np.prod(row_shape))))
        ds = self.h5.create_dataset(name, shape=(0, *row_shape), maxshape=(None, *row_shape),
                                    chunks=(chunk, *row_shape), dtype=dtype)
        ds.attrs["units"] = units

    def _truncate(self, resume_step: int) -> None:
        """Drop the rows after the checkpoint: the resumed run logs those steps again."""
        import h5py

        for group in ("steps", "validation"):
            keep = int(np.searchsorted(self.h5[f"{group}/step"][:], resume_step, side="right"))

            def cut(_: str, item: Any, keep: int = keep) -> None:
                if isinstance(item, h5py.Dataset) and item.maxshape[0] is None:
                    item.resize(keep, axis=0)  # every series that grows by a row a step

            self.h5[group].visititems(cut)

    def _append(self, name: str, value: Any) -> None:
        ds = self.h5[name]
        ds.resize(ds.shape[0] + 1, axis=0)
        ds[-1] = value

    def step(self, values: dict[str, float], largest: np.ndarray, mean: np.ndarray) -> None:
        """One row of every step series; ``largest`` and ``mean``: (rows, fields) arrays of
        every field of :data:`RECORD_FIELDS` over the ranks (see
        :class:`~hpctrain.timing.RanksSummary`)."""
        for name in STEP_SERIES:
            self._append(f"steps/{name}", values[name])
        for k, name in enumerate(RECORD_FIELDS):
            self._append(f"steps/layers/{name}/max", largest[:, k])
            self._append(f"steps/layers/{name}/mean", mean[:, k])
        self.h5.flush()

    def validation(self, step: int, loss: float, accuracy: float) -> None:
        for name, value in (("step", step), ("loss", loss), ("accuracy", accuracy)):
            self._append(f"validation/{name}", value)
        self.h5.flush()

    def finish(self, status: str, summary: Callable[[Any], None] | None = None) -> None:
        """Set the final status, add the end-of-run summary (``summary(h5)``), close."""
        if summary is not None:
            for name in ("layers", "iteration"):
                if name in self.h5:
                    del self.h5[name]  # a resumed run's summary replaces the earlier one
            summary(self.h5)
        self.h5.attrs["status"] = status
        self.h5.attrs["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        self.close()

    def close(self) -> None:
        if self.h5.id.valid:
            self.h5.close()
