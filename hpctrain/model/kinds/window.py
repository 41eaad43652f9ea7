"""What the window kinds (convolution, max and average pooling) share: kernel, stride and pad
along each spatial axis of an image (height, width) or a volume (depth, height, width), and
the split of the first spatial axis with its halo rows.

The first spatial axis is the one a domain split cuts (:class:`~hpctrain.layout.partition.Window`
and its halo plans); the others are never split and pad as the options say. A net file gives a
window's sizes once for every axis or once per axis; :meth:`WindowKind.resolve` spreads them
over the axes of the layer's input, so the options a layer holds have one entry per axis.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpctrain.cost.collectives import halo_time
from hpctrain.cost.machine import Machine
from hpctrain.cost.memory import Footprint
from hpctrain.cost.nodes import halo_crossings
from hpctrain.cost.work import LocalWork
from hpctrain.io.units import shape_text
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import Layout, Split, axis_name, largest_block
from hpctrain.layout.partition import (
    HaloPlan,
    SplitError,
    Window,
    halo_plans,
    halo_row_counts,
    windows_of,
)
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape
from hpctrain.model.options import SAME, Key, NetError, padding, sizes, spread

WINDOW_KEYS = {"kernel": Key(sizes(1)), "stride": Key(sizes(1), "1"), "pad": Key(padding, "0")}
# pooling: stride 0 (the default) means the kernel, filled in by spread_window
POOL_KEYS = {**WINDOW_KEYS, "stride": Key(sizes(0), "0")}


def rows(o: Any) -> Window:
    """The window along the first spatial axis (the one a domain split cuts) of options ``o``."""
    return windows_of(o)[0]


def spread_window(spec: LayerSpec, shape: Shape, where: str) -> dict[str, tuple]:
    """The kernel, stride and pad of ``spec`` (and its dilation, where it has one) with one
    entry per spatial axis of the per-sample input ``shape``: a stride of 0 (a pool's default)
    made the kernel, ``pad=same`` TensorFlow's padding for stride 1 (of the window's span,
    dilated)."""
    o = spec.options
    if len(shape) < 2:
        raise NetError(f"{where}: layer {spec.name} ({spec.kind}) needs an image or volume "
                       f"input, got shape {shape}")
    axes = len(shape) - 1
    kernel = spread(o.kernel, axes, "kernel", where, spec.name)
    stride = tuple(s or k for s, k in zip(spread(o.stride, axes, "stride", where, spec.name),
                                          kernel, strict=True))  # a pool's 0: its kernel
    found = {"kernel": kernel, "stride": stride}
    span = kernel
    if hasattr(o, "dilation"):
        found["dilation"] = spread(o.dilation, axes, "dilation", where, spec.name)
        span = tuple(d * (k - 1) + 1 for k, d in zip(kernel, found["dilation"], strict=True))
    if o.pad == SAME:
        if any(s != 1 for s in stride):
            raise NetError(f"{where}: layer {spec.name}: pad=same needs stride=1 (a pool's "
                           f"stride is its kernel unless given); give stride=1, or the "
                           f"padding as before+after, e.g. pad=0+1")
        pad = tuple(((k - 1) // 2, k - 1 - (k - 1) // 2) for k in span)
    else:
        pad = spread(o.pad, axes, "pad", where, spec.name)
    return {**found, "pad": pad}


def check_window(spec: LayerSpec, shape: Shape, where: str) -> Shape:
    """The spatial output sizes of a window layer on per-sample ``shape``, refused when the
    input is too small."""
    o = spec.options
    if len(shape) != len(o.kernel) + 1:
        raise NetError(f"{where}: layer {spec.name} ({spec.kind}) needs an input with "
                       f"{len(o.kernel)} spatial axes, got shape {shape}")
    out = tuple(w.out_size(n) for w, n in zip(windows_of(o), shape[1:], strict=True))
    if min(out) < 1:
        pad = "x".join(str(b) if b == a else f"{b}+{a}" for b, a in o.pad)
        dilation = getattr(o, "dilation", None)
        dilated = (f", dilation {shape_text(dilation)}"
                   if dilation and any(d != 1 for d in dilation) else "")
        raise NetError(f"{where}: layer {spec.name} receives {shape_text(shape[1:])}, too "
                       f"small for its window (kernel {shape_text(o.kernel)}, stride "
                       f"{shape_text(o.stride)}, pad {pad}{dilated}); use a larger "
                       f"--image-size")
    return out


def check_windows_hold_input(spec: LayerSpec, shape: Shape, where: str) -> None:
    """Refuse padding so wide that some window of a pool would hold only padding (a maximum of
    nothing; an average over no entry): along each axis the first window must reach past the
    padding before, and the last start before the padding after."""
    o = spec.options
    for n, window, axis in zip(shape[1:], windows_of(o), ("first", "second", "third"),
                               strict=False):
        last_start = (window.out_size(n) - 1) * window.stride - window.before
        if window.before >= window.kernel or last_start >= n:
            raise NetError(f"{where}: layer {spec.name} ({spec.kind}): pad "
                           f"{window.before}+{window.after} on the {axis} spatial axis of "
                           f"{n} leaves windows (kernel {window.kernel}, stride "
                           f"{window.stride}) that hold only padding; pad less")


def axis_halo_plans(spec: LayerSpec, layout: Layout, axis: int) -> tuple[HaloPlan, ...]:
    """The halo plans of the blocks of spatial ``axis`` of ``layout`` under the layer's window
    along it (refused, naming the layer, the axis and the sizes, when they cannot be made)."""
    return halo_plans(layout.shape[axis], layout.parts[axis], windows_of(spec.options)[axis - 2],
                      spec.name, axis_name(layout.shape, axis))


def check_rows(spec: LayerSpec, layout: Layout) -> None:
    """Refuse a split of the spatial axes the layer's window cannot run on (a rank without
    rows, or one needing halo rows from beyond its neighbours), naming the layer and sizes."""
    for axis in layout.spatial_cuts:
        axis_halo_plans(spec, layout, axis)


def padded_bytes(work: LocalWork, itemsize: int) -> int:
    """Bytes of the work's input block with its padding (a padded copy, or its gradient)."""
    n, c, *extent = work.x
    return n * c * math.prod(e + before + after for e, (before, after)
                             in zip(extent, work.pads, strict=True)) * itemsize


