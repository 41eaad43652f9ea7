"""Input splits: a conv or linear layer whose input channels (or features) are cut, and the sum
that completes its output (pure maths, no MPI).

Under a :class:`~hpctrain.layout.layout.Split` with ``inputs = q > 1`` a rank holds a slice of
the input channels and the matching block of the weight, ``W[o-block, i-block]``, and computes
a *partial* output: the true output block is the sum of the partial blocks of the q ranks that
hold the same output block and the other input slices. The layer sums them before anything
else sees its output (:class:`~hpctrain.layers.partial.InputSum`):

- by an all-reduce over those q ranks, after which each holds the whole block (the output is
  replicated over them); the backward is an all-reduce too (the gradient of a replicated
  output is held as partial sums, :mod:`hpctrain.layout.layout`);
- or by a reduce-scatter that leaves each of them a sub-block of the channels (the output is
  cut ``c·q`` ways); the backward is its adjoint, an all-gather.

The input gradient stays cut as the input is, with no gather: ``ΔX_i = ΔY W_(o,i)``, a partial
sum over the output blocks, as for any layer whose input is replicated over them.

Everything here is read off the layer's two layouts, input and output, which the layer, the
cost model and the plan table all have: :func:`common_mesh` finds the mesh of the split that
made them, and :class:`InputSplit` which block of the weight and bias each rank holds and over
which ranks their gradients are summed. Worked example, a linear layer of 6 inputs and 4
outputs on 4 ranks as ``c=2,i=2`` (rank = 2·o + i)::

    rank      0        1        2        3
    X cols  [0,3)    [3,6)    [0,3)    [3,6)
    W block [0,2)x[0,3) [0,2)x[3,6) [2,4)x[0,3) [2,4)x[3,6)
    sum     ranks {0,1} for outputs [0,2), {2,3} for outputs [2,4)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from hpctrain.cost.collectives import (
    allgather_time,
    allreduce_time,
    reduce_scatter_time,
)
from hpctrain.cost.machine import Machine
from hpctrain.cost.nodes import Group
from hpctrain.layout.layout import CHANNEL_AXIS, REPLICAS, Layout, shared_layout


def _strides(layout: Layout) -> list[int]:
    """The rank stride of each digit boundary of ``layout``'s mesh, 1 to P, fastest first."""
    found, stride = [1], 1
    for size in reversed(layout.mesh):
        stride *= size
        found.append(stride)
    return found


def _axis_at(layout: Layout, stride: int) -> int:
    """The axis cut by the digit of ``layout``'s mesh that holds rank stride ``stride``."""
    below = 1
    for size, axis in zip(reversed(layout.mesh), reversed(layout.axes), strict=True):
        if below <= stride < below * size:
            return axis
        below *= size
    raise ValueError(f"stride {stride} is outside a mesh of {layout.size} ranks")


