"""The training loop: build, then forward / loss / backward / SGD step, with progress, held-out
evaluation, checkpoints, a step-by-step log, and a clean stop on SIGTERM or SIGUSR1.

Every step is timed per layer (:mod:`hpctrain.record.timing`); at the end rank 0 prints the median
over the steps after the first (which pays one-off allocation and warm-up), the largest over ranks.
Timing costs a few clock reads per layer on the CPU; on a GPU one device event per reading,
read once at the end of the step (one wait). With ``TrainConfig.timings_every`` the same
medians of the steps so far go into the log as the run goes
(:meth:`~hpctrain.record.runlog.RunLog.timings`), so a run killed on the way leaves them behind.

Rank 0 alone prints and writes the log; the others are silent unless something fails.
"""

from __future__ import annotations

import math
import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from hpctrain.comm.grid import GridSet
from hpctrain.cost.machine import BUCKET_BYTES
from hpctrain.data.prefetch import Prefetched
from hpctrain.data.source import DataSource, HeldOutSource, MicroBatches
from hpctrain.data.synthetic import SyntheticData
from hpctrain.device.backend import Backend
from hpctrain.errors import UserError
from hpctrain.kernels.segmentation import PixelTotals
from hpctrain.model.net import NetSpec
from hpctrain.plan.planner import PlannedNetwork
from hpctrain.plan.plans import LayerPlan
from hpctrain.record.runlog import RunLog
from hpctrain.record.timeline import TimelineWindow
from hpctrain.record.timing import (
    RanksSummary,
    StepRecords,
    StepTimes,
    format_table,
    measured_over_ranks,
    summary_over_ranks,
)
from hpctrain.run.loss_scale import INITIAL_SCALE, LossScale
from hpctrain.run.network import Network, Overflow
from hpctrain.run.optimizer import Optimizer, OptimizerSettings, make_optimizer
from hpctrain.run.schedule import Schedule
from hpctrain.run.signals import StopRequests

BEFORE_TRAINING = "before training; nothing was trained or saved"  # after "stopped by SIGTERM"
TIMINGS_SHARE = 16
"""The timings written as the run goes are at least 1/16 of the steps timed apart, so past
16 x ``timings_every`` steps further apart than ``timings_every`` (each write takes a median
over every step so far; so spaced, it costs each step a bounded share)."""


class TrainingError(UserError):
    """Training cannot go on: a non-finite loss (the same all-reduced value on every rank) from
    finite inputs, or, in a run's first step, any value that overflowed; a NaN or Inf read from
    the data is refused before, naming the sample."""


@dataclass(frozen=True)
class TrainConfig:
    """What to train and how; the options after ``print_every`` have defaults that keep a run
    self-contained (constant rate, no evaluation schedule, no checkpoints)."""

    batch: int
    steps: int  # the last step of the run, counted from 0 (a resumed run ends at the same one)
    lr: float
    momentum: float
    weight_decay: float
    seed: int
    print_every: int
    schedule: Schedule | None = None  # None: ``lr`` at every step
    eval_every: int = 0  # held-out evaluation every N steps (and at the end); 0: at the end
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0  # 0: only at the end and on a stop signal
    keep_checkpoints: int = 2
    overlap: bool = False  # gradient sums in flight during the backward (hpctrain.comm.gradients)
    bucket_bytes: int = BUCKET_BYTES  # gradients summed together (the machine profile's)
    timeline: tuple[int, int] | None = None  # steps to record spans of (hpctrain.record.timeline)
    prefetch: bool = True  # read a dataset's next batch during each step (hpctrain.data.prefetch)
    loss_scale: float = INITIAL_SCALE  # fp16's first loss scale (hpctrain.run.loss_scale)
    # the per-layer timings so far into the log every N steps and at each checkpoint (the
    # same on every rank, log or not: their medians are collective); 0: at the end only
    timings_every: int = 0
    # --optimizer and its flags, clipping (hpctrain.run.optimizer); SGD by default
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    # micro-batches per step (--accumulate): the network runs batch / accumulate samples at a
    # time and sums their gradients before the one update (Network.train_step)
    accumulate: int = 1

    @property
    def micro_batch(self) -> int:
        """The batch over ``accumulate``, the samples of one forward and backward."""
        return self.batch // self.accumulate

    def lr_at(self, step: int) -> float:
        return self.schedule.lr(step) if self.schedule else self.lr


