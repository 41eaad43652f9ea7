"""One GPU, side by side: hpctrain's training step against PyTorch eager's, same net, batch and
precision, in one process.

Nets (``--nets``): AlexNet 224² batch 256, ResNet-50 224² batch 128, CosmoFlow 128³ batch 4
(hpctrain's shipped .net files; the PyTorch model is built from the same file, layer by
layer, by :class:`TorchNet`). Precisions (``--precisions``):

- ``fp32``: float32, no TF32 anywhere (PyTorch: ``torch.backends.cudnn.allow_tf32`` and
  ``torch.backends.cuda.matmul.allow_tf32`` off; hpctrain: ``--precision fp32``);
- ``tf32``: float32 storage, TF32 products (both flags on; hpctrain ``tf32``);
- ``bf16``: PyTorch autocast to bfloat16 over float32 weights; hpctrain ``bf16`` (bfloat16
  storage, float32 master weights and momentum).

Both sides: synthetic data made once (data production is not compared), SGD with momentum and
weight decay, batch norm in training mode, PyTorch channels-last (``--torch-layout``) with
cuDNN's heuristics (``torch.backends.cudnn.benchmark`` off, its default). hpctrain runs one
``Network`` on one rank (pure batch 1×1), updating each layer as its gradient is ready, as
``train`` does, with no timing record. A step is timed between two device synchronisations;
the result is the median of ``--steps`` steps after ``--warmup``. Then, separately, hpctrain's
forward and backward time per layer for one net and precision (``--layers``), measured with a
timing record (device events around each layer).

Each result is printed as soon as it is measured, the most wanted first (ResNet-50 tf32 and
bf16, AlexNet tf32, then the per-layer table, then the rest), and everything is written to
``--out`` (JSON, rewritten after each).

    python bench/gpu_step.py --out runs/bench/gpu_step.json
    python bench/gpu_step.py --nets resnet50 --precisions bf16 --steps 10 --warmup 3
    python bench/gpu_step.py --device cpu --dry-run      # the harness itself, tiny sizes
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4
SEED = 0


@dataclass(frozen=True)
class NetCase:
    image_size: int
    batch: int
    dry_size: int  # --dry-run: the smallest size the net takes
    dry_batch: int


NETS = {"alexnet": NetCase(224, 256, 63, 2), "resnet50": NetCase(224, 128, 32, 2),
        "cosmoflow": NetCase(128, 4, 32, 1)}
PRECISIONS = ("fp32", "tf32", "bf16")
FIRST = (("resnet50", "tf32"), ("resnet50", "bf16"), ("alexnet", "tf32"))
"""Measured first, in this order: the numbers most wanted if the run is cut short."""


def ordered_runs(nets: list[str], precisions: list[str]) -> list[tuple[str, str]]:
    """Every (net, precision) asked for: those of :data:`FIRST` first, strict fp32 (the
    slowest, least used) last."""
    wanted = [(n, p) for n in nets for p in precisions]
    rest = [r for r in wanted if r not in FIRST]
    return ([r for r in FIRST if r in wanted] + [r for r in rest if r[1] != "fp32"]
            + [r for r in rest if r[1] == "fp32"])


# -- the PyTorch model of a .net file ------------------------------------------------------------

def torch_net(net: Any):
    """The PyTorch module of hpctrain net ``net`` (a NetSpec): one module per layer, the same
    graph (adds read two layers), the same shapes."""
    import torch
    from torch import nn

    class Add(nn.Module):
        def forward(self, *xs):
            out = xs[0]
            for x in xs[1:]:
                out = out + x
            return out

    class Scale(nn.Module):
        def __init__(self, factor: float) -> None:
            super().__init__()
            self.factor = factor

        def forward(self, x):
            return x * self.factor

    def padding(pads, value: float):
        """A pad module for (before, after) per spatial axis, and the symmetric padding left
        for the layer itself: () when it pads everything."""
        if all(b == a for b, a in pads):
            return None, tuple(b for b, _ in pads)
        flat = tuple(v for b, a in reversed(pads) for v in (b, a))  # F.pad: last axis first
        pad_kind = nn.ConstantPad2d if len(pads) == 2 else nn.ConstantPad3d
        return pad_kind(flat, value), (0,) * len(pads)

    def module(k: int, spec: Any) -> nn.Module:
        shape = net.in_shapes(k)[0]
        o, d = spec.options, len(shape) - 1
        kind = spec.kind
        if kind == "conv":
            conv = (nn.Conv2d if d == 2 else nn.Conv3d)
            pad, inner = padding(o.pad, 0.0)
            layer = conv(shape[0], o.out, o.kernel, o.stride, inner, bias=o.bias)
            return layer if pad is None else nn.Sequential(pad, layer)
        if kind == "batchnorm":
            return (nn.BatchNorm2d if d == 2 else nn.BatchNorm3d)(shape[0], eps=o.eps,
                                                                  momentum=o.momentum)
        if kind == "relu":
            producer = net.producers(k)[0]
            alone = producer >= 0 and len(net.consumers[producer]) == 1
            return nn.ReLU(inplace=alone)
        if kind == "leakyrelu":
            return nn.LeakyReLU(o.slope)
        if kind in ("maxpool", "avgpool"):
            if o.kernel is None:  # global
                return (nn.AdaptiveMaxPool2d if kind == "maxpool" else nn.AdaptiveAvgPool2d)(1) \
                    if d == 2 else (nn.AdaptiveMaxPool3d if kind == "maxpool"
                                    else nn.AdaptiveAvgPool3d)(1)
            value = -math.inf if kind == "maxpool" else 0.0
            pad, inner = padding(o.pad, value)
            pool = {("maxpool", 2): nn.MaxPool2d, ("maxpool", 3): nn.MaxPool3d,
                    ("avgpool", 2): nn.AvgPool2d, ("avgpool", 3): nn.AvgPool3d}[kind, d]
            layer = pool(o.kernel, o.stride, inner)
            return layer if pad is None else nn.Sequential(pad, layer)
        if kind == "add":
            return Add()
        if kind == "flatten":
            return nn.Flatten()
        if kind == "dropout":
            return nn.Dropout(o.p)
        if kind == "linear":
            return nn.Linear(math.prod(shape), o.out, bias=o.bias)
        if kind == "tanh":
            return nn.Tanh()
        if kind == "scale":
            return Scale(o.factor)
        raise ValueError(f"layer {spec.name}: kind {kind!r} has no PyTorch module here; add it "
                         f"to bench/gpu_step.py's torch_net")

    class TorchNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(module(k, s) for k, s in enumerate(net.layers))
            self.producers = [net.producers(k) for k in range(len(net.layers))]
            # the outputs free after each layer: those it is the last reader of
            self.frees: list[list[int]] = [[] for _ in net.layers]
            for p, readers in net.consumers.items():
                if p >= 0:
                    self.frees[readers[-1]].append(p)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            outs: dict[int, torch.Tensor] = {}
            for k, layer in enumerate(self.layers):
                outs[k] = layer(*(x if p < 0 else outs[p] for p in self.producers[k]))
                for p in self.frees[k]:
                    del outs[p]
            return outs[len(self.layers) - 1]

    return TorchNet()


def torch_step_fn(net: Any, precision: str, batch: int, device: str, layout: str):
    """A function running one PyTorch training step, and the module."""
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda" if device == "gpu" else "cpu")
    tf32 = precision != "fp32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(SEED)
    model = torch_net(net).to(dev).train()
    x = torch.randn(batch, *net.input_shape, device=dev)
    if layout == "channels-last":
        fmt = torch.channels_last if len(net.input_shape) == 3 else torch.channels_last_3d
        model = model.to(memory_format=fmt)
        x = x.contiguous(memory_format=fmt)
    if net.regression:
        y = torch.rand(batch, net.classes, device=dev) * 2 - 1
    else:
        y = torch.randint(0, net.classes, (batch,), device=dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM,
                                weight_decay=WEIGHT_DECAY)
    autocast = precision == "bf16"

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
        out = out.float()
        loss = F.mse_loss(out, y) if net.regression else F.cross_entropy(out, y)
        loss.backward()
        optimizer.step()

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    return step, sync, model


# -- hpctrain -----------------------------------------------------------------------------------

class FixedBatch:
    """One batch, made once, given for every step (the data source protocol)."""

    nonfinite = None

    def __init__(self, source: Any, batch: int, sample_shape: tuple[int, ...]) -> None:
        box = ((0, batch), *((0, n) for n in sample_shape))
        self._images = source.images(0, box)
        self._labels = source.labels(0, (0, batch))

    def images(self, step: int, box: Any) -> Any:
        return self._images

    def labels(self, step: int, samples: tuple[int, int]) -> Any:
        return self._labels


class HpctrainRun:
    """hpctrain's network, optimizer and data for one net, precision and batch, on one rank."""

    def __init__(self, net: Any, precision: str, batch: int, device: str) -> None:
        from mpi4py import MPI

        from hpctrain.comm.grid import GridSet
        from hpctrain.data.synthetic import SyntheticData
        from hpctrain.device.backend import make_backend
        from hpctrain.plan.plans import LayerPlan
        from hpctrain.run.network import Network
        from hpctrain.run.optimizer import SGD

        self.backend = make_backend(device, precision)
        self.grids = GridSet(MPI.COMM_SELF)
        plan = [LayerPlan("batch", (1, 1)) for _ in net.layers]
        self.network = Network(net, plan, batch, self.grids, self.backend, SEED)
        self.data = FixedBatch(SyntheticData.for_net(self.backend, net, batch, SEED), batch,
                               net.input_shape)
        self.optimizer = SGD(self.network.params, LR, MOMENTUM, WEIGHT_DECAY)
        self.step_number = 0

    def step(self, times: Any = None) -> None:
        self.network.train_step(self.data, self.step_number, times=times,
                                update=partial(self.optimizer.step, LR))
        self.step_number += 1

    def sync(self) -> None:
        self.backend.sync()

    def close(self) -> None:
        self.grids.__exit__(None, None, None)


