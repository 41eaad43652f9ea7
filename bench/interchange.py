"""Models in and out, measured: torchvision's models through ONNX, predicted on P ranks under
``--grid auto`` against onnxruntime; an imported ResNet-50 against the shipped ``resnet50``,
planned and stepped side by side; and ``predict`` throughput against onnxruntime on one process.

1. **Agreement.** Every torchvision classifier today's kinds express, with seeded random
   weights and batch-norm statistics far from 0 and 1, exported as the docs say
   (``TrainingMode.PRESERVE``, no constant folding) at a small image (64²; Inception-v3 75²;
   AlexNet and VGG-16 at 224², where their adaptive pools are exportable): ``predict`` on
   ``--procs`` ranks under ``--grid auto`` against onnxruntime on the same file, the largest
   relative error of the outputs.
2. **ResNet-50 imported against shipped.** ``plan`` of both (the plan files' mode and grid
   columns compared line by line) on this machine's ``--procs`` and on dgx-h100 at 4096 ranks,
   and a training step of both under the same plan, launched alternately ``--rounds`` times:
   the median step of each and their ratio.
3. **Throughput.** ``predict`` on one process, one thread, against an onnxruntime session of
   one intra-op thread on the same file, batch and samples: samples/s of each and the ratio.

Writes the tables to ``--out`` (JSON) and beside it (``.txt``)::

    python bench/interchange.py --procs 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import h5py
import numpy as np

PY = sys.executable
MPIEXEC = str(Path(PY).parent / "mpiexec") if (Path(PY).parent / "mpiexec").exists() \
    else "mpiexec"
MODELS = {"alexnet": 224, "vgg16": 224, "resnet18": 64, "resnet50": 64,
          "wide_resnet50_2": 64, "densenet121": 64, "googlenet": 64, "inception_v3": 75,
          "squeezenet1_0": 64,
          # depthwise, grouped and dilated convolutions, gates, layer norm, per-pixel outputs
          "mobilenet_v2": 64, "mobilenet_v3_small": 64, "mobilenet_v3_large": 64,
          "efficientnet_b0": 64, "mnasnet0_5": 64, "resnext50_32x4d": 64,
          "regnet_x_400mf": 64, "regnet_y_400mf": 64, "convnext_tiny": 64,
          "fcn_resnet50": 64, "deeplabv3_resnet50": 64}
SEGMENTATION = ("fcn_resnet50", "deeplabv3_resnet50")  # torchvision.models.segmentation's
TORCHVISION_OPTIONS = {"googlenet": {"aux_logits": False, "init_weights": False},
                       "inception_v3": {"aux_logits": False, "init_weights": False}}


def hpctrain(*args: str, procs: int = 1, cwd: Path) -> str:
    """``python -m hpctrain ARGS`` on ``procs`` ranks, one thread each; its output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "HPCTRAIN_CACHE_DIR": str(cwd / "cache")}
    command = [MPIEXEC, "-n", str(procs), PY, "-m", "hpctrain", *args]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
    if result.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed:\n{result.stdout[-3000:]}"
                 f"{result.stderr[-3000:]}")
    return result.stdout


def exported(name: str, size: int, folder: Path, classes: int = 10) -> Path:
    """torchvision's ``name`` with seeded weights and statistics, as ONNX at ``size``²."""
    import torch
    import torchvision

    torch.manual_seed(0)
    if name in SEGMENTATION:  # its dict output, {"out": …}, as one tensor of scores per pixel
        inner = getattr(torchvision.models.segmentation, name)(
            num_classes=classes, weights=None, weights_backbone=None)

        class Scores(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = inner

            def forward(self, x):
                return self.model(x)["out"]

        model = Scores()
    else:
        model = getattr(torchvision.models, name)(num_classes=classes,
                                                  **TORCHVISION_OPTIONS.get(name, {}))
    generator = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            n = module.num_features
            module.running_mean.copy_(torch.randn(n, generator=generator) * 0.2)
            module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
    path = folder / f"{name}.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (torch.randn(2, 3, size, size),), str(path),
                          opset_version=17, dynamo=False, input_names=["input"],
                          output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                          training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)
    return path


