"""The paper's Section 3 study from the cost model: strong, weak and domain scaling.

Gholami et al. (SPAA 2018, Sec. 3) predict the communication time per epoch of AlexNet on Cori
for every Pr×Pc grid of P processes and show that the best grid is rarely pure batch (1×P) or
pure model (P×1) parallelism. This module recomputes that study from the α–β model, with no MPI
and nothing run, and adds what the implementation's planner would choose. Three studies:

- ``strong``: B = 2048 (``--strong-batch``), P = 8, 16, …, 512;
- ``weak``: B = 16·P (``--weak-batch-per-rank``), P = 8, …, 512: every rank keeps 16 samples,
  the local batch at which the paper's strong-scaling study ends (2048 / 128);
- ``domain``: B = 512 (``--domain-batch``), P = 512, 1024, 2048, 4096: beyond P = B pure batch
  parallelism has less than one sample per rank, and splitting the image height (domain
  parallelism, Eq. 9) is what lets the convolutions use more processes.

Each row is one (P, strategy, Pr, Pc), for every factorisation with Pc ≤ B, under the paper's
equations (:func:`hpctrain.plan.paper.strategy_comm`): ``1.5d`` (every layer on Pr×Pc),
``conv-batch`` (convolutions batch parallel over all P, fully connected layers 1.5D on Pr×Pc)
and, in the domain study, ``integrated`` (convolutions domain parallel on Pr×Pc, fully
connected layers 1.5D). Compute per epoch follows the paper's perfect-scaling assumption: the
forward and backward FLOPs of one iteration at batch B (whole-batch kernels, FLOP-rate model),
divided evenly over P ranks, at the machine's FLOP rate, times B-sized iterations per epoch
(images / B, kept fractional as the paper does).

Per (B, P) the study also records the plan :func:`hpctrain.plan.planner.plan_network` chooses and
two baselines, all three costed by the implementation-faithful model (:mod:`hpctrain.plan.pricing`:
reduce-scatter as the adjoint of the all-gather, the all-gather deferred past pooling,
redistribution between layouts, batch norm's statistics, compute at the largest local block,
the optimizer's update of each rank's weight shard), so their times are not the paper's numbers
and are stored apart, one group each:

- ``auto``: the planner's plan, exact over every layer's (mode, Pr×Pc);
- ``pure_batch``: every weighted layer batch parallel on 1×P;
- ``weird_trick``: Krizhevsky's "one weird trick" (2014): convolutions batch parallel on 1×P,
  the fully connected layers model parallel on P×1.

With ``--overlap`` the three are costed as a run with gradient sums in flight: the machine
profile's ``overlap`` share of each sum hides behind the backward below it
(:meth:`hpctrain.plan.planner.PlannedNetwork.hidden_sums`, stored per epoch as
``hidden_per_epoch``).

Both baselines are in the planner's search space, so ``auto`` is never predicted slower;
with ``--overlap`` the planner brackets the optimum rather than finding it (see
:func:`~hpctrain.plan.planner.plan_network`), so a baseline could in principle come out faster by
at most ``auto``'s distance from the planner's lower bound. A
baseline that cannot run at a point (pure batch with P > B leaves ranks without a sample) is
stored as ``runnable`` false with NaN times and the reason as its plan. For each paper row the
same model's time of the same layout is stored too (``impl_total_per_epoch``), with
``runnable`` saying whether hpctrain can execute the layout at all (the paper's equations ignore
that 128 ranks cannot split 64 channels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine
from hpctrain.device.precision import Precision
from hpctrain.layout.partition import factorisations
from hpctrain.model.net import NetSpec
from hpctrain.plan.baselines import BASELINES, strategy_plan
from hpctrain.plan.paper import strategy_comm
from hpctrain.plan.planner import PlannerError, iteration_flops, plan_network
from hpctrain.plan.plans import LayerPlan
from hpctrain.plan.pricing import CostModel
from hpctrain.record import runlog
from hpctrain.study.outcome import Outcome, cost_choices, describe_plan, summarise_plan
from hpctrain.study.records import command_line, write_table

STRONG_PROCS = (8, 16, 32, 64, 128, 256, 512)
WEAK_PROCS = STRONG_PROCS
DOMAIN_PROCS = (512, 1024, 2048, 4096)
STUDY_STRATEGIES = {"strong": ("1.5d", "conv-batch"), "weak": ("1.5d", "conv-batch"),
                    "domain": ("integrated", "conv-batch", "1.5d")}
AUTO_NOTE = ("auto: the plan of hpctrain.plan.planner.plan_network, costed by the implementation-"
             "faithful model (reduce-scatter adjoint of the all-gather, deferred all-gather, "
             "redistribution between layouts, compute at the largest local block, the "
             "optimizer's update of each rank's weight shard); not the "
             "paper's equations, so compare it with the rows' impl_total_per_epoch, not with "
             "their total_per_epoch")
#: the implementation model's plans at every (B, P), one HDF5 group each, and what each is
PLANS = {
    "auto": AUTO_NOTE,
    "pure_batch": "pure batch parallelism: every conv and linear layer batch parallel on 1xP",
    "weird_trick": "one weird trick (Krizhevsky 2014): convolutions batch parallel on 1xP, "
                   "fully connected layers model parallel on Px1",
}
PLAN_COLUMNS = ("per P: runnable (false: NaN times, plan says why), iteration_time (s), "
                "per-epoch total = compute + comm, comm = layer_comm (inside layers: weight "
                "gradients, halos, batch norm statistics) + redistribution (between layouts), "
                "plan (every weighted layer's mode and grid), plan_summary (per kind and "
                "kernel: how many layers chose each mode and grid)")


@dataclass
class Study:
    """One study's rows (one per P, strategy, Pr, Pc), per-P summaries and attributes."""

    name: str
    description: str
    rows: dict[str, list] = field(default_factory=dict)
    best: dict[str, list] = field(default_factory=dict)
    plans: dict[str, dict[str, list]] = field(default_factory=lambda: {n: {} for n in PLANS})
    attrs: dict[str, object] = field(default_factory=dict)

    @property
    def auto(self) -> dict[str, list]:
        return self.plans["auto"]

    def add(self, table: dict[str, list], **values: object) -> None:
        for key, value in values.items():
            table.setdefault(key, []).append(value)


