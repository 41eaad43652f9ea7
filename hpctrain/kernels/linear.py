"""Fully connected layer: Y = X Wᵀ + b with X: (N, F_in), W: (F_out, F_in).

The products go through :func:`~hpctrain.kernels.products.matmul` (float32 sums for 16-bit
arrays, TF32 inputs where asked) and the bias gradient through
:func:`~hpctrain.kernels.products.total`.
"""

from __future__ import annotations

from typing import Any

from hpctrain.kernels.products import matmul, total


def linear_forward(xp: Any, x: Any, w: Any, b: Any | None) -> Any:
    y = matmul(xp, x, w.T)
    if b is not None:
        y += b
    return y


def linear_backward(xp: Any, x: Any, w: Any, dy: Any, need_dx: bool = True,
                    dw_out: Any | None = None) -> tuple[Any | None, Any, Any]:
    """(dX, dW, db) = (dY W, dYᵀ X, Σ_n dY); dW written into ``dw_out`` when given."""
    dw = matmul(xp, dy.T, x, out=dw_out)
    return (matmul(xp, dy, w) if need_dx else None), dw, total(dy, axis=0)

