"""``python -m hpctrain [train options]``: the training command.

Rank 0 reads and checks every option and every file they name before anything collective
(see :func:`~hpctrain.comm.agree.agreed`); then the threads, backend and plan are set up
(:mod:`hpctrain.commands.setup`), the run log is opened, and :func:`hpctrain.run.loop.train` runs.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.comm.agree import agreed
from hpctrain.commands.flags import (
    NoteGiven,
    add_init_options,
    add_optimizer_options,
    add_overlap_option,
    add_planning_options,
    add_precision_option,
    add_run_options,
    check_space,
    class_weights,
    optimizer_choice,
    with_init,
)
from hpctrain.commands.setup import Setup, SetupRequest, set_up
from hpctrain.cost.machine import BUCKET_BYTES
from hpctrain.data.augment import AUGMENT_MODES, check_augment
from hpctrain.errors import ArgumentParser, OutputError, UserError
from hpctrain.interchange.nets import load_network, net_for_dataset
from hpctrain.model.net import NetSpec
from hpctrain.record.timeline import parse_window
from hpctrain.run.loss_scale import GROWTH_INTERVAL, INITIAL_SCALE

TIMINGS_EVERY = 100  # the default --timings-every

if TYPE_CHECKING:  # the readers import h5py and MPI: only when a command runs
    from hpctrain.data.dataset_format import DatasetInfo
    from hpctrain.plan.planner import PlannedNetwork
    from hpctrain.record.runlog import RunLog
    from hpctrain.run.checkpoint import CheckpointInfo
    from hpctrain.run.loop import TrainConfig, TrainResult
    from hpctrain.run.schedule import Schedule


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m hpctrain",
        description="Train a network on P MPI processes with per-layer batch, model (1.5D) and "
                    "domain parallelism. Launch with mpiexec -n P or srun (or plain python for "
                    "one process). Other commands (each with --help): verify, plan, calibrate, "
                    "simulate, compare-plans, convert.",
        epilog="On SIGTERM or SIGUSR1 (sbatch --signal=USR1@120) every rank stops after the "
               "same step, writes a checkpoint to --checkpoint-dir and exits with status 0; "
               "one that comes while the run starts up or plans stops every rank before the "
               "first step, also with status 0 ('stopped by SIGTERM before training'). "
               "Exit status: 0 done or stopped; 1 a crash on some rank; 2 bad input (options, "
               "files, NaN or Inf in the data or a checkpoint), before any work, with one line "
               "naming the fix; 3 a result (checkpoint, log, plan file) could not be written, "
               "with one line naming the file and the reason. Outputs are new files or files "
               "hpctrain wrote: anything else at an output path (a directory, FIFO, device, "
               "link, another file, an input) is refused.")
    add_run_options(parser)
    training = parser.add_argument_group("the run")
    training.add_argument("--data", default="synthetic",
                          help="'synthetic' (deterministic ImageNet-shaped data from --seed) or an "
                               "HDF5 dataset (see README; make one with 'python -m hpctrain "
                               "convert'); a dataset sets the image size unless --image-size is "
                               "given (default: %(default)s)")
    training.add_argument("--batch", type=int, default=32, help="global mini-batch (default: 32)")
    training.add_argument("--accumulate", type=accumulation, default=1, metavar="K",
                          help="K micro-batches of batch/K samples per step, their gradients "
                               "summed, then one update: the step of the whole --batch in the "
                               "memory of a micro-batch, which is what is planned; each "
                               "micro-batch's loss counts 1/K and batch norm takes each "
                               "micro-batch's statistics, as PyTorch accumulating does. auto "
                               "(with --grid auto and --mem-per-rank): the fewest micro-batches "
                               "whose plan fits the cap, 1 where the whole batch fits "
                               "(default: 1)")
    add_init_options(training)
    training.add_argument("--classes", type=int, default=None, metavar="N",
                          help="train the net for a dataset of N classes: the width (out=) of "
                               "the layer that gives its classes, the last (or the one before "
                               "an upsampling or a pooling to 1x1), becomes N, its weights "
                               "drawn from --seed (with --init, name it in --init-except): "
                               "the fine-tune of pretrained weights is --init FILE --classes "
                               "10 --init-except fc. Checkpoints and the log keep the changed "
                               "net, and a "
                               "--resume takes the checkpoint's classes (default: the net's)")
    training.add_argument("--augment", default="none", choices=AUGMENT_MODES,
                          help="random per-sample augmentation of training images: flip "
                               "(horizontal, probability 1/2), crop (a random HxW window of the "
                               "image zero-padded by 4 pixels), standard (crop and flip) or none; "
                               "drawn from --seed, the epoch and the sample, so every plan and "
                               "number of processes trains on the same images; held-out data is "
                               "never augmented; a segmentation's label maps are flipped and "
                               "cropped with their images (default: %(default)s)")
    training.add_argument("--class-weights", type=class_weights, default=None,
                          metavar="W1,W2,...",
                          help="a segmentation net's loss weighted per class, one weight per "
                               "class: the mean over every counted pixel of the batch of "
                               "w[label]·cross-entropy over the sum of w[label], as PyTorch's "
                               "cross_entropy(weight=w) (default: all 1)")
    training.add_argument("--label-smoothing", type=float, default=0.0, metavar="S",
                          help="train the cross-entropy towards (1 - S)·onehot(label) + S/K "
                               "over the K classes, as PyTorch's CrossEntropyLoss("
                               "label_smoothing=S), a segmentation's per-pixel loss with its "
                               "--class-weights too; the held-out loss is the same loss; from "
                               "0 to 1 (default: 0)")
    training.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=True,
                          help="read the next batch of --data in a background thread while "
                               "each step computes; the log records the time a step waits for "
                               "its data (default: on)")
    length = training.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=None,
                        help="train until this many steps are done (default: 10)")
    length.add_argument("--epochs", type=float, default=None,
                        help="train this many passes over a dataset's training split (each "
                             "epoch is floor(N / batch) steps of a fresh shuffle)")
    training.add_argument("--lr", type=float, default=0.01, help="learning rate (default: 0.01)")
    training.add_argument("--lr-schedule", default="constant",
                          help="constant, cosine (to 0 at the last step), step:EVERY:FACTOR "
                               "(e.g. step:100:0.1) or poly, the polynomial decay of the LARS "
                               "recipes (to 0 at the last step, as PyTorch's PolynomialLR), "
                               "each after the warm-up (default: %(default)s)")
    training.add_argument("--poly-power", type=float, default=None, metavar="P",
                          help="--lr-schedule poly: lr · (1 - t/T)^P over the T steps after "
                               "the warm-up (default: 2, as MLPerf's LARS recipe)")
    training.add_argument("--warmup-steps", type=int, default=0,
                          help="ramp the rate linearly over the first N steps (default: 0)")
    add_precision_option(training)
    training.add_argument("--dtype", dest="precision", choices=("float32", "float64"),
                          default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # older spelling
    training.add_argument("--loss-scale", type=float, default=INITIAL_SCALE, metavar="S",
                          action=NoteGiven,
                          help="--precision fp16: the first loss scale; it halves on each "
                               "overflowed step (skipped on every rank) and doubles after "
                               f"{GROWTH_INTERVAL} clean steps (default: 2**16)")
    add_overlap_option(training)
    training.add_argument("--timeline", default=None, metavar="FIRST:LAST",
                          help="record every rank's compute, communication and redistribution "
                               "spans of steps FIRST to LAST (from 1) into the --log file; draw "
                               "them with analysis/timeline.py (a PNG and a Chrome trace)")
    training.add_argument("--eval-every", type=int, default=None,
                          help="held-out accuracy (mean squared error for a regression) every "
                               "N steps, when the dataset has a val split (default: every "
                               "epoch, and always at the end)")
    add_optimizer_options(parser)
    planning = parser.add_argument_group("planning")
    add_planning_options(planning)
    planning.add_argument("--plan-file", default=None,
                          help="where --grid auto writes its plan, which --grid accepts "
                               "(default: runs/NET-pP-bB-sSIZE-PRECISION.plan)")
    planning.add_argument("--replan-after", type=int, default=None, metavar="K",
                          help="with --grid auto: after K steps compare the measured step "
                               "with the prediction; where they differ by more than "
                               "--replan-threshold, refit the profile to those steps' "
                               "per-layer times, plan again, and switch plans at that step "
                               "(through its checkpoint: needs --checkpoint-dir) when the new "
                               "one is predicted at least 5%% faster; the log says what changed "
                               "and why (default: never)")
    planning.add_argument("--replan-threshold", type=float, default=None, metavar="FRACTION",
                          help="the prediction error past which --replan-after refits "
                               "(default: 0.1)")
    planning.add_argument("--plan-only", action="store_true",
                          help="print the plan with its predicted times (and write the plan file "
                               "for --grid auto), then exit without training")
    output = parser.add_argument_group("output")
    output.add_argument("--log", default=None,
                        help="HDF5 run log written by rank 0 and flushed every step: config, "
                             "plan, loss, accuracy, per-layer times and bytes (layout in "
                             "README); an existing log of an earlier run is renamed aside "
                             "(run.h5 -> run.1.h5), or continued with --resume")
    output.add_argument("--timings-every", type=int, default=TIMINGS_EVERY, metavar="N",
                        action=NoteGiven,
                        help="with --log: write the per-layer times measured so far (/layers, "
                             "/iteration: the medians over the steps timed) into the log every "
                             "N steps and at each checkpoint, in place, so that the log of a "
                             "run killed on the way still holds them for 'calibrate "
                             "--from-log'; a long run writes them at most every 1/16 of its "
                             "steps (each write takes a median over all of them); 0: only at "
                             "the end (default: %(default)s)")
    output.add_argument("--print-every", type=int, default=1,
                        help="progress line every N steps (default: 1)")
    output.add_argument("--checkpoint-dir", default=None,
                        help="write HDF5 checkpoints here (atomically, as step-NNNNNNNN.h5): "
                             "at the end, on SIGTERM/SIGUSR1, and every --checkpoint-every "
                             "steps (default: none)")
    output.add_argument("--checkpoint-every", type=int, default=0,
                        help="also checkpoint every N steps (default: 0, never)")
    output.add_argument("--keep-checkpoints", type=int, default=2, action=NoteGiven,
                        help="keep the newest N checkpoints (default: 2)")
    output.add_argument("--resume", nargs="?", const="latest", default=None,
                        help="continue from a checkpoint file or directory (its newest), on "
                             "any P and plan; bare --resume takes the newest in "
                             "--checkpoint-dir and starts afresh when there is none")
    return parser


@dataclass
class Prepared:
    """What rank 0 reads and checks before anything collective (see
    :func:`~hpctrain.comm.agree.agreed`)."""

    net: NetSpec
    dataset: DatasetInfo | None  # None for synthetic data
    resume: Path | None  # the checkpoint to resume from
    info: CheckpointInfo | None  # what it says
    seed: int
    steps: int
    schedule: Schedule
    eval_every: int
    timeline: tuple[int, int] | None  # --timeline FIRST:LAST
    accumulate: int = 1  # --accumulate's micro-batches per step (auto's, decided)


def _prepare(args: argparse.Namespace, procs: int) -> Prepared:
    """Every check of the options and the files they name, before planning (rank 0)."""
    from hpctrain.plan.accumulation import check_accumulate
    from hpctrain.run.checkpoint import check_optimizer, resume_from
    from hpctrain.run.optimizer import check as check_rates
    from hpctrain.run.schedule import parse_schedule

    for flag in ("steps", "print_every", "eval_every", "checkpoint_every", "keep_checkpoints",
                 "timings_every"):
        value = getattr(args, flag)
        least = 0 if flag in ("checkpoint_every", "timings_every") else 1
        if value is not None and value < least:
            raise UserError(f"--{flag.replace('_', '-')} {value} must be >= {least}")
    if args.batch < 1:
        raise UserError(f"--batch {args.batch} must be at least 1")
    check_accumulate(args.accumulate, args.batch)
    if args.epochs is not None and not args.epochs > 0:
        raise UserError(f"--epochs {args.epochs} must be positive")
    if args.checkpoint_every and not args.checkpoint_dir:
        raise UserError("--checkpoint-every needs --checkpoint-dir DIR")
    if getattr(args, "keep_checkpoints_given", False) and not args.checkpoint_dir:
        raise UserError(f"--keep-checkpoints {args.keep_checkpoints} says how many checkpoints "
                        f"--checkpoint-dir keeps; give --checkpoint-dir DIR too")
    if args.plan_file is not None and not (args.grid and args.grid.strip() == "auto"):
        raise UserError(f"--plan-file {args.plan_file} says where --grid auto writes its plan; "
                        f"with {'--grid ' + args.grid if args.grid else 'no --grid'} nothing "
                        f"is planned (to run a plan file, give --grid FILE)")
    if getattr(args, "timings_every_given", False) and not args.log:
        raise UserError(f"--timings-every {args.timings_every} says how often the per-layer "
                        f"times are written to the run log; give --log FILE.h5 too")
    _check_loss_scale(args)
    momentum, _ = optimizer_choice(args)
    check_rates(args.lr, momentum, args.weight_decay)
    net = load_network(args.net, args.image_size, args.loss)
    net, dataset = _dataset_net(args, net.with_classes(_classes(args, net)))
    net = net.with_statistics(args.bn_group, procs).with_class_weights(args.class_weights)
    net = net.with_label_smoothing(args.label_smoothing)
    check_augment(args.augment, net.name, net.input_shape,
                  dataset.sample_shape if dataset else None, args.batch)
    epoch = dataset.train_size // args.batch if dataset else None
    if args.epochs is not None:
        if epoch is None:
            raise UserError("--epochs needs a dataset (--data PATH.h5); synthetic data has no "
                            "epochs, use --steps")
        steps = max(1, int(args.epochs * epoch + 0.5))
    else:
        steps = args.steps or 10
    _check_replan(args, steps)
    check_space(args, [args.grid])
    timeline = None if args.timeline is None else parse_window(args.timeline)
    if timeline is not None:
        if not args.log:
            raise UserError(f"--timeline {args.timeline} needs --log FILE.h5: the spans are "
                            f"written to the run log")
        if timeline[1] > steps:
            raise UserError(f"--timeline {args.timeline} ends after the last step ({steps}); "
                            f"give LAST <= {steps}")
    if args.eval_every and not (dataset and dataset.val_size):
        raise UserError(f"--eval-every {args.eval_every} needs a dataset with a held-out split "
                        f"(/val); --data {args.data} has none")
    schedule = parse_schedule(args.lr_schedule, args.lr, steps, args.warmup_steps,
                              args.poly_power)
    resume, info = resume_from(args.resume, args.checkpoint_dir, args.seed, args.batch, net)
    if info is not None:
        check_optimizer(info, args.optimizer)
    if resume is not None and args.init is not None:
        if args.resume != "latest":
            raise UserError(f"--init {args.init} gives starting weights, but the run resumes "
                            f"from {resume}, whose weights it continues; drop --init or start "
                            f"afresh")
        # a requeued job's bare --resume: --init started the run, the checkpoint continues it
        print(f"--init {args.init} is not read: the run resumes from {resume}", flush=True)
    net = with_init(args, net) if resume is None else replace(net, weights=None)
    accumulate = _accumulation(args, net, procs)
    _check_writable(args, net, procs, resume, args.batch // accumulate)
    seed = info.seed if info else (0 if args.seed is None else args.seed)
    eval_every = args.eval_every if args.eval_every is not None else (epoch or 0)
    return Prepared(net, dataset, resume, info, seed, steps, schedule, eval_every, timeline,
                    accumulate)


def _classes(args: argparse.Namespace, net: NetSpec) -> int | None:
    """``--classes``, or, resuming without it, the classes of the checkpoint's net where they
    differ from ``net``'s (a run started with ``--classes``; said on a line); else None."""
    if args.classes is not None or args.resume is None:
        return args.classes
    from hpctrain.run.checkpoint_file import (
        CheckpointError,
        checkpoint_net,
        latest_checkpoint,
        resolve_resume,
    )

    try:
        path = (resolve_resume(Path(args.resume)) if args.resume != "latest"
                else latest_checkpoint(Path(args.checkpoint_dir)) if args.checkpoint_dir
                else None)
        written = checkpoint_net(path) if path is not None else None
    except CheckpointError:  # resume_from says what is wrong with it
        return None
    if written is None or written.classes == net.classes or net.regression:
        return None
    print(f"--classes {written.classes}: the net of {path} gives {written.classes} classes, "
          f"not {net.name}'s {net.classes}", flush=True)
    return written.classes


