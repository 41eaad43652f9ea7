"""Training throughput: hpctrain against PyTorch on this machine, measured in one run.

``--net alexnet`` (the default). For each P: hpctrain under --grid auto and under pure batch
(1xP), against plain PyTorch (P = 1) or PyTorch DistributedDataParallel over gloo (P > 1), with
the same network, global batch and one thread per process. Also: the training step's achieved
FLOP/s against this machine's GEMM peak, and each layer's gradient all-reduce against a raw
mpi4py Allreduce of the same size. At P = 1 also the step against its roofline: the
convolutions' FLOP/s against the GEMM peak, the fully connected layers' bytes (weights, their
gradients and the optimizer's update, all memory-bound at a small batch) against the measured
memory bandwidth, and the whole step's time at those two limits against its measured time.

``--net resnet18``: ResNet-18 with batch norm over each rank's own samples on both sides
(hpctrain's ``--bn-group rank``, DDP's default per-process BatchNorm2d). For each P: hpctrain
under pure batch (1xP) and --grid auto, each with its predicted iteration, against plain PyTorch
(P = 1) or DDP over gloo (P > 1), and hpctrain's time over PyTorch's.

``--net cosmoflow``: CosmoFlow on 4-channel volumes (32³ by default), its 3-D convolutions,
leaky ReLUs and max-pools, regressed onto 4 targets by the mean squared error; the same table as
ResNet-18's.

``--net mobilenet_v2``: MobileNet v2 (64² by default), its depthwise convolutions and batch norm
over each rank's samples, against torchvision's model; the same table as ResNet-18's.

``--net resnet50`` (64², batch 8 by default) and ``--net inception_v3`` (75², batch 8, without
the auxiliary classifier): batch norm over each rank's samples, against torchvision's models;
the same table as ResNet-18's.

Every net but AlexNet also gets, at P = 1, each convolution's achieved GFLOP/s (its forward and
backward FLOPs over its measured compute in the auto run) against the GEMM rate of one thread
measured in the same invocation (:func:`gemm_peak`, the higher of a reading before and after
the runs).

Every net, both sides: float32, SGD with the same rate, momentum and weight decay, the same
global batch and image size, synthetic data, one thread per process, the first ``--warmup`` steps
dropped, a step's time the slowest rank's, the median over the other steps; the runs follow one
another in one invocation. The data are drawn outside the timed step on both sides: PyTorch
draws its batch once before the steps, and hpctrain's step is its logged time less its logged
wait for the input and labels (``/steps/data_wait_seconds``, the synthetic draw), step by step.
The PyTorch side is bench/ddp_reference.py. Prints the table and writes it, with every number
behind it, to ``--out`` (JSON) and beside it (``.txt``).

    python bench/throughput.py --procs 1 2 4 --batch 16 --image-size 127 --steps 6
    python bench/throughput.py --net resnet18 --procs 1 2 --batch 16 --image-size 32 --steps 12
    python bench/throughput.py --net cosmoflow --procs 1 2 --rounds 3
    python bench/throughput.py --net mobilenet_v2 --procs 1 2 --batch 16 --rounds 3
    python bench/throughput.py --net resnet50 --procs 1 --rounds 3
    python bench/throughput.py --net inception_v3 --procs 1 --rounds 3
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


@dataclass(frozen=True)
class NetCase:
    """A compared net: its defaults here and the hpctrain flags that match PyTorch's model."""

    image_size: int
    steps: int
    warmup: int
    out: str
    hpctrain_flags: tuple[str, ...] = ()
    batch: int = 16


NETS = {
    "alexnet": NetCase(127, 6, 1, "runs/bench/throughput.json"),
    # batch norm over each rank's samples, as DDP's BatchNorm2d (the only grouping it has)
    "resnet18": NetCase(32, 12, 2, "runs/bench/throughput-resnet18.json", ("--bn-group", "rank")),
    "cosmoflow": NetCase(32, 8, 2, "runs/bench/throughput-cosmoflow.json"),
    "mobilenet_v2": NetCase(64, 8, 2, "runs/bench/throughput-mobilenet_v2.json",
                            ("--bn-group", "rank")),
    "resnet50": NetCase(64, 8, 2, "runs/bench/throughput-resnet50.json", ("--bn-group", "rank"),
                        batch=8),
    "inception_v3": NetCase(75, 8, 2, "runs/bench/throughput-inception_v3.json",
                            ("--bn-group", "rank"), batch=8),
}
TITLES = {  # what each table's first line says of the net, beyond the batch and the update
    "resnet18": "ResNet-18 {size}x{size}, global batch {batch}, float32, batch norm over each "
                "rank's samples (hpctrain --bn-group rank, DDP's BatchNorm2d)",
    "cosmoflow": "CosmoFlow {size}^3, 4 channels, global batch {batch}, float32, mean squared "
                 "error",
    "mobilenet_v2": "MobileNet v2 {size}x{size}, global batch {batch}, float32, batch norm over "
                    "each rank's samples (hpctrain --bn-group rank, DDP's BatchNorm2d)",
    "resnet50": "ResNet-50 {size}x{size}, global batch {batch}, float32, batch norm over each "
                "rank's samples (hpctrain --bn-group rank, DDP's BatchNorm2d)",
    "inception_v3": "Inception v3 {size}x{size} (no auxiliary classifier), global batch {batch}, "
                    "float32, batch norm over each rank's samples (hpctrain --bn-group rank, "
                    "DDP's BatchNorm2d)",
}
# the update on both sides: hpctrain's defaults, passed explicitly to each
LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4