@dataclass(frozen=True)
class Settings:
    """What the three studies are run on: the net, the machine, the epoch and the batches."""

    net: NetSpec
    machine: Machine
    images: int
    precision: Precision  # what messages and buffers are priced in (--precision)
    strong_batch: int
    weak_batch_per_rank: int
    domain_batch: int
    overlap: bool = False  # the implementation model's plans with gradient sums in flight
    bn_group: str | int = "global"  # batch norm's statistics groups (--bn-group)

    @property
    def word_bytes(self) -> int:
        """Bytes of one activation or weight entry, the paper's word (the storage size)."""
        return self.precision.itemsize


class _Compute:
    """Forward and backward seconds of one iteration's kernels at the whole batch on one rank,
    per batch size (cached): the paper's compute, without the optimizer's update, which the
    implementation model adds per weight shard."""

    def __init__(self, net: NetSpec, flops: FlopModel) -> None:
        self.net, self.flops = net, flops
        self.known: dict[int, float] = {}

    def iteration(self, batch: int) -> float:
        if batch not in self.known:
            self.known[batch] = iteration_flops(self.net, batch) / self.flops.rate
        return self.known[batch]


# the auto group's column of its speedup over each baseline (speedup_over_batch kept from
# before the one weird trick was added)
SPEEDUP_OVER = {"pure_batch": "speedup_over_batch", "weird_trick": "speedup_over_weird_trick"}


