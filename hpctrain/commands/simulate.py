"""``python -m hpctrain simulate``: the paper's Section 3 study from the cost model, to HDF5.

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

``--levels`` runs a fourth study instead, of flat against levelled planning, on a machine
profile with levels (:attr:`hpctrain.cost.machine.Machine.levelled`: the link inside a node and
the network between nodes). For each net (AlexNet, ResNet-50 and Inception-v3, or ``--net``) and
P = 8, 16, …, 4096 at B = max(``--strong-batch``, P), and at B = ``--domain-batch`` for the P of
the domain study beyond it (fewer samples than ranks: images are split too), it plans twice: on
the levelled profile, and on :meth:`~hpctrain.cost.machine.Machine.flattened` (the network's
link between every pair of ranks, what a planner without levels sees); then it prices the flat
plan on the levelled profile (:func:`compare_levels`). The flat plan is never predicted faster
there than the levelled plan (the planner is exact); by how much it is slower is the ``loss``.

``--volumes`` runs a fifth study instead, of a net on 3-D volumes under a memory cap per rank
(``--mem-per-rank``, default 40 GiB, an A100 of the default ``--machine perlmutter-gpu``):
CosmoFlow (or ``--net``) at 128³ and 512³, P = 8, 16, …, 4096, strong scaling at B =
``--strong-batch`` (default 64 here) and weak scaling at B = P / :data:`WEAK_RANKS_PER_SAMPLE`
(one volume per rank at 128³; one per node of 4 GPUs at 512³, where one volume needs 75.6 GiB,
more than one GPU has). At each point the planner's plan under the cap (``auto``) and pure batch
parallelism, which runs only where P ≤ B and its predicted peak fits the cap: per plan the
iteration time, samples per second, speedup and efficiency over the least P where it runs,
peak memory per rank and the first layer's mode and grid (:func:`volumes_table`).

``--ddp`` runs a sixth study instead: hpctrain's auto plan against the step users would run
otherwise, PyTorch's DistributedDataParallel, as the cost model prices it
(:mod:`hpctrain.plan.ddp`: pure batch, statistics per rank, 25 MiB gradient buckets in flight
with the profile's overlap share hidden). Per machine profile (dgx-h100 and perlmutter-gpu, or
``--machine``), net (ResNet-50, Inception-v3 and CosmoFlow, or ``--net``) and batch-norm choice
(per rank, as DDP; global, hpctrain's exact default; one for a net without batch norm), at P =
8, 16, …, 4096 and B = max(``--strong-batch``, P): DDP's step and the auto plan under the same
terms. The auto plan is never predicted slower (DDP's plan is in its space); where it is
faster, by how much and with which plan is the study's answer. Memory is not capped.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine, MachineError, available_machines, load_machine
from hpctrain.cost.nodes import Group, halo_crossings, span
from hpctrain.device.precision import PRECISIONS, Precision, resolve_precision
from hpctrain.errors import ArgumentParser, OutputError, UserError, shown
from hpctrain.io.locations import checkout_root
from hpctrain.layout.partition import SplitError, factorisations
from hpctrain.model.net import NetSpec, load_net
from hpctrain.plan.baselines import BASELINES, strategy_plan
from hpctrain.plan.ddp import against_ddp
from hpctrain.plan.paper import strategy_comm
from hpctrain.plan.planner import (
    PlannedNetwork,
    PlannerError,
    evaluate,
    iteration_flops,
    plan_network,
)
from hpctrain.plan.plans import LayerPlan
from hpctrain.plan.pricing import CostModel
from hpctrain.record import runlog

STUDIES_OUT, LEVELS_OUT = "runs/simulation.h5", "runs/levels.h5"  # the default --out
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
        """Bytes of one activation or weight entry, the paper's word: the storage size."""
        return self.precision.itemsize


