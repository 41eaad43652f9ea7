"""Where each layer's input and output sit under its plan entry (pure; no MPI).

The distributed layers take their layouts from here, and the cost model predicts a plan from the
same layouts, so prediction and execution cannot disagree on what moves where.

- conv/linear, batch or model mode on Pr×Pc: input replicated over Pr (batch split over Pc),
  output split by channels/features over Pr.
- conv, domain mode: input and output split by height over Pr.
- maxpool: keeps the split it is fed (a height split is pooled with a halo exchange).
- relu, dropout: the layout they are fed.
- flatten: a channel split becomes a feature split; a height split is gathered first.
- a first layer without weights runs batch-parallel on 1×P.

:func:`plan_layouts` gives every layer's layouts under a whole plan and :func:`move_pairs` the
moves between them; the network builds its redistributions from these.
"""

from __future__ import annotations

from hpctrain.layout import CHANNEL_AXIS, HEIGHT_AXIS, Layout
from hpctrain.net import LayerSpec, NetSpec
from hpctrain.plan import LayerPlan


def weighted_layouts(spec: LayerSpec, in_shape: tuple[int, ...], mode: str,
                     grid: tuple[int, int]) -> tuple[Layout, Layout]:
    """(input, output) layouts of a conv or linear layer; ``in_shape`` includes the batch."""
    n = in_shape[0]
    out = int(spec.args["out"])
    if spec.kind == "linear":
        return Layout(in_shape, grid), Layout((n, out), grid, CHANNEL_AXIS)
    window = spec.window()
    out_shape = (n, out, window.out_size(in_shape[2]), window.out_size(in_shape[3]))
    if mode == "domain":
        return Layout(in_shape, grid, HEIGHT_AXIS), Layout(out_shape, grid, HEIGHT_AXIS)
    return Layout(in_shape, grid), Layout(out_shape, grid, CHANNEL_AXIS)


def follower_layouts(spec: LayerSpec, layout: Layout) -> tuple[Layout, Layout]:
    """(input, output) layouts of a layer without weights fed on ``layout``."""
    if spec.kind == "maxpool":
        window = spec.window()
        n, c, h, w = layout.shape
        out_shape = (n, c, window.out_size(h), window.out_size(w))
        if layout.split_axis == HEIGHT_AXIS:
            return layout, Layout(out_shape, layout.grid, HEIGHT_AXIS)
        return layout, Layout(out_shape, layout.grid, layout.split_axis, layout.split_ranges)
    if spec.kind == "flatten":
        # A height-split input cannot be flattened in place (its rows are not contiguous
        # features): gather the rows first.
        source = layout.replicated() if layout.split_axis == HEIGHT_AXIS else layout
        n, c, h, w = layout.shape
        ranges = None
        if source.split_axis == CHANNEL_AXIS:
            ranges = tuple((lo * h * w, hi * h * w) for lo, hi in source.split_ranges)
        return source, Layout((n, c * h * w), layout.grid,
                              CHANNEL_AXIS if ranges else None, ranges)
    return layout, layout


def plan_layouts(net: NetSpec, plan: list[LayerPlan], batch: int,
                 procs: int) -> list[tuple[Layout, Layout]]:
    """(input, output) layout of every layer of ``net`` under ``plan`` on ``procs`` ranks.

    A weighted layer takes the layouts of its mode and grid; a layer without weights follows
    the output before it, and a first one runs on 1×P.
    """
    layouts: list[tuple[Layout, Layout]] = []
    for spec, entry, shape in zip(net.layers, plan, net.shapes()[:-1], strict=True):
        if entry.mode != "follow":
            layouts.append(weighted_layouts(spec, (batch, *shape), entry.mode, entry.grid))
        else:
            fed = layouts[-1][1] if layouts else Layout((batch, *shape), (1, procs))
            layouts.append(follower_layouts(spec, fed))
    return layouts


def move_pairs(layouts: list[tuple[Layout, Layout]]) -> list[tuple[Layout, Layout]]:
    """(source, target) of every move of a network whose layers have ``layouts``: the move
    feeding each layer (from the output before it; the first from its own input), then the
    move of the logits to the loss, replicated over the last grid's Pr ranks."""
    pairs = []
    previous = layouts[0][0]
    for in_layout, out_layout in layouts:
        pairs.append((previous, in_layout))
        previous = out_layout
    pairs.append((previous, previous.replicated()))
    return pairs
