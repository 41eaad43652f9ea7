"""Communication per layer under the paper's assumptions (Gholami et al., SPAA 2018, Sec. 2–3).

The assumptions: every layer's output is all-gathered where it is produced (no deferral past
pooling), the input gradient is all-reduced (not reduce-scattered), ΔW is one all-reduce of the
weights ``|W_i|`` (biases are left out, as in the paper's counts), every split is even, every
rank has two halo neighbours, and nothing is charged for changing layouts between layers. For
weighted layer i with d_i output and d_{i−1} input entries per sample (d_{i−1} is the size of
the layer's input, which is layer i−1's output when nothing lies between), w bytes per entry:

- 1.5D on Pr×Pc (Eq. 8; Eq. 3 is Pc = 1, model; Eq. 4 is Pr = 1, batch)::

    forward   α⌈log Pr⌉ + β·(B/Pc)·(Pr−1)/Pr·d_i·w                      (all-gather Y_i)
    backward  2(α⌈log Pr⌉ + β·(B/Pc)·(Pr−1)/Pr·d_{i−1}·w), for i ≥ 2     (all-reduce ΔX_i)
            + 2(α⌈log Pc⌉ + β·(Pc−1)/Pc·|W_i|/Pr·w)                       (all-reduce ΔW_i)

- domain on Pr (height) × Pc (batch), conv layers (Eq. 7 is Pc = 1; Eq. 9 uses it for the
  convolutions and 1.5D for the fully connected layers, on one grid)::

    forward   2(α + β·(B/Pc)·X_W·X_C·⌊k_h/2⌋·w)                          (halo of X to both sides)
    backward  2(α + β·(B/Pc)·Y_W·Y_C·⌊k_h/2⌋·w), for i ≥ 2                (halo of ΔY)
            + 2(α⌈log P⌉ + β·(P−1)/P·|W_i|·w)                             (ΔW over all P)

Each function returns, per weighted layer, (forward, backward) seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpctrain.cost.collectives import allgather_time, allreduce_time, halo_time
from hpctrain.cost.machine import Machine
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import NetSpec
from hpctrain.plan.baselines import strategy_plan


@dataclass(frozen=True)
class PaperLayer:
    """A weighted layer as the paper's equations see it (sizes per sample)."""

    name: str
    kind: str
    d_in: int
    d_out: int
    weights: int
    kernel: int = 1
    x_width: int = 0
    x_channels: int = 0
    y_width: int = 0
    y_channels: int = 0


def paper_layers(net: NetSpec) -> list[PaperLayer]:
    shapes = net.shapes()
    layers = []
    for k, spec in enumerate(net.layers):
        if not KINDS[spec.kind].weighted:
            continue
        x, y = shapes[k], net.out_shapes[k]
        out = spec.options.out
        if len(x) >= 3:  # a row is a plane of the first spatial axis: a volume's H x W
            kernel = spec.options.kernel
            layers.append(PaperLayer(spec.name, "conv", math.prod(x), math.prod(y),
                                     out * x[0] * math.prod(kernel), kernel[0],
                                     math.prod(x[2:]), x[0], math.prod(y[2:]), y[0]))
        else:
            layers.append(PaperLayer(spec.name, "linear", x[0], out, out * x[0]))
    return layers


def one_five_d(layer: PaperLayer, first: bool, batch: int, grid: tuple[int, int],
               machine: Machine, word: int = 4) -> tuple[float, float]:
    """Eq. 8 terms of one layer on Pr×Pc (model: Pc = 1, Eq. 3; batch: Pr = 1, Eq. 4)."""
    pr, pc = grid
    local_batch = batch / pc
    forward = allgather_time(machine, pr, local_batch * layer.d_out * word)
    backward = 0.0 if first else allreduce_time(machine, pr, local_batch * layer.d_in * word)
    backward += allreduce_time(machine, pc, layer.weights / pr * word)
    return forward, backward


def domain(layer: PaperLayer, first: bool, batch: int, grid: tuple[int, int],
           machine: Machine, word: int = 4) -> tuple[float, float]:
    """Eq. 7 (Pc = 1) and the convolution terms of Eq. 9 for one conv layer on Pr×Pc."""
    pr, pc = grid
    local_batch = batch / pc
    rows = layer.kernel // 2
    forward = backward = 0.0
    if pr > 1 and rows:
        forward = 2 * halo_time(machine, local_batch * layer.x_width * layer.x_channels * rows
                                * word)
        if not first:
            backward = 2 * halo_time(machine, local_batch * layer.y_width * layer.y_channels
                                     * rows * word)
    backward += allreduce_time(machine, pr * pc, layer.weights * word)
    return forward, backward


def strategy_comm(net: NetSpec, strategy: str, batch: int, grid: tuple[int, int],
                  machine: Machine, word: int = 4) -> list[tuple[float, float]]:
    """Per weighted layer (forward, backward) communication of a whole-network strategy
    (:mod:`hpctrain.plan.baselines`): each layer's equations are those of the mode the strategy
    gives it, 1.5D (Eq. 3, 4, 8; batch is 1.5D on 1×P) or domain (Eq. 7, 9)."""
    kinds = [KINDS[spec.kind] for spec in net.layers if KINDS[spec.kind].weighted]
    costs = []
    for k, (layer, entry) in enumerate(zip(paper_layers(net),
                                           strategy_plan(kinds, strategy, grid), strict=True)):
        equations = domain if entry.mode == "domain" else one_five_d
        costs.append(equations(layer, k == 0, batch, entry.grid, machine, word))
    return costs