# -- command line -----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from hpctrain.commands.flags import add_net_options, parse_size
    from hpctrain.commands.plan import add_planning_precision

    parser = ArgumentParser(
        prog="python -m hpctrain simulate",
        description="Predict communication and total time per epoch of a net for every Pr x Pc "
                    "grid under the paper's equations (Gholami et al., SPAA 2018, Sec. 3): "
                    "strong scaling (B = 2048, P = 8..512), weak scaling (B = 16 P) and domain "
                    "parallelism beyond P = B (B = 512, P = 512..4096), with the planner's "
                    "auto plan at every point. With --levels instead: plans made with and "
                    "without the machine's levels (inside a node, between nodes), priced on "
                    "the levelled machine, P = 8..4096. With --volumes instead: CosmoFlow "
                    "on 128^3 and 512^3 volumes, the auto plan under a memory cap per rank "
                    "against pure batch, P = 8..4096. Pure cost model: no MPI, runs in "
                    "seconds. Writes one HDF5 file; --plots also draws the figures.")
    add_net_options(parser, image_size=False)
    parser.add_argument("--machine", default="cori-knl",
                        help="machine profile by name or TOML path: alpha, beta and the FLOP "
                             "rate of one rank (default: %(default)s, the paper's Table 1); "
                             "--levels needs one with levels")
    parser.add_argument("--images", default="1200000",
                        help="images per epoch; an epoch is images/B iterations "
                             "(default: %(default)s, ImageNet)")
    add_planning_precision(parser, default="fp32")  # the paper's 4-byte word
    parser.add_argument("--strong-batch", default="2048",
                        help="global batch of the strong-scaling study, and the least batch "
                             "of the --levels study, B = max(this, P) (default: %(default)s)")
    parser.add_argument("--weak-batch-per-rank", default="16",
                        help="samples per rank in the weak-scaling study, B = this x P "
                             "(default: %(default)s)")
    parser.add_argument("--domain-batch", default="512",
                        help="global batch of the domain study, P = 512..4096, and of the "
                             "--levels points with P > B (default: %(default)s)")
    parser.add_argument("--overlap", action="store_true",
                        help="cost the implementation model's plans (auto and the baselines) "
                             "with gradient sums in flight, as a run with --overlap: the "
                             "machine profile's 'overlap' share of each sum hides behind the "
                             "backward below it (the paper's rows count every sum, as its "
                             "equations do; cori-knl's share is 0: nothing hides until a "
                             "profile says so)")
    parser.add_argument("--levels", action="store_true",
                        help="instead of the three studies, compare plans made without the "
                             "machine's levels (the network's link between every pair of "
                             "ranks) with plans made with them, both priced on the levelled "
                             "machine: per net (AlexNet, ResNet-50 and Inception-v3, or --net) "
                             "and P = 8..4096 at B = max(--strong-batch, P); needs --machine "
                             "with levels (ranks_per_node and [network])")
    parser.add_argument("--volumes", action="store_true",
                        help=f"instead of the three studies, the volumes study: {VOLUMES_NET} "
                             f"(or --net, a volume net) on "
                             f"{' and '.join(f'{s}^3' for s in VOLUME_SIZES)} volumes, P = "
                             f"{VOLUMES_PROCS[0]}..{VOLUMES_PROCS[-1]}, strong scaling (B = "
                             f"--strong-batch, default {VOLUMES_STRONG_BATCH} here) and weak "
                             f"scaling (one volume per rank at 128^3, per 4 ranks at 512^3), "
                             f"the auto plan under --mem-per-rank against pure batch where it "
                             f"runs and fits (default --machine {VOLUMES_MACHINE})")
    parser.add_argument("--ddp", action="store_true",
                        help="instead of the three studies, the auto plan against the "
                             "DDP-faithful step (pure batch, statistics per rank, 25 MiB "
                             "gradient buckets in flight with the profile's overlap), each "
                             "batch-norm choice (rank, global) priced alike: ResNet-50, "
                             "Inception-v3 and CosmoFlow (or --net) on dgx-h100 and "
                             "perlmutter-gpu (or --machine), P = 8..4096 at B = "
                             "max(--strong-batch, P)")
    parser.add_argument("--mem-per-rank", type=parse_size, default=None,
                        help="--volumes only: the cap on the predicted peak memory per rank, "
                             "e.g. 40G (default: 40G, an A100 of perlmutter-gpu)")
    parser.add_argument("--out", default=None,
                        help=f"HDF5 file to write, atomically (default: {STUDIES_OUT}; "
                             f"{LEVELS_OUT} with --levels; {VOLUMES_OUT} with --volumes; "
                             f"{DDP_OUT} with --ddp)")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="also draw the PNG figures into DIR "
                             "(analysis/plot_simulation.py of a source checkout; needs "
                             "matplotlib)")
    return parser