def accumulation(text: str) -> int | str:
    """``--accumulate``: auto or a whole number (checked against --batch later)."""
    if text.strip() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of micro-batches, such "
                                         f"as 4, or auto") from None


def _accumulation(args: argparse.Namespace, net: NetSpec, procs: int) -> int:
    """``--accumulate``'s K: as given, or for auto the fewest micro-batches whose plan fits
    ``--mem-per-rank`` (said on a line); arithmetic only, nothing timed (rank 0)."""
    if args.accumulate != "auto":
        return args.accumulate
    if not (args.grid and args.grid.strip() == "auto" and args.mem_per_rank is not None):
        raise UserError("--accumulate auto picks the fewest micro-batches whose plan fits "
                        "the memory cap; give --grid auto and --mem-per-rank SIZE, or a "
                        "number of micro-batches")
    from hpctrain.cost.machine import load_machine, sums_in_flight
    from hpctrain.device.precision import resolve_precision
    from hpctrain.io.units import format_bytes
    from hpctrain.plan.accumulation import fewest_micro_batches

    machine = load_machine(args.machine)
    cap = args.mem_per_rank
    found = fewest_micro_batches(net, args.batch, procs, machine,
                                 resolve_precision(args.precision, args.device), cap,
                                 args.space, sums_in_flight(args.overlap, machine),
                                 optimizer=args.optimizer)
    if found is None:
        raise UserError(f"--accumulate auto: no plan fits --mem-per-rank {format_bytes(cap)}"
                        f" even with micro-batches of one sample; use more processes, a "
                        f"smaller --image-size, or raise --mem-per-rank if the memory is "
                        f"there")
    if found > 1:
        print(f"--accumulate auto: {found} micro-batches of {args.batch // found} per step "
              f"(no plan of the whole batch {args.batch} fits --mem-per-rank "
              f"{format_bytes(cap)})", flush=True)
    return found


