"""``python -m hpctrain calibrate``: measure this machine's α–β constants and FLOP rate.

Every rank takes part. The flags say how long each sweep of message sizes is and where the
profile goes; the measurements themselves, every collective on every communicator size the
planner can meet, inside a node and between nodes, the GEMM rates, the overlap share and NIC
sharing, are :mod:`hpctrain.comm.benchmarks`, and the lines fitted to them
:mod:`hpctrain.cost.fits`. This module checks the flags and the placement on every rank at once
before anything is timed, runs the measurements, writes the profile from rank 0, fits it to a
few training steps of probe plans (:mod:`hpctrain.commands.probes`) and prints the table.
``--from-log`` measures nothing: it refits a profile to the per-layer times of run logs.

Rank 0 prints a line, flushed, as each phase starts (:class:`Progress`): on two nodes of
oversubscribed ranks the whole takes minutes, and the table comes only at the end.
"""

from __future__ import annotations

import argparse
import math
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.comm.benchmarks import (
    MIN_BYTES,
    OVERLAP_GEMM_SIZE,
    Measured,
    Sharing,
    Sweep,
    build_machine,
    far_sizes,
    measure,
    measure_flops,
    measure_levels,
    measure_overlap,
    measure_precision_flops,
)
from hpctrain.comm.nodes import LAUNCH_IN_BLOCKS, unblocked
from hpctrain.commands.flags import (
    add_collectives_option,
    add_precision_option,
    add_threads_option,
)
from hpctrain.commands.probes import PROBE_NETS, fit_to_probe_steps, parse_probe_nets
from hpctrain.cost.conditions import quiet_share, troubles, warning_text
from hpctrain.cost.machine import (
    Machine,
    is_saved_profile,
    local_profile,
    save_machine,
    warning_lines,
)
from hpctrain.errors import ArgumentParser, UserError, shown_path
from hpctrain.io.files import can_create_in
from hpctrain.io.units import bytes_from
from hpctrain.plan.stepfit import FLOOR, StepFit
from hpctrain.record.refit import PricedPlan

QUICK = {"max_bytes": 64 * 1024, "sizes": 4, "repeats": 3, "gemm_size": 512, "far_bytes": 0}
DEFAULTS = {"max_bytes": 4 * 1024 * 1024, "sizes": 8, "repeats": 10, "gemm_size": 1024,
            "far_bytes": 64 * 1024 * 1024}
GPU_GEMM_SIZE = 4096  # a GPU needs a larger GEMM than a CPU core to reach its sustained rate


class CalibrateError(UserError):
    """A calibrate option with a value that cannot be used."""


def parse_bytes(text: str, option: str = "--max-bytes") -> int:
    """Bytes from ``'4194304'``, ``'64KiB'``, ``'4M'`` or ``'1 GiB'`` (binary units, any case).

    Raises :class:`CalibrateError` naming ``option`` and ``text`` when it is not such a size.
    """
    size = bytes_from(text)
    if size is None:
        raise CalibrateError(f"{option} {text!r} is not a size; write e.g. 4194304, 64KiB "
                             f"or 4MiB")
    return int(size)