def _positive_int(text: str, flag: str) -> int:
    """``text`` as an integer ≥ 1, accepting 1_200_000 and 1.2e6 when they are whole."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise UserError(f"{flag} {shown(text)} is not a number; give a positive integer"
                        ) from None
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise UserError(f"{flag} {shown(text, quoted=False)} must be a positive integer")
    return int(value)


def _settings(args: argparse.Namespace) -> Settings:
    machine = load_machine(args.machine)
    return Settings(load_net(args.net), machine, _positive_int(args.images, "--images"),
                    resolve_precision(args.precision, machine.device),
                    _positive_int(args.strong_batch, "--strong-batch"),
                    _positive_int(args.weak_batch_per_rank, "--weak-batch-per-rank"),
                    _positive_int(args.domain_batch, "--domain-batch"), args.overlap,
                    args.bn_group)


# -- the model pieces ---------------------------------------------------------------------------

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


@dataclass(frozen=True)
class Outcome:
    """One plan at one (B, P) under the implementation model: its costs, or why it has none."""

    planned: PlannedNetwork | None
    why_not: str = ""


def cost_choices(model: CostModel, choices: list[LayerPlan]) -> Outcome:
    """:func:`~hpctrain.plan.planner.evaluate` of ``choices``, or the first segment's reason it
    cannot run."""
    try:
        return Outcome(evaluate(model, choices))
    except SplitError as err:
        return Outcome(None, str(err))


def describe_plan(planned: PlannedNetwork) -> str:
    """``conv1=batch 1x512, conv2=model 2x256, …``: every weighted layer's mode and grid."""
    return ", ".join(f"{c.layer}={p.describe()}" for c, p in zip(planned.layers, planned.plans,
                                                                     strict=True)
                     if p.mode != "follow")


def summarise_plan(net: NetSpec, planned: PlannedNetwork) -> str:
    """How many weighted layers of each kind (convolutions per kernel shape, since a 1×1
    kernel needs no halo) chose each mode and grid, e.g. ``conv 1x1: 30 domain 8x512, 6 model
    8x512; conv 3x3: 16 domain 8x512; linear: 1 model 8x512``."""
    counts: dict[str, dict[str, int]] = {}
    for spec, plan in zip(net.layers, planned.plans, strict=True):
        if plan.mode == "follow":
            continue
        kernel = getattr(spec.options, "kernel", None)
        group = spec.kind if kernel is None else f"{spec.kind} {'x'.join(map(str, kernel))}"
        chosen = counts.setdefault(group, {})
        chosen[plan.describe()] = chosen.get(plan.describe(), 0) + 1
    return "; ".join(f"{group}: " + ", ".join(f"{n} {what}" for what, n in sorted(
        chosen.items(), key=lambda item: -item[1])) for group, chosen in counts.items())


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
        """:func:`cost_choices` at (``batch``, ``procs``), once per distinct plan: a study's
        rows, the baselines and other strategies' 1×P rows name the same plans again."""
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


# -- HDF5 ---------------------------------------------------------------------------------------

def _units(key: str) -> str | None:
    """The units of a column: seconds, a pure number, or none (labels, flags, counts)."""
    if key.startswith("speedup") or key == "iterations_per_epoch":
        return "1"
    if key.endswith("_per_epoch") or key == "iteration_time":
        return "s"
    return None


