"""AlexNet training throughput: hpctrain against PyTorch on this machine, measured in one run.

For each P: hpctrain under --grid auto and under pure batch (1xP), against plain PyTorch (P = 1)
or PyTorch DistributedDataParallel over gloo (P > 1), with the same network, global batch and
one thread per process. Also: the training step's achieved FLOP/s against this machine's GEMM
peak, and each layer's gradient all-reduce against a raw mpi4py Allreduce of the same size.
Prints the table and writes it, with every number behind it, to ``--out`` (JSON) and beside it
(``.txt``).

    python bench/throughput.py --procs 1 2 4 --batch 16 --image-size 127 --steps 6
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

import h5py
import numpy as np

HERE = Path(__file__).resolve().parent
PY = sys.executable
MPIEXEC = str(Path(PY).parent / "mpiexec") if (Path(PY).parent / "mpiexec").exists() \
    else "mpiexec"


def run(command: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed:\n{result.stdout[-2000:]}"
                 f"{result.stderr[-2000:]}")


def gemm_peak(size: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of one process on a square float32 GEMM (one thread, as every rank runs)."""
    a = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    b = a.T.copy()
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * size ** 3 / statistics.median(times)


def step_flops(image_size: int, batch: int) -> float:
    """GEMM FLOPs of one whole training step: forward and backward of every convolution and
    linear layer, whole batch (pooling and element-wise work is under 1 % and not GEMM)."""
    from hpctrain.net import load_net
    from hpctrain.planner import iteration_flops

    return iteration_flops(load_net("alexnet", image_size), batch, kinds=("conv", "linear"))


def hpctrain_run(procs: int, grid: str, args: argparse.Namespace, where: Path) -> dict:
    log = where / f"hpctrain-p{procs}-{grid.replace('x', 'by')}.h5"
    log.unlink(missing_ok=True)
    run([MPIEXEC, "-n", str(procs), PY, "-m", "hpctrain", "--net", "alexnet", "--image-size",
         str(args.image_size), "--batch", str(args.batch), "--steps", str(args.steps), "--grid",
         grid, "--print-every", str(args.steps), "--log", str(log), "--plan-file",
         str(where / f"p{procs}.plan")])
    with h5py.File(log) as h5:
        seconds = h5["steps/seconds"][1:]
        names = [n.decode() for n in h5["layers/name"][:]]
        modes = [m.decode() for m in h5["plan/mode"][:]]
        compute = sum(h5[f"layers/measured/{f}"][:].sum()
                      for f in ("forward_compute", "backward_compute"))
        layer_comm = h5["layers/measured_fastest_rank/backward_layer_comm"][:]
        sent = np.median(h5["steps/layers/bytes_sent/max"][1:], axis=0)
    return {"grid": grid, "log": str(log), "step_seconds": float(np.median(seconds)),
            "compute_seconds": float(compute), "pure_batch": set(modes) <= {"batch", "follow"},
            "layers": {name: {"allreduce_seconds": float(t), "bytes": float(b)}
                       for name, t, b, mode in zip(names, layer_comm, sent, modes + ["loss"])
                       if mode == "batch" and t > 0}}


def torch_run(procs: int, args: argparse.Namespace, where: Path) -> dict:
    out = where / f"torch-p{procs}.json"
    run([PY, str(HERE / "torch_alexnet.py"), "--procs", str(procs), "--batch", str(args.batch),
         "--image-size", str(args.image_size), "--steps", str(args.steps), "--out", str(out)])
    return json.loads(out.read_text())


def raw_allreduce(procs: int, sizes: list[int], where: Path) -> dict[int, float]:
    out = where / f"raw-p{procs}.json"
    run([MPIEXEC, "-n", str(procs), PY, str(HERE / "raw_collective.py"), "--out", str(out),
         "--bytes", *map(str, sizes)])
    return {int(k): v for k, v in json.loads(out.read_text())["allreduce_seconds"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch", type=int, default=16, help="global batch (default: 16)")
    parser.add_argument("--image-size", type=int, default=127, help="(default: 127)")
    parser.add_argument("--steps", type=int, default=6,
                        help="steps per run, the first a warm-up (default: 6)")
    parser.add_argument("--out", default="runs/bench/throughput.json")
    args = parser.parse_args()
    out = Path(args.out)
    where = out.parent
    where.mkdir(parents=True, exist_ok=True)

    peak = gemm_peak()
    flops = step_flops(args.image_size, args.batch)
    rows = []
    for procs in args.procs:
        grids = ["auto"] + ([f"1x{procs}"] if procs > 1 else [])
        ours = {g: hpctrain_run(procs, g, args, where) for g in grids}
        theirs = torch_run(procs, args, where)
        batch_run = ours[grids[-1]]
        raw = raw_allreduce(procs, sorted({int(v["bytes"]) for v in
                                           batch_run["layers"].values()}), where) \
            if procs > 1 and batch_run["layers"] else {}
        efficiency = {name: raw[int(v["bytes"])] / v["allreduce_seconds"]
                      for name, v in batch_run["layers"].items()}
        rows.append({"procs": procs, "hpctrain": ours, "torch": theirs,
                     "collective_efficiency": efficiency})

    lines = [f"AlexNet {args.image_size}x{args.image_size}, global batch {args.batch}, "
             f"1 thread per process; step FLOPs {flops / 1e9:.2f} G; GEMM peak "
             f"{peak / 1e9:.1f} GFLOP/s per process",
             f"{'P':>2} {'auto ms':>9} {'1xP ms':>9} {'torch ms':>9} {'reference':>9} "
             f"{'auto/torch':>10} {'1xP/torch':>9} {'auto plan':>10} {'FLOP/s/peak':>11} "
             f"{'compute/peak':>12} {'allreduce/raw':>13}"]
    for row in rows:
        procs, ours, theirs = row["procs"], row["hpctrain"], row["torch"]
        auto = ours["auto"]
        batch_ms = ours.get(f"1x{procs}", auto)["step_seconds"] * 1e3
        torch_s = theirs["step_seconds"]
        achieved = flops / auto["step_seconds"] / procs / peak
        compute = flops / procs / auto["compute_seconds"] / peak
        eff = row["collective_efficiency"]
        eff_text = f"{min(eff.values()):.2f}-{max(eff.values()):.2f}" if eff else "-"
        lines.append(
            f"{procs:>2} {auto['step_seconds'] * 1e3:9.1f} {batch_ms:9.1f} {torch_s * 1e3:9.1f} "
            f"{'torch' if procs == 1 else 'DDP gloo':>9} {torch_s / auto['step_seconds']:10.2f} "
            f"{torch_s * 1e3 / batch_ms:9.2f} {'batch' if auto['pure_batch'] else 'mixed':>10} "
            f"{achieved:11.1%} {compute:12.1%} {eff_text:>13}")
    lines.append("ratios > 1: hpctrain faster (time of PyTorch / time of hpctrain); FLOP/s/peak: "
                 "whole step, compute/peak: the layers' compute time only; allreduce/raw: each "
                 "batch-parallel layer's gradient all-reduce (pure-batch run, fastest rank) "
                 "against a raw mpi4py Allreduce of the same bytes")
    table = "\n".join(lines)
    print(table)
    out.write_text(json.dumps({"image_size": args.image_size, "batch": args.batch,
                               "steps": args.steps, "gemm_peak": peak, "step_flops": flops,
                               "rows": rows}, indent=1))
    out.with_suffix(".txt").write_text(table + "\n")
    print(f"written: {out} and {out.with_suffix('.txt')}")


if __name__ == "__main__":
    main()