class ImplementationPlans:
    """The implementation model and its three plans per (B, P), each built once: the weak
    study's P = 128 is the strong study's point, and the domain study's batch limit P = B is
    usually its first point."""

    def __init__(self, settings: Settings, flops: FlopModel) -> None:
        self.settings, self.flops = settings, flops
        self.models: dict[tuple[int, int], CostModel] = {}
        self.outcomes: dict[tuple[int, int, str], Outcome] = {}
        self._costed: dict[tuple[int, int, tuple[LayerPlan, ...]], Outcome] = {}

    def model(self, batch: int, procs: int) -> CostModel:
        if (batch, procs) not in self.models:
            s = self.settings
            net = s.net.with_statistics(s.bn_group, procs)
            self.models[batch, procs] = CostModel(net, batch, procs, s.machine, self.flops,
                                                  s.precision, s.overlap)
        return self.models[batch, procs]

    def cost(self, batch: int, procs: int, choices: list[LayerPlan]) -> Outcome:
        """:func:`~hpctrain.study.outcome.cost_choices` at (``batch``, ``procs``), once per
        distinct plan: a study's rows, the baselines and other strategies' 1×P rows name the same
        plans again."""
        key = (batch, procs, tuple(choices))
        if key not in self._costed:
            self._costed[key] = cost_choices(self.model(batch, procs), choices)
        return self._costed[key]

    def outcome(self, batch: int, procs: int, name: str) -> Outcome:
        """The plan ``name`` (a key of :data:`PLANS`) at (``batch``, ``procs``)."""
        key = (batch, procs, name)
        if key not in self.outcomes:
            model = self.model(batch, procs)
            if name != "auto":
                self.outcomes[key] = self.cost(batch, procs,
                                               BASELINES[name](model.segment_kinds, procs))
            else:
                try:
                    self.outcomes[key] = Outcome(plan_network(model))
                except PlannerError as err:  # a small net on many ranks: record why
                    self.outcomes[key] = Outcome(None, str(err))
        return self.outcomes[key]


def _plan_columns(net: NetSpec, outcome: Outcome, iterations: float) -> dict[str, object]:
    """One row of a plan group: per-iteration and per-epoch seconds, split, description."""
    planned = outcome.planned
    if planned is None:
        return {"runnable": False, "iteration_time": math.nan, "total_per_epoch": math.nan,
                "compute_per_epoch": math.nan, "comm_per_epoch": math.nan,
                "layer_comm_per_epoch": math.nan, "redistribution_per_epoch": math.nan,
                "hidden_per_epoch": math.nan, "plan": f"none: {outcome.why_not}",
                "plan_summary": "none"}
    totals = planned.totals()
    return {"runnable": True, "iteration_time": planned.iteration_time,
            "total_per_epoch": planned.iteration_time * iterations,
            "compute_per_epoch": totals["compute"] * iterations,
            "comm_per_epoch": (totals["communication"] + totals["redistribution"]) * iterations,
            "layer_comm_per_epoch": totals["communication"] * iterations,
            "redistribution_per_epoch": totals["redistribution"] * iterations,
            # the part of comm_per_epoch that hides behind the backward (--overlap)
            "hidden_per_epoch": planned.hidden_sums() * iterations,
            "plan": describe_plan(planned), "plan_summary": summarise_plan(net, planned)}


def _speedup(baseline: Outcome, auto: Outcome) -> float:
    """Baseline time over auto's; NaN where either has none."""
    if baseline.planned is None or auto.planned is None:
        return math.nan
    return baseline.planned.iteration_time / auto.planned.iteration_time


def grids_for(strategy: str, procs: int, batch: int) -> list[tuple[int, int]]:
    """Every Pr×Pc = P on which ``strategy`` leaves no rank without a sample: Pc ≤ B, and for
    ``conv-batch`` also P ≤ B, since its convolutions split the batch over all P ranks."""
    if strategy == "conv-batch" and procs > batch:
        return []
    return [grid for grid in factorisations(procs) if grid[1] <= batch]