def common_mesh(a: Layout, b: Layout) -> tuple[tuple[int, ...], tuple[int, ...],
                                               tuple[int, ...]]:
    """(digit sizes slowest first, the axis each cuts in ``a``, in ``b``) of the coarsest mesh
    that refines both layouts' meshes. Two layouts of one split are coarsenings of its mesh
    (neighbours on one axis merged), so their digit boundaries nest into one chain."""
    bounds = sorted(set(_strides(a)) | set(_strides(b)))
    if bounds[-1] != a.size or a.size != b.size:
        raise ValueError("layouts on different numbers of ranks")
    sizes, in_a, in_b = [], [], []
    for lo, hi in zip(bounds, bounds[1:]):
        if hi % lo:
            raise ValueError(f"meshes {a.mesh} and {b.mesh} come from different splits")
        sizes.append(hi // lo)
        in_a.append(_axis_at(a, lo))
        in_b.append(_axis_at(b, lo))
    return tuple(reversed(sizes)), tuple(reversed(in_a)), tuple(reversed(in_b))


@dataclass(frozen=True)
class InputSplit:
    """How a conv or linear layer read on ``x`` and giving ``y`` splits its input channels.

    ``x``: the input's layout, its channels cut over the ranks of a sum. ``scatter``: the sum is a
    reduce-scatter into the output's channels (else an all-reduce). ``weight``, ``bias``:
    layouts of the whole weight (output channels first, input channels second) and bias on
    the same ranks, from which each rank's block (``box``) and the ranks that share it
    (``REPLICAS`` digits) follow. ``partial``: the layout of the output before its sum, its
    channels cut as the weight's rows.
    """

    x: Layout
    scatter: bool
    weight: Layout
    bias: Layout
    partial: Layout

    @staticmethod
    def of(x: Layout, y: Layout, weight_shape: tuple[int, ...]) -> InputSplit | None:
        """The input split of a layer reading ``x`` and giving ``y`` with a weight of
        ``weight_shape``; None where its input channels are whole. Made once per layouts:
        the cost model asks for it several times for every layer it prices."""
        return None if x.parts[CHANNEL_AXIS] == 1 else _input_split(x, y, weight_shape)

    @property
    def parts(self) -> int:
        """How many ranks hold parts of each sum (q)."""
        return self.x.parts[CHANNEL_AXIS]

    # -- groups of ranks ---------------------------------------------------------------------

    @property
    def sum_group(self) -> Group:
        """The ranks that add up one output block, which differ only in their slice of the
        input channels."""
        return self.x.group((CHANNEL_AXIS,))

    @property
    def weight_group(self) -> Group:
        """The ranks holding the same block of the weight, whose gradients are summed."""
        return self.weight.group((REPLICAS,))

    @property
    def bias_group(self) -> Group:
        """The ranks holding the same block of the bias. The bias is added after the sum, and
        its gradient made from the output gradient as it arrives: under an all-reduce that is
        a partial sum over the q ranks, which this group then includes."""
        return self.bias.group((REPLICAS,))

    # -- sizes and prices --------------------------------------------------------------------

    @property
    def partial_channels(self) -> int:
        """The output channels of the busiest rank's partial block (the weight's rows)."""
        return self.partial.largest_block[CHANNEL_AXIS]

    def local_parameters(self, bias: bool) -> tuple[int, int]:
        """(weight, bias) entries the busiest rank holds: ``|W| / (c·q)`` and its bias block."""
        weight = math.prod(self.weight.largest_block)
        return weight, (self.bias.largest_block[0] if bias else 0)

    def sum_seconds(self, machine: Machine, itemsize: int) -> tuple[float, float]:
        """(forward, backward) seconds of the sum at the busiest rank: an all-reduce each way,
        or a reduce-scatter and its adjoint all-gather."""
        n = math.prod(self.partial.largest_block) * itemsize
        group = self.sum_group
        if self.scatter:
            return reduce_scatter_time(machine, group, n), allgather_time(machine, group, n)
        once = allreduce_time(machine, group, n)
        return once, once

    def gradient_sums(self, itemsize: int, bias: bool) -> list[tuple[Group, float]]:
        """(ranks, bytes) of the parameter gradients' sums: the weight's over its group, the
        bias's over its own."""
        weight, bias_entries = self.local_parameters(bias)
        sums = [(self.weight_group, weight * itemsize)]
        return sums + [(self.bias_group, bias_entries * itemsize)] if bias_entries else sums


@lru_cache(maxsize=4096)
def _input_split(x: Layout, y: Layout, weight_shape: tuple[int, ...]) -> InputSplit:
    """:meth:`InputSplit.of` where ``x`` cuts its channels."""
    sizes, in_x, in_y = common_mesh(x, y)
    pairs = list(zip(in_x, in_y, strict=True))
    # the digits of the weight's rows: they cut the output's channels, not the input's
    rows = [ay == CHANNEL_AXIS and ax != CHANNEL_AXIS for ax, ay in pairs]
    scatter = any(ax == CHANNEL_AXIS and ay == CHANNEL_AXIS for ax, ay in pairs)
    weight_axes = tuple(0 if row else 1 if ax == CHANNEL_AXIS else REPLICAS
                        for row, ax in zip(rows, in_x, strict=True))
    partial_axes = tuple(CHANNEL_AXIS if row else REPLICAS if ax == CHANNEL_AXIS else ay
                         for row, ax, ay in zip(rows, in_x, in_y, strict=True))
    bias_axes = tuple(0 if axis == CHANNEL_AXIS else REPLICAS for axis in y.axes)
    where = (None, y.first, y.procs)  # on the layer's ranks (a group, or all)
    return InputSplit(x, scatter, shared_layout(weight_shape, sizes, weight_axes, *where),
                      shared_layout(weight_shape[:1], y.mesh, bias_axes, *where),
                      shared_layout(y.shape, sizes, partial_axes, *where))
