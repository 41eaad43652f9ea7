"""hpctrain's training step against PyTorch's on one thread, step for step, by CPU time as well
as wall time: a comparison that a shared machine disturbs less.

bench/throughput.py runs each side on its own, one after the other, and times steps by the wall
clock: on a machine whose other jobs come and go, a burst spoils one side and not the other.
Here each side runs in a process of its own (P = 1, one thread), and the two step in turn, one
step of hpctrain, then one of PyTorch, each waiting while the other steps: a burst falls on
both, and each step is also timed by its process's CPU time, which counts only what the step
itself ran. (Contention still costs CPU time: another job's traffic through the caches and the
memory slows both sides' kernels, not always alike.)

A process of its own for each side, because each side's malloc is its own: hpctrain keeps freed
memory for reuse (:func:`hpctrain.device.allocator.keep_freed_memory`, as a ``python -m
hpctrain`` run does), PyTorch's process runs glibc's malloc as it is, which hands a block of 32
MiB or more back to the system when it is freed, and maps fresh pages for it the next step. In
one process the two would share hpctrain's setting, which spares PyTorch those pages: AlexNet's
PyTorch step (127², batch 16; its fully connected layers' gradients and weight-decay terms are
16–67 MB each) took 376 ms of CPU time beside hpctrain in one process and 569 ms alone.
``--torch-keeps-freed-memory`` gives PyTorch's process hpctrain's setting too, for the
comparison at equal malloc.

The sides are those of bench/throughput.py: hpctrain's shipped net on one rank (its whole-batch
plan, the step the training loop runs: forward, loss, backward, each layer updated by SGD as its
gradient is ready), and bench/ddp_reference.py's PyTorch model with torch.optim.SGD, the same
rate, momentum and weight decay, float32. The data are drawn outside the timed step on both
sides: PyTorch's batch once before the steps, and hpctrain's batch before each step's clocks
start (the synthetic draw, read by the step as it would read the source). Prints one line per
net, medians over the steps after the warm-up.

    python bench/side_by_side.py --net resnet18 --image-size 32 --batch 16
    python bench/side_by_side.py --net resnet50 --image-size 64 --batch 8 --steps 12
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4  # as bench/throughput.py's
SIDES = ("hpctrain", "torch")


class Drawn:
    """A data source whose batch is drawn before the step that reads it: ``draw`` draws batch
    ``step`` (this rank's blocks), which ``images`` and ``labels`` then hand over; anything
    else is the source's own (``nonfinite``...)."""

    def __init__(self, source: object) -> None:
        self.source, self.batch = source, None

    def draw(self, step: int, input_box: object, labels_box: object) -> None:
        self.batch = (step, self.source.images(step, input_box),
                      self.source.labels(step, labels_box))

    def images(self, step: int, box: object) -> object:
        assert self.batch is not None and self.batch[0] == step, "draw the batch first"
        return self.batch[1]

    def labels(self, step: int, box: object) -> object:
        assert self.batch is not None and self.batch[0] == step, "draw the batch first"
        return self.batch[2]

    def __getattr__(self, name: str) -> object:
        return getattr(self.source, name)


def ours(args: argparse.Namespace) -> Callable[[int], tuple[float, float]]:
    """hpctrain's step on one rank, freed memory kept: (CPU, wall) seconds of step ``step``."""
    import numpy as np
    from mpi4py import MPI
    from threadpoolctl import threadpool_limits

    from hpctrain.comm.grid import GridSet
    from hpctrain.data.synthetic import SyntheticData
    from hpctrain.device.allocator import keep_freed_memory
    from hpctrain.device.backend import Backend
    from hpctrain.model.net import load_net
    from hpctrain.plan.plans import LayerPlan
    from hpctrain.run.network import Network
    from hpctrain.run.optimizer import SGD

    keep_freed_memory()
    limits = threadpool_limits(1)  # the limit holds while the object lives
    grids = GridSet(MPI.COMM_SELF)  # held until the process ends
    net = load_net(args.net, args.image_size)
    backend = Backend(np, np.float32)
    network = Network(net, [LayerPlan("batch", (1, 1))] * len(net.layers), args.batch, grids,
                      backend)
    optimizer = SGD(network.params, LR, MOMENTUM, WEIGHT_DECAY)
    drawn = Drawn(SyntheticData.for_net(backend, net, args.batch))

    def step(step: int) -> tuple[float, float]:
        drawn.draw(step, network.input_box, network.labels_box)  # before the clocks start
        cpu, wall = time.process_time(), time.perf_counter()
        network.train_step(drawn, step, update=partial(optimizer.step, LR))
        return time.process_time() - cpu, time.perf_counter() - wall

    step.limits = limits  # kept as long as the step
    return step


def theirs(args: argparse.Namespace) -> Callable[[int], tuple[float, float]]:
    """PyTorch's step on one thread: (CPU, wall) seconds of a step."""
    import torch

    sys.path.insert(0, str(HERE))
    import ddp_reference

    if args.torch_keeps_freed_memory:
        from hpctrain.device.allocator import keep_freed_memory

        keep_freed_memory()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ddp_reference.build(args.net, args.image_size).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM,
                                weight_decay=WEIGHT_DECAY)
    x, y, loss = ddp_reference.batch_of(args.net, args.batch, args.image_size)

    def step(step: int) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        optimizer.zero_grad()
        loss(model(x), y).backward()
        optimizer.step()
        return time.process_time() - cpu, time.perf_counter() - wall

    return step


