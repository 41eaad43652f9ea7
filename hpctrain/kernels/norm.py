"""Batch normalisation, with statistics that may span several ranks.

A distributed layer may hold only part of each channel's values — some samples (batch split) or
some rows (height split). Its kernels compute per-channel local sums and pass them to ``reduce``,
which sums an array over the ranks that hold the other parts of the same channels (the identity
on one process); ``counts`` is the global number of values per channel. The statistics, and so
the outputs and gradients, are then exactly those of the whole batch — or of each group of
samples, where the statistics are kept per group ("ghost" batch norm,
:mod:`hpctrain.layout.statistics`): a rank then sums (k, C) arrays, one row per group it holds.
Each direction sends one message: the forward's two sums together, the backward's two sums
together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Reduce = Callable[[Any], Any]


@dataclass(frozen=True)
class BatchNormCache:
    x_hat: Any  # like X: the normalised input
    inv_std: Any  # (k, C): 1/sqrt(var + eps) of each group
    gamma: Any  # (C,), in the dtype of X
    groups: Any = None  # the local samples of each group (None: one)


def channel_axes(x: Any) -> tuple[int, ...]:
    """The axes a per-channel statistic sums over: all but C of X: (N, C) or (N, C, H, W)."""
    return (0, *range(2, x.ndim))


def per_channel(v: Any, x: Any) -> Any:
    """A (C,) vector shaped to broadcast over X: (1, C) or (1, C, 1, 1)."""
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def channel_sums(xp: Any, x: Any) -> Any:
    """S[c] = Σ over every axis but C of X: the local part of a per-channel sum, shape (C,).

    Over the samples first, then over each channel's positions, which lie together in that
    (C, P) sum: NumPy's sum over the axes (0, 2, …) at once strides across X for every
    position, 2–5 times slower (an (8, 768, 3, 3) input: 153 against 31 µs, one thread)."""
    if x.ndim <= 2:
        return x.sum(axis=0)
    return x.sum(axis=0).reshape(x.shape[1], -1).sum(axis=1)


Groups = tuple[tuple[int, int], ...] | None
"""The local samples of each statistics group a rank holds, as (start, stop) along X's first
axis (:mod:`hpctrain.layout.statistics`); None: one group, every local sample."""


def group_sums(xp: Any, x: Any, groups: Groups) -> Any:
    """S[g, c] = Σ of X over group g's samples and every spatial position: shape (k, C)."""
    if groups is None or len(groups) == 1:
        a, b = (0, x.shape[0]) if groups is None else groups[0]
        part = x if (a, b) == (0, x.shape[0]) else x[a:b]
        return channel_sums(xp, part)[None]
    per_sample = x.sum(axis=tuple(range(2, x.ndim))) if x.ndim > 2 else x  # (N, C)
    size = groups[0][1] - groups[0][0]
    if all(b - a == size for a, b in groups) and groups[-1][1] == x.shape[0]:
        return per_sample.reshape(len(groups), size, x.shape[1]).sum(axis=1)
    return xp.stack([per_sample[a:b].sum(axis=0) for a, b in groups])


def per_group(xp: Any, v: Any, x: Any, groups: Groups) -> Any:
    """A (k, C) array of per-group values shaped to broadcast over X: each sample gets its
    group's row, (N, C, 1, 1) or (1, C, 1, 1) for one group."""
    if v.shape[0] == 1:
        return per_channel(v[0], x)
    size = groups[0][1] - groups[0][0]
    if all(b - a == size for a, b in groups):
        rows = v.repeat(size, axis=0)
    else:
        rows = xp.concatenate([v[g:g + 1].repeat(b - a, axis=0)
                               for g, (a, b) in enumerate(groups)])
    return rows.reshape(rows.shape + (1,) * (x.ndim - 2))