def _refusal_with_accumulation(err: Exception, args: argparse.Namespace, net: NetSpec,
                               procs: int, accumulate: int) -> Exception:
    """``err``, the planner's refusal of ``--mem-per-rank``, naming the fewest micro-batches
    whose plan fits it (arithmetic only, the same on every rank); a refusal of the batch under
    ``accumulate`` > 1 saying that it is the micro-batch's; ``err`` itself otherwise."""
    from hpctrain.plan.planner import PlannerError

    micro = args.batch // accumulate
    if accumulate > 1 and f"batch {micro} " in str(err):
        return UserError(f"{err} (batch {micro} is the micro-batch, --batch {args.batch} / "
                         f"--accumulate {accumulate}: lower --accumulate)")
    if not (isinstance(err, PlannerError) and args.mem_per_rank is not None
            and str(err).startswith("no plan fits in --mem-per-rank")):
        return err
    from hpctrain.cost.machine import load_machine, sums_in_flight
    from hpctrain.device.precision import resolve_precision
    from hpctrain.plan.accumulation import fewest_micro_batches

    machine = load_machine(args.machine)
    found = fewest_micro_batches(net, args.batch, procs, machine,
                                 resolve_precision(args.precision, args.device),
                                 args.mem_per_rank, args.space,
                                 sums_in_flight(args.overlap, machine), least=accumulate + 1,
                                 optimizer=args.optimizer)
    if found is None:
        return err
    return PlannerError(f"{err}; or keep --batch {args.batch} in micro-batches: "
                        f"--accumulate {found} ({args.batch // found} samples each) fits "
                        f"(--accumulate auto picks it)")


