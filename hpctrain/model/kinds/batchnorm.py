"""``batchnorm [eps=1e-5] [momentum=0.1]``: batch normalisation over the whole global batch,
with running statistics for evaluation, on the layout that feeds it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpctrain.cost.collectives import allreduce_time
from hpctrain.cost.machine import Machine
from hpctrain.cost.memory import Footprint, larger
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import CHANNEL_AXIS, REPLICAS, Layout, largest_block
from hpctrain.layout.partition import SplitError, block_ranges
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape
from hpctrain.model.options import Key, fraction


@dataclass(frozen=True)
class BatchNormOptions:
    eps: float
    momentum: float


def statistics_axes(x: Layout) -> tuple[int, ...]:
    """The axes whose blocks share a channel's statistics: all but the channels."""
    return tuple(a for a in range(len(x.shape)) if a != CHANNEL_AXIS)


class BatchNormKind(Kind):
    name = "batchnorm"
    keys = {"eps": Key(fraction(1e-300, 1.0), "1e-5"),
            "momentum": Key(fraction(0.0, 1.0, high_open=False), "0.1")}
    options = BatchNormOptions

    def param_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        return {"gamma": shapes[0][:1], "beta": shapes[0][:1]}

    def buffer_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        return {"running_mean": shapes[0][:1], "running_var": shapes[0][:1]}

    def check(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> None:
        super().check(spec, inputs, output)
        x = inputs[0]
        values = x.shape[0] * math.prod(x.shape[2:])
        if values < 2:
            raise SplitError(f"layer {spec.name}: batch norm over {values} value per channel "
                             f"(batch {x.shape[0]}, shape {x.shape[1:]}) has no variance; "
                             f"raise --batch")
        parts = x.parts[CHANNEL_AXIS]
        if x.split_ranges is not None and CHANNEL_AXIS in x.cut_axes and x.split_ranges != (
                block_ranges(x.shape[CHANNEL_AXIS], parts)):
            raise SplitError(f"layer {spec.name}: its {x.shape[CHANNEL_AXIS]} channels arrive "
                             f"split unevenly over {parts} ranks (after a flatten); put the "
                             f"batchnorm before the flatten")

    def flops(self, work: LocalWork) -> tuple[float, float]:
        elements = float(math.prod(work.x))
        return 8 * elements, 10 * elements

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        # only timing runs the kernels: planning never loads them
        from hpctrain.kernels.norm import batchnorm_backward, batchnorm_forward

        x = random(work.x)
        gamma, beta = xp.ones(work.x[1], dtype=dtype), xp.zeros(work.x[1], dtype=dtype)
        dy = xp.ones_like(x)
        count = math.prod(work.x) // work.x[1]

        def same(a: Any) -> Any:
            return a

        def backward_of(out: Any) -> Callable[[], Any]:
            return lambda: batchnorm_backward(xp, dy, out[1], count, same)

        return lambda: batchnorm_forward(xp, x, gamma, beta, 1e-5, count, same), backward_of

    def local_parameters(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                         ) -> int:
        return 2 * largest_block(inputs[0])[CHANNEL_AXIS]

    def comm_time(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                  machine: Machine, itemsize: int) -> tuple[float, float]:
        """Forward: the mean and the variance, each one all-reduce of C/Pr entries; backward:
        one of 2·C/Pr (the sums that are also Δγ and Δβ), and a second over Pr for replicas."""
        x = inputs[0]
        channels = largest_block(x)[CHANNEL_AXIS] * itemsize
        ranks = x.group(statistics_axes(x))
        forward = 2 * allreduce_time(machine, ranks, channels)
        backward = allreduce_time(machine, ranks, 2 * channels)
        return forward, backward + self.gradient_sum_time(spec, inputs, output, machine,
                                                          itemsize)

    def gradient_sum_time(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                          machine: Machine, itemsize: int) -> float:
        """Δγ and Δβ summed over the Pr replicas (channels not split); the batch's sums are
        the statistics' own, which the backward needs at once."""
        x = inputs[0]
        if x.replicas == 1:
            return 0.0
        channels = largest_block(x)[CHANNEL_AXIS] * itemsize
        return allreduce_time(machine, x.group((REPLICAS,)), 2 * channels)

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """X̂ kept for the backward; the output and a centred copy while normalising."""
        return {"normalized input": fp.y}, larger(
            {**fp.loose_input, "centred input": fp.x, "output": fp.y},
            {"output gradient": fp.y, "input gradient": fp.x, "product with X̂": fp.x})

    def magnitudes(self, spec: LayerSpec, xs: list[np.ndarray], dy: np.ndarray
                   ) -> dict[str, np.ndarray]:
        """Δγ = Σ dY·x̂ and Δβ = Σ dY over all values of a channel: ``Σ |dY|·|x̂|`` and ``Σ |dY|``.
        The running mean after one step from zero is momentum·μ, μ a mean: ``momentum·mean |X|``.
        The running variance's terms are squares, which do not cancel: it is its own
        magnitude (no entry)."""
        from hpctrain.kernels.norm import batchnorm_forward, channel_sums

        x = xs[0]
        count = x.size // x.shape[1]
        ones = np.ones(x.shape[1])
        _, cache, _, _ = batchnorm_forward(np, x, ones, 0 * ones, spec.options.eps, count,
                                           lambda local: local)
        size = np.abs(dy)
        return {"gamma": channel_sums(np, size * np.abs(cache.x_hat)),
                "beta": channel_sums(np, size),
                "running_mean": spec.options.momentum * channel_sums(np, np.abs(x)) / count}

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.norm import BatchNorm  # needs MPI: only when run

        return BatchNorm(spec.name, spec.options, ctx)


KIND = BatchNormKind()