def batchnorm_forward(xp: Any, x: Any, gamma: Any, beta: Any, eps: float, counts: Any,
                      reduce: Reduce, shift: Any = None, groups: Groups = None
                      ) -> tuple[Any, BatchNormCache, Any, Any]:
    """Y = γ·x̂ + β with x̂ = (X − μ)/sqrt(σ² + ε), statistics per channel of each group of
    samples over all other axes.

    X: (N, C, H, W) or (N, C); γ, β: (C,). ``groups``: the local samples of each statistics
    group (None: one); ``counts``: each group's number of values per channel over all ranks,
    shape (k, 1) (or a number for one group). μ = (1/m) Σ X and the biased σ² = (1/m) Σ (X − μ)²
    over a group's m values.

    Without a ``shift``, two ``reduce`` calls: Σ X, then Σ (X − μ)², exact whatever the mean.
    With one, K (the same on every rank of a group: the running mean), one ``reduce`` of the
    stacked local sums [Σ X, Σ (X − μ_l)² + n_l (μ_l − K)²] (μ_l, n_l: the local mean and
    count): Chan's pairwise combination, Σ (X − μ)² = Σ over ranks of that second sum, minus
    m (μ − K)². Within a rank the squares are of deviations from its own mean; the sum and the
    difference cancel as (μ − K)² against σ², a few units of the last place once K tracks μ
    within a few σ (a layer's running mean, after its first step).

    Returns (Y, cache, μ, σ²), μ and σ² of shape (k, C): the caller updates its running
    statistics from them (PyTorch keeps the unbiased σ²·m/(m − 1) there).
    """
    gamma = gamma.astype(x.dtype, copy=False)
    sums = group_sums(xp, x, groups)
    if shift is None:  # two messages: the mean, then the squares of deviations from it
        mean = reduce(sums) / counts
        deviation = x - per_group(xp, mean, x, groups)
        squares = xp.multiply(deviation, deviation)  # later Y's room
        var = reduce(group_sums(xp, squares, groups)) / counts
    else:
        spatial = 1
        for n in x.shape[2:]:
            spatial *= n
        sizes = [x.shape[0]] if groups is None else [b - a for a, b in groups]
        # (k, 1); one group's count as a number: no host-to-device copy per forward
        local_counts = (x.dtype.type(sizes[0] * spatial) if len(sizes) == 1 else
                        xp.asarray([[n * spatial] for n in sizes], dtype=x.dtype))
        local_mean = sums / local_counts
        deviation = x - per_group(xp, local_mean, x, groups)
        squares = xp.multiply(deviation, deviation)  # later Y's room
        square_sums = group_sums(xp, squares, groups)
        shift = shift.astype(x.dtype, copy=False)[None]
        offset = local_mean - shift
        total = reduce(xp.stack([sums, square_sums + local_counts * offset * offset]))
        mean = total[0] / counts
        offset = mean - shift
        var = xp.maximum(total[1] / counts - offset * offset, 0)
        deviation -= per_group(xp, mean - local_mean, x, groups)
    inv_std = 1 / xp.sqrt(var + eps)
    # the arrays made above, reused in place: the same operations in the same order
    x_hat = xp.multiply(deviation, per_group(xp, inv_std, x, groups), out=deviation)
    y = xp.multiply(per_channel(gamma, x), x_hat, out=squares)
    y += per_channel(beta.astype(x.dtype, copy=False), x)
    return y, BatchNormCache(x_hat, inv_std, gamma, groups), mean, var


def batchnorm_backward(xp: Any, dy: Any, cache: BatchNormCache, counts: Any, reduce: Reduce
                       ) -> tuple[Any, Any, Any]:
    """The input gradient of :func:`batchnorm_forward` given dY (shaped like X), and the sums
    [Σ dY, Σ dY·x̂] per group, (2, k, C): this rank's, and over the group's ranks.

    Within each group: dβ_g = Σ dY and dγ_g = Σ dY·x̂ over all the group's values on every
    rank (one ``reduce`` of the stacked local sums), and

        dX = γ·(1/sqrt(σ² + ε))·(dY − dβ_g/m − x̂·dγ_g/m),  m = the group's count.

    The parameters' gradients are dβ = Σ_g dβ_g and dγ = Σ_g dγ_g: with one group, the summed
    sums; with several, the caller sums its local ones over every rank. All of it is linear
    in dY, so dY may arrive as partial sums over replicas.
    """
    groups = cache.groups
    product = dy * cache.x_hat  # later x̂'s term's room
    local = xp.stack([group_sums(xp, dy, groups), group_sums(xp, product, groups)])
    total = reduce(local)
    dbeta, dgamma = total
    mean_dy = per_group(xp, dbeta / counts, dy, groups)
    mean_dy_x_hat = per_group(xp, dgamma / counts, dy, groups)
    scale = per_channel(cache.gamma, dy) * per_group(xp, cache.inv_std, dy, groups)
    # γ/σ·((dY − mean dY) − x̂·mean(dY·x̂)), in place in the arrays made here
    dx = dy - mean_dy
    dx -= xp.multiply(cache.x_hat, mean_dy_x_hat, out=product)
    dx *= scale
    return dx, local, total


