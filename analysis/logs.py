"""Read hpctrain's HDF5 run logs into plain dataclasses, and group runs for scaling plots.

Reads with h5py and NumPy only: never imports MPI or hpctrain, so it runs on a laptop. The log
layout is the one :mod:`hpctrain.record.runlog` writes (README, "Run logs"):

- a **run log** (``python -m hpctrain ... --log run.h5``): root attributes ``processes``,
  ``batch``, ``net``, ``input_shape``, ``config`` (JSON of every option; ``grid`` null is pure
  batch 1xP), ``plan`` (text), ``predicted_iteration``; per-step series under ``/steps``; held-out
  evaluations under ``/validation``; the per-layer summary ``/layers/{predicted,
  measured}/F`` with row names ``/layers/name`` and ``/iteration`` (attributes ``predicted``,
  ``measured``), written every ``--timings-every`` steps and at the end (while ``/layers``'
  attribute ``writing`` is 1, a write was cut short and ``/layers/staged`` holds the whole
  copy; a measured ``/iteration`` of NaN: none written yet). One :class:`Run`.
- a **compare-plans log** (``python -m hpctrain compare-plans --log ...``): root attributes
  ``net``, ``batch``, ``steps``; one group ``/plans/NN`` per plan with attributes ``spec`` and
  ``plan`` and the same ``layers`` and ``iteration`` summary. One :class:`Run` per plan, with no
  steps.

Other hpctrain files (the ``simulate`` output, a dataset, a checkpoint) raise
:class:`OtherHpctrainFile`, so a caller given ``runs/*.h5`` can skip them with a note; anything
else raises :class:`LogError` with a message naming the file and what is wrong.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TIME_FIELDS = ("forward_compute", "backward_compute", "forward_layer_comm",
               "backward_layer_comm", "forward_redistribution", "backward_redistribution")
# The three stacks of the per-layer bars, each the sum of its fields (forward + backward).
COMPONENTS = {
    "compute": ("forward_compute", "backward_compute"),
    "communication": ("forward_layer_comm", "backward_layer_comm"),
    "redistribution": ("forward_redistribution", "backward_redistribution"),
}
BATCH_LABEL = "1xP (batch)"
MODEL_LABEL = "Px1 (model)"


class LogError(ValueError):
    """A file that cannot be read as a run log: missing, not HDF5, or another layout."""


class OtherHpctrainFile(LogError):
    """An hpctrain HDF5 file that is not a run log (simulate output, dataset, checkpoint)."""


@dataclass(frozen=True)
class LayerTimes:
    """Seconds per row (layers in network order, then "loss") of each of :data:`TIME_FIELDS`."""

    names: tuple[str, ...]
    fields: dict[str, np.ndarray]

    def component(self, name: str) -> np.ndarray:
        """Seconds per row of one of :data:`COMPONENTS`: the sum of its forward and backward."""
        first, second = COMPONENTS[name]
        return self.fields[first] + self.fields[second]

    @property
    def total(self) -> np.ndarray:
        """Seconds per row: compute + communication + redistribution, forward and backward."""
        return sum(self.component(c) for c in COMPONENTS)


@dataclass(frozen=True)
class Run:
    """One training run (or one plan of a compare-plans log), as logged.

    ``name`` is what output files are called after: the log's stem, or ``stem-NN`` for the
    NN-th plan of a compare-plans log.
    """

    path: Path
    name: str
    net: str
    processes: int
    batch: int
    grid_spec: str | None  # the --grid option as given; None: the default, pure batch 1xP
    input_shape: tuple[int, ...] | None = None
    device: str = ""  # "cpu" or "gpu", and the dtype: runs of other settings never share a line
    dtype: str = ""
    plan: str = ""
    status: str = ""
    step: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    step_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    loss: np.ndarray = field(default_factory=lambda: np.zeros(0))
    accuracy: np.ndarray = field(default_factory=lambda: np.zeros(0))
    validation_step: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    validation_loss: np.ndarray = field(default_factory=lambda: np.zeros(0))
    validation_accuracy: np.ndarray = field(default_factory=lambda: np.zeros(0))
    timeline: bool = False  # the log has a /timeline (--timeline)
    iteration_measured: float | None = None  # /iteration attrs, of the steps timed so far
    iteration_predicted: float | None = None
    measured: LayerTimes | None = None  # /layers/measured: each entry the slowest rank's
    predicted: LayerTimes | None = None
    compare_plan: str | None = None  # "NN" of /plans/NN in a compare-plans log, else None

    @property
    def iteration_time(self) -> float | None:
        """Measured seconds per iteration: the median of ``steps/seconds`` (each step's slowest
        rank) without the first step, which pays for warm-up; the only step when there is one.
        Without logged steps (a compare-plans plan) the end summary's ``/iteration`` measured."""
        seconds = self.step_seconds[1:] if len(self.step_seconds) > 1 else self.step_seconds
        if len(seconds):
            return float(np.median(seconds))
        return self.iteration_measured

    @property
    def grid_label(self) -> str:
        """The kind of grid, the same at every P: "auto", "1xP (batch)", "conv=1xP,fc=Px1"…"""
        return grid_kinds(self.grid_spec, self.processes)[0]

    @property
    def title(self) -> str:
        """One line naming the run: net, input, processes, batch, grid."""
        shape = "×".join(str(s) for s in self.input_shape) if self.input_shape else "?"
        return (f"{self.net} (input {shape}), P = {self.processes}, batch {self.batch}, "
                f"grid {self.grid_spec or '1xP (default)'}")


