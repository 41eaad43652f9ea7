"""Single-axis against multi-axis plans, from the cost model (no MPI): for CosmoFlow at 128³
and 512³ and ResNet-50, at P = 8 … 4096, the 1.5D planner's best plan (a split of one axis
besides the batch per layer), the planner's best over the balanced multi-axis splits
(``--space balanced``: every layer any n × c × balanced d·h·w, exactly) with the seconds its
search took, and the best of a fixed family of multi-axis plans — every convolution cut
n × (d·h·w) with the spatial degrees as even as powers of two allow, for every n that divides
P, and the linear layers model-parallel or replicated (LBANN's layout, one for the whole net),
each priced as given. Time per iteration and peak memory per rank, under a memory cap per rank:

    python bench/multiaxis.py [--plot plots/multiaxis.png]
"""

from __future__ import annotations

import argparse
import math
import time

from hpctrain.cost.machine import load_machine
from hpctrain.layout.partition import SplitError, factorisations
from hpctrain.model.net import load_net
from hpctrain.plan.planner import PlannerError, plan_network
from hpctrain.plan.plans import PlanError, plan_from_spec
from hpctrain.plan.pricing import build_cost_model
from hpctrain.plan.spaces import predict

CASES = [  # (label, net, image size, batch, machine, cap GiB)
    ("CosmoFlow 128^3 b16", "cosmoflow", 128, 16, "perlmutter-gpu", 40),
    ("CosmoFlow 512^3 b16", "cosmoflow", 512, 16, "perlmutter-gpu", 40),
    ("ResNet-50 224^2 b256", "resnet50", 224, 256, "dgx-h100", 80),
]
PROCS = (8, 64, 512, 4096)


def spatial_degrees(parts: int, axes: int) -> tuple[int, ...]:
    """``parts`` over ``axes`` axes as evenly as powers of two allow, the first largest."""
    degrees, k = [1] * axes, 0
    while math.prod(degrees) < parts:
        degrees[k % axes] *= 2
        k += 1
    return tuple(degrees)


def multi_axis_specs(procs: int, batch: int, letters: str) -> list[str]:
    specs = []
    for n, rest in factorisations(procs):
        if n > batch or rest < 4:  # two axes at least: 2 x 2 or more
            continue
        degrees = spatial_degrees(rest, len(letters))
        conv = "".join(f"{a}{d}" for a, d in zip(letters, degrees, strict=True) if d > 1)
        for fc in (f"fc={rest}x{n}", f"fc=n{n}r{rest}"):
            # /model: a convolution too small for the cut runs model-parallel on that grid
            specs.append(f"conv=n{n}{conv}/model,{fc}")
    return specs


def best_given(model, net, specs, cap):
    found = None
    for spec in specs:
        try:
            planned = predict(model, plan_from_spec(spec, net, model.procs))
        except (SplitError, PlanError):
            continue
        if planned.memory > cap:
            continue
        if found is None or planned.iteration_time < found[1].iteration_time:
            found = (spec, planned)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", default=None, help="draw iteration time against P here")
    args = parser.parse_args()
    rows = []
    print(f"{'case':<22} {'P':>5} {'1.5D ms':>9} {'1.5D GiB':>9} {'balanced ms':>12} "
          f"{'GiB':>6} {'search s':>9} {'family ms':>10} {'GiB':>6}  family plan")
    for label, name, size, batch, machine_name, cap_gib in CASES:
        net = load_net(name, size)
        machine = load_machine(machine_name)
        cap = cap_gib * 2**30
        letters = "dhw" if len(net.input_shape) == 4 else "hw"
        for procs in PROCS:
            model = build_cost_model(net, batch, procs, machine, "flops")
            try:
                grid = plan_network(model, cap)
                grid_cells = f"{grid.iteration_time * 1e3:>9.2f} {grid.memory / 2**30:>9.2f}"
                grid_ms = grid.iteration_time * 1e3
            except (PlannerError, SplitError):
                grid_cells, grid_ms = f"{'no plan':>9} {'':>9}", math.nan
            started = time.perf_counter()
            try:
                balanced = plan_network(model, cap, space="balanced")
                balanced_ms = balanced.iteration_time * 1e3
                balanced_cells = (f"{balanced_ms:>12.2f} {balanced.memory / 2**30:>6.2f} "
                                  f"{time.perf_counter() - started:>9.2f}")
            except (PlannerError, SplitError):
                balanced_cells, balanced_ms = f"{'no plan':>12} {'':>6} {'':>9}", math.nan
            found = best_given(model, net, multi_axis_specs(procs, batch, letters), cap)
            if found is None:
                multi_cells, multi_ms, spec = f"{'no plan':>10} {'':>6}", math.nan, ""
            else:
                spec, planned = found
                multi_ms = planned.iteration_time * 1e3
                multi_cells = f"{multi_ms:>10.2f} {planned.memory / 2**30:>6.2f}"
            print(f"{label:<22} {procs:>5} {grid_cells} {balanced_cells} {multi_cells}  {spec}",
                  flush=True)
            rows.append((label, procs, grid_ms, balanced_ms, multi_ms))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(CASES), figsize=(4.2 * len(CASES), 3.4))
        for ax, (label, *_rest) in zip(axes, CASES, strict=True):
            mine = [r for r in rows if r[0] == label]
            ax.loglog([r[1] for r in mine], [r[2] for r in mine], "o-", label="1.5D planner")
            ax.loglog([r[1] for r in mine], [r[3] for r in mine], "s-", label="balanced planner")
            ax.loglog([r[1] for r in mine], [r[4] for r in mine], "^--", label="n x dhw family")
            ax.set_title(label, fontsize=9)
            ax.set_xlabel("P")
            ax.set_ylabel("predicted ms / iteration")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
