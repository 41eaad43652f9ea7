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
from dataclasses import dataclass
from typing import Any

from hpctrain.errors import ArgumentParser, UserError
from hpctrain.net import NetSpec, available_nets, load_net
from hpctrain.plan import LayerPlan, plan_from_spec, plan_text
from hpctrain.units import bytes_from

COMMANDS = ("train", "verify", "plan", "calibrate", "simulate", "compare-plans", "convert")


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
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of weights, data order, dropout (default: 0, or the "
                             "checkpoint's when resuming)")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m hpctrain",
        description="Train a network on P MPI processes with per-layer batch, model (1.5D) and "
                    "domain parallelism. Launch with mpiexec -n P or srun (or plain python for "
                    "one process). Other commands (each with --help): verify, plan, calibrate, "
                    "simulate, compare-plans, convert.",
        epilog="On SIGTERM or SIGUSR1 (sbatch --signal=USR1@120) every rank stops after the "
               "same step, writes a checkpoint to --checkpoint-dir and exits with status 0. "
               "Bad input exits with status 2 and one line naming the fix.")
    _common(parser)
    run = parser.add_argument_group("the run")
    run.add_argument("--data", default="synthetic",
                     help="'synthetic' (deterministic ImageNet-shaped data from --seed) or an "
                          "HDF5 dataset (see README; make one with 'python -m hpctrain "
                          "convert'); a dataset sets the image size unless --image-size is "
                          "given (default: %(default)s)")
    run.add_argument("--batch", type=int, default=32, help="global mini-batch (default: 32)")
    length = run.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=None,
                        help="train until this many steps are done (default: 10)")
    length.add_argument("--epochs", type=float, default=None,
                        help="train this many passes over a dataset's training split (each "
                             "epoch is floor(N / batch) steps of a fresh shuffle)")
    run.add_argument("--lr", type=float, default=0.01, help="learning rate (default: 0.01)")
    run.add_argument("--lr-schedule", default="constant",
                     help="constant, cosine (to 0 at the last step) or step:EVERY:FACTOR "
                          "(e.g. step:100:0.1) (default: %(default)s)")
    run.add_argument("--warmup-steps", type=int, default=0,
                     help="ramp the rate linearly over the first N steps (default: 0)")
    run.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    run.add_argument("--weight-decay", type=float, default=5e-4,
                     help="L2 weight decay (default: 5e-4)")
    run.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                     help="compute precision (default: %(default)s)")
    run.add_argument("--eval-every", type=int, default=None,
                     help="held-out accuracy every N steps, when the dataset has a val split "
                          "(default: every epoch, and always at the end)")
    plan = parser.add_argument_group("planning")
    _planning(plan)
    plan.add_argument("--plan-file", default=None,
                      help="where --grid auto writes its plan, which --grid accepts "
                           "(default: runs/NET-pP-bB.plan)")
    plan.add_argument("--plan-only", action="store_true",
                      help="print the plan with its predicted times (and write the plan file "
                           "for --grid auto), then exit without training")
    output = parser.add_argument_group("output")
    output.add_argument("--log", default=None,
                        help="HDF5 run log written by rank 0 and flushed every step: config, "
                             "plan, loss, accuracy, per-layer times and bytes (layout in "
                             "README); an existing file is renamed aside, or continued with "
                             "--resume")
    output.add_argument("--print-every", type=int, default=1,
                        help="progress line every N steps (default: 1)")
    output.add_argument("--checkpoint-dir", default=None,
                        help="write HDF5 checkpoints here (atomically, as step-NNNNNNNN.h5): "
                             "at the end, on SIGTERM/SIGUSR1, and every --checkpoint-every "
                             "steps (default: none)")
    output.add_argument("--checkpoint-every", type=int, default=0,
                        help="also checkpoint every N steps (default: 0, never)")
    output.add_argument("--keep-checkpoints", type=int, default=2,
                        help="keep the newest N checkpoints (default: 2)")
    output.add_argument("--resume", nargs="?", const="latest", default=None,
                        help="continue from a checkpoint file or directory (its newest), on "
                             "any P and plan; bare --resume takes the newest in "
                             "--checkpoint-dir and starts afresh when there is none")
    return parser