# ---------------------------------------------------------------------------------------------
# grid labels


_GRID = re.compile(r"^(\d+)x(\d+)$")


def _token_kinds(token: str, procs: int) -> list[str]:
    """The P-independent names of one R x C token: "1x4" on 4 ranks is "1xP"; "1x1" on one
    rank is both "1xP" and "Px1"; any other R x C stays as it is."""
    match = _GRID.match(token)
    if not match:
        return [token]
    rows, cols = int(match[1]), int(match[2])
    kinds = []
    if rows == 1 and cols == procs:
        kinds.append("1xP")
    if rows == procs and cols == 1:
        kinds.append("Px1")
    return kinds or [token]


def grid_kinds(spec: str | None, procs: int) -> list[str]:
    """Every P-independent label the grid spec ``spec`` on ``procs`` ranks is an instance of,
    the preferred first. Runs of one kind at different P share a line in the scaling plots.

    >>> grid_kinds(None, 4), grid_kinds("1x4", 4), grid_kinds("4x1", 4), grid_kinds("2x2", 4)
    (['1xP (batch)'], ['1xP (batch)'], ['Px1 (model)'], ['2x2'])
    >>> grid_kinds("conv=domain:1x4,fc=4x1", 4)
    ['conv=domain:1xP,fc=Px1']
    >>> grid_kinds("conv=1x1,fc=1x1", 1)[:2]   # one rank: every grid is 1x1, so several kinds
    ['conv=1xP,fc=1xP', 'conv=1xP,fc=Px1']

    A plan file is labelled by its file name, a shipped plan by its name; "auto" stays "auto".
    """
    if spec is None or spec.strip() == "":
        return [BATCH_LABEL, MODEL_LABEL] if procs == 1 else [BATCH_LABEL]
    spec = spec.strip()
    if spec == "auto":
        return ["auto"]
    if _GRID.match(spec):
        named = {"1xP": BATCH_LABEL, "Px1": MODEL_LABEL}
        return [named.get(k, k) for k in _token_kinds(spec, procs)]
    if "=" not in spec:  # a plan file
        return [Path(spec).name]
    options: list[list[str]] = [[]]
    for part in spec.split(","):
        key, _, value = part.partition("=")
        mode, _, grid = value.rpartition(":")
        prefix = f"{key.strip()}=" + (f"{mode.strip()}:" if mode else "")
        kinds = _token_kinds(grid.strip(), procs)
        options = [done + [prefix + k] for done in options for k in kinds]
    return [",".join(o) for o in options]