def _check_loss_scale(args: argparse.Namespace) -> None:
    """``--loss-scale``: under fp16 alone (no other precision scales its loss), and a number
    the float32 loss can be multiplied by without overflowing to inf (every step would be
    skipped)."""
    import numpy as np

    from hpctrain.device.precision import resolve_precision

    scale = args.loss_scale
    if not getattr(args, "loss_scale_given", False):
        return
    precision = resolve_precision(args.precision, args.device).name
    if precision != "fp16":
        raise UserError(f"--loss-scale {scale:g} scales the loss under --precision fp16 only; "
                        f"{precision} has the range of float32 and needs none")
    if not 0 < scale <= float(np.finfo(np.float32).max):
        raise UserError(f"--loss-scale {scale:g} must be a positive number a float32 holds "
                        f"(the loss is scaled in float32; 2**16 = 65536 is the usual start)")


def _check_replan(args: argparse.Namespace, steps: int) -> None:
    """``--replan-after`` and ``--replan-threshold`` with what they need."""
    if args.replan_threshold is not None and args.replan_after is None:
        raise UserError("--replan-threshold is the error past which --replan-after K refits; "
                        "give --replan-after K too")
    if args.replan_after is None:
        return
    if not (args.grid and args.grid.strip() == "auto"):
        raise UserError(f"--replan-after {args.replan_after} plans again as --grid auto does; "
                        f"give --grid auto")
    if not 2 <= args.replan_after < steps:
        raise UserError(f"--replan-after {args.replan_after} must be from 2 (the first step "
                        f"is a warm-up) to {steps - 1}, below the last step ({steps})")
    if args.accumulate != 1:
        raise UserError(f"--replan-after {args.replan_after} compares a step with the plan's "
                        f"prediction, which is of one micro-batch under --accumulate "
                        f"{args.accumulate}; drop one of them")
    if not args.checkpoint_dir:
        raise UserError(f"--replan-after {args.replan_after} switches plans through the "
                        f"checkpoint of that step; give --checkpoint-dir DIR")
    threshold = args.replan_threshold
    if threshold is not None and not 0 <= threshold < 10:
        raise UserError(f"--replan-threshold {threshold} must be a fraction from 0 (always "
                        f"refit) to below 10")