def build_verify_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
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


@dataclass
class Setup:
    """What every training command derives from its options before the first step."""

    net: NetSpec
    plan: list[LayerPlan]
    backend: Any
    planned: Any  # PlannedNetwork with the predictions, or None when not asked for
    machine: Any = None  # the cost model's machine profile


def _setup(args: argparse.Namespace, net: NetSpec, comm, dtype: str,
           predict: bool = True) -> Setup:
    """The per-layer plan of ``net``, the backend, and the plan's predicted costs."""
    from hpctrain.backend import make_backend

    procs = comm.Get_size()
    spec = args.grid or f"1x{procs}"
    plan = None if spec.strip() == "auto" else agreed(
        comm, lambda: plan_from_spec(spec, net, procs))
    backend = make_backend(args.device, dtype, comm)
    if plan is not None and not predict:
        return Setup(net, plan, backend, None)
    from hpctrain.cost.machine import load_machine
    from hpctrain.cost.model import build_cost_model
    from hpctrain.planner import predict

    machine = agreed(comm, lambda: load_machine(args.machine))
    model = build_cost_model(net, args.batch, procs, machine, args.compute, backend, comm)
    planned = predict(model, plan, args.mem_per_rank)
    if plan is None and comm.Get_rank() == 0:
        _write_plan(getattr(args, "plan_file", None)
                    or f"runs/{net.name}-p{procs}-b{args.batch}.plan",
                    net, planned, procs, args.batch, model.machine.name)
    return Setup(net, planned.plans, backend, planned, model.machine)


def _write_plan(path: str, net, planned, procs: int, batch: int, machine: str) -> None:
    from pathlib import Path

    from hpctrain.plan import write_plan

    write_plan(Path(path), planned.plans,
               f"hpctrain plan: net {net.name}, {procs} processes, batch {batch}, machine "
               f"{machine}\npredicted iteration {planned.iteration_time * 1e3:.3f} ms")
    print(f"plan written to {path} (use it with --grid {path})", flush=True)


def agreed(comm, work, everywhere: bool = False):
    """``work()`` run by rank 0 and its result broadcast (or, ``everywhere``, run by every
    rank); a :class:`UserError` on any rank is raised on every rank, rank 0's or the first.

    What is read from files — the net, a plan, a machine profile, the dataset, a checkpoint —
    goes through here: a file that only some ranks can see (node-local disk) then fails the
    whole job at once with one message, where ranks that failed alone would leave the others
    waiting in a collective.
    """
    result = error = None
    if everywhere or comm.Get_rank() == 0:
        try:
            result = work()
        except UserError as err:
            error = str(err)
    if everywhere:
        error = next((e for e in comm.allgather(error) if e), None)
    else:
        result, error = comm.bcast((result, error), root=0)
    if error is not None:
        raise UserError(error)
    return result


@dataclass
class Prepared:
    """What rank 0 reads and checks before anything collective (see :func:`agreed`)."""

    net: NetSpec
    dataset: Any  # DatasetInfo, or None for synthetic data
    resume: Any  # the checkpoint to resume from (a Path), or None
    info: Any  # its CheckpointInfo, or None
    seed: int
    steps: int
    schedule: Any  # the learning-rate Schedule
    eval_every: int