@dataclass
class TrainResult:
    """What a run measured: the loss of every step, and the per-layer times.

    ``layer_times``: per field, the median over the steps after the first (the only step when
    there is one), then the largest over ranks; the same on every rank. ``step_times``: this
    rank's record of every step.
    """

    losses: list[float]
    layer_times: StepTimes
    step_times: list[StepTimes]
    fastest_rank_times: StepTimes  # as layer_times, but the smallest over ranks
    step_seconds: list[float]  # this rank's wall time of each whole step, optimizer included
    iteration: float  # median of step_seconds after the first, the largest over ranks
    first_step: int = 0  # the step this run started from (> 0 when resumed)
    stopped_by: str | None = None  # the signal that stopped the run early
    validation: list[tuple[int, float, float]] = field(default_factory=list)  # step, loss, acc
    checkpoint: Path | None = None  # the last checkpoint written
    loss_scale: LossScale | None = None  # fp16's loss scale, and the steps it skipped
    records: StepRecords = field(default_factory=StepRecords, repr=False)  # for the medians

    @property
    def last_step(self) -> int:
        """The number of steps completed, counting those before a resume."""
        return self.first_step + len(self.losses)

    @property
    def timed_steps(self) -> tuple[int, int]:
        """The steps the per-layer medians are over, as (first, last) counted from 1 (this
        run's steps after its first, or its only one)."""
        return self.first_step + (2 if len(self.losses) > 1 else 1), self.last_step

    def finish_log(self, log: RunLog, planned: PlannedNetwork) -> None:
        """Close rank 0's ``log`` with its final status, how this run ended, and, when a step
        ran, the measured per-layer times beside ``planned``'s predictions.

        Raises
        ------
        OutputError
            This or an earlier write of the log failed.
        """
        status = (f"stopped by {self.stopped_by} after step {self.last_step}"
                  if self.stopped_by else f"finished at step {self.last_step}")
        if self.losses:
            log.timings(planned, self.layer_times, self.fastest_rank_times, self.iteration,
                        self.timed_steps, final=True)
        log.finish(status)


def print_now(*args: Any) -> None:
    """print, flushed at once: a job's output file shows each line as it happens."""
    print(*args, flush=True)