def onnxruntime_outputs(path: Path, x: np.ndarray, batch: int) -> tuple[np.ndarray, float]:
    """onnxruntime's outputs for ``x`` in batches of ``batch``, one intra-op thread, and the
    seconds the batches took after one warm-up batch."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options,
                                           providers=["CPUExecutionProvider"])
    session.run(None, {"input": x[:batch]})
    start = time.perf_counter()
    found = [session.run(None, {"input": x[k:k + batch]})[0] for k in range(0, len(x), batch)]
    return np.concatenate(found), time.perf_counter() - start


def agreement(folder: Path, procs: int, samples: int, names: list[str]) -> list[dict]:
    rows = []
    for name in names:
        size = MODELS[name]
        path = exported(name, size, folder)
        x = np.random.default_rng(2).standard_normal((samples, 3, size, size)).astype(
            np.float32)
        np.save(folder / "x.npy", x)
        out = folder / f"{name}.h5"
        hpctrain("predict", "--net", str(path), "--data", "x.npy", "--out", str(out),
                 "--batch", str(min(samples, 4)), "--grid", "auto", procs=procs, cwd=folder)
        with h5py.File(out) as h5:
            got = h5["outputs"][...]
            plan = h5.attrs["plan"]
        want, _ = onnxruntime_outputs(path, x, min(samples, 4))
        error = float(np.abs(got - want).max() / np.abs(want).max())
        modes = sorted({line.split()[1] for line in plan.splitlines() if line.split()[1:2]
                        and line.split()[1] != "follow"})
        rows.append({"model": name, "image": size, "procs": procs, "error": error,
                     "modes": modes})
        print(f"{name:16s} {size:4d}²  {procs} ranks  largest relative error {error:.2e}  "
              f"modes {', '.join(modes)}", flush=True)
        path.unlink()
    return rows


def plan_columns(path: Path) -> list[list[str]]:
    return [line.split()[1:] for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def resnet50_side_by_side(folder: Path, procs: int, rounds: int, steps: int) -> dict:
    onnx_path = exported("resnet50", 64, folder, classes=1000)
    nets = {"imported": str(onnx_path), "shipped": "resnet50"}
    same = {}
    for where, extra in (("this machine", ["--procs", str(procs), "--batch", "16",
                                            "--image-size", "64"]),
                         ("dgx-h100 4096", ["--procs", "4096", "--batch", "2048",
                                            "--image-size", "224", "--machine", "dgx-h100"])):
        plans = {}
        for label, net in nets.items():
            out = folder / f"{label}.plan"
            hpctrain("plan", "--net", net, *extra, "--out", str(out), cwd=folder)
            plans[label] = plan_columns(out)
        same[where] = plans["imported"] == plans["shipped"]
        print(f"resnet50 plans, {where}: {'identical' if same[where] else 'DIFFERENT'}",
              flush=True)
    steps_ms: dict[str, list[float]] = {label: [] for label in nets}
    for _ in range(rounds):
        for label, net in nets.items():
            log = folder / f"{label}-step.h5"
            log.unlink(missing_ok=True)
            hpctrain("--net", net, "--image-size", "64", "--batch", "16", "--steps",
                     str(steps), "--grid", f"1x{procs}", "--log", str(log), procs=procs,
                     cwd=folder)
            with h5py.File(log) as h5:
                times = h5["steps/seconds"][1:]  # the first step warms up
            steps_ms[label].append(float(np.median(times)) * 1e3)
    medians = {label: statistics.median(v) for label, v in steps_ms.items()}
    ratio = medians["imported"] / medians["shipped"]
    print(f"resnet50 step, 64², batch 16, 1x{procs}: imported {medians['imported']:.1f} ms, "
          f"shipped {medians['shipped']:.1f} ms, ratio {ratio:.3f} (rounds "
          f"{steps_ms})", flush=True)
    onnx_path.unlink()
    return {"plans_identical": same, "step_ms": steps_ms, "median_ms": medians,
            "ratio": ratio}


def throughput(folder: Path, samples: int, batch: int) -> list[dict]:
    rows = []
    for name, size in (("resnet50", 64), ("resnet18", 112)):
        path = exported(name, size, folder)
        x = np.random.default_rng(3).standard_normal((samples, 3, size, size)).astype(
            np.float32)
        np.save(folder / "x.npy", x)
        out = folder / f"{name}-throughput.h5"
        out.unlink(missing_ok=True)
        hpctrain("predict", "--net", str(path), "--data", "x.npy", "--out", str(out),
                 "--batch", str(batch), "--threads", "1", procs=1, cwd=folder)
        with h5py.File(out) as h5:
            ours = samples / float(h5.attrs["seconds"])
        _, seconds = onnxruntime_outputs(path, x, batch)
        theirs = samples / seconds
        rows.append({"model": name, "image": size, "batch": batch, "samples": samples,
                     "hpctrain_per_s": ours, "onnxruntime_per_s": theirs,
                     "ratio": ours / theirs})
        print(f"predict {name} {size}², batch {batch}, one process, one thread: hpctrain "
              f"{ours:.1f}/s, onnxruntime {theirs:.1f}/s, ratio {ours / theirs:.2f}",
              flush=True)
        path.unlink()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--throughput-samples", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--only", choices=("agreement", "resnet50", "throughput"),
                        default=None)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS),
                        help="the models of the agreement (default: all)")
    parser.add_argument("--out", default="runs/bench/interchange.json")
    args = parser.parse_args()
    result = {}
    with tempfile.TemporaryDirectory(prefix="hpctrain-interchange-") as tmp:
        folder = Path(tmp)
        if args.only in (None, "agreement"):
            result["agreement"] = agreement(folder, args.procs, args.samples, args.models)
        if args.only in (None, "resnet50"):
            result["resnet50"] = resnet50_side_by_side(folder, args.procs, args.rounds,
                                                       args.steps)
        if args.only in (None, "throughput"):
            result["throughput"] = throughput(folder, args.throughput_samples, args.batch)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"written to {out}", flush=True)


if __name__ == "__main__":
    main()
