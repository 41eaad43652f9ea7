"""Fully connected layer: Y = X Wᵀ + b with X: (N, F_in), W: (F_out, F_in)."""

from __future__ import annotations

from typing import Any


def linear_forward(x: Any, w: Any, b: Any | None) -> Any:
    y = x @ w.T
    if b is not None:
        y += b
    return y


def linear_backward(xp: Any, x: Any, w: Any, dy: Any, need_dx: bool = True,
                    dw_out: Any | None = None) -> tuple[Any | None, Any, Any]:
    """(dX, dW, db) = (dY W, dYᵀ X, Σ_n dY); dW written into ``dw_out`` when given."""
    dw = xp.matmul(dy.T, x, out=dw_out)
    return (dy @ w if need_dx else None), dw, dy.sum(axis=0)
