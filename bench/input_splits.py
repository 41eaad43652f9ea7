"""What splitting the reduction buys, from the cost model (no MPI): AlexNet and VGG-16 at 224²,
global batch 256 (or P, where P is larger: OWT's batch-parallel convolutions need a sample per
rank), on dgx-h100 and cori-knl (``--compute flops``), at P = 8 … 4096. For each, the plans:

- OWT: every conv batch-parallel on 1×P, every linear layer output-split over all P (Krizhevsky's
  "one weird trick", the baseline PaSE compares with), priced as given;
- PaSE's pattern: convs batch-parallel, the classifier in out × in blocks whose digits swap
  from layer to layer (fc6 ``c=a,i=b``, fc7 ``i=a,c=b``, fc8 ``c=a,i=b``, a·b = P, a ≤ b as
  square as P allows), priced as given;
- 1.5D: the planner's best over the grids (``--space grids``);
- 2-D: the planner's best over ``--space balanced``, which holds input splits, with the seconds
  its search took.

Each with its predicted iteration time, the classifier's share of it (its layers' communication
and the moves that feed them), the classifier's communication volume per rank (bytes, as the
α–β model counts them: the plan priced again on a machine of α = 0 and 1 byte per second), peak
memory per rank, and the classifier's splits. Then, for the memory case, the leanest plan each
space can find under a cap (VGG-16, 16 ranks, batch 16).

    python bench/input_splits.py [--machine dgx-h100 cori-knl]
"""

from __future__ import annotations

import argparse
import math
import time

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import Machine, load_machine
from hpctrain.layout.partition import SplitError
from hpctrain.model.net import load_net
from hpctrain.plan.planner import PlannerError, plan_network
from hpctrain.plan.plans import LayerPlan, PlanError, parse_plan, plan_from_spec
from hpctrain.plan.pricing import CostModel
from hpctrain.plan.spaces import predict

NETS = ("alexnet", "vgg16")
PROCS = (8, 64, 512, 4096)
BATCH, IMAGE = 256, 224
MIB = 2**20


def pase_plan(net, procs: int) -> list[LayerPlan]:
    """Convs batch-parallel, the classifier in alternating out × in blocks."""
    a = 2 ** (int(math.log2(procs)) // 2)
    b = procs // a
    lines = [f"{layer.name} batch 1x{procs}" for layer in net.layers if layer.kind == "conv"]
    fcs = [layer.name for layer in net.layers if layer.kind == "linear"]
    for k, name in enumerate(fcs):
        lines.append(f"{name} split " + (f"c={a},i={b}" if k % 2 == 0 else f"i={a},c={b}"))
    return parse_plan("\n".join(lines), "PaSE pattern", net, procs)


def classifier(planned, net) -> tuple[float, str]:
    """(seconds of the classifier's communication and moves, its linear layers' splits)."""
    first = next(k for k, layer in enumerate(net.layers) if layer.kind == "linear")
    costs = planned.layers[first:] + [planned.loss]
    seconds = sum(sum(c.comm) + sum(c.redistribution) for c in costs)
    splits = " ".join(entry.describe().replace("split ", "") for entry, layer
                      in zip(planned.plans, net.layers, strict=True) if layer.kind == "linear")
    return seconds, splits


def row(label, planned, volume_model, net, searched=None):
    seconds, splits = classifier(planned, net)
    volume, _ = classifier(predict(volume_model, planned.plans), net)
    return (f"{label:<10} {planned.iteration_time * 1e3:9.2f} {seconds * 1e3:9.3f} "
            f"{volume / MIB:11.1f} {planned.memory / MIB:9.0f} "
            f"{'' if searched is None else f'{searched:6.2f}':>6}  {splits}")


def alternates(planned, net) -> bool:
    """Whether two consecutive linear layers swap the digits of their out × in blocks."""
    splits = [entry.split for entry, layer in zip(planned.plans, net.layers, strict=True)
              if layer.kind == "linear"]
    return any(a is not None and b is not None and a.inputs > 1 and b.inputs > 1
               and a.inputs_outer != b.inputs_outer for a, b in zip(splits, splits[1:]))


def study(machine: Machine) -> None:
    volume_machine = Machine("volume", alpha=0.0, beta=1.0, flops=machine.flops)
    print(f"\n{machine.name}, batch max({BATCH}, P), {IMAGE}x{IMAGE}, compute flops; classifier "
          f"= the linear layers, their followers and the moves into them")
    print(f"{'plan':<10} {'iter ms':>9} {'clf ms':>9} {'clf MiB/rk':>11} {'peak MiB':>9} "
          f"{'srch s':>6}  classifier splits (fc6 fc7 fc8)")
    for name in NETS:
        net = load_net(name, IMAGE)
        for procs in PROCS:
            batch = max(BATCH, procs)
            print(f"-- {name}, P = {procs}, batch {batch}")
            model = CostModel(net, batch, procs, machine, FlopModel(machine.flops))
            volume_model = CostModel(net, batch, procs, volume_machine,
                                     FlopModel(machine.flops))
            for label in ("OWT", "PaSE"):
                try:
                    plan = (plan_from_spec(f"conv=1x{procs},fc={procs}x1", net, procs)
                            if label == "OWT" else pase_plan(net, procs))
                    print(row(label, predict(model, plan), volume_model, net))
                except (SplitError, PlanError) as err:
                    print(f"{label:<10} cannot run: {err}")
            for label, space in (("1.5D", "grids"), ("2-D", "balanced")):
                start = time.perf_counter()
                planned = plan_network(model, space=space)
                took = time.perf_counter() - start
                print(row(label, planned, volume_model, net, took)
                      + ("   (alternating)" if alternates(planned, net) else ""))


def memory_case(machine: Machine) -> None:
    net = load_net("vgg16", IMAGE)
    model = CostModel(net, 16, 16, machine, FlopModel(machine.flops))
    print("\nmemory: VGG-16 224², 16 ranks, batch 16: the leanest plan each space finds "
          "(a cap bisected to 1 %)")
    for space in ("grids", "balanced"):
        lo, hi = 1e6, plan_network(model, space=space).memory
        while hi / lo > 1.01:
            mid = math.sqrt(lo * hi)
            try:
                plan_network(model, mem_per_rank=mid, space=space)
                hi = mid
            except PlannerError:
                lo = mid
        planned = plan_network(model, mem_per_rank=hi, space=space)
        _, splits = classifier(planned, net)
        print(f"  {space:<9} peak {planned.memory / MIB:6.0f} MiB per rank, "
              f"{planned.iteration_time * 1e3:6.2f} ms; classifier {splits}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", nargs="+", default=["dgx-h100", "cori-knl"],
                        help="shipped profiles (default: dgx-h100 cori-knl)")
    args = parser.parse_args()
    for name in args.machine:
        study(load_machine(name))
    memory_case(load_machine(args.machine[0]))


if __name__ == "__main__":
    main()
