"""``python -m hpctrain compare-plans``: run several plans, predicted against measured.

Launched on P ranks. For each plan — the planner's (auto), pure batch, every uniform R×C grid,
convolutions batch-parallel with the fully connected layers on each grid, and domain-parallel
convolutions — it predicts the iteration with the cost model, trains a few steps, and measures.
It reports each plan's predicted and measured iteration time, where the auto plan ranks among the
measured plans, and for the auto plan the per-layer communication, predicted against measured.

Both sides see the machine in one state. The compute times of the prediction are timed at the
start of the run, not read from the cache (on a shared 2-core machine one plan's step varied by
a third over half an hour, so a cached timing from another hour priced every plan 20-40 % fast).
The plans are trained in turn, ``--rounds`` times, each measured as the median round, so a
slow minute falls on every plan instead of on whichever ran in it. And the kernels of the plans
are timed again before every round after the first, each priced at its median over the rounds
(the mean of two; ``--kernel-timing each-round``), so a slow moment while they were timed does
not price every plan of the launch (on a virtual machine, a 3-D net's kernels timed twice,
seconds apart, in one launch summed 12-18 % apart). The auto plan is the planner's from the
first timing, as a training run would choose it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hpctrain.commands.flags import (
    add_collectives_option,
    add_net_options,
    add_overlap_option,
    add_planning_options,
    add_precision_option,
    add_threads_option,
    check_space,
    load_net_for,
)
from hpctrain.cost.compute import MedianCompute
from hpctrain.cost.machine import Machine, sums_in_flight, warning_lines
from hpctrain.errors import ArgumentParser, UserError
from hpctrain.layout.partition import SplitError, factorisations
from hpctrain.model.net import NetSpec
from hpctrain.plan.baselines import grid_spec
from hpctrain.plan.planner import PlannedNetwork, evaluate_plan
from hpctrain.plan.plans import plan_from_spec
from hpctrain.plan.pricing import CostModel
from hpctrain.plan.spaces import predict
from hpctrain.record.runlog import communication, measured_fields, predicted_fields
from hpctrain.record.timing import StepTimes


def default_specs(procs: int) -> list[str]:
    """auto, then the strategies of :mod:`hpctrain.plan.baselines` as ``--grid`` values:
    ``1.5d`` on every grid (1xP, every RxC), ``conv-batch`` and ``integrated`` for R > 1; then
    splits of the spatial axes beyond the 1.5D modes: the width cut R ways, and the height and
    width cut a×b ways where R = a·b with a, b > 1 (the last as evenly as R allows)."""
    grids = factorisations(procs)
    found = ["auto", *(grid_spec("1.5d", g) for g in grids),
             *(grid_spec("conv-batch", g) for g in grids[1:]),
             *(grid_spec("integrated", g) for g in grids[1:])]
    for pr, pc in grids[1:]:
        found.append(f"conv=n{pc}w{pr}/model,fc={pr}x{pc}")
        square = [(a, b) for a, b in factorisations(pr) if a > 1 and b > 1 and a <= b]
        if square:
            a, b = square[-1]
            found.append(f"conv=n{pc}h{a}w{b}/model,fc={pr}x{pc}")
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m hpctrain compare-plans",
        description="Train a few steps under each of several plans (launched on P ranks) and "
                    "report predicted against measured iteration time, where the auto plan "
                    "ranks, and the auto plan's per-layer communication, predicted and measured.")
    add_net_options(parser)
    parser.add_argument("--batch", type=int, default=16, help="global mini-batch (default: 16)")
    parser.add_argument("--steps", type=int, default=5,
                        help="steps per plan; the first is a warm-up (default: 5)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="train every plan in turn this many times and keep each plan's "
                             "median round, so that a slow moment of the machine falls on all "
                             "plans alike (default: %(default)s)")
    parser.add_argument("--kernel-timing", choices=("each-round", "once"), default="each-round",
                        help="each-round: time the compared plans' kernels again before every "
                             "round after the first and price each kernel at its median over "
                             "the rounds (the mean of two); once: only at the start, as the "
                             "planner saw them (default: %(default)s)")
    parser.add_argument("--plan", action="append", default=None, dest="plans",
                        help="a --grid value to compare (repeat the flag); default: auto, every "
                             "RxC, conv=1xP,fc=RxC, conv=domain:RxC,fc=RxC, and the width (or "
                             "height and width) cut R ways, conv=nCwR/model,fc=RxC")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="NumPy or CuPy (default: %(default)s)")
    add_collectives_option(parser)
    add_precision_option(parser)
    parser.add_argument("--log", default=None, help="write every plan's timings to this HDF5")
    add_threads_option(parser)
    add_overlap_option(parser)
    add_planning_options(parser)
    return parser


@dataclass
class Outcome:
    spec: str
    planned: PlannedNetwork
    measured_iteration: float
    layer_times: StepTimes  # the slowest rank's
    fastest_rank: StepTimes  # the fastest rank's
    rounds: tuple[float, ...] = ()  # the iteration of every round, s
    # the iteration as the kernels' first timing alone priced it, when they were timed again
    # before every round (--kernel-timing each-round), s
    first_timing: float | None = None

    @property
    def error(self) -> float:
        return self.planned.iteration_time / self.measured_iteration - 1

    @property
    def spread(self) -> tuple[float, float]:
        """The fastest and the slowest round (the median round alone when not known)."""
        found = self.rounds or (self.measured_iteration,)
        return min(found), max(found)


def _run(net: NetSpec, planned: PlannedNetwork, args, backend, comm, machine: Machine
         ) -> Outcome:
    from hpctrain.run.loop import TrainConfig, train

    config = TrainConfig(args.batch, args.steps, 0.001, 0.9, 5e-4, 0, args.steps,
                         overlap=args.overlap, bucket_bytes=machine.bucket_bytes)
    result = train(net, planned.plans, config, backend, comm, out=lambda *_: None)
    return Outcome("", planned, result.iteration, result.layer_times, result.fastest_rank_times)


def compare(args, comm, quiet: bool = False) -> tuple[list[Outcome], NetSpec, Machine]:
    """Every plan's outcome (its median round), with the net and the profile that predicted
    them; ``quiet``: no line per plan and round."""
    from hpctrain.comm.agree import agreed
    from hpctrain.comm.nodes import check_placement
    from hpctrain.cost.machine import load_machine
    from hpctrain.device.backend import make_backend
    from hpctrain.device.threads import configure_threads
    from hpctrain.plan.pricing import build_cost_model

    net = agreed(comm, lambda: load_net_for(args, comm.Get_size()))
    if args.steps < 2:
        raise UserError(f"--steps {args.steps} must be at least 2 (the first is a warm-up)")
    if not 1 <= args.rounds <= 100:
        raise UserError(f"--rounds {args.rounds} must be between 1 and 100")
    procs, rank = comm.Get_size(), comm.Get_rank()
    threads = configure_threads(comm, args.threads)
    if rank == 0 and not quiet:
        print(f"threads: {threads.describe()}", flush=True)
    backend = make_backend(args.device, args.precision, comm,
                           getattr(args, "collectives", "auto"))
    args.precision = backend.precision.name  # resolved: auto is tf32 on a GPU, fp32 on the CPU
    machine = agreed(comm, lambda: load_machine(args.machine))
    check_placement(comm, machine)
    args.overlap = sums_in_flight(args.overlap, machine)  # resolved: on or off from here
    model = build_cost_model(net, args.batch, procs, machine, args.compute, backend, comm,
                             threads, args.overlap, cached=False)
    plans = []
    for spec in args.plans or default_specs(procs):
        try:
            plan = None if spec == "auto" else plan_from_spec(spec, net, procs)
            plans.append((spec, predict(model, plan, args.mem_per_rank, space=args.space,
                                        groups=args.branches == "auto")))
        except SplitError as err:  # a plan this net cannot run here; the same on every rank
            if rank == 0 and not quiet:
                print(f"{spec:<28} skipped: {err}", flush=True)
    # measured compute times again (MeasuredCompute.again); FLOP-rate ones never change
    retime = (args.kernel_timing == "each-round" and args.rounds > 1
              and hasattr(model.compute, "again"))
    first = [planned for _, planned in plans]  # as the first timing priced them
    timings = [model.compute]  # the kernels' timings, one before each round
    rounds: list[list[Outcome]] = [[] for _ in plans]
    for k in range(args.rounds):
        priced = first  # as this round's timing prices them
        if k > 0 and retime:
            timings.append(model.compute.again())
            priced = priced_again(model.timed_by(timings[-1]), first)
        for (spec, _), now, runs in zip(plans, priced, rounds, strict=True):
            outcome = _run(net, now, args, backend, comm, machine)
            outcome.spec = spec
            runs.append(outcome)
            if rank == 0 and not quiet:
                print(f"{spec:<28} round {k + 1}: predicted {now.iteration_time * 1e3:9.2f} "
                      f"ms  measured {outcome.measured_iteration * 1e3:9.2f} ms  "
                      f"({outcome.error:+.1%})", flush=True)
    found = [median_round(runs) for runs in rounds]
    if retime:  # every plan priced again, each kernel at its median over the rounds
        median = priced_again(model.timed_by(MedianCompute(timings)), first)
        found = [replace(o, planned=again, first_timing=was.iteration_time)
                 for o, again, was in zip(found, median, first, strict=True)]
        if rank == 0 and not quiet:
            print(f"predictions: each kernel at its median over {len(timings)} timings, one "
                  f"before each round", flush=True)
    return found, net, machine


def priced_again(model: CostModel, planned: list[PlannedNetwork]) -> list[PlannedNetwork]:
    """The plans of ``planned`` priced by ``model`` (the same model under other compute
    times), with what the planner said of each: the space it searched and whether its rule was
    exact. (Its lower bound is left out: it was priced under the other times.)"""
    return [replace(evaluate_plan(model, p.plans), space_note=p.space_note, exact=p.exact)
            for p in planned]


def median_round(runs: list[Outcome]) -> Outcome:
    """The round whose iteration time is the median (the lower middle one of an even count),
    with every round's time."""
    found = sorted(runs, key=lambda o: o.measured_iteration)[(len(runs) - 1) // 2]
    return replace(found, rounds=tuple(o.measured_iteration for o in runs))


def report(outcomes: list[Outcome]) -> str:
    """Ranking by measured time, and the auto plan's per-layer communication."""
    fastest = min(o.measured_iteration for o in outcomes)
    order = sorted(outcomes, key=lambda o: o.measured_iteration)
    by_prediction = sorted(outcomes, key=lambda o: o.planned.iteration_time)
    lines = [f"{'plan':<28} {'predicted ms':>13} {'measured ms':>12} {'error':>7} "
             f"{'measured rank':>14} {'predicted rank':>15}"]
    for o in order:
        lines.append(f"{o.spec:<28} {o.planned.iteration_time * 1e3:>13.2f} "
                     f"{o.measured_iteration * 1e3:>12.2f} {o.error:>+7.1%} "
                     f"{order.index(o) + 1:>14} {by_prediction.index(o) + 1:>15}")
    errors = [abs(o.error) for o in outcomes]
    lines.append(f"iteration prediction error: median {np.median(errors):.1%}, largest "
                 f"{max(errors):.1%} over {len(outcomes)} plans (each its median round)")
    if all(o.first_timing is not None for o in outcomes):
        first = [abs(o.first_timing / o.measured_iteration - 1) for o in outcomes]
        lines.append(f"priced by the kernels' first timing alone (--kernel-timing once): "
                     f"median {np.median(first):.1%}, largest {max(first):.1%}")
    if len(outcomes) > 2:
        predicted = [o.planned.iteration_time for o in outcomes]
        measured = [o.measured_iteration for o in outcomes]
        rho = spearman(predicted, measured)
        within = spearman(predicted, ranks_within_noise(predicted, measured,
                                                        [o.spread for o in outcomes]))
        lines.append(f"predicted order against measured: Spearman rank correlation {rho:+.2f} "
                     f"(1: the same order); {within:+.2f} with plans whose rounds overlap "
                     f"taken as tied")
        apart, alike = pairs_apart(predicted, [o.spread for o in outcomes])
        lines.append(f"pairs of plans the rounds tell apart (one's slowest round faster than "
                     f"the other's fastest): {apart} of {len(outcomes) * (len(outcomes) - 1) // 2}"
                     + (f", {alike} of them in the predicted order ({alike / apart:.0%})"
                        if apart else ""))
    auto = next((o for o in outcomes if o.spec == "auto"), None)
    if auto is None:
        return "\n".join(lines)
    beaten, level = rank_beyond_noise(auto.spread, [o.spread for o in outcomes if o is not auto])
    lines.append(f"auto plan: measured rank {order.index(auto) + 1} of {len(outcomes)}, "
                 f"{auto.measured_iteration / fastest - 1:+.1%} from the fastest measured "
                 f"({order[0].spec}); beyond the rounds' spread {beaten} plan"
                 f"{'s' if beaten != 1 else ''} faster, {level} within it")
    lines.append(layer_comm_table(auto))
    return "\n".join(lines)


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation of ``a`` and ``b``: the correlation of their ranks, tied
    values sharing the mean of their ranks (0 where either has all values equal)."""

    def ranks(values: list[float]) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        order = np.argsort(values, kind="stable")
        found = np.empty(len(values))
        found[order] = np.arange(len(values), dtype=float)
        for value in np.unique(values):  # ties: the mean of the ranks they span
            same = values == value
            found[same] = found[same].mean()
        return found

    x, y = ranks(a), ranks(b)
    x, y = x - x.mean(), y - y.mean()
    scale = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / scale if scale > 0 else 0.0


def ranks_within_noise(predicted: list[float], measured: list[float],
                       spreads: list[tuple[float, float]]) -> list[float]:
    """The measured ranks, with plans that noise cannot tell apart ranked as predicted.

    Plans taken in measured order form groups: a plan joins the group before it when its
    rounds overlap those of every plan in the group (its fastest round is no faster than the
    slowest of each), so the machine measured no order among any two of them. Each group keeps
    its place and ranks its plans by ``predicted``. Spearman's correlation of ``predicted``
    with these ranks is 1 when the prediction orders every pair the measurements tell apart,
    and a pair whose rounds overlap only through a third plan still counts."""
    order = sorted(range(len(measured)), key=lambda i: measured[i])
    groups: list[list[int]] = []
    reach = -math.inf  # the slowest round every member of the last group reaches
    for i in order:
        low, high = spreads[i]
        if groups and low <= reach:
            groups[-1].append(i)
            reach = min(reach, high)
        else:
            groups.append([i])
            reach = high
    found = [0.0] * len(measured)
    place = 0
    for group in groups:
        for i in sorted(group, key=lambda i: predicted[i]):
            found[i] = float(place)
            place += 1
    return found


def pairs_apart(predicted: list[float], spreads: list[tuple[float, float]]) -> tuple[int, int]:
    """(pairs of plans the measurements tell apart, those the prediction orders the same way):
    a pair is apart when one plan's slowest round is faster than the other's fastest."""
    apart = alike = 0
    for i in range(len(spreads)):
        for j in range(i + 1, len(spreads)):
            if spreads[i][1] < spreads[j][0]:
                faster, slower = i, j
            elif spreads[j][1] < spreads[i][0]:
                faster, slower = j, i
            else:
                continue
            apart += 1
            alike += predicted[faster] < predicted[slower]
    return apart, alike


def rank_beyond_noise(spread: tuple[float, float], others: list[tuple[float, float]]
                      ) -> tuple[int, int]:
    """(how many of ``others`` measured faster than a plan of rounds ``spread`` beyond noise,
    their slowest round faster than its fastest; how many overlap its rounds)."""
    low, high = spread
    beaten = sum(1 for _, slowest in others if slowest < low)
    level = sum(1 for fastest, slowest in others if not (slowest < low or fastest > high))
    return beaten, level


def layer_comm_table(outcome: Outcome, floor: float = 1e-4) -> str:
    """Per layer: communication + redistribution, predicted against measured (ms).

    Measured is the fastest rank's time inside the communication: the last rank to reach a
    collective waits for no one, so its time is the transfer the α–β model predicts. A layer's
    gradient sum is predicted at the layer but measured where its bucket is sent (the layer
    whose backward fills the bucket, or the end of backward): a layer that measured none has no
    error, and the count of such layers is printed.
    """
    names = [c.layer for c in outcome.planned.layers] + ["loss"]
    predicted = communication(predicted_fields(outcome.planned))
    measured = communication(measured_fields(outcome.fastest_rank))
    lines = [f"per-layer communication of the auto plan (own + redistribution, both "
             f"directions, fastest rank; layers under {floor * 1e3:g} ms both ways left out)",
             f"{'layer':<10} {'predicted ms':>13} {'measured ms':>12} {'error':>7}"]
    errors, unmeasured = [], 0
    for name, p, m in zip(names, predicted, measured, strict=True):
        if max(p, m) < floor:
            continue
        if m > 0:
            errors.append(abs(p / m - 1))
            shown = f"{p / m - 1:>+7.1%}"
        else:
            unmeasured += 1
            shown = f"{'-':>7}"
        lines.append(f"{name:<10} {p * 1e3:>13.3f} {m * 1e3:>12.3f} {shown}")
    summary = [f"median {np.median(errors):.1%}, largest {max(errors):.1%}"] if errors else []
    if unmeasured:
        summary.append(f"{unmeasured} layer(s) measured none (a gradient bucket is timed where "
                       f"it is sent)")
    if summary:
        lines.append(f"per-layer communication error: {'; '.join(summary)}")
    return "\n".join(lines)


def write_log(path: Path, outcomes: list[Outcome], args, procs: int, net: NetSpec,
              machine: Machine) -> None:
    """Every plan's predicted and measured per-layer times, with what ``calibrate
    --from-log`` needs to price them again: the net and its input, the plan as a plan file,
    the profile; beside its iteration, every round's time and, where the kernels were timed
    again before every round, the iteration the first timing alone priced
    (``predicted_first_timing``)."""
    from hpctrain.cost.machine import format_machine
    from hpctrain.device.precision import PRECISIONS
    from hpctrain.plan.plans import plan_text
    from hpctrain.record.runlog import write_hdf5, write_timings

    def fill(h5) -> None:
        h5.attrs["processes"] = procs
        h5.attrs["net"] = args.net
        h5.attrs["input_shape"] = list(net.input_shape)
        h5.attrs["batch"] = args.batch
        h5.attrs["precision"] = args.precision
        h5.attrs["dtype"] = np.dtype(PRECISIONS[args.precision].storage).name
        h5.attrs["steps"] = args.steps
        h5.attrs["rounds"] = args.rounds
        h5.attrs["machine_profile"] = format_machine(machine)
        for k, o in enumerate(outcomes):
            group = h5.create_group(f"plans/{k:02d}")
            group.attrs["spec"] = o.spec
            group.attrs["plan"] = "\n".join(p.describe() for p in o.planned.plans)
            group.attrs["plan_file"] = plan_text(net, o.planned.plans)
            write_timings(group, o.planned, o.layer_times, o.fastest_rank, o.measured_iteration)
            group["iteration"].attrs["rounds"] = list(o.rounds)
            if o.first_timing is not None:
                group["iteration"].attrs["predicted_first_timing"] = o.first_timing

    write_hdf5(path, fill)


def run(argv: list[str], comm) -> int:
    args = build_parser().parse_args(argv)
    if args.batch < 1:
        raise UserError(f"--batch {args.batch} must be at least 1")
    if args.plans:  # the default plans include auto, which searches --space
        check_space(args, args.plans, "--plan")
    if args.retime:
        raise UserError("--retime is unused: compare-plans times every kernel afresh, and "
                        "keeps none of them")
    outcomes, net, machine = compare(args, comm)
    if not outcomes:
        raise UserError("no plan could run; check --batch and the process count")
    if comm.Get_rank() == 0:
        print(report(outcomes), flush=True)
        for line in warning_lines(machine):
            print(line, flush=True)
        if args.log:
            write_log(Path(args.log), outcomes, args, comm.Get_size(), net, machine)
            print(f"timings written to {args.log}")
    return 0
