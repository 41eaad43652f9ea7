"""Batch normalisation with statistics over the whole global batch or over groups of its
samples, and layer normalisation over the channels at each position, on any layout."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpctrain.comm.collectives import allreduce_sum
from hpctrain.kernels.fused_norm import (
    FusedCache,
    fused_available,
    fused_batchnorm_backward,
    fused_batchnorm_forward,
)
from hpctrain.kernels.norm import (
    batchnorm_backward,
    batchnorm_forward,
    batchnorm_inference,
    batchnorm_inference_backward,
    layernorm_backward,
    layernorm_forward,
)
from hpctrain.kernels.products import widen
from hpctrain.layers.base import Layer, Parameter
from hpctrain.layout.layout import CHANNEL_AXIS, REPLICAS
from hpctrain.layout.statistics import held_groups

if TYPE_CHECKING:
    from hpctrain.layers.base import BuildContext


class BatchNorm(Layer):
    """Y = γ (X − μ) / √(σ² + ε) + β per channel, μ and σ² over the whole global batch (and
    the whole image), so every plan gives the serial numbers; or over each group of samples
    (``options.groups`` of them, :mod:`hpctrain.layout.statistics`), which every plan and one
    process compute alike too.

    The statistics are summed over the ranks that hold other parts of the same channels of the
    same group: other sample blocks of the group and other spatial blocks, never a replica (it
    holds the same values). On the 1.5D grids with global statistics: the Pc ranks of the batch
    group under a channel split (model mode) or none (batch mode, or replicated over Pr); all P
    ranks under a height split (domain mode). With a group per rank's samples, batch mode sums
    nothing.

    γ, β: (C/c,) sharded like a bias when the channels are cut c ways, else whole on every
    rank. With global statistics their gradients are complete after the backward's one
    all-reduce of [Σ ΔY, Σ ΔY·X̂]; replicated, the gradient is a partial sum over the replicas,
    which the network sums there. With groups, each rank's own sums are summed by the network
    over every rank of the channel block, as every other parameter gradient is.

    Running mean and (unbiased) variance: (C/c,) buffers, updated in training with
    ``momentum`` (r ← (1 − m) r + m s, as PyTorch) from the mean over the groups of each group's
    statistic. A rank sees only its own groups, so it keeps their mean, and :meth:`settle`
    averages the ranks' buffers (the update is linear, so averaging once equals averaging every
    step) before anything reads them.

    Under a 16-bit precision the statistics, the normalisation and the sums are made in
    float32 (the master dtype) from the widened input, and Y and ΔX are rounded back to 16 bits;
    the running statistics are float32; γ and β are parameters like any other (a 16-bit copy
    of float32 master values).
    """

    mode = "follow"

    def __init__(self, name: str, options: Any, ctx: BuildContext) -> None:
        self.name, self.backend = name, ctx.backend
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        self.eps, self.momentum = options.eps, options.momentum
        xp, precision = ctx.backend.xp, ctx.backend.precision
        dtype = precision.master  # statistics, counts and running buffers: summed at full width
        layout = self.in_layout
        statistics = layout.digits_of(a for a in range(len(layout.shape)) if a != CHANNEL_AXIS)
        replicas = layout.digits_of((REPLICAS,))
        # every rank holding other values of this channel block: other samples, other places
        self.block_comm = ctx.grids.over(layout, statistics)
        spatial = 1
        for n in layout.shape[2:]:
            spatial *= n
        batch, groups = layout.shape[0], options.groups
        lo, hi = layout.box(ctx.rank)[0]
        held = held_groups(batch, groups, lo, hi)
        self.groups = held.ranges if groups > 1 else None
        self.counts = xp.asarray([[size * spatial] for size in held.sizes], dtype=dtype)
        self.unbiased = xp.asarray([[m / (m - 1) if m > 1 else 1.0]
                                    for m in (size * spatial for size in held.sizes)],
                                   dtype=dtype)
        # this rank's weight in the mean over groups of the running statistics (see settle)
        self.share = 1.0
        if self.groups is None:
            self.stats_comm = self.block_comm
            self.grad_comm = ctx.grids.over(layout, replicas) if replicas else None
        else:
            # the ranks of this rank's groups: those of the channel block whose samples start
            # in the same group
            self.stats_comm = ctx.grids.split(layout, statistics, ("statistics", batch, groups),
                                              held.first)
            self.grad_comm = ctx.grids.over(layout, statistics + replicas)
            self.share = len(held.sizes) / (groups * self.stats_comm.Get_size())
        channels = layout.shape[CHANNEL_AXIS]
        params = []
        for suffix, fill in (("gamma", 1.0), ("beta", 0.0), ("running_mean", 0.0),
                             ("running_var", 1.0)):
            p = Parameter(f"{name}.{suffix}", None, (channels,), layout)
            lo, hi = p.box(ctx.rank)[0]
            p.value = xp.full(hi - lo, fill, dtype=dtype)
            if precision.mixed and suffix in ("gamma", "beta"):
                p.master, p.value = p.value, p.value.astype(precision.storage)
            params.append(p)
        self.gamma, self.beta, self.running_mean, self.running_var = params
        self.params = [self.gamma, self.beta]
        self.buffers = [self.running_mean, self.running_var]
        self.shifted = False  # the running mean has seen a batch (see forward)

    def _reduce(self, a: Any) -> Any:
        return allreduce_sum(self.backend, self.stats_comm, self.backend.xp.ascontiguousarray(a))

    def settle(self) -> None:
        """Make every rank's running statistics the mean over all groups (collective over the
        channel block's ranks; nothing to do under global statistics)."""
        if self.groups is None:
            return
        xp = self.backend.xp
        both = xp.stack([self.running_mean.value, self.running_var.value]) * self.share
        self.running_mean.value, self.running_var.value = allreduce_sum(
            self.backend, self.block_comm, xp.ascontiguousarray(both))

    def forward(self, x: Any, step: int) -> Any:
        xp, storage = self.backend.xp, x.dtype
        if self.training and self._fused(x):
            shift = self.running_mean.value if self.shifted else None
            y, self.cache, mean, var = fused_batchnorm_forward(
                xp, x, self.gamma.weights, self.beta.weights, self.eps, self.counts,
                self._reduce, shift)
            self._update_running(mean, var)
            return y
        x = widen(x)
        if not self.training:
            self.cache = None
            return batchnorm_inference(xp, x, self.gamma.weights, self.beta.weights, self.eps,
                                       self.running_mean.value,
                                       self.running_var.value).astype(storage, copy=False)
        # one message for both sums, shifted by the running mean, once that has seen a batch:
        # before, two (the mean, then the squares), which need no shift
        shift = self.running_mean.value if self.shifted else None
        y, self.cache, mean, var = batchnorm_forward(
            xp, x, self.gamma.weights, self.beta.weights, self.eps, self.counts, self._reduce,
            shift, self.groups)
        self._update_running(mean, var)
        return y.astype(storage, copy=False)

    def _fused(self, x: Any) -> bool:
        """Whether the fused GPU kernels take this step (:mod:`hpctrain.kernels.fused_norm`):
        on CuPy, one statistics group, a float32 or 16-bit input (float64 stays exact)."""
        return (self.groups is None and x.dtype.itemsize <= 4
                and fused_available(self.backend.xp, x.dtype))

    def _update_running(self, mean: Any, var: Any) -> None:
        """r ← (1 − m) r + m s for the mean over groups of each group's statistics."""
        self.shifted = True
        unbiased = var * self.unbiased
        m = self.momentum
        self.running_mean.value = (1 - m) * self.running_mean.value + m * mean.mean(axis=0)
        self.running_var.value = (1 - m) * self.running_var.value + m * unbiased.mean(axis=0)

    def backward(self, dy: Any) -> Any:
        if isinstance(self.cache, FusedCache):
            dx, _, total = fused_batchnorm_backward(self.backend.xp, dy, self.cache,
                                                    self.counts, self._reduce)
            sums = total.sum(axis=1).astype(self.gamma.value.dtype, copy=False)
            self.beta.grad, self.gamma.grad = sums[0], sums[1]
            return dx if self.need_dx else None
        storage = dy.dtype
        dy = widen(dy)
        if self.cache is None:  # evaluation mode: a fixed affine map
            return batchnorm_inference_backward(dy, self.gamma.weights, self.eps,
                                                self.running_var.value).astype(storage,
                                                                               copy=False)
        # the sum is made in place: with groups this rank's own sums are kept apart first
        reduce = self._reduce if self.groups is None else (lambda a: self._reduce(a.copy()))
        dx, local, total = batchnorm_backward(self.backend.xp, dy, self.cache, self.counts,
                                              reduce)
        # one group: the group's sums are the whole gradient; several: this rank's part
        sums = (total if self.groups is None else local).sum(axis=1)
        sums = sums.astype(self.gamma.value.dtype, copy=False)  # summed with the others
        self.beta.grad, self.gamma.grad = sums[0], sums[1]
        return dx.astype(storage, copy=False) if self.need_dx else None