def run_study(name: str, description: str, points: list[tuple[int, int]], settings: Settings,
              compute: _Compute, impl: ImplementationPlans) -> Study:
    """Every row, the best grid per (P, strategy), and the auto plan with its baselines at each
    (B, P) point."""
    net, machine, word = settings.net, settings.machine, settings.word_bytes
    study = Study(name, description)
    strategies = STUDY_STRATEGIES[name]
    for batch, procs in points:
        iterations = settings.images / batch
        compute_epoch = compute.iteration(batch) / procs * iterations
        model = impl.model(batch, procs)
        batch_rows: dict[str, float] = {}
        for strategy in strategies:
            best: tuple[float, tuple[int, int]] | None = None
            for grid in grids_for(strategy, procs, batch):
                comm = sum(f + b for f, b in strategy_comm(net, strategy, batch, grid, machine,
                                                           word)) * iterations
                total = compute_epoch + comm
                choices = strategy_plan(model.segment_kinds, strategy, grid)
                planned = impl.cost(batch, procs, choices).planned
                runnable = planned is not None
                impl_total = planned.iteration_time * iterations if runnable else math.nan
                study.add(study.rows, procs=procs, batch=batch, iterations_per_epoch=iterations,
                          strategy=strategy, pr=grid[0], pc=grid[1], comm_per_epoch=comm,
                          compute_per_epoch=compute_epoch, total_per_epoch=total,
                          runnable=runnable, impl_total_per_epoch=impl_total)
                if grid[0] == 1:
                    batch_rows[strategy] = total
                if best is None or total < best[0]:
                    best = (total, grid)
            if best is None:
                continue  # conv-batch beyond P = B
            baseline = batch_rows.get(strategy, math.nan)  # none when P > B
            study.add(study.best, procs=procs, batch=batch, strategy=strategy, pr=best[1][0],
                      pc=best[1][1], total_per_epoch=best[0], batch_total_per_epoch=baseline,
                      speedup_over_batch=baseline / best[0])
        outcomes = {plan: impl.outcome(batch, procs, plan) for plan in PLANS}
        for plan, outcome in outcomes.items():
            study.add(study.plans[plan], procs=procs, batch=batch,
                      **_plan_columns(net, outcome, iterations))
        study.add(study.auto, **{key: _speedup(outcomes[plan], outcomes["auto"])
                                 for plan, key in SPEEDUP_OVER.items()})
    return study


def _add_baseline_limits(study: Study, settings: Settings, compute: _Compute,
                         impl: ImplementationPlans) -> None:
    """Speedups over each baseline at its scaling limit P = B, for points where it cannot run.

    Beyond P = B pure batch and one weird trick leave ranks without a sample, so the fair
    baseline is the fastest run of them there is: on B ranks. Pure batch under the paper's
    equations for the strategy rows; both baselines under the implementation's model for the
    auto plan (NaN where a baseline cannot run even there).
    """
    net, machine, word = settings.net, settings.machine, settings.word_bytes
    batch = settings.domain_batch
    iterations = settings.images / batch
    paper = compute.iteration(batch) / batch * iterations + sum(
        f + b for f, b in strategy_comm(net, "1.5d", batch, (1, batch), machine, word)
    ) * iterations
    study.attrs["batch_limit_procs"] = batch
    study.attrs["batch_limit_total_per_epoch"] = paper
    study.best["speedup_over_batch_limit"] = [paper / t for t in study.best["total_per_epoch"]]
    for plan, attr in (("pure_batch", "batch_limit_impl_total_per_epoch"),
                       ("weird_trick", "weird_trick_limit_total_per_epoch")):
        planned = impl.outcome(batch, batch, plan).planned
        limit = math.nan if planned is None else planned.iteration_time * iterations
        study.attrs[attr] = limit
        study.auto[f"{SPEEDUP_OVER[plan]}_limit"] = [limit / t
                                                     for t in study.auto["total_per_epoch"]]


def run_studies(settings: Settings) -> list[Study]:
    """The strong, weak and domain studies of ``settings``."""
    # one instance: its rate is all it holds
    flops = FlopModel(settings.machine.flops_for(settings.precision.name))
    compute = _Compute(settings.net, flops)
    impl = ImplementationPlans(settings, flops)
    b, per_rank, bd = settings.strong_batch, settings.weak_batch_per_rank, settings.domain_batch
    studies = [
        run_study("strong", f"strong scaling: B = {b}, P = {STRONG_PROCS[0]}..{STRONG_PROCS[-1]}",
                  [(b, p) for p in STRONG_PROCS], settings, compute, impl),
        run_study("weak", f"weak scaling: B = {per_rank} x P, P = {WEAK_PROCS[0]}.."
                          f"{WEAK_PROCS[-1]} (every rank keeps {per_rank} samples)",
                  [(per_rank * p, p) for p in WEAK_PROCS], settings, compute, impl),
        run_study("domain", f"domain parallelism: B = {bd}, P = {DOMAIN_PROCS[0]}.."
                            f"{DOMAIN_PROCS[-1]}; grids with Pc ≤ B only",
                  [(bd, p) for p in DOMAIN_PROCS], settings, compute, impl),
    ]
    _add_baseline_limits(studies[2], settings, compute, impl)
    return studies


