"""Fully connected layer in batch, model (1.5D) or replicated mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpctrain.kernels.linear import linear_backward, linear_forward
from hpctrain.layers.base import weight_and_bias
from hpctrain.layers.partial import InputSplitLayer
from hpctrain.layout.layout import shared_channel_digits

if TYPE_CHECKING:
    from hpctrain.layers.base import BuildContext


class Linear(InputSplitLayer):
    """Y = X Wᵀ + b with W split by output features over Pr (the paper's Fig. 5).

    W: (F_out/Pr, F_in), b: (F_out/Pr,) — replicated over Pc.
    X: (N/Pc, F_in) replicated over Pr;  Y: (N/Pc, F_out/Pr).
    Backward: ΔWᵢ = ΔYᵢᵀ X, summed over Pc by the network; ΔX = ΔYᵢ Wᵢ is a partial sum over
    Pr, summed by the adjoint of the all-gather that replicated X (a reduce-scatter).

    Replicated mode: W and b whole on every rank, Y: (N/Pc, F_out) replicated over Pr. Its
    gradient is held as partial sums over Pr (the rank with i = 0 holds the loss's), so ΔW and
    ΔX are partial sums too: ΔW is summed over all P, ΔX as in model mode.

    Input split (``i=`` or ``s=``): W: (F_out/c, F_in/q), X: (N/Pc, F_in/q); X Wᵀ is a partial
    sum, completed over the q ranks by :class:`~hpctrain.layers.partial.InputSum` before b is
    added; ΔX = ΔY W stays cut as X is.
    """

    def __init__(self, name: str, options: Any, ctx: BuildContext) -> None:
        self.name, self.mode, self.backend = name, ctx.mode, ctx.backend
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        out = self.out_layout
        shape = (options.out, self.in_layout.shape[1])
        split = self.input_split(ctx, shape)
        # Wᵢ is on every rank that holds the same block of output features
        self.grad_comm = ctx.grids.over(out, shared_channel_digits(out))
        self.weight, self.bias = weight_and_bias(
            ctx.backend, name, shape, options.bias, out, ctx.rank, ctx.key, split)
        self.params = [p for p in (self.weight, self.bias) if p is not None]

    def forward(self, x: Any, step: int) -> Any:
        self.x = x if self.training else None  # X for ΔW; evaluation keeps nothing
        if self.sum is not None:
            return self.sum.forward(linear_forward(self.backend.xp, x, self.weight.value, None),
                                    self.bias)
        return linear_forward(self.backend.xp, x, self.weight.value,
                              None if self.bias is None else self.bias.value)

    def backward(self, dy: Any) -> Any:
        xp = self.backend.xp
        if self.sum is not None:
            dy = self.sum.backward(dy, self.bias)
        dx, dw, db = linear_backward(xp, self.x, self.weight.value, dy, self.need_dx,
                                     self.weight.grad_buffer(xp))
        self.weight.grad = dw
        if self.bias is not None and self.sum is None:
            self.bias.grad = db
        return dx