def train(net: NetSpec, plan: list[LayerPlan], config: TrainConfig, backend: Backend,
          comm: MPI.Comm, out=print_now, data: DataSource | None = None,
          val_data: HeldOutSource | None = None, log: RunLog | None = None,
          resume: Path | None = None, stop: StopRequests | None = None) -> TrainResult:
    """Train from step 0 (or the step of checkpoint ``resume``) to ``config.steps``.

    Collective over ``comm``. ``data`` gives the training batches (default: synthetic data of
    ``config.seed``); ``val_data`` (an :class:`~hpctrain.data.dataset_reader.H5Data` of split val)
    is evaluated every ``config.eval_every`` steps and at the end. ``log`` is rank 0's
    :class:`~hpctrain.record.runlog.RunLog` (None elsewhere, or for no log). After the progress
    lines and the "done:" line, rank 0 prints the per-layer time table (see :class:`TrainResult`).
    On SIGTERM or SIGUSR1 every rank stops after the same step, a checkpoint is written when
    ``config.checkpoint_dir`` is set, and the result says which signal stopped it (``stop``:
    requests already being recorded, e.g. since before planning).

    With ``config.prefetch`` a source given (a dataset, augmented or not; training or
    held-out) is read through :class:`~hpctrain.data.prefetch.Prefetched`: the next batch's
    block is read (and augmented) by a background thread during each step, whose thread ends
    with the run (the source itself stays open: its owner closes it).
    """
    rank, procs = comm.Get_rank(), comm.Get_size()
    say = out if rank == 0 else (lambda *_: None)
    with GridSet(comm) as grids, (nullcontext(stop) if stop else StopRequests()) as stop, \
            ExitStack() as readers:
        prefetch = config.prefetch and data is not None  # a dataset, augmented or not
        data = data or SyntheticData.for_net(backend, net, config.batch, config.seed)
        if config.accumulate > 1:  # the network reads micro-batches of the sources' batches
            data = MicroBatches(data, config.accumulate, config.micro_batch)
            if val_data is not None:
                val_data = MicroBatches(val_data, config.accumulate, config.micro_batch)
        if prefetch:
            data = readers.enter_context(Prefetched(data))
        if config.prefetch and val_data is not None:
            val_data = readers.enter_context(Prefetched(val_data, cycle=val_data.batches))
        network = Network(net, plan, config.micro_batch, grids, backend, config.seed,
                          config.overlap, config.bucket_bytes)
        optimizer = make_optimizer(network.params, config.lr, config.momentum,
                                   config.weight_decay, config.optimizer, grids.world)
        scaler = LossScale(config.loss_scale) if backend.precision.loss_scaling else None
        first = 0
        if resume is not None:
            from hpctrain.run.checkpoint import load_checkpoint

            info = load_checkpoint(resume, network, optimizer)
            first = info.step
            if scaler is not None and "loss_scale" in info.state:  # an fp16 run's
                scaler.scale = float(info.state["loss_scale"])
            say(f"resumed from {resume} at step {first}")
        say(f"hpctrain: {net.name}, {net.parameter_count() / 1e6:.1f} M parameters, input "
            f"{'x'.join(map(str, net.input_shape))}, batch {config.batch}"
            f"{_micro_words(config)}, {procs} processes, "
            f"{backend.device} {backend.xp.dtype(backend.dtype).name}"
            f"{_precision_words(backend)}")
        # a diverging run overflows; the loss check in the loop names the step instead
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            result = _loop(network, optimizer, data, val_data, config, first, comm, log, stop,
                           say, scaler)
            if val_data is not None and result.losses and not result.stopped_by and (
                    not result.validation or result.validation[-1][0] != result.last_step):
                result.validation.append(_evaluate(network, val_data, result.last_step, log,
                                                   say))
        if result.stopped_by and not result.losses:
            say(f"stopped by {result.stopped_by} {BEFORE_TRAINING}")
        elif result.stopped_by:
            saved = (f"; resume with --resume {result.checkpoint}" if result.checkpoint
                     else "; no --checkpoint-dir, so nothing was saved"
                     if config.checkpoint_dir is None else "")
            say(f"stopped by {result.stopped_by} after step {result.last_step}{saved}")
        if result.losses or not result.stopped_by:
            _summarise(result, config, comm, say, net.loss.classifies,
                       [layer.out_layout.holds(comm.Get_rank()) for layer in network.layers],
                       net.per_pixel)
    return result