def _prepare(args: argparse.Namespace) -> Prepared:
    """Every check of the options and the files they name, before planning (rank 0)."""
    from hpctrain.optim import SGD
    from hpctrain.schedule import parse_schedule

    for flag in ("steps", "print_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
        value = getattr(args, flag)
        least = 0 if flag == "checkpoint_every" else 1
        if value is not None and value < least:
            raise UserError(f"--{flag.replace('_', '-')} {value} must be >= {least}")
    if args.batch < 1:
        raise UserError(f"--batch {args.batch} must be at least 1")
    if args.epochs is not None and not args.epochs > 0:
        raise UserError(f"--epochs {args.epochs} must be positive")
    if args.checkpoint_every and not args.checkpoint_dir:
        raise UserError("--checkpoint-every needs --checkpoint-dir DIR")
    SGD.check(args.lr, args.momentum, args.weight_decay)
    net, dataset = _dataset_net(args, load_net(args.net, args.image_size))
    epoch = dataset.train_size // args.batch if dataset else None
    if args.epochs is not None:
        if epoch is None:
            raise UserError("--epochs needs a dataset (--data PATH.h5); synthetic data has no "
                            "epochs, use --steps")
        steps = max(1, int(args.epochs * epoch + 0.5))
    else:
        steps = args.steps or 10
    if args.eval_every and not (dataset and dataset.val_size):
        raise UserError(f"--eval-every {args.eval_every} needs a dataset with a held-out split "
                        f"(/val); --data {args.data} has none")
    schedule = parse_schedule(args.lr_schedule, args.lr, steps, args.warmup_steps)
    resume, info = _resume_from(args, net)
    _check_writable(args)
    seed = info.seed if info else (0 if args.seed is None else args.seed)
    eval_every = args.eval_every if args.eval_every is not None else (epoch or 0)
    return Prepared(net, dataset, resume, info, seed, steps, schedule, eval_every)


def _check_writable(args: argparse.Namespace) -> None:
    """Refuse a log or checkpoint path that cannot be written now, not after the training."""
    import os
    from pathlib import Path

    for flag, directory in (("--log", Path(args.log).parent if args.log else None),
                            ("--checkpoint-dir", args.checkpoint_dir)):
        if directory is None:
            continue
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"{flag}: cannot create directory {directory} ({err.strerror}); "
                            f"choose another path") from None
        if not os.access(directory, os.W_OK | os.X_OK):
            raise UserError(f"{flag}: directory {directory} is not writable; choose another "
                            f"path")


def _dataset_net(args: argparse.Namespace, net: NetSpec):
    """(``net`` at the dataset's image size, the dataset's description) for ``--data``, or
    (``net``, None) for synthetic data. Refuses a dataset that does not fit the net."""
    if args.data == "synthetic":
        return net, None
    from hpctrain.dataset import check_fits, inspect_dataset

    info = inspect_dataset(args.data)
    shape = info.sample_shape
    if (args.image_size is None and len(shape) == 3 == len(net.input_shape)
            and shape[1] == shape[2] and shape != net.input_shape
            and shape[0] == net.input_shape[0]):
        net = net.with_image_size(shape[1])  # the dataset's images set the input size
    check_fits(info, net.input_shape, net.classes, args.batch)
    return net, info


def _resume_from(args: argparse.Namespace, net: NetSpec):
    """The checkpoint to resume from and what it says, or (None, None) to start afresh.

    Refuses a --checkpoint-dir holding checkpoints of another trajectory: newer than the one
    resumed, or any at all for a fresh run (keeping the newest few would delete them, and a
    later bare --resume would pick the wrong one).
    """
    from hpctrain.checkpoint import (
        latest_checkpoint,
        read_checkpoint_info,
        resolve_resume,
        step_of,
    )

    newest = latest_checkpoint(args.checkpoint_dir) if args.checkpoint_dir else None
    path = info = None
    if args.resume == "latest" and not args.checkpoint_dir:
        raise UserError("bare --resume takes the newest checkpoint in --checkpoint-dir; give "
                        "--checkpoint-dir DIR or --resume PATH")
    if args.resume is not None:
        path = newest if args.resume == "latest" else resolve_resume(args.resume)
    if path is not None:
        info = read_checkpoint_info(path, net)
        if args.seed is not None and args.seed != info.seed:
            raise UserError(f"checkpoint {path} was written with --seed {info.seed}, not "
                            f"{args.seed}; drop --seed or pass --seed {info.seed}")
        batch = info.state.get("batch", args.batch)
        if batch != args.batch:
            raise UserError(f"checkpoint {path} was written with --batch {batch}; resume with "
                            f"--batch {batch} (what step N reads depends on it)")
    step = info.step if info else -1
    if newest is not None and step_of(newest) > step:
        what = f"is newer than step {step} resumed" if info else "belongs to another run"
        raise UserError(f"--checkpoint-dir {args.checkpoint_dir} holds {newest.name}, which "
                        f"{what}; resume from it (--resume), or use an empty directory")
    return path, info


