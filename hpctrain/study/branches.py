"""Branches side by side on groups of ranks against every branch on every rank
(``simulate --side-by-side``).

Per machine profile (dgx-h100 and perlmutter-gpu, or ``--machine``), net (Inception-v3 and
ResNet-50, or ``--net``) and batch-norm statistics (global, hpctrain's exact default; per rank, as
DDP), at P = 4, 16, …, 4096 and B = max(``--strong-batch``, P): the auto plan with every branch on
every rank (``--branches serial``) and the auto plan that may put a region's branches on groups
(:mod:`hpctrain.plan.grouped`, ``--branches auto``), both exact over the 1.5D grids. The second is
never predicted slower (the first is in its space); where it is faster, by how much, and with how
many regions on groups is the study's answer.

FlexFlow's case (:func:`flexflow_case`) is one more point: Inception-v3 on the 4 GPUs of one node
(``gpu-like``) at 64 images per GPU, the auto plan against data parallelism.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine, load_machine
from hpctrain.device.precision import PRECISIONS, Precision, resolve_precision
from hpctrain.model.net import NetSpec, load_net
from hpctrain.plan.baselines import pure_batch
from hpctrain.plan.planner import PlannedNetwork, evaluate, plan_network
from hpctrain.plan.pricing import CostModel
from hpctrain.record import runlog
from hpctrain.study.outcome import describe_plan
from hpctrain.study.records import sweep, write_sweep

SIDE_NETS = ("inception_v3", "resnet50")
SIDE_MACHINES = ("dgx-h100", "perlmutter-gpu")
SIDE_PROCS = tuple(4**k for k in range(1, 7))  # 4, 16, …, 4096
SIDE_STATISTICS = ("global", "rank")
SIDE_BATCH = 256  # B = max(this, P): few samples per rank at scale, where latency dominates
SIDE_NOTE = ("per machine, net, batch-norm statistics (global: the whole mini-batch; rank: each "
             "rank's share, as DDP) and P: the auto plan of hpctrain.plan.planner.plan_network "
             "with every branch on every rank (serial) and with fork-join regions allowed on "
             "groups of ranks (groups), both exact over the 1.5D grids, priced at the profile's "
             "FLOP rate for the precision")
SIDE_COLUMNS = ("procs: P; batch: B; serial_time, groups_time: predicted iteration (s); gain: "
                "serial_time / groups_time - 1; regions_on_groups: regions whose branches run "
                "on groups; side_by_side: what running them at once saves (s); "
                "serial_seconds, groups_seconds: planning wall time (s); groups_plan: the plan")


@dataclass
class SideStudy:
    """The --side-by-side study: one table per (machine, net, statistics), and FlexFlow's
    case."""

    least_batch: int
    precision: str
    tables: dict[tuple[str, str, str], dict[str, list]] = field(default_factory=dict)
    machines: dict[str, Machine] = field(default_factory=dict)
    precisions: dict[str, Precision] = field(default_factory=dict)
    flexflow: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0


def regions_on_groups(planned: PlannedNetwork, net: NetSpec) -> int:
    """How many fork–join regions ``planned`` runs on groups of ranks: the distinct joins of its
    layers on groups."""
    from hpctrain.model.regions import fork_join_regions

    return sum(1 for region in fork_join_regions(net)
               if any(k in planned.on_groups for k in region.inside))


def side_row(net: NetSpec, machine: Machine, batch: int, procs: int,
             precision: Precision = PRECISIONS["fp32"]) -> dict[str, object]:
    """One row of the study: both auto plans at (B, P)."""
    rate = FlopModel(machine.flops_for(precision.name))

    def model() -> CostModel:
        return CostModel(net, batch, procs, machine, rate, precision, overlap=True)

    start = time.perf_counter()
    serial = plan_network(model())
    middle = time.perf_counter()
    groups = plan_network(model(), groups=True)
    end = time.perf_counter()
    return {"procs": procs, "batch": batch, "serial_time": serial.iteration_time,
            "groups_time": groups.iteration_time,
            "gain": serial.iteration_time / groups.iteration_time - 1,
            "regions_on_groups": regions_on_groups(groups, net),
            "side_by_side": groups.side_by_side, "serial_seconds": middle - start,
            "groups_seconds": end - middle, "groups_plan": describe_plan(groups)}


def flexflow_case(precision: str = "fp32") -> dict[str, object]:
    """Inception-v3 on the 4 GPUs of one node (``gpu-like``), 64 images per GPU as FlexFlow's
    Section 8 trains it: the auto plan (branches may go on groups) against data parallelism,
    statistics per rank as their data-parallel baseline keeps them, at the profile's FLOP rate
    for the precision named ``precision``."""
    machine = load_machine("gpu-like")
    chosen = resolve_precision(precision, machine.device)
    net = load_net("inception_v3").with_statistics("rank", 4)
    rate = FlopModel(machine.flops_for(chosen.name))
    model = CostModel(net, 256, 4, machine, rate, chosen, overlap=True)
    auto = plan_network(model, groups=True)
    data = evaluate(CostModel(net, 256, 4, machine, rate, chosen,
                              overlap=True), pure_batch(model.segment_kinds, 4))
    return {"machine": machine.name, "batch": 256, "procs": 4,
            "data_parallel_time": data.iteration_time, "auto_time": auto.iteration_time,
            "gain": data.iteration_time / auto.iteration_time - 1,
            "regions_on_groups": regions_on_groups(auto, net),
            "auto_plan": describe_plan(auto)}


def run_side_study(nets: list[NetSpec], machines: list[Machine], least_batch: int = SIDE_BATCH,
                   procs: tuple[int, ...] = SIDE_PROCS, precision: str = "fp32") -> SideStudy:
    """:func:`side_row` for every machine, net, batch-norm choice and P, B = max(least, P),
    and :func:`flexflow_case`."""
    study = SideStudy(least_batch, precision)
    start = time.perf_counter()
    sweep(study, nets, machines, SIDE_STATISTICS, procs, least_batch, precision,
          lambda net, machine, batch, p, statistics, chosen: side_row(
              net.with_statistics(statistics, p), machine, batch, p, chosen))
    study.flexflow = flexflow_case(precision)
    study.seconds = time.perf_counter() - start
    return study


def write_side_hdf5(path: Path, study: SideStudy, attrs: dict[str, object]) -> None:
    """Write the study to ``path`` atomically: ``side_by_side/<machine>/<net>_<statistics>``,
    one dataset per column, and FlexFlow's case as attributes of ``side_by_side/flexflow``."""
    def fill(out) -> None:
        out.attrs.update(attrs)
        seconds = ("serial_time", "groups_time", "side_by_side", "serial_seconds",
                   "groups_seconds")
        top = write_sweep(out, "side_by_side", study, SIDE_NOTE, SIDE_COLUMNS,
                          {**dict.fromkeys(seconds, "s"), "gain": "1"})
        top.create_group("flexflow").attrs.update(study.flexflow)

    runlog.write_hdf5(path, fill)