def _write_table(group, table: dict[str, list]) -> None:
    import h5py

    for key, values in table.items():
        if values and isinstance(values[0], str):
            data = np.array(values, dtype=h5py.string_dtype("utf-8"))
        elif values and isinstance(values[0], bool):
            data = np.array(values, dtype=bool)
        elif values and isinstance(values[0], int):
            data = np.array(values, dtype=np.int64)
        else:
            data = np.array(values, dtype=np.float64)
        dataset = group.create_dataset(key, data=data)
        if _units(key) is not None:
            dataset.attrs["units"] = _units(key)


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
            _write_table(group, study.rows)
            best = group.create_group("best")
            best.attrs["description"] = ("per (P, strategy): the grid of least total time "
                                         "per epoch, and the 1xP (pure batch) time over it "
                                         "(NaN where 1xP has Pc > B)")
            _write_table(best, study.best)
            for plan, note in PLANS.items():
                table = group.create_group(plan)
                table.attrs["description"] = note
                table.attrs["columns"] = PLAN_COLUMNS
                _write_table(table, study.plans[plan])

    runlog.write_hdf5(path, fill)


def _root_attrs(settings: Settings, argv: list[str]) -> dict[str, object]:
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
            "command": shlex.join(["python", "-m", "hpctrain", "simulate", *argv]),
            "compute_model": "paper rows: whole-batch forward+backward FLOPs of one iteration "
                             "/ P / flops x images/B (perfect scaling, no optimizer update); "
                             "auto and impl: FLOP model per largest local block, with the "
                             "update",
            "paper_model": "hpctrain.plan.paper.strategy_comm (Eq. 3, 4, 7, 8, 9)",
            "auto_note": AUTO_NOTE,
            "plans": ",".join(PLANS)}


def plot_script() -> Path | None:
    """analysis/plot_simulation.py of the source checkout hpctrain runs from; None when it runs
    from an installed wheel, which ships no analysis/."""
    root = checkout_root()
    script = None if root is None else root / "analysis" / "plot_simulation.py"
    return script if script is not None and script.is_file() else None


def _plotting_script() -> Path:
    """The script ``--plots`` runs, refused in one line before any work when it cannot: an
    installed hpctrain has no analysis/, and the script needs matplotlib."""
    import importlib.util

    script = plot_script()
    if script is None:
        raise UserError("--plots needs analysis/plot_simulation.py of a source checkout (an "
                        "installed hpctrain has no analysis/); simulate without --plots, then "
                        "run 'python analysis/plot_simulation.py FILE.h5 --out DIR' in one")
    if importlib.util.find_spec("matplotlib") is None:
        raise UserError("--plots needs matplotlib: pip install 'hpctrain[plots]'")
    return script


def _draw(script: Path, h5: Path, out_dir: str) -> None:
    """Run ``script`` (analysis/plot_simulation.py, a program of its own that reads the HDF5
    file only) on ``h5`` with this Python; it prints each figure it writes."""
    import subprocess

    sys.stdout.flush()
    result = subprocess.run([sys.executable, str(script), str(h5), "--out", out_dir],
                            check=False)
    if result.returncode != 0:
        raise OutputError(f"--plots {out_dir}: {script.name} failed with status "
                          f"{result.returncode} (its message is above); {h5} is written")


def _overlap_line(machine: Machine) -> str:
    if not machine.overlap:
        return (f"--overlap: machine {machine.name} has overlap share 0, so no gradient sum "
                f"hides; give --machine a profile with 'overlap' (calibrate measures it)")
    return (f"--overlap: {machine.overlap:.2f} of each gradient sum may hide behind the "
            f"backward (machine {machine.name}); implementation times count the rest")


def _summary(studies: list[Study]) -> str:
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


# -- flat against levelled planning (--levels) ---------------------------------------------------

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
        _write_table(group, table)
        for key, (units, _) in LEVELS_COLUMNS.items():
            if units is not None:
                group[key].attrs["units"] = units