def _check_writable(args: argparse.Namespace, net: NetSpec, procs: int,
                    resume: Path | None, micro_batch: int) -> None:
    """Refuse an output path that cannot be written now, not after the training, or that is
    not ours to write (see :mod:`hpctrain.io.files`); clear a crash's temporaries from the
    checkpoint directory. ``micro_batch``: what --grid auto plans (its plan file's name)."""
    from hpctrain.commands.setup import plan_file_path
    from hpctrain.device.precision import resolve_precision
    from hpctrain.io.files import check_directory, check_output
    from hpctrain.plan.plans import is_plan_file
    from hpctrain.record.runlog import check_log_path
    from hpctrain.run.checkpoint import remove_temporaries

    inputs = _inputs(args, resume)
    if args.log:
        check_directory(Path(args.log).parent, "--log")
        check_log_path(Path(args.log), inputs, resuming=args.resume is not None)
    if args.grid and args.grid.strip() == "auto":
        plan_file = plan_file_path(args.plan_file, net, procs, micro_batch,
                                   resolve_precision(args.precision, args.device).name)
        check_directory(plan_file.parent, "--plan-file")
        check_output(plan_file, "--plan-file", is_plan_file, "an hpctrain plan file", inputs)
    if args.checkpoint_dir:
        check_directory(Path(args.checkpoint_dir), "--checkpoint-dir")
        if Path(args.checkpoint_dir).is_dir():
            remove_temporaries(Path(args.checkpoint_dir))