def serve(side: str, args: argparse.Namespace, conn: object) -> None:
    """A side's process: build the side, say "ready", then run each step it is sent and send
    back its (CPU, wall) seconds, until it is sent None. An error goes back as its traceback."""
    try:
        step = (ours if side == "hpctrain" else theirs)(args)
        conn.send("ready")
        while (number := conn.recv()) is not None:
            conn.send(step(number))
    except Exception:
        conn.send(traceback.format_exc())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="resnet18", help="a net of bench/ddp_reference.py "
                        "(default: resnet18)")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each side, after "
                        "the warm-up (default: 10)")
    parser.add_argument("--warmup", type=int, default=2, help="steps of each side not timed "
                        "(default: 2)")
    parser.add_argument("--torch-keeps-freed-memory", action="store_true",
                        help="give PyTorch's process hpctrain's malloc setting (default: "
                        "glibc's malloc as it is, as PyTorch runs)")
    parser.add_argument("--out", help="also write the result here (JSON)")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import ddp_reference

    if args.net not in ddp_reference.NETS:
        parser.error(f"--net {args.net}: one of {', '.join(ddp_reference.NETS)}")
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the sides' processes
    spawn = multiprocessing.get_context("spawn")  # fresh processes: nothing of this one's malloc
    ends, processes = {}, []
    for side in SIDES:
        ends[side], theirs_end = spawn.Pipe()
        # daemons: ended with this process, should the other side fail
        processes.append(spawn.Process(target=serve, args=(side, args, theirs_end), daemon=True))
        processes[-1].start()

    def ask(side: str, message: int | None) -> object:
        if message is not None:
            ends[side].send(message)
        answer = ends[side].recv()
        if isinstance(answer, str) and answer != "ready":
            sys.exit(f"side_by_side: the {side} side failed:\n{answer}")
        return answer

    for side in SIDES:
        ask(side, None)  # built
    steps = {side: [] for side in SIDES}
    for step in range(args.warmup + args.steps):
        for side in SIDES:
            seconds = ask(side, step)
            if step >= args.warmup:
                steps[side].append(seconds)
    for side in SIDES:
        ends[side].send(None)
    for process in processes:
        process.join()
    median = {side: [statistics.median(s[k] for s in timed) for k in (0, 1)]
              for side, timed in steps.items()}
    (our_cpu, our_wall), (their_cpu, their_wall) = median["hpctrain"], median["torch"]
    malloc = "hpctrain's" if args.torch_keeps_freed_memory else "glibc's"
    print(f"{args.net} size {args.image_size} batch {args.batch}: CPU ms hpctrain "
          f"{our_cpu * 1e3:.1f} torch {their_cpu * 1e3:.1f} = {our_cpu / their_cpu:.2f}; "
          f"wall ms hpctrain {our_wall * 1e3:.1f} torch {their_wall * 1e3:.1f} = "
          f"{our_wall / their_wall:.2f} (medians of {args.steps} steps each, alternating; "
          f"PyTorch with {malloc} malloc)")
    if args.out:
        import torch

        Path(args.out).write_text(json.dumps({
            "net": args.net, "image_size": args.image_size, "batch": args.batch,
            "torch_keeps_freed_memory": args.torch_keeps_freed_memory,
            "steps": {side: [list(s) for s in timed] for side, timed in steps.items()},
            "cpu_seconds": {"hpctrain": our_cpu, "torch": their_cpu},
            "wall_seconds": {"hpctrain": our_wall, "torch": their_wall},
            "torch": torch.__version__}))


if __name__ == "__main__":
    main()