def _loop(network: Network, optimizer: Optimizer, data: DataSource, val_data: HeldOutSource | None,
          config: TrainConfig, first: int, comm: MPI.Comm, log: RunLog | None,
          stop: StopRequests, say, scaler: LossScale | None = None) -> TrainResult:
    """Steps ``first`` .. ``config.steps - 1``, or until every rank agrees to stop.

    With a loss ``scaler`` (fp16) no layer is updated during the backward: once every
    gradient is summed, the ranks agree whether any overflowed, and then all update (from the
    gradients divided by the scale) or all skip the step (:mod:`hpctrain.run.loss_scale`).
    Neither does an optimizer that needs whole-tensor or global norms (LARS, LAMB, clipping):
    it steps once every sum has arrived.
    """
    backend, rank = network.backend, comm.Get_rank()
    losses: list[float] = []
    step_times: list[StepTimes] = []
    step_seconds: list[float] = []
    result = TrainResult(losses, None, step_times, None, step_seconds, 0.0, first,
                         loss_scale=scaler)
    result.stopped_by = stop.agreed(comm)  # asked to stop while planning: train nothing
    last = first if result.stopped_by else config.steps
    window = TimelineWindow(config.timeline, comm, backend) if config.timeline else None
    runs = [layer.out_layout.holds(rank) for layer in network.layers]
    timings_written = first  # the last step whose timings went into the log
    start = time.perf_counter()
    for step in range(first, last):
        t0 = time.perf_counter()
        times = network.step_times()
        if window is not None:
            window.begin(step, times)
        lr = config.lr_at(step)
        # before the first update (step 0, not a resumed run's first) an overflow is the net's,
        # not the rate's: that step alone is watched, to name what overflowed
        watch = Overflow(backend.xp) if step == 0 else None
        scale = 1.0 if scaler is None else scaler.scale
        # each layer is updated as soon as its gradient's sum arrives, during the backward;
        # under loss scaling only once every rank knows no gradient overflowed, and with
        # norms over whole tensors once every sum has arrived
        update = None if scaler else optimizer.during_backward(lr)
        loss, accuracy = network.train_step(data, step, times=times, update=update,
                                            watch=watch, loss_scale=scale,
                                            accumulate=config.accumulate)
        if watch is not None:
            forward, backward = watch.over_ranks(comm)
            if scaler is not None:  # an overflowed gradient lowers the scale instead
                backward = None
            _refuse_first_overflow(network.net, loss, (forward, backward), config.steps)
        skipped = False
        if scaler is not None:
            skipped = scaler.overflowed([p.grad for p in network.params], comm, backend)
        if update is None and not skipped:
            optimizer.step(lr, unscale=1.0 / scale)
        if scaler is not None:
            scaler.update(skipped, step + 1)
        if not math.isfinite(loss):
            raise TrainingError(f"loss became {loss} at step {step + 1} (of {config.steps}); "
                                f"lower --lr (now {lr:g})")
        backend.sync()
        seconds = time.perf_counter() - t0
        if window is not None:
            window.end(step, times)
        losses.append(loss)
        step_times.append(times)
        step_seconds.append(seconds)
        record = times.to_array()
        result.records.add(record, seconds)
        summary = summary_over_ranks(times, seconds, comm, record=record)  # at rank 0 only
        if rank == 0:
            _report(step, loss, accuracy if network.net.loss.classifies else None, lr, summary,
                    config, start, first, log, say, scale, skipped,
                    None if skipped else optimizer.grad_norm)
        done = step + 1
        result.stopped_by, log_broken = stop.agreed_with(
            comm, log is not None and log.failure is not None)  # only rank 0 holds the log
        if log_broken:
            _stop_on_log_failure(log, comm)
        if (val_data is not None and config.eval_every and done % config.eval_every == 0
                and not result.stopped_by):  # stopping: the checkpoint first and only
            result.validation.append(_evaluate(network, val_data, done, log, say))
        checkpointing = config.checkpoint_dir is not None and (
            done == config.steps or result.stopped_by
            or (config.checkpoint_every and done % config.checkpoint_every == 0))
        if checkpointing:
            result.checkpoint = _checkpoint(network, optimizer, config, done, comm, say, scaler)
        # at the end and on a stop the run's own summary follows (TrainResult.finish_log)
        if done < config.steps and not result.stopped_by and _timings_due(
                config.timings_every, done - timings_written, done - first, checkpointing):
            _write_timings_so_far(result, comm, log, runs)
            timings_written = done
        if window is not None and window.done:
            _write_timeline(window, log)
            window = None
        if result.stopped_by:
            break
    if window is not None and window.recorded:  # stopped inside the window
        _write_timeline(window, log)
    return result