def write_hdf5(path: Path, studies: list[Study], attrs: dict[str, object]) -> None:
    """Write every study to ``path`` atomically: a temporary file in the same directory, then
    ``os.replace``, so a crash leaves the old file or the new one, never half of one."""

    def fill(out) -> None:
        out.attrs.update(attrs)
        for study in studies:
            group = out.create_group(study.name)
            group.attrs["description"] = study.description
            group.attrs["strategies"] = ",".join(STUDY_STRATEGIES[study.name])
            group.attrs.update(study.attrs)
            write_table(group, study.rows)
            best = group.create_group("best")
            best.attrs["description"] = ("per (P, strategy): the grid of least total time "
                                         "per epoch, and the 1xP (pure batch) time over it "
                                         "(NaN where 1xP has Pc > B)")
            write_table(best, study.best)
            for plan, note in PLANS.items():
                table = group.create_group(plan)
                table.attrs["description"] = note
                table.attrs["columns"] = PLAN_COLUMNS
                write_table(table, study.plans[plan])

    runlog.write_hdf5(path, fill)


def root_attrs(settings: Settings, argv: list[str]) -> dict[str, object]:
    """The file's attributes: the settings, the machine's constants and what made it."""
    from hpctrain import __version__

    m = settings.machine
    return {"net": settings.net.name, "machine": m.name, "alpha": m.alpha, "beta": m.beta,
            "flops": m.flops, "images": settings.images, "word_bytes": settings.word_bytes,
            "precision": settings.precision.name,
            "precision_flops": m.flops_for(settings.precision.name),
            "strong_batch": settings.strong_batch,
            "weak_batch_per_rank": settings.weak_batch_per_rank,
            "domain_batch": settings.domain_batch, "hpctrain_version": __version__,
            "overlap": settings.overlap,
            "overlap_share": m.overlap if settings.overlap else 0.0,
            "bn_group": str(settings.bn_group),
            "command": command_line(argv),
            "compute_model": "paper rows: whole-batch forward+backward FLOPs of one iteration "
                             "/ P / flops x images/B (perfect scaling, no optimizer update); "
                             "auto and impl: FLOP model per largest local block, with the "
                             "update",
            "paper_model": "hpctrain.plan.paper.strategy_comm (Eq. 3, 4, 7, 8, 9)",
            "auto_note": AUTO_NOTE,
            "plans": ",".join(PLANS)}


def summary(studies: list[Study]) -> str:
    """Per study, the best grid per (P, strategy) and the implementation model's plans, in
    lines."""
    lines = []
    for study in studies:
        lines.append(f"{study.name}: {study.description}")
        best = study.best
        for k in range(len(best["procs"])):
            speedup = best["speedup_over_batch"][k]
            note = (f"{speedup:5.2f}x over 1x{best['procs'][k]}" if math.isfinite(speedup)
                    else "1xP impossible")
            if "speedup_over_batch_limit" in best:
                note += f", {best['speedup_over_batch_limit'][k]:5.2f}x over batch limit"
            lines.append(f"  P={best['procs'][k]:<5d} B={best['batch'][k]:<5d} "
                         f"{best['strategy'][k]:<11s} best {best['pr'][k]}x{best['pc'][k]:<5d} "
                         f"{best['total_per_epoch'][k]:9.2f} s/epoch  {note}")
        lines.append("  implementation model, s/epoch (auto's speedup over each baseline; "
                     "beyond P = B over the baseline on B ranks):")
        auto = study.auto
        for k in range(len(auto["procs"])):
            parts = [f"auto {auto['total_per_epoch'][k]:9.2f}"]
            for plan, label in (("pure_batch", "pure batch"), ("weird_trick", "weird trick")):
                time = study.plans[plan]["total_per_epoch"][k]
                over = SPEEDUP_OVER[plan]
                if math.isfinite(time):
                    parts.append(f"{label} {time:9.2f} ({auto[over][k]:4.2f}x)")
                elif f"{over}_limit" in auto:
                    parts.append(f"{label} cannot run ({auto[f'{over}_limit'][k]:4.2f}x)")
                else:
                    parts.append(f"{label} cannot run")
            lines.append(f"  P={auto['procs'][k]:<5d} B={auto['batch'][k]:<5d} "
                         + "  ".join(parts))
    return "\n".join(lines)
