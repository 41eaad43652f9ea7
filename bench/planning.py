"""How long ``python -m hpctrain plan`` takes, whole process, with the plan's hash, against an
earlier tree of hpctrain and the published planners.

Each case runs ``plan`` as its own process ``--repeat`` times (import, net, cost model, exact
search, printing) and reports the median, least and largest wall time, and the first 12 hex
digits of the SHA-256 of what it printed (the plan, its predicted costs and notes), and the
median CPU seconds (user and system: on a shared machine a process waiting for a core counts
wall seconds but not CPU seconds, so those compare where the wall's do not). With
``--before DIR`` (a source tree of an earlier hpctrain, e.g. from ``git worktree add DIR
COMMIT``) each case also runs from that tree, the two in turn so that both see the machine
alike, and the line adds its median, the ratio before / after and whether the two printed
the same bytes: a faster planner must find the same plans.

The published times are those of PaSE (Elango, IPDPS 2021, Table I) for Inception-v3: its
dynamic programming over a vertex ordering needs 14 s for 4 GPUs and 3 min 16 s for 64,
FlexFlow's MCMC search 1 min 9 s and 37 min 17 s on the same; the ratio is theirs over ours at
the same process count (their machines and their nets' granularity differ: a ratio of
seconds, not of work).

    python bench/planning.py --repeat 3
    python bench/planning.py --repeat 3 --before ../hpctrain-before --only 'P=4096 .*dgx'
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (net, P, B, machine, extra flags): first the default plan of the four nets on both machines
# at 4096 ranks, then at 65,536, then other spaces, caps and scales
CASES = [
    *((net, 4096, 2048, machine, ()) for machine in ("cori-knl", "dgx-h100")
      for net in ("alexnet", "vgg16", "resnet50", "inception_v3")),
    ("resnet50", 65536, 65536, "dgx-h100", ()),
    ("resnet50", 4096, 2048, "dgx-h100", ("--space", "grids")),
    ("inception_v3", 4096, 2048, "dgx-h100", ("--space", "grids", "--branches", "serial")),
    ("resnet50", 4096, 512, "cori-knl", ()),
    ("inception_v3", 4096, 512, "cori-knl", ()),
    ("deepcam", 4096, 2048, "cori-knl", ()),  # 145 weighted layers at 768x1152
    ("efficientnet_b0", 4096, 2048, "cori-knl", ()),
    ("resnet50", 4096, 2048, "cori-knl", ("--mem-per-rank", "230M")),  # a cap that binds
    ("inception_v3", 4, 128, "cori-knl", ()),
    ("inception_v3", 64, 128, "cori-knl", ()),
]
PUBLISHED = {  # Inception-v3 at P: seconds (PaSE, FlexFlow)
    4: (14.0, 69.0),
    64: (196.0, 2237.0),
}


def run_plan(argv: list[str], tree: Path | None, bytecode: Path) -> tuple[float, float, str]:
    """Wall seconds and CPU seconds (user and system) of one ``plan`` process, and the hash of
    what it printed; from ``tree`` (its directory first on the path, as the current directory
    of the process) when given. Its modules' bytecode is read from and written to
    ``bytecode``, as an installed package's is read from its own: with no bytecode kept
    (``PYTHONDONTWRITEBYTECODE``) every process would compile hpctrain anew, 0.3 s here."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(bytecode)
    cwd = None
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
        cwd = tree
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hpctrain", "plan", *argv], check=True,
                          stdout=subprocess.PIPE, env=env, cwd=cwd)
    wall = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    return wall, cpu, hashlib.sha256(done.stdout).hexdigest()[:12]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (default: 5)")
    parser.add_argument("--before", type=Path, default=None,
                        help="a source tree of an earlier hpctrain to time beside this one")
    parser.add_argument("--only", default="",
                        help="the cases whose line matches this regular expression, e.g. "
                             "'^[a-z0-9_]+ P=4096 B=2048 [a-z0-9-]+$' for the default plans at "
                             "4096 ranks (default: every case)")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    head = (f"{'plan':<58} {'median s':>9} {'min s':>7} {'max s':>7} {'cpu s':>7}  "
            f"{'hash':<12}")
    if args.before is not None:
        head += f" {'before s':>9} {'cpu s':>7} {'ratio':>6} {'cpu':>6}  same"
    print(head + "  published (PaSE, FlexFlow)")
    with tempfile.TemporaryDirectory(prefix="hpctrain-bytecode-") as bytecode:
        for case in CASES:
            time_case(case, args, here, Path(bytecode))
    return 0


def time_case(case: tuple, args: argparse.Namespace, here: Path, bytecode: Path) -> None:
    """Time one of :data:`CASES` as ``args`` ask and print its line."""
    net, procs, batch, machine, extra = case
    name = f"{net} P={procs} B={batch} {machine} {' '.join(extra)}".strip()
    if not re.search(args.only, name):
        return
    argv = ["--net", net, "--procs", str(procs), "--batch", str(batch), "--machine",
            machine, *extra]
    after, before = [], []
    trees = [here] + ([args.before.resolve()] if args.before is not None else [])
    for tree in trees:  # untimed: each tree's bytecode written before it is timed
        run_plan(argv, tree, bytecode)
    for _ in range(args.repeat):  # the two trees in turn
        after.append(run_plan(argv, here, bytecode))
        if args.before is not None:
            before.append(run_plan(argv, args.before.resolve(), bytecode))
    times = [t for t, _, _ in after]
    median, cpu = statistics.median(times), statistics.median(c for _, c, _ in after)
    line = (f"{name:<58} {median:>9.3f} {min(times):>7.3f} {max(times):>7.3f} "
            f"{cpu:>7.3f}  {after[0][2]:<12}")
    if before:
        was = statistics.median(t for t, _, _ in before)
        was_cpu = statistics.median(c for _, c, _ in before)
        same = "yes" if {h for *_, h in after} == {h for *_, h in before} else "NO"
        line += (f" {was:>9.3f} {was_cpu:>7.3f} {was / median:>6.2f} {was_cpu / cpu:>6.2f}"
                 f"  {same}")
    if net == "inception_v3" and procs in PUBLISHED:
        pase, flexflow = PUBLISHED[procs]
        line += (f"  {pase:.0f} s, {flexflow:.0f} s: {pase / median:.0f}x and "
                 f"{flexflow / median:.0f}x ours")
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
