"""What the weighted kinds (conv, linear) share for a split of their input channels: the sum
that completes their output, the gradients summed over two groups, and the rows of the weight a
rank holds (:mod:`hpctrain.layout.reduction`)."""

from __future__ import annotations

from collections.abc import Iterable

from hpctrain.cost.machine import Machine
from hpctrain.cost.nodes import Group
from hpctrain.layout.layout import CHANNEL_AXIS, REPLICAS, Layout, Split, axis_name, largest_block
from hpctrain.layout.partition import check_split
from hpctrain.layout.reduction import InputSplit
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape


class SplitsInputs(Kind):
    """A kind whose layers may split their input channels (``i=`` or ``s=`` in a split): mixed
    in before the kind's own base, so that its prices include the sum."""

    def split_layouts(self, fed: tuple[Layout, ...], out_shape: Shape, split: Split,
                      cut: Iterable[int]) -> tuple[tuple[Layout, ...], Layout]:
        """X cut as ``split`` cuts the output along the batch and the axes in ``cut``, and
        along its channels by the input digit; Y cut as ``split`` says, replicated over the
        ranks that sum it, or cut further by a reduce-scatter."""
        summed = CHANNEL_AXIS if split.scatter else REPLICAS
        return ((Layout.of_split(fed[0].shape, split, cut, CHANNEL_AXIS),),
                Layout.of_split(out_shape, split, reduction=summed))

    def check(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> None:
        super().check(spec, inputs, output)
        x = inputs[0]
        check_split(x.shape[CHANNEL_AXIS], x.parts[CHANNEL_AXIS],
                    f"input {axis_name(x.shape, CHANNEL_AXIS)}", spec.name)

    def input_split(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                    ) -> InputSplit | None:
        """The layer's input split on these layouts (None: its input channels are whole)."""
        if inputs[0].parts[CHANNEL_AXIS] == 1:
            return None
        weight = self.param_shapes(spec, (inputs[0].shape[1:],))["weight"]
        return InputSplit.of(inputs[0], output, weight)

    def output_rows(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> int:
        """Output channels (or features) the busiest rank computes: its block of the output,
        or, where the input channels are split, its block of the sum's parts (the weight's
        rows), which a reduce-scatter then cuts further."""
        split = self.input_split(spec, inputs, output)
        return largest_block(output)[CHANNEL_AXIS] if split is None else split.partial_channels

    def split_parameters(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                         ) -> int | None:
        """Parameter entries the busiest rank holds under an input split (None: no split)."""
        split = self.input_split(spec, inputs, output)
        return None if split is None else sum(split.local_parameters(spec.options.bias))

    def gradient_sums(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                      itemsize: int) -> list[tuple[Group, float]]:
        split = self.input_split(spec, inputs, output)
        if split is None:
            return super().gradient_sums(spec, inputs, output, itemsize)
        return split.gradient_sums(itemsize, spec.options.bias)

    def comm_time(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                  machine: Machine, itemsize: int, sums: float | None = None
                  ) -> tuple[float, float]:
        """The kind's own communication, and the sum of an input split's parts."""
        forward, backward = super().comm_time(spec, inputs, output, machine, itemsize, sums)
        split = self.input_split(spec, inputs, output)
        if split is None:
            return forward, backward
        summed = split.sum_seconds(machine, itemsize)
        return forward + summed[0], backward + summed[1]
