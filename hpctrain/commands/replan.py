"""``train --grid auto --replan-after K``: the plan checked against the run's own first steps.

The planner's choice is only as good as the profile's predictions, and a profile calibrated
elsewhere (another machine, another launch, microbenchmarks alone) may be off by a third. After
K steps the run compares its measured iteration with the prediction. Where they differ by more
than ``--replan-threshold``, it refits the profile to those steps' per-layer times (as
``calibrate --from-log`` would, but the compute and the communication apart, which one plan's
sums cannot tell apart: :func:`hpctrain.record.refit.refit`), plans again under the
refitted profile, and prices the plan running on it too. It switches when the new plan is
predicted faster by at least :data:`REPLAN_GAIN`: less is within a step's run-to-run noise,
and a switch costs a checkpoint written and read.

The switch happens at a step boundary through the checkpoint of step K in ``--checkpoint-dir``
(:mod:`hpctrain.run.checkpoint`): it holds whole tensors, which any plan reads its blocks of,
and the data and dropout masks are keyed by the step, so the run goes on with the numbers the
first plan would have computed, up to floating-point order. It happens once per run; the log
says what changed and why (:meth:`~hpctrain.record.runlog.RunLog.replanned`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpctrain.comm.agree import on_root
from hpctrain.commands.setup import Setup, SetupRequest, write_auto_plan
from hpctrain.cost.machine import Machine, format_machine
from hpctrain.plan.planner import PlannedNetwork, format_plan
from hpctrain.plan.plans import plan_text

if TYPE_CHECKING:
    from hpctrain.record.runlog import RunLog

REPLAN_GAIN = 0.05
"""The least predicted gain, as a share of the running plan's predicted step, for which the
run switches plans (the same plan's step varies by 5-10 % from run to run on a shared node)."""
REPLAN_THRESHOLD = 0.10
"""The default ``--replan-threshold``, the prediction error past which the run refits."""


@dataclass(frozen=True)
class Replan:
    """What the run does after its check: go on with ``planned`` (a new plan when
    ``switched``), predicted on ``machine``; ``reason`` says why (and after which step), in a
    line."""

    switched: bool
    refitted: bool
    reason: str
    planned: PlannedNetwork
    machine: Machine


def decide(setup: Setup, request: SetupRequest, step: int, result: Any, threshold: float,
           comm: Any, limit: tuple[float, str] | None = None) -> Replan:
    """The plan to go on with after ``step`` steps that measured ``result`` (a
    :class:`~hpctrain.run.loop.TrainResult`: its per-layer times, the same on every rank);
    collective over ``comm``, the same on every rank.

    ``limit`` is the (bytes, where they come from) a rank may use that the run was planned
    under (:func:`~hpctrain.cost.memory.memory_limit`, agreed at set-up), and the new plan is
    held to it too. None: agreed again here, over ``comm``, which costs an all-reduce and reads
    the node's free memory while the running plan's arrays hold part of it."""
    from hpctrain.plan.pricing import build_cost_model
    from hpctrain.plan.spaces import predict
    from hpctrain.record.measured import measured_plan
    from hpctrain.record.refit import refit

    planned, procs = setup.planned, comm.Get_size()
    error = planned.iteration_time / result.iteration - 1
    seen = (f"after step {step}: measured {result.iteration * 1e3:.1f} ms per step, predicted "
            f"{planned.iteration_time * 1e3:.1f} ms ({error:+.1%})")
    if abs(error) <= threshold:
        return Replan(False, False, f"{seen}, within --replan-threshold {threshold:.0%}: "
                                          f"plan kept", planned, setup.machine)
    steps = _timed_steps(result)
    measured = measured_plan(f"{steps} of this run", setup.net, request.batch, procs,
                             setup.backend.precision, setup.machine, planned,
                             result.layer_times, result.fastest_rank_times, result.iteration)
    fitted, _, _ = refit([measured], setup.machine,
                         f"the per-layer times of {steps} of this run", apart=True,
                         cache_bytes=setup.machine.cache_bytes)
    model = build_cost_model(setup.net, request.batch, procs, fitted, request.compute,
                             setup.backend, comm, setup.threads, setup.overlap,
                             optimizer=request.optimizer, accumulate=request.accumulate)
    if limit is None:
        from hpctrain.cost.memory import memory_limit

        limit = memory_limit(comm, request.mem_per_rank, setup.threads.ranks_on_node)
    cap, source = limit
    running = predict(model, planned.plans)
    best = predict(model, None, cap, source, request.space, request.branches == "auto")
    gain = 1 - best.iteration_time / running.iteration_time
    refitted = (f"{seen}; refitted to {steps}, the plan running is predicted "
                f"{running.iteration_time * 1e3:.1f} ms")
    if best.plans == planned.plans or gain < REPLAN_GAIN:
        why = ("and is the planner's choice again" if best.plans == planned.plans else
               f"and the planner's choice {best.iteration_time * 1e3:.1f} ms ({gain:.1%} "
               f"faster, under the {REPLAN_GAIN:.0%} a switch needs)")
        return Replan(False, True, f"{refitted}, {why}: plan kept", running, fitted)
    return Replan(True, True, f"{refitted}, the planner's choice "
                                    f"{best.iteration_time * 1e3:.1f} ms ({gain:.1%} faster): "
                                    f"switched to it", best, fitted)


def replan_after_step(request: SetupRequest, setup: Setup, step: int, result: Any,
                      threshold: float | None, comm: Any, log: RunLog | None,
                      logged: bool) -> PlannedNetwork:
    """The plan to go on with after ``step``, said on rank 0 and in the log (collective).

    :func:`decide` chooses it, under ``threshold`` (``--replan-threshold``; None for
    :data:`REPLAN_THRESHOLD`); a new plan is printed and written to the plan file. ``logged``
    says on every rank whether the run has a log, ``log`` is rank 0's.
    """
    threshold = REPLAN_THRESHOLD if threshold is None else threshold
    # the limit set-up agreed: agreeing it again would re-read the node's free memory while the
    # running plan's arrays hold part of it
    decision = decide(setup, request, step, result, threshold, comm, setup.limit)
    if comm.Get_rank() == 0:
        print(f"replan: {decision.reason}", flush=True)
        if decision.switched:
            print(format_plan(decision.planned), flush=True)
    if decision.switched:  # the plan file says what runs (hpctrain wrote it at set-up)
        write_auto_plan(request, setup.net, decision.planned, decision.machine.name, comm)
    if logged:  # collective: every rank knows whether there is a log
        changed = {"plan": plan_text(setup.net, decision.planned.plans),
                   "predicted_iteration": decision.planned.iteration_time,
                   "machine_profile": format_machine(decision.machine)}
        on_root(comm, lambda: log.replanned(decision.reason, *(
            (decision.planned, changed) if decision.refitted else (None, {}))))
    return decision.planned


def _timed_steps(result: Any) -> str:
    """The steps the per-layer times are the median of (all but the run's first), in words."""
    first = result.first_step + (2 if len(result.losses) > 1 else 1)
    return f"steps {first}-{result.last_step}" if first < result.last_step else f"step {first}"
