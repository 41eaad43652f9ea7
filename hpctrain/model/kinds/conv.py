"""``conv out=O kernel=K [stride=1] [pad=0] [bias=1] [groups=1] [dilation=1]``: convolution of
images or volumes (kernel, stride and dilation are ``K``, ``HxW`` or ``DxHxW``; pad is ``P``,
``B+A`` per axis, or ``same``), grouped (``groups=G``: G groups of C/G inputs and O/G
outputs; depthwise when G = C) and dilated (taps ``dilation`` apart), in batch, model (1.5D)
or domain mode.

A grouped convolution under a split of its output channels gives each rank whole groups, and
its input is cut along the channels as its output is: a rank reads only its own groups'
inputs, so no rank needs the others' and none sums an input gradient (a depthwise layer fed by
a layer of the same channel split runs with no communication at all). An input-channel split
(``i=``) of a grouped layer is refused: its groups already keep inputs apart."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hpctrain.cost.memory import Footprint
from hpctrain.cost.nodes import Group
from hpctrain.cost.work import LocalWork
from hpctrain.kernels.sliding import depthwise_channels_last, live_taps, prefer_channels_last
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import (
    CHANNEL_AXIS,
    HEIGHT_AXIS,
    Layout,
    Split,
    largest_block,
    shared_channel_digits,
)
from hpctrain.layout.partition import SplitError, check_split
from hpctrain.layout.reduction import InputSplit
from hpctrain.model.kinds.base import LayerSpec, Shape
from hpctrain.model.kinds.weighted import SplitsInputs
from hpctrain.model.kinds.window import WINDOW_KEYS, WindowKind, padded_bytes, padded_copy_bytes
from hpctrain.model.options import Key, NetError, flag, sizes, whole


@dataclass(frozen=True)
class ConvOptions:
    out: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    pad: tuple[tuple[int, int], ...] | str  # (before, after) per axis; "same" in the file
    bias: bool
    groups: int = 1
    dilation: tuple[int, ...] = (1,)  # per axis once resolved


def check_whole_groups(layer: str, groups: int, parts: int) -> None:
    """Refuse a split of a grouped layer's output channels into ``parts`` blocks that are not
    whole groups (each rank computes whole groups)."""
    if groups > 1 and groups % parts:
        raise SplitError(f"layer {layer}: its {groups} groups cannot be cut into {parts} "
                         f"blocks of whole groups; give its output channels a degree that "
                         f"divides {groups}")


class ConvKind(SplitsInputs, WindowKind):
    name = "conv"
    keys = {"out": Key(whole(1)), **WINDOW_KEYS, "bias": Key(flag, "1"),
            "groups": Key(whole(1), "1"), "dilation": Key(sizes(1), "1")}
    options = ConvOptions
    weighted = True
    modes = ("model", "domain")
    grid_key = "conv"
    # too few rows or planes to cut Pr ways (or as a split asks)
    fallbacks = {"domain": "model", "split": "model"}

    def option_texts(self, options: Any) -> dict[str, str]:
        """As every kind's, without ``groups=1`` and ``dilation=1``: a plain convolution's
        line reads as it always did."""
        texts = super().option_texts(options)
        if options.groups == 1:
            del texts["groups"]
        if all(step == 1 for step in options.dilation):
            del texts["dilation"]
        return texts

    def resolve(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> LayerSpec:
        """The window's sizes and the dilation one per spatial axis
        (:func:`~hpctrain.model.kinds.window.spread_window`); groups that divide both the input
        and the output channels."""
        spec = super().resolve(spec, shapes, where)
        o, c = spec.options, shapes[0][0]
        if c % o.groups or o.out % o.groups:
            raise NetError(f"{where}: layer {spec.name}: groups={o.groups} must divide its "
                           f"{c} input and {o.out} output channels")
        return spec

    def out_channels(self, spec: LayerSpec, channels: int) -> int:
        return spec.options.out

    def local_groups(self, spec: LayerSpec, output: Layout) -> int:
        """Groups the busiest rank computes: all G, or G/c where its output channels are cut
        c ways (each rank whole groups, :meth:`check`)."""
        return max(1, spec.options.groups // output.parts[CHANNEL_AXIS])

    def local_channels(self, spec: LayerSpec, output: Layout) -> int:
        """All O when the channels are whole, O/c (the busiest rank's) cut c ways."""
        return largest_block(output)[CHANNEL_AXIS]

    def param_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        o = spec.options
        found = {"weight": (o.out, shapes[0][0], *o.kernel)}
        found["weight"] = (o.out, shapes[0][0] // o.groups, *o.kernel)
        return {**found, "bias": (o.out,)} if o.bias else found

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        """Y cut as ``split`` says; X cut the same way along the batch and the spatial axes,
        its channels whole (replicated over the ranks that split the output channels). On the
        1.5D grids: batch/model, X replicated over Pr and Y split by output channels; domain,
        X and Y split along the first spatial axis (height, or a volume's depth). An input
        split cuts X's channels too, and leaves Y replicated over the ranks that sum it, or cut
        further by a reduce-scatter.
        A grouped layer whose output channels are cut into blocks of whole groups takes its
        input cut the same way along the channels."""
        spatial = range(HEIGHT_AXIS, len(out_shape))
        c = split.degrees[CHANNEL_AXIS]
        if spec.options.groups > 1 and c > 1 and split.inputs == 1 \
                and spec.options.groups % c == 0:
            return ((Layout.of_split(fed[0].shape, split, (CHANNEL_AXIS, *spatial)),),
                    Layout.of_split(out_shape, split))
        return self.split_layouts(fed, out_shape, split, spatial)

    def check(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> None:
        super().check(spec, inputs, output)  # the batch, and the spatial splits' rows
        check_split(spec.options.out, output.parts[CHANNEL_AXIS], "output channels", spec.name)
        groups = spec.options.groups
        check_whole_groups(spec.name, groups, output.parts[CHANNEL_AXIS])
        if groups > 1 and (inputs[0].digits_of((CHANNEL_AXIS,))
                           != output.digits_of((CHANNEL_AXIS,))):
            raise SplitError(f"layer {spec.name}: a grouped convolution's input channels are "
                             f"split as its output channels are, never on their own; give i=1")

    def input_split(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                    ) -> InputSplit | None:
        """None for a grouped layer: its input is cut with its groups, and nothing is summed
        (:meth:`check`)."""
        if spec.options.groups > 1:
            return None
        return super().input_split(spec, inputs, output)

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork:
        """The window kernel (:meth:`~hpctrain.model.kinds.window.WindowKind.work`) over the
        busiest rank's input channels, giving the rows of the weight it holds."""
        return self.window_work(spec, inputs[0], self.output_rows(spec, inputs, output),
                                need_dx, groups=self.local_groups(spec, output),
                                dilation=spec.options.dilation)

    def flops(self, work: LocalWork) -> tuple[float, float]:
        n, c = work.x[:2]
        forward = (2.0 * n * work.out * math.prod(work.out_sizes()) * (c // work.groups)
                   * math.prod(work.kernel))
        return forward, forward * (2 if work.need_dx else 1)

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        # only timing runs the kernels: planning never loads them
        from hpctrain.kernels.conv import conv_backward, conv_forward

        x = random(work.x)
        w = random((work.out, work.x[1] // work.groups, *work.kernel))
        b = xp.zeros(work.out, dtype=dtype)
        dilation = work.dilation or None

        def backward_of(out: Any) -> Callable[[], Any]:
            y, cache = out
            dy = xp.ones_like(y)
            dw = xp.empty_like(w)  # kept across steps, as the layer's gradient is
            return lambda: conv_backward(xp, dy, w, cache, work.stride, work.need_dx, dw)

        return (lambda: conv_forward(xp, x, w, b, work.stride, work.pads, dilation=dilation,
                                     groups=work.groups), backward_of)

    def local_parameters(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                         ) -> int:
        split = self.split_parameters(spec, inputs, output)
        if split is not None:
            return split
        o = spec.options
        per_out = (inputs[0].shape[CHANNEL_AXIS] // o.groups * math.prod(o.kernel)
                   + (1 if o.bias else 0))
        return per_out * self.local_channels(spec, output)

    def gradient_group(self, inputs: tuple[Layout, ...], output: Layout) -> Group:
        """Wᵢ is on every rank that holds the same block of output channels: every rank in
        domain mode, the Pc ranks of a model row in model mode."""
        return output.digit_group(shared_channel_digits(output))

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """The im2col columns kept for ΔW; a padded copy of the input while they are made.
        Windows taken channels-last (:mod:`hpctrain.kernels.conv`) always copy the input, and
        turn the input gradient back to NCHW. Taps that read only padding are not taken
        (:func:`~hpctrain.kernels.sliding.live_taps`), nor the padding they read."""
        work, b = fp.work, fp.itemsize
        live = live_taps(tuple(work.x[2:]), work.kernel, work.stride, work.pads,
                         work.dilation or None)
        if live is not None:
            taps, pads = live
            kernel = tuple(len(range(k)[t]) for k, t in zip(work.kernel, taps, strict=True))
            work = replace(work, kernel=kernel, pads=pads)
            fp = replace(fp, work=work)
        n, c = work.x[:2]
        out = work.out_sizes()
        if 1 < work.groups == c == work.out:  # depthwise: the padded input, kept; no columns
            return self.depthwise_memory(fp)
        cols = c * math.prod(work.kernel) * n * math.prod(out) * b
        # grouped products are taken channel-major (hpctrain.kernels.conv)
        last = work.groups == 1 and prefer_channels_last(c, work.kernel, out[-1])
        copy = padded_bytes(work, b) if last else padded_copy_bytes(fp)
        y = n * work.out * math.prod(out) * b
        forward = {**fp.loose_input, "im2col workspace": cols, "padded input": copy,
                   "output and GEMM result": 2 * y}
        backward = {"output gradient and its transpose": 2 * y}
        if work.need_dx:
            backward.update({"im2col workspace": cols, "padded input gradient": copy})
            if last:
                backward["input gradient, channel-major"] = math.prod(work.x) * b
        return {"im2col columns": cols}, fp.phases(forward, backward)

    def depthwise_memory(self, fp: Footprint) -> tuple[dict[str, float], dict[str, float]]:
        """A depthwise layer keeps its padded input for ΔW; each tap's product takes an output's
        room; channels-last (:func:`~hpctrain.kernels.sliding.depthwise_channels_last`) the
        output and the gradients are transposed once more."""
        work, b = fp.work, fp.itemsize
        padded = padded_bytes(work, b)
        y = work.x[0] * work.out * math.prod(work.out_sizes()) * b
        last = depthwise_channels_last(work.x[1])
        forward = {**fp.loose_input, "output and tap product": (3 if last else 2) * y}
        backward = {"output gradient and tap product": (3 if last else 2) * y}
        if work.need_dx:
            backward["padded input gradient"] = padded
            if last:
                backward["input gradient, channel-major"] = math.prod(work.x) * b
        return {"padded input": padded}, fp.phases(forward, backward)

    def magnitudes(self, spec: LayerSpec, xs: list[np.ndarray], dy: np.ndarray
                   ) -> dict[str, np.ndarray]:
        """ΔW and Δb are sums over samples and positions of dY·X (windows) and dY: their
        magnitudes are the same sums of ``|dY|·|X|`` and ``|dY|``, by the kernel itself."""
        from hpctrain.kernels.conv import conv_backward, conv_forward

        o = spec.options
        x = np.abs(xs[0])
        # any weight: only the windows are used
        w = np.ones((o.out, x.shape[1] // o.groups, *o.kernel))
        _, cache = conv_forward(np, x, w, None, o.stride, o.pad, dilation=o.dilation,
                                groups=o.groups)
        _, dw, db = conv_backward(np, np.abs(dy), w, cache, o.stride, need_dx=False)
        return {"weight": dw, "bias": db} if o.bias else {"weight": dw}

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.conv import Conv  # needs MPI: only when run

        return Conv(spec.name, spec.options, ctx)


KIND = ConvKind()
