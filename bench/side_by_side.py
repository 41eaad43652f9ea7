"""hpctrain's training step against PyTorch's in one process on one thread, step for step, by
CPU time as well as wall time: a comparison that a shared machine disturbs less.

bench/throughput.py runs each side in its own process, one after the other, and times steps by
the wall clock: on a machine whose other jobs come and go, a burst spoils one side and not the
other. Here the two sides alternate step by step in one process (P = 1, one thread), so a burst
falls on both, and each step is also timed by this process's CPU time, which counts only what
the step itself ran. (Contention still costs CPU time: another job's traffic through the caches
and the memory slows both sides' kernels, not always alike.)

The sides are those of bench/throughput.py: hpctrain's shipped net on one rank (its whole-batch
plan, the step the training loop runs: forward, loss, backward, each layer updated by SGD as its
gradient is ready), and bench/ddp_reference.py's PyTorch model with torch.optim.SGD, the same
rate, momentum and weight decay, float32. The data are drawn outside the timed step on both
sides: PyTorch's batch once before the steps, and hpctrain's batch before each step's clocks
start (the synthetic draw, read by the step as it would read the source). Freed memory is kept
for reuse in the process (:func:`hpctrain.device.allocator.keep_freed_memory`, as a ``python -m
hpctrain`` run does), for both sides. Prints one line per net, medians over the steps after the
warm-up.

    python bench/side_by_side.py --net resnet18 --image-size 32 --batch 16
    python bench/side_by_side.py --net resnet50 --image-size 64 --batch 8 --steps 12
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4  # as bench/throughput.py's


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
    parser.add_argument("--out", help="also write the result here (JSON)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"

    import numpy as np
    import torch
    from mpi4py import MPI
    from threadpoolctl import threadpool_limits

    sys.path.insert(0, str(HERE))
    import ddp_reference

    from hpctrain.comm.grid import GridSet
    from hpctrain.data.synthetic import SyntheticData
    from hpctrain.device.allocator import keep_freed_memory
    from hpctrain.device.backend import Backend
    from hpctrain.model.net import load_net
    from hpctrain.plan.plans import LayerPlan
    from hpctrain.run.network import Network
    from hpctrain.run.optimizer import SGD

    if args.net not in ddp_reference.NETS:
        parser.error(f"--net {args.net}: one of {', '.join(ddp_reference.NETS)}")
    keep_freed_memory()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with threadpool_limits(1), GridSet(MPI.COMM_SELF) as grids:
        net = load_net(args.net, args.image_size)
        backend = Backend(np, np.float32)
        network = Network(net, [LayerPlan("batch", (1, 1))] * len(net.layers), args.batch,
                          grids, backend)
        data = SyntheticData.for_net(backend, net, args.batch)
        optimizer = SGD(network.params, LR, MOMENTUM, WEIGHT_DECAY)
        model = ddp_reference.build(args.net, args.image_size).train()
        torch_optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM,
                                          weight_decay=WEIGHT_DECAY)
        x, y, loss = ddp_reference.batch_of(args.net, args.batch, args.image_size)

        drawn = Drawn(data)

        def ours(step: int) -> tuple[float, float]:
            drawn.draw(step, network.input_box, network.labels_box)  # before the clocks start
            cpu, wall = time.process_time(), time.perf_counter()
            network.train_step(drawn, step, update=partial(optimizer.step, LR))
            return time.process_time() - cpu, time.perf_counter() - wall

        def theirs(step: int) -> tuple[float, float]:
            cpu, wall = time.process_time(), time.perf_counter()
            torch_optimizer.zero_grad()
            loss(model(x), y).backward()
            torch_optimizer.step()
            return time.process_time() - cpu, time.perf_counter() - wall

        steps = {"hpctrain": [], "torch": []}
        for step in range(args.warmup + args.steps):
            for side, run in (("hpctrain", ours), ("torch", theirs)):
                seconds = run(step)
                if step >= args.warmup:
                    steps[side].append(seconds)
    median = {side: [statistics.median(s[k] for s in timed) for k in (0, 1)]
              for side, timed in steps.items()}
    (our_cpu, our_wall), (their_cpu, their_wall) = median["hpctrain"], median["torch"]
    print(f"{args.net} size {args.image_size} batch {args.batch}: CPU ms hpctrain "
          f"{our_cpu * 1e3:.1f} torch {their_cpu * 1e3:.1f} = {our_cpu / their_cpu:.2f}; "
          f"wall ms hpctrain {our_wall * 1e3:.1f} torch {their_wall * 1e3:.1f} = "
          f"{our_wall / their_wall:.2f} (medians of {args.steps} steps each, alternating)")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "net": args.net, "image_size": args.image_size, "batch": args.batch,
            "steps": {side: [list(s) for s in timed] for side, timed in steps.items()},
            "cpu_seconds": {"hpctrain": our_cpu, "torch": their_cpu},
            "wall_seconds": {"hpctrain": our_wall, "torch": their_wall},
            "torch": torch.__version__}))


if __name__ == "__main__":
    main()