def padded_copy_bytes(fp: Footprint) -> int:
    """Bytes of the padded copy of the input a window kernel makes: none when nothing is
    padded and the rows are the rank's own (no halo to join)."""
    padding = any(before or after for before, after in fp.work.pads)
    return padded_bytes(fp.work, fp.itemsize) if padding or fp.height_split else 0


def busiest_halo(spec: LayerSpec, layout: Layout, axis: int) -> HaloPlan:
    """The halo plan of the block of ``axis`` with the most output rows (then the most rows
    read)."""
    plans = axis_halo_plans(spec, layout, axis)
    return max(plans, key=lambda q: (q.out[1] - q.out[0], q.need[1] - q.need[0]))


def halo_seconds(spec: LayerSpec, layout: Layout, machine: Machine, itemsize: int
                 ) -> tuple[float, float]:
    """Halo exchange of a window layer whose spatial axes are split (forward: rows received;
    backward: rows sent back), at the busiest rank; zero without a spatial split.

    The axes are exchanged one after the other, the last first, each on the block the ones
    before extended: a plane of an axis counts the halos of the axes exchanged before it, which
    is how edges and corners travel with no message of their own."""
    forward = backward = 0.0
    for axis, plane, (received, sent) in halo_axes(spec, layout):
        plane *= itemsize
        # with levels: whether the busiest rank's neighbour may be on another node
        crossing = 0
        if machine.levelled:
            group = layout.group((axis,))
            crossing = halo_crossings(group.size, layout.size, machine.ranks_per_node,
                                      group.stride)

        def busiest(counts: frozenset[tuple[int, int]], plane: int = plane,
                     crossing: int = crossing) -> float:
            return max([0.0, *(sum(halo_time(machine, k * plane, crossing) for k in pair)
                               for pair in counts)])

        forward += busiest(received)
        backward += busiest(sent)
    return forward, backward


def halo_axes(spec: LayerSpec, layout: Layout
              ) -> list[tuple[int, int, tuple[frozenset, frozenset]]]:
    """Per split spatial axis, in the order exchanged (the last first): the axis, the entries
    of one plane of it on the busiest rank's block as the axes before extended it, and the
    (top, bottom) numbers of planes received and sent
    (:func:`~hpctrain.layout.partition.halo_row_counts`)."""
    block = list(largest_block(layout))
    found = []
    for axis in sorted(layout.spatial_cuts, reverse=True):
        plane = math.prod(block[:axis] + block[axis + 1:])
        counts = halo_row_counts(layout.shape[axis], layout.parts[axis],
                                 windows_of(spec.options)[axis - 2], spec.name,
                                 axis_name(layout.shape, axis))
        found.append((axis, plane, counts))
        p = busiest_halo(spec, layout, axis)
        block[axis] = p.need[1] - p.need[0]
    return found