def hpctrain_run(procs: int, grid: str, args: argparse.Namespace, where: Path,
                 name: str = "") -> dict:
    log = where / f"hpctrain-{args.net}-p{procs}-{grid.replace('x', 'by')}{name}.h5"
    log.unlink(missing_ok=True)
    run([MPIEXEC, "-n", str(procs), PY, "-m", "hpctrain", "--net", args.net, "--image-size",
         str(args.image_size), "--batch", str(args.batch), "--steps", str(args.steps), "--grid",
         grid, "--precision", "fp32", "--lr", str(LR), "--momentum", str(MOMENTUM),
         "--weight-decay", str(WEIGHT_DECAY), *NETS[args.net].hpctrain_flags,
         "--print-every", str(args.steps), "--log", str(log),
         *(["--plan-file", str(where / f"{args.net}-p{procs}.plan")] if grid == "auto" else [])])
    with h5py.File(log) as h5:
        with_data = h5["steps/seconds"][args.warmup:]
        # the draw of the synthetic batch, outside the step as PyTorch's is
        seconds = with_data - h5["steps/data_wait_seconds"][args.warmup:]
        names = [n.decode() for n in h5["layers/name"][:]]
        modes = [m.decode() for m in h5["plan/mode"][:]]
        compute = sum(h5[f"layers/measured/{f}"][:]
                      for f in ("forward_compute", "backward_compute"))
        layer_comm = h5["layers/measured_fastest_rank/backward_layer_comm"][:]
        sent = np.median(h5["steps/layers/bytes_sent/max"][args.warmup:], axis=0)
        predicted = float(h5["iteration"].attrs["predicted"])
    return {"grid": grid, "log": str(log), "step_seconds": float(np.median(seconds)),
            "step_with_data_seconds": float(np.median(with_data)),
            "predicted_seconds": predicted,
            "compute_seconds": float(compute.sum()),
            "layer_compute_seconds": dict(zip(names, map(float, compute))),
            "pure_batch": set(modes) <= {"batch", "follow"},
            "layers": {name: {"allreduce_seconds": float(t), "bytes": float(b)}
                       for name, t, b, mode in zip(names, layer_comm, sent, modes + ["loss"])
                       if mode == "batch" and t > 0}}


def torch_run(procs: int, args: argparse.Namespace, where: Path, name: str = "") -> dict:
    out = where / f"torch-{args.net}-p{procs}{name}.json"
    run([PY, str(HERE / "ddp_reference.py"), "--net", args.net, "--procs", str(procs),
         "--batch", str(args.batch), "--image-size", str(args.image_size), "--steps",
         str(args.steps), "--warmup", str(args.warmup), "--lr", str(LR), "--momentum",
         str(MOMENTUM), "--weight-decay", str(WEIGHT_DECAY), "--out", str(out)])
    return json.loads(out.read_text())


def measure(procs: int, args: argparse.Namespace, where: Path) -> dict:
    """hpctrain under --grid auto and (P > 1) 1xP, then PyTorch, one after the other, that
    ``args.rounds`` times. Each configuration's result is its run with the median step over the
    rounds (the lower middle one for an even count), with every round's step beside it: on a
    shared machine another job's burst then spoils one round of one side, not the ratio."""
    grids = ["auto"] + ([f"1x{procs}"] if procs > 1 else [])
    names = [f"-round{k + 1}" if args.rounds > 1 else "" for k in range(args.rounds)]
    rounds = [({g: hpctrain_run(procs, g, args, where, name) for g in grids},
               torch_run(procs, args, where, name)) for name in names]

    def middle(runs: list[dict]) -> dict:
        steps = [r["step_seconds"] for r in runs]
        chosen = runs[steps.index(statistics.median_low(steps))]
        return {**chosen, "rounds_step_seconds": steps}

    return {"procs": procs, "hpctrain": {g: middle([ours[g] for ours, _ in rounds])
                                         for g in grids},
            "torch": middle([theirs for _, theirs in rounds])}


