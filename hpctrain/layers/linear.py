"""Fully connected layer in batch or model (1.5D) mode."""

from __future__ import annotations

from typing import Any

from hpctrain.backend import Backend
from hpctrain.comm.collectives import GradientAllreduce
from hpctrain.grid import GridSet
from hpctrain.kernels.linear import linear_backward, linear_forward
from hpctrain.layers.base import Layer, weight_and_bias
from hpctrain.net import LayerSpec
from hpctrain.partition import check_split
from hpctrain.placement import weighted_layouts
from hpctrain.plan import LayerPlan


class Linear(Layer):
    """Y = X Wᵀ + b with W split by output features over Pr (the paper's Fig. 5).

    W: (F_out/Pr, F_in), b: (F_out/Pr,) — replicated over Pc.
    X: (N/Pc, F_in) replicated over Pr;  Y: (N/Pc, F_out/Pr).
    Backward: ΔWᵢ = ΔYᵢᵀ X all-reduced over Pc; ΔX = ΔYᵢ Wᵢ is a partial sum over Pr, summed by
    the adjoint of the all-gather that replicated X (a reduce-scatter).
    """

    kind = "linear"

    def __init__(self, spec: LayerSpec, in_shape: tuple[int, ...], plan: LayerPlan,
                 grids: GridSet, backend: Backend, key: int) -> None:
        self.name, self.mode, self.backend = spec.name, plan.mode, backend
        n, f_in = in_shape
        out = int(spec.args["out"])
        grid = grids.get(plan.grid)
        check_split(n, grid.pc, "batch", self.name)
        check_split(out, grid.pr, "output features", self.name)
        self.in_layout, self.out_layout = weighted_layouts(spec, in_shape, self.mode, grid.shape)
        self.grad_comm = grid.batch_comm
        self.weight, self.bias = weight_and_bias(
            backend, self.name, (out, f_in), bool(spec.args["bias"]), grid.shape, True,
            grid.rank, key)
        self.params = [p for p in (self.weight, self.bias) if p is not None]
        self.grad_sum = GradientAllreduce(backend, self.grad_comm)

    def forward(self, x: Any, step: int) -> Any:
        self.x = x
        return linear_forward(x, self.weight.value,
                              None if self.bias is None else self.bias.value)

    def backward(self, dy: Any) -> Any:
        dx, dw, db = linear_backward(self.x, self.weight.value, dy, self.need_dx)
        grads = self.grad_sum([dw] if self.bias is None else [dw, db])
        for p, grad in zip(self.params, grads, strict=True):
            p.grad = grad
        return dx