def placement_problem(ranks_per_node: int, nodes: int, even: bool, blocked: bool) -> str:
    """Why calibrate cannot measure levels on this placement (empty when it can): the ranks
    must fill equal nodes in blocks, node n holding ranks n·R … n·R + R − 1."""
    how = unblocked(even, blocked)
    if not how:
        return ""
    return (f"calibrate needs ranks to fill nodes in blocks of R (node n holding ranks n*R to "
            f"n*R+R-1), but on these {nodes} nodes {how}; {LAUNCH_IN_BLOCKS}")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m hpctrain calibrate",
        description="Measure the latency (alpha) and inverse bandwidth (beta) of the all-gather, "
                    "reduce-scatter, all-reduce, all-to-all and halo messages the training code "
                    "sends, on every communicator size the planner can use at this number of "
                    "processes, and the FLOP rate of one rank; write them as a machine profile. "
                    "Launch with the process count and placement you will train with, e.g. "
                    "'mpiexec -n 4 python -m hpctrain calibrate'.")
    parser.add_argument("--out", default=str(local_profile()), metavar="PATH",
                        help="profile to write, atomically (default: %(default)s, in "
                             "$XDG_CONFIG_HOME/hpctrain or ~/.config/hpctrain: --machine local, "
                             "which the planner reads when no machine is named)")
    parser.add_argument("--name", default="local",
                        help="name stored in the profile (default: %(default)s)")
    parser.add_argument("--max-bytes", default=None, metavar="BYTES",
                        help="largest message of each sweep, in bytes or with KiB/MiB/GiB; "
                             "larger is more accurate for bandwidth and slower "
                             f"(default: {DEFAULTS['max_bytes'] // 1024**2}MiB, "
                             f"{QUICK['max_bytes'] // 1024}KiB with --quick)")
    parser.add_argument("--far-bytes", default=None, metavar="BYTES",
                        help="largest message of a second sweep past the caches, sizes "
                             "doubling from 2x --max-bytes, where the bandwidth of large "
                             "messages is fitted (a gradient of tens of MiB moves at it); 0 for "
                             f"none (default: {DEFAULTS['far_bytes'] // 1024**2}MiB, none with "
                             "--quick)")
    parser.add_argument("--sizes", type=int, default=None, metavar="N",
                        help=f"message sizes per sweep, log-spaced from {MIN_BYTES} bytes to "
                             f"--max-bytes (default: {DEFAULTS['sizes']}, {QUICK['sizes']} with "
                             f"--quick)")
    parser.add_argument("--repeats", type=int, default=None, metavar="K",
                        help=f"timed calls per size, median kept (default: "
                             f"{DEFAULTS['repeats']}, {QUICK['repeats']} with --quick)")
    parser.add_argument("--gemm-size", type=int, default=None, metavar="N",
                        help=f"side of the square float32 GEMM timed for flops (default: "
                             f"{DEFAULTS['gemm_size']} on cpu, {GPU_GEMM_SIZE} on gpu, "
                             f"{QUICK['gemm_size']} with --quick)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="where the buffers and the GEMM live; on gpu, messages move as "
                             "--collectives says, exactly as in training (NCCL, or MPI staged "
                             "through host memory unless HPCTRAIN_CUDA_AWARE_MPI=1), and the "
                             "GEMM rate is also timed in tf32, bf16 and fp16 for the "
                             "profile's flops_tf32, flops_bf16 and flops_fp16; --precision is "
                             "what the probe nets train in (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="a rough profile in seconds: fewer, smaller sizes and repeats "
                             "(explicit options still win)")
    parser.add_argument("--probe-nets", default=None, metavar="NETS",
                        help="after the collectives and the GEMM, train a few steps of every "
                             "plan compare-plans compares on these nets (NAME[:IMAGE_SIZE],...) "
                             "and fit the profile to their per-layer times; none to skip "
                             f"(default: {PROBE_NETS}, none with --quick)")
    parser.add_argument("--from-log", nargs="+", default=None, metavar="LOG",
                        help="measure nothing: refit the profile --machine to the per-layer "
                             "times of these run logs (train --log, compare-plans --log), "
                             "compute per layer kind and the links' alpha and beta by least "
                             "squares, and write it to --out")
    parser.add_argument("--machine", default=None,
                        help="with --from-log, the profile to refit: a name or a .toml path "
                             "(default: local when calibrated, else default)")
    parser.add_argument("--check-log", nargs="+", default=None, metavar="LOG",
                        help="with --from-log, logs of other runs (other nets, best) that are "
                             "not fitted: the refit is written only if it predicts them better "
                             "than the profile it replaces (without them: the fitted logs)")
    parser.add_argument("--force", action="store_true",
                        help="with --from-log, write the refit even where it predicts worse "
                             "than the profile it replaces")
    add_collectives_option(parser)
    add_precision_option(parser)
    add_threads_option(parser)
    return parser


@dataclass(frozen=True)
class Settings:
    """Checked calibrate options."""

    out: Path
    name: str
    max_bytes: int
    sizes: int
    repeats: int
    gemm_size: int
    device: str
    far_bytes: int = 0

    @property
    def sweep(self) -> Sweep:
        """How each collective is swept (:class:`~hpctrain.comm.benchmarks.Sweep`)."""
        return Sweep(self.max_bytes, self.sizes, self.repeats, self.far_bytes)


