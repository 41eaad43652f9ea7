"""The auto plan against PyTorch DDP's step (``simulate --ddp``).

hpctrain's auto plan against the step users would run otherwise, PyTorch's DistributedDataParallel,
as the cost model prices it (:mod:`hpctrain.plan.ddp`: pure batch, statistics per rank, 25 MiB
gradient buckets in flight with the profile's overlap share hidden). Per machine profile (dgx-h100
and perlmutter-gpu, or ``--machine``), net (ResNet-50, Inception-v3 and CosmoFlow, or ``--net``)
and batch-norm choice (per rank, as DDP; global, hpctrain's exact default; one for a net without
batch norm), at P = 8, 16, …, 4096 and B = max(``--strong-batch``, P): DDP's step and the auto plan
under the same terms. The auto plan is never predicted slower (DDP's plan is in its space); where
it is faster, by how much and with which plan is the study's answer. Memory is not capped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.cost.machine import Machine
from hpctrain.device.precision import PRECISIONS, Precision
from hpctrain.model.net import NetSpec
from hpctrain.plan.ddp import against_ddp
from hpctrain.record import runlog
from hpctrain.study.outcome import describe_plan, summarise_plan
from hpctrain.study.records import sweep, write_sweep

DDP_NETS = ("resnet50", "inception_v3", "cosmoflow")
DDP_MACHINES = ("dgx-h100", "perlmutter-gpu")
DDP_PROCS = tuple(2**k for k in range(3, 13))  # 8, 16, …, 4096
DDP_STATISTICS = ("rank", "global")
DDP_NOTE = ("per machine, net and batch-norm statistics (rank: each rank's share of the batch, "
            "as DDP; global: the whole mini-batch), and P: the DDP-faithful step (every "
            "weighted layer batch parallel on 1xP, 25 MiB gradient buckets in flight, the "
            "profile's overlap share hidden) and the auto plan of hpctrain.plan.planner."
            "plan_network under the same terms, both priced by the implementation-faithful "
            "model at the profile's FLOP rate")
DDP_COLUMNS = ("procs: P; batch: B; ddp_time, auto_time: predicted iteration (s); speedup: "
               "ddp_time / auto_time; <plan>_comm: communication inside layers and moves "
               "(s, before hiding); <plan>_hidden: gradient sums hidden behind the backward "
               "(s); auto_plan, auto_summary: the auto plan's modes and grids")


@dataclass
class DdpStudy:
    """The --ddp study: one table per (machine, net, statistics)."""

    least_batch: int
    precision: str  # --precision: auto is resolved per machine (precisions)
    tables: dict[tuple[str, str, str], dict[str, list]] = field(default_factory=dict)
    machines: dict[str, Machine] = field(default_factory=dict)
    precisions: dict[str, Precision] = field(default_factory=dict)  # by machine
    seconds: float = 0.0


def has_batch_norm(net: NetSpec) -> bool:
    """Whether ``net`` has a batch-norm layer, whose statistics the study chooses two ways."""
    return any(layer.kind == "batchnorm" for layer in net.layers)


def ddp_row(net: NetSpec, machine: Machine, batch: int, procs: int, statistics: str,
            precision: Precision = PRECISIONS["fp32"]) -> dict[str, object]:
    """One row of the study: the DDP-faithful step and the auto plan at (B, P)."""
    found = against_ddp(net, machine, batch, procs, statistics, precision)
    row: dict[str, object] = {"procs": procs, "batch": batch,
                              "ddp_time": found.ddp.iteration_time,
                              "auto_time": found.auto.iteration_time,
                              "speedup": found.speedup}
    for name, planned in (("ddp", found.ddp), ("auto", found.auto)):
        totals = planned.totals()
        row[f"{name}_comm"] = totals["communication"] + totals["redistribution"]
        row[f"{name}_hidden"] = planned.hidden_sums()
    row["auto_plan"] = describe_plan(found.auto)
    row["auto_summary"] = summarise_plan(net, found.auto)
    return row


def run_ddp_study(nets: list[NetSpec], machines: list[Machine], least_batch: int = 2048,
                  procs: tuple[int, ...] = DDP_PROCS, precision: str = "fp32") -> DdpStudy:
    """:func:`ddp_row` for every machine, net, batch-norm choice and P, B = max(least, P), in
    the precision named ``precision`` (auto: as a run on each machine's device picks)."""
    study = DdpStudy(least_batch, precision)
    start = time.perf_counter()
    sweep(study, nets, machines, DDP_STATISTICS, procs, least_batch, precision, ddp_row)
    study.seconds = time.perf_counter() - start
    return study


def write_ddp_hdf5(path: Path, study: DdpStudy, attrs: dict[str, object]) -> None:
    """Write the study to ``path`` atomically: ``ddp/<machine>/<net>_<statistics>``, one
    dataset per column."""
    def fill(out) -> None:
        out.attrs.update(attrs)
        seconds = ("ddp_time", "auto_time", "ddp_comm", "auto_comm", "ddp_hidden", "auto_hidden")
        write_sweep(out, "ddp", study, DDP_NOTE, DDP_COLUMNS,
                    {**dict.fromkeys(seconds, "s"), "speedup": "1"})

    runlog.write_hdf5(path, fill)


def ddp_summary(study: DdpStudy) -> str:
    """Per machine, net and statistics, DDP's step against the auto plan at each P, in lines."""
    lines = [f"auto against the DDP-faithful step (pure batch, 25 MiB buckets in flight), same "
             f"batch-norm statistics; B = max({study.least_batch}, P); times in ms"]
    for (machine, net, statistics), t in study.tables.items():
        share = study.machines[machine].overlap
        lines.append(f"  {machine} (overlap {share:g}), {net}, statistics {statistics}")
        for k in range(len(t["procs"])):
            lines.append(f"    P={t['procs'][k]:<5d} B={t['batch'][k]:<5d} "
                         f"DDP {t['ddp_time'][k] * 1e3:9.3f}  auto {t['auto_time'][k] * 1e3:9.3f}"
                         f"  x{t['speedup'][k]:.3f}  {t['auto_summary'][k]}")
    lines.append(f"  priced {sum(len(t['procs']) for t in study.tables.values())} points in "
                 f"{study.seconds:.1f} s")
    return "\n".join(lines)

