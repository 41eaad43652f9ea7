"""A net on 3-D volumes under a memory cap per rank (``simulate --volumes``).

The cap per rank is ``--mem-per-rank`` (default 40 GiB, an A100 of the default ``--machine
perlmutter-gpu``): CosmoFlow (or ``--net``) at 128³ and 512³, P = 8, 16, …, 4096, strong scaling at
B = ``--strong-batch`` (default 64 here) and weak scaling at B = P / :data:`WEAK_RANKS_PER_SAMPLE`
(one volume per rank at 128³; one per node of 4 GPUs at 512³, where one volume needs 75.6 GiB, more
than one GPU has). At each point the planner's plan under the cap (``auto``) and pure batch
parallelism, which runs only where P ≤ B and its predicted peak fits the cap: per plan the
iteration time, samples per second, speedup and efficiency over the least P where it runs, peak
memory per rank and the first layer's mode and grid (:func:`volumes_table`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine
from hpctrain.device.precision import PRECISIONS, Precision
from hpctrain.model.net import NetSpec
from hpctrain.plan.baselines import BASELINES
from hpctrain.plan.planner import PlannedNetwork, PlannerError
from hpctrain.plan.pricing import CostModel
from hpctrain.plan.spaces import plan_over
from hpctrain.record import runlog
from hpctrain.study.outcome import cost_choices, describe_plan, summarise_plan
from hpctrain.study.records import planned_provenance, write_table

VOLUMES_NET, VOLUMES_MACHINE = "cosmoflow", "perlmutter-gpu"  # its default --net and --machine
VOLUMES_CAP = 40 * 2**30  # its default --mem-per-rank: an A100's 40 GB (perlmutter-gpu)
VOLUMES_STRONG_BATCH = 64  # its default --strong-batch
# its default --space: auto, which with compute from FLOPs searches balanced (several axes of a
# volume cut at once: depth, height and width)
VOLUMES_SPACE = "auto"
VOLUME_SIZES = (128, 512)  # the volumes' edge: CosmoFlow's own 128³ and the 512³ of its data
VOLUMES_PROCS = tuple(2**k for k in range(3, 13))  # 8, 16, …, 4096
#: the ranks per sample of weak scaling at each volume edge (B = P / this). One volume per rank
#: where one fits a rank (128³, 1.2 GiB), else one volume per node of 4 GPUs (512³, 75.6 GiB;
#: 18.5 GiB per rank with its depth split over the node)
WEAK_RANKS_PER_SAMPLE = {128: 1, 512: 4}
#: the plans of the --volumes study at every (B, P), and what each is
VOLUME_PLANS = {
    "auto": "the planner's plan under the memory cap (plan_over with mem_per_rank)",
    "pure_batch": "every conv and linear layer batch parallel on 1xP; it runs only where "
                  "P <= B and its predicted peak per rank is within the cap",
}
VOLUMES_NOTE = ("per volume edge, scaling rule and P: the auto plan under the memory cap per "
                "rank, and pure batch parallelism where it runs and fits; predicted by the "
                "implementation model with compute from the machine's FLOP rate")
#: each plan's columns in a --volumes table (prefixed with the plan's name), with units
VOLUME_COLUMNS: dict[str, tuple[str | None, str]] = {
    "runnable": (None, "the plan runs: it splits and its peak per rank is within the cap"),
    "iteration_time": ("s", "predicted time of one iteration (NaN where it does not run)"),
    "compute": ("s", "of which compute"),
    "communication": ("s", "of which communication inside layers and redistribution"),
    "samples_per_second": ("1/s", "B / iteration_time"),
    "speedup": ("1", "samples per second over those at the least P where the plan runs in "
                     "this table (strong: the time ratio; weak: the scaled speedup)"),
    "efficiency": ("1", "speedup x (that least P) / P"),
    "memory_per_rank": ("B", "predicted peak bytes per rank, kept + the largest transient "
                             "(also where over the cap; NaN where it does not split)"),
    "first_layer": (None, "the first weighted layer's mode and grid"),
    "plan": (None, "every weighted layer's mode and grid, or 'none: ' and why it does not run"),
    "summary": (None, "per kind and kernel, how many layers chose each mode and grid"),
}


@dataclass(frozen=True)
class VolumeOutcome:
    """One plan at one (B, P) of the --volumes study: its predicted costs where it splits
    (``planned``), and why it does not run (``why_not``: it does not split, no plan fits, or
    its peak per rank is over the cap), empty where it runs."""

    planned: PlannedNetwork | None
    why_not: str = ""

    @property
    def runs(self) -> bool:
        return self.planned is not None and not self.why_not


def volume_outcome(model: CostModel, plan: str, cap: float, space: str = VOLUMES_SPACE
                   ) -> VolumeOutcome:
    """The plan ``plan`` (a key of :data:`VOLUME_PLANS`) of ``model`` under ``cap`` bytes of
    peak memory per rank; the auto plan searched over ``space``."""
    from hpctrain.io.units import format_bytes

    if plan == "auto":
        try:
            return VolumeOutcome(plan_over(model, cap, space=space))
        except PlannerError as err:
            return VolumeOutcome(None, str(err))
    found = cost_choices(model, BASELINES[plan](model.segment_kinds, model.procs))
    if found.planned is None:
        return VolumeOutcome(None, found.why_not)
    if found.planned.memory > cap:
        return VolumeOutcome(found.planned, f"needs {format_bytes(found.planned.memory)} per "
                                            f"rank, over the cap of {format_bytes(cap)}")
    return VolumeOutcome(found.planned)


def first_layer(planned: PlannedNetwork) -> str:
    """The first weighted layer's mode and grid, e.g. ``domain 8x8``."""
    return next(plan.describe() for plan in planned.plans if plan.mode != "follow")


