"""What ``--space balanced`` costs ``train --grid auto`` with measured compute, against ``grids``.

For each net, process count and space, launches ``mpiexec -n P python -m hpctrain --net NET
--grid auto --space SPACE --plan-only`` twice on one fresh compute-time cache
(``HPCTRAIN_CACHE_DIR``): first cold (the directory empty), then warm (the same directory).
``--plan-only`` stops ``train`` where its first step would start, after the same set-up: the P
ranks time every candidate's kernels together, search and write the plan file. Per launch it
reports the wall time (launch, imports, kernel timing and search), the kernels timed (the
entries the cache gained: every kernel timed is added under its own key) and the predicted
iteration of the chosen plan (from the plan file's header).

After the spaces, ``grids`` runs once more on the cache ``balanced`` filled ("grids on
balanced's cache"), so that the two plans are priced from the same timings: measured compute
varies from launch to launch, and two spaces' plans timed apart differ by that noise too.
Below the table, the kernel shapes one space times that the other does not.

Then ``--space auto`` (the default) runs on a copy of the cache a cold ``grids`` launch filled
("auto on grids' cache"): it finds the grids' kernels cached and estimates how long timing the
kernels balanced adds would take (its plan's note says about how long, and which space it
searched; ``--steps``: the run it weighs that against, train's default of 10 steps unless
given). ``balanced`` runs twice on another copy: the first launch's time less the second's is
how long that timing took, to set against the estimate.

Cold and warm are repeated ``--repeat`` times, each on a fresh directory; the table gives the
median seconds, the range, and the median predicted iteration. A launch past ``--timeout``
seconds is stopped and reported as such, and one that ends without a plan with its last lines.

CosmoFlow runs at batch 8 by default (``cosmoflow@8``): at train's batch of 32 its 128^3
volumes fit no 1.5D plan in the memory of a 23 GiB node on 2 or 4 ranks (``grids`` refuses in
seconds), and ``balanced`` then times the kernels of candidates that do not fit either.

    OMP_NUM_THREADS=1 python bench/space_cost.py --nets alexnet:224 resnet50 cosmoflow@8 \\
        --procs 2 4 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PY = sys.executable
MPIEXEC = str(Path(PY).parent / "mpiexec") if (Path(PY).parent / "mpiexec").exists() \
    else "mpiexec"
ROOT = Path(__file__).resolve().parent.parent
PREDICTED = re.compile(r"^# predicted iteration ([\d.]+) ms", re.MULTILINE)
ESTIMATE = re.compile(r"--space auto searched (balanced|the grids only)[^\n]*?(?:about|"
                      r"estimated at) ([\d.e-]+) (s|min)")
SPACES = ("grids", "balanced")
SAME_CACHE = "grids on balanced's cache"
AUTO = "auto on grids' cache"


@dataclass
class Launch:
    """One ``train --grid auto --plan-only``: its wall time, the cache keys it added and the
    predicted iteration of its plan (None where it failed or ran past the timeout)."""

    seconds: float
    gained: set[str] = field(default_factory=set)
    predicted_ms: float | None = None
    failed: str = ""  # why there is no plan
    output: str = ""  # what it printed


def cache_keys(cache: Path) -> set[str]:
    path = cache / "compute-times.json"
    if not path.is_file():
        return set()
    return set(json.loads(path.read_text()))


def launch(net: str, image_size: int | None, procs: int, space: str, batch: int, cache: Path,
           work: Path, timeout: float, steps: int | None = None) -> Launch:
    """One launch of ``train --grid auto --space SPACE --plan-only`` on the cache ``cache``
    (for a run of ``steps`` steps, when given)."""
    plan = work / f"{net}-p{procs}-{space}-{time.monotonic_ns()}.plan"
    command = [MPIEXEC, "-n", str(procs), PY, "-m", "hpctrain", "--net", net,
               "--batch", str(batch), "--grid", "auto", "--space", space, "--plan-only",
               "--plan-file", str(plan)]
    if steps is not None:
        command += ["--steps", str(steps)]
    if image_size is not None:
        command += ["--image-size", str(image_size)]
    env = {**os.environ, "HPCTRAIN_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    env.setdefault("OMP_NUM_THREADS", "1")
    before = cache_keys(cache)
    start = time.perf_counter()
    # its own process group, so that a launch past the timeout is stopped with its ranks
    process = subprocess.Popen(command, env=env, cwd=work, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return Launch(time.perf_counter() - start, failed=f"stopped after {timeout:.0f} s")
    seconds = time.perf_counter() - start
    gained = cache_keys(cache) - before
    if process.returncode != 0 or not plan.is_file():
        tail = " | ".join(output.strip().splitlines()[-3:])
        return Launch(seconds, gained, failed=f"exit {process.returncode}: {tail}")
    match = PREDICTED.search(plan.read_text())
    return Launch(seconds, gained, float(match.group(1)) if match else None, output=output)


def auto_estimate(auto: Launch, first: Launch, second: Launch) -> str:
    """What ``--space auto`` (``auto``) estimated the balanced kernels' timing at and which
    space it searched, and how long the timing took: ``first``'s time less ``second``'s,
    ``balanced`` on a copy of the same cache and again on the cache ``first`` filled."""
    if auto.failed or first.failed or second.failed:
        return f"auto: {auto.failed or first.failed or second.failed}"
    found = ESTIMATE.search(auto.output.replace("\n", " "))
    took = (f"timing took {first.seconds - second.seconds:.1f} s ({first.seconds:.1f} - "
            f"{second.seconds:.1f}), {len(first.gained)} kernels")
    if found is None:
        searched = "balanced" if "searched balanced" in auto.output else "?"
        return f"auto searched {searched} with nothing to estimate; {took}"
    estimate = float(found.group(2)) * (60 if found.group(3) == "min" else 1)
    searched = "balanced" if found.group(1) == "balanced" else "the grids only"
    return f"auto estimated {estimate:.3g} s, searched {searched}; {took}"


def parse_net(text: str) -> tuple[str, int | None, int | None]:
    """NAME[:IMAGE_SIZE][@BATCH]: 'alexnet:224' -> ('alexnet', 224, None); 'cosmoflow@8' ->
    ('cosmoflow', None, 8); None: the net's own size, --batch."""
    rest, _, batch = text.partition("@")
    name, _, size = rest.partition(":")
    try:
        return name, int(size) if size else None, int(batch) if batch else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nets {text}: give NAME[:IMAGE_SIZE][@BATCH], e.g. "
                                         f"alexnet:224 or cosmoflow@8") from None


