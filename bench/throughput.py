"""AlexNet training throughput: hpctrain against PyTorch on this machine, measured in one run.

For each P: hpctrain under --grid auto and under pure batch (1xP), against plain PyTorch (P = 1)
or PyTorch DistributedDataParallel over gloo (P > 1), with the same network, global batch and
one thread per process. Also: the training step's achieved FLOP/s against this machine's GEMM
peak, and each layer's gradient all-reduce against a raw mpi4py Allreduce of the same size.
At P = 1 also the step against its roofline: the convolutions' FLOP/s against the GEMM peak,
the fully connected layers' bytes (weights, their gradients and the optimizer's update, all
memory-bound at a small batch) against the measured memory bandwidth, and the whole step's
time at those two limits against its measured time.
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
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
from threadpoolctl import threadpool_limits

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
    """FLOP/s of one process on a square float32 GEMM, on one thread as every rank runs (this
    process's BLAS would otherwise use every core)."""
    a = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    b = a.T.copy()
    with threadpool_limits(1):
        a @ b
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
    return 2 * size ** 3 / statistics.median(times)


def memory_bandwidth(entries: int, repeats: int = 5) -> float:
    """Bytes/s of one process copying a float32 array of ``entries`` (far larger than the
    caches), each byte read once and written once (STREAM's "copy" counting).

    The rate depends on the size on machines of this kind (16 to 256 MiB arrays copy at 10 to
    26 GB/s), so it is measured at the size of the largest weight the fully connected layers
    stream, the arrays it judges."""
    source = np.ones(entries, dtype=np.float32)
    target = np.empty_like(source)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        np.copyto(target, source)
        times.append(time.perf_counter() - start)
    return 2 * source.nbytes / statistics.median(times[1:])


SGD_PASSES = 5  # momentum SGD reads w, g, v and writes w, v: each array crosses the bus once


@dataclass(frozen=True)
class LayerWork:
    """A conv or linear layer of AlexNet at P = 1, as its roofline sees it.

    The bytes count only for fully connected layers, whose weights are read once per GEMM at a
    small batch: forward reads W; backward reads W (for dX, when needed) and writes dW; the
    update makes :data:`SGD_PASSES` passes over W."""

    kind: str
    flops: float  # GEMM FLOPs of forward and backward
    weight_bytes: float  # one pass over W (0 for a convolution)
    gemm_passes: int

    @property
    def gemm_bytes(self) -> float:
        return self.weight_bytes * self.gemm_passes

    @property
    def update_bytes(self) -> float:
        return self.weight_bytes * SGD_PASSES


def layer_work(image_size: int, batch: int) -> dict[str, LayerWork]:
    """Every conv and linear layer of AlexNet at P = 1, by name."""
    from hpctrain.model.net import load_net
    from hpctrain.plan.planner import serial_layers

    return {c.layer: LayerWork(c.kind, sum(c.work.flops()),
                               c.resident["parameters"] if c.kind == "linear" else 0.0,
                               3 if c.work.need_dx else 2)
            for c in serial_layers(load_net("alexnet", image_size), batch)
            if c.kind in ("conv", "linear")}


def roofline(measured: dict[str, float], work: dict[str, LayerWork], step_seconds: float,
             peak: float, bandwidth: float) -> dict[str, float]:
    """A P = 1 run against its roofline. Each convolution's limit is its FLOPs at the GEMM peak;
    each fully connected layer's is its GEMMs at the slower of peak and bandwidth, plus its
    update at bandwidth (its measured time includes the update, which runs inside the
    backward). Reported: the convolutions' FLOP/s over the peak, the fully connected layers'
    limit over their time, and the step's: the sum of the limits (everything else, pooling and
    element-wise work, counted as free) over the measured step; ``measured``: each layer's
    compute seconds, forward and backward."""
    conv = {n: w for n, w in work.items() if w.kind == "conv"}
    fc = {n: w for n, w in work.items() if w.kind == "linear"}
    conv_flops = sum(w.flops for w in conv.values())
    conv_s = sum(measured[n] for n in conv)
    fc_bytes = sum(w.gemm_bytes + w.update_bytes for w in fc.values())
    fc_limit = sum(max(w.flops / peak, w.gemm_bytes / bandwidth) + w.update_bytes / bandwidth
                   for w in fc.values())
    fc_s = sum(measured[n] for n in fc)
    ideal = conv_flops / peak + fc_limit
    return {"conv_seconds": float(conv_s), "conv_flops": conv_flops,
            "conv_of_peak": conv_flops / conv_s / peak, "fc_seconds": float(fc_s),
            "fc_bytes": fc_bytes, "fc_limit_seconds": fc_limit, "fc_of_limit": fc_limit / fc_s,
            "fc_of_bandwidth": fc_bytes / fc_s / bandwidth,
            "ideal_seconds": ideal, "step_of_roofline": ideal / step_seconds}


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
        compute = sum(h5[f"layers/measured/{f}"][:]
                      for f in ("forward_compute", "backward_compute"))
        layer_comm = h5["layers/measured_fastest_rank/backward_layer_comm"][:]
        sent = np.median(h5["steps/layers/bytes_sent/max"][1:], axis=0)
    return {"grid": grid, "log": str(log), "step_seconds": float(np.median(seconds)),
            "compute_seconds": float(compute.sum()),
            "layer_compute_seconds": dict(zip(names, map(float, compute))),
            "pure_batch": set(modes) <= {"batch", "follow"},
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

    work = layer_work(args.image_size, args.batch)
    # GEMM FLOPs of a whole step (pooling and element-wise work is under 1 % and not GEMM)
    flops = sum(w.flops for w in work.values())
    largest_weight = max(w.weight_bytes for w in work.values())

    def limits() -> tuple[float, float]:
        return gemm_peak(), memory_bandwidth(int(largest_weight) // 4)

    # read before and after the runs, the higher kept: each reading takes a fraction of a
    # second, and a moment of a busy machine only ever makes it read low
    before = limits()
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
    peak, bandwidth = map(max, zip(before, limits(), strict=True))
    for row in rows:
        if row["procs"] == 1:
            auto = row["hpctrain"]["auto"]
            row["roofline"] = roofline(auto["layer_compute_seconds"], work, auto["step_seconds"],
                                       peak, bandwidth)

    lines = [f"AlexNet {args.image_size}x{args.image_size}, global batch {args.batch}, "
             f"1 thread per process; step FLOPs {flops / 1e9:.2f} G; GEMM peak "
             f"{peak / 1e9:.1f} GFLOP/s per process; memory bandwidth {bandwidth / 1e9:.1f} GB/s "
             f"(a copy of {largest_weight / 2**20:.0f} MiB)",
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
    for row in rows:
        if "roofline" in row:
            r = row["roofline"]
            lines.append(
                f"P = 1 against the roofline: conv {r['conv_flops'] / 1e9:.2f} GFLOP in "
                f"{r['conv_seconds'] * 1e3:.1f} ms = {r['conv_of_peak']:.1%} of GEMM peak; "
                f"fully connected with their update {r['fc_bytes'] / 1e6:.0f} MB in "
                f"{r['fc_seconds'] * 1e3:.1f} ms = {r['fc_of_bandwidth']:.1%} of bandwidth, "
                f"limit {r['fc_limit_seconds'] * 1e3:.1f} ms = {r['fc_of_limit']:.1%}; step at "
                f"those limits {r['ideal_seconds'] * 1e3:.1f} ms = "
                f"{r['step_of_roofline']:.1%} of the measured step (target >= 60%)")
    table = "\n".join(lines)
    print(table)
    out.write_text(json.dumps({"image_size": args.image_size, "batch": args.batch,
                               "steps": args.steps, "gemm_peak": peak, "step_flops": flops,
                               "memory_bandwidth": bandwidth,
                               "rows": rows}, indent=1))
    out.with_suffix(".txt").write_text(table + "\n")
    print(f"written: {out} and {out.with_suffix('.txt')}")


if __name__ == "__main__":
    main()
