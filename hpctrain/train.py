"""The training loop: plan, build, then forward / loss / backward / SGD step, with progress."""

from __future__ import annotations

import math
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
          comm: MPI.Comm, out=print) -> list[float]:
    """Train ``config.steps`` steps on synthetic data; rank 0 prints; returns the losses."""
    rank, procs = comm.Get_rank(), comm.Get_size()
    say = out if rank == 0 else (lambda *_: None)
    losses = []
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
            loss, accuracy = network.train_step(data, step)
            if not math.isfinite(loss):
                raise TrainingError(f"loss became {loss} at step {step}; lower --lr "
                                    f"(now {config.lr})")
            optimizer.step()
            backend.sync()
            seconds = time.perf_counter() - t0
            losses.append(loss)
            if (step + 1) % config.print_every == 0 or step + 1 == config.steps:
                eta = (time.perf_counter() - start) / (step + 1) * (config.steps - step - 1)
                say(f"step {step + 1:>5}/{config.steps}  loss {loss:8.4f}  acc {accuracy:6.1%}  "
                    f"{config.batch / seconds:8.1f} images/s  {seconds * 1e3:8.1f} ms/step  "
                    f"ETA {eta:6.1f} s")
        total = time.perf_counter() - start
        say(f"done: {config.steps} steps in {total:.1f} s, "
            f"{config.steps * config.batch / total:.1f} images/s, final loss {losses[-1]:.4f}")
    return losses