# ---------------------------------------------------------------------------------------------
# reading


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _strings(dataset) -> tuple[str, ...]:
    return tuple(_text(v) for v in dataset[()])


def _series(h5, name: str, dtype=float) -> np.ndarray:
    return np.asarray(h5[name][()], dtype=dtype) if name in h5 else np.zeros(0, dtype=dtype)


def _summary(group):
    """The whole copy of ``group``'s per-layer summary as (layers, iteration) groups (the
    second None in a log without ``/iteration``): ``/layers/staged`` and its ``iteration``
    while a write of ``/layers`` was cut short (attribute ``writing`` 1); None when there is
    no summary or none was written yet (a measured iteration of NaN)."""
    if "layers" not in group:
        return None
    layers, iteration = group["layers"], group.get("iteration")
    if int(layers.attrs.get("writing", 0)) and "staged" in layers:
        layers, iteration = layers["staged"], layers["staged"].get("iteration")
    measured = None if iteration is None else iteration.attrs.get("measured")
    if measured is not None and np.isnan(float(measured)):
        return None
    return layers, iteration


def _layer_times(group, kind: str) -> LayerTimes | None:
    """``<kind>/F`` of the summary's whole copy for every F, or None when the summary is
    absent, not written yet or partial."""
    summary = _summary(group)
    if summary is None or "layers/name" not in group:
        return None
    layers = summary[0]
    if any(f"{kind}/{f}" not in layers for f in TIME_FIELDS):
        return None
    names = _strings(group["layers/name"])
    fields = {f: np.asarray(layers[f"{kind}/{f}"][()], dtype=float) for f in TIME_FIELDS}
    if any(values.shape != (len(names),) for values in fields.values()):
        return None
    return LayerTimes(names, fields)


def _iteration(group) -> tuple[float | None, float | None]:
    summary = _summary(group)
    if summary is None or summary[1] is None:
        return None, None
    attrs = summary[1].attrs
    measured, predicted = attrs.get("measured"), attrs.get("predicted")
    return (None if measured is None else float(measured),
            None if predicted is None else float(predicted))


def _procs_from_plan(plan: str) -> int | None:
    """P from a plan text's first "MODE RxC" entry ("model 2x2" → 4)."""
    for match in re.finditer(r"\b(\d+)x(\d+)\b", plan):
        return int(match[1]) * int(match[2])
    return None


