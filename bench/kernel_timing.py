"""How repeatable measured compute is: every kernel of a net's plans timed twice in one process,
under the timing rule of :class:`~hpctrain.cost.compute.MeasuredCompute` and under the rule it
replaced, side by side.

A kernel is timed once and its time priced in every plan that has it, so a timing that differs
from one process to the next by more than a kind departs from its timing in a step is noise
the step fit learns (:mod:`hpctrain.plan.stepfit`). Per net, at ``--batch`` over the ranks:
the distinct local works of every plan ``compare-plans`` compares (:func:`~hpctrain.commands.
compare_plans.default_specs`, less ``auto``), each timed by all ranks at once as ``calibrate``
times them, twice per rule (rules alternating, so a drift of the machine falls on both); the
two timings' disagreement is the mean over kernels of ``|log(first / second)|``, each kernel
weighted by its time, forward and backward apart. The rules:

- **now**: warm-up calls until two in a row agree (``STEADY``), the median of at least
  ``MIN_SAMPLES`` samples;
- **before**: two warm-up calls, the mean of as many samples as fit ``SAMPLE_BUDGET`` (one for a
  kernel of 0.15 s or more).

    mpiexec -n 2 python bench/kernel_timing.py
    mpiexec -n 2 python bench/kernel_timing.py --nets res3d:24 \
        --out runs/bench/kernel-timing-res3d.txt
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_name] = "1"

import argparse  # noqa: E402  (the thread variables must be set before NumPy loads)
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from hpctrain.commands.compare_plans import default_specs  # noqa: E402
from hpctrain.commands.probes import PROBE_NETS, parse_probe_nets  # noqa: E402
from hpctrain.cost import compute  # noqa: E402
from hpctrain.cost.compute import FlopModel, MeasuredCompute  # noqa: E402
from hpctrain.cost.machine import load_machine  # noqa: E402
from hpctrain.device.allocator import keep_freed_memory  # noqa: E402
from hpctrain.device.backend import make_backend  # noqa: E402
from hpctrain.layout.partition import SplitError  # noqa: E402
from hpctrain.model.net import load_net  # noqa: E402
from hpctrain.plan.planner import evaluate_plan  # noqa: E402
from hpctrain.plan.plans import plan_from_spec  # noqa: E402
from hpctrain.plan.pricing import CostModel, step_bytes  # noqa: E402


class BeforeRule(MeasuredCompute):
    """The rule replaced: two warm-up calls, then the mean of 1 to ``repeats`` samples."""

    def _time(self, fn):
        for _ in range(compute.WARM_UPS):
            start = time.perf_counter()
            output = fn()
            warm = self._slowest(time.perf_counter() - start)
        repeats = max(1, min(self.repeats, int(compute.SAMPLE_BUDGET / max(warm, 1e-9))))
        samples = np.empty(repeats)
        for k in range(repeats):
            compute.evict_caches(self.backend.device, self.evict)
            self.comm.Barrier()
            start = time.perf_counter()
            fn()
            samples[k] = time.perf_counter() - start
        self.comm.Allreduce(MPI.IN_PLACE, samples, MPI.MAX)
        return float(samples.mean()), output


RULES = {"now": MeasuredCompute, "before": BeforeRule}


def works_of_plans(name: str, size: int | None, batch: int, procs: int) -> tuple[list, float]:
    """The distinct local works of every plan compare-plans compares (less auto), and the bytes
    a step keeps per rank (what each sample evicts)."""
    net = load_net(name, image_size=size)
    machine = load_machine("default")
    model = CostModel(net, batch, procs, machine, FlopModel(machine.flops))
    works = []
    for spec in default_specs(procs)[1:]:
        try:
            planned = evaluate_plan(model, plan_from_spec(spec, net, procs), timed=False)
        except SplitError:
            continue
        works += [c.work for c in [*planned.layers, planned.loss] if c.work is not None]
    return list(dict.fromkeys(works)), step_bytes(net, batch, procs, machine)


def disagreement(first: dict, second: dict) -> float:
    """The time-weighted mean over kernels and directions of |log(first / second)|."""
    a = np.array([first[w] for w in first])
    b = np.array([second[w] for w in first])
    weights = (a + b) / (a + b).sum()
    return float((np.abs(np.log(a / b)) * weights).sum())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default=PROBE_NETS,
                        help="NAME:IMAGE_SIZE,... (default: the probe nets, %(default)s)")
    parser.add_argument("--batch", type=int, default=16, help="global batch (default: 16)")
    parser.add_argument("--out", default="runs/bench/kernel-timing.txt",
                        help="the table, written by rank 0 (default: %(default)s)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    keep_freed_memory()  # as hpctrain times kernels
    backend = make_backend("cpu", "fp32")
    rows = []
    for name, size in parse_probe_nets(args.nets):
        works, kept = works_of_plans(name, size, args.batch, comm.Get_size())
        found = {}
        for rule in ("now", "before", "now", "before"):
            timer = RULES[rule](backend, comm, None, None, 5, kept)
            start = time.perf_counter()
            times = timer.times(works)
            found.setdefault(rule, []).append(({(w, d): times[w][d] for w in works
                                                for d in (0, 1)}, time.perf_counter() - start))
        label = f"{name}{f' {size}' if size else ''}"
        rows.append((label, len(works),
                     *[disagreement(found[r][0][0], found[r][1][0]) for r in ("now", "before")],
                     *[np.mean([s for _, s in found[r]]) for r in ("now", "before")]))
    lines = [f"kernels of every plan timed twice per rule on {comm.Get_size()} ranks, batch "
             f"{args.batch}: time-weighted mean |log| of the two timings' ratio",
             f"{'net':<16} {'kernels':>8} {'now':>7} {'before':>7} {'now s':>7} "
             f"{'before s':>8}"]
    lines += [f"{label:<16} {n:>8} {now:>7.3f} {before:>7.3f} {now_s:>7.1f} {before_s:>8.1f}"
              for label, n, now, before, now_s, before_s in rows]
    if len(rows) > 1:
        lines.append(f"{'mean':<16} {'':>8} {np.mean([r[2] for r in rows]):>7.3f} "
                     f"{np.mean([r[3] for r in rows]):>7.3f}")
    if comm.Get_rank() == 0:
        table = "\n".join(lines)
        print(table)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