def median_step(step, sync, steps: int, warmup: int) -> tuple[float, list[float]]:
    """The median seconds of ``steps`` steps after ``warmup``, each between two syncs."""
    for _ in range(warmup):
        step()
    sync()
    seconds = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        step()
        sync()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), seconds


def compare(name: str, precision: str, args: argparse.Namespace) -> dict:
    """hpctrain and PyTorch on ``name`` at ``precision``: both medians, one after the other."""
    from hpctrain.model.net import load_net

    case = NETS[name]
    size = args.image_size or (case.dry_size if args.dry_run else case.image_size)
    batch = args.batch or (case.dry_batch if args.dry_run else case.batch)
    net = load_net(name, size)
    result: dict[str, Any] = {"net": name, "precision": precision, "image_size": size,
                              "batch": batch, "steps": args.steps, "warmup": args.warmup}
    try:
        ours = HpctrainRun(net, precision, batch, args.device)
        try:
            result["hpctrain_seconds"], result["hpctrain_steps"] = median_step(
                ours.step, ours.sync, args.steps, args.warmup)
            result["hpctrain_peak_bytes"] = device_peak_bytes(args.device, "hpctrain")
            result["predicted_peak_bytes"] = predicted_peak_bytes(net, batch, precision,
                                                                  args.device)
        finally:
            ours.close()
        del ours
    except Exception as err:  # report and go on: the other runs still count
        result["hpctrain_error"] = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    free_device_memory(args.device)
    try:
        step, sync, model = torch_step_fn(net, precision, batch, args.device, args.torch_layout)
        result["torch_seconds"], result["torch_steps"] = median_step(step, sync, args.steps,
                                                                     args.warmup)
        result["torch_peak_bytes"] = device_peak_bytes(args.device, "torch")
        del step, model
    except Exception as err:
        result["torch_error"] = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    free_device_memory(args.device)
    if "hpctrain_seconds" in result and "torch_seconds" in result:
        result["ratio"] = result["hpctrain_seconds"] / result["torch_seconds"]
    return result


