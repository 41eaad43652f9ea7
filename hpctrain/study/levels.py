"""Flat against levelled planning (``simulate --levels``).

The study runs on a machine profile with levels (:attr:`hpctrain.cost.machine.Machine.levelled`:
the link inside a node and the network between nodes). For each net (AlexNet, ResNet-50 and
Inception-v3, or ``--net``) and P = 8, 16, …, 4096 at B = max(``--strong-batch``, P), and at B =
``--domain-batch`` for the P of the domain study beyond it (fewer samples than ranks: images are
split too), it plans twice: on the levelled profile, and on
:meth:`~hpctrain.cost.machine.Machine.flattened` (the network's link between every pair of ranks,
what a planner without levels sees); then it prices the flat plan on the levelled profile
(:func:`compare_levels`). The flat plan is never predicted faster there than the levelled plan (the
planner is exact); by how much it is slower is the ``loss``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine, MachineError, available_machines, load_machine
from hpctrain.cost.nodes import Group, halo_crossings, span
from hpctrain.device.precision import PRECISIONS, Precision
from hpctrain.model.net import NetSpec
from hpctrain.plan.planner import PlannedNetwork, evaluate, plan_network
from hpctrain.plan.pricing import CostModel
from hpctrain.record import runlog
from hpctrain.study.outcome import describe_plan, summarise_plan
from hpctrain.study.paper import DOMAIN_PROCS
from hpctrain.study.records import planned_provenance, write_table

LEVELS_PROCS = tuple(2**k for k in range(3, 13))  # 8, 16, …, 4096
LEVELS_NETS = ("alexnet", "resnet50", "inception_v3")
LEVELS_NOTE = ("per net and P: the plan of hpctrain.plan.planner.plan_network on the levelled "
               "machine (levelled), the plan it makes on the machine flattened to the network's "
               "link between every pair of ranks (flat), and the flat plan priced on the "
               "levelled machine; the planner is exact, so the flat plan is never faster there "
               "(loss >= 0)")
#: every column of a net's group in the --levels file, with its units (or None) and what it holds
LEVELS_COLUMNS: dict[str, tuple[str | None, str]] = {
    "procs": (None, "P, the ranks"),
    "batch": (None, "the global batch B = max(strong_batch, P)"),
    "levelled_time": ("s", "iteration time of the levelled plan on the levelled machine"),
    "flat_on_levelled_time": ("s", "iteration time of the flat plan on the levelled machine"),
    "flat_time": ("s", "the flat plan's own prediction, on the flattened machine"),
    "loss": ("1", "flat_on_levelled_time / levelled_time - 1"),
    "segments": (None, "segments: a weighted layer and the layers that follow it"),
    "segments_changed": (None, "segments whose mode or grid differ between the two plans"),
    **{f"{plan}_{key}": (units, f"the {plan} plan's {what}") for plan in ("levelled", "flat")
       for key, units, what in (
           ("widest_model_group", None, "largest Pr of a model-parallel layer (1: none)"),
           ("model_group_crosses_nodes", None, "the widest model group spans nodes"),
           ("domain_halos_crossing", None, "domain-parallel layers with a window taller than "
                                           "one row whose halos cross nodes"),
           ("plan", None, "every weighted layer's mode and grid"),
           ("summary", None, "per kind and kernel, how many layers chose each mode and grid"),
           ("planning_seconds", "s", "wall time of plan_network"))},
}


def widest_model_group(planned: PlannedNetwork) -> int:
    """The largest Pr of a model-parallel layer of ``planned`` (1 when every layer splits the
    batch or the image)."""
    return max((plan.grid[0] for plan in planned.plans if plan.mode == "model"), default=1)


def domain_halos_crossing(net: NetSpec, planned: PlannedNetwork, ranks_per_node: int) -> int:
    """How many domain-parallel layers of ``planned`` exchange halos across nodes: a window
    taller than one row (a 1×1 convolution split by rows needs no halo), on a chain of Pr
    consecutive ranks that crosses a node's edge, as the cost model prices it
    (:func:`hpctrain.cost.nodes.halo_crossings`); 0 on a flat profile (R = 0)."""
    if not ranks_per_node:
        return 0
    return sum(1 for spec, plan in zip(net.layers, planned.plans, strict=True)
               if plan.mode == "domain" and getattr(spec.options, "kernel", (1,))[0] > 1
               and halo_crossings(plan.grid[0], math.prod(plan.grid), ranks_per_node))


@dataclass(frozen=True)
class LevelsComparison:
    """One (net, B, P) of the --levels study: the plan made on the levelled machine, the plan
    made on its flattened profile, and the flat plan priced on the levelled machine."""

    net: NetSpec
    batch: int
    procs: int
    ranks_per_node: int
    levelled: PlannedNetwork
    flat: PlannedNetwork
    flat_on_levelled: PlannedNetwork
    planning_seconds: tuple[float, float]  # plan_network's wall time: levelled, flat

    @property
    def loss(self) -> float:
        """How much slower the flat plan runs on the levelled machine than the levelled plan,
        as a fraction."""
        return self.flat_on_levelled.iteration_time / self.levelled.iteration_time - 1

    def row(self) -> dict[str, object]:
        """The values of :data:`LEVELS_COLUMNS`."""
        pairs = [(a, b) for a, b in zip(self.levelled.plans, self.flat.plans, strict=True)
                 if a.mode != "follow"]
        row: dict[str, object] = {
            "procs": self.procs, "batch": self.batch,
            "levelled_time": self.levelled.iteration_time,
            "flat_on_levelled_time": self.flat_on_levelled.iteration_time,
            "flat_time": self.flat.iteration_time, "loss": self.loss,
            "segments": len(pairs), "segments_changed": sum(a != b for a, b in pairs)}
        for name, planned, seconds in (("levelled", self.levelled, self.planning_seconds[0]),
                                       ("flat", self.flat, self.planning_seconds[1])):
            widest = widest_model_group(planned)
            row[f"{name}_widest_model_group"] = widest
            row[f"{name}_model_group_crosses_nodes"] = bool(
                self.ranks_per_node
                and not span(Group(widest, 1, self.procs), self.ranks_per_node).inside_node)
            row[f"{name}_domain_halos_crossing"] = domain_halos_crossing(
                self.net, planned, self.ranks_per_node)
            row[f"{name}_plan"] = describe_plan(planned)
            row[f"{name}_summary"] = summarise_plan(self.net, planned)
            row[f"{name}_planning_seconds"] = seconds
        return row


def compare_levels(net: NetSpec, machine: Machine, batch: int, procs: int,
                   precision: Precision = PRECISIONS["fp32"]) -> LevelsComparison:
    """Plan ``net`` at (``batch``, ``procs``) on ``machine`` and on
    :meth:`~hpctrain.cost.machine.Machine.flattened`, compute from the FLOP rate, and price the
    flat plan's choice per segment on ``machine``. On a flat profile both plans are one plan,
    and the loss is 0."""
    flops = FlopModel(machine.flops_for(precision.name))
    model = CostModel(net, batch, procs, machine, flops, precision)
    start = time.perf_counter()
    levelled = plan_network(model)
    middle = time.perf_counter()
    flat = plan_network(CostModel(net, batch, procs, machine.flattened(), flops, precision))
    seconds = (middle - start, time.perf_counter() - middle)
    flat_on_levelled = evaluate(model, [flat.plans[head] for head in model.heads])
    return LevelsComparison(net, batch, procs, machine.ranks_per_node, levelled, flat,
                            flat_on_levelled, seconds)


@dataclass
class LevelsStudy:
    """The --levels study: per net, one row of :data:`LEVELS_COLUMNS` per P."""

    machine: Machine
    least_batch: int
    tables: dict[str, dict[str, list]] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the whole study
    domain_batch: int = 0  # 0: no points with P > B
    domain_tables: dict[str, dict[str, list]] = field(default_factory=dict)  # B = domain_batch


def run_levels(nets: list[NetSpec], machine: Machine, least_batch: int = 2048,
               procs: tuple[int, ...] = LEVELS_PROCS,
               precision: Precision = PRECISIONS["fp32"], domain_batch: int = 0,
               domain_procs: tuple[int, ...] = DOMAIN_PROCS
               ) -> LevelsStudy:
    """:func:`compare_levels` for each of ``nets`` at each of ``procs``, with B = max(
    ``least_batch``, P): the strong study's batch while it gives every rank a sample, then one
    sample per rank, so that every layer can still split the batch over all P ranks. With a
    ``domain_batch``, also at B = ``domain_batch`` for each of ``domain_procs`` above it, where
    a layer on P ranks must split its images (or channels) as well as the batch."""
    study = LevelsStudy(machine, least_batch, domain_batch=domain_batch)
    start = time.perf_counter()
    for net in nets:
        study.tables[net.name] = _levels_table(net, machine, [(max(least_batch, p), p)
                                                              for p in procs], precision)
        beyond = [(domain_batch, p) for p in domain_procs if domain_batch and p > domain_batch]
        if beyond:
            study.domain_tables[net.name] = _levels_table(net, machine, beyond, precision)
    study.seconds = time.perf_counter() - start
    return study


def _levels_table(net: NetSpec, machine: Machine, points: list[tuple[int, int]],
                  precision: Precision) -> dict[str, list]:
    """The rows of :data:`LEVELS_COLUMNS` at each (B, P) of ``points``."""
    table: dict[str, list] = {}
    for batch, p in points:
        for key, value in compare_levels(net, machine, batch, p, precision).row().items():
            table.setdefault(key, []).append(value)
    return table


def write_levels_hdf5(path: Path, study: LevelsStudy, attrs: dict[str, object]) -> None:
    """Write the --levels study to ``path`` atomically: a group ``levels`` with one group per
    net, one dataset per column of :data:`LEVELS_COLUMNS`."""

    def fill(out) -> None:
        out.attrs.update(attrs)
        for name, tables, rule in (
                ("levels", study.tables, f"B = max({study.least_batch}, P)"),
                ("levels_domain", study.domain_tables, f"B = {study.domain_batch} < P")):
            if tables:
                _write_levels_group(out.create_group(name), tables, rule)

    runlog.write_hdf5(path, fill)


def _write_levels_group(levels, tables: dict[str, dict[str, list]], rule: str) -> None:
    """One group per net, one dataset per column of :data:`LEVELS_COLUMNS`."""
    levels.attrs["description"] = LEVELS_NOTE
    levels.attrs["columns"] = "; ".join(f"{key}: {what}"
                                        for key, (_, what) in LEVELS_COLUMNS.items())
    levels.attrs["nets"] = ",".join(tables)
    levels.attrs["batch_rule"] = rule
    for name, table in tables.items():
        group = levels.create_group(name)
        group.attrs["net"] = name
        group.attrs["batch_rule"] = rule
        write_table(group, table)
        for key, (units, _) in LEVELS_COLUMNS.items():
            if units is not None:
                group[key].attrs["units"] = units


def levels_attrs(study: LevelsStudy, precision: Precision, argv: list[str]
                 ) -> dict[str, object]:
    """The file's attributes: the machine's two levels, the batches and what made it."""
    m, net = study.machine, study.machine.network
    return {"machine": m.name, "machine_levels": m.describe(), "flat_machine": m.flattened().name,
            "ranks_per_node": m.ranks_per_node, "alpha": m.alpha, "beta": m.beta,
            "network_alpha": net.alpha if net else m.alpha,
            "network_beta": net.beta if net else m.beta, "nics": net.nics if net else 0.0,
            "flops": m.flops, "word_bytes": precision.itemsize, "precision": precision.name,
            "least_batch": study.least_batch,
            "domain_batch": study.domain_batch,
            "batch_rule": "B = max(least_batch, P); levels_domain: B = domain_batch < P",
            "nets": ",".join(study.tables), **planned_provenance(argv, LEVELS_NOTE)}


def levels_summary(study: LevelsStudy) -> str:
    """Per net and P, the two plans' times on the levelled machine and how they differ, in
    lines."""
    m = study.machine
    lines = [f"flat against levelled planning on {m.name} ({m.describe()}); B = max("
             f"{study.least_batch}, P), then B = {study.domain_batch} for P above it; * a model "
             f"group wider than a node; halos: domain layers whose halos cross nodes",
             f"  {'net':<13s} {'P':>5s} {'B':>5s} {'levelled ms':>11s} {'flat plan ms':>12s} "
             f"{'loss %':>7s} {'changed':>8s}  widest model group flat -> levelled, halos"]
    every = [*study.tables.items(), *study.domain_tables.items()]
    for name, t in every:
        for k in range(len(t["procs"])):
            widths = [f"{t[f'{plan}_widest_model_group'][k]}"
                      + ("*" if t[f"{plan}_model_group_crosses_nodes"][k] else "")
                      for plan in ("flat", "levelled")]
            halos = [t[f"{plan}_domain_halos_crossing"][k] for plan in ("flat", "levelled")]
            lines.append(f"  {name:<13s} {t['procs'][k]:>5d} {t['batch'][k]:>5d} "
                         f"{t['levelled_time'][k] * 1e3:>11.3f} "
                         f"{t['flat_on_levelled_time'][k] * 1e3:>12.3f} "
                         f"{t['loss'][k] * 100:>7.2f} "
                         f"{t['segments_changed'][k]:>4d}/{t['segments'][k]:<3d}  "
                         f"{widths[0]} -> {widths[1]}, {halos[0]} -> {halos[1]}")
    slowest = max((seconds, name, procs) for name, t in every
                  for plan in ("levelled", "flat")
                  for seconds, procs in zip(t[f"{plan}_planning_seconds"], t["procs"]))
    lines.append(f"  planned {2 * sum(len(t['procs']) for _, t in every)} times in "
                 f"{study.seconds:.1f} s; slowest plan {slowest[0]:.2f} s ({slowest[1]}, "
                 f"P = {slowest[2]})")
    return "\n".join(lines)


def levelled_profiles() -> list[str]:
    """The profiles with levels that --machine finds by name (those that read)."""
    names = []
    for name in available_machines():
        try:
            if load_machine(name).levelled:
                names.append(name)
        except MachineError:
            continue
    return names
