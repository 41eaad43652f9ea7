"""``deconv out=O kernel=K [stride=1] [pad=0] [outpad=0] [bias=1] [groups=1] [dilation=1]``:
transposed convolution of images or volumes (PyTorch's ``ConvTranspose2d``/``3d``, ONNX's
``ConvTranspose``), the learned upsampling of a segmentation net's decoder. Each input entry
spreads its weighted copies over a window of the output, ``stride`` apart; ``pad`` crops the
output (``P``, or ``B+A`` per axis) and ``outpad`` gives back entries at its end (PyTorch's
``output_padding``), so that a stride-2 layer with kernel 3, pad 1 and outpad 1 doubles the size.
The weight is PyTorch's, (C, O/G, K…).

Its modes and splits are a convolution's, and it shares its ``--grid conv=`` key: a split of the
output channels gives each rank a block of the weight's columns, all input channels (or, grouped,
whole groups with their input channels cut alike), and the ranks' input gradients are partial
sums that the move's adjoint adds; a domain split gives each rank its output rows, computed from
the input rows that reach them (:class:`~hpctrain.layout.partition.TransposedWindow`) with halo
rows from its neighbours. Unlike LBANN's, any kernel, stride, padding and output padding split.
An input-channel split (``i=``) is refused: a convolution's sum over its inputs is what a
transposed convolution's output channels are not."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpctrain.cost.memory import Footprint
from hpctrain.cost.nodes import Group
from hpctrain.cost.work import LocalWork
from hpctrain.kernels.sliding import full_size
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import (
    CHANNEL_AXIS,
    HEIGHT_AXIS,
    REPLICAS,
    Layout,
    Split,
    largest_block,
    shared_channel_digits,
)
from hpctrain.layout.partition import SplitError, TransposedWindow, check_split
from hpctrain.model.kinds.base import LayerSpec, Shape
from hpctrain.model.kinds.conv import check_whole_groups
from hpctrain.model.kinds.window import WINDOW_KEYS, WindowKind, busiest_halo, spread_window
from hpctrain.model.options import SAME, Key, NetError, flag, sizes, spread, whole


@dataclass(frozen=True)
class DeconvOptions:
    out: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    pad: tuple[tuple[int, int], ...] | str  # (before, after) per axis, cropped from the output
    outpad: tuple[int, ...]  # entries given back at the end of each axis
    bias: bool
    groups: int = 1
    dilation: tuple[int, ...] = (1,)

    def windows(self) -> list[TransposedWindow]:
        """The transposed window along each spatial axis (once resolved)."""
        return [TransposedWindow(k, s, before, after - extra, d) for k, s, (before, after), extra, d
                in zip(self.kernel, self.stride, self.pad, self.outpad, self.dilation,
                       strict=True)]


class DeconvKind(WindowKind):
    name = "deconv"
    keys = {"out": Key(whole(1)), **WINDOW_KEYS, "outpad": Key(sizes(0), "0"),
            "bias": Key(flag, "1"), "groups": Key(whole(1), "1"), "dilation": Key(sizes(1), "1")}
    options = DeconvOptions
    weighted = True
    modes = ("model", "domain")
    grid_key = "conv"  # split as a convolution is, by the same --grid key
    fallbacks = {"domain": "model", "split": "model"}

    def parse(self, texts: dict[str, str], where: str) -> Any:
        options = super().parse(texts, where)
        if options.pad == SAME:
            raise NetError(f"{where}: deconv pad= crops the output; give P or before+after "
                           f"(pad=same is a convolution's)")
        return options

    def option_texts(self, options: Any) -> dict[str, str]:
        """As every kind's, without the defaults a plain layer leaves out."""
        texts = super().option_texts(options)
        for key, plain in (("groups", options.groups == 1),
                           ("dilation", all(d == 1 for d in options.dilation)),
                           ("outpad", not any(options.outpad))):
            if plain:
                del texts[key]
        return texts

    def resolve(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> LayerSpec:
        """Kernel, stride, pad, dilation and output padding one per spatial axis; the output
        padding smaller than the stride or the dilation (PyTorch's rule: anything more would
        be entries no input reaches), groups dividing both channel counts."""
        o, shape = spec.options, shapes[0]
        found = spread_window(spec, shape, where)
        outpad = spread(o.outpad, len(shape) - 1, "outpad", where, spec.name)
        for q, s, d in zip(outpad, found["stride"], found["dilation"], strict=True):
            if q >= max(s, d):
                raise NetError(f"{where}: layer {spec.name}: outpad={q} must be smaller than "
                               f"the stride ({s}) or the dilation ({d})")
        c = shape[0]
        if c % o.groups or o.out % o.groups:
            raise NetError(f"{where}: layer {spec.name}: groups={o.groups} must divide its "
                           f"{c} input and {o.out} output channels")
        return dataclasses.replace(spec, options=dataclasses.replace(o, **found, outpad=outpad))

    def out_channels(self, spec: LayerSpec, channels: int) -> int:
        return spec.options.out

    def local_channels(self, spec: LayerSpec, output: Layout) -> int:
        return largest_block(output)[CHANNEL_AXIS]

    def param_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        o = spec.options
        found = {"weight": (shapes[0][0], o.out // o.groups, *o.kernel)}
        return {**found, "bias": (o.out,)} if o.bias else found

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        """Y cut as ``split`` says; X cut the same way along the batch and the spatial axes,
        its channels whole, or cut as Y's are where a grouped layer's ranks hold whole
        groups. An input-channel split is refused (the module's text)."""
        if split.inputs > 1:
            raise SplitError(f"layer {spec.name}: a transposed convolution does not split its "
                             f"input channels; give i=1")
        spatial = tuple(range(HEIGHT_AXIS, len(out_shape)))
        c = split.degrees[CHANNEL_AXIS]
        grouped = spec.options.groups > 1 and c > 1 and spec.options.groups % c == 0
        cut = (CHANNEL_AXIS, *spatial) if grouped else spatial
        return ((Layout.of_split(fed[0].shape, split, cut),), Layout.of_split(out_shape, split))

    def check(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> None:
        super().check(spec, inputs, output)  # the batch, and the spatial splits' rows
        check_split(spec.options.out, output.parts[CHANNEL_AXIS], "output channels", spec.name)
        groups, c = spec.options.groups, output.parts[CHANNEL_AXIS]
        check_whole_groups(spec.name, groups, c)
        if groups > 1 and c > 1:
            same = inputs[0].digits_of((CHANNEL_AXIS,)) == output.digits_of((CHANNEL_AXIS,))
        else:
            same = inputs[0].parts[CHANNEL_AXIS] == 1
        if not same:
            raise SplitError(f"layer {spec.name}: a transposed convolution does not split its "
                             f"input channels on their own; give i=1")

    def weight_layout(self, spec: LayerSpec, weight_shape: Shape, output: Layout) -> Layout:
        """Where the weight (C, O/G, K…) lies: its columns (axis 1) cut as the output's
        channels are, or, grouped, its rows (axis 0: whole groups with their inputs)."""
        axis = 0 if spec.options.groups > 1 else 1
        return Layout(weight_shape, mesh=output.mesh,
                      axes=tuple(axis if a == CHANNEL_AXIS else REPLICAS for a in output.axes),
                      first=output.first, procs=output.procs)

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork:
        """The busiest rank's input rows (with halos) spread over its output rows: the window
        kernel with ``pads`` the crop of the full output, (first, after) per axis."""
        o, x = spec.options, inputs[0]
        windows = o.windows()
        block = list(largest_block(x))
        rows = [(0, n) for n in x.shape[2:]]
        outs = [(0, w.out_size(n)) for w, n in zip(windows, x.shape[2:], strict=True)]
        for axis in x.spatial_cuts:
            p = busiest_halo(spec, x, axis)
            block[axis] = p.need[1] - p.need[0]
            rows[axis - 2], outs[axis - 2] = p.need, p.out
        pads = []
        for w, (r0, r1), out in zip(windows, rows, outs, strict=True):
            first, size = w.crop((r0, r1), out)
            pads.append((first, full_size(r1 - r0, w.kernel, w.stride, w.dilation) - first - size))
        return LocalWork(self, tuple(block), self.local_channels(spec, output), o.kernel,
                         o.stride, tuple(pads), need_dx,
                         groups=max(1, o.groups // output.parts[CHANNEL_AXIS]),
                         dilation=o.dilation, transposed=True)

    def flops(self, work: LocalWork) -> tuple[float, float]:
        """Per input entry and group, (O/G·K) × (C/G) products: forward; the input gradient
        (a convolution of as many) and the weight's take as many each."""
        n, c, *size = work.x
        forward = (2.0 * n * math.prod(size) * (c // work.groups) * work.out
                   * math.prod(work.kernel))
        return forward, forward * (2 if work.need_dx else 1)

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        from hpctrain.kernels.deconv import deconv_backward, deconv_forward

        x = random(work.x)
        w = random((work.x[1], work.out // work.groups, *work.kernel))
        b = xp.zeros(work.out, dtype=dtype)
        crop = tuple((first, size) for (first, _), size in zip(work.pads, work.out_sizes(),
                                                                strict=True))
        dilation = work.dilation or None

        def backward_of(out: Any) -> Callable[[], Any]:
            y, cache = out
            dy = xp.ones_like(y)
            dw = xp.empty_like(w)
            return lambda: deconv_backward(xp, dy, w, cache, work.need_dx, dw)

        return (lambda: deconv_forward(xp, x, w, b, work.stride, crop, dilation, work.groups),
                backward_of)

    def local_parameters(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                         ) -> int:
        o = spec.options
        per_out = (inputs[0].shape[CHANNEL_AXIS] // o.groups * math.prod(o.kernel)
                   + (1 if o.bias else 0))
        return per_out * self.local_channels(spec, output)

    def gradient_group(self, inputs: tuple[Layout, ...], output: Layout) -> Group:
        """W's block is on every rank that holds the same block of output channels."""
        return output.digit_group(shared_channel_digits(output))

    def keeps_input(self, spec: LayerSpec) -> bool:
        return True  # the weight gradient reads X

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """Forward: the columns Wᵀ·X and the full output they are scattered into; backward:
        the output gradient put back in the full output, and the columns of the convolution
        that makes the input gradient (kept for the weight gradient)."""
        work, b = fp.work, fp.itemsize
        n = work.x[0]
        columns = work.out * math.prod(work.kernel) * n * math.prod(work.x[2:]) * b
        full = n * work.out * math.prod(
            full_size(m, k, s, d) for m, k, s, d in zip(work.x[2:], work.kernel, work.stride,
                                                        work.dilation or (1,) * len(work.kernel),
                                                        strict=True)) * b
        forward = {**fp.loose_input, "columns": columns, "full output": full,
                   "output": fp.y}
        backward = {"full output gradient": full, "columns": columns}
        if work.need_dx:
            backward["input gradient"] = fp.x
        return {}, fp.phases(forward, backward)

    def magnitudes(self, spec: LayerSpec, xs: list[np.ndarray], dy: np.ndarray
                   ) -> dict[str, np.ndarray]:
        """ΔW and Δb are sums of X·dY and of dY: their magnitudes are the same sums of
        ``|X|·|dY|`` and ``|dY|``, by the kernel itself."""
        from hpctrain.kernels.deconv import deconv_backward, deconv_forward

        o = spec.options
        x = np.abs(xs[0])
        w = np.ones((x.shape[1], o.out // o.groups, *o.kernel))  # any: only X is read
        windows = o.windows()
        crop = tuple(win.crop((0, n), (0, win.out_size(n)))
                     for win, n in zip(windows, x.shape[2:], strict=True))
        _, cache = deconv_forward(np, x, w, None, o.stride, crop, o.dilation, o.groups)
        _, dw, db = deconv_backward(np, np.abs(dy), w, cache, need_dx=False)
        return {"weight": dw, "bias": db} if o.bias else {"weight": dw}

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.deconv import Deconv  # needs MPI: only when run

        return Deconv(spec.name, spec.options, ctx, self.weight_layout(
            spec, self.param_shapes(spec, (ctx.inputs[0].shape[1:],))["weight"], ctx.output))


KIND = DeconvKind()
