"""Does hpctrain learn as PyTorch does? Held-out accuracy of the same recipe on both, over seeds.

A folder of photographs of three shapes (circle, square, triangle: ``tests/shapes_folder.py``,
JPEG and PNG of random sizes, colours and positions, ``--per-class`` of each) is drawn once and
converted with ``python -m hpctrain convert --image-folder … --size 24 --val-fraction 0.25``, as
docs/data.md says users do: uint8 pixels, normalised per channel by the training split's mean
and std. Then, for each seed, the same recipe is trained twice:

- hpctrain: ``mpiexec -n 2 python -m hpctrain train`` on that dataset (pure batch unless
  ``--grid`` says otherwise), held-out accuracy at the end read from its run log
  (``/validation/accuracy``);
- PyTorch, in this process: the same net as a ``torch.nn.Module``, starting from the same
  weights (those hpctrain starts from with that seed, built by hpctrain's ``Network`` on one
  process: the same on every grid), reading the same pixels normalised the same way, trained
  with ``torch.optim.SGD`` set to hpctrain's update (docs/running.md, "The update": momentum,
  weight decay on every parameter, no dampening, no Nesterov) on epochs of ⌊N / batch⌋ batches.

The net: conv 3→8 (3×3, pad 1), ReLU, 2×2 max-pool, conv 8→16, ReLU, 2×2 max-pool, one linear
layer to the 3 classes; softmax cross-entropy, mean over the batch. Float32, one thread per
process (``OMP_NUM_THREADS=1``). The recipe: 30 epochs, batch 16, SGD with lr 0.01 (constant),
momentum 0.9, weight decay 5e-4, horizontal flips (``--augment``).

Only the initial weights are shared: each side draws its own epoch order and its own flips (and
crops) from the seed, as a user of either would, so a seed's two accuracies differ by the noise
of training. The comparison is statistical: per side the mean over seeds and its standard error,
and the gap (hpctrain − PyTorch), paired by seed, with its standard error. A gap within about
two standard errors of 0 says that no difference in learning shows at this many seeds.
``--same-order`` makes PyTorch read hpctrain's epoch order instead (docs/data.md); with
``--augment none`` the two sides then differ only by float32 rounding, which checks that the
recipe is the same rather than that it learns alike.

    python bench/learning.py                       # 16 seeds; make learning runs this
    python bench/learning.py --seeds 32 --augment standard --epochs 40 --per-class 400

With the defaults (600 images, 30 epochs of 28 steps) a seed took 37-68 s on a 2-core
machine while other work shared it (hpctrain on 2 ranks 32-59 s, most of it the
840 steps and the start-up; PyTorch 5-10 s), 14.4 minutes in all. Needs PyTorch (the ``bench``
extra) and Pillow (the ``images`` extra).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

HERE = Path(__file__).resolve().parent
PY = sys.executable
MPIEXEC = str(Path(PY).parent / "mpiexec") if (Path(PY).parent / "mpiexec").exists() \
    else "mpiexec"
SHAPES = ("circle", "square", "triangle")
AUGMENTS = ("none", "flip", "crop", "standard")
PAD = 4  # the crop's zero padding, after normalisation (docs/data.md)
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def net_text(size: int, classes: int) -> str:
    """The compared net as an hpctrain .net file; its layers are named conv1, conv2, linear1."""
    return "\n".join([
        "# two conv blocks and a linear classifier: bench/learning.py",
        f"input channels=3 size={size} classes={classes}",
        "conv out=8 kernel=3 pad=1", "relu", "maxpool kernel=2",
        "conv out=16 kernel=3 pad=1", "relu", "maxpool kernel=2",
        "flatten", f"linear out={classes}", ""])


def torch_net(size: int, classes: int):
    """The same net in PyTorch, its parameters named as hpctrain names them (``conv1.weight``
    (out, in, kh, kw), ``linear1.weight`` (out, in); flatten is channel-major in both)."""
    import torch.nn.functional as F
    from torch import nn

    class TwoConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
            self.linear1 = nn.Linear(16 * (size // 4) ** 2, classes)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            return self.linear1(x.flatten(1))

    return TwoConv()


def run(command: list[str]) -> str:
    """Run ``command`` with one thread per process; its stdout, or exit naming what failed."""
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, **ONE_THREAD})
    if result.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed with status {result.returncode}:\n"
                 f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result.stdout


def make_dataset(work: Path, args: argparse.Namespace) -> Path:
    """The image folder, drawn from ``--data-seed``, converted by hpctrain's ``convert``."""
    sys.path.insert(0, str(HERE.parent))
    from tests.shapes_folder import make_folder

    folder = make_folder(work / "shapes", args.per_class, args.data_seed, SHAPES)
    data = work / "shapes.h5"
    run([PY, "-m", "hpctrain", "convert", "--image-folder", str(folder), "--size",
         str(args.size), "--val-fraction", str(args.val_fraction), "--seed", str(args.data_seed),
         "--out", str(data)])
    return data