def _inputs(args: argparse.Namespace, resume: Path | None) -> list[tuple[str, Path]]:
    """(flag, path) of every file this run reads: no output may be one of them."""
    from hpctrain.cost.machine import local_profile, user_machines_dir
    from hpctrain.io.textfile import existing_file

    named = [("--data", args.data if args.data != "synthetic" else None), ("--net", args.net),
             ("--grid", args.grid), ("--resume", resume), ("--init", args.init),
             ("--machine", args.machine or local_profile())]
    if args.machine and "/" not in args.machine:
        named.append(("--machine", user_machines_dir() / f"{args.machine}.toml"))
    # existing_file: a value too long to name a file (a --grid spec) is simply not a file here
    return [(flag, found) for flag, path in named if path and (found := existing_file(str(path)))]


def _dataset_net(args: argparse.Namespace, net: NetSpec) -> tuple[NetSpec, DatasetInfo | None]:
    """(``net`` at the dataset's image size, the dataset's description) for ``--data``, or
    (``net``, None) for synthetic data. Refuses a dataset that does not fit the net; a flat-input
    net takes (C, H, W) samples of as many values, flattened (``--net mlp`` on the digits)."""
    if args.data == "synthetic":
        return net, None
    from hpctrain.data.dataset_fit import check_label_maps
    from hpctrain.data.dataset_format import inspect_dataset

    info = inspect_dataset(args.data)
    net = net_for_dataset(net, info, args.image_size is None, args.batch)
    check_label_maps(info, net.per_pixel, net.name)
    return net, info