def raw_allreduce(procs: int, sizes: list[int], where: Path) -> dict[int, float]:
    out = where / f"raw-p{procs}.json"
    run([MPIEXEC, "-n", str(procs), PY, str(HERE / "raw_collective.py"), "--out", str(out),
         "--bytes", *map(str, sizes)])
    return {int(k): v for k, v in json.loads(out.read_text())["allreduce_seconds"].items()}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(NETS), default="alexnet",
                        help="alexnet (with the roofline and the all-reduce check), resnet18 "
                        "(batch norm over each rank's samples), cosmoflow (3-D), "
                        "mobilenet_v2 (depthwise), resnet50 or inception_v3 (default: "
                        "alexnet)")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch", type=int, help="global batch (default: 8 for resnet50 and "
                        "inception_v3, 16 for the others)")
    parser.add_argument("--image-size", type=int,
                        help="(default: 127 for alexnet, 32 for resnet18 and cosmoflow, 64 for "
                        "mobilenet_v2 and resnet50, 75 for inception_v3)")
    parser.add_argument("--steps", type=int,
                        help="steps per run, the warm-up included (default: 6 for alexnet, 12 "
                        "for resnet18, 8 for the others)")
    parser.add_argument("--warmup", type=int,
                        help="first steps of each run left out of its median (default: 1 for "
                        "alexnet, 2 for the others)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every configuration this many times, in turn, and keep the "
                        "median (default: 1)")
    parser.add_argument("--out", help="JSON file (default: runs/bench/throughput.json for "
                        "alexnet, runs/bench/throughput-NET.json for the others)")
    args = parser.parse_args()
    case = NETS[args.net]
    for name in ("image_size", "steps", "warmup", "out", "batch"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(case, name))
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup {args.warmup}: must be at least 0 and below --steps "
                     f"{args.steps}")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: must be at least 1")
    if args.batch < max(args.procs):
        parser.error(f"--batch {args.batch}: needs a sample for each of --procs "
                     f"{max(args.procs)}")
    return args


def write(table: str, out: Path, record: dict) -> None:
    print(table)
    out.write_text(json.dumps(record, indent=1))
    out.with_suffix(".txt").write_text(table + "\n")
    print(f"written: {out} and {out.with_suffix('.txt')}")


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.net == "alexnet":
        alexnet(args, out)
    else:
        against_pytorch(args, out)


def alexnet(args: argparse.Namespace, out: Path) -> None:
    """Throughput, FLOP/s against the GEMM peak, the P = 1 roofline and the all-reduces."""
    where = out.parent
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
        row = measure(procs, args, where)
        ours = row["hpctrain"]
        batch_run = ours[f"1x{procs}" if procs > 1 else "auto"]
        raw = raw_allreduce(procs, sorted({int(v["bytes"]) for v in
                                           batch_run["layers"].values()}), where) \
            if procs > 1 and batch_run["layers"] else {}
        efficiency = {name: raw[int(v["bytes"])] / v["allreduce_seconds"]
                      for name, v in batch_run["layers"].items()}
        rows.append({**row, "collective_efficiency": efficiency})
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
    write("\n".join(lines), out, {
        "net": args.net, "image_size": args.image_size, "batch": args.batch,
        "steps": args.steps, "warmup": args.warmup, "gemm_peak": peak, "step_flops": flops,
        "memory_bandwidth": bandwidth, "rows": rows})


def spread(result: dict) -> str:
    """Each round's step, in milliseconds: '102.6 110.3 187.5'."""
    return " ".join(f"{t * 1e3:.1f}" for t in result["rounds_step_seconds"])


def conv_rates(args: argparse.Namespace, measured: dict[str, float], peak: float
               ) -> list[dict]:
    """Each convolution of the net at P = 1: its FLOPs (forward and backward, the nominal
    count, windows over padding included), its measured compute seconds and its FLOP/s, alone
    and over the GEMM ``peak``."""
    from hpctrain.model.net import load_net
    from hpctrain.plan.planner import serial_layers

    rows = []
    for c in serial_layers(load_net(args.net, args.image_size), args.batch):
        if c.kind == "conv" and measured.get(c.layer, 0.0) > 0:
            flops = sum(c.work.flops())
            rows.append({"layer": c.layer, "flops": flops, "seconds": measured[c.layer],
                         "flops_per_second": flops / measured[c.layer],
                         "of_peak": flops / measured[c.layer] / peak})
    return rows