def _volume_columns(net: NetSpec, outcome: VolumeOutcome, batch: int) -> dict[str, object]:
    """One plan's columns of :data:`VOLUME_COLUMNS` at one P, but the speedups."""
    planned, runs = outcome.planned, outcome.runs
    totals = planned.totals() if planned is not None else {}
    seconds = planned.iteration_time if runs else math.nan
    return {
        "runnable": runs, "iteration_time": seconds,
        "compute": totals["compute"] if runs else math.nan,
        "communication": totals["communication"] + totals["redistribution"] if runs
        else math.nan,
        "samples_per_second": batch / seconds,
        "memory_per_rank": float(planned.memory) if planned is not None else math.nan,
        "first_layer": first_layer(planned) if runs else "none",
        "plan": describe_plan(planned) if runs else f"none: {outcome.why_not}",
        "summary": summarise_plan(net, planned) if runs else "none"}


def _add_speedups(table: dict[str, list], plan: str) -> None:
    """``plan``'s speedup and efficiency at each P of ``table``, over the least P where it
    runs (NaN everywhere if it runs nowhere)."""
    procs, rates = table["procs"], table[f"{plan}_samples_per_second"]
    runs = [k for k, ok in enumerate(table[f"{plan}_runnable"]) if ok]
    first = runs[0] if runs else None
    speedup = [rates[k] / rates[first] if first is not None else math.nan
               for k in range(len(procs))]
    table[f"{plan}_speedup"] = speedup
    table[f"{plan}_efficiency"] = [s * procs[first] / p if first is not None else math.nan
                                   for s, p in zip(speedup, procs, strict=True)]