def _levels_attrs(study: LevelsStudy, precision: Precision, argv: list[str]
                  ) -> dict[str, object]:
    m, net = study.machine, study.machine.network
    return {"machine": m.name, "machine_levels": m.describe(), "flat_machine": m.flattened().name,
            "ranks_per_node": m.ranks_per_node, "alpha": m.alpha, "beta": m.beta,
            "network_alpha": net.alpha if net else m.alpha,
            "network_beta": net.beta if net else m.beta, "nics": net.nics if net else 0.0,
            "flops": m.flops, "word_bytes": precision.itemsize, "precision": precision.name,
            "least_batch": study.least_batch,
            "domain_batch": study.domain_batch,
            "batch_rule": "B = max(least_batch, P); levels_domain: B = domain_batch < P",
            "nets": ",".join(study.tables), **_planned_provenance(argv, LEVELS_NOTE)}


def _planned_provenance(argv: list[str], description: str) -> dict[str, str]:
    """What made a file of a study the planner prices by FLOP rate: the version, the command,
    the compute model and the study's note."""
    from hpctrain import __version__

    return {"hpctrain_version": __version__,
            "command": shlex.join(["python", "-m", "hpctrain", "simulate", *argv]),
            "compute_model": "FLOP model at the machine's rate, per largest local block, with "
                             "the optimizer's update",
            "description": description}


def _levels_summary(study: LevelsStudy) -> str:
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


def _levelled_profiles() -> list[str]:
    """The profiles with levels that --machine finds by name (those that read)."""
    names = []
    for name in available_machines():
        try:
            if load_machine(name).levelled:
                names.append(name)
        except MachineError:
            continue
    return names


# -- CosmoFlow on volumes (--volumes) -------------------------------------------------------------

VOLUMES_OUT = "runs/volumes.h5"  # the default --out of --volumes
VOLUMES_NET, VOLUMES_MACHINE = "cosmoflow", "perlmutter-gpu"  # its default --net and --machine
VOLUMES_CAP = 40 * 2**30  # its default --mem-per-rank: an A100's 40 GB (perlmutter-gpu)
VOLUMES_STRONG_BATCH = 64  # its default --strong-batch
VOLUME_SIZES = (128, 512)  # the volumes' edge: CosmoFlow's own 128³ and the 512³ of its data
VOLUMES_PROCS = tuple(2**k for k in range(3, 13))  # 8, 16, …, 4096
#: the ranks per sample of weak scaling at each volume edge (B = P / this). One volume per rank
#: where one fits a rank (128³, 1.2 GiB), else one volume per node of 4 GPUs (512³, 75.6 GiB;
#: 18.5 GiB per rank with its depth split over the node)
WEAK_RANKS_PER_SAMPLE = {128: 1, 512: 4}
#: the plans of the --volumes study at every (B, P), and what each is
VOLUME_PLANS = {
    "auto": "the planner's plan under the memory cap (plan_network with mem_per_rank)",
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


def volume_outcome(model: CostModel, plan: str, cap: float) -> VolumeOutcome:
    """The plan ``plan`` (a key of :data:`VOLUME_PLANS`) of ``model`` under ``cap`` bytes of
    peak memory per rank."""
    from hpctrain.io.units import format_bytes

    if plan == "auto":
        try:
            return VolumeOutcome(plan_network(model, cap))
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
                  precision: Precision = PRECISIONS["fp32"]) -> dict[str, list]:
    """The rows of the --volumes study at each (B, P) of ``points``: every plan of
    :data:`VOLUME_PLANS` with its columns of :data:`VOLUME_COLUMNS`, and the auto plan's
    speedup over pure batch (NaN where pure batch does not run)."""
    flops = FlopModel(machine.flops_for(precision.name))
    table: dict[str, list] = {}
    for batch, procs in points:
        model = CostModel(net, batch, procs, machine, flops, precision)
        outcomes = {plan: volume_outcome(model, plan, cap) for plan in VOLUME_PLANS}
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
    tables: dict[tuple[int, str], dict[str, list]] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the whole study