def _settings(args: argparse.Namespace) -> Settings:
    """Options with --quick and the device defaults applied; raises CalibrateError on bad ones."""
    base = QUICK if args.quick else DEFAULTS
    max_bytes = base["max_bytes"] if args.max_bytes is None else parse_bytes(args.max_bytes)
    if not 1024 <= max_bytes <= 1024**3:
        raise CalibrateError(f"--max-bytes {args.max_bytes} must be between 1KiB and 1GiB")
    far_bytes = (base["far_bytes"] if args.far_bytes is None
                 else parse_bytes(args.far_bytes, "--far-bytes"))
    if not (far_bytes == 0 or 2 * max_bytes <= far_bytes <= 4 * 1024**3):
        raise CalibrateError(f"--far-bytes {args.far_bytes} must be 0 or between twice "
                             f"--max-bytes ({2 * max_bytes} bytes) and 4GiB")
    sizes = base["sizes"] if args.sizes is None else args.sizes
    if not 2 <= sizes <= 64:
        raise CalibrateError(f"--sizes {sizes} must be between 2 and 64 (a line needs two "
                             f"points)")
    repeats = base["repeats"] if args.repeats is None else args.repeats
    if not 1 <= repeats <= 10000:
        raise CalibrateError(f"--repeats {repeats} must be between 1 and 10000")
    gemm_size = args.gemm_size
    if gemm_size is None:
        gemm_size = base["gemm_size"] if args.quick or args.device == "cpu" else GPU_GEMM_SIZE
    if not 16 <= gemm_size <= 32768:
        raise CalibrateError(f"--gemm-size {gemm_size} must be between 16 and 32768")
    # the name is written between double quotes in TOML: keep it to characters needing no escape
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", args.name):
        raise CalibrateError(f"--name {args.name!r} must be letters, digits and _ . + - only")
    return Settings(Path(args.out), args.name, max_bytes, sizes, repeats, gemm_size, args.device,
                    far_bytes)


def _unwritable(out: Path) -> str:
    """Why rank 0 could not write ``out`` (empty when it can): checked before measuring."""
    if out.is_dir():
        return f"--out {out} is a directory; give a file path such as {out / 'local.toml'}"
    if out.is_symlink() or (out.exists() and not out.is_file()):
        return f"--out {out} is not a regular file; give the path of a new or a profile file"
    if out.exists() and not is_saved_profile(out):
        return (f"--out {out} exists and is not a profile hpctrain wrote; hpctrain replaces "
                f"only files it wrote: give a new path, or move the file aside")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    problem = f"--out {out}: cannot create files in {parent}; give --out a writable path"
    return "" if parent.is_dir() and can_create_in(parent) else problem


class Progress:
    """Rank 0's line as each phase of the measurement starts, flushed at once, with the
    seconds since the start: on two nodes of oversubscribed ranks calibrate takes minutes, and
    a job that prints nothing until its end cannot be told from one that hangs.

    Example: ``calibrate: [12 s] between nodes: allreduce on groups of 2 nodes``.
    """

    def __init__(self, rank: int) -> None:
        self.rank, self.started = rank, time.perf_counter()

    def __call__(self, phase: str) -> None:
        """Say that ``phase`` starts (rank 0 alone; the others are silent)."""
        if self.rank == 0:
            print(f"calibrate: [{time.perf_counter() - self.started:.0f} s] {phase}", flush=True)


def find_nodes(world: Any) -> Any:
    """This rank's node communicator; :class:`CalibrateError` on every rank at once when the
    ranks do not fill equal nodes in blocks (collective)."""
    from mpi4py import MPI

    from hpctrain.comm.nodes import placement

    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    where = placement(world, node)
    problem = placement_problem(where.ranks_per_node, where.nodes, where.even, where.blocked)
    if problem:  # every rank learnt the same placement: all raise together
        node.Free()
        raise CalibrateError(problem)
    return node