@dataclass
class Dataset:
    """The converted pixels, normalised as hpctrain's reader does: (x − mean[c]) / std[c] in
    float32."""

    images: np.ndarray  # (N, 3, S, S) float32
    labels: np.ndarray  # (N,) int64
    val_images: np.ndarray
    val_labels: np.ndarray

    @classmethod
    def read(cls, path: Path) -> Dataset:
        with h5py.File(path, "r") as h5:
            mean = np.asarray(h5.attrs["mean"], np.float32)[:, None, None]
            std = np.asarray(h5.attrs["std"], np.float32)[:, None, None]

            def normalised(name: str) -> np.ndarray:
                return ((h5[name][...].astype(np.float32) - mean) / std).astype(np.float32)

            return cls(normalised("train/images"), h5["train/labels"][...].astype(np.int64),
                       normalised("val/images"), h5["val/labels"][...].astype(np.int64))


def initial_weights(net_path: Path, size: int, batch: int, seed: int) -> dict[str, np.ndarray]:
    """The float32 parameters a ``train --seed SEED`` run of the net starts from, built as
    hpctrain builds them (one process; the values are the same on every grid and P)."""
    from mpi4py import MPI

    from hpctrain.comm.grid import GridSet
    from hpctrain.device.backend import make_backend
    from hpctrain.model.net import load_net
    from hpctrain.plan.plans import LayerPlan
    from hpctrain.run.network import Network

    net = load_net(str(net_path), size)
    plan = [LayerPlan("batch", (1, 1)) if layer.kind in ("conv", "linear")
            else LayerPlan("follow") for layer in net.layers]
    with GridSet(MPI.COMM_SELF) as grids:
        network = Network(net, plan, batch, grids, make_backend("cpu", "fp32", MPI.COMM_SELF),
                          seed)
        return {p.name: np.array(p.value, np.float32) for p in network.params}


def train_hpctrain(net_path: Path, data: Path, log: Path, seed: int, steps: int,
                   args: argparse.Namespace) -> float:
    """hpctrain's held-out accuracy (a fraction) after ``steps`` steps, from its run log."""
    grid = [] if args.grid is None else ["--grid", args.grid]
    return held_out_after(args.procs, [
        "--net", str(net_path), "--data", str(data), *grid, "--batch", str(args.batch),
        "--epochs", str(args.epochs), "--lr", str(args.lr), "--momentum", str(args.momentum),
        "--weight-decay", str(args.weight_decay), "--augment", args.augment, "--seed",
        str(seed)], log, steps)


def held_out_after(procs: int, flags: list[str], log: Path, steps: int) -> float:
    """The held-out accuracy (a fraction) of ``train`` with ``flags`` on ``procs`` ranks, one
    thread each, evaluated after its last step ``steps`` alone, from its run log at ``log``."""
    run([MPIEXEC, "-n", str(procs), PY, "-m", "hpctrain", "train", *flags,
         "--threads", "1", "--eval-every", str(steps), "--print-every", str(steps),
         # the plan is given; flops instead of timing kernels keeps the start-up short
         "--compute", "flops", "--machine", "default", "--log", str(log)])
    with h5py.File(log, "r") as h5:
        evaluated, accuracy = h5["validation/step"][...], h5["validation/accuracy"][...]
    if len(evaluated) == 0 or int(evaluated[-1]) != steps:
        sys.exit(f"bench: {log} has held-out evaluations after steps {evaluated.tolist()}, "
                 f"not after step {steps}")
    return float(accuracy[-1])


