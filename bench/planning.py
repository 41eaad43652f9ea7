"""How long ``python -m hpctrain plan`` takes, whole process, against the published planners.

Each case runs ``plan`` as its own process ``--repeat`` times (import, net, cost model, exact
search, printing) and reports the median, least and largest wall time. The published times
are those of PaSE (Elango, IPDPS 2021, Table I) for Inception-v3: its dynamic programming over
a vertex ordering needs 14 s for 4 GPUs and 3 min 16 s for 64, FlexFlow's MCMC search 1 min 9 s
and 37 min 17 s on the same; the ratio is theirs over ours at the same process count (their
machines and their nets' granularity differ: a ratio of seconds, not of work).

    python bench/planning.py --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

# (net, P, B, extra flags)
CASES = [
    ("resnet50", 4096, 2048, ()),
    ("resnet50", 4096, 512, ()),
    ("inception_v3", 4096, 2048, ()),
    ("inception_v3", 4096, 512, ()),
    ("alexnet", 4096, 2048, ()),
    ("vgg16", 4096, 2048, ()),
    ("deepcam", 4096, 2048, ()),  # 145 weighted layers at 768x1152
    ("efficientnet_b0", 4096, 2048, ()),
    ("resnet50", 4096, 2048, ("--mem-per-rank", "230M")),  # a cap that binds (239 MiB free)
    ("inception_v3", 4, 128, ()),
    ("inception_v3", 64, 128, ()),
]
PUBLISHED = {  # Inception-v3 at P: seconds (PaSE, FlexFlow)
    4: (14.0, 69.0),
    64: (196.0, 2237.0),
}


def wall_times(argv: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (default: 5)")
    parser.add_argument("--machine", default="cori-knl", help="profile (default: cori-knl)")
    args = parser.parse_args()
    print(f"{'plan':<44} {'median s':>9} {'min s':>7} {'max s':>7}  published (PaSE, FlexFlow)")
    for net, procs, batch, extra in CASES:
        argv = [sys.executable, "-m", "hpctrain", "plan", "--net", net, "--procs", str(procs),
                "--batch", str(batch), "--machine", args.machine, *extra]
        times = wall_times(argv, args.repeat)
        median = statistics.median(times)
        name = f"{net} P={procs} B={batch} {' '.join(extra)}".strip()
        versus = ""
        if net == "inception_v3" and procs in PUBLISHED:
            pase, flexflow = PUBLISHED[procs]
            versus = (f"  {pase:.0f} s, {flexflow:.0f} s: {pase / median:.0f}x and "
                      f"{flexflow / median:.0f}x ours")
        print(f"{name:<44} {median:>9.3f} {min(times):>7.3f} {max(times):>7.3f}{versus}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
