"""``batchnorm [eps=1e-5] [momentum=0.1] [group=global|rank|K]``: batch normalisation with
statistics over the whole global batch or over groups of its samples, with running statistics
for evaluation, on the layout that feeds it.

``group``: over which samples a channel's mean and variance are taken (see
:mod:`hpctrain.layout.statistics`): ``global``, the whole mini-batch (every plan computes what
one process computes); ``rank``, each rank's share of the batch, as PyTorch's
DistributedDataParallel does; ``K``, the shares of K ranks, as MLPerf's "bn group". Without it,
the run's ``--bn-group`` decides (global unless told otherwise)."""

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
from hpctrain.errors import shown
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import CHANNEL_AXIS, REPLICAS, Layout, largest_block
from hpctrain.layout.partition import SplitError, block_ranges
from hpctrain.layout.statistics import GLOBAL, PER_RANK, check_nesting, sharing_blocks
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape
from hpctrain.model.options import Key, NetError, fraction, integer


@dataclass(frozen=True)
class BatchNormOptions:
    eps: float
    momentum: float
    group: str | int | None  # as written: global, rank, K ranks; None: the run's --bn-group
    groups: int = 1  # sample groups, once the ranks are known (NetSpec.with_statistics)


def statistics_group(key: str, text: str, where: str) -> str | int | None:
    """``group=global``, ``rank`` or a number of ranks K; the default, the run's choice."""
    if text in (GLOBAL, PER_RANK):
        return text
    if text == RUN_CHOICE:
        return None
    try:
        return integer(key, text, where, 1)
    except NetError:
        raise NetError(f"{where}: {key}={shown(text)} must be global, rank or a number of "
                       f"ranks such as 8") from None


RUN_CHOICE = "--bn-group"
"""The default of ``group=``: whatever the run's ``--bn-group`` says."""


def statistics_axes(x: Layout) -> tuple[int, ...]:
    """The axes whose blocks share a channel's statistics: all but the channels."""
    return tuple(a for a in range(len(x.shape)) if a != CHANNEL_AXIS)


def statistics_ranks(x: Layout, groups: int) -> Group:
    """The pattern of the groups of ranks that sum one statistics group's sums: every rank of
    the channel block under global statistics; under groups, the sample blocks sharing a group
    times the spatial blocks, as the fastest of those digits lays them out."""
    axes = statistics_axes(x)
    if groups == 1:
        return x.group(axes)
    sharing = sharing_blocks(x.shape[0], groups, x.parts[0])
    if sharing == x.parts[0]:
        return x.group(axes)
    spatial = [a for a in axes if a != 0]
    if sharing == 1:
        return x.group(spatial)
    digits = x.digits_of(axes)
    size = sharing * math.prod(x.parts[a] for a in spatial)
    return Group(size, math.prod(x.mesh[max(digits) + 1:]), x.size)


class BatchNormKind(Kind):
    name = "batchnorm"
    keys = {"eps": Key(fraction(1e-300, 1.0), "1e-5"),
            "momentum": Key(fraction(0.0, 1.0, high_open=False), "0.1"),
            "group": Key(statistics_group, RUN_CHOICE)}
    communicates_in_evaluation = False  # the running statistics: no sum over ranks
    options = BatchNormOptions

    def param_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        return {"gamma": shapes[0][:1], "beta": shapes[0][:1]}

    def buffer_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        return {"running_mean": shapes[0][:1], "running_var": shapes[0][:1]}

    def check(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> None:
        super().check(spec, inputs, output)
        x = inputs[0]
        groups = spec.options.groups
        values = x.shape[0] // groups * math.prod(x.shape[2:])
        if values < 2:
            among = f" in each of {groups} groups" if groups > 1 else ""
            raise SplitError(f"layer {spec.name}: batch norm over {values} value per channel"
                             f"{among} (batch {x.shape[0]}, shape {x.shape[1:]}) has no "
                             f"variance; raise --batch")
        check_nesting(x.shape[0], groups, x.parts[0], spec.name)
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
        count = math.prod(work.x) // work.x[1]  # the local values as one group

        def same(a: Any) -> Any:
            return a

        def backward_of(out: Any) -> Callable[[], Any]:
            return lambda: batchnorm_backward(xp, dy, out[1], count, same)

        shift = xp.zeros(work.x[1], dtype=dtype)  # a training step's: one message, shifted
        return (lambda: batchnorm_forward(xp, x, gamma, beta, 1e-5, count, same, shift),
                backward_of)

    def local_parameters(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                         ) -> int:
        return 2 * largest_block(inputs[0])[CHANNEL_AXIS]

    def comm_time(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                  machine: Machine, itemsize: int, sums: float | None = None
                  ) -> tuple[float, float]:
        """One all-reduce each way over the ranks of a statistics group: forward the two sums
        of the mean and the variance, backward the two of the input gradient (2·C/c entries
        per group held); then Δγ and Δβ summed over the other groups and the replicas."""
        x = inputs[0]
        held = max(1, -(-spec.options.groups // x.parts[0]))  # groups in a sample block
        # the sums are made and sent in the master dtype: float32 (float64 under fp64)
        message = 2 * held * largest_block(x)[CHANNEL_AXIS] * max(itemsize, STATISTICS_BYTES)
        ranks = statistics_ranks(x, spec.options.groups)
        both = allreduce_time(machine, ranks, message)
        return both, both + self.gradient_sum_time(spec, inputs, output, machine, itemsize,
                                                   sums)

    def gradient_sums(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                      itemsize: int) -> list[tuple[Group, float]]:
        """Δγ and Δβ summed over the ranks that hold other parts of them: the replicas under
        global statistics (the batch's sums are the statistics' own, which the backward needs
        at once); under groups, every other rank of the channel block too."""
        x = inputs[0]
        axes = (REPLICAS,) if spec.options.groups == 1 else (*statistics_axes(x), REPLICAS)
        ranks = x.group(axes)
        if ranks.size == 1:
            return []
        return [(ranks, 2 * largest_block(x)[CHANNEL_AXIS] * itemsize)]

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """X̂ kept for the backward; the output and a centred copy while normalising."""
        return {"normalized input": fp.y}, fp.phases(
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