def augment(x, generator, mode: str):
    """A batch (B, C, S, S) of normalised images under ``mode``, drawn from ``generator``: a
    window of the image zero-padded by PAD (``crop``), reversed along its width with
    probability 1/2 (``flip``), or both (``standard``)."""
    import torch
    import torch.nn.functional as F

    n, _, h, w = x.shape
    if mode in ("crop", "standard"):
        padded = F.pad(x, (PAD, PAD, PAD, PAD))
        offsets = torch.randint(0, 2 * PAD + 1, (n, 2), generator=generator).tolist()
        x = torch.stack([padded[k, :, dy:dy + h, dx:dx + w]
                         for k, (dy, dx) in enumerate(offsets)])
    if mode in ("flip", "standard"):
        flipped = torch.rand(n, generator=generator) < 0.5
        x = torch.where(flipped[:, None, None, None], x.flip(3), x)
    return x


def train_torch(data: Dataset, initial: dict[str, np.ndarray], seed: int,
                args: argparse.Namespace) -> float:
    """PyTorch's held-out accuracy (a fraction): the same net from ``initial``, epochs of
    ⌊N / batch⌋ batches of a permutation drawn from ``seed`` (hpctrain's with
    ``--same-order``; the last N mod batch samples not read that epoch, as in hpctrain), the
    same update."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    model = torch_net(args.size, len(SHAPES))
    theirs = dict(model.named_parameters())
    if set(theirs) != set(initial) or any(tuple(theirs[k].shape) != initial[k].shape
                                          for k in initial):
        sys.exit(f"bench: hpctrain's parameters {sorted(initial)} do not match PyTorch's "
                 f"{sorted(theirs)}")
    with torch.no_grad():
        for name, value in initial.items():
            theirs[name].copy_(torch.from_numpy(value))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                dampening=0.0, weight_decay=args.weight_decay, nesterov=False)
    images, labels = torch.from_numpy(data.images), torch.from_numpy(data.labels)
    per_epoch = len(images) // args.batch
    model.train()
    for epoch in range(args.epochs):
        if args.same_order:  # hpctrain's epoch order (docs/data.md)
            order = torch.from_numpy(np.random.default_rng([seed, epoch]).permutation(
                len(images)))
        else:
            order = torch.randperm(len(images), generator=generator)
        for k in range(per_epoch):
            batch = order[k * args.batch:(k + 1) * args.batch]
            optimizer.zero_grad(set_to_none=True)
            logits = model(augment(images[batch], generator, args.augment))
            F.cross_entropy(logits, labels[batch]).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(data.val_images)).argmax(1)
    return float((predicted == torch.from_numpy(data.val_labels)).double().mean())


def mean_and_error(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (sample standard deviation / √n)."""
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def table(hpctrain: list[float], torch: list[float]) -> list[str]:
    """Per side and for the gap (paired by seed): mean, standard error, min and max, in %."""
    gaps = [a - b for a, b in zip(hpctrain, torch, strict=True)]
    lines = [f"{'':10} {'mean %':>8} {'std err':>8} {'min %':>8} {'max %':>8}"]
    for name, values, sign in (("hpctrain", hpctrain, ""), ("PyTorch", torch, ""),
                               ("gap", gaps, "+")):
        mean, error = mean_and_error(values)
        lines.append(f"{name:10} {100 * mean:{sign}8.2f} {100 * error:8.2f} "
                     f"{100 * min(values):{sign}8.2f} {100 * max(values):{sign}8.2f}")
    mean, error = mean_and_error(gaps)
    lines.append(f"gap = hpctrain - PyTorch, paired by seed: {100 * mean:+.2f} ± "
                 f"{100 * error:.2f} points ({abs(mean) / error:.1f} standard errors from 0)"
                 if error > 0 else f"gap = hpctrain - PyTorch: {100 * mean:+.2f} points, "
                 "the same on every seed")
    return lines


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def add_shared_options(parser: argparse.ArgumentParser, seeds: int, per_class: int,
                       first_seed: int = 0, first_seed_why: str = "") -> None:
    """The options of the shapes benches (this one and ``bench/large_batch.py``): seeds, the
    image folder and its split, epochs, the update's momentum and decay, augmentation, ranks
    and the working directory."""
    parser.add_argument("--seeds", type=positive, default=seeds,
                        help=f"training seeds, at least 2 (default: {seeds})")
    parser.add_argument("--first-seed", type=int, default=first_seed,
                        help=f"the first seed; the others follow it (default: {first_seed}"
                             f"{first_seed_why})")
    parser.add_argument("--epochs", type=positive, default=30, help="(default: 30)")
    parser.add_argument("--per-class", type=positive, default=per_class,
                        help=f"images of each of the 3 shapes (default: {per_class})")
    parser.add_argument("--size", type=positive, default=24,
                        help="the side of the converted images and of the net's input, a "
                             "multiple of 4 (default: 24)")
    parser.add_argument("--val-fraction", type=float, default=0.25,
                        help="share of the images held out (default: 0.25)")
    parser.add_argument("--data-seed", type=int, default=0,
                        help="seed of the image folder and of the held-out split (default: 0)")
    parser.add_argument("--momentum", type=float, default=0.9, help="(default: 0.9)")
    parser.add_argument("--weight-decay", type=float, default=5e-4, help="(default: 5e-4)")
    parser.add_argument("--augment", choices=AUGMENTS, default="flip",
                        help="as hpctrain's --augment, docs/data.md (default: flip)")
    parser.add_argument("--procs", type=positive, default=2,
                        help="hpctrain's ranks (default: 2)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="a new directory to keep the images, dataset, net and run logs in "
                             "(default: a temporary one, removed at the end)")


