"""The reference: the same AlexNet trained with PyTorch on the CPU, alone or under DDP (gloo).

Same network as ``hpctrain/inputs/nets/alexnet.net`` (torchvision's one-tower AlexNet, the
classifier sized for the input), same global batch, SGD with momentum and weight decay, one thread
per process, random data made once (data production is not what is compared). Prints one JSON
line: the median step seconds after the warm-up steps.

    python bench/torch_alexnet.py --procs 2 --batch 16 --image-size 127 --steps 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def alexnet(image_size: int):
    import torch
    from torch import nn

    features = nn.Sequential(
        nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, 1, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, 1, 1), nn.ReLU(),
        nn.Conv2d(384, 256, 3, 1, 1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(3, 2), nn.Flatten())
    width = features(torch.zeros(1, 3, image_size, image_size)).shape[1]
    return nn.Sequential(features, nn.Dropout(), nn.Linear(width, 4096), nn.ReLU(), nn.Dropout(),
                         nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1000))


def train(rank: int, procs: int, args: argparse.Namespace, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = alexnet(args.image_size)
    if procs > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=procs)
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    local = args.batch // procs + (rank < args.batch % procs)
    x = torch.randn(local, 3, args.image_size, args.image_size)
    y = torch.randint(0, 1000, (local,))
    seconds = []
    for _ in range(args.steps):
        if procs > 1:
            dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    if procs > 1:
        # the slowest rank sets the pace: report the largest median
        median = torch.tensor([statistics.median(seconds[1:])])
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
        dist.destroy_process_group()
        step = float(median[0])
    else:
        step = statistics.median(seconds[1:])
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"procs": procs, "batch": args.batch, "image_size": args.image_size,
                       "threads": args.threads, "step_seconds": step,
                       "torch": __import__("torch").__version__}, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16, help="global batch")
    parser.add_argument("--image-size", type=int, default=127)
    parser.add_argument("--steps", type=int, default=6, help="the first is a warm-up")
    parser.add_argument("--threads", type=int, default=1, help="threads per process")
    parser.add_argument("--out", required=True, help="JSON result file")
    args = parser.parse_args()
    if args.procs == 1:
        train(0, 1, args, 0, args.out)
        return
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    mp.spawn(train, args=(args.procs, args, port, args.out), nprocs=args.procs)


if __name__ == "__main__":
    main()