def device_peak_bytes(device: str, side: str) -> float | None:
    """The device memory one side's run held at its peak: CuPy's pool (which keeps freed
    blocks, so it holds its high-water mark; emptied before each run) or PyTorch's
    ``max_memory_allocated`` (reset before each run); None on the CPU."""
    if device != "gpu":
        return None
    if side == "hpctrain":
        import cupy

        return float(cupy.get_default_memory_pool().total_bytes())
    import torch

    return float(torch.cuda.max_memory_allocated())


def predicted_peak_bytes(net: Any, batch: int, precision: str, device: str) -> float:
    """hpctrain's memory model's peak per rank for the one-rank plan in ``precision``."""
    from hpctrain.device.precision import resolve_precision
    from hpctrain.plan.planner import plan_memory
    from hpctrain.plan.plans import LayerPlan

    plan = [LayerPlan("batch", (1, 1)) for _ in net.layers]
    return plan_memory(net, plan, batch, 1, resolve_precision(precision, device)).memory


def free_device_memory(device: str) -> None:
    """Give the pools' cached blocks back, so the next side starts with the memory free: the
    cuDNN graphs and workspace the last net built first (they would count in the next net's
    peak), then the pools."""
    import gc

    from hpctrain.kernels import cudnn_conv

    cudnn_conv.release_graphs()
    gc.collect()
    if device != "gpu":
        return
    try:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    except ImportError:
        pass
    try:
        import torch

        torch.cuda.empty_cache()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
    except ImportError:
        pass