def check_shared_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse the values of :func:`add_shared_options` the benches cannot use."""
    if args.seeds < 2:
        parser.error(f"--seeds {args.seeds}: a standard error needs at least 2")
    if args.size % 4:
        parser.error(f"--size {args.size} must be a multiple of 4 (two 2x2 max-pools)")
    if not 0 < args.val_fraction < 1:
        parser.error(f"--val-fraction {args.val_fraction} must be in (0, 1)")
    if args.workdir is not None and args.workdir.exists():
        parser.error(f"--workdir {args.workdir} exists; give a new directory")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shared_options(parser, seeds=16, per_class=200)
    parser.add_argument("--batch", type=positive, default=16, help="(default: 16)")
    parser.add_argument("--lr", type=float, default=0.01, help="constant (default: 0.01)")
    parser.add_argument("--same-order", action="store_true",
                        help="PyTorch reads hpctrain's epoch order, not its own")
    parser.add_argument("--grid", default=None,
                        help="hpctrain's --grid (default: its own, pure batch)")
    args = parser.parse_args(argv)
    check_shared_options(parser, args)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    os.environ.update(ONE_THREAD)  # before PyTorch starts its thread pool
    import torch

    torch.set_num_threads(1)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hpctrain-learning-") as temporary:
        work = args.workdir or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        data_path = make_dataset(work, args)
        data = Dataset.read(data_path)
        net_path = work / "twoconv.net"
        net_path.write_text(net_text(args.size, len(SHAPES)))
        steps = args.epochs * (len(data.images) // args.batch)
        print(f"{len(data.images)} training / {len(data.val_images)} held-out images of "
              f"{len(SHAPES)} shapes at {args.size}x{args.size}; {args.epochs} epochs of "
              f"{steps // args.epochs} steps, batch {args.batch}, lr {args.lr}, momentum "
              f"{args.momentum}, weight decay {args.weight_decay}, augment {args.augment}; "
              f"hpctrain on {args.procs} ranks", flush=True)
        ours, theirs = [], []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            start = time.perf_counter()
            ours.append(train_hpctrain(net_path, data_path, work / f"seed-{seed}.h5", seed,
                                       steps, args))
            initial = initial_weights(net_path, args.size, args.batch, seed)
            middle = time.perf_counter()
            theirs.append(train_torch(data, initial, seed, args))
            print(f"seed {seed:3d}: hpctrain {100 * ours[-1]:6.2f} % ({middle - start:4.1f} s)"
                  f"  PyTorch {100 * theirs[-1]:6.2f} % ({time.perf_counter() - middle:4.1f} s)",
                  flush=True)
    print(f"\nheld-out accuracy after {args.epochs} epochs over {args.seeds} seeds "
          f"({args.first_seed}..{args.first_seed + args.seeds - 1})")
    print("\n".join(table(ours, theirs)))
    print(f"wall time {(time.perf_counter() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
