"""What the window kinds (convolution, max and average pooling) share: kernel, stride and pad
along height and width, and the height split with its halo rows.

A window's height is the axis a domain split cuts (:class:`~hpctrain.layout.partition.Window` and
its halo plans); its width is never split and only pads both sides alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpctrain.cost.collectives import halo_time
from hpctrain.cost.machine import Machine
from hpctrain.cost.memory import Footprint
from hpctrain.cost.nodes import halo_crossings
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import HEIGHT_AXIS, Layout, largest_block
from hpctrain.layout.partition import HaloPlan, SplitError, Window, halo_plans, halo_row_counts
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape
from hpctrain.model.options import Key, NetError, pair

WINDOW_KEYS = {"kernel": Key(pair(1)), "stride": Key(pair(1), "1"), "pad": Key(pair(0), "0")}
# pooling: stride 0 (the default) means the kernel, filled in by PoolKind.parse
POOL_KEYS = {**WINDOW_KEYS, "stride": Key(pair(0), "0")}


def rows(o: Any) -> Window:
    """The window along the height (the axis a domain split cuts) of options ``o``."""
    return Window(o.kernel[0], o.stride[0], o.pad[0])


def check_window(spec: LayerSpec, shape: Shape, where: str) -> Shape:
    """(Ho, Wo) of a window layer on per-sample ``shape``, refused when too small."""
    o = spec.options
    if len(shape) != 3:
        raise NetError(f"{where}: layer {spec.name} ({spec.kind}) needs an image input, got "
                       f"shape {shape}")
    h, w = (Window(o.kernel[a], o.stride[a], o.pad[a]).out_size(shape[1 + a]) for a in (0, 1))
    if h < 1 or w < 1:
        raise NetError(f"{where}: layer {spec.name} receives {shape[1]}x{shape[2]}, too small "
                       f"for its window (kernel {o.kernel[0]}x{o.kernel[1]}, stride "
                       f"{o.stride[0]}x{o.stride[1]}, pad {o.pad[0]}x{o.pad[1]}); use a larger "
                       f"--image-size")
    return h, w


def check_rows(spec: LayerSpec, layout: Layout) -> None:
    """Refuse a height split the layer's window cannot run on (a rank without rows, or one
    needing halo rows from beyond its neighbours), naming the layer and sizes."""
    if layout.split_axis == HEIGHT_AXIS:
        halo_plans(layout.shape[HEIGHT_AXIS], layout.grid[0], rows(spec.options), spec.name)


def padded_bytes(work: LocalWork, itemsize: int) -> int:
    """Bytes of the work's input block with its padding (a padded copy, or its gradient)."""
    n, c, h, w = work.x
    top, bottom, side = work.pads
    return n * c * (h + top + bottom) * (w + 2 * side) * itemsize


def padded_copy_bytes(fp: Footprint) -> int:
    """Bytes of the padded copy of the input a window kernel makes: none when nothing is
    padded and the rows are the rank's own (no halo to join)."""
    top, bottom, side = fp.work.pads
    return padded_bytes(fp.work, fp.itemsize) if top or bottom or side or fp.height_split else 0


def busiest_halo(name: str, window: Window, layout: Layout) -> HaloPlan:
    """The halo plan of the rank with the most output rows (then the most rows read)."""
    plans = halo_plans(layout.shape[HEIGHT_AXIS], layout.grid[0], window, name)
    return max(plans, key=lambda q: (q.out[1] - q.out[0], q.need[1] - q.need[0]))


def halo_seconds(spec: LayerSpec, layout: Layout, machine: Machine, itemsize: int
                 ) -> tuple[float, float]:
    """Halo exchange of a height-split window layer (forward: rows received; backward: rows
    sent back), at the busiest rank; zero without a height split."""
    if layout.split_axis != HEIGHT_AXIS:
        return 0.0, 0.0
    n, c, _, w = largest_block(layout)
    row_bytes = n * c * w * itemsize
    received, sent = halo_row_counts(layout.shape[HEIGHT_AXIS], layout.grid[0],
                                     rows(spec.options), spec.name)
    # with levels: whether the busiest rank's neighbour may be on another node
    crossing = (halo_crossings(layout.grid[0], layout.size, machine.ranks_per_node)
                if machine.levelled else 0)

    def busiest(counts: frozenset[tuple[int, int]]) -> float:
        return max([0.0, *(sum(halo_time(machine, k * row_bytes, crossing) for k in pair)
                           for pair in counts)])

    return busiest(received), busiest(sent)