def side_summary(study: SideStudy) -> str:
    """Per machine, net and statistics, the two auto plans at each P, and FlexFlow's case, in
    lines."""
    lines = [f"auto with every branch on every rank (serial) against branches allowed on groups "
             f"of ranks; B = max({study.least_batch}, P); times in ms"]
    for (machine, net, statistics), t in study.tables.items():
        lines.append(f"  {machine}, {net}, statistics {statistics}")
        for k in range(len(t["procs"])):
            lines.append(f"    P={t['procs'][k]:<5d} B={t['batch'][k]:<5d} "
                         f"serial {t['serial_time'][k] * 1e3:8.3f}  groups "
                         f"{t['groups_time'][k] * 1e3:8.3f}  gain {t['gain'][k]:6.1%}  "
                         f"regions on groups {t['regions_on_groups'][k]:2d}  planned in "
                         f"{t['groups_seconds'][k]:.1f} s")
    f = study.flexflow
    lines.append(f"  FlexFlow's case: inception_v3 on {f['procs']} GPUs of one node "
                 f"({f['machine']}), B = {f['batch']}, statistics per rank: data parallel "
                 f"{f['data_parallel_time'] * 1e3:.3f} ms, auto {f['auto_time'] * 1e3:.3f} ms "
                 f"({f['gain']:+.1%}), {f['regions_on_groups']} regions on groups")
    lines.append(f"  priced {sum(len(t['procs']) for t in study.tables.values())} points in "
                 f"{study.seconds:.1f} s")
    return "\n".join(lines)
