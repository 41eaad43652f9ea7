"""``conv out=O kernel=K [stride=1] [pad=0] [bias=1]``: convolution of images or volumes
(kernel and stride are ``K``, ``HxW`` or ``DxHxW``; pad is ``P``, ``B+A`` per axis, or
``same``), in batch, model (1.5D) or domain mode."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hpctrain.cost.memory import Footprint
from hpctrain.cost.nodes import Group
from hpctrain.cost.work import LocalWork
from hpctrain.kernels.sliding import prefer_channels_last
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import (
    CHANNEL_AXIS,
    HEIGHT_AXIS,
    Layout,
    Split,
    largest_block,
    shared_channel_digits,
)
from hpctrain.layout.partition import check_split
from hpctrain.model.kinds.base import LayerSpec, Shape
from hpctrain.model.kinds.weighted import SplitsInputs
from hpctrain.model.kinds.window import WINDOW_KEYS, WindowKind, padded_bytes, padded_copy_bytes
from hpctrain.model.options import Key, flag, whole


@dataclass(frozen=True)
class ConvOptions:
    out: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    pad: tuple[tuple[int, int], ...] | str  # (before, after) per axis; "same" in the file
    bias: bool


class ConvKind(SplitsInputs, WindowKind):
    name = "conv"
    keys = {"out": Key(whole(1)), **WINDOW_KEYS, "bias": Key(flag, "1")}
    options = ConvOptions
    weighted = True
    modes = ("model", "domain")
    grid_key = "conv"
    # too few rows or planes to cut Pr ways (or as a split asks)
    fallbacks = {"domain": "model", "split": "model"}

    def out_channels(self, spec: LayerSpec, channels: int) -> int:
        return spec.options.out

    def local_channels(self, spec: LayerSpec, output: Layout) -> int:
        """All O when the channels are whole, O/c (the busiest rank's) cut c ways."""
        return largest_block(output)[CHANNEL_AXIS]

    def param_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        o = spec.options
        found = {"weight": (o.out, shapes[0][0], *o.kernel)}
        return {**found, "bias": (o.out,)} if o.bias else found

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        """Y cut as ``split`` says; X cut the same way along the batch and the spatial axes,
        its channels whole (replicated over the ranks that split the output channels). On the
        1.5D grids: batch/model, X replicated over Pr and Y split by output channels; domain,
        X and Y split along the first spatial axis (height, or a volume's depth). An input
        split cuts X's channels too, and leaves Y replicated over the ranks that sum it, or cut
        further by a reduce-scatter."""
        return self.split_layouts(fed, out_shape, split, range(HEIGHT_AXIS, len(out_shape)))

    def check(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> None:
        super().check(spec, inputs, output)  # the batch, and the spatial splits' rows
        check_split(spec.options.out, output.parts[CHANNEL_AXIS], "output channels", spec.name)

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork:
        """The window kernel (:meth:`~hpctrain.model.kinds.window.WindowKind.work`) over the
        busiest rank's input channels, giving the rows of the weight it holds."""
        work = super().work(spec, inputs, output, need_dx)
        return replace(work, out=self.output_rows(spec, inputs, output))

    def flops(self, work: LocalWork) -> tuple[float, float]:
        n, c = work.x[:2]
        forward = (2.0 * n * work.out * math.prod(work.out_sizes()) * c
                   * math.prod(work.kernel))
        return forward, forward * (2 if work.need_dx else 1)

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        # only timing runs the kernels: planning never loads them
        from hpctrain.kernels.conv import conv_backward, conv_forward

        x = random(work.x)
        w = random((work.out, work.x[1], *work.kernel))
        b = xp.zeros(work.out, dtype=dtype)

        def backward_of(out: Any) -> Callable[[], Any]:
            y, cache = out
            dy = xp.ones_like(y)
            dw = xp.empty_like(w)  # kept across steps, as the layer's gradient is
            return lambda: conv_backward(xp, dy, w, cache, work.stride, work.need_dx, dw)

        return lambda: conv_forward(xp, x, w, b, work.stride, work.pads), backward_of

    def local_parameters(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                         ) -> int:
        split = self.split_parameters(spec, inputs, output)
        if split is not None:
            return split
        o = spec.options
        per_out = inputs[0].shape[CHANNEL_AXIS] * math.prod(o.kernel) + (1 if o.bias else 0)
        return per_out * self.local_channels(spec, output)

    def gradient_group(self, inputs: tuple[Layout, ...], output: Layout) -> Group:
        """Wᵢ is on every rank that holds the same block of output channels: every rank in
        domain mode, the Pc ranks of a model row in model mode."""
        return output.digit_group(shared_channel_digits(output))

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """The im2col columns kept for ΔW; a padded copy of the input while they are made.
        Windows taken channels-last (:mod:`hpctrain.kernels.conv`) always copy the input, and
        turn the input gradient back to NCHW."""
        work, b = fp.work, fp.itemsize
        n, c = work.x[:2]
        out = work.out_sizes()
        cols = c * math.prod(work.kernel) * n * math.prod(out) * b
        last = prefer_channels_last(c, work.kernel, out[-1])
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

    def magnitudes(self, spec: LayerSpec, xs: list[np.ndarray], dy: np.ndarray
                   ) -> dict[str, np.ndarray]:
        """ΔW and Δb are sums over samples and positions of dY·X (windows) and dY: their
        magnitudes are the same sums of ``|dY|·|X|`` and ``|dY|``, by the kernel itself."""
        from hpctrain.kernels.conv import conv_backward, conv_forward

        o = spec.options
        x = np.abs(xs[0])
        w = np.ones((o.out, x.shape[1], *o.kernel))  # any weight: only the windows are used
        _, cache = conv_forward(np, x, w, None, o.stride, o.pad)
        _, dw, db = conv_backward(np, np.abs(dy), w, cache, o.stride, need_dx=False)
        return {"weight": dw, "bias": db} if o.bias else {"weight": dw}

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.conv import Conv  # needs MPI: only when run

        return Conv(spec.name, spec.options, ctx)


KIND = ConvKind()
