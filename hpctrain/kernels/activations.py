"""Element-wise layers: ReLU, leaky ReLU, tanh, scaling, the gates and clipped units of
mobile nets (sigmoid, SiLU, hard sigmoid, hard swish, ReLU6 and clip), GELU and dropout.

A backward reads the output Y where the derivative is a function of Y (ReLU, tanh, sigmoid,
the clips), and the input X where it is not (SiLU, hard swish and GELU are not one-to-one): a
layer keeps one of them. Where an activation has a kink, the derivative there is PyTorch's."""

from __future__ import annotations

from typing import Any

import numpy as np

from hpctrain.kernels.counter_rng import uniform_block
from hpctrain.kernels.products import total, widen


def relu_forward(xp: Any, x: Any) -> Any:
    return xp.maximum(x, 0)


def relu_backward(xp: Any, y: Any, dy: Any) -> Any:
    """dY where the unit was on (Y > 0), else 0, as dY·[Y > 0]: NumPy's ``where`` is not
    vectorised and took 10 times as long (4.4 against 0.4 ms on AlexNet's relu1). The same
    numbers for a finite dY; a non-finite one, which only a diverged step makes, stays
    non-finite where the unit was off too."""
    return xp.multiply(dy, y > 0)


def leaky_relu_forward(xp: Any, x: Any, slope: float) -> Any:
    """x where x > 0, slope·x elsewhere (0 ≤ slope < 1), as max(x, slope·x): the same numbers
    (slope·x lies between 0 and x), in two vectorised passes. NumPy's ``where`` is not
    vectorised and branches on every sign: 6.2 against 0.2 ms on CosmoFlow's second block,
    batch 8, and twice as slow on random signs as on an activation's runs of them, so that
    its timing over-priced the layer."""
    y = x * x.dtype.type(slope)
    return xp.maximum(x, y, out=y)


def leaky_relu_backward(xp: Any, y: Any, dy: Any, slope: float) -> Any:
    """dY where Y > 0, slope·dY elsewhere: for 0 ≤ slope the sign of Y is the sign of X
    (and the kink at 0 takes the slope, as PyTorch does). As dY·max([Y > 0], slope), a
    factor of exactly 1 or the slope, with no branch (see :func:`leaky_relu_forward`): 0.7
    against 6.6 ms there."""
    factor = (y > 0).astype(dy.dtype)
    xp.maximum(factor, dy.dtype.type(slope), out=factor)
    return xp.multiply(dy, factor, out=factor)


def tanh_forward(xp: Any, x: Any) -> Any:
    return xp.tanh(x)


def tanh_backward(xp: Any, y: Any, dy: Any) -> Any:
    """dY·(1 − Y²)."""
    return dy * (1 - y * y)


def sigmoid_forward(xp: Any, x: Any) -> Any:
    """1/(1 + e^−x), as (1 + tanh(x/2))/2: the same function with no overflow of e^−x for a
    large negative x, and one transcendental per entry."""
    half = x.dtype.type(0.5)
    y = xp.tanh(x * half)
    y += 1
    y *= half
    return y


def sigmoid_backward(xp: Any, y: Any, dy: Any) -> Any:
    """dY·Y·(1 − Y)."""
    return dy * y * (1 - y)


def silu_forward(xp: Any, x: Any) -> Any:
    """x·σ(x) (SiLU, or swish: EfficientNet's activation)."""
    return x * sigmoid_forward(xp, x)


def silu_backward(xp: Any, x: Any, dy: Any) -> Any:
    """dY·σ(x)·(1 + x·(1 − σ(x))), from the input (SiLU is not one-to-one)."""
    s = sigmoid_forward(xp, x)
    return dy * s * (1 + x * (1 - s))


def clip_forward(xp: Any, x: Any, low: float, high: float) -> Any:
    """x cut to [low, high] (ReLU6 is low 0, high 6)."""
    return xp.clip(x, x.dtype.type(low), x.dtype.type(high))


def clip_backward(xp: Any, y: Any, dy: Any, low: float, high: float) -> Any:
    """dY where low < x < high, read from Y (which lies strictly inside there, and on a bound
    elsewhere), else 0: at a bound the derivative is 0, as PyTorch's hardtanh gives."""
    inside = (y > y.dtype.type(low)) & (y < y.dtype.type(high))
    return xp.multiply(dy, inside)


def hardsigmoid_forward(xp: Any, x: Any) -> Any:
    """ReLU6(x + 3)/6 = x/6 + 1/2 cut to [0, 1] (MobileNet v3's gate)."""
    y = x * x.dtype.type(1 / 6)
    y += x.dtype.type(0.5)
    return xp.clip(y, 0, 1, out=y)


