"""The element-wise parts of AdamW and LAMB on one parameter shard, in place.

Both keep two moments of the gradient g, m ← β1·m + (1 − β1)·g and v ← β2·v + (1 − β2)·g², and
step along m̂ / (√v̂ + ε), m̂ and v̂ the moments divided by 1 − β^t (bias correction, at step t
from 1). AdamW (Loshchilov and Hutter 2019, PyTorch's ``torch.optim.AdamW``) decays the weights
apart from the step: w ← w·(1 − lr·λ), then w ← w − lr·m̂ / (√v̂ + ε). LAMB (You et al. 2020)
steps along u = m̂ / (√v̂ + ε) + λ·w scaled by the layer's trust ratio ‖w‖ / ‖u‖, which needs
the norms of whole tensors: :func:`lamb_moments` updates the moments and gives u in a scratch
array, whose norm the optimizer sums over the shards (:mod:`hpctrain.run.optimizer`); then
:func:`lamb_apply` makes u again from the same values and steps.

Element-wise, so a shard's update is the serial one restricted to the shard. The gradient ``g``
is overwritten (widened and multiplied by ``unscale`` first: fp16's 1 / loss scale times the
clipping factor); under a mixed precision ``w`` is the float32 master and ``copy`` receives the
updated weights rounded to the kernels' 16-bit dtype. Moments are made (zeros) on first use, in
``w``'s dtype, and returned.
"""

from __future__ import annotations

import math
from typing import Any

from hpctrain.kernels.sgd import Scratch


def unscaled(g: Any, dtype: Any, unscale: float) -> Any:
    """``g`` in ``dtype`` (widened from 16 bits in a new array, else in place) times
    ``unscale``."""
    if g.dtype != dtype:
        g = g.astype(dtype)
    if unscale != 1.0:
        g *= dtype.type(unscale)
    return g


def moments(xp: Any, w: Any, g: Any, m: Any | None, v: Any | None, betas: tuple[float, float],
            scratch: Any) -> tuple[Any, Any]:
    """m ← m + (1 − β1)·(g − m) (PyTorch's ``lerp``); v ← β2·v + (1 − β2)·g²; zeros before
    the first step."""
    beta1, beta2 = betas
    if m is None:
        m, v = xp.zeros_like(w), xp.zeros_like(w)
    xp.subtract(g, m, out=scratch)
    scratch *= 1 - beta1
    m += scratch
    v *= beta2
    xp.multiply(g, g, out=scratch)
    scratch *= 1 - beta2
    v += scratch
    return m, v


def direction(xp: Any, m: Any, v: Any, step: int, betas: tuple[float, float], eps: float,
              bias_correction: bool, out: Any) -> Any:
    """m̂ / (√v̂ + ε) into ``out``: PyTorch's order, m / (√v / √(1 − β2^t) + ε) / (1 − β1^t)."""
    xp.sqrt(v, out=out)
    if bias_correction:
        out /= math.sqrt(1 - betas[1] ** step)
    out += eps
    xp.divide(m, out, out=out)
    if bias_correction:
        out /= 1 - betas[0] ** step
    return out


def adamw_update(xp: Any, w: Any, g: Any, m: Any | None, v: Any | None, lr: float,
                 betas: tuple[float, float], eps: float, weight_decay: float, step: int,
                 scratch: Scratch, unscale: float = 1.0, copy: Any = None
                 ) -> tuple[Any, Any]:
    """AdamW's step ``step`` (from 1) of one shard, as ``torch.optim.AdamW``: w ← w·(1 − lr·λ);
    the moments; w ← w − lr·m̂ / (√v̂ + ε). Returns the moments to keep."""
    g = unscaled(g, w.dtype, unscale)
    if weight_decay:
        w *= 1 - lr * weight_decay
    temporary = scratch.like(xp, w)
    m, v = moments(xp, w, g, m, v, betas, temporary)
    direction(xp, m, v, step, betas, eps, True, temporary)
    temporary *= lr
    w -= temporary
    if copy is not None:
        copy[...] = w
    return m, v


def lamb_moments(xp: Any, w: Any, g: Any, m: Any | None, v: Any | None,
                 betas: tuple[float, float], eps: float, weight_decay: float, step: int,
                 bias_correction: bool, scratch: Scratch, unscale: float = 1.0
                 ) -> tuple[Any, Any, Any]:
    """LAMB's first half on one shard: the moments, and u = m̂ / (√v̂ + ε) + λ·w in a scratch
    array (valid until the next use of ``scratch``). Returns (m, v, u)."""
    g = unscaled(g, w.dtype, unscale)
    temporary = scratch.like(xp, w)
    m, v = moments(xp, w, g, m, v, betas, temporary)
    return m, v, lamb_direction(xp, w, m, v, betas, eps, weight_decay, step, bias_correction,
                                temporary)


def lamb_direction(xp: Any, w: Any, m: Any, v: Any, betas: tuple[float, float], eps: float,
                   weight_decay: float, step: int, bias_correction: bool, out: Any) -> Any:
    """u = m̂ / (√v̂ + ε) + λ·w into ``out``."""
    direction(xp, m, v, step, betas, eps, bias_correction, out)
    if weight_decay:
        out += weight_decay * w
    return out


def lamb_apply(xp: Any, w: Any, m: Any, v: Any, lr: float, trust: float,
               betas: tuple[float, float], eps: float, weight_decay: float, step: int,
               bias_correction: bool, scratch: Scratch, copy: Any = None) -> None:
    """LAMB's second half: u made again from the same moments and weights (the same values
    as :func:`lamb_moments` gave, without keeping an array per shard), w ← w − lr·trust·u."""
    u = lamb_direction(xp, w, m, v, betas, eps, weight_decay, step, bias_correction,
                       scratch.like(xp, w))
    u *= lr * trust
    w -= u
    if copy is not None:
        copy[...] = w
