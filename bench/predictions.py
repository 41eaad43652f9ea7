"""How close the cost model's iteration times come to measured ones, on one node and across two.

For each launch — P ranks on one node, and the same ranks as emulated nodes of one rank each
(MPICH's ``mpiexec -launcher fork -hosts nodeA:1,nodeB:1``, whose messages between the "nodes"
take the network path) — it calibrates a profile for that launch, then runs ``compare-plans``
for each net and reads the log: per plan the predicted and measured iteration (its median
round), the median and largest absolute error over the plans, and how far the auto plan is from
the fastest measured. Targets: median error at most 10 %, auto within 5 % of the fastest.

Every rank runs one thread (``--threads 1``): an emulated node believes it owns every core, and
ranks beyond the cores would share them (an oversubscribed launch measures the scheduler, not
the links). Calibrated profiles and compute timings stay in the work directory.

    python bench/predictions.py --procs 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import h5py

PY = sys.executable
MPIEXEC = str(Path(PY).parent / "mpiexec") if (Path(PY).parent / "mpiexec").exists() \
    else "mpiexec"
NETS = (("alexnet", 64), ("resnet18", 64), ("inception_v3", 96))  # (net, image size)


def hpctrain(launch: list[str], *args: str, work: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "config"),
           "HPCTRAIN_CACHE_DIR": str(work / "cache")}
    subprocess.run([MPIEXEC, *launch, PY, "-m", "hpctrain", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def errors(log: Path) -> dict[str, object]:
    """Per plan (predicted s, measured s) from a compare-plans log, and the summary."""
    with h5py.File(log, "r") as f:
        plans = {g.attrs["spec"]: (float(g["iteration"].attrs["predicted"]),
                                   float(g["iteration"].attrs["measured"]))
                 for g in f["plans"].values()}
    off = [abs(p / m - 1) for p, m in plans.values()]
    fastest = min(m for _, m in plans.values())
    return {"plans": plans, "median_error": statistics.median(off), "largest_error": max(off),
            "auto_from_fastest": plans["auto"][1] / fastest - 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=2, help="ranks (default: 2)")
    parser.add_argument("--steps", type=int, default=6, help="steps per plan (default: 6)")
    parser.add_argument("--out", default="runs/bench/predictions.json",
                        help="JSON of every number, with the table beside it (.txt)")
    args = parser.parse_args()
    out = Path(args.out)
    work = out.parent / "predictions"
    work.mkdir(parents=True, exist_ok=True)
    hosts = ",".join(f"node{k}:1" for k in range(args.procs))
    launches = {"one node": ["-n", str(args.procs)],
                f"{args.procs} nodes of 1 rank": ["-launcher", "fork", "-hosts", hosts,
                                                  "-n", str(args.procs)]}
    results: dict[str, dict[str, object]] = {}
    for name, launch in launches.items():
        tag = "one-node" if name == "one node" else "nodes"
        profile = work / f"{tag}.toml"
        hpctrain(launch, "calibrate", "--threads", "1", "--out", str(profile), work=work)
        for net, size in NETS:
            log = work / f"{tag}-{net}.h5"
            hpctrain(launch, "compare-plans", "--threads", "1", "--net", net, "--image-size",
                     str(size), "--batch", "16", "--steps", str(args.steps), "--machine",
                     str(profile), "--log", str(log), work=work)
            results[f"{name}: {net}"] = errors(log)
    lines = [f"compare-plans at P = {args.procs}, batch 16, {args.steps} steps, one thread per "
             f"rank; targets: median error <= 10 %, auto within 5 % of the fastest",
             f"{'launch: net':<36} {'median error':>13} {'largest':>8} {'auto vs fastest':>16}"]
    for key, r in results.items():
        lines.append(f"{key:<36} {r['median_error']:>13.1%} {r['largest_error']:>8.1%} "
                     f"{r['auto_from_fastest']:>+16.1%}")
    table = "\n".join(lines)
    print(table)
    out.write_text(json.dumps(results, indent=1))
    out.with_suffix(".txt").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
