"""``python -m hpctrain plan``: the plan of least predicted time for P processes, printed
without launching MPI (measured compute runs on this process alone)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.commands.flags import (
    add_net_options,
    add_overlap_option,
    add_planning_options,
    add_threads_option,
    check_space,
    load_net_for,
)
from hpctrain.errors import ArgumentParser, UserError

if TYPE_CHECKING:
    from hpctrain.cost.machine import Machine
    from hpctrain.device.precision import Precision


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m hpctrain plan",
        description="Print the plan of least predicted iteration time for P processes, without "
                    "launching MPI: each layer's mode and Pr x Pc grid, predicted compute, "
                    "communication, redistribution and memory per rank.")
    add_net_options(parser)
    parser.add_argument("--procs", type=int, required=True, help="number of processes P")
    parser.add_argument("--batch", type=int, required=True, help="global mini-batch B")
    add_planning_precision(parser)
    parser.add_argument("--optimizer", choices=("sgd", "adamw", "lars", "lamb"), default="sgd",
                        help="the optimizer the run trains with, as train's --optimizer: its "
                             "state per parameter counts in the memory (one float32 array for "
                             "sgd and lars, two for adamw and lamb) (default: %(default)s)")
    parser.add_argument("--accumulate", type=int, default=1, metavar="K",
                        help="as train's --accumulate K: plan the micro-batch of batch/K "
                             "samples, each parameter also keeping the sum of its gradients "
                             "(default: 1)")
    parser.add_argument("--out", default=None, help="also write the plan file here")
    parser.add_argument("--grid", default="auto",
                        help="auto: search for the plan of least predicted time; or a --grid "
                             "value of train (RxC, conv=SPEC,fc=SPEC, a degree per axis such as "
                             "conv=h2w2, a plan file) to price that plan instead "
                             "(default: auto)")
    add_threads_option(parser)
    add_planning_options(parser)
    add_overlap_option(parser)
    return parser


def add_planning_precision(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    """--precision for a command that plans without running: what the bytes are priced in and
    the FLOP rate compute is priced at (:mod:`hpctrain.device.precision`)."""
    from hpctrain.device.precision import RUN_PRECISIONS

    parser.add_argument("--precision", choices=RUN_PRECISIONS, default=default,
                        help="the precision the run trains in, as train's --precision: "
                             "activations, their moves and halos, partial sums and gradients "
                             "(and their sums, buckets included) priced at its storage size "
                             "(fp64 8 bytes; fp32 and tf32 4; bf16 and fp16 2), batch-norm "
                             "statistics at 4 bytes (8 under fp64), master weights (bf16, "
                             "fp16) and momentum at 4; --compute flops at the profile's rate "
                             "for it (flops_tf32, flops_bf16, flops_fp16; flops when it has "
                             "none); measured compute timed in it. auto: tf32 for a GPU "
                             "profile (device = \"gpu\"), fp32 otherwise, as train picks on "
                             "that device; float32 and float64 are fp32 and fp64 "
                             "(default: %(default)s)")


def planning_precision(name: str, machine: Machine) -> Precision:
    """The precision ``--precision name`` means when planning for ``machine``: auto is what a
    run on the profile's device picks (tf32 on a GPU, fp32 on the CPU)."""
    from hpctrain.device.precision import resolve_precision

    return resolve_precision(name, machine.device)


def terminal_width() -> int | None:
    """The columns of the terminal the plan is printed on, or None when standard output is a
    file or a pipe: a table written there keeps every layer name whole, however wide."""
    import shutil
    import sys

    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def run(argv: list[str]) -> int:
    import numpy as np

    from hpctrain.cost.machine import load_machine, sums_in_flight, warning_lines
    from hpctrain.device.backend import Backend
    from hpctrain.io.files import check_directory, check_output
    from hpctrain.io.textfile import existing_file
    from hpctrain.plan.accumulation import check_accumulate
    from hpctrain.plan.planner import describe_precision, format_plan, wrap_line
    from hpctrain.plan.plans import is_plan_file, plan_and_fallbacks
    from hpctrain.plan.pricing import build_cost_model, compute_source, timing_warnings
    from hpctrain.plan.spaces import plan_over, predict

    args = build_parser().parse_args(argv)
    for flag in ("procs", "batch"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} {getattr(args, flag)} must be at least 1")
    check_accumulate(args.accumulate, args.batch)
    check_space(args, [args.grid])
    net = load_net_for(args, args.procs)
    given, fell_back = (None, []) if args.grid.strip() == "auto" else plan_and_fallbacks(
        args.grid, net, args.procs)
    if args.out:  # before the planner measures anything
        check_directory(Path(args.out).parent, "--out")
        check_output(Path(args.out), "--out", is_plan_file, "an hpctrain plan file",
                     [("--net", net_file)] if (net_file := existing_file(args.net)) else [])
    machine = load_machine(args.machine)
    precision = planning_precision(args.precision, machine)
    backend = Backend(np, precision.storage, precision=precision)
    source = compute_source(machine, args.compute)
    threads = None
    if source == "measured":  # the thread set-up matters only to kernels timed here
        from hpctrain.device.threads import configure_threads

        threads = configure_threads(None, args.threads)
    overlap = sums_in_flight(args.overlap, machine)
    micro = args.batch // args.accumulate  # what runs at once, and is planned
    model = build_cost_model(net, micro, args.procs, machine, args.compute, backend,
                             threads=threads, overlap=overlap, retime=args.retime,
                             optimizer=args.optimizer, accumulate=args.accumulate)
    if given is None:
        planned = plan_over(model, args.mem_per_rank, space=args.space,
                               groups=args.branches == "auto")
    else:  # priced as given, and held to the cap as a run would be
        from hpctrain.cost.memory import check_memory

        planned = predict(model, given)
        if args.mem_per_rank is not None:
            check_memory(planned, args.mem_per_rank, "--mem-per-rank")
    width = terminal_width()
    batch = (f"batch {args.batch}" if args.accumulate == 1 else
             f"batch {args.batch} in {args.accumulate} micro-batches of {micro}")
    print(wrap_line(f"hpctrain plan: {net.name}, {args.procs} processes, {batch}, "
                    f"machine {machine.name} ({machine.describe()}), compute {source}"
                    + (f" with {threads.describe()}" if threads else ""), width))
    print(wrap_line(describe_precision(precision) + (
        f"; compute at {machine.flops_for(precision.name) / 1e12:.4g} TFLOP/s per rank"
        if source == "flops" else ""), width))
    print(wrap_line(f"batch-norm statistics: {args.bn_group}; gradient sums in "
                    f"{machine.bucket_bytes / 2**20:g} MiB buckets, "
                    + (f"in flight ({machine.overlap:g} of each may hide)" if overlap
                       else "blocking"), width))
    print(format_plan(planned, width))
    if args.accumulate > 1:
        print(wrap_line(f"a step of {args.accumulate} micro-batches: about "
                        f"{args.accumulate * planned.iteration_time * 1e3:.1f} ms (the plan is "
                        f"one micro-batch's, its gradient sums counted in each; the memory "
                        f"counts the sums of the gradients kept between micro-batches)", width))
    for line in (*warning_lines(machine), *timing_warnings(model)):
        print(wrap_line(line, width))
    for line in fell_back:  # a layer running another mode than --grid asked says why
        print(wrap_line(line, width))
    if args.out:
        from hpctrain.commands.setup import write_plan_file  # its MPI helpers: only to write a file

        write_plan_file(args.out, net, planned, args.procs, micro, machine.name)
    return 0
