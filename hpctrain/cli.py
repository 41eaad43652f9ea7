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
from hpctrain.units import bytes_from

COMMANDS = ("train", "verify", "plan", "calibrate", "simulate", "compare-plans")


def parse_size(text: str) -> float:
    """Bytes from '512M', '2G', '1.5GiB' or a plain byte count (K/M/G/T are powers of 1024)."""
    size = bytes_from(text)
    if not size:
        raise argparse.ArgumentTypeError(f"'{text}' is not a memory size; write e.g. 512M or 2G")
    return size


def _planning(parser: argparse.ArgumentParser) -> None:
    from hpctrain.cost.machine import available_machines
    from hpctrain.cost.model import COMPUTE_SOURCES

    parser.add_argument("--machine", default=None,
                        help=f"machine profile for the cost model: "
                             f"{', '.join(available_machines())} or a .toml path "
                             f"(default: local when calibrated, else default)")
    parser.add_argument("--mem-per-rank", type=parse_size, default=None,
                        help="memory cap per rank for --grid auto, e.g. 2G (default: none)")
    parser.add_argument("--compute", choices=COMPUTE_SOURCES, default="auto",
                        help="compute times for the cost model: measured on this device, or "
                             "FLOPs / the profile's rate; auto measures on this machine's own "
                             "profile and uses FLOPs for another machine's (default: auto)")


def add_net_options(parser: argparse.ArgumentParser, image_size: bool = True) -> None:
    """--net and (unless told not to) --image-size, as every command spells them."""
    parser.add_argument("--net", default="alexnet",
                        help=f"shipped net ({', '.join(available_nets())}) or a .net file "
                             f"(default: %(default)s)")
    if image_size:
        parser.add_argument("--image-size", type=int, default=None,
                            help="input height and width, overriding the net's")


def _common(parser: argparse.ArgumentParser) -> None:
    add_net_options(parser)
    parser.add_argument("--grid", default=None,
                        help="auto (the planner picks each layer's mode and grid), RxC (every "
                             "layer on R model x C batch ranks), conv=SPEC,fc=SPEC with SPEC = "
                             "RxC or domain:RxC, or a plan file (default: 1xP, pure batch)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="NumPy on the CPU or CuPy on a GPU; each rank uses GPU "
                             "local_rank %% n_gpus (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, data, dropout")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpctrain",
        description="Train a network on P MPI processes with per-layer batch, model (1.5D) and "
                    "domain parallelism. Launch with mpiexec -n P or srun. "
                    "Other commands (each with --help): verify, plan, calibrate, simulate, "
                    "compare-plans.")
    _common(parser)
    _planning(parser)
    parser.add_argument("--plan-file", default=None,
                        help="where --grid auto writes its plan, which --grid accepts "
                             "(default: runs/NET-pP-bB.plan)")
    parser.add_argument("--log", default=None,
                        help="HDF5 run log: losses, step times, and per layer the predicted "
                             "and measured times (written by rank 0)")
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
    _planning(parser)
    return parser


def _setup(args: argparse.Namespace, comm, dtype: str, predict: bool = True):
    """The net, its per-layer plan, the backend, and the plan's predicted costs (or None)."""
    from hpctrain.backend import make_backend

    net = load_net(args.net, args.image_size)
    if args.batch < 1:
        raise UserError(f"--batch {args.batch} must be at least 1")
    procs = comm.Get_size()
    spec = args.grid or f"1x{procs}"
    plan = None if spec.strip() == "auto" else plan_from_spec(spec, net, procs)
    backend = make_backend(args.device, dtype, comm)
    if plan is not None and not predict:
        return net, plan, backend, None
    from hpctrain.cost.machine import load_machine
    from hpctrain.cost.model import build_cost_model
    from hpctrain.planner import choices_of, evaluate, plan_network

    model = build_cost_model(net, args.batch, procs, load_machine(args.machine), args.compute,
                             backend, comm)
    if plan is None:
        planned = plan_network(model, args.mem_per_rank)
        if comm.Get_rank() == 0:
            _write_plan(getattr(args, "plan_file", None)
                        or f"runs/{net.name}-p{procs}-b{args.batch}.plan",
                        net, planned, procs, args.batch, model.machine.name)
    else:
        planned = evaluate(model, choices_of(model, plan))
    return net, planned.plans, backend, planned


def _write_plan(path: str, net, planned, procs: int, batch: int, machine: str) -> None:
    from pathlib import Path

    from hpctrain.plan import write_plan

    write_plan(Path(path), planned.plans,
               f"hpctrain plan: net {net.name}, {procs} processes, batch {batch}, machine "
               f"{machine}\npredicted iteration {planned.iteration_time * 1e3:.3f} ms")
    print(f"plan written to {path} (use it with --grid {path})", flush=True)