def following_layouts(spec: LayerSpec, x: Layout, out_shape: Shape
                      ) -> tuple[tuple[Layout, ...], Layout]:
    """The layouts of a window layer that follows its input (pooling, resizing): the layout
    fed, its split spatial axes recut into blocks of the output rows, or, where an axis is too
    short for that (a rank would get no rows, or need halo rows from beyond its neighbours),
    gathered first: the input then drops that axis's split."""
    short = []
    for axis in x.spatial_cuts:
        try:
            axis_halo_plans(spec, x, axis)
        except SplitError:
            short.append(axis)
    x = x.without(short)
    return (x,), x.with_shape(out_shape)


@dataclass(frozen=True)
class PoolOptions:
    kernel: tuple[int, ...] | None  # None: the whole image (avgpool kernel=global)
    stride: tuple[int, ...]  # 0 in the file: the kernel
    pad: tuple[tuple[int, int], ...] | str  # (before, after) per axis; "same" in the file


class WindowKind(Kind):
    """A kind that slides a window over an image or volume: its shape, the check of a split of
    the first spatial axis, its local work (rows plus halos under that split) and the halo
    exchange it adds.
    Subclasses say how many channels come out (:meth:`out_channels`) and how many a rank's
    kernel makes (:meth:`local_channels`)."""

    def out_channels(self, spec: LayerSpec, channels: int) -> int:
        return channels

    def local_channels(self, spec: LayerSpec, output: Layout) -> int:
        return 0

    def resolve(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> LayerSpec:
        """The window's sizes one per spatial axis of the input."""
        options = dataclasses.replace(spec.options, **spread_window(spec, shapes[0], where))
        return dataclasses.replace(spec, options=options)

    def out_shape(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> Shape:
        return (self.out_channels(spec, shapes[0][0]), *check_window(spec, shapes[0], where))

    def check(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> None:
        super().check(spec, inputs, output)
        check_rows(spec, inputs[0])

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork:
        """The busiest rank's window kernel: under a split of the first spatial axis it reads
        its rows plus halos and pads only at the image's edges."""
        return self.window_work(spec, inputs[0], self.local_channels(spec, output), need_dx)

    def window_work(self, spec: LayerSpec, x: Layout, out: int, need_dx: bool,
                    **more: Any) -> LocalWork:
        """:meth:`work` on input ``x`` making ``out`` channels, with ``more`` of
        :class:`~hpctrain.cost.work.LocalWork`'s fields (a convolution's groups)."""
        o = spec.options
        block, pads = list(largest_block(x)), list(o.pad)
        for axis in x.spatial_cuts:
            p = busiest_halo(spec, x, axis)
            block[axis] = p.need[1] - p.need[0]
            pads[axis - 2] = (p.pad_top, p.pad_bottom)
        return LocalWork(self, tuple(block), out, o.kernel, o.stride, tuple(pads), need_dx,
                         **more)

    def comm_time(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                  machine: Machine, itemsize: int, sums: float | None = None
                  ) -> tuple[float, float]:
        """The parameters' all-reduce (if any) and the halo exchange."""
        forward, backward = super().comm_time(spec, inputs, output, machine, itemsize, sums)
        halo = halo_seconds(spec, inputs[0], machine, itemsize)
        return forward + halo[0], backward + halo[1]


class PoolKind(WindowKind):
    """A pooling kind: a window reduction per channel on the layout that feeds it.

    Subclasses give the local kernels (:meth:`pool_kernels`); their options have ``kernel``,
    ``stride`` and ``pad``, and a stride of 0 means the kernel.
    """

    keys = POOL_KEYS
    options = PoolOptions

    def pool_kernels(self, options: Any = None) -> tuple[Callable, Callable]:
        """(forward, backward) kernels for a layer of ``options`` (None: the kind's usual
        ones, for timing), as :class:`~hpctrain.layers.pool.Pool` takes them; imported when
        asked for, as only timing and training run them."""
        raise NotImplementedError

    def resolve(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> LayerSpec:
        if spec.options.kernel is None:  # a window as large as the image (global pooling)
            return spec
        return super().resolve(spec, shapes, where)

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        return following_layouts(spec, fed[0], out_shape)

    def flops(self, work: LocalWork) -> tuple[float, float]:
        return (float(work.x[0] * work.x[1] * math.prod(work.out_sizes())
                      * math.prod(work.kernel)), float(math.prod(work.x)))

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        x = random(work.x)
        forward_kernel, backward_kernel = self.pool_kernels()

        def backward_of(out: Any) -> Callable[[], Any]:
            y, cache = out
            dy = xp.ones_like(y)
            return lambda: backward_kernel(xp, dy, work.kernel, work.stride, cache)

        return lambda: forward_kernel(xp, x, work.kernel, work.stride, work.pads), backward_of

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.pool import Pool  # needs MPI: only when run

        return Pool(spec.name, spec.options, ctx, *self.pool_kernels(spec.options))