def volumes_table(net: NetSpec, machine: Machine, points: list[tuple[int, int]], cap: float,
                  precision: Precision = PRECISIONS["fp32"], space: str = VOLUMES_SPACE
                  ) -> dict[str, list]:
    """The rows of the --volumes study at each (B, P) of ``points``: every plan of
    :data:`VOLUME_PLANS` with its columns of :data:`VOLUME_COLUMNS` (auto searching
    ``space``), and the auto plan's speedup over pure batch (NaN where pure batch does not
    run)."""
    flops = FlopModel(machine.flops_for(precision.name))
    table: dict[str, list] = {}
    for batch, procs in points:
        model = CostModel(net, batch, procs, machine, flops, precision)
        outcomes = {plan: volume_outcome(model, plan, cap, space) for plan in VOLUME_PLANS}
        row: dict[str, object] = {"procs": procs, "batch": batch}
        for plan, outcome in outcomes.items():
            row.update({f"{plan}_{key}": value
                        for key, value in _volume_columns(net, outcome, batch).items()})
        auto, batch_plan = outcomes["auto"], outcomes["pure_batch"]
        row["auto_speedup_over_batch"] = (
            batch_plan.planned.iteration_time / auto.planned.iteration_time
            if auto.runs and batch_plan.runs else math.nan)
        for key, value in row.items():
            table.setdefault(key, []).append(value)
    for plan in VOLUME_PLANS:
        _add_speedups(table, plan)
    return table