def hardsigmoid_backward(xp: Any, y: Any, dy: Any) -> Any:
    """dY/6 where −3 < x < 3, that is 0 < Y < 1; else 0."""
    inside = (y > 0) & (y < 1)
    return xp.multiply(dy * dy.dtype.type(1 / 6), inside)


def hardswish_forward(xp: Any, x: Any) -> Any:
    """x·ReLU6(x + 3)/6 (MobileNet v3's activation)."""
    return x * hardsigmoid_forward(xp, x)


def hardswish_backward(xp: Any, x: Any, dy: Any) -> Any:
    """dY·(x/3 + 1/2) for −3 < x < 3, dY from 3 up, 0 to −3, from the input (hard swish is
    not one-to-one): at the kinks, PyTorch's values."""
    factor = x * x.dtype.type(1 / 3)
    factor += x.dtype.type(0.5)
    factor = xp.where(x <= -3, x.dtype.type(0), xp.where(x >= 3, x.dtype.type(1), factor))
    return dy * factor


def erf(xp: Any, x: Any) -> Any:
    """The error function entry by entry: SciPy's on NumPy arrays, CuPy's on CuPy's."""
    if xp is np:
        from scipy.special import erf as scipy_erf

        return scipy_erf(x)
    from cupyx.scipy.special import erf as cupy_erf

    return cupy_erf(x)


def gelu_forward(xp: Any, x: Any) -> Any:
    """x·Φ(x) = x·(1 + erf(x/√2))/2 (GELU, PyTorch's exact form; ConvNeXt's activation). A
    16-bit x is computed in float32 (SciPy's erf has no 16-bit loop) and rounded back."""
    wide = widen(x)
    half = wide.dtype.type(0.5)
    y = wide * half * (1 + erf(xp, wide * wide.dtype.type(1 / np.sqrt(2))))
    return y.astype(x.dtype, copy=False)


def gelu_backward(xp: Any, x: Any, dy: Any) -> Any:
    """dY·(Φ(x) + x·φ(x)), from the input (GELU is not one-to-one); 16-bit in float32."""
    wide = widen(x)
    cdf = (1 + erf(xp, wide * wide.dtype.type(1 / np.sqrt(2)))) * wide.dtype.type(0.5)
    pdf = xp.exp(-(wide * wide) * wide.dtype.type(0.5)) * wide.dtype.type(1 / np.sqrt(2 * np.pi))
    return (widen(dy) * (cdf + wide * pdf)).astype(dy.dtype, copy=False)


def gate_backward(xp: Any, dy: Any, a: Any, g: Any) -> tuple[Any, Any]:
    """(ΔA, ΔG) of Y = A ⊙ G: ΔY ⊙ G, and ΔY ⊙ A summed over the axes along which G was
    broadcast (its sizes of 1 where A's are larger)."""
    dg = dy * a
    broadcast = tuple(k for k, (n, m) in enumerate(zip(g.shape, a.shape, strict=True)) if n != m)
    if broadcast:
        dg = total(dg, axis=broadcast).reshape(g.shape)  # 16-bit: summed in float32
    return dy * g, dg


def layer_scale_backward(xp: Any, dy: Any, x: Any, gamma: Any) -> tuple[Any, Any]:
    """(ΔX, Δγ) of Y = γ ⊙ X, γ of shape (C, 1, …, 1) broadcast over the samples and
    positions: ΔY ⊙ γ, and ΔY ⊙ X summed over every axis but the channels, in γ's shape."""
    dx, dgamma = gate_backward(xp, dy, x, gamma[None])
    return dx, dgamma[0]


def scale_forward(xp: Any, x: Any, factor: float) -> Any:
    return x * x.dtype.type(factor)


def scale_backward(xp: Any, y: Any, dy: Any, factor: float) -> Any:
    return dy * dy.dtype.type(factor)


def dropout_mask(xp: Any, key: int, p: float, shape: tuple[int, ...],
                 box: tuple[tuple[int, int], ...], dtype: Any) -> Any:
    """Inverted-dropout mask for block ``box`` of a global ``shape`` activation.

    Entry (n, ...) is kept with probability 1 - p, decided by the counter RNG at its global
    index, so sample n gets the same mask on every grid; kept entries are scaled by 1/(1 - p).
    """
    # drawn in float32 at least: a 16-bit draw would keep too coarse a fraction
    draw = dtype if np.dtype(dtype).itemsize >= 4 else np.float32
    keep = uniform_block(xp, key, shape, box, draw) >= p
    return keep.astype(dtype) * dtype(1.0 / (1.0 - p))
