"""The training loop: plan, build, then forward / loss / backward / SGD step, with progress.

Every step is timed per layer (:mod:`hpctrain.timing`); at the end rank 0 prints the median over
the steps after the first (which pays one-off allocation and warm-up), the largest over ranks.
Timing costs a few clock reads per layer on the CPU; on a GPU each reading waits for the device,
which removes some overlap of kernels with the host.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from mpi4py import MPI

from hpctrain.backend import Backend
from hpctrain.data import SyntheticData
from hpctrain.errors import UserError
from hpctrain.grid import GridSet
from hpctrain.net import NetSpec
from hpctrain.network import Network
from hpctrain.optim import SGD
from hpctrain.plan import LayerPlan
from hpctrain.timing import StepTimes, format_table, max_over_ranks, median_times, over_ranks


class TrainingError(UserError):
    """Training cannot go on: a non-finite loss (the same all-reduced value on every rank)."""


@dataclass(frozen=True)
class TrainConfig:
    batch: int
    steps: int
    lr: float
    momentum: float
    weight_decay: float
    seed: int
    print_every: int


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


def describe_plan(network: Network) -> str:
    """The plan as a table: each layer's mode and grid, its layouts, and the move feeding it."""
    rows = [f"{'layer':<10} {'kind':<8} {'mode':<7} {'grid':<6} {'input layout':<26} "
            f"{'output layout':<26} {'fed by':<10}"]
    for layer, move in zip(network.layers, network.moves, strict=True):
        pr, pc = layer.out_layout.grid
        rows.append(f"{layer.name:<10} {layer.kind:<8} {layer.mode:<7} {f'{pr}x{pc}':<6} "
                    f"{layer.in_layout.describe():<26} {layer.out_layout.describe():<26} "
                    f"{move.kind:<10}")
    rows.append(f"{'loss':<10} {'softmax':<8} {'':<7} {'':<6} "
                f"{network.loss_layout.describe():<26} {'':<26} {network.to_loss.kind:<10}")
    return "\n".join(rows)


def train(net: NetSpec, plan: list[LayerPlan], config: TrainConfig, backend: Backend,
          comm: MPI.Comm, out=print) -> TrainResult:
    """Train ``config.steps`` steps on synthetic data; rank 0 prints.

    Collective over ``comm``. After the progress lines and the "done:" line, rank 0 prints the
    per-layer time table (see :class:`TrainResult`); returns the losses and those times.
    """
    rank, procs = comm.Get_rank(), comm.Get_size()
    say = out if rank == 0 else (lambda *_: None)
    losses = []
    step_times: list[StepTimes] = []
    step_seconds: list[float] = []
    with GridSet(comm) as grids:
        network = Network(net, plan, config.batch, grids, backend, config.seed)
        data = SyntheticData(backend, net.input_shape, net.classes, config.batch, config.seed)
        optimizer = SGD(network.params, config.lr, config.momentum, config.weight_decay)
        say(f"hpctrain: {net.name}, {net.parameter_count() / 1e6:.1f} M parameters, input "
            f"{'x'.join(map(str, net.input_shape))}, batch {config.batch}, {procs} processes, "
            f"{backend.device} {backend.xp.dtype(backend.dtype).name}")
        say(describe_plan(network))
        start = time.perf_counter()
        for step in range(config.steps):
            t0 = time.perf_counter()
            times = network.step_times()
            loss, accuracy = network.train_step(data, step, times=times)
            if not math.isfinite(loss):
                raise TrainingError(f"loss became {loss} at step {step}; lower --lr "
                                    f"(now {config.lr})")
            optimizer.step()
            backend.sync()
            seconds = time.perf_counter() - t0
            step_seconds.append(seconds)
            losses.append(loss)
            step_times.append(times)
            if (step + 1) % config.print_every == 0 or step + 1 == config.steps:
                eta = (time.perf_counter() - start) / (step + 1) * (config.steps - step - 1)
                say(f"step {step + 1:>5}/{config.steps}  loss {loss:8.4f}  acc {accuracy:6.1%}  "
                    f"{config.batch / seconds:8.1f} images/s  {seconds * 1e3:8.1f} ms/step  "
                    f"ETA {eta:6.1f} s")
        total = time.perf_counter() - start
        say(f"done: {config.steps} steps in {total:.1f} s, "
            f"{config.steps * config.batch / total:.1f} images/s, final loss {losses[-1]:.4f}")
        steady = step_times[1:] or step_times
        typical = median_times(steady)
        layer_times = max_over_ranks(typical, comm)
        fastest_rank_times = over_ranks(typical, comm, "min")
        which = {1: "step 1", 2: "step 2"}.get(config.steps, f"steps 2-{config.steps}")
        say(f"per-layer time (ms): median over {which}, then the largest over {procs} "
            f"processes, entry by entry")
        say(format_table(layer_times))
        iteration = comm.allreduce(statistics.median(step_seconds[1:] or step_seconds), MPI.MAX)
    return TrainResult(losses, layer_times, step_times, fastest_rank_times, step_seconds,
                       iteration)