def layer_table(name: str, precision: str, args: argparse.Namespace) -> dict:
    """hpctrain's forward and backward compute per layer (median over the timed steps), with
    a timing record: each layer between device events."""
    from hpctrain.model.net import load_net

    case = NETS[name]
    size = args.image_size or (case.dry_size if args.dry_run else case.image_size)
    batch = args.batch or (case.dry_batch if args.dry_run else case.batch)
    net = load_net(name, size)
    ours = HpctrainRun(net, precision, batch, args.device)
    try:
        for _ in range(max(1, args.warmup)):
            ours.step()
        records = []
        for _ in range(max(3, args.steps // 4)):
            times = ours.network.step_times()
            ours.step(times)
            records.append(times)
        ours.sync()
    finally:
        ours.close()
    rows = {}
    for k, spec in enumerate(net.layers):
        rows[spec.name] = {
            "kind": spec.kind,
            "forward_seconds": statistics.median(r.layers[k].forward_compute for r in records),
            "backward_seconds": statistics.median(r.layers[k].backward_compute for r in records)}
    return {"net": name, "precision": precision, "batch": batch, "image_size": size,
            "step_seconds": statistics.median(r.step for r in records), "layers": rows}


def print_row(r: dict) -> None:
    def ms(key: str) -> str:
        return f"{r[key] * 1e3:10.1f}" if key in r else f"{'failed':>10}"

    def rate(key: str) -> str:
        return f"{r['batch'] / r[key]:10.0f}" if key in r else f"{'-':>10}"

    ratio = f"{r['ratio']:7.2f}" if "ratio" in r else f"{'-':>7}"
    print(f"{r['net']:>10} {r['precision']:>5} {r['batch']:>5} {ms('hpctrain_seconds')} "
          f"{ms('torch_seconds')} {ratio} {rate('hpctrain_seconds')} {rate('torch_seconds')}",
          flush=True)
    if r.get("hpctrain_peak_bytes"):
        torch_peak = r.get("torch_peak_bytes")
        print(f"{'':>10} peak device memory: hpctrain {r['hpctrain_peak_bytes'] / 2**30:.2f} GiB "
              f"(predicted {r['predicted_peak_bytes'] / 2**30:.2f}), PyTorch "
              f"{torch_peak / 2**30 if torch_peak else float('nan'):.2f} GiB", flush=True)
    for side in ("hpctrain", "torch"):
        if f"{side}_error" in r:
            print(f"{'':>10} {side} failed: {r[side + '_error'][:300]}", flush=True)


def print_layers(table: dict, top: int) -> None:
    rows = sorted(table["layers"].items(), key=lambda kv: -(kv[1]["forward_seconds"]
                                                           + kv[1]["backward_seconds"]))
    total_f = sum(v["forward_seconds"] for v in table["layers"].values())
    total_b = sum(v["backward_seconds"] for v in table["layers"].values())
    by_kind: dict[str, list[float]] = {}
    for v in table["layers"].values():
        f_b = by_kind.setdefault(v["kind"], [0.0, 0.0])
        f_b[0] += v["forward_seconds"]
        f_b[1] += v["backward_seconds"]
    print(f"\nhpctrain per layer, {table['net']} {table['precision']} batch {table['batch']} "
          f"(timed step {table['step_seconds'] * 1e3:.1f} ms; layers forward "
          f"{total_f * 1e3:.1f} ms, backward {total_b * 1e3:.1f} ms)", flush=True)
    print(f"{'kind':>12} {'forward ms':>11} {'backward ms':>11}")
    for kind, (f, b) in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        print(f"{kind:>12} {f * 1e3:11.2f} {b * 1e3:11.2f}")
    print(f"{'layer':>28} {'kind':>10} {'forward ms':>11} {'backward ms':>11}")
    for layer, v in rows[:top]:
        print(f"{layer:>28} {v['kind']:>10} {v['forward_seconds'] * 1e3:11.2f} "
              f"{v['backward_seconds'] * 1e3:11.2f}")
    print(flush=True)


def versions(device: str) -> dict:
    found: dict[str, str] = {"python": sys.version.split()[0]}
    try:
        import torch

        found["torch"] = torch.__version__
        if device == "gpu" and torch.cuda.is_available():
            found["gpu"] = torch.cuda.get_device_name()
            found["torch_cudnn"] = str(torch.backends.cudnn.version())
    except ImportError:
        found["torch"] = "missing"
    if device == "gpu":
        try:
            import cupy

            found["cupy"] = cupy.__version__
        except ImportError:
            found["cupy"] = "missing"
    from hpctrain.kernels import cudnn_conv

    found["hpctrain_cudnn_conv"] = cudnn_conv.unavailable() or "cuDNN graphs"
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", choices=sorted(NETS),
                        default=["resnet50", "alexnet", "cosmoflow"])
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--steps", type=int, default=20, help="timed steps (default: 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default: 5)")
    parser.add_argument("--batch", type=int, help="every net's batch (default: each net's own)")
    parser.add_argument("--image-size", type=int, help="every net's size (default: its own)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--dry-run", action="store_true",
                        help="each net at its smallest size and a batch of 1-2, 2 steps: checks "
                        "the harness, measures nothing")
    parser.add_argument("--torch-layout", choices=("channels-last", "nchw"),
                        default="channels-last", help="PyTorch's memory format (default: "
                        "channels-last)")
    parser.add_argument("--layers", default="resnet50:bf16",
                        help="NET:PRECISION of hpctrain's per-layer table, or 'none' "
                        "(default: resnet50:bf16)")
    parser.add_argument("--top", type=int, default=15, help="slowest layers listed (default: 15)")
    parser.add_argument("--out", default="runs/bench/gpu_step.json", help="JSON file")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.steps, args.warmup = min(args.steps, 2), min(args.warmup, 1)
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps {args.steps} must be at least 1 and --warmup {args.warmup} "
                     "at least 0")
    if args.layers != "none":
        net, _, precision = args.layers.partition(":")
        if net not in NETS or precision not in PRECISIONS:
            parser.error(f"--layers {args.layers!r}: give NET:PRECISION with NET one of "
                         f"{', '.join(NETS)} and PRECISION one of {', '.join(PRECISIONS)}, "
                         "or none")
    return args