def format_table(results: Sequence[Measured], flops: float, device: str,
                 precision_flops: dict[str, float] | None = None) -> str:
    """The fits, one line per (collective, p), and the FLOP rates (float32, and on a GPU each
    tensor-core precision's); with a level column when some were measured between nodes."""
    levels = any(m.level != "node" for m in results)
    level = (lambda name: f"{name:<9}") if levels else (lambda name: "")
    width = max([3, *(len(m.where) for m in results)])
    lines = [f"{level('level')}{'collective':<15}{'p':>{width}}{'alpha (us)':>13}"
             f"{'1/beta (GB/s)':>15}{'knee (MiB)':>12}{'past it (GB/s)':>16}{'worst resid':>13}"]
    for m in results:
        far = (f"{m.fit.knee / 2**20:>12.3g}{1 / m.fit.far_beta / 1e9:>16.3f}"
               if math.isfinite(m.fit.knee) else f"{'-':>12}{'-':>16}")
        lines.append(f"{level(m.level)}{m.collective:<15}{m.where:>{width}}"
                     f"{m.fit.alpha * 1e6:>13.2f}"
                     f"{1 / m.fit.beta / 1e9:>15.3f}{far}{m.residual:>13.1%}"
                     f"{' *' * m.floored}")
    if not results:
        lines.append("(one rank: no messages to time)")
    if levels:
        lines.append("p: ranks of one node at the node level, nodes (one rank on each) at the "
                     "network level, KxM (K ranks on each of M nodes, whole groups) for a shape")
    if any(m.floored for m in results):
        lines.append("* alpha or beta held at its floor: the times did not follow a line "
                     "(a noisy machine?); rerun, or raise --repeats")
    lines.append(f"flops: {flops / 1e9:.1f} GFLOP/s per rank (float32 GEMM, {device})")
    lines += [f"flops_{name}: {rate / 1e9:.1f} GFLOP/s per rank ({name} GEMM, {device})"
              for name, rate in (precision_flops or {}).items()]
    return "\n".join(lines)


def run(argv: list[str], comm: Any) -> int:
    """Parse ``argv``, calibrate on every rank of ``comm``, write the profile from rank 0.

    Returns 0. Raises :class:`CalibrateError` (a :class:`~hpctrain.errors.UserError`) on every
    rank for a bad option or ranks not placed in blocks, before any message is timed.
    """
    from hpctrain.comm.agree import on_root
    from hpctrain.device.backend import make_backend
    from hpctrain.device.threads import configure_threads

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.from_log:
        _refuse_given(parser, args, MEASURING, "measures nothing with --from-log (it refits "
                                              "--machine to the logs' times)")
        return refit_from_logs(args, argv, comm)
    _refuse_given(parser, args, ("check_log", "force"), "belongs to --from-log")
    if args.machine is not None:
        raise CalibrateError("--machine names the profile to refit with --from-log; a "
                             "calibration measures its own")
    settings = _settings(args)
    probes = parse_probe_nets(args.probe_nets if args.probe_nets is not None else
                              "none" if args.quick else PROBE_NETS)
    rank, size = comm.Get_rank(), comm.Get_size()
    # only rank 0 writes, so only its view of the file system counts; share its verdict so every
    # rank raises the same error together
    problem = comm.bcast(_unwritable(settings.out) if rank == 0 else None, root=0)
    if problem:
        raise CalibrateError(problem)
    node = find_nodes(comm)
    per_node = node.Get_size()
    nodes = size // per_node
    threads = configure_threads(comm, args.threads)  # the GEMM rate is per rank at these threads
    backend = make_backend(settings.device, "fp32", comm, args.collectives)
    started = time.perf_counter()
    progress = Progress(rank)
    where = f" ({nodes} nodes of {per_node})" if nodes > 1 else ""
    progress(f"{size} ranks{where}: each collective timed at {settings.sizes} message sizes up "
             f"to {settings.max_bytes} B, median of {settings.repeats} calls" if size > 1 else
             "1 rank: no messages to time")
    sharing: Sharing | None = None
    try:
        shares = {"before measuring": quiet_share(comm, node)}
        if nodes == 1:
            results = measure(comm, backend, settings.sweep, progress)
        else:
            results, sharing = measure_levels(comm, node, backend, settings.sweep, progress)
        shares["after the collectives"] = quiet_share(comm, node)
    finally:
        node.Free()
    progress(f"FLOP rate: float32 GEMM of {settings.gemm_size}x{settings.gemm_size}")
    flops = measure_flops(comm, backend, settings.gemm_size, settings.repeats)
    if settings.device == "gpu":
        progress("FLOP rates on tensor cores: tf32, bf16 and fp16 GEMMs")
    precision_flops = measure_precision_flops(comm, backend, settings.gemm_size,
                                              settings.repeats)
    if size > 1:
        progress("overlap: a gradient sum in flight beside GEMMs")
    overlap = measure_overlap(comm, backend, OVERLAP_GEMM_SIZE, settings.repeats)
    doubts = troubles(shares, [(m.collective, m.p, m.residual) for m in results])
    machine = replace(build_machine(settings.name, settings.device, results, flops,
                                    threads.threads, overlap, per_node, sharing),
                      precision_flops=precision_flops, warning=warning_text(doubts))
    machine_measured = machine
    command = " ".join(["python -m hpctrain calibrate", *argv])
    far = far_sizes(settings.max_bytes, settings.far_bytes)
    far_note = f", {len(far)} up to {far[-1]} B past a knee" if far else ""
    comment = f"written by '{command}' on {size} processes{where}\n"
    comment += (f"on {socket.gethostname()} at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{settings.sizes} sizes from {MIN_BYTES} B to {settings.max_bytes} B"
                f"{far_note}, median of {settings.repeats} calls, GEMM {settings.gemm_size}")
    # rank 0 writes; a failed write (OutputError) is raised on every rank
    on_root(comm, lambda: save_machine(machine, settings.out, comment))
    stepped = None
    if probes:  # the profile just written predicts the probe plans it is fitted to
        stepped = fit_to_probe_steps(settings.out, machine, probes, settings.device,
                                     args.threads, comm, progress, args.precision,
                                     args.collectives)
        on_root(comm, lambda: save_machine(stepped[0], settings.out, comment + (
            f"\nthen fitted to the training steps of {stepped[1].plans} probe plans")))
        machine = stepped[0]
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(f"threads: {threads.describe()}")
        print(format_table(results, flops, settings.device, precision_flops))
        if sharing is None:
            print(f"one node ({per_node} rank{'s' if per_node > 1 else ''}): measured the node "
                  f"level only; calibrate on 2 or more nodes to measure the network between "
                  f"them")
        else:
            print(sharing.describe())
        print(f"overlap: {machine.overlap:.2f} of a gradient sum in flight moves while the "
              f"ranks compute (used with --overlap)")
        if stepped is not None:
            print(describe_fit(stepped[1], stepped[2], before=machine_measured,
                               what="the probe plans"))
        print(f"calibrated {size} rank{'s' if size > 1 else ''}{where} in {elapsed:.1f} s; wrote "
              f"{settings.out}", flush=True)
        for line in warning_lines(machine):
            print(line, flush=True)
    comm.Barrier()  # on return the profile exists for every rank that shares rank 0's files
    return 0


