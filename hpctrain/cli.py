"""Command line: ``python -m hpctrain [train options]`` and ``python -m hpctrain verify …``.

A :class:`~hpctrain.errors.UserError` (a bad net, grid or size) is found identically on every rank
before any rank can block, so every rank exits with status 2 and rank 0 prints one line naming the
fix. Anything else may have struck one rank only: that rank prints what happened and aborts the
whole job, so no rank is left waiting in a collective.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from hpctrain.errors import UserError
from hpctrain.net import available_nets, load_net
from hpctrain.plan import plan_from_spec

COMMANDS = ("train", "verify")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--net", default="alexnet",
                        help=f"shipped net ({', '.join(available_nets())}) or a .net file "
                             f"(default: %(default)s)")
    parser.add_argument("--grid", default=None,
                        help="RxC (every layer on R model x C batch ranks), "
                             "conv=SPEC,fc=SPEC with SPEC = RxC or domain:RxC, or a plan "
                             "file (default: 1xP, pure batch parallelism)")
    parser.add_argument("--image-size", type=int, default=None,
                        help="input height and width, overriding the net's")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="NumPy on the CPU or CuPy on a GPU; each rank uses GPU "
                             "local_rank %% n_gpus (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, data, dropout")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpctrain",
        description="Train a network on P MPI processes with per-layer batch, model (1.5D) and "
                    "domain parallelism. Launch with mpiexec -n P or srun. "
                    "Other command: 'python -m hpctrain verify --help'.")
    _common(parser)
    parser.add_argument("--batch", type=int, default=32, help="global mini-batch (default: 32)")
    parser.add_argument("--steps", type=int, default=10, help="training steps (default: 10)")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate (default: 0.01)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    parser.add_argument("--weight-decay", type=float, default=5e-4,
                        help="L2 weight decay (default: 5e-4)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="compute precision (default: %(default)s)")
    parser.add_argument("--print-every", type=int, default=1,
                        help="progress line every N steps (default: 1)")
    return parser


def build_verify_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpctrain verify",
        description="Run one forward and backward under a plan and the same computation on one "
                    "process in float64; print per layer the largest relative error of the "
                    "output and of every gradient; exit 1 above the tolerance.")
    _common(parser)
    parser.add_argument("--batch", type=int, default=4, help="global mini-batch (default: 4)")
    parser.add_argument("--tolerance", type=float, default=1e-9,
                        help="largest relative error accepted (default: 1e-9)")
    return parser


def _setup(args: argparse.Namespace, comm, dtype: str):
    from hpctrain.backend import make_backend

    net = load_net(args.net)
    if args.image_size is not None:
        net = net.with_image_size(args.image_size)
    if args.batch < 1:
        raise UserError(f"--batch {args.batch} must be at least 1")
    procs = comm.Get_size()
    plan = plan_from_spec(args.grid or f"1x{procs}", net, procs)
    return net, plan, make_backend(args.device, dtype, comm)


def run_train(argv: list[str], comm) -> int:
    from hpctrain.train import TrainConfig, train

    args = build_parser().parse_args(argv)
    for flag in ("steps", "print_every"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} {getattr(args, flag)} must be >= 1")
    net, plan, backend = _setup(args, comm, args.dtype)
    config = TrainConfig(args.batch, args.steps, args.lr, args.momentum, args.weight_decay,
                         args.seed, args.print_every)
    train(net, plan, config, backend, comm)
    return 0


def run_verify(argv: list[str], comm) -> int:
    from hpctrain.grid import GridSet
    from hpctrain.verify import verify

    args = build_verify_parser().parse_args(argv)
    net, plan, backend = _setup(args, comm, "float64")
    with GridSet(comm) as grids:
        ok = verify(net, plan, args.batch, grids, backend, args.seed, args.tolerance)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "train"
    if any(a in ("-h", "--help") for a in argv):  # help needs no MPI
        (build_verify_parser() if command == "verify" else build_parser()).parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    try:
        return {"train": run_train, "verify": run_verify}[command](argv, comm)
    except UserError as err:
        if comm.Get_rank() == 0:
            print(f"hpctrain: error: {err}", file=sys.stderr, flush=True)
        return 2
    except SystemExit:
        raise
    except BaseException as err:
        detail = str(err) if isinstance(err, RuntimeError) else traceback.format_exc()
        print(f"hpctrain: rank {comm.Get_rank()} failed: {detail}", file=sys.stderr, flush=True)
        comm.Abort(1)
        return 1