def layers(record: dict, args: argparse.Namespace) -> None:
    """hpctrain's per-layer table of ``--layers`` into ``record``, printed."""
    if args.layers == "none":
        return
    name, _, precision = args.layers.partition(":")
    try:
        record["layers"] = layer_table(name, precision, args)
        print_layers(record["layers"], args.top)
    except Exception as err:
        record["layers"] = {"error": f"{type(err).__name__}: {err}"}
        traceback.print_exc()
    free_device_memory(args.device)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"versions": versions(args.device), "device": args.device,
                              "torch_layout": args.torch_layout, "lr": LR, "momentum": MOMENTUM,
                              "weight_decay": WEIGHT_DECAY, "runs": [], "layers": None}
    print(" ".join(f"{k}={v}" for k, v in record["versions"].items()), flush=True)

    def save() -> None:
        partial_out = out.with_suffix(".json.part")
        partial_out.write_text(json.dumps(record, indent=1))
        partial_out.replace(out)

    print(f"{'net':>10} {'prec':>5} {'batch':>5} {'hpctrain ms':>10} {'torch ms':>10} "
          f"{'ratio':>7} {'ours im/s':>10} {'torch im/s':>10}", flush=True)
    runs = ordered_runs(args.nets, args.precisions)
    first = [r for r in runs if r in FIRST]
    for k, (name, precision) in enumerate(runs):
        r = compare(name, precision, args)
        record["runs"].append(r)
        print_row(r)
        save()
        if args.layers != "none" and (k == len(first) - 1 or not first and k == 0):
            layers(record, args)  # the per-layer table next
            save()
            print(f"{'net':>10} {'prec':>5} {'batch':>5} {'hpctrain ms':>10} {'torch ms':>10} "
                  f"{'ratio':>7} {'ours im/s':>10} {'torch im/s':>10}", flush=True)
    if not runs:
        layers(record, args)
        save()
    print("ratio: hpctrain ms / PyTorch ms (> 1: hpctrain slower); im/s: images (volumes) "
          "per second", flush=True)
    print(f"written: {out}", flush=True)


if __name__ == "__main__":
    main()
