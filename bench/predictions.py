"""How close the cost model's iteration times come to measured ones, on nets the fit never saw,
on one node and across two.

For each launch — P ranks on one node, and the same ranks as emulated nodes of one rank each
(MPICH's ``mpiexec -launcher fork -hosts nodeA:1,nodeB:1``, whose messages between the "nodes"
take the network path):

1. ``calibrate --probe-nets none``: the collectives and the GEMM alone (the microbenchmark
   profile);
2. a plain ``calibrate``: the same, then a few training steps of every plan on its probe nets
   (:data:`~hpctrain.commands.probes.PROBE_NETS`: smallcnn 32², AlexNet 64², a small branched
   net, a small volume net, smallcnn 192²), and the profile refitted to them (the fitted
   profile), timed;
3. ``compare-plans`` under the fitted profile on the held-out nets (ResNet-18 64², Inception-v3
   96², CosmoFlow 32³, and res3d 24³, a 3-D residual net), logged.

Per held-out net: the median and largest absolute iteration error over the plans, the Spearman
rank correlation of the predicted and the measured order (as measured, and with the plans whose
rounds overlap taken as tied: :func:`~hpctrain.commands.compare_plans.ranks_within_noise`), and
how far the auto plan (chosen by the fitted profile) is from the fastest measured — the errors
and the correlation for both profiles, the microbenchmark one re-pricing the same measured
plans; and the median error of the fitted profile's prices from the kernels' first timing
alone, against the same measurements (``compare-plans`` times them again before every round and
prices each at its median). Targets (fitted): median
error at most 10 %, Spearman at least 0.8, auto within 5 % of the fastest.

Every rank runs one thread (``--threads 1``): an emulated node believes it owns every core, and
ranks beyond the cores would share them (an oversubscribed launch measures the scheduler, not
the links). Profiles, logs and compute timings stay in the work directory.

    python bench/predictions.py --procs 2
    python bench/predictions.py --procs 2 --tables-only   # the table again, from the logs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.commands.probes import PROBE_NETS

PY = sys.executable
MPIEXEC = str(Path(PY).parent / "mpiexec") if (Path(PY).parent / "mpiexec").exists() \
    else "mpiexec"
HELD_OUT = (("resnet18", 64), ("inception_v3", 96), ("cosmoflow", 32), ("res3d", 24))


def hpctrain(launch: list[str], *args: str, work: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "config"),
           "HPCTRAIN_CACHE_DIR": str(work / "cache")}
    subprocess.run([MPIEXEC, *launch, PY, "-m", "hpctrain", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def summary(log: Path, micro: Path) -> dict[str, object]:
    """Per plan (predicted by the fitted profile, by the microbenchmark one, measured), and
    per profile the median and largest error and the rank correlation; auto from the fastest."""
    import h5py

    from hpctrain.commands.compare_plans import ranks_within_noise, spearman
    from hpctrain.cost.machine import load_machine
    from hpctrain.record.measured import read_measured_plans
    from hpctrain.record.refit import priced

    with h5py.File(log, "r") as f:
        groups = [g for _, g in sorted(f["plans"].items())]
        specs = [g.attrs["spec"] for g in groups]
        rounds = [tuple(g["iteration"].attrs["rounds"]) for g in groups]
        firsts = [g["iteration"].attrs.get("predicted_first_timing") for g in groups]
    before = load_machine(str(micro))
    plans = {}
    for spec, plan, times, first in zip(specs, read_measured_plans(log), rounds, firsts,
                                        strict=True):
        plans[spec] = {"fitted": plan.iteration[0], "microbenchmarks":
                       priced(plan, before).predicted(before), "measured": plan.iteration[1],
                       "rounds": times, "first_timing": None if first is None else float(first)}
    measured = [p["measured"] for p in plans.values()]
    spreads = [(min(p["rounds"]), max(p["rounds"])) for p in plans.values()]
    found: dict[str, object] = {"plans": plans}
    for profile in ("fitted", "microbenchmarks"):
        predicted = [p[profile] for p in plans.values()]
        off = [abs(p[profile] / p["measured"] - 1) for p in plans.values()]
        found[profile] = {"median_error": statistics.median(off), "largest_error": max(off),
                          "spearman": spearman(predicted, measured),
                          "spearman_within_noise": spearman(predicted, ranks_within_noise(
                              predicted, measured, spreads))}
    if all(p["first_timing"] is not None for p in plans.values()):  # the same measurements
        found["first_timing_median_error"] = statistics.median(
            abs(p["first_timing"] / p["measured"] - 1) for p in plans.values())
    found["auto_from_fastest"] = plans["auto"]["measured"] / min(measured) - 1
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=2, help="ranks (default: 2)")
    parser.add_argument("--steps", type=int, default=6, help="steps per plan (default: 6)")
    parser.add_argument("--out", default="runs/bench/predictions.json",
                        help="JSON of every number, with the table beside it (.txt)")
    parser.add_argument("--kernel-timing", choices=("each-round", "once"), default="each-round",
                        help="compare-plans' --kernel-timing: the kernels timed again before "
                             "every round, or at the start only (default: %(default)s)")
    parser.add_argument("--tables-only", action="store_true",
                        help="measure nothing: tabulate the logs and profiles a run left in "
                             "the work directory again")
    args = parser.parse_args()
    out = Path(args.out)
    work = out.parent / "predictions"
    work.mkdir(parents=True, exist_ok=True)
    hosts = ",".join(f"node{k}:1" for k in range(args.procs))
    launches = {"one node": ["-n", str(args.procs)],
                f"{args.procs} nodes of 1 rank": ["-launcher", "fork", "-hosts", hosts,
                                                  "-n", str(args.procs)]}
    results: dict[str, dict[str, object]] = {}

    def compare(launch: list[str], net: str, size: int, profile: Path, log: Path) -> None:
        hpctrain(launch, "compare-plans", "--threads", "1", "--net", net, "--image-size",
                 str(size), "--batch", "16", "--steps", str(args.steps), "--rounds", "3",
                 "--kernel-timing", args.kernel_timing, "--machine", str(profile), "--log",
                 str(log), work=work)

    for name, launch in launches.items():
        tag = "one-node" if name == "one node" else "nodes"
        micro, fitted = work / f"{tag}-microbenchmarks.toml", work / f"{tag}-fitted.toml"
        if args.tables_only:
            for net, _ in HELD_OUT:
                results[f"{name}: {net}"] = summary(work / f"{tag}-{net}.h5", micro)
            continue
        hpctrain(launch, "calibrate", "--threads", "1", "--probe-nets", "none", "--out",
                 str(micro), work=work)
        start = time.perf_counter()
        hpctrain(launch, "calibrate", "--threads", "1", "--out", str(fitted), work=work)
        results[f"{name}: calibrate"] = {"seconds": time.perf_counter() - start}
        for net, size in HELD_OUT:
            log = work / f"{tag}-{net}.h5"
            compare(launch, net, size, fitted, log)
            results[f"{name}: {net}"] = summary(log, micro)
    lines = [f"held-out nets, compare-plans at P = {args.procs}, batch 16, {args.steps} steps, "
             f"3 rounds, kernels timed {args.kernel_timing.replace('-', ' ')}, one thread per "
             f"rank; fitted by a plain calibrate on "
             f"{PROBE_NETS}",
             "targets (fitted): median error <= 10 %, Spearman >= 0.8, auto within 5 % of the "
             "fastest",
             f"{'launch: net':<34} {'median error':>13} {'largest':>8} {'Spearman':>9} "
             f"{'within noise':>13} {'auto vs fastest':>16}   microbenchmarks only: median, "
             f"Spearman" + ("; first timing only: median" if any(
                 "first_timing_median_error" in r for r in results.values()) else "")]
    for key, r in results.items():
        if "seconds" in r:
            lines.append(f"{key:<34} {r['seconds']:.0f} s")
            continue
        f, m = r["fitted"], r["microbenchmarks"]
        lines.append(f"{key:<34} {f['median_error']:>13.1%} {f['largest_error']:>8.1%} "
                     f"{f['spearman']:>+9.2f} {f['spearman_within_noise']:>+13.2f} "
                     f"{r['auto_from_fastest']:>+16.1%}   "
                     f"{m['median_error']:.1%}, {m['spearman']:+.2f}"
                     + (f"; {r['first_timing_median_error']:.1%}"
                        if "first_timing_median_error" in r else ""))
    table = "\n".join(lines)
    print(table)
    out.write_text(json.dumps(results, indent=1))
    out.with_suffix(".txt").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
