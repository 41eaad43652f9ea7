"""Softmax cross-entropy."""

from __future__ import annotations

from typing import Any


def softmax_cross_entropy(xp: Any, logits: Any, labels: Any, scale: float
                          ) -> tuple[Any, Any, Any]:
    """Summed loss, number correct, and d(scale·loss)/dlogits for logits: (N, K), labels: (N,).

    loss = Σ_n [log Σ_k exp z_nk − z_n,y_n]; the gradient is scale·(softmax(z) − onehot(y)).
    """
    z = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(z)
    total = exp.sum(axis=1, keepdims=True)
    rows = xp.arange(len(labels))
    loss_sum = (xp.log(total[:, 0]) - z[rows, labels]).sum()
    correct = (logits.argmax(axis=1) == labels).sum()
    grad = exp / total
    grad[rows, labels] -= 1.0
    return loss_sum, correct, grad * scale
