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
                              layers (the net's layers as text: NetSpec.architecture),
                              classes (the width of its output: a changed net's, --classes),
                              predicted_iteration (s), status, started, finished
    /plan/layer               (L,)     layer names in network order
    /plan/mode, /plan/grid    (L,), (L, 2)  each layer's mode and Pr x Pc (0 x 0: follows)
    /steps/step               (n,)     the step's number: after it, that many steps are done
    /steps/loss, accuracy     (n,)     mean training loss and accuracy of the step's batch
    /steps/seconds            (n,)     wall time of the step, the slowest rank
    /steps/images_per_second  (n,)     batch / seconds
    /steps/lr                 (n,)     learning rate used
    /steps/comm_fraction      (n,)     communication seconds / step seconds, mean over ranks
    /steps/data_wait_seconds  (n,)     time the step waited for its input block and labels
                                       (the whole read, or with prefetching the wait for the
                                       read ahead), the slowest rank
    /steps/data_fraction      (n,)     data wait seconds / step seconds, mean over ranks
    /steps/layers/name        (L+1,)   the rows: layers, then "loss"
    /steps/layers/F/max       (n, L+1) field F of each row in each step, largest over ranks
    /steps/layers/F/mean      (n, L+1) the same, mean over ranks
    /validation/step, loss, accuracy  (m,)  held-out evaluation after that many steps (a
                                       segmentation's accuracy is per pixel)
    /validation/mean_iou      (m,)     a segmentation's held-out mean IoU (only there)
    /layers/name              (L+1,)   the rows: layers, then "loss"
    /layers/S/F               (L+1,)   field F of each row: S predicted, measured (median
                              over the steps timed, then the slowest rank) or
                              measured_fastest_rank; attrs of /layers: first_step,
                              last_step (the steps timed), final (1: written as the run
                              ended), writing (see :mod:`hpctrain.record.summary`)
    /iteration                attrs: predicted, measured (s per step; NaN: none timed yet)
    /layers/staged/...        the second copy of the two above, for a write cut short
    /timeline/spans           (k, 6)   with --timeline: rank, row (index into
                              /timeline/rows), phase, category (indices into the attributes
                              phases and categories), start, end (s from a common origin)
    /timeline/steps, rows     the steps recorded (counted from 1); the row names

with F one of forward_compute, backward_compute, forward_layer_comm, backward_layer_comm,
forward_redistribution, backward_redistribution (seconds; see
:class:`hpctrain.record.timing.LayerTimes`) and bytes_sent (bytes).

``/layers`` and ``/iteration`` are written every ``train --timings-every`` steps (at its
checkpoints too) and as the run ends, in place (:mod:`hpctrain.record.summary`): a killed run's
log keeps the timings of its steps up to the last write.

A resumed run (``--resume`` with the same ``--log``) on the same P and plan opens the file
again, drops the rows after the checkpoint's step, and goes on appending: one log for the whole
training (``resumed`` lists each resume). Otherwise an existing file is never overwritten: it is
first renamed to ``NAME.1.h5`` (or the first free number), and a resume on another P or plan
starts a log of its own, whose ``resumed`` says so.

Whose file it is: a log carries the root attribute ``format = "hpctrain-log"`` from its first
byte on disk (logs written before it existed are known by their ``command`` and ``status``).
Only such a file, regular and not a link, is renamed aside or continued; anything else at the
path is refused (:func:`check_log_path`). A log whose run is still going is refused too: the
writer holds an exclusive ``flock`` on its log for the whole run, and a second job given the
same ``--log`` finds it held, while a killed run's log is free. (Where the file system offers
no ``flock``, a log whose status is still "running" counts as in use except to a resume: a
killed run's log must then be resumed or moved aside.) The new log is written under a
temporary name and linked to its path only if the path is free, while a lock file
``.NAME.lock`` keeps two starting jobs from rotating the same log: the log a run reports is
the file it wrote.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import subprocess
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import hpctrain
from hpctrain.cost.machine import Machine, format_machine
from hpctrain.errors import OutputError, UserError
from hpctrain.io.files import (
    check_output,
    exclusive_lock,
    output_error,
    publish_exclusive,
    replace_atomically,
    rotate_aside,
    temporary_beside,
)
from hpctrain.io.locations import checkout_root
from hpctrain.plan.planner import PlannedNetwork
from hpctrain.plan.plans import plan_text
from hpctrain.record.summary import Summary, SummaryWriter, create_summary, require_summary
from hpctrain.record.timing import COMM_FIELDS, RECORD_FIELDS, TIME_FIELDS, StepTimes

if TYPE_CHECKING:
    from hpctrain.device.backend import Backend
    from hpctrain.device.threads import ThreadChoice
    from hpctrain.model.net import NetSpec
    from hpctrain.plan.plans import LayerPlan

FORMAT = "hpctrain-log"  # the root attribute "format" of every log
STEP_SERIES = {"step": ("i8", "1"), "loss": ("f8", "1"), "accuracy": ("f8", "1"),
               "seconds": ("f8", "s"), "images_per_second": ("f8", "1/s"), "lr": ("f8", "1"),
               "comm_fraction": ("f8", "1"), "data_wait_seconds": ("f8", "s"),
               "data_fraction": ("f8", "1"), "loss_scale": ("f8", "1"),
               "skipped": ("i8", "1"), "grad_norm": ("f8", "1")}
"""Each step's row. ``loss_scale``: what the step's loss was multiplied by (1 but under fp16's
loss scaling); ``skipped``: 1 where the update was skipped (its gradients overflowed);
``grad_norm``: with ``--clip-grad-norm``, the global norm of the gradients before clipping
(after unscaling under fp16; NaN without clipping, or where the update was skipped)."""
STEP_DEFAULTS = {"loss_scale": 1.0, "skipped": 0}  # for a caller that gives neither
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
    for source, values in (("predicted", predicted_fields(planned)),
                           ("measured", measured_fields(measured)),
                           ("measured_fastest_rank", measured_fields(fastest_rank))):
        for name, data in values.items():
            group.create_dataset(f"layers/{source}/{name}", data=data).attrs["units"] = "s"
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


def run_attributes(command: list[str], options: dict[str, Any], processes: int, net: NetSpec,
                   plan: list[LayerPlan], planned: PlannedNetwork, backend: Backend,
                   threads: ThreadChoice, machine: Machine) -> dict[str, Any]:
    """The root attributes of a run's log that say what ran where (see the module doc).

    Parameters
    ----------
    command : the command line, from ``python`` on.
    options : every option by name, stored as JSON in ``config``; its ``batch``, ``device`` and
        ``data`` are attributes of their own too.
    processes : the number of ranks.
    net, plan, planned : the net, its plan and the plan's predictions.
    backend, threads, machine : where it runs: the arrays' dtype and precision, the threads per
        rank, the machine profile the plan was priced on.
    """
    from mpi4py import MPI  # only when a run starts: not on importing the log's readers

    return {
        "command": shlex.join(command),
        "config": options,
        "version": hpctrain.__version__,
        "git_commit": git_commit(),
        "mpi_library": MPI.Get_library_version().strip(),
        "mpi_version": "{}.{}".format(*MPI.Get_version()),
        "processes": processes,
        "net": net.name,
        "layers": "\n".join(net.architecture()),
        "input_shape": list(net.input_shape),
        "classes": net.classes,
        "batch": options["batch"],
        "dtype": np.dtype(backend.dtype).name,
        "precision": backend.precision.name,
        "device": options["device"],
        "threads_per_rank": threads.threads,
        "threads": threads.describe(),
        "ranks_per_node": threads.ranks_on_node,
        "data": options["data"],
        "machine": machine.name,
        "machine_profile": format_machine(machine),
        "plan": plan_text(net, plan),
        "predicted_iteration": planned.iteration_time,
    }


def is_run_log(path: Path) -> bool:
    """Whether ``path`` is a run log hpctrain wrote (read-only look at its root attributes)."""
    import h5py

    try:
        with h5py.File(path, "r", locking=False) as h5:
            attrs = h5.attrs
            if attrs.get("format") == FORMAT:
                return True
            command = str(attrs.get("command", ""))  # a log from before the format attribute
            return command.startswith("python -m hpctrain") and "status" in attrs
    except (OSError, ValueError):
        return False


def log_in_use(path: Path, resuming: bool = False) -> bool:
    """Whether a running job writes the log at ``path``: its writer holds a lock on it, or,
    where the file system has no ``flock``, its status is still "running" and this run is not
    ``resuming`` (a killed run's log then looks like a running one)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:  # no flock here: trust the status
        return not resuming and _status(path) == "running"
    finally:
        os.close(fd)


def _status(path: Path) -> str:
    import h5py

    try:
        with h5py.File(path, "r", locking=False) as h5:
            return str(h5.attrs.get("status", ""))
    except OSError:
        return ""


def check_log_path(path: Path, inputs: Iterable[tuple[str, Path]] = (), flag: str = "--log",
                   resuming: bool = False) -> None:
    """Refuse ``path`` as a run log unless it is free or a finished (or killed) log of ours.

    Raises :class:`~hpctrain.errors.UserError` for a directory, FIFO, device, link, a file hpctrain
    did not write, one of the run's ``inputs``, or the log of a run still going.
    """
    path = Path(path)
    check_output(path, flag, is_run_log, "an hpctrain run log", inputs)
    if path.exists() and log_in_use(path, resuming):
        raise UserError(f"{flag} {path} is the log of a run still going; give another {flag} "
                        f"(two runs never share a log)")


def _same_run(path: Path, attrs: dict[str, Any]) -> bool:
    """Whether the log at ``path`` is of a run on the same P, network and plan as ``attrs``:
    the same layers (``layers``), whatever the net file was called (a log from before logs
    held them: the same ``net``)."""
    import h5py

    if not path.exists():
        return False
    try:
        with h5py.File(path, "r", locking=False) as h5:
            network = "layers" if "layers" in h5.attrs else "net"
            return all(str(h5.attrs.get(k)) == str(attrs.get(k))
                       for k in ("processes", network, "plan"))
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
        self.planned = planned  # whose predictions the timings stand beside (see replanned)
        self.rotated: Path | None = None  # where an earlier log at ``path`` was moved
        self.failure: str | None = None  # the first write that failed (see :meth:`step`)
        self._lock: int | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.path, "--log"):
            # again: another job may have started meanwhile
            check_log_path(self.path, resuming=resume_step is not None)
            try:
                if resume_step is not None and _same_run(self.path, attrs):
                    self._hold(self.path)
                    self.h5 = h5py.File(self.path, "a", locking=False)
                    self._truncate(resume_step)
                    self._add_missing_series()
                    require_summary(self.h5, self.rows)
                    self._describe(attrs, resume_step)
                else:
                    self._create_beside(attrs, planned, resume_step)
                self._summary = SummaryWriter(self.h5)
            except OSError as err:
                self.close()
                raise output_error(self.path, err) from None
            except BaseException:
                self.close()
                raise

    def _hold(self, path: Path) -> None:
        """Lock the log for the whole run: a second job given it sees it in use."""
        self._lock = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        with contextlib.suppress(OSError):  # no flock on this file system: the status says
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _create_beside(self, attrs: dict[str, Any], planned: PlannedNetwork,
                       resume_step: int | None = None) -> None:
        """Write the new log's header under a temporary name, then give it the log's name;
        an earlier log there is first renamed aside."""
        import h5py

        tmp = temporary_beside(self.path)
        try:
            self._hold(tmp)
            self.h5 = h5py.File(tmp, "w", locking=False)
            self.h5.attrs["format"] = FORMAT
            self._create(planned)
            self._describe(attrs, resume_step)
            if os.path.lexists(self.path):
                self.rotated = rotate_aside(self.path)
            try:
                publish_exclusive(tmp, self.path)
            except FileExistsError:
                raise UserError(f"--log {self.path} was just created by another run; give "
                                f"another --log") from None
        finally:
            tmp.unlink(missing_ok=True)

    def _describe(self, attrs: dict[str, Any], resume_step: int | None) -> None:
        for key, value in attrs.items():
            self.h5.attrs[key] = json.dumps(value) if isinstance(value, dict) else value
        self.h5.attrs["status"] = "running"
        now = datetime.now(UTC).isoformat(timespec="seconds")
        if "started" in self.h5.attrs:  # a resumed run: one log for the whole training
            earlier = self.h5.attrs.get("resumed", "")
            self.h5.attrs["resumed"] = f"{earlier}at step {resume_step}, {now}\n"
        else:
            self.h5.attrs["started"] = now
            if resume_step is not None:  # resumed on another P or plan: a log of its own
                self.h5.attrs["resumed"] = (f"at step {resume_step}, {now}, in a new log (the "
                                            f"checkpoint's run had another P or plan)\n")
        self.h5.flush()

    def _create(self, planned: PlannedNetwork) -> None:
        h5 = self.h5
        self._write_plan(planned)
        for name, (dtype, units) in STEP_SERIES.items():
            self._series(f"steps/{name}", (), dtype, units)
        h5.create_dataset("steps/layers/name", data=np.array(self.rows, dtype="S"))
        for name in RECORD_FIELDS:
            for stat in ("max", "mean"):
                units = "bytes" if name == "bytes_sent" else "s"
                self._series(f"steps/layers/{name}/{stat}", (len(self.rows),), "f8", units)
        for name, (dtype, units) in VALIDATION_SERIES.items():
            self._series(f"validation/{name}", (), dtype, units)
        create_summary(h5, self.rows)

    def _write_plan(self, planned: PlannedNetwork) -> None:
        """``/plan``: every layer's mode and grid, and its predicted times."""
        h5 = self.h5
        names = [c.layer for c in planned.layers]
        h5.create_dataset("plan/layer", data=np.array(names, dtype="S"))
        h5.create_dataset("plan/mode", data=np.array([p.mode for p in planned.plans], dtype="S"))
        grids = [p.grid if p.mode != "follow" else (0, 0) for p in planned.plans]
        h5.create_dataset("plan/grid", data=np.array(grids, dtype="i8"))
        for name, values in predicted_fields(planned).items():
            h5.create_dataset(f"plan/predicted/{name}", data=values).attrs["units"] = "s"
        h5["plan"].attrs["rows"] = "predicted/*: layers in network order, then loss"

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

    def _add_missing_series(self) -> None:
        """A log written before a step series existed gets it, NaN for the rows already there."""
        rows = self.h5["steps/step"].shape[0]
        for name, (dtype, units) in STEP_SERIES.items():
            if f"steps/{name}" not in self.h5:
                self._series(f"steps/{name}", (), dtype, units)
                self.h5[f"steps/{name}"].resize(rows, axis=0)
                self.h5[f"steps/{name}"][:] = np.nan

    def _append(self, name: str, value: Any) -> None:
        ds = self.h5[name]
        ds.resize(ds.shape[0] + 1, axis=0)
        ds[-1] = value

    def _write(self, write: Callable[[], None]) -> None:
        """Run ``write()``, recording the first failure in ``failure`` (and writing no
        more) instead of raising on rank 0 alone: the training loop shares it with every
        rank."""
        if self.failure is not None:
            return
        try:
            write()
        except OSError as err:
            self.failure = str(output_error(self.path, err))

    def step(self, values: dict[str, float], largest: np.ndarray, mean: np.ndarray) -> None:
        """One row of every step series (NaN for one ``values`` lacks); ``largest`` and
        ``mean``: (rows, fields) arrays of every field of
        :data:`~hpctrain.record.timing.RECORD_FIELDS` over the ranks (see
        :class:`~hpctrain.record.timing.RanksSummary`). A failed write sets ``failure``."""
        def write() -> None:
            for name in STEP_SERIES:  # a series not given (an older caller's): NaN, or default
                self._append(f"steps/{name}", values.get(name, STEP_DEFAULTS.get(name, np.nan)))
            for k, name in enumerate(RECORD_FIELDS):
                self._append(f"steps/layers/{name}/max", largest[:, k])
                self._append(f"steps/layers/{name}/mean", mean[:, k])
            self.h5.flush()

        self._write(write)

    def validation(self, step: int, loss: float, accuracy: float,
                   mean_iou: float | None = None) -> None:
        """A held-out evaluation's row; ``mean_iou`` a segmentation's, whose series is made
        at its first row (a classifier's log has none)."""
        def write() -> None:
            for name, value in (("step", step), ("loss", loss), ("accuracy", accuracy)):
                self._append(f"validation/{name}", value)
            if mean_iou is not None:
                if "validation/mean_iou" not in self.h5:
                    self._series("validation/mean_iou", (), "f8", "1")
                self._append("validation/mean_iou", mean_iou)
            self.h5.flush()

        self._write(write)

    def timeline(self, spans: np.ndarray, steps: list[int]) -> None:
        """``/timeline``: every rank's spans of ``steps`` (see :mod:`hpctrain.record.timeline`),
        rows of (rank, row, phase, category, start, end), replacing any earlier timeline (of a
        resumed run). A failed write sets ``failure``."""
        from hpctrain.record.timeline import SPAN_FIELDS
        from hpctrain.record.timing import CATEGORIES, PHASES

        def write() -> None:
            if "timeline" in self.h5:
                del self.h5["timeline"]
            group = self.h5.create_group("timeline")
            data = group.create_dataset("spans", data=spans)
            data.attrs["fields"] = ",".join(SPAN_FIELDS)
            data.attrs["units"] = "s from a barrier before the first step recorded"
            group.create_dataset("steps", data=np.array(steps, dtype="i8"))
            group["rows"] = self.h5["steps/layers/name"]  # the same names: a hard link
            group.attrs["phases"] = ",".join(PHASES)
            group.attrs["categories"] = ",".join(CATEGORIES)
            self.h5.flush()

        self._write(write)

    def timings(self, planned: PlannedNetwork, measured: StepTimes, fastest_rank: StepTimes,
                iteration: float, steps: tuple[int, int], final: bool) -> None:
        """Overwrite ``/layers`` and ``/iteration`` in place with the per-layer times of
        ``steps`` (the first and the last step timed, from 1) beside ``planned``'s predictions:
        ``measured`` on the slowest rank, ``fastest_rank`` on the fastest, ``iteration`` the
        measured seconds per step; ``final`` when the run ends. A failed write sets
        ``failure``."""
        summary = Summary({"predicted": predicted_fields(planned),
                           "measured": measured_fields(measured),
                           "measured_fastest_rank": measured_fields(fastest_rank)},
                          (planned.iteration_time, iteration), *steps, final)
        self._write(lambda: self._summary.write(summary))

    def replanned(self, reason: str, planned: PlannedNetwork | None,
                  attrs: dict[str, Any]) -> None:
        """The run checked its plan against its first steps (``train --replan-after``):
        ``reason`` goes to the root's ``replanned``. With ``planned`` (the plan going on,
        predicted on the refitted profile) it becomes ``/plan``, and ``attrs`` replace the
        root's (the plan, its prediction, the profile); the first plan stays as
        ``/first_plan`` and the values replaced under ``first_`` names. A failed write sets
        ``failure``."""
        if planned is not None:
            self.planned = planned

        def write() -> None:
            if planned is not None:
                if "first_plan" in self.h5:  # a resumed run that had replanned already
                    del self.h5["plan"]
                else:
                    self.h5.move("plan", "first_plan")
                self._write_plan(planned)
                for key, value in attrs.items():
                    if key in self.h5.attrs:
                        self.h5.attrs[f"first_{key}"] = self.h5.attrs[key]
                    self.h5.attrs[key] = value
            self.h5.attrs["replanned"] = reason
            self.h5.flush()

        self._write(write)

    def finish(self, status: str) -> None:
        """Set the final status and close (the end-of-run timings: :meth:`timings` first).

        Raises :class:`~hpctrain.errors.OutputError` when this or an earlier write failed."""
        def write() -> None:
            self.h5.attrs["status"] = status
            self.h5.attrs["finished"] = datetime.now(UTC).isoformat(timespec="seconds")

        self._write(write)
        try:
            self.close()
        except OSError as err:  # the last data reach the file as it closes
            self.failure = self.failure or str(output_error(self.path, err))
        if self.failure is not None:
            raise OutputError(self.failure)

    def close(self) -> None:
        h5 = getattr(self, "h5", None)
        try:
            if h5 is not None and h5.id.valid:
                h5.close()
        finally:
            if self._lock is not None:
                os.close(self._lock)  # and with it the lock
                self._lock = None
