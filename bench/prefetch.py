"""Reading the next batch during each step: the wait for data with and without prefetching.

AlexNet at 127 x 127, batch 16, on ``--procs`` ranks (``mpiexec -n P python -m hpctrain``),
reading an HDF5 dataset of random images written first (``python -m hpctrain convert`` from
random ``.npy`` arrays, one batch more than the steps). The same run twice, side by side:
``--prefetch`` (the next batch's block read by a background thread during each step,
:mod:`hpctrain.data.prefetch`) and ``--no-prefetch`` (each block read when the step asks for
it). From each run's log: the median over the steps after the first of the share of the step
spent waiting for data (``steps/data_fraction``, mean over ranks), of the wait itself
(``steps/data_wait_seconds``, the slowest rank) and of the step (``steps/seconds``). The
target: a wait under 2 % of the step with prefetching. Prints the table and writes it to
``--out``.

    python bench/prefetch.py --procs 2 --steps 12
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

PY = sys.executable
MPIEXEC = str(Path(PY).parent / "mpiexec") if (Path(PY).parent / "mpiexec").exists() \
    else "mpiexec"
TARGET = 0.02  # the data wait's share of the step with prefetching


def run(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed:\n{result.stdout[-2000:]}"
                 f"{result.stderr[-2000:]}")
    return result.stdout


def write_dataset(folder: Path, samples: int, image_size: int) -> Path:
    """Random images (samples, 3, S, S) and labels in [0, 1000), converted to a dataset."""
    rng = np.random.default_rng(0)
    images = np.lib.format.open_memmap(folder / "images.npy", "w+", np.float32,
                                       (samples, 3, image_size, image_size))
    for lo in range(0, samples, 64):
        hi = min(lo + 64, samples)
        images[lo:hi] = rng.standard_normal((hi - lo, 3, image_size, image_size))
    images.flush()
    del images
    np.save(folder / "labels.npy", rng.integers(0, 1000, samples))
    out = folder / "random.h5"
    run([PY, "-m", "hpctrain", "convert", "--images", str(folder / "images.npy"),
         "--labels", str(folder / "labels.npy"), "--classes", "1000", "--out", str(out)])
    return out


def measure(data: Path, log: Path, args: argparse.Namespace, prefetch: bool
            ) -> tuple[float, float, float]:
    """Median data-wait share, data wait (s) and step (s) over the steps after the first."""
    run([MPIEXEC, "-n", str(args.procs), PY, "-m", "hpctrain", "--net", args.net,
         "--image-size", str(args.image_size), "--batch", str(args.batch), "--grid", args.grid,
         "--steps", str(args.steps), "--print-every", str(args.steps), "--data", str(data),
         "--log", str(log), "--prefetch" if prefetch else "--no-prefetch"])
    with h5py.File(log, "r") as h5:
        series = {name: h5[f"steps/{name}"][1:] for name in
                  ("data_fraction", "data_wait_seconds", "seconds")}
    return tuple(float(statistics.median(series[name])) for name in
                 ("data_fraction", "data_wait_seconds", "seconds"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--net", default="alexnet")
    parser.add_argument("--image-size", type=int, default=127)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--grid", default="conv=1x{p},fc=1x{p}",
                        help="grid spec, {p} the ranks (default: batch-parallel)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", default="runs/bench/prefetch.txt")
    args = parser.parse_args()
    args.grid = args.grid.format(p=args.procs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hpctrain-prefetch-") as tmp:
        folder = Path(tmp)
        data = write_dataset(folder, args.batch * (args.steps + 1), args.image_size)
        for prefetch in (False, True):
            name = "prefetch" if prefetch else "no prefetch"
            share, wait, step = measure(data, folder / f"{name.replace(' ', '-')}.h5", args,
                                        prefetch)
            rows.append((name, share, wait, step))
    lines = [f"data wait: {args.net} {args.image_size}x{args.image_size}, batch {args.batch}, "
             f"{args.procs} processes, grid {args.grid}, HDF5 dataset of random images; "
             f"median over steps 2-{args.steps}",
             f"{'reading':<12} {'wait share':>10} {'wait (ms)':>10} {'step (ms)':>10}"]
    lines += [f"{name:<12} {share:10.2%} {wait * 1e3:10.2f} {step * 1e3:10.1f}"
              for name, share, wait, step in rows]
    met = rows[-1][1] < TARGET
    lines.append(f"target: wait under {TARGET:.0%} of the step with prefetching: "
                 f"{'met' if met else 'NOT met'}")
    write(out, lines)


def write(out: Path, lines: list[str]) -> None:
    table = "\n".join(lines)
    print(table)
    out.write_text(table + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