def conv_lines(rates: list[dict], peak: float) -> list[str]:
    """The table of :func:`conv_rates`, and the convolutions' total."""
    flops = sum(r["flops"] for r in rates)
    seconds = sum(r["seconds"] for r in rates)
    lines = [f"P = 1, each convolution against the GEMM rate of one thread, "
             f"{peak / 1e9:.1f} GFLOP/s (2048² float32, this run): all {len(rates)} "
             f"{flops / 1e9:.2f} GFLOP in {seconds * 1e3:.1f} ms = {flops / seconds / 1e9:.1f} "
             f"GFLOP/s = {flops / seconds / peak:.1%}",
             f"{'conv':<32} {'MFLOP':>8} {'ms':>7} {'GFLOP/s':>8} {'of GEMM':>8}"]
    lines += [f"{r['layer']:<32} {r['flops'] / 1e6:8.1f} {r['seconds'] * 1e3:7.2f} "
              f"{r['flops_per_second'] / 1e9:8.1f} {r['of_peak']:8.1%}" for r in rates]
    lines.append("MFLOP: forward and backward, windows over the padding counted (a layer that "
                 "skips taps reading only padding may pass the GEMM rate); ms: the layer's "
                 "compute, forward and backward, median step of the auto run")
    return lines


def against_pytorch(args: argparse.Namespace, out: Path) -> None:
    """Measured steps of hpctrain (1xP and auto) and PyTorch, hpctrain's predictions, and at
    P = 1 each convolution's FLOP/s against the GEMM rate."""
    before = gemm_peak()
    rows = [measure(procs, args, out.parent) for procs in args.procs]
    peak = max(before, gemm_peak())
    rates = [conv_rates(args, row["hpctrain"]["auto"]["layer_compute_seconds"], peak)
             for row in rows if row["procs"] == 1]
    title = TITLES[args.net].format(size=args.image_size, batch=args.batch)
    lines = [f"{title}, SGD (lr {LR}, momentum {MOMENTUM}, weight decay {WEIGHT_DECAY}), "
             f"1 thread per process; step: the slowest rank's, median of steps "
             f"{args.warmup + 1}-{args.steps}",
             f"{'P':>2} {'1xP ms':>8} {'predicted':>9} {'auto ms':>8} {'predicted':>9} "
             f"{'auto plan':>9} {'torch ms':>8} {'reference':>9} {'1xP/torch':>9} "
             f"{'auto/torch':>10}"]
    for row in rows:
        procs, ours, theirs = row["procs"], row["hpctrain"], row["torch"]
        auto, batch = ours["auto"], ours.get(f"1x{procs}", ours["auto"])
        torch_s = theirs["step_seconds"]
        lines.append(
            f"{procs:>2} {batch['step_seconds'] * 1e3:8.1f} "
            f"{batch['predicted_seconds'] * 1e3:9.1f} {auto['step_seconds'] * 1e3:8.1f} "
            f"{auto['predicted_seconds'] * 1e3:9.1f} "
            f"{'batch' if auto['pure_batch'] else 'mixed':>9} {torch_s * 1e3:8.1f} "
            f"{theirs['reference']:>9} {batch['step_seconds'] / torch_s:9.2f} "
            f"{auto['step_seconds'] / torch_s:10.2f}")
        if args.rounds > 1:
            lines.append(f"{'':>2} rounds, ms: 1xP {spread(batch)}; auto {spread(auto)}; "
                         f"torch {spread(theirs)}")
    lines.append("ratios < 1: hpctrain faster (time of hpctrain / time of PyTorch); predicted: "
                 "hpctrain's iteration time for that run, as its log records it "
                 "(/iteration predicted); at P = 1 the 1xP columns are the auto run; "
                 "hpctrain's steps without the draw of their data, as PyTorch's")
    for rate in rates:
        lines += conv_lines(rate, peak)
    write("\n".join(lines), out, {
        "net": args.net, "image_size": args.image_size, "batch": args.batch,
        "steps": args.steps, "warmup": args.warmup,
        **({"bn_group": "rank"} if "--bn-group" in NETS[args.net].hpctrain_flags else {}),
        "lr": LR, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY, "gemm_peak": peak,
        "conv_rates": rates[0] if rates else [], "rows": rows})


if __name__ == "__main__":
    main()
