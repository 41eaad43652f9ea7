"""The measured plans a log holds, read back: what was run (net, batch, processes, plan, the
profile that predicted it) and its per-layer times, predicted and measured.

A training run's log (``train --log``) holds one plan, timed every ``--timings-every`` steps
and at the end of the run (:mod:`hpctrain.record.summary`: a killed run's log holds the
timings of its steps up to the last write); a ``compare-plans --log`` holds one per plan
compared (:func:`~hpctrain.record.runlog.write_timings`). This reads them, for refitting a
profile to the runs a user already has (``calibrate --from-log``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpctrain.cost.machine import Machine, MachineError, parse_machine
from hpctrain.cost.memory import precision_of
from hpctrain.device.precision import Precision, resolve_precision
from hpctrain.errors import UserError, shown_path
from hpctrain.interchange.nets import load_network
from hpctrain.model.net import NetSpec
from hpctrain.plan.plans import LayerPlan, parse_plan
from hpctrain.record.summary import Summary, read_summary


class LogError(UserError):
    """A log that does not hold what a refit needs."""


@dataclass
class MeasuredPlan:
    """One plan as run and timed: rows are the net's layers, then the loss."""

    source: str  # the log, and the plan's place in it
    net: NetSpec
    batch: int
    procs: int
    precision: Precision  # what the run stored and sent its values in
    plans: list[LayerPlan]
    profile: Machine | None  # the profile that predicted it, when the log says
    predicted: dict[str, np.ndarray]
    measured: dict[str, np.ndarray]  # the slowest rank's
    fastest_rank: dict[str, np.ndarray]
    iteration: tuple[float, float]  # (predicted, measured) seconds per step
    unfinished: tuple[int, int] | None = None  # the steps timed, when the run did not finish

    @property
    def unfinished_words(self) -> str:
        """A line saying that the run did not finish and which steps its timings come from
        ("run.h5: the run did not finish; timings from its first 40 steps (medians over steps
        2-40)"); empty for a run that finished."""
        if self.unfinished is None:
            return ""
        first, last = self.unfinished
        what = f"its first {last} steps" if first <= 2 else f"its steps up to {last}"
        steps = f"steps {first}-{last}" if first < last else f"step {last}"
        return f"{self.source}: the run did not finish; timings from {what} (medians over {steps})"

    @property
    def itemsize(self) -> int:
        """Bytes of one stored value (an activation, a gradient, a message's entry)."""
        return self.precision.itemsize


def log_identity(path: Path) -> str:
    """What makes two logs the same log: the SHA-256 of the file's bytes (a path given twice,
    a link to it, or a copy of it, are one log). Refused in one line where ``path`` is not a
    file."""
    import hashlib

    _check_is_file(path)
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def distinct_logs(paths: list[Path]) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """``paths`` with each log once (its first path), and each (path, the path kept) left
    out as the same log again."""
    kept: dict[str, Path] = {}
    repeated = []
    for path in paths:
        identity = log_identity(path)
        if identity in kept:
            repeated.append((path, kept[identity]))
        else:
            kept[identity] = path
    return list(kept.values()), repeated


def _check_is_file(path: Path) -> None:
    where = shown_path(path)
    if path.is_dir():
        raise LogError(f"{where} is a directory: give its logs (say {where}/*.h5)")
    if not path.is_file():
        raise LogError(f"{where}: no such log")


def read_measured_plans(path: Path) -> list[MeasuredPlan]:
    """Every timed plan of the log at ``path``; refused in one line, naming the log and what
    it lacks, where it holds none."""
    import h5py

    _check_is_file(path)
    where = shown_path(path)
    try:  # no lock: a run still going holds its log, and may be read as it goes
        h5 = h5py.File(path, "r", locking=False)
    except OSError as err:
        raise LogError(f"{where}: not a readable HDF5 log ({err})") from None
    with h5:
        attrs = dict(h5.attrs)
        groups = ([(f"{where}, plan {key}", h5["plans"][key]) for key in sorted(h5["plans"])]
                  if "plans" in h5 else [(where, h5)])
        found = []
        for source, group in groups:
            summary = read_summary(group)
            if summary is None:
                raise LogError(f"{source}: no per-layer timings (/layers): the run ended before "
                               f"it wrote any (train --log writes them every --timings-every "
                               f"steps and at the end); refit from logs of runs that did")
            if summary.iteration is None:
                raise LogError(f"{source}: no iteration times (/iteration); refit from a log "
                               f"hpctrain wrote")
            plan_text = group.attrs.get("plan_file", group.attrs.get("plan"))
            found.append(_measured(source, attrs, plan_text, summary))
    if not found:
        raise LogError(f"{where}: holds no timed plan")
    return found