def run(argv: list[str], comm, stop=None) -> int:
    """The training command; ``stop``: StopRequests already recording (since start-up), else
    recording starts here. A signal before the first step stops every rank there, status 0."""
    from contextlib import nullcontext

    from hpctrain.run.signals import StopRequests

    args = build_parser().parse_args(argv)
    with nullcontext(stop) if stop else StopRequests() as stop:
        return _train_command(args, argv, comm, stop)


def _stopped_before_training(stop, comm) -> bool:
    """Collective: whether any rank was asked to stop; rank 0 says so."""
    from hpctrain.run.loop import BEFORE_TRAINING

    signame = stop.agreed(comm)
    if signame and comm.Get_rank() == 0:
        print(f"stopped by {signame} {BEFORE_TRAINING}", flush=True)
    return signame is not None


def _peak_line(peak: float, memory: float, measured: str, timed: str) -> str:
    """The line that sets the measured peak memory per rank beside the predicted one. A
    process's high-water mark cannot be lowered: one that held more before this run (a run
    inside a longer-lived process) measures no growth, and says so instead of a ratio."""
    if peak <= 0:
        return (f"peak memory per rank: {memory / 2**20:.1f} MiB predicted, none measured "
                f"({measured}: none; the process held more before this run{timed})")
    return (f"peak memory per rank: {peak / 2**20:.1f} MiB measured, "
            f"{memory / 2**20:.1f} MiB predicted ({memory / peak - 1:+.1%}; {measured}{timed})")