@dataclass(frozen=True)
class PoolOptions:
    kernel: tuple[int, int] | None  # None: the whole image (avgpool kernel=global)
    stride: tuple[int, int]  # 0 in the file: the kernel
    pad: tuple[int, int]


class WindowKind(Kind):
    """A kind that slides a window over the image: its shape, the check of a height split, its
    local work (rows plus halos under a height split) and the halo exchange it adds.
    Subclasses say how many channels come out (:meth:`out_channels`) and how many a rank's
    kernel makes (:meth:`local_channels`)."""

    def out_channels(self, spec: LayerSpec, channels: int) -> int:
        return channels

    def local_channels(self, spec: LayerSpec, output: Layout) -> int:
        return 0

    def out_shape(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> Shape:
        h, w = check_window(spec, shapes[0], where)
        return (self.out_channels(spec, shapes[0][0]), h, w)

    def check(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> None:
        super().check(spec, inputs, output)
        check_rows(spec, inputs[0])

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork:
        """The busiest rank's window kernel: under a height split it reads its rows plus
        halos and pads only at the image's edges."""
        o, x = spec.options, inputs[0]
        block = largest_block(x)
        pads = (o.pad[0], o.pad[0], o.pad[1])
        if x.split_axis == HEIGHT_AXIS:
            p = busiest_halo(spec.name, rows(o), x)
            block = (*block[:2], p.need[1] - p.need[0], block[3])
            pads = (p.pad_top, p.pad_bottom, o.pad[1])
        return LocalWork(self, block, self.local_channels(spec, output), o.kernel,
                         o.stride, pads, need_dx)

    def comm_time(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                  machine: Machine, itemsize: int) -> tuple[float, float]:
        """The parameters' all-reduce (if any) and the halo exchange."""
        forward, backward = super().comm_time(spec, inputs, output, machine, itemsize)
        halo = halo_seconds(spec, inputs[0], machine, itemsize)
        return forward + halo[0], backward + halo[1]


class PoolKind(WindowKind):
    """A pooling kind: a window reduction per channel on the layout that feeds it.

    Subclasses give the local kernels (:meth:`pool_kernels`); their options have ``kernel``,
    ``stride`` and ``pad``, and a stride of 0 means the kernel.
    """

    keys = POOL_KEYS
    options = PoolOptions

    def pool_kernels(self) -> tuple[Callable, Callable]:
        """(forward, backward) kernels, as :class:`~hpctrain.layers.pool.Pool2d` takes them;
        imported when asked for, as only timing and training run them."""
        raise NotImplementedError

    def parse(self, texts: dict[str, str], where: str) -> Any:
        o = super().parse(texts, where)
        if o.kernel is None:  # a window as large as the image (global average pooling)
            return o
        stride = tuple(s or k for s, k in zip(o.stride, o.kernel, strict=True))
        return PoolOptions(o.kernel, stride, o.pad)

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape, mode: str,
                grid: tuple[int, int]) -> tuple[tuple[Layout, ...], Layout]:
        """The layout fed; a height split is recut into blocks of the output rows, or, where
        the image is too short for that (a rank would get no rows, or need halo rows from
        beyond its neighbours), gathered first: the input then drops the height split."""
        x = fed[0]
        if x.split_axis == HEIGHT_AXIS:
            try:
                check_rows(spec, x)
            except SplitError:
                return (x.replicated(),), Layout(out_shape, x.grid)
            return fed, Layout(out_shape, x.grid, HEIGHT_AXIS)
        return super().layouts(spec, fed, out_shape, mode, grid)

    def flops(self, work: LocalWork) -> tuple[float, float]:
        ho, wo = work.out_rows()
        return (float(work.x[0] * work.x[1] * ho * wo * work.kernel[0] * work.kernel[1]),
                float(math.prod(work.x)))

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
        from hpctrain.layers.pool import Pool2d  # needs MPI: only when run

        return Pool2d(spec.name, spec.options, ctx, *self.pool_kernels())
