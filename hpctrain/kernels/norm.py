"""Batch normalisation, with statistics that may span several ranks.

A distributed layer may hold only part of each channel's values — some samples (batch split) or
some rows (height split). Its kernels compute per-channel local sums and pass them to ``reduce``,
which sums an array over the ranks that hold the other parts of the same channels (the identity
on one process); ``count`` is the global number of values per channel. The statistics, and so
the outputs and gradients, are then exactly those of the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Reduce = Callable[[Any], Any]


@dataclass(frozen=True)
class BatchNormCache:
    x_hat: Any  # like X: the normalised input
    inv_std: Any  # (C,): 1/sqrt(var + eps)
    gamma: Any  # (C,), in the dtype of X


def channel_axes(x: Any) -> tuple[int, ...]:
    """The axes a per-channel statistic sums over: all but C of X: (N, C) or (N, C, H, W)."""
    return (0, *range(2, x.ndim))


def per_channel(v: Any, x: Any) -> Any:
    """A (C,) vector shaped to broadcast over X: (1, C) or (1, C, 1, 1)."""
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def channel_sums(xp: Any, x: Any) -> Any:
    """S[c] = Σ over every axis but C of X: the local part of a per-channel sum, shape (C,)."""
    return x.sum(axis=channel_axes(x))


def batchnorm_forward(xp: Any, x: Any, gamma: Any, beta: Any, eps: float, count: int,
                      reduce: Reduce) -> tuple[Any, BatchNormCache, Any, Any]:
    """Y = γ·x̂ + β with x̂ = (X − μ)/sqrt(σ² + ε), statistics per channel over all other axes.

    X: (N, C, H, W) or (N, C); γ, β: (C,). With m = ``count`` values per channel over all ranks,
    μ = (1/m) Σ X and the biased σ² = (1/m) Σ (X − μ)², each sum taken locally and then over the
    ranks by ``reduce``. Two passes (mean first, then squared deviations) rather than
    E[X²] − μ², which cancels catastrophically when ``|μ| ≫ σ``.

    Returns (Y, cache, μ, σ²): the caller updates its running statistics from μ and σ²
    (PyTorch keeps the unbiased σ²·m/(m − 1) there).
    """
    gamma = gamma.astype(x.dtype, copy=False)
    mean = reduce(channel_sums(xp, x)) / count
    centred = x - per_channel(mean, x)
    var = reduce(channel_sums(xp, centred * centred)) / count
    inv_std = 1 / xp.sqrt(var + eps)
    x_hat = centred * per_channel(inv_std, x)
    y = per_channel(gamma, x) * x_hat + per_channel(beta.astype(x.dtype, copy=False), x)
    return y, BatchNormCache(x_hat, inv_std, gamma), mean, var


def batchnorm_backward(xp: Any, dy: Any, cache: BatchNormCache, count: int, reduce: Reduce
                       ) -> tuple[Any, Any, Any]:
    """Gradients (dX, dγ, dβ) of :func:`batchnorm_forward` given dY (shaped like X).

    dβ = Σ dY and dγ = Σ dY·x̂, each over all values of the channel on every rank (one ``reduce``
    of the stacked (2, C) local sums), and

        dX = γ·(1/sqrt(σ² + ε))·(dY − dβ/m − x̂·dγ/m),  m = ``count``.

    dX, dγ and dβ are linear in dY, so dY may arrive as partial sums over replicas.
    """
    local = xp.stack([channel_sums(xp, dy), channel_sums(xp, dy * cache.x_hat)])  # (2, C)
    dbeta, dgamma = reduce(local)
    mean_dy, mean_dy_x_hat = per_channel(dbeta / count, dy), per_channel(dgamma / count, dy)
    dx = per_channel(cache.gamma * cache.inv_std, dy) * (dy - mean_dy - cache.x_hat * mean_dy_x_hat)
    return dx, dgamma, dbeta


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
