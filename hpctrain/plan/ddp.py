"""The baseline users run instead: PyTorch DistributedDataParallel, as the cost model prices it.

DDP copies the whole model to every rank and splits only the batch (every weighted layer batch
parallel on 1×P); keeps each rank's batch-norm statistics to itself (``SyncBatchNorm`` is
opt-in); sums the gradients in 25 MiB buckets (``bucket_cap_mb=25``), a bucket's all-reduce
starting as soon as the backward has filled it, so the sums overlap the rest of the backward.
:func:`ddp_faithful` prices exactly that on a machine profile: pure batch, statistics per rank,
the profile's links with DDP's bucket size, and gradient sums in flight with the profile's
``overlap`` share hidden behind the backward below them
(:meth:`~hpctrain.plan.planner.PlannedNetwork.hidden_sums`).

:func:`against_ddp` plans hpctrain's own run under the same terms (the same batch-norm groups,
buckets and overlap) over the whole 1.5D space, which holds the DDP plan, so the comparison is
of the plans alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import BUCKET_BYTES, Machine
from hpctrain.device.precision import PRECISIONS, Precision
from hpctrain.model.net import NetSpec
from hpctrain.plan.baselines import pure_batch
from hpctrain.plan.planner import PlannedNetwork, evaluate, plan_network
from hpctrain.plan.pricing import CostModel

DDP_STATISTICS = "rank"
"""Each process's statistics over its own share of the batch, as DDP's batch norm keeps them."""


@dataclass(frozen=True)
class DdpComparison:
    """One (net, batch-norm groups, B, P): the DDP-faithful step and hpctrain's auto plan
    priced under the same terms."""

    ddp: PlannedNetwork
    auto: PlannedNetwork

    @property
    def speedup(self) -> float:
        """The ratio of DDP's predicted iteration time to the auto plan's, at least 1, since
        the auto plan is never slower."""
        return self.ddp.iteration_time / self.auto.iteration_time


def ddp_terms(net: NetSpec, machine: Machine, procs: int, statistics: str | int
              ) -> tuple[NetSpec, Machine]:
    """The net with batch-norm groups ``statistics`` on ``procs`` ranks, and the machine with
    DDP's bucket size."""
    return (net.with_statistics(statistics, procs),
            replace(machine, bucket_bytes=BUCKET_BYTES))


def ddp_model(net: NetSpec, machine: Machine, batch: int, procs: int,
              statistics: str | int = DDP_STATISTICS,
              precision: Precision = PRECISIONS["fp32"]) -> CostModel:
    """The cost model of a run in ``precision`` under DDP's terms: gradient sums in flight in
    DDP's buckets (of bytes: twice as many 16-bit gradients fill one), compute from the
    profile's FLOP rate for the precision."""
    net, machine = ddp_terms(net, machine, procs, statistics)
    return CostModel(net, batch, procs, machine, FlopModel(machine.flops_for(precision.name)),
                     precision, overlap=True)


def ddp_faithful(model: CostModel) -> PlannedNetwork:
    """DDP's step on ``model`` (:func:`ddp_model`): every weighted layer batch parallel on
    1×P."""
    return evaluate(model, pure_batch(model.segment_kinds, model.procs))


def against_ddp(net: NetSpec, machine: Machine, batch: int, procs: int,
                statistics: str | int = DDP_STATISTICS,
                precision: Precision = PRECISIONS["fp32"]) -> DdpComparison:
    """DDP's step and hpctrain's auto plan, both priced in ``precision`` with batch-norm groups
    ``statistics``, DDP's buckets and the profile's overlap."""
    model = ddp_model(net, machine, batch, procs, statistics, precision)
    return DdpComparison(ddp_faithful(model), plan_network(model))
