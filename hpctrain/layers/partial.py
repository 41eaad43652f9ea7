"""The sum that completes the output of a conv or linear layer whose input channels are split
(:mod:`hpctrain.layout.reduction`), and the layer's gradients summed over their two groups.

Forward, the rank's partial output (its input slice times its weight block) is summed over the
ranks holding the other slices: an all-reduce, or a reduce-scatter into the channels; then the
bias is added, once. Backward, the output gradient as it arrives gives the bias gradient (under
an all-reduce it is a partial sum over those ranks, which the bias's group includes), and the
adjoint of the sum (an all-reduce again, or an all-gather) gives the gradient of the partial
output, from which the kernel makes the weight gradient and the input gradient.
"""

from __future__ import annotations

from typing import Any

from hpctrain.comm.collectives import AllGather, allreduce_sum
from hpctrain.comm.grid import GridSet
from hpctrain.device.backend import Backend
from hpctrain.kernels.products import total
from hpctrain.layers.base import BuildContext, Layer, Parameter
from hpctrain.layout.layout import CHANNEL_AXIS, REPLICAS
from hpctrain.layout.partition import block_range
from hpctrain.layout.reduction import InputSplit


class InputSum:
    """The sum of ``split``'s partial outputs on this rank, with its adjoint, and the
    communicators of the weight's and the bias's gradients."""

    def __init__(self, backend: Backend, grids: GridSet, split: InputSplit, rank: int) -> None:
        self.backend, self.split = backend, split
        x = split.x
        self.comm = grids.over(x, x.digits_of((CHANNEL_AXIS,)))
        self.weight_comm = grids.over(split.weight, split.weight.digits_of((REPLICAS,)))
        self.bias_comm = grids.over(split.bias, split.bias.digits_of((REPLICAS,)))
        self.scatter = None
        if split.scatter:
            # member k of the sum keeps sub-block k of the partial block's channels: block
            # o·q + k of the output's channels, o the weight's row block
            bias = split.bias
            first = bias.block_index(rank, 0) - self.comm.Get_rank()
            ranges = tuple(block_range(bias.shape[0], bias.parts[0], first + k)
                           for k in range(split.parts))
            self.scatter = AllGather(backend, self.comm, CHANNEL_AXIS, ranges)

    def forward(self, partial: Any, bias: Parameter | None) -> Any:
        """The rank's output block from its partial block (a fresh array, summed in place),
        with ``bias`` added."""
        if self.scatter is not None:
            y = self.scatter.backward(partial)  # a reduce-scatter: the adjoint of a gather
        else:
            y = allreduce_sum(self.backend, self.comm, partial)
        if bias is not None:
            y += bias.value.reshape((-1,) + (1,) * (y.ndim - 2))
        return y

    def backward(self, dy: Any, bias: Parameter | None) -> Any:
        """The gradient of the partial block from the output's, ``dy`` (not written into);
        ``bias.grad`` set on the way."""
        if bias is not None:
            bias.grad = total(dy, axis=tuple(a for a in range(dy.ndim) if a != CHANNEL_AXIS))
        if self.scatter is not None:
            return self.scatter.forward(dy)
        return allreduce_sum(self.backend, self.comm, dy.copy())

    def gradient_groups(self, weight: Parameter, bias: Parameter | None
                        ) -> list[tuple[Any, list[Parameter]]]:
        """The weight's gradient summed over the ranks holding its block, the bias's over the
        ranks holding its own."""
        groups = [(self.weight_comm, [weight])]
        return groups + [(self.bias_comm, [bias])] if bias is not None else groups


class InputSplitLayer(Layer):
    """A conv or linear layer, whose input channels may be split: its :class:`InputSum` (None
    where they are whole), and its gradients summed over the groups that sum says."""

    sum: InputSum | None = None
    weight: Parameter
    bias: Parameter | None

    def input_split(self, ctx: BuildContext, weight_shape: tuple[int, ...]
                    ) -> InputSplit | None:
        """The layer's input split on its layouts, its sum made (None: channels whole)."""
        split = InputSplit.of(self.in_layout, self.out_layout, weight_shape)
        self.sum = None if split is None else InputSum(ctx.backend, ctx.grids, split, ctx.rank)
        return split

    def gradient_groups(self) -> list[tuple[Any, list[Parameter]]]:
        if self.sum is None:
            return super().gradient_groups()
        return self.sum.gradient_groups(self.weight, self.bias)