MEASURING = ("max_bytes", "far_bytes", "sizes", "repeats", "gemm_size", "device", "quick",
             "probe_nets", "collectives", "precision", "threads")
"""The options of a measurement, which a refit from logs would ignore."""


def _refuse_given(parser: argparse.ArgumentParser, args: argparse.Namespace,
                  names: tuple[str, ...], why: str) -> None:
    """Refuse the first option of ``names`` given a value other than its default."""
    for name in names:
        if getattr(args, name) != parser.get_default(name):
            raise CalibrateError(f"--{name.replace('_', '-')} {why}")


def refit_from_logs(args: argparse.Namespace, argv: list[str], comm: Any) -> int:
    """``calibrate --from-log``: the profile ``--machine`` refitted to the logs' per-layer
    times, written to ``--out`` by rank 0 if it predicts the check logs (``--check-log``, else
    the fitted ones) no worse than the profile it replaces, or with ``--force``; what changed,
    printed. A log given twice (the same file, or the same bytes) counts once."""
    from hpctrain.comm.agree import on_root
    from hpctrain.cost.machine import load_machine
    from hpctrain.record.measured import distinct_logs, log_identity, read_measured_plans
    from hpctrain.record.refit import errors, priced, refit

    out = Path(args.out)
    problem = comm.bcast(_unwritable(out) if comm.Get_rank() == 0 else None, root=0)
    if problem:
        raise CalibrateError(problem)
    machine = load_machine(args.machine)
    logs, repeated = distinct_logs([Path(p) for p in args.from_log])
    checks, _ = distinct_logs([Path(p) for p in args.check_log or []])
    fitted_logs = {log_identity(path) for path in logs}
    both = [path for path in checks if log_identity(path) in fitted_logs]
    if both:
        raise CalibrateError(f"--check-log {shown_path(both[0])} is also fitted (--from-log): "
                             f"a check must be a log the fit did not see")
    plans = [p for path in logs for p in read_measured_plans(path)]
    held = [p for path in checks for p in read_measured_plans(path)]
    names = ", ".join(path.name for path in logs)
    fitted, step_fit, found = refit(plans, machine, f"the per-layer times of {len(plans)} "
                                                    f"measured plans ({names})")
    fitted = replace(fitted, name=args.name)
    judged = [priced(p, machine) for p in held] if held else found
    what = (f"the {len(held)} plans of --check-log" if held else "the fitted plans")
    before = float(np.median(np.abs(errors(judged, machine))))
    after = float(np.median(np.abs(errors(judged, machine, step_fit))))
    verdict = (f"median iteration error on {what}: {before:.1%} with {machine.name}, "
               f"{after:.1%} refitted")
    worse = after > before
    if worse and not args.force:
        raise CalibrateError(f"the refit predicts worse than {machine.name} ({verdict}); "
                             f"nothing written: refit from more plans (other layouts, other "
                             f"nets), or --force to write it anyway")
    command = " ".join(["python -m hpctrain calibrate", *argv])
    comment = (f"written by '{command}' at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
               f"{machine.name} refitted to {len(plans)} measured plans")
    on_root(comm, lambda: save_machine(fitted, out, comment))
    if comm.Get_rank() == 0:
        for path, kept in repeated:
            print(f"{shown_path(path)} is {shown_path(kept)} again: counted once")
        print(f"refitted {machine.name} to {step_fit.layers} layer times of {len(plans)} "
              f"plans ({names})")
        for plan in plans:
            if plan.unfinished:
                print(plan.unfinished_words)
        print(describe_fit(step_fit, found, machine, "these plans"))
        print(verdict + (": worse, written anyway (--force)" if worse else ""))
        print(f"wrote {out}", flush=True)
    comm.Barrier()
    return 0