def _grid_from_command(command: str) -> str | None:
    """The ``--grid`` value of a command line (logs written before ``config`` existed)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for k, word in enumerate(words):
        if word == "--grid" and k + 1 < len(words):
            return words[k + 1]
        if word.startswith("--grid="):
            return word.partition("=")[2]
    return None


def _read_run(h5, path: Path) -> Run:
    attrs = h5.attrs
    if "config" in attrs:
        try:
            grid = json.loads(_text(attrs["config"])).get("grid")
        except (json.JSONDecodeError, AttributeError) as error:
            raise LogError(f"{path}: the 'config' attribute is not a JSON object ({error})") \
                from None
    else:
        grid = _grid_from_command(_text(attrs.get("command", "")))
    iteration_measured, iteration_predicted = _iteration(h5)
    if iteration_predicted is None and "predicted_iteration" in attrs:
        iteration_predicted = float(attrs["predicted_iteration"])
    shape = attrs.get("input_shape")
    return Run(
        path=path, name=path.stem, net=_text(attrs.get("net", "?")),
        timeline="timeline/spans" in h5,
        processes=int(attrs["processes"]), batch=int(attrs["batch"]),
        grid_spec=grid,
        input_shape=None if shape is None else tuple(int(s) for s in np.atleast_1d(shape)),
        device=_text(attrs.get("device", "")), dtype=_text(attrs.get("dtype", "")),
        plan=_text(attrs.get("plan", "")), status=_text(attrs.get("status", "")),
        step=_series(h5, "steps/step", int), step_seconds=_series(h5, "steps/seconds"),
        loss=_series(h5, "steps/loss"), accuracy=_series(h5, "steps/accuracy"),
        validation_step=_series(h5, "validation/step", int),
        validation_loss=_series(h5, "validation/loss"),
        validation_accuracy=_series(h5, "validation/accuracy"),
        iteration_measured=iteration_measured, iteration_predicted=iteration_predicted,
        measured=_layer_times(h5, "measured"), predicted=_layer_times(h5, "predicted"),
    )


def _read_compare(h5, path: Path) -> list[Run]:
    runs = []
    for key in sorted(h5["plans"]):
        group = h5["plans"][key]
        plan = _text(group.attrs.get("plan", ""))
        # logs before compare-plans stored P: recover it from the plan's first grid
        procs = int(h5.attrs["processes"]) if "processes" in h5.attrs else _procs_from_plan(plan)
        if procs is None:
            raise LogError(f"{path}: plan {key} names no R x C grid; cannot tell P")
        measured, predicted = _iteration(group)
        runs.append(Run(path=path, name=f"{path.stem}-{key}", net=_text(h5.attrs.get("net", "?")),
                        processes=procs, batch=int(h5.attrs["batch"]),
                        grid_spec=_text(group.attrs.get("spec", "?")), plan=plan,
                        iteration_measured=measured, iteration_predicted=predicted,
                        measured=_layer_times(group, "measured"),
                        predicted=_layer_times(group, "predicted"), compare_plan=key))
    return runs


def read_log(path: str | Path) -> list[Run]:
    """The runs in one HDF5 log: one for a run log, one per plan for a compare-plans log.

    Raises
    ------
    OtherHpctrainFile : an hpctrain file of another kind (simulate output, dataset, checkpoint).
    LogError : a missing file, a file that is not HDF5, or an HDF5 file of another layout.
    """
    import h5py

    path = Path(path)
    if not path.is_file():
        raise LogError(f"{path}: no such file")
    try:
        h5 = h5py.File(path, "r", locking=False)
    except OSError as error:
        raise LogError(f"{path}: not an HDF5 file ({error})") from None
    with h5:
        attrs = h5.attrs
        if "processes" in attrs and "batch" in attrs and "steps" in h5:
            return [_read_run(h5, path)]
        if "plans" in h5 and "batch" in attrs:
            return _read_compare(h5, path)
        if "strong_batch" in attrs or "domain_batch" in attrs:
            raise OtherHpctrainFile(f"{path}: output of 'python -m hpctrain simulate', not a run "
                                    "log (plot it with analysis/plot_simulation.py)")
        if _text(attrs.get("format", "")) == "hpctrain-dataset":
            raise OtherHpctrainFile(f"{path}: a dataset, not a run log")
        if "params" in h5:
            raise OtherHpctrainFile(f"{path}: a checkpoint, not a run log")
    raise LogError(f"{path}: not an hpctrain run log (no 'processes'/'batch' attributes and "
                   "'steps' group; write one with 'python -m hpctrain ... --log run.h5')")


# ---------------------------------------------------------------------------------------------
# scaling studies


@dataclass(frozen=True)
class ScalingPoint:
    """One process count of one line: the median over the runs there (repeats of one setup)."""

    processes: int
    batch: int
    measured: float  # seconds per iteration
    predicted: float | None
    runs: tuple[str, ...]


@dataclass(frozen=True)
class ScalingStudy:
    """Runs of one net and input at either one global batch (strong scaling) or one batch per
    process (weak scaling); ``lines`` maps a grid label to its points in increasing P."""

    kind: str  # "strong" or "weak"
    net: str
    input_shape: tuple[int, ...] | None
    batch: float  # the global batch (strong) or the batch per process (weak)
    lines: dict[str, list[ScalingPoint]]

    @property
    def processes(self) -> list[int]:
        return sorted({p.processes for points in self.lines.values() for p in points})

    def baseline(self) -> tuple[str | None, ScalingPoint | None]:
        """The reference of the speedups: pure batch at the smallest P of the study when it ran
        there (label, point); else (None, None) and each line is its own reference."""
        points = self.lines.get(BATCH_LABEL, [])
        if points and points[0].processes == self.processes[0]:
            return BATCH_LABEL, points[0]
        return None, None

    def speedup(self, label: str, predicted: bool = False) -> np.ndarray:
        """Throughput (images/s) of each point of ``label`` over the reference's — for strong
        scaling the ratio of iteration times, for weak scaling the scaled speedup
        (P/P₀)·T₀/T(P); ideal is P/P₀ in both."""
        _, reference = self.baseline()
        points = self.lines[label]
        reference = reference or points[0]

        def seconds(p: ScalingPoint) -> float:
            value = p.predicted if predicted else p.measured
            return np.nan if value is None else value

        base = reference.batch / seconds(reference)
        return np.array([p.batch / seconds(p) / base for p in points])


def _points(runs: list[Run]) -> list[ScalingPoint]:
    by_procs: dict[int, list[Run]] = {}
    for run in runs:
        by_procs.setdefault(run.processes, []).append(run)
    points = []
    for procs in sorted(by_procs):
        here = by_procs[procs]
        predicted = [r.iteration_predicted for r in here if r.iteration_predicted is not None]
        points.append(ScalingPoint(
            processes=procs, batch=here[0].batch,
            measured=statistics.median(r.iteration_time for r in here),
            predicted=statistics.median(predicted) if predicted else None,
            runs=tuple(r.name for r in here)))
    return points


def _lines(runs: list[Run]) -> dict[str, list[ScalingPoint]]:
    """Runs grouped by grid kind. A run whose spec fits several kinds (on one rank every grid
    is 1x1) joins each such line that lacks a point at its P, or else starts its first kind."""
    members: dict[str, list[Run]] = {}
    ambiguous = []
    for run in runs:
        kinds = grid_kinds(run.grid_spec, run.processes)
        if len(kinds) == 1:
            members.setdefault(kinds[0], []).append(run)
        else:
            ambiguous.append((run, kinds))
    placed_at: dict[str, set[int]] = {k: {r.processes for r in v} for k, v in members.items()}
    for run, kinds in ambiguous:
        homes = [k for k in kinds if k in placed_at and run.processes not in placed_at[k]]
        for kind in homes or [kinds[0]]:
            members.setdefault(kind, []).append(run)
            placed_at.setdefault(kind, set()).add(run.processes)
    return {kind: _points(members[kind]) for kind in sorted(members, key=_line_order)}


def _line_order(label: str) -> tuple[int, str]:
    return ({"auto": 0, BATCH_LABEL: 1, MODEL_LABEL: 2}.get(label, 3), label)


def scaling_studies(runs: Iterable[Run], kind: str) -> list[ScalingStudy]:
    """Strong (``kind="strong"``: same net, input and global batch) or weak (``"weak"``: same
    net, input and batch per process) scaling studies among ``runs``: each with at least two
    process counts. Runs without a measured iteration time are left out."""
    if kind not in ("strong", "weak"):
        raise ValueError(f"scaling kind {kind!r}: use 'strong' or 'weak'")
    families: dict[tuple, list[Run]] = {}
    for run in runs:
        if run.iteration_time is None:
            continue
        per = run.batch if kind == "strong" else run.batch / run.processes
        families.setdefault((run.net, run.input_shape, run.device, run.dtype, per),
                            []).append(run)
    studies = []
    for (net, shape, _, _, per), members in sorted(families.items(), key=lambda kv: str(kv[0])):
        if len({r.processes for r in members}) < 2:
            continue
        studies.append(ScalingStudy(kind, net, shape, per, _lines(members)))
    return studies