class LayerNorm(Layer):
    """Y = γ (X − μ) / √(σ² + ε) + β at each position, μ and σ² over its channels (a flat
    input's features), as ConvNeXt's LayerNorm2d (and PyTorch's LayerNorm over the features).

    The statistics are summed over the ranks that hold other channel blocks of the same
    positions (a channel split: model mode); every other split holds whole positions and sums
    nothing. γ, β: (C/c,), sharded like a bias; their gradients are this rank's sums over its
    samples and positions, summed by the network over the ranks holding the same channel
    block (the batch and spatial blocks, and replicas). 16-bit inputs are normalised in
    float32, as batch norm's are.
    """

    mode = "follow"

    def __init__(self, name: str, options: Any, ctx: BuildContext) -> None:
        self.name, self.backend, self.eps = name, ctx.backend, options.eps
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        layout, precision, xp = self.in_layout, ctx.backend.precision, ctx.backend.xp
        self.channels = layout.shape[CHANNEL_AXIS]
        cut = layout.digits_of((CHANNEL_AXIS,))
        self.channel_comm = ctx.grids.over(layout, cut) if cut else None
        others = layout.digits_of(a for a in (*range(len(layout.shape)), REPLICAS)
                                  if a != CHANNEL_AXIS)
        self.grad_comm = ctx.grids.over(layout, others) if others else None
        params = []
        for suffix, fill in (("gamma", 1.0), ("beta", 0.0)):
            p = Parameter(f"{name}.{suffix}", None, (self.channels,), layout)
            lo, hi = p.box(ctx.rank)[0]
            p.value = xp.full(hi - lo, fill, dtype=precision.master)
            if precision.mixed:
                p.master, p.value = p.value, p.value.astype(precision.storage)
            params.append(p)
        self.gamma, self.beta = params
        self.params = params

    def _reduce(self, a: Any) -> Any:
        if self.channel_comm is None:
            return a
        return allreduce_sum(self.backend, self.channel_comm,
                             self.backend.xp.ascontiguousarray(a))

    def forward(self, x: Any, step: int) -> Any:
        storage = x.dtype
        y, cache = layernorm_forward(self.backend.xp, widen(x), self.gamma.weights,
                                     self.beta.weights, self.eps, self.channels, self._reduce)
        self.cache = cache if self.training else None
        return y.astype(storage, copy=False)

    def backward(self, dy: Any) -> Any:
        storage = dy.dtype
        dx, dgamma, dbeta = layernorm_backward(self.backend.xp, widen(dy), self.cache,
                                               self.channels, self._reduce)
        dtype = self.gamma.value.dtype
        self.gamma.grad = dgamma.astype(dtype, copy=False)
        self.beta.grad = dbeta.astype(dtype, copy=False)
        return dx.astype(storage, copy=False) if self.need_dx else None
