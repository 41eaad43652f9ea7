"""Predicted against measured peak memory per rank, AlexNet and VGG-16 under several plans.

Each configuration trains a few steps on ``--procs`` ranks; the training command prints the
largest, over the ranks, peak resident set above the interpreter's (numpy, mpi4py and h5py
loaded) and the cost model's prediction. A ``--plan-only`` run first fills the compute-time cache,
so the measured run times no kernel. Run from the repository root:

    python bench/memory.py [--procs 2] [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"peak memory per rank: ([\d.]+) MiB measured, ([\d.]+) MiB predicted")
CONFIGS = [  # (net, image size, batch, grid)
    ("alexnet", 127, 16, "1x2"),
    ("alexnet", 127, 16, "2x1"),
    ("alexnet", 127, 16, "conv=1x2,fc=2x1"),
    ("alexnet", 127, 16, "conv=domain:2x1,fc=2x1"),
    ("vgg16", 64, 16, "1x2"),
    ("vgg16", 64, 16, "2x1"),
    ("vgg16", 64, 16, "conv=1x2,fc=2x1"),
    ("vgg16", 128, 8, "conv=1x2,fc=2x1"),
]


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec") or "mpiexec"


def run(procs: int, net: str, size: int, batch: int, grid: str, steps: int) -> tuple[float, float]:
    """(measured MiB, predicted MiB) of one configuration."""
    command = [mpiexec(), "-n", str(procs), sys.executable, "-m", "hpctrain", "--net", net,
               "--image-size", str(size), "--batch", str(batch), "--grid", grid,
               "--print-every", str(steps)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([*command, "--plan-only"], check=True, capture_output=True, env=env)
    out = subprocess.run([*command, "--steps", str(steps)], check=True, capture_output=True,
                         text=True, env=env).stdout
    match = LINE.search(out)
    if match is None:
        raise SystemExit(f"no peak memory line from {' '.join(command)}:\n{out}")
    return float(match.group(1)), float(match.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    print(f"peak memory per rank, {args.procs} processes, {args.steps} steps (MiB above the "
          f"interpreter's resident set)")
    print(f"{'net':<8} {'image':>5} {'batch':>5} {'grid':<24} {'measured':>9} {'predicted':>9} "
          f"{'pred/meas':>9}")
    for net, size, batch, grid in CONFIGS:
        measured, predicted = run(args.procs, net, size, batch, grid, args.steps)
        print(f"{net:<8} {size:>5} {batch:>5} {grid:<24} {measured:>9.1f} {predicted:>9.1f} "
              f"{predicted / measured:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