def volume_points(size: int, scaling: str, strong_batch: int,
                  procs: tuple[int, ...] = VOLUMES_PROCS) -> list[tuple[int, int]]:
    """(B, P) of each P of ``procs``: B = ``strong_batch`` (strong), or P over
    :data:`WEAK_RANKS_PER_SAMPLE` of ``size`` (weak; at least 1)."""
    if scaling == "strong":
        return [(strong_batch, p) for p in procs]
    per_sample = WEAK_RANKS_PER_SAMPLE.get(size, 1)
    return [(max(1, p // per_sample), p) for p in procs]


@dataclass
class VolumesStudy:
    """The --volumes study: one table per (volume edge, scaling)."""

    net: NetSpec
    machine: Machine
    cap: float
    strong_batch: int
    space: str = VOLUMES_SPACE  # what the auto plan searches
    tables: dict[tuple[int, str], dict[str, list]] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the whole study


def run_volumes(net: NetSpec, machine: Machine, sizes: tuple[int, ...] = VOLUME_SIZES,
                procs: tuple[int, ...] = VOLUMES_PROCS, strong_batch: int = VOLUMES_STRONG_BATCH,
                cap: float = VOLUMES_CAP, precision: Precision = PRECISIONS["fp32"],
                space: str = VOLUMES_SPACE) -> VolumesStudy:
    """:func:`volumes_table` of ``net`` on volumes of each edge of ``sizes``, strong and weak
    (:func:`volume_points`), at each P of ``procs``, under ``cap`` bytes per rank."""
    study = VolumesStudy(net, machine, cap, strong_batch, space)
    start = time.perf_counter()
    for size in sizes:
        sized = net.with_image_size(size)
        for scaling in ("strong", "weak"):
            study.tables[size, scaling] = volumes_table(
                sized, machine, volume_points(size, scaling, strong_batch, procs), cap,
                precision, space)
    study.seconds = time.perf_counter() - start
    return study


def _volume_rule(study: VolumesStudy, size: int, scaling: str) -> str:
    if scaling == "strong":
        return f"B = {study.strong_batch}"
    per_sample = WEAK_RANKS_PER_SAMPLE.get(size, 1)
    return "B = P" if per_sample == 1 else f"B = P/{per_sample}"


def write_volumes_hdf5(path: Path, study: VolumesStudy, attrs: dict[str, object]) -> None:
    """Write the --volumes study to ``path`` atomically: a group ``volumes`` with one group
    per volume edge (``<net>_<edge>``), and in it ``strong`` and ``weak``, one dataset per
    column."""

    def fill(out) -> None:
        out.attrs.update(attrs)
        volumes = out.create_group("volumes")
        volumes.attrs["description"] = VOLUMES_NOTE
        volumes.attrs["columns"] = "; ".join(
            ["procs: P; batch: B; auto_speedup_over_batch: pure batch's iteration time over "
             "auto's (NaN where pure batch does not run)"]
            + [f"<plan>_{key}: {what}" for key, (_, what) in VOLUME_COLUMNS.items()])
        volumes.attrs["plans"] = "; ".join(f"{plan}: {note}" for plan, note in
                                           VOLUME_PLANS.items())
        volumes.attrs["sizes"] = ",".join(str(size) for size in dict.fromkeys(
            size for size, _ in study.tables))
        for (size, scaling), table in study.tables.items():
            name = f"{study.net.name}_{size}"
            sized = volumes[name] if name in volumes else volumes.create_group(name)
            sized.attrs["size"] = size
            group = sized.create_group(scaling)
            group.attrs["batch_rule"] = _volume_rule(study, size, scaling)
            write_table(group, table)
            for plan in VOLUME_PLANS:
                for key, (units, _) in VOLUME_COLUMNS.items():
                    if units is not None:
                        group[f"{plan}_{key}"].attrs["units"] = units
            group["auto_speedup_over_batch"].attrs["units"] = "1"

    runlog.write_hdf5(path, fill)


def volumes_attrs(study: VolumesStudy, precision: Precision, argv: list[str]
                  ) -> dict[str, object]:
    """The file's attributes: the net, the machine, the cap, the batches and what made it."""
    m = study.machine
    return {"net": study.net.name, "machine": m.name, "machine_levels": m.describe(),
            "flops": m.flops, "word_bytes": precision.itemsize, "precision": precision.name,
            "mem_per_rank": float(study.cap),
            "strong_batch": study.strong_batch, "space": study.space,
            "weak_ranks_per_sample": ",".join(f"{size}:{n}"
                                              for size, n in WEAK_RANKS_PER_SAMPLE.items()),
            **planned_provenance(argv, VOLUMES_NOTE)}


def volumes_summary(study: VolumesStudy) -> str:
    """Per volume edge, scaling rule and P, the auto plan against pure batch, in lines."""
    from hpctrain.io.units import format_bytes

    m = study.machine
    lines = [f"{study.net.name} volumes on {m.name} ({m.describe()}), at most "
             f"{format_bytes(study.cap)} per rank; ms per iteration, samples/s, peak memory "
             f"per rank, the first layer's grid; pure batch where it runs and fits"]
    for (size, scaling), t in study.tables.items():
        lines.append(f"  {size}^3 {scaling} ({_volume_rule(study, size, scaling)}):")
        for k, procs in enumerate(t["procs"]):
            if t["auto_runnable"][k]:
                auto = (f"auto {t['auto_iteration_time'][k] * 1e3:9.2f} ms "
                        f"{t['auto_samples_per_second'][k]:>9,.0f}/s "
                        f"{t['auto_memory_per_rank'][k] / 2**30:6.2f} GiB "
                        f"{t['auto_first_layer'][k]:<15s}")
            else:
                why = "no plan fits" if "no plan fits" in t["auto_plan"][k] else "no plan"
                auto = f"auto {why:<48s}"
            if t["pure_batch_runnable"][k]:
                batch = (f"batch {t['pure_batch_iteration_time'][k] * 1e3:9.2f} ms "
                         f"({t['auto_speedup_over_batch'][k]:.2f}x)")
            elif math.isfinite(t["pure_batch_memory_per_rank"][k]):
                batch = (f"batch over the cap "
                         f"({t['pure_batch_memory_per_rank'][k] / 2**30:.1f} GiB)")
            else:
                batch = "batch cannot run" + (" (P > B)" if procs > t["batch"][k] else "")
            lines.append(f"    P={procs:<5d} B={t['batch'][k]:<5d} {auto} {batch}")
    lines.append(f"  planned {sum(len(t['procs']) for t in study.tables.values())} points in "
                 f"{study.seconds:.1f} s")
    return "\n".join(lines)

