"""``layernorm [eps=1e-5]``: layer normalisation over the channels at each position of an image
or volume (ConvNeXt's LayerNorm2d), or over the features of a flat input (PyTorch's LayerNorm),
with a scale and shift per channel, on the layout that feeds it. Unlike batch norm it has no
running statistics: training and evaluation compute alike."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpctrain.cost.collectives import allreduce_time
from hpctrain.cost.machine import Machine
from hpctrain.cost.memory import STATISTICS_BYTES, Footprint
from hpctrain.cost.nodes import Group
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import CHANNEL_AXIS, REPLICAS, Layout, largest_block
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape
from hpctrain.model.options import Key, fraction


@dataclass(frozen=True)
class LayerNormOptions:
    eps: float


class LayerNormKind(Kind):
    name = "layernorm"
    keys = {"eps": Key(fraction(1e-300, 1.0), "1e-5")}
    options = LayerNormOptions

    def param_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        return {"gamma": shapes[0][:1], "beta": shapes[0][:1]}

    def flops(self, work: LocalWork) -> tuple[float, float]:
        elements = float(math.prod(work.x))
        return 8 * elements, 10 * elements

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        from hpctrain.kernels.norm import layernorm_backward, layernorm_forward

        x = random(work.x)
        gamma, beta = xp.ones(work.x[1], dtype=dtype), xp.zeros(work.x[1], dtype=dtype)
        dy = xp.ones_like(x)

        def same(a: Any) -> Any:
            return a

        return (lambda: layernorm_forward(xp, x, gamma, beta, 1e-5, work.x[1], same),
                lambda out: lambda: layernorm_backward(xp, dy, out[1], work.x[1], same))

    def local_parameters(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                         ) -> int:
        return 2 * largest_block(inputs[0])[CHANNEL_AXIS]

    def gradient_group(self, inputs: tuple[Layout, ...], output: Layout) -> Group:
        """γ and β are on every rank holding the same channel block: other samples, other
        positions, replicas."""
        x = inputs[0]
        return x.group(a for a in (*range(len(x.shape)), REPLICAS) if a != CHANNEL_AXIS)

    def comm_time(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                  machine: Machine, itemsize: int, sums: float | None = None
                  ) -> tuple[float, float]:
        """Under a channel split, two all-reduces forward (the mean, then the squared
        deviations) and one of two sums backward, one value per position held; then Δγ and Δβ
        summed over the ranks of the channel block."""
        x = inputs[0]
        forward = backward = 0.0
        channel_ranks = x.group((CHANNEL_AXIS,))
        if channel_ranks.size > 1:
            block = largest_block(x)
            positions = block[0] * math.prod(block[2:])
            one = allreduce_time(machine, channel_ranks,
                                 positions * max(itemsize, STATISTICS_BYTES))
            two = allreduce_time(machine, channel_ranks,
                                 2 * positions * max(itemsize, STATISTICS_BYTES))
            forward, backward = 2 * one, two
        return forward, backward + self.gradient_sum_time(spec, inputs, output, machine,
                                                          itemsize, sums)

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """X̂ kept for the backward; a centred copy and the output while normalising."""
        return {"normalized input": fp.y}, fp.phases(
            {**fp.loose_input, "centred input": fp.x, "output": fp.y},
            {"output gradient times γ": fp.y, "input gradient": fp.x, "product with X̂": fp.x})

    def magnitudes(self, spec: LayerSpec, xs: list[np.ndarray], dy: np.ndarray
                   ) -> dict[str, np.ndarray]:
        """Δγ = Σ dY·x̂ and Δβ = Σ dY over the samples and positions: ``Σ |dY|·|x̂|`` and
        ``Σ |dY|``."""
        from hpctrain.kernels.norm import layernorm_forward

        x = xs[0]
        channels = x.shape[1]
        _, cache = layernorm_forward(np, x, np.ones(channels), np.zeros(channels),
                                     spec.options.eps, channels, lambda a: a)
        axes = (0, *range(2, dy.ndim))
        return {"gamma": (np.abs(dy) * np.abs(cache.normalized)).sum(axis=axes),
                "beta": np.abs(dy).sum(axis=axes)}

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.norm import LayerNorm  # needs MPI: only when run

        return LayerNorm(spec.name, spec.options, ctx)


KIND = LayerNormKind()
