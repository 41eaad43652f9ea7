"""Gradient accumulation under a memory cap: the fewest micro-batches per step for which a plan
of the micro-batch fits (``--accumulate auto``, and what a refusal of ``--grid auto`` under
``--mem-per-rank`` proposes).

A step of K micro-batches of B/K samples trains on the whole batch B in the memory of B/K: the
activations a rank keeps scale with the micro-batch, its parameters, gradients and optimizer
state do not. The planner plans the micro-batch; here K runs over the divisors of B, smallest
first, and each is checked by arithmetic alone (:func:`~hpctrain.plan.planner.leanest_fitting`,
nothing timed), so the search costs no more than pricing the memory of each segment's choices.
"""

from __future__ import annotations

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine
from hpctrain.device.precision import Precision
from hpctrain.errors import UserError
from hpctrain.layout.partition import SplitError
from hpctrain.model.net import NetSpec
from hpctrain.plan.planner import PlannerError, leanest_fitting
from hpctrain.plan.pricing import CostModel


def fewest_micro_batches(net: NetSpec, batch: int, procs: int, machine: Machine,
                         precision: Precision, cap: float, space: str = "grids",
                         overlap: bool = False, least: int = 1,
                         optimizer: str = "sgd") -> int | None:
    """The smallest divisor K ≥ ``least`` of ``batch`` for which a plan of ``net`` with
    micro-batch ``batch / K`` on ``procs`` ranks fits under ``cap`` bytes per rank, searching
    ``space`` ("auto" searches balanced, as the planner may), each parameter keeping the state
    of ``optimizer`` and, for K > 1, the sum of its gradients; None when not even
    micro-batches of one sample fit.

    >>> from hpctrain.cost.machine import load_machine
    >>> from hpctrain.device.precision import PRECISIONS
    >>> from hpctrain.model.net import load_net
    >>> net, machine = load_net("smallcnn", 32), load_machine("default")
    >>> fewest_micro_batches(net, 64, 2, machine, PRECISIONS["fp32"], 2**40)
    1
    >>> fewest_micro_batches(net, 64, 2, machine, PRECISIONS["fp32"], 20 * 2**20)
    4
    """
    searched = "balanced" if space == "auto" else space
    rate = FlopModel(machine.flops_for(precision.name))
    for k in range(max(least, 1), batch + 1):
        if batch % k:
            continue
        model = CostModel(net, batch // k, procs, machine, rate, precision, overlap,
                          optimizer=optimizer, accumulate=k)
        try:
            if leanest_fitting(model, cap, searched) is not None:
                return k
        except (PlannerError, SplitError):  # no plan of this micro-batch runs here at all
            continue
    return None


def check_accumulate(accumulate: int | str, batch: int) -> None:
    """``--accumulate K``: at least 1, and a divisor of ``--batch`` (equal micro-batches)."""
    if accumulate == "auto":
        return
    if accumulate < 1:
        raise UserError(f"--accumulate {accumulate} must be at least 1 (1: no accumulation)")
    if batch % accumulate:
        divisors = [k for k in range(2, batch + 1) if batch % k == 0]
        some = ", ".join(map(str, divisors[:6])) + (", ..." if len(divisors) > 6 else "")
        raise UserError(f"--accumulate {accumulate} must divide --batch {batch} into equal "
                        f"micro-batches; give 1 or a divisor of {batch}"
                        f"{f' ({some})' if divisors else ''}")
