"""A trained scale per channel (layer scale) on the layout that feeds it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpctrain.kernels.activations import layer_scale_backward
from hpctrain.layers.base import Layer, Parameter
from hpctrain.layout.layout import CHANNEL_AXIS, REPLICAS

if TYPE_CHECKING:
    from hpctrain.layers.base import BuildContext


class LayerScale(Layer):
    """Y = γ ⊙ X, γ one value per channel broadcast over the samples and positions;
    ΔX = ΔY ⊙ γ and Δγ = Σ ΔY ⊙ X over the samples and positions.

    X, Y: any block (N/n, C/c, H/h, W/w). γ: (C/c, 1, 1), the channels of this rank's block,
    sharded like a bias. Nothing is exchanged in the forward or the backward: Δγ is this rank's
    sum over its samples and positions, summed by the network over ``grad_comm``, the ranks
    holding the same channel block (the other sample and spatial blocks, and replicas).
    """

    mode = "follow"

    def __init__(self, name: str, options: Any, ctx: BuildContext) -> None:
        self.name, self.backend = name, ctx.backend
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        layout, precision, xp = self.in_layout, ctx.backend.precision, ctx.backend.xp
        others = layout.digits_of(a for a in (*range(len(layout.shape)), REPLICAS)
                                  if a != CHANNEL_AXIS)
        self.grad_comm = ctx.grids.over(layout, others) if others else None
        shape = (layout.shape[CHANNEL_AXIS], *(1,) * (len(layout.shape) - 2))
        # torchvision's name for γ, the kind's parameter (its module imports this one)
        self.gamma = Parameter(f"{name}.layer_scale", None, shape, layout)
        local = tuple(hi - lo for lo, hi in self.gamma.box(ctx.rank))
        self.gamma.value = xp.full(local, options.init, dtype=precision.master)
        if precision.mixed:
            self.gamma.master = self.gamma.value
            self.gamma.value = self.gamma.master.astype(precision.storage)
        self.params = [self.gamma]

    def forward(self, x: Any, step: int) -> Any:
        self.kept = x if self.training else None
        return x * self.gamma.value

    def backward(self, dy: Any) -> Any:
        dx, dgamma = layer_scale_backward(self.backend.xp, dy, self.kept, self.gamma.value)
        self.gamma.grad = dgamma.astype(self.gamma.value.dtype, copy=False)
        return dx if self.need_dx else None