def run_train(argv: list[str], comm) -> int:
    from hpctrain.signals import StopRequests

    args = build_parser().parse_args(argv)
    with StopRequests() as stop:  # a signal while planning stops the run before training
        return _train_command(args, argv, comm, stop)


def _train_command(args: argparse.Namespace, argv: list[str], comm, stop) -> int:
    from pathlib import Path

    from hpctrain.planner import format_plan
    from hpctrain.train import TrainConfig, train

    rank = comm.Get_rank()
    prepared = agreed(comm, lambda: _prepare(args))
    setup = _setup(args, prepared.net, comm, args.dtype)
    if rank == 0:
        print(format_plan(setup.planned), flush=True)
    if args.plan_only:
        return 0
    data = val_data = None
    if prepared.dataset is not None:
        from hpctrain.dataset import H5Data

        def open_data(split: str):
            return agreed(comm, lambda: H5Data(setup.backend, args.data, args.batch,
                                               prepared.seed, split, prepared.dataset),
                          everywhere=True)

        data = open_data("train")
        val_data = open_data("val") if prepared.dataset.val_size else None
    config = TrainConfig(args.batch, prepared.steps, args.lr, args.momentum, args.weight_decay,
                         prepared.seed, args.print_every, prepared.schedule, prepared.eval_every,
                         Path(args.checkpoint_dir) if args.checkpoint_dir else None,
                         args.checkpoint_every, args.keep_checkpoints)
    log = None
    if rank == 0 and args.log:
        log = _open_log(args, argv, setup, comm.Get_size(), config,
                        prepared.info.step if prepared.info else None)
    try:
        result = train(setup.net, setup.plan, config, setup.backend, comm, data=data,
                       val_data=val_data, log=log, resume=prepared.resume, stop=stop)
    except BaseException as err:
        if log is not None:
            log.finish(f"failed: {err}")
        raise
    finally:
        for reader in (data, val_data):
            if reader is not None:
                reader.close()
    if rank == 0 and result.losses:
        planned = setup.planned
        error = planned.iteration_time / result.iteration - 1
        print(f"iteration: predicted {planned.iteration_time * 1e3:.1f} ms, measured "
              f"{result.iteration * 1e3:.1f} ms ({error:+.1%})", flush=True)
    if log is not None:
        status = (f"stopped by {result.stopped_by} after step {result.last_step}"
                  if result.stopped_by else f"finished at step {result.last_step}")
        summary = None
        if result.losses:
            from hpctrain.runlog import write_timings

            def summary(h5) -> None:
                write_timings(h5, setup.planned, result.layer_times,
                              result.fastest_rank_times, result.iteration)

        log.finish(status, summary)
        print(f"log written to {args.log}", flush=True)
    return 0


