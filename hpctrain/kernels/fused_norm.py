"""Batch normalisation on a GPU in four fused CuPy kernels a step, for statistics over every local
sample (one group): the same numbers as :mod:`hpctrain.kernels.norm`, up to rounding.

The generic kernels of :mod:`hpctrain.kernels.norm` are written once for NumPy and CuPy, an
array operation at a time: about ten passes over the activations forward and as many backward,
each a kernel that reads and writes the whole tensor (and, in 16 bits, a widened float32 copy
first). On a GPU batch norm is memory-bound, so the passes are its time. Here:

- forward: two reductions read X (Σ(X − K) and Σ(X − K)² per channel, in float32, for the shift
  K of :func:`~hpctrain.kernels.norm.batchnorm_forward`), and one element-wise kernel writes
  Y = (X − μ)·γ/σ + β in X's dtype;
- backward: two reductions read ΔY and X (Σ ΔY, Σ ΔY·x̂), one element-wise kernel writes ΔX.

x̂ is not kept: the backward recomputes it from X, μ and 1/σ, as cuDNN does, so a 16-bit input
costs no float32 copy. The statistics messages are those of the generic kernels (one per
direction, or two in the first forward, which has no shift yet).

Why CuPy kernels rather than cuDNN's batch norm: they take NCHW and NCDHW arrays of any dtype
as hpctrain stores them, statistics over groups of ranks need the sums between the two halves
(cuDNN's fused forward would need its own all-reduce hook), and the whole layer is four
memory-bound passes, which is what cuDNN's kernels do too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from hpctrain.kernels.norm import Reduce


@dataclass(frozen=True)
class FusedCache:
    x: Any  # the layer's input, in its own dtype
    mean: Any  # (1, C) float32
    inv_std: Any  # (1, C) float32
    gamma: Any  # (C,) float32


def fused_available(xp: Any, dtype: Any = np.float32) -> bool:
    """Whether ``xp`` is CuPy with its kernel builders (not NumPy, not a stand-in), the kernels
    compile and run for ``dtype`` (tried once per dtype, :func:`fused_problem`), and
    ``HPCTRAIN_FUSED_NORM`` is not 0 (to compare with the generic kernels)."""
    return (xp is not np and hasattr(xp, "ReductionKernel")
            and os.environ.get("HPCTRAIN_FUSED_NORM", "1") != "0"
            and fused_problem(xp, np.dtype(dtype).name) is None)


@cache
def fused_problem(xp: Any, dtype: str) -> str | None:
    """None where every kernel compiles and runs on a tiny ``dtype`` tensor, else why not,
    said once (the generic kernels then run): decided on every rank alike, before any
    statistics message, so no rank goes another way than its group."""
    try:
        x = xp.ones((2, 3, 2, 2), dtype=dtype)
        ones, counts = xp.ones(3, np.float32), xp.full((1, 1), 8, np.float32)
        _, cache_, _, _ = fused_batchnorm_forward(xp, x, ones, ones, 1e-5, counts, lambda a: a)
        fused_batchnorm_backward(xp, x, cache_, counts, lambda a: a)
        xp.cuda.get_current_stream().synchronize()
    except Exception as err:  # a compiler's or driver's error: any of them means "not here"
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        print(f"batch norm: the fused GPU kernels do not run for {dtype} ({reason}); the "
              f"generic kernels run instead", flush=True)
        return reason
    return None


@cache
def _kernels(xp: Any) -> dict[str, Any]:
    """The kernels, built once per process (CuPy compiles each on first use per dtype)."""
    reduction, elementwise = xp.ReductionKernel, xp.ElementwiseKernel
    return {
        "shifted": reduction("T x, float32 k", "float32 s", "(float)x - k", "a + b", "s = a",
                             "0", "hpctrain_bn_shifted"),
        "squares": reduction("T x, float32 k", "float32 s",
                             "((float)x - k) * ((float)x - k)", "a + b", "s = a", "0",
                             "hpctrain_bn_squares"),
        "normalise": elementwise("T x, float32 mean, float32 scale, float32 beta", "T y",
                                 "y = (T)(((float)x - mean) * scale + beta)",
                                 "hpctrain_bn_normalise"),
        "grad": reduction("T dy", "float32 s", "(float)dy", "a + b", "s = a", "0",
                          "hpctrain_bn_grad_sum"),
        "grad_xhat": reduction("T dy, T x, float32 mean, float32 inv_std", "float32 s",
                               "(float)dy * (((float)x - mean) * inv_std)", "a + b", "s = a",
                               "0", "hpctrain_bn_grad_xhat"),
        "input_grad": elementwise(
            "T dy, T x, float32 mean, float32 inv_std, float32 scale, float32 mean_dy, "
            "float32 mean_dy_xhat", "T dx",
            "dx = (T)(scale * ((float)dy - mean_dy - ((float)x - mean) * inv_std * mean_dy_xhat))",
            "hpctrain_bn_input_grad"),
    }


def _channels(v: Any, ndim: int) -> Any:
    """A (C,) or (1, C) vector as (1, C, 1, …) to broadcast over an (N, C, …) tensor."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def fused_batchnorm_forward(xp: Any, x: Any, gamma: Any, beta: Any, eps: float, counts: Any,
                            reduce: Reduce, shift: Any = None
                            ) -> tuple[Any, FusedCache, Any, Any]:
    """:func:`~hpctrain.kernels.norm.batchnorm_forward` for one group: (Y, cache, μ, σ²), μ
    and σ² of shape (1, C), float32 (``gamma``, ``beta``, ``shift`` and ``counts`` float32)."""
    k = _kernels(xp)
    axes = (0, *range(2, x.ndim))
    local = float(x.size // x.shape[1])  # this rank's values per channel
    f32 = np.float32
    if shift is None:  # two messages: the mean, then the squares of deviations from it
        zero = xp.zeros((1, x.shape[1]) + (1,) * (x.ndim - 2), f32)
        mean = reduce(k["shifted"](x, zero, axis=axes)[None]) / counts
        var = reduce(k["squares"](x, _channels(mean, x.ndim), axis=axes)[None]) / counts
    else:
        offset = _channels(shift.astype(f32, copy=False), x.ndim)
        sums = k["shifted"](x, offset, axis=axes)  # Σ(X − K)
        squares = k["squares"](x, offset, axis=axes)  # Σ(X − K)²
        total = reduce(xp.stack([sums + local * shift, squares])[:, None])  # (2, 1, C)
        mean = total[0] / counts
        drift = mean - shift[None]
        var = xp.maximum(total[1] / counts - drift * drift, 0)
    inv_std = 1 / xp.sqrt(var + f32(eps))
    scale = gamma[None] * inv_std
    y = k["normalise"](x, _channels(mean, x.ndim), _channels(scale, x.ndim),
                       _channels(beta.astype(f32, copy=False), x.ndim))
    return y, FusedCache(x, mean, inv_std, gamma), mean, var


def fused_batchnorm_backward(xp: Any, dy: Any, cache: FusedCache, counts: Any, reduce: Reduce
                             ) -> tuple[Any, Any, Any]:
    """:func:`~hpctrain.kernels.norm.batchnorm_backward` for one group: (ΔX in ΔY's dtype,
    this rank's sums (2, 1, C), the summed ones)."""
    k = _kernels(xp)
    x, n = cache.x, dy.ndim
    axes = (0, *range(2, n))
    mean, inv_std = _channels(cache.mean, n), _channels(cache.inv_std, n)
    local = xp.stack([k["grad"](dy, axis=axes), k["grad_xhat"](dy, x, mean, inv_std,
                                                                axis=axes)])[:, None]
    total = reduce(local.copy())
    dbeta, dgamma = total
    scale = cache.gamma[None] * cache.inv_std
    dx = k["input_grad"](dy, x, mean, inv_std, _channels(scale, n),
                         _channels(dbeta / counts, n), _channels(dgamma / counts, n))
    return dx, local, total