def row(name: str, procs: int, space: str, state: str, launches: list[Launch]) -> str:
    done = [run for run in launches if not run.failed]
    if not done:
        if not launches:
            return f"{name:<14} {procs:>2} {space:<26} {state:<5} not run"
        seconds = statistics.median(run.seconds for run in launches)
        return (f"{name:<14} {procs:>2} {space:<26} {state:<5} {seconds:>8.1f}  no plan: "
                f"{launches[0].failed}")
    seconds = [run.seconds for run in done]
    kernels = sorted({len(run.gained) for run in done})
    predicted = [run.predicted_ms for run in done if run.predicted_ms is not None]
    shown = statistics.median(predicted) if predicted else float("nan")
    spread = f"{min(seconds):.1f}-{max(seconds):.1f}"
    failed = f"  ({len(launches) - len(done)} failed)" if len(done) < len(launches) else ""
    return (f"{name:<14} {procs:>2} {space:<26} {state:<5} {statistics.median(seconds):>8.1f} "
            f"{spread:>13} {'/'.join(map(str, kernels)):>8} {shown:>13.1f}{failed}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", nargs="+", type=parse_net,
                        default=[("alexnet", 224, None), ("resnet50", None, None),
                                 ("cosmoflow", None, 8)],
                        metavar="NET[:SIZE][@BATCH]",
                        help="nets, each with its image size after a colon (default: the "
                             "net's own) and its batch after an @ (default: --batch) "
                             "(default: alexnet:224 resnet50 cosmoflow@8)")
    parser.add_argument("--procs", nargs="+", type=int, default=[2, 4],
                        help="process counts (default: 2 4)")
    parser.add_argument("--batch", type=int, default=32,
                        help="global batch of a net without @BATCH (default: 32, train's)")
    parser.add_argument("--repeat", type=int, default=2,
                        help="cold and warm launches per case, each cold one on a fresh "
                             "cache (default: 2)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds before a launch is stopped (default: 600)")
    parser.add_argument("--steps", type=int, default=None,
                        help="the run --space auto weighs the balanced kernels' timing "
                             "against (default: train's default)")
    args = parser.parse_args()
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}, batch {args.batch} "
          f"unless the net says @BATCH, "
          f"{args.repeat} launches per row; kernels: those timed (the cache's new entries)")
    print(f"{'net':<14} {'P':>2} {'space':<26} {'cache':<5} {'median s':>8} {'min-max s':>13} "
          f"{'kernels':>8} {'predicted ms':>13}", flush=True)
    extra: list[str] = []
    with tempfile.TemporaryDirectory(prefix="space-cost-") as scratch:
        work = Path(scratch)
        for net, image_size, net_batch in args.nets:
            name = (f"{net}:{image_size}" if image_size else net) + (
                f"@{net_batch}" if net_batch else "")
            batch = net_batch or args.batch
            slug = name.replace(":", "-s").replace("@", "-b")  # one net at two sizes apart
            for procs in args.procs:
                runs: dict[tuple[str, str], list[Launch]] = {}
                keys: dict[str, set[str]] = {}
                for space in (*SPACES, SAME_CACHE):
                    cold, warm = runs.setdefault((space, "cold"), []), runs.setdefault(
                        (space, "warm"), [])
                    for k in range(args.repeat):
                        cache = work / f"{slug}-p{procs}-{space.split()[0]}-{k}"
                        if space == SAME_CACHE:  # the cache the balanced launches left
                            cache = work / f"{slug}-p{procs}-balanced-{k}"
                            if not cache.is_dir():
                                continue
                            cold.append(launch(net, image_size, procs, "grids", batch,
                                               cache, work, args.timeout))
                            continue
                        cache.mkdir()
                        first = launch(net, image_size, procs, space, batch, cache, work,
                                       args.timeout)
                        cold.append(first)
                        if first.failed:
                            break  # a warm cache would be neither cold nor warm
                        keys.setdefault(space, first.gained)
                        if space == "grids":  # copies for auto, before the warm launch
                            for copy in ("auto", "timed"):
                                shutil.copytree(cache, work / f"{slug}-p{procs}-{copy}-{k}")
                        warm.append(launch(net, image_size, procs, space, batch, cache,
                                           work, args.timeout))
                    for state in ("cold", "warm"):
                        if runs[space, state]:
                            label = "warm" if space == SAME_CACHE else state
                            print(row(name, procs, space, label, runs[space, state]),
                                  flush=True)
                for k in range(args.repeat):
                    cache = work / f"{slug}-p{procs}-auto-{k}"
                    if cache.is_dir():
                        auto = launch(net, image_size, procs, "auto", batch, cache, work,
                                      args.timeout, args.steps)
                        timed = work / f"{slug}-p{procs}-timed-{k}"
                        first, second = (launch(net, image_size, procs, "balanced", batch,
                                                timed, work, args.timeout) for _ in range(2))
                        print(f"{name:<14} {procs:>2} {AUTO:<26} "
                              f"{auto_estimate(auto, first, second)}", flush=True)
                if "grids" in keys and "balanced" in keys:
                    only = len(keys["balanced"] - keys["grids"])
                    extra.append(f"{name} P={procs}: balanced times {only} kernel shapes that "
                                 f"grids does not; grids {len(keys['grids'] - keys['balanced'])}"
                                 f" that balanced does not")
    for line in extra:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