def _open_log(args: argparse.Namespace, argv: list[str], setup: Setup, procs: int, config,
              resume_step: int | None):
    """Rank 0's run log, with everything needed to know what ran where."""
    import shlex
    from pathlib import Path

    from mpi4py import MPI

    import hpctrain
    from hpctrain.cost.machine import format_machine
    from hpctrain.runlog import RunLog, git_commit

    options = dict(vars(args), steps=config.steps, seed=config.seed,
                   eval_every=config.eval_every, learning_rate=config.schedule.describe())
    attrs = {
        "command": shlex.join(["python", "-m", "hpctrain", *argv]),
        "config": options,
        "version": hpctrain.__version__,
        "git_commit": git_commit(),
        "mpi_library": MPI.Get_library_version().strip(),
        "mpi_version": "{}.{}".format(*MPI.Get_version()),
        "processes": procs,
        "net": setup.net.name,
        "input_shape": list(setup.net.input_shape),
        "batch": args.batch,
        "dtype": args.dtype,
        "device": args.device,
        "data": args.data,
        "machine": setup.machine.name,
        "machine_profile": format_machine(setup.machine),
        "plan": plan_text(setup.plan),
        "predicted_iteration": setup.planned.iteration_time,
    }
    rows = [p.layer for p in setup.plan] + ["loss"]
    return RunLog(Path(args.log), attrs, setup.planned, rows, resume_step)


def run_verify(argv: list[str], comm) -> int:
    from hpctrain.grid import GridSet
    from hpctrain.verify import verify

    args = build_verify_parser().parse_args(argv)
    if args.batch < 1:
        raise UserError(f"--batch {args.batch} must be at least 1")
    net = agreed(comm, lambda: load_net(args.net, args.image_size))
    setup = _setup(args, net, comm, "float64", predict=False)
    with GridSet(comm) as grids:
        ok = verify(setup.net, setup.plan, args.batch, grids, setup.backend, args.seed or 0,
                    args.tolerance)
    return 0 if ok else 1


def build_plan_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
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

    from hpctrain.backend import DTYPES, Backend
    from hpctrain.cost.machine import load_machine
    from hpctrain.cost.model import build_cost_model, compute_source
    from hpctrain.planner import format_plan, plan_network

    args = build_plan_parser().parse_args(argv)
    for flag in ("procs", "batch"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} {getattr(args, flag)} must be at least 1")
    net = load_net(args.net, args.image_size)
    machine = load_machine(args.machine)
    backend = Backend(np, DTYPES[args.dtype])
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
    from hpctrain.convert import build_convert_parser
    from hpctrain.simulate import build_simulate_parser

    return {"train": build_parser, "verify": build_verify_parser, "plan": build_plan_parser,
            "calibrate": build_calibrate_parser, "simulate": build_simulate_parser,
            "compare-plans": build_compare_parser, "convert": build_convert_parser}


def _without_mpi(command: str, argv: list[str]) -> int:
    """Commands that never launch MPI: the cost model alone, and dataset conversion."""
    try:
        if command == "simulate":
            from hpctrain.simulate import run_simulate

            return run_simulate(argv)
        if command == "convert":
            from hpctrain.convert import run_convert

            return run_convert(argv)
        return run_plan(argv)
    except UserError as err:
        print(f"hpctrain: error: {err}", file=sys.stderr, flush=True)
        return 2


def _check_launch(comm) -> None:
    """Refuse tasks that srun started together but MPI sees apart (srun without a PMI the MPI
    library speaks makes each task a world of one): each would train alone, all writing the
    same files. Only that case: under mpiexec inside an allocation the step's task count is
    that of mpiexec's own proxies, not of the ranks."""
    import os

    launched = os.environ.get("SLURM_STEP_NUM_TASKS", "")
    if comm.Get_size() == 1 and launched.isdigit() and int(launched) > 1:
        raise UserError(f"srun launched {launched} tasks but MPI sees each alone; the MPI "
                        f"library and srun do not share a PMI: use srun --mpi=pmi2 (the mpich "
                        f"wheel) or mpiexec")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "train"
    if any(a in ("-h", "--help") for a in argv):  # help needs no MPI
        try:
            _parsers()[command]().parse_args(argv)
        except UserError as err:
            print(f"hpctrain: error: {err}", file=sys.stderr, flush=True)
            return 2
    if command in ("plan", "simulate", "convert"):
        return _without_mpi(command, argv)
    from mpi4py import MPI

    from hpctrain.calibrate import run_calibrate
    from hpctrain.compare import run_compare

    comm = MPI.COMM_WORLD
    try:
        _check_launch(comm)
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