def _timings_due(every: int, since: int, timed: int, checkpointing: bool) -> bool:
    """Whether the timings so far go into the log now, ``since`` steps after their last
    write and ``timed`` steps into this run, at a checkpoint or not: every ``every`` steps
    and at each checkpoint, at least 1/:data:`TIMINGS_SHARE` of ``timed`` apart; never for
    ``every`` 0. The same on every rank.
    """
    return (every > 0 and (since >= every or (checkpointing and since > 0))
            and since >= timed // TIMINGS_SHARE)


def _write_timings_so_far(result: TrainResult, comm: MPI.Comm, log: RunLog | None,
                          runs: list[bool]) -> None:
    """The per-layer medians of the steps so far into rank 0's ``log``, beside the plan's
    predictions (:meth:`~hpctrain.record.runlog.RunLog.timings`). Collective: every rank
    calls it after the same steps, log or not."""
    slowest, fastest, iteration = measured_over_ranks(result.step_times[0], result.records,
                                                      comm, runs)
    if log is not None:
        log.timings(log.planned, slowest, fastest, iteration, result.timed_steps, final=False)


def _refuse_first_overflow(net: NetSpec, loss: float, where: tuple[int | None, int | None],
                           steps: int) -> None:
    """Raise :class:`TrainingError` on every rank when the first step of a run overflowed:
    its loss is not finite, or ``where`` (the first layer whose output, and the first from the
    loss down whose gradients, held NaN or Inf, over every rank) names a layer.

    No update has happened before it, so the learning rate cannot be the cause: the message
    names what overflowed and points at the net's values (an option such as ``scale
    factor=1e38``, the initial weights) instead of ``--lr``. ``loss`` and ``where`` are the
    same on every rank (all-reduced), so every rank raises together.
    """
    forward, backward = where
    if math.isfinite(loss) and forward is None and backward is None:
        return

    def layer(k: int) -> str:
        spec = net.layers[k]
        return f"layer '{spec.name}' ({spec.kind}, {spec.where})"

    if forward is not None:
        what = (f"the output of {layer(forward)} holds NaN or Inf in the forward pass (loss "
                f"{loss:.3g}); check the values of the net up to that layer")
    elif not math.isfinite(loss):
        what = f"the loss became {loss} from finite outputs of every layer; check the net's values"
    else:
        what = (f"the gradients of {layer(backward)} hold NaN or Inf in the backward pass "
                f"(loss {loss:.3g}); check the net's values")
    raise TrainingError(f"step 1 (of {steps}) overflowed before any update, so --lr is not the "
                        f"cause: {what} (its layers' options, e.g. a scale factor) and the range "
                        f"of the data")


def _micro_words(config: TrainConfig) -> str:
    """' (4 micro-batches of 8 per step)' under accumulation; nothing otherwise."""
    if config.accumulate == 1:
        return ""
    return f" ({config.accumulate} micro-batches of {config.micro_batch} per step)"


def _precision_words(backend: Backend) -> str:
    """', bf16 (float32 master weights)' and the like; nothing for a plain precision."""
    precision = backend.precision
    if precision.mixed:
        extra = ", loss scaling" if precision.loss_scaling else ""
        return f", {precision.name} ({np.dtype(precision.master).name} master weights{extra})"
    return ", tf32 products" if precision.name == "tf32" else ""


def _skipped_words(scaler: LossScale | None) -> str:
    """', loss scale 512 (2 updates skipped for overflow: steps 1, 2)' under fp16."""
    if scaler is None:
        return ""
    steps = scaler.skipped
    shown = ", ".join(map(str, steps[:5])) + (", ..." if len(steps) > 5 else "")
    skipped = (f" ({len(steps)} update{'s' if len(steps) != 1 else ''} skipped for overflow: "
               f"step{'s' if len(steps) != 1 else ''} {shown})" if steps else "")
    return f", loss scale {scaler.scale:g}{skipped}"


def _write_timeline(window: TimelineWindow, log: RunLog | None) -> None:
    """Gather the window's spans to rank 0 and write them to the log. Collective."""
    spans = window.gather()
    if log is not None and spans is not None:
        log.timeline(spans, window.recorded)


def _stop_on_log_failure(log: RunLog, comm: MPI.Comm) -> None:
    """Collective, once rank 0's ``log`` could not be written (a full disk): raise
    :class:`~hpctrain.errors.OutputError` on every rank, so every rank exits with status 3."""
    from hpctrain.comm.agree import on_root
    from hpctrain.errors import OutputError

    def fail() -> None:
        raise OutputError(log.failure)

    on_root(comm, fail)


def _report(step: int, loss: float, accuracy: float | None, lr: float, summary: RanksSummary,
            config: TrainConfig, start: float, first: int, log: RunLog | None, say,
            loss_scale: float = 1.0, skipped: bool = False,
            grad_norm: float | None = None) -> None:
    """Rank 0: the step's log row, and a progress line every ``print_every`` steps; a
    regression (``accuracy`` None) logs an accuracy of 0 and prints none. ``loss_scale`` and
    ``skipped``: fp16's scale that step, and whether its update was skipped; ``grad_norm``:
    the global gradient norm before clipping (None: not clipping, or skipped)."""
    seconds, comm_fraction = summary.seconds, summary.comm_fraction
    if log is not None:
        log.step({"step": step + 1, "loss": loss, "accuracy": accuracy or 0.0,
                  "seconds": seconds,
                  "images_per_second": config.batch / seconds, "lr": lr,
                  "comm_fraction": comm_fraction, "data_wait_seconds": summary.data_seconds,
                  "data_fraction": summary.data_fraction, "loss_scale": loss_scale,
                  "skipped": int(skipped),
                  "grad_norm": math.nan if grad_norm is None else grad_norm},
                 summary.largest, summary.mean)
    done = step + 1
    if done % config.print_every == 0 or done == config.steps:
        elapsed = time.perf_counter() - start
        eta = elapsed / (done - first) * (config.steps - done)
        score = "" if accuracy is None else f"acc {accuracy:6.1%}  "
        scaled = "" if loss_scale == 1.0 else f"  scale {loss_scale:g}"
        if grad_norm is not None:
            scaled += f"  grad norm {grad_norm:.4g}"
        say(f"step {done:>5}/{config.steps}  loss {loss:8.4f}  {score}"
            f"{config.batch / seconds:8.1f} images/s  {seconds * 1e3:8.1f} ms/step  "
            f"comm {comm_fraction:4.0%}  ETA {_duration(eta)}{scaled}"
            f"{'  (overflow: update skipped)' if skipped else ''}")


def _duration(seconds: float) -> str:
    """'42 s', '3m07s' or '2h05m'."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _evaluate(network: Network, val_data: HeldOutSource, step: int, log: RunLog | None,
              say) -> tuple[int, float, float]:
    """Loss and accuracy over the whole held-out split (collective); for a segmentation net
    the pixel accuracy, and the mean IoU besides (:func:`_evaluate_pixels`)."""
    if network.net.per_pixel:
        return _evaluate_pixels(network, val_data, step, log, say)
    loss_sum = correct = count = 0
    for batch in range(val_data.batches):
        batch_loss, batch_correct, batch_count = network.evaluate(val_data, batch)
        loss_sum, correct, count = loss_sum + batch_loss, correct + batch_correct, \
            count + batch_count
    loss, accuracy = loss_sum / max(count, 1), correct / max(count, 1)
    if not network.net.loss.classifies:
        say(f"validation after step {step}: mean squared error {loss:.4f} over {count} "
            f"samples")
    else:
        say(f"validation after step {step}: loss {loss:.4f}, accuracy {accuracy:.2%} "
            f"({correct}/{count})")
    if log is not None:
        log.validation(step, loss, accuracy)
    return step, loss, accuracy


def _evaluate_pixels(network: Network, val_data: HeldOutSource, step: int,
                     log: RunLog | None, say) -> tuple[int, float, float]:
    """A segmentation's held-out loss (the weighted mean over every counted pixel), pixel
    accuracy and mean IoU: each class's intersection and union are summed over every batch and
    rank before any division (collective)."""
    totals = PixelTotals(network.net.classes)
    for batch in range(val_data.batches):
        totals.add(network.evaluate_pixels(val_data, batch))
    say(f"validation after step {step}: loss {totals.loss:.4f}, pixel accuracy "
        f"{totals.accuracy:.2%}, mean IoU {totals.mean_iou:.4f} ({totals.counted} pixels)")
    if log is not None:
        log.validation(step, totals.loss, totals.accuracy, mean_iou=totals.mean_iou)
    return step, totals.loss, totals.accuracy


def _checkpoint(network: Network, optimizer: Optimizer, config: TrainConfig, step: int,
                comm: MPI.Comm, say, scaler: LossScale | None = None) -> Path:
    """Write the checkpoint of ``step`` (collective) and drop all but the newest few; an fp16
    run's loss scale goes in its state, for a resume to start from."""
    from hpctrain.run.checkpoint import checkpoint_path, prune_checkpoints, save_checkpoint

    path = checkpoint_path(config.checkpoint_dir, step)
    state = {"batch": config.batch, "lr": config.lr, "momentum": config.momentum,
             "weight_decay": config.weight_decay, "accumulate": config.accumulate}
    if scaler is not None:
        state["loss_scale"] = scaler.scale
    save_checkpoint(path, network, optimizer, step, state, comm, seed=config.seed)
    if comm.Get_rank() == 0:
        prune_checkpoints(config.checkpoint_dir, config.keep_checkpoints)
    say(f"checkpoint written: {path}")
    return path


def _summarise(result: TrainResult, config: TrainConfig, comm: MPI.Comm, say,
               classifies: bool = True, runs: list[bool] | None = None,
               pixels: bool = False) -> None:
    """Fill the result's per-layer summary and print the closing lines (collective). ``runs``:
    per layer, whether this rank runs it (see :func:`~hpctrain.record.timing.over_ranks`);
    ``pixels``: a segmentation's accuracy is per pixel."""
    procs = comm.Get_size()
    steps = len(result.losses)
    if steps == 0:
        result.layer_times = result.fastest_rank_times = None
        say(f"done: nothing to do, already at step {result.first_step} of {config.steps}")
        return
    total = sum(result.step_seconds)
    # the share of its steps the slowest-fed rank spent waiting for data
    data_share = comm.allreduce(sum(t.data for t in result.step_times) / total if total else 0.0,
                                MPI.MAX)
    say(f"done: {steps} steps in {total:.1f} s, {steps * config.batch / total:.1f} images/s, "
        f"final loss {result.losses[-1]:.4f}"
        + ("" if not result.validation else
           f", held-out mean squared error {result.validation[-1][1]:.4f}" if not classifies else
           f", held-out {'pixel ' if pixels else ''}accuracy "
           f"{result.validation[-1][2]:.2%}")
        + f", waiting for data {data_share:.1%} of the time"
        + _skipped_words(result.loss_scale))
    result.layer_times, result.fastest_rank_times, result.iteration = measured_over_ranks(
        result.step_times[0], result.records, comm, runs)
    which = {1: "step 1", 2: "step 2"}.get(steps, f"steps 2-{steps}")
    say(f"per-layer time (ms): median over {which} of this run, then the largest over {procs} "
        f"processes, entry by entry")
    say(format_table(result.layer_times))