def batchnorm_inference(xp: Any, x: Any, gamma: Any, beta: Any, eps: float, running_mean: Any,
                        running_var: Any) -> Any:
    """Y = γ·(X − μ_run)/sqrt(σ²_run + ε) + β, evaluation mode: a fixed per-channel affine map.

    X: (N, C, H, W) or (N, C); γ, β, μ_run, σ²_run: (C,). No statistics and no communication.
    """
    scale = (gamma / xp.sqrt(running_var + eps)).astype(x.dtype, copy=False)
    shift = (beta - running_mean * scale).astype(x.dtype, copy=False)
    return x * per_channel(scale, x) + per_channel(shift, x)


def batchnorm_inference_backward(dy: Any, gamma: Any, eps: float, running_var: Any) -> Any:
    """dX = dY·γ/sqrt(σ²_run + ε) per channel: the adjoint of :func:`batchnorm_inference`."""
    scale = (gamma * (running_var + eps) ** -0.5).astype(dy.dtype, copy=False)
    return dy * per_channel(scale, dy)


@dataclass
class LayerNormCache:
    normalized: Any  # X̂
    rstd: Any  # 1/√(σ² + ε) per position, (N, 1, S…)
    gamma: Any  # γ shaped to broadcast over X


def layernorm_forward(xp: Any, x: Any, gamma: Any, beta: Any, eps: float, channels: int,
                      reduce: Callable[[Any], Any]) -> tuple[Any, LayerNormCache]:
    """Y = γ·(X − μ)/√(σ² + ε) + β with μ and σ² over the channels (axis 1) at each position,
    the channels of ``channels`` in all, of which X holds a block: ``reduce`` sums a per-position
    array over the ranks holding the others (the identity where X holds them all). The mean
    first, then the squared deviations from it: two sums, each as exact as one process's."""
    shape = (1, -1, *(1,) * (x.ndim - 2))
    mean = reduce(x.sum(axis=1, keepdims=True)) / channels
    centred = x - mean
    var = reduce((centred * centred).sum(axis=1, keepdims=True)) / channels
    rstd = 1.0 / xp.sqrt(var + eps)
    normalized = centred * rstd
    g = gamma.reshape(shape)
    return normalized * g + beta.reshape(shape), LayerNormCache(normalized, rstd, g)


def layernorm_backward(xp: Any, dy: Any, cache: LayerNormCache, channels: int,
                       reduce: Callable[[Any], Any]) -> tuple[Any, Any, Any]:
    """(dX, dγ, dβ) of :func:`layernorm_forward`: with dX̂ = dY·γ,
    dX = (dX̂ − mean_c dX̂ − X̂·mean_c(dX̂·X̂))/√(σ² + ε), the means over all the channels (one
    sum of both over the ranks); dγ = Σ dY·X̂ and dβ = Σ dY over the samples and positions this
    rank holds."""
    axes = (0, *range(2, dy.ndim))
    dgamma = (dy * cache.normalized).sum(axis=axes)
    dbeta = dy.sum(axis=axes)
    dnorm = dy * cache.gamma
    both = reduce(xp.concatenate([dnorm.sum(axis=1, keepdims=True),
                                  (dnorm * cache.normalized).sum(axis=1, keepdims=True)],
                                 axis=1)) / channels
    dx = (dnorm - both[:, :1] - cache.normalized * both[:, 1:]) * cache.rstd
    return dx, dgamma, dbeta