def run_volumes(net: NetSpec, machine: Machine, sizes: tuple[int, ...] = VOLUME_SIZES,
                procs: tuple[int, ...] = VOLUMES_PROCS, strong_batch: int = VOLUMES_STRONG_BATCH,
                cap: float = VOLUMES_CAP, precision: Precision = PRECISIONS["fp32"]
                ) -> VolumesStudy:
    """:func:`volumes_table` of ``net`` on volumes of each edge of ``sizes``, strong and weak
    (:func:`volume_points`), at each P of ``procs``, under ``cap`` bytes per rank."""
    study = VolumesStudy(net, machine, cap, strong_batch)
    start = time.perf_counter()
    for size in sizes:
        sized = net.with_image_size(size)
        for scaling in ("strong", "weak"):
            study.tables[size, scaling] = volumes_table(
                sized, machine, volume_points(size, scaling, strong_batch, procs), cap,
                precision)
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
            _write_table(group, table)
            for plan in VOLUME_PLANS:
                for key, (units, _) in VOLUME_COLUMNS.items():
                    if units is not None:
                        group[f"{plan}_{key}"].attrs["units"] = units
            group["auto_speedup_over_batch"].attrs["units"] = "1"

    runlog.write_hdf5(path, fill)


def _volumes_attrs(study: VolumesStudy, precision: Precision, argv: list[str]
                   ) -> dict[str, object]:
    m = study.machine
    return {"net": study.net.name, "machine": m.name, "machine_levels": m.describe(),
            "flops": m.flops, "word_bytes": precision.itemsize, "precision": precision.name,
            "mem_per_rank": float(study.cap),
            "strong_batch": study.strong_batch,
            "weak_ranks_per_sample": ",".join(f"{size}:{n}"
                                              for size, n in WEAK_RANKS_PER_SAMPLE.items()),
            **_planned_provenance(argv, VOLUMES_NOTE)}


def _volumes_summary(study: VolumesStudy) -> str:
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


# -- the --ddp study ---------------------------------------------------------------------------

DDP_OUT = "runs/ddp.h5"  # the default --out of --ddp
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
    for machine in machines:
        study.machines[machine.name] = machine
        chosen = study.precisions[machine.name] = resolve_precision(precision, machine.device)
        for net in nets:
            for statistics in DDP_STATISTICS if has_batch_norm(net) else DDP_STATISTICS[:1]:
                table: dict[str, list] = {}
                for p in procs:
                    row = ddp_row(net, machine, max(least_batch, p), p, statistics, chosen)
                    for key, value in row.items():
                        table.setdefault(key, []).append(value)
                study.tables[machine.name, net.name, statistics] = table
    study.seconds = time.perf_counter() - start
    return study


def write_ddp_hdf5(path: Path, study: DdpStudy, attrs: dict[str, object]) -> None:
    """Write the study to ``path`` atomically: ``ddp/<machine>/<net>_<statistics>``, one
    dataset per column."""
    def fill(out) -> None:
        out.attrs.update(attrs)
        top = out.create_group("ddp")
        top.attrs["description"] = DDP_NOTE
        top.attrs["columns"] = DDP_COLUMNS
        for (machine, net, statistics), table in study.tables.items():
            where = top.require_group(machine)
            where.attrs["machine_levels"] = study.machines[machine].describe()
            where.attrs["overlap"] = study.machines[machine].overlap
            where.attrs["precision"] = study.precisions[machine].name
            group = where.create_group(f"{net}_{statistics}")
            group.attrs.update({"net": net, "statistics": statistics,
                                "batch_rule": f"B = max({study.least_batch}, P)"})
            _write_table(group, table)
            for key in ("ddp_time", "auto_time", "ddp_comm", "auto_comm", "ddp_hidden",
                        "auto_hidden"):
                group[key].attrs["units"] = "s"
            group["speedup"].attrs["units"] = "1"

    runlog.write_hdf5(path, fill)


