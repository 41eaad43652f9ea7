"""The reference: a net trained with plain PyTorch on the CPU (P = 1) or under
DistributedDataParallel over gloo (P > 1), timed step by step as hpctrain's run log times it.

The nets: ``alexnet`` (bench/torch_alexnet.py's, hpctrain's alexnet.net), ``resnet18`` and
``cosmoflow`` (tests/torch_reference.py's, checked there against hpctrain's resnet18.net and
cosmoflow.net tensor by tensor), ``mobilenet_v2`` (torchvision's, checked against
mobilenet_v2.net in tests/test_mobile_layers.py), ``resnet50`` and ``inception_v3``
(torchvision's, without Inception's auxiliary classifier, as resnet50.net and inception_v3.net;
bench/interchange.py holds their ONNX exports against the shipped nets; CosmoFlow on
4-channel volumes of ``--image-size``³, regressed onto 4 targets by the mean squared error, the
others classify 1000 ways). Float32, SGD with momentum and weight decay, one thread per process,
random data made once (data production is not what is compared), each rank its share of the
global batch. DDP keeps its defaults: 25 MiB gradient buckets, and BatchNorm2d statistics over
each process's own samples (its running statistics broadcast from rank 0 at every forward,
``broadcast_buffers``).

A step is timed from a barrier to the end of the optimizer's update; as in hpctrain's log, a
step's time is the slowest rank's, and the result is the median over the steps after the
warm-up. Writes one JSON file.

    python bench/ddp_reference.py --net resnet18 --procs 2 --batch 16 --image-size 32 \\
        --steps 12 --warmup 2 --out runs/bench/ddp.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NETS = ("alexnet", "resnet18", "cosmoflow", "mobilenet_v2", "resnet50", "inception_v3")
CLASSES = 1000  # the image nets' classes, and hpctrain's synthetic labels'


def build(net: str, image_size: int):
    """The PyTorch model of hpctrain's shipped ``net``."""
    if net == "mobilenet_v2":  # torchvision's (tests/test_mobile_layers.py checks the net)
        import torchvision

        return torchvision.models.mobilenet_v2(num_classes=CLASSES)
    if net == "resnet50":
        import torchvision

        return torchvision.models.resnet50(num_classes=CLASSES)
    if net == "inception_v3":  # no auxiliary classifier, as inception_v3.net
        import torchvision

        return torchvision.models.inception_v3(weights=None, aux_logits=False,
                                               init_weights=False, num_classes=CLASSES)
    if net == "alexnet":
        sys.path.insert(0, str(HERE))
        from torch_alexnet import alexnet

        return alexnet(image_size)
    # tests/torch_reference.py imports mpi4py (through hpctrain): keep it from starting MPI in
    # these workers, which torch.multiprocessing starts and gloo connects
    import mpi4py

    mpi4py.rc.initialize = False
    sys.path.insert(0, str(HERE.parent))
    from tests.torch_reference import ResNet18, cosmoflow_model, cosmoflow_net

    if net == "cosmoflow":
        return cosmoflow_model(cosmoflow_net(image_size))
    return ResNet18(CLASSES)


def batch_of(net: str, local: int, image_size: int):
    """Random inputs and targets of ``local`` samples, and the loss that compares them."""
    import torch
    from torch import nn

    if net == "cosmoflow":  # 4 channels of a volume, 4 cosmological parameters
        return (torch.randn(local, 4, image_size, image_size, image_size),
                torch.rand(local, 4) * 2 - 1, nn.functional.mse_loss)
    return (torch.randn(local, 3, image_size, image_size),
            torch.randint(0, CLASSES, (local,)), nn.functional.cross_entropy)


def train(rank: int, procs: int, args: argparse.Namespace, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build(args.net, args.image_size).train()
    if procs > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=procs)
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    local = args.batch // procs + (rank < args.batch % procs)
    x, y, loss = batch_of(args.net, local, args.image_size)
    seconds = torch.zeros(args.steps, dtype=torch.float64)
    for step in range(args.steps):
        if procs > 1:
            dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        loss(model(x), y).backward()
        optimizer.step()
        seconds[step] = time.perf_counter() - start
    if procs > 1:  # each step as long as its slowest rank, as hpctrain's /steps/seconds
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        dist.destroy_process_group()
    if rank == 0:
        measured = seconds.tolist()[args.warmup:]
        Path(args.out).write_text(json.dumps({
            "net": args.net, "procs": procs, "batch": args.batch, "image_size": args.image_size,
            "threads": args.threads, "warmup": args.warmup, "steps_seconds": seconds.tolist(),
            "step_seconds": statistics.median(measured), "torch": torch.__version__,
            "reference": "torch" if procs == 1 else "DDP gloo"}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=NETS, default="resnet18")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16, help="global batch")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12, help="steps, the warm-up included")
    parser.add_argument("--warmup", type=int, default=2, help="first steps not counted")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=1, help="threads per process")
    parser.add_argument("--out", required=True, help="JSON result file")
    args = parser.parse_args()
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup {args.warmup}: must be at least 0 and below --steps "
                     f"{args.steps}")
    if args.batch < args.procs:
        parser.error(f"--batch {args.batch}: needs at least one sample per process "
                     f"(--procs {args.procs})")
    if args.procs == 1:
        train(0, 1, args, 0)
        return
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    mp.spawn(train, args=(args.procs, args, port), nprocs=args.procs)


if __name__ == "__main__":
    main()