def describe_fit(step_fit: StepFit, found: list[PricedPlan], before: Machine, what: str) -> str:
    """What a fit to training steps changed, and the iteration errors of the plans fitted
    (on ``before``, then fitted), in lines."""
    from hpctrain.model.kinds import BEYOND_CACHE
    from hpctrain.record.refit import errors

    x = step_fit.links
    lines = [f"fitted to {step_fit.layers} layer times of {step_fit.plans} plans: alpha x "
             f"{x[0]:.3g}, beta x {x[1]:.3g} inside a node"
             + (f"; alpha x {x[2]:.3g}, beta x {x[3]:.3g} between nodes"
                if before.levelled else "")
             + (f" (x {FLOOR:g}: the least a fit gives, where the steps measured too little to "
                f"tell)" if FLOOR in x else "")]
    lines.append(f"factors pulled towards 1 (the microbenchmarks) by {step_fit.pull:g}: the "
                 f"pull that predicted each net best from the others"
                 if step_fit.pull else "factors as the steps alone put them (no pull "
                                       "towards the microbenchmarks)")
    lines.append(f"work touching more than {step_fit.cache_bytes / 2**20:.3g} MiB per rank ran "
                 f"as from memory: its factors are fitted apart ('{BEYOND_CACHE.strip()}')"
                 if step_fit.cache_bytes else "one set of compute factors fits work of every "
                                              "size")
    lines += [f"compute of {kind}: forward x {f:.3g}, backward x {b:.3g}"
              for kind, (f, b) in sorted(step_fit.compute.items())]
    floored = [f"{kind} {direction}" for kind, both in sorted(step_fit.compute.items())
               for direction, factor in zip(("forward", "backward"), both, strict=True)
               if factor <= FLOOR]
    if floored:
        lines.append(f"clamped at x {FLOOR:g}, the least a fit gives (the steps measured too "
                     f"little of them to tell): compute of {', '.join(floored)}")
    was, now = np.abs(errors(found, before)), np.abs(errors(found, before, step_fit))
    lines.append(f"iteration prediction error of {what}: median {np.median(was):.1%} before, "
                 f"{np.median(now):.1%} after (fitted on them: validate on other nets with "
                 f"compare-plans)")
    return "\n".join(lines)
