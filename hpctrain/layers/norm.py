"""Batch normalisation with statistics over the whole global batch, on any layout."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpctrain.comm.collectives import allreduce_sum
from hpctrain.kernels.norm import (
    batchnorm_backward,
    batchnorm_forward,
    batchnorm_inference,
    batchnorm_inference_backward,
)
from hpctrain.layers.base import Layer, Parameter
from hpctrain.layout.layout import CHANNEL_AXIS, REPLICAS

if TYPE_CHECKING:
    from hpctrain.layers.base import BuildContext


class BatchNorm(Layer):
    """Y = γ (X − μ) / √(σ² + ε) + β per channel, μ and σ² over the whole global batch (and
    the whole image), so every plan gives the serial numbers.

    The statistics are summed over the ranks that hold other parts of the same channels: other
    sample blocks and other spatial blocks, never a replica (it holds the same values). On the
    1.5D grids: the Pc ranks of the batch group under a channel split (model mode) or none
    (batch mode, or replicated over Pr); all P ranks under a height split (domain mode).

    γ, β: (C/c,) sharded like a bias when the channels are cut c ways, else whole on every
    rank. Their gradients are complete after the backward's one all-reduce of [Σ ΔY, Σ ΔY·X̂];
    replicated, the gradient is a partial sum over the replicas, which the network sums there.
    Running mean and (unbiased) variance: (C/c,) buffers, updated in training with
    ``momentum`` (r ← (1 − m) r + m s, as PyTorch) and used in evaluation.
    """

    mode = "follow"

    def __init__(self, name: str, options: Any, ctx: BuildContext) -> None:
        self.name, self.backend = name, ctx.backend
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        self.eps, self.momentum = options.eps, options.momentum
        xp, dtype = ctx.backend.xp, ctx.backend.dtype
        layout = self.in_layout
        # the statistics of a channel block: over its samples and every spatial block
        self.stats_comm = ctx.grids.over(layout, layout.digits_of(
            a for a in range(len(layout.shape)) if a != CHANNEL_AXIS))
        # replicas hold partial gradients: the network sums them there
        replicas = layout.digits_of((REPLICAS,))
        self.grad_comm = ctx.grids.over(layout, replicas) if replicas else None
        self.count = layout.shape[0]
        for n in layout.shape[2:]:
            self.count *= n
        channels = layout.shape[CHANNEL_AXIS]
        params = []
        for suffix, fill in (("gamma", 1.0), ("beta", 0.0), ("running_mean", 0.0),
                             ("running_var", 1.0)):
            p = Parameter(f"{name}.{suffix}", None, (channels,), layout)
            lo, hi = p.box(ctx.rank)[0]
            p.value = xp.full(hi - lo, fill, dtype=dtype)
            params.append(p)
        self.gamma, self.beta, self.running_mean, self.running_var = params
        self.params = [self.gamma, self.beta]
        self.buffers = [self.running_mean, self.running_var]

    def _reduce(self, a: Any) -> Any:
        return allreduce_sum(self.backend, self.stats_comm, self.backend.xp.ascontiguousarray(a))

    def forward(self, x: Any, step: int) -> Any:
        xp = self.backend.xp
        if not self.training:
            self.cache = None
            return batchnorm_inference(xp, x, self.gamma.value, self.beta.value, self.eps,
                                       self.running_mean.value, self.running_var.value)
        y, self.cache, mean, var = batchnorm_forward(xp, x, self.gamma.value, self.beta.value,
                                                     self.eps, self.count, self._reduce)
        unbiased = var * (self.count / (self.count - 1)) if self.count > 1 else var
        m = self.momentum
        self.running_mean.value = (1 - m) * self.running_mean.value + m * mean
        self.running_var.value = (1 - m) * self.running_var.value + m * unbiased
        return y

    def backward(self, dy: Any) -> Any:
        if self.cache is None:  # evaluation mode: a fixed affine map
            return batchnorm_inference_backward(dy, self.gamma.value, self.eps,
                                                self.running_var.value)
        dx, dgamma, dbeta = batchnorm_backward(self.backend.xp, dy, self.cache, self.count,
                                               self._reduce)
        self.gamma.grad, self.beta.grad = dgamma, dbeta
        return dx if self.need_dx else None