def _train_command(args: argparse.Namespace, argv: list[str], comm, stop) -> int:
    from hpctrain.comm.agree import on_root
    from hpctrain.commands.replan import replan_after_step
    from hpctrain.cost.memory import baseline_bytes, measured_peak
    from hpctrain.plan.planner import format_plan
    from hpctrain.run.loop import TrainConfig, train
    from hpctrain.run.sources import open_sources

    rank = comm.Get_rank()
    baseline = baseline_bytes()  # the interpreter and its libraries, before any array of ours
    prepared = agreed(comm, lambda: _prepare(args, comm.Get_size()))
    if _stopped_before_training(stop, comm):  # skip planning, which may measure for a while
        return 0
    request = SetupRequest.from_flags(args, args.precision, args.overlap, args.plan_file,
                                      prepared.steps)
    accumulate = prepared.accumulate
    # the micro-batch is planned, each parameter keeping the sum of its gradients too
    request = replace(request, batch=args.batch // accumulate, accumulate=accumulate)
    try:
        setup = set_up(request, prepared.net, comm)
    except UserError as err:
        raise _refusal_with_accumulation(err, args, prepared.net, comm.Get_size(),
                                         accumulate) from None
    if rank == 0:
        print(f"threads: {setup.threads.describe()}", flush=True)
        print(format_plan(setup.planned), flush=True)
        for line in setup.warnings:
            print(line, flush=True)
    if args.plan_only:
        return 0
    sources = open_sources(comm, setup.backend, setup.net, args.batch, prepared.seed,
                           args.augment, args.data, prepared.dataset)
    momentum, optimizer = optimizer_choice(args)  # checked by _prepare
    config = TrainConfig(args.batch, prepared.steps, args.lr, momentum, args.weight_decay,
                         prepared.seed, args.print_every, prepared.schedule, prepared.eval_every,
                         Path(args.checkpoint_dir) if args.checkpoint_dir else None,
                         args.checkpoint_every, args.keep_checkpoints, setup.overlap,
                         bucket_bytes=(setup.machine.bucket_bytes if setup.machine
                                       else BUCKET_BYTES),
                         timeline=prepared.timeline, prefetch=args.prefetch,
                         loss_scale=args.loss_scale,
                         timings_every=args.timings_every if args.log else 0,
                         optimizer=optimizer, accumulate=accumulate)
    log = None
    if args.log:  # rank 0 writes it; a failure to create it stops every rank
        log = on_root(comm, lambda: _open_log(args, argv, setup, comm.Get_size(), config,
                                              prepared.info.step if prepared.info else None))
    planned = setup.planned
    first = prepared.info.step if prepared.info else 0
    replan_at = args.replan_after if args.replan_after and first < args.replan_after else None
    if args.replan_after and replan_at is None and rank == 0:
        print(f"--replan-after {args.replan_after}: the run resumes at step {first}, past it; "
              f"the plan is kept", flush=True)
    try:
        run_to = replace(config, steps=replan_at) if replan_at else config
        result = train(setup.net, setup.plan, run_to, setup.backend, comm, data=sources.train,
                       val_data=sources.val, log=log, resume=prepared.resume, stop=stop)
        if replan_at and result.losses and not result.stopped_by:
            planned = replan_after_step(request, setup, replan_at, result,
                                        args.replan_threshold, comm, log, bool(args.log))
            result = train(setup.net, planned.plans, config, setup.backend, comm,
                           data=sources.train, val_data=sources.val, log=log,
                           resume=result.checkpoint, stop=stop)
    except BaseException as err:
        if log is not None:
            with contextlib.suppress(OutputError):  # the error that stopped it comes first
                log.finish(f"failed: {err}")
        raise
    finally:
        sources.close()
    if rank == 0 and result.losses:
        # under accumulation the plan is one micro-batch's; a step runs K of them
        predicted = planned.iteration_time * accumulate
        error = predicted / result.iteration - 1
        each = (f" ({accumulate} micro-batches of {planned.iteration_time * 1e3:.1f} ms, the "
                f"gradient sums counted in each)" if accumulate > 1 else "")
        print(f"iteration: predicted {predicted * 1e3:.1f} ms{each}, measured "
              f"{result.iteration * 1e3:.1f} ms ({error:+.1%})", flush=True)
    # collective: every rank reports its own
    peak, measured = measured_peak(comm, baseline, setup.backend.device_memory_held())
    if rank == 0 and result.losses:
        # the peak is a high-water mark: kernels timed while planning count in it too
        timed = (f"; includes {setup.kernels_timed} kernels timed while planning"
                 if setup.kernels_timed else "")
        memory = planned.memory if planned is not setup.planned else setup.memory
        print(_peak_line(peak, memory, measured, timed), flush=True)
    if args.log:
        on_root(comm, lambda: _finish_log(log, result, planned))
    return 0


def _finish_log(log: RunLog, result: TrainResult, planned: PlannedNetwork) -> None:
    """Rank 0: the log's final status and summary; :class:`~hpctrain.errors.OutputError` when any of
    its writes failed."""
    result.finish_log(log, planned)
    print(f"log written to {log.path}", flush=True)


def _open_log(args: argparse.Namespace, argv: list[str], setup: Setup, procs: int,
              config: TrainConfig, resume_step: int | None) -> RunLog:
    """Rank 0's run log, with everything needed to know what ran where."""
    from hpctrain.record.runlog import RunLog, run_attributes

    momentum = config.momentum if config.optimizer.name in ("sgd", "lars") else None
    options = dict(vars(args), steps=config.steps, seed=config.seed, momentum=momentum,
                   accumulate=config.accumulate,
                   eval_every=config.eval_every, learning_rate=config.schedule.describe())
    attrs = run_attributes(["python", "-m", "hpctrain", *argv], options, procs, setup.net,
                           setup.plan, setup.planned, setup.backend, setup.threads, setup.machine)
    rows = [layer.name for layer in setup.net.layers] + ["loss"]
    log = RunLog(Path(args.log), attrs, setup.planned, rows, resume_step)
    if log.rotated is not None:
        print(f"the earlier log {log.path} was renamed to {log.rotated}", flush=True)
    return log