def _measured(source: str, attrs: dict, plan_text: str | None,
              summary: Summary) -> MeasuredPlan:
    for key in ("net", "batch", "processes"):
        if key not in attrs:
            raise LogError(f"{source}: the attribute {key!r} is missing; refit from a log "
                           f"hpctrain wrote")
    procs, batch = int(attrs["processes"]), int(attrs["batch"])
    _check_one_micro_batch(source, attrs, batch)
    net = _net(source, attrs, procs)
    if plan_text is None:
        raise LogError(f"{source}: no plan text; refit from a log hpctrain wrote")
    plans = parse_plan(str(plan_text), source, net, procs)
    profile = None
    if "machine_profile" in attrs:
        try:
            profile = parse_machine(str(attrs["machine_profile"]), source)
        except MachineError:
            profile = None  # an older profile format: the refit does without it
    precision = _precision(source, attrs)
    fields = summary.fields
    rows = len(net.layers) + 1
    if any(len(v) != rows for values in fields.values() for v in values.values()):
        raise LogError(f"{source}: per-layer timings of another net ({rows} rows expected)")
    unfinished = None if summary.final else (summary.first_step, summary.last_step)
    return MeasuredPlan(source, net, batch, procs, precision, plans, profile,
                        fields["predicted"], fields["measured"],
                        fields["measured_fastest_rank"], summary.iteration, unfinished)


def _precision(source: str, attrs: dict) -> Precision:
    """The precision the log's run used: its 'precision' attribute, else its 'dtype' (a
    precision name, or the storage dtype's: float32, float64, bfloat16, float16; float32 when
    absent)."""
    name = str(attrs.get("precision", attrs.get("dtype", "float32")))
    name = {"bfloat16": "bf16", "float16": "fp16"}.get(name, name)
    try:
        return resolve_precision(name, str(attrs.get("device", "cpu")))
    except UserError as err:
        raise LogError(f"{source}: {err}") from None


def _check_one_micro_batch(source: str, attrs: dict, batch: int) -> None:
    """Refuse the log of a run that accumulated gradients (``--accumulate K``): each of its
    steps times K forwards and backwards of a micro-batch against the plan of one, so its
    per-layer times are not what a fit of the plan's predictions reads."""
    config = json.loads(attrs["config"]) if "config" in attrs else {}
    accumulate = int(config.get("accumulate") or 1)
    if accumulate > 1:
        raise LogError(f"{source}: the run accumulated {accumulate} micro-batches of "
                       f"{batch // accumulate} per step (--accumulate {accumulate}), so each "
                       f"step times {accumulate} forwards and backwards of a plan of one; "
                       f"refit from a run without --accumulate")


def _net(source: str, attrs: dict, procs: int) -> NetSpec:
    """The net the log ran, at the input size it ran (a dataset may have set it), with the
    batch-norm statistics groups it ran on its ``procs`` ranks."""
    config = json.loads(attrs["config"]) if "config" in attrs else {}
    try:
        net = load_network(str(attrs["net"]), config.get("image_size"),
                           config.get("loss", "auto"))
        net = net.with_statistics(config.get("bn_group", "global"), procs)
        net = net.with_classes(config.get("classes"))  # a run of --classes N
    except UserError as err:
        raise LogError(f"{source}: its net {attrs['net']!r} cannot be loaded here ({err})"
                       ) from None
    shape = tuple(int(n) for n in attrs.get("input_shape", ()))
    if shape and shape != tuple(net.input_shape):
        net = net.with_image_size(shape[-1])
    return net


def measured_plan(source: str, net: NetSpec, batch: int, procs: int,
                  precision: Precision | int, profile: Machine, planned, slowest, fastest,
                  iteration: float) -> MeasuredPlan:
    """A plan just run in this process in ``precision`` (a number: bytes per value, see
    :func:`~hpctrain.cost.memory.precision_of`), with its per-layer times on the slowest and
    the fastest rank and its measured iteration, as a log would give it back."""
    from hpctrain.record.runlog import measured_fields, predicted_fields

    return MeasuredPlan(source, net, batch, procs, precision_of(precision),
                        list(planned.plans), profile, predicted_fields(planned),
                        measured_fields(slowest), measured_fields(fastest),
                        (planned.iteration_time, iteration))