def ddp_summary(study: DdpStudy) -> str:
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


# the options given on the line, told from their defaults (see _parse)
_TOLD = ("net", "out", "images", "weak_batch_per_rank", "domain_batch", "overlap", "machine",
         "strong_batch", "mem_per_rank", "bn_group")
_NOT_FOR_LEVELS = {"images": "--images", "weak_batch_per_rank": "--weak-batch-per-rank",
                   "overlap": "--overlap", "bn_group": "--bn-group"}
_NOT_FOR_VOLUMES = {"images": "--images", "weak_batch_per_rank": "--weak-batch-per-rank",
                    "domain_batch": "--domain-batch", "overlap": "--overlap",
                    "bn_group": "--bn-group"}


def _parse(argv: list[str]) -> tuple[argparse.Namespace, set[str]]:
    """The options of ``argv``, and which of ``_TOLD`` the line gave: --levels plans three
    nets unless --net names one, and refuses the other studies' options."""
    parser = build_parser()
    unset = object()
    args = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(_TOLD, unset)))
    given = {dest for dest in _TOLD if getattr(args, dest) is not unset}
    for dest in _TOLD:
        if dest not in given:
            setattr(args, dest, parser.get_default(dest))
    if args.out is None:
        args.out = (LEVELS_OUT if args.levels else VOLUMES_OUT if args.volumes
                    else DDP_OUT if args.ddp else STUDIES_OUT)
    return args, given


def _refuse_given(given: set[str], options: dict[str, str], why: str) -> None:
    """Refuse in one line (``why``, naming the ``{flag}``) the first of ``options`` (dest →
    flag) the line gave."""
    for dest, flag in options.items():
        if dest in given:
            raise UserError(why.format(flag=flag))


def _run_levels(args: argparse.Namespace, given: set[str], argv: list[str]) -> int:
    """The --levels study: refuse what it cannot do in one line, before any work; then plan,
    write, summarise (and draw with --plots)."""
    _refuse_given(given, _NOT_FOR_LEVELS, "{flag} belongs to the strong, weak and domain "
                  "studies; --levels takes --net, --machine, --strong-batch, --domain-batch, "
                  "--precision, --out and --plots")
    machine = load_machine(args.machine)
    if not machine.levelled:
        names = _levelled_profiles()
        fix = (f"give --machine {names[0]}" if names else
               "give --machine a profile with ranks_per_node and a [network] table")
        raise UserError(f"--levels needs a machine profile with levels "
                        f"({', '.join([*names, '…'])}); {machine.name} is flat: {fix}")
    nets = [load_net(args.net)] if "net" in given else [load_net(n) for n in LEVELS_NETS]
    least_batch = _positive_int(args.strong_batch, "--strong-batch")
    domain_batch = _positive_int(args.domain_batch, "--domain-batch")
    precision = resolve_precision(args.precision, machine.device)
    out, script = _outputs(args, "levels.h5")
    study = run_levels(nets, machine, least_batch, LEVELS_PROCS, precision, domain_batch,
                       DOMAIN_PROCS)
    write_levels_hdf5(out, study, _levels_attrs(study, precision, argv))
    return _report(out, [_levels_summary(study)], script, args.plots)


