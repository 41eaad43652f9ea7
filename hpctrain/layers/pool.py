"""Max-pooling on whatever layout feeds it: channel-split, replicated, or height-split (domain)."""

from __future__ import annotations

from typing import Any

from hpctrain.backend import Backend
from hpctrain.comm.halo import HaloExchange
from hpctrain.grid import GridSet
from hpctrain.kernels.pool import maxpool_backward, maxpool_forward
from hpctrain.layers.base import Layer
from hpctrain.layers.window import WindowRows
from hpctrain.layout import HEIGHT_AXIS, Layout
from hpctrain.net import LayerSpec
from hpctrain.partition import halo_plans
from hpctrain.placement import follower_layouts


class MaxPool2d(Layer):
    """Y = max over each window; pooling acts per channel, so any channel split passes through.

    A height-split input (after a domain-parallel layer) is pooled domain-parallel: X: (N/Pc, C,
    H/Pr + halo, W) -> Y: (N/Pc, C, Ho/Pr, Wo), with the same halo exchange as convolution.
    """

    kind = "maxpool"
    mode = "follow"

    def __init__(self, spec: LayerSpec, layout: Layout, grids: GridSet, backend: Backend) -> None:
        self.name, self.backend, self.params = spec.name, backend, []
        self.window = spec.window()
        h = layout.shape[2]
        self.in_layout, self.out_layout = follower_layouts(spec, layout)
        if layout.split_axis == HEIGHT_AXIS:
            grid = grids.get(layout.grid)
            plan_i = halo_plans(h, grid.pr, self.window, self.name)[grid.i]
            self.rows = WindowRows(backend, self.window, h,
                                   HaloExchange(backend, grid.model_comm, plan_i), plan_i)
        else:
            self.rows = WindowRows(backend, self.window, h)

    def _forward_rows(self, x: Any, pads: tuple[int, int, int]) -> tuple[Any, Any]:
        return maxpool_forward(self.backend.xp, x, self.window.kernel, self.window.stride, pads)

    def _backward_rows(self, dy: Any, cache: Any) -> Any:
        return maxpool_backward(self.backend.xp, dy, self.window.kernel, self.window.stride, cache)

    def forward(self, x: Any, step: int) -> Any:
        y, self.bands = self.rows.forward(x, self._forward_rows)
        return y

    def backward(self, dy: Any) -> Any:
        return self.rows.backward(dy, self.bands, self._backward_rows, self.need_dx)
