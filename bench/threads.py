"""Threads per rank: the README's launch with no variables set against OMP_NUM_THREADS=1.

Runs ``mpiexec -n P python -m hpctrain compare-plans`` twice, each with a fresh compute-time
cache: once with every thread variable removed from the environment (as a new user launches
it; hpctrain then decides the threads itself), once with ``OMP_NUM_THREADS=1``. Prints, for
each launch, the auto plan's measured iteration, the fastest plan's, where the auto plan
ranks and the median prediction error, then the ratio of the two launches' auto iterations
(1.00: as fast).

    python bench/threads.py --procs 2 --net alexnet --image-size 127 --batch 16
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
MPIEXEC = str(Path(PY).parent / "mpiexec") if (Path(PY).parent / "mpiexec").exists() \
    else "mpiexec"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
ROW = re.compile(r"^(\S+)\s+([\d.]+)\s+([\d.]+)\s+([+-][\d.]+)%\s+(\d+)\s+(\d+)$")


def launch(args: argparse.Namespace, extra_env: dict[str, str]) -> dict:
    """One compare-plans run; its rows by plan, the threads line and the wall time."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    with tempfile.TemporaryDirectory() as cache:
        env.update(extra_env, HPCTRAIN_CACHE_DIR=cache)
        command = [MPIEXEC, "-n", str(args.procs), PY, "-m", "hpctrain", "compare-plans",
                   "--net", args.net, "--image-size", str(args.image_size), "--batch",
                   str(args.batch), "--steps", str(args.steps)]
        start = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed:\n{result.stdout[-2000:]}"
                 f"{result.stderr[-2000:]}")
    rows = {}
    threads = ""
    for line in result.stdout.splitlines():
        if line.startswith("threads: "):
            threads = line.removeprefix("threads: ")
        match = ROW.match(line.strip())
        if match:
            spec, predicted, measured, error, rank, _ = match.groups()
            rows[spec] = (float(predicted), float(measured), float(error), int(rank))
    if "auto" not in rows:
        sys.exit(f"bench: no auto plan row in the output of {' '.join(command)}")
    return {"rows": rows, "threads": threads, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--net", default="alexnet")
    parser.add_argument("--image-size", type=int, default=127)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    launches = {"no variables (as the README)": launch(args, {}),
                "OMP_NUM_THREADS=1": launch(args, {"OMP_NUM_THREADS": "1"})}
    print(f"compare-plans, {args.net} {args.image_size}x{args.image_size}, batch {args.batch}, "
          f"P = {args.procs}; each launch with a fresh compute-time cache")
    print(f"{'launch':<30} {'auto ms':>9} {'fastest ms':>11} {'auto rank':>10} "
          f"{'median |error|':>15} {'wall s':>7}  threads")
    for label, run in launches.items():
        rows = run["rows"]
        fastest = min(r[1] for r in rows.values())
        errors = sorted(abs(r[2]) for r in rows.values())
        median = errors[len(errors) // 2]
        auto = rows["auto"]
        print(f"{label:<30} {auto[1]:>9.1f} {fastest:>11.1f} {auto[3]:>4} of {len(rows):<3} "
              f"{median:>14.1f}% {run['wall']:>7.1f}  {run['threads']}")
    mine, pinned = (launches[k]["rows"]["auto"][1] for k in launches)
    print(f"auto-plan iteration, no variables / OMP_NUM_THREADS=1: {mine / pinned:.2f} "
          f"(1.00: as fast)")


if __name__ == "__main__":
    main()