def _run_volumes(args: argparse.Namespace, given: set[str], argv: list[str]) -> int:
    """The --volumes study: refuse what it cannot do in one line, before any work; then plan,
    write, summarise (and draw with --plots)."""
    if args.levels:
        raise UserError("--volumes and --levels are two studies; give one of them")
    _refuse_given(given, _NOT_FOR_VOLUMES, "{flag} belongs to the strong, weak and domain "
                  "studies; --volumes takes --net, --machine, --mem-per-rank, --strong-batch, "
                  "--precision, --out and --plots")
    net = load_net(args.net if "net" in given else VOLUMES_NET)
    if len(net.input_shape) != 4:
        raise UserError(f"--volumes needs a net on volumes (input size=DxHxW), such as "
                        f"{VOLUMES_NET}; {net.name} takes input of shape {net.input_shape}")
    machine = load_machine(args.machine if "machine" in given else VOLUMES_MACHINE)
    cap = args.mem_per_rank if "mem_per_rank" in given else VOLUMES_CAP
    strong_batch = (_positive_int(args.strong_batch, "--strong-batch")
                    if "strong_batch" in given else VOLUMES_STRONG_BATCH)
    precision = resolve_precision(args.precision, machine.device)
    out, script = _outputs(args, "volumes.h5")
    study = run_volumes(net, machine, VOLUME_SIZES, VOLUMES_PROCS, strong_batch, cap,
                        precision)
    write_volumes_hdf5(out, study, _volumes_attrs(study, precision, argv))
    return _report(out, [_volumes_summary(study)], script, args.plots)


_NOT_FOR_DDP = {"images": "--images", "weak_batch_per_rank": "--weak-batch-per-rank",
                "domain_batch": "--domain-batch", "overlap": "--overlap",
                "mem_per_rank": "--mem-per-rank", "bn_group": "--bn-group"}


def _run_ddp(args: argparse.Namespace, given: set[str], argv: list[str]) -> int:
    """The --ddp study: refuse what it cannot do in one line, before any work; then price,
    write and summarise."""
    if args.levels or args.volumes:
        raise UserError("--ddp, --levels and --volumes are three studies; give one of them")
    _refuse_given(given, _NOT_FOR_DDP, "{flag} does not apply to --ddp, which prices both "
                  "batch-norm choices with sums in flight; it takes --net, --machine, "
                  "--strong-batch, --precision and --out")
    nets = [load_net(args.net)] if "net" in given else [load_net(n) for n in DDP_NETS]
    machines = ([load_machine(args.machine)] if "machine" in given
                else [load_machine(name) for name in DDP_MACHINES])
    if args.plots is not None:
        raise UserError("--plots draws the other studies' figures; --ddp prints its table")
    out, _ = _outputs(args, "ddp.h5")
    study = run_ddp_study(nets, machines, _positive_int(args.strong_batch, "--strong-batch"),
                          precision=args.precision)
    write_ddp_hdf5(out, study, {"precision": study.precision,
                                "least_batch": study.least_batch,
                                **_planned_provenance(argv, "see ddp.description")})
    return _report(out, [ddp_summary(study)], None, None)


def _outputs(args: argparse.Namespace, example: str) -> tuple[Path, Path | None]:
    """The HDF5 file to write and the plotting script (when --plots), checked before any
    work."""
    out = Path(args.out)
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; give a file path such as {out}/{example}")
    return out, _plotting_script() if args.plots is not None else None


def _report(out: Path, lines: list[str], script: Path | None, plots: str | None) -> int:
    """Print the summary ``lines`` and where the file went, then draw the plots."""
    print("\n".join([*lines, f"wrote {out}"]), flush=True)
    if script is not None:
        _draw(script, out, plots)
    return 0


def run(argv: list[str]) -> int:
    """Run the three studies (the --levels study with ``--levels``, the --volumes study with
    ``--volumes``), write the HDF5 file (and the plots with ``--plots``); 0 on success. Bad
    options raise :class:`~hpctrain.errors.UserError`."""
    args, given = _parse(argv)
    if args.ddp:
        return _run_ddp(args, given, argv)
    if args.volumes:
        return _run_volumes(args, given, argv)
    if "mem_per_rank" in given:
        raise UserError("--mem-per-rank belongs to the --volumes study; the other studies "
                        "plan without a memory cap")
    if args.levels:
        return _run_levels(args, given, argv)
    settings = _settings(args)
    out, script = _outputs(args, "sim.h5")
    studies = run_studies(settings)
    write_hdf5(out, studies, _root_attrs(settings, argv))
    overlap = [_overlap_line(settings.machine)] if settings.overlap else []
    return _report(out, [*overlap, _summary(studies)], script, args.plots)
