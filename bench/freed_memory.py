"""Freed memory kept for reuse against glibc's own malloc, side by side.

Runs ``mpiexec -n P python -m hpctrain compare-plans`` in turns, A B A B …: A with
``HPCTRAIN_KEEP_FREED_MEMORY=0`` (glibc's malloc as it is), B as a user launches it (hpctrain
keeps freed memory: :mod:`hpctrain.device.allocator`). Every launch starts from a fresh compute-time
cache, so its wall time includes timing the kernels for ``--grid auto``. Prints per net and plan
the measured iteration (each launch's median round, then the median over launches) and the ratio
A/B, and per launch the wall time and the CPU time the ranks spent in the kernel (``sys``);
the table also goes to ``--out``. Ratios above 1 mean kept memory is faster.

    python bench/freed_memory.py --procs 2 --launches 2
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py

from hpctrain.device.allocator import SWITCH, user_setting
from hpctrain.record.measured import read_measured_plans

PY = sys.executable
MPIEXEC = str(Path(PY).parent / "mpiexec") if (Path(PY).parent / "mpiexec").exists() \
    else "mpiexec"
NETS = (("resnet18", 64), ("inception_v3", 96), ("cosmoflow", 32), ("res3d", 24))
SETTINGS = {"glibc's own": {SWITCH: "0"}, "kept": {}}


def launch(net: str, size: int, args: argparse.Namespace, setting: dict[str, str]) -> dict:
    """One compare-plans run: measured iteration per plan (s), wall and kernel CPU seconds."""
    env = {k: v for k, v in os.environ.items() if k != SWITCH and user_setting({k: v}) is None}
    with tempfile.TemporaryDirectory() as work:
        log = Path(work) / "plans.h5"
        env.update(setting, HPCTRAIN_CACHE_DIR=work, XDG_CONFIG_HOME=work)
        command = [MPIEXEC, "-n", str(args.procs), PY, "-m", "hpctrain", "compare-plans",
                   "--threads", "1", "--net", net, "--image-size", str(size), "--batch",
                   str(args.batch), "--steps", str(args.steps), "--machine", "default",
                   "--log", str(log)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if result.returncode != 0:
            sys.exit(f"bench: {' '.join(command)} failed:\n{result.stdout[-2000:]}"
                     f"{result.stderr[-2000:]}")
        with h5py.File(log, "r") as f:
            specs = [group.attrs["spec"] for _, group in sorted(f["plans"].items())]
        plans = {spec: plan.iteration[1]
                 for spec, plan in zip(specs, read_measured_plans(log), strict=True)}
    return {"plans": plans, "wall": wall, "sys": after.ru_stime - before.ru_stime,
            "user": after.ru_utime - before.ru_utime}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2, help="ranks (default: 2)")
    parser.add_argument("--launches", type=int, default=2,
                        help="launches of each setting, alternating (default: 2)")
    parser.add_argument("--batch", type=int, default=16, help="global batch (default: 16)")
    parser.add_argument("--steps", type=int, default=5, help="steps per plan (default: 5)")
    parser.add_argument("--nets", default=",".join(f"{n}:{s}" for n, s in NETS),
                        help="NET:SIZE,... (default: the held-out nets of bench/predictions.py)")
    parser.add_argument("--out", default="runs/bench/freed-memory.txt",
                        help="the table (default: %(default)s)")
    args = parser.parse_args()
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"compare-plans on {args.procs} ranks, batch {args.batch}, {args.steps} steps, "
          f"3 rounds, one thread per rank; {args.launches} launch(es) of each setting, "
          f"alternating; each from a fresh compute-time cache")
    say(f"{'net: plan':<36} {'glibc ms':>9} {'kept ms':>8} {'glibc/kept':>11}")
    for item in args.nets.split(","):
        net, size = item.split(":")
        runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
        for _ in range(args.launches):
            for name, setting in SETTINGS.items():
                runs[name].append(launch(net, int(size), args, setting))
        glibc, kept = ({spec: statistics.median(r["plans"][spec] for r in runs[name])
                        for spec in runs[name][0]["plans"]} for name in SETTINGS)
        for spec in glibc:
            say(f"{net + ': ' + spec:<36} {glibc[spec] * 1e3:>9.1f} {kept[spec] * 1e3:>8.1f} "
                  f"{glibc[spec] / kept[spec]:>11.2f}")
        for name in SETTINGS:
            walls = ", ".join(f"{r['wall']:.0f}" for r in runs[name])
            kernel = ", ".join(f"{r['sys'] / (r['sys'] + r['user']):.0%}" for r in runs[name])
            say(f"{net + ': ' + name:<36} wall s {walls}; CPU time in the kernel {kernel}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