def run_train(argv: list[str], comm) -> int:
    from hpctrain.planner import format_plan
    from hpctrain.train import TrainConfig, train

    args = build_parser().parse_args(argv)
    for flag in ("steps", "print_every"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} {getattr(args, flag)} must be >= 1")
    net, plan, backend, planned = _setup(args, comm, args.dtype)
    if comm.Get_rank() == 0:
        print(format_plan(planned), flush=True)
    config = TrainConfig(args.batch, args.steps, args.lr, args.momentum, args.weight_decay,
                         args.seed, args.print_every)
    result = train(net, plan, config, backend, comm)
    if comm.Get_rank() == 0:
        error = planned.iteration_time / result.iteration - 1
        print(f"iteration: predicted {planned.iteration_time * 1e3:.1f} ms, measured "
              f"{result.iteration * 1e3:.1f} ms ({error:+.1%})", flush=True)
        if args.log:
            _write_log(args, argv, net, comm.Get_size(), planned, result)
    return 0


def _write_log(args: argparse.Namespace, argv: list[str], net, procs: int, planned,
               result) -> None:
    from pathlib import Path

    import numpy as np

    from hpctrain.runlog import write_hdf5, write_timings

    def fill(h5) -> None:
        h5.attrs["command"] = " ".join(["python -m hpctrain", *argv])
        h5.attrs["net"] = net.name
        h5.attrs["processes"] = procs
        h5.attrs["batch"] = args.batch
        h5.attrs["plan"] = "\n".join(f"{p.layer} {p.describe()}" for p in planned.plans)
        h5.create_dataset("steps/loss", data=np.array(result.losses))
        h5.create_dataset("steps/seconds", data=np.array(result.step_seconds))
        write_timings(h5, planned, result.layer_times, result.fastest_rank_times,
                      result.iteration)

    write_hdf5(Path(args.log), fill)
    print(f"log written to {args.log}", flush=True)


def run_verify(argv: list[str], comm) -> int:
    from hpctrain.grid import GridSet
    from hpctrain.verify import verify

    args = build_verify_parser().parse_args(argv)
    net, plan, backend, _ = _setup(args, comm, "float64", predict=False)
    with GridSet(comm) as grids:
        ok = verify(net, plan, args.batch, grids, backend, args.seed, args.tolerance)
    return 0 if ok else 1


def build_plan_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpctrain plan",
        description="Print the plan of least predicted iteration time for P processes, without "
                    "launching MPI: each layer's mode and Pr x Pc grid, predicted compute, "
                    "communication, redistribution and memory per rank.")
    add_net_options(parser)
    parser.add_argument("--procs", type=int, required=True, help="number of processes P")
    parser.add_argument("--batch", type=int, required=True, help="global mini-batch B")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="training precision: bytes moved and kernels timed "
                             "(default: %(default)s)")
    parser.add_argument("--out", default=None, help="also write the plan file here")
    _planning(parser)
    return parser


def run_plan(argv: list[str]) -> int:
    import numpy as np

    from hpctrain.backend import Backend
    from hpctrain.cost.machine import load_machine
    from hpctrain.cost.model import build_cost_model, compute_source
    from hpctrain.planner import format_plan, plan_network

    args = build_plan_parser().parse_args(argv)
    for flag in ("procs", "batch"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} {getattr(args, flag)} must be at least 1")
    net = load_net(args.net, args.image_size)
    machine = load_machine(args.machine)
    backend = Backend(np, np.float32 if args.dtype == "float32" else np.float64)
    model = build_cost_model(net, args.batch, args.procs, machine, args.compute, backend)
    planned = plan_network(model, args.mem_per_rank)
    print(f"hpctrain plan: {net.name}, {args.procs} processes, batch {args.batch}, machine "
          f"{machine.name} (alpha {machine.alpha * 1e6:.3g} us, 1/beta "
          f"{1 / machine.beta / 1e9:.3g} GB/s), compute "
          f"{compute_source(machine, args.compute)}")
    print(format_plan(planned))
    if args.out:
        _write_plan(args.out, net, planned, args.procs, args.batch, machine.name)
    return 0


def _parsers() -> dict:
    from hpctrain.calibrate import build_calibrate_parser
    from hpctrain.compare import build_compare_parser
    from hpctrain.simulate import build_simulate_parser

    return {"train": build_parser, "verify": build_verify_parser, "plan": build_plan_parser,
            "calibrate": build_calibrate_parser, "simulate": build_simulate_parser,
            "compare-plans": build_compare_parser}


def _without_mpi(command: str, argv: list[str]) -> int:
    """Commands that never launch MPI: the cost model alone."""
    try:
        if command == "simulate":
            from hpctrain.simulate import run_simulate

            return run_simulate(argv)
        return run_plan(argv)
    except UserError as err:
        print(f"hpctrain: error: {err}", file=sys.stderr, flush=True)
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "train"
    if any(a in ("-h", "--help") for a in argv):  # help needs no MPI
        _parsers()[command]().parse_args(argv)
    if command in ("plan", "simulate"):
        return _without_mpi(command, argv)
    from mpi4py import MPI

    from hpctrain.calibrate import run_calibrate
    from hpctrain.compare import run_compare

    comm = MPI.COMM_WORLD
    try:
        return {"train": run_train, "verify": run_verify, "calibrate": run_calibrate,
                "compare-plans": run_compare}[command](argv, comm)
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
