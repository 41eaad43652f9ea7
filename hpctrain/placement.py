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
"""

from __future__ import annotations

from hpctrain.layout import CHANNEL_AXIS, HEIGHT_AXIS, Layout
from hpctrain.net import LayerSpec


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
